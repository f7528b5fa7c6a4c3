// cadence-train: trains a real model on Fashion-MNIST across MPI processes (rank 0 serves, the
// others compute real gradients on their shards) under each policy in turn, with per-worker speed
// profiles, and holds the simulator's prediction of the same run against what it measured.
#include "cli.hpp"
#include "idx.hpp"
#include "mlp.hpp"
#include "model.hpp"
#include "race.hpp"
#include "trace.hpp"
#include "train.hpp"

#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/sim/collective.hpp>
#include <cadence/sim/simulator.hpp>
#include <cadence/transport/mpi/communicator.hpp>

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using cadence::tools::usage_error;
using clock_type = std::chrono::steady_clock;
namespace train = cadence::train;

constexpr const char* default_policies[] = {"bsp", "asp", "ssp:3", "dssp:3:15", "elastic:15"};
constexpr const char* default_data = "/usr/share/datasets/fashion-mnist";

void print_help() {
  std::cout <<
R"(usage: mpirun -np N cadence-train [options]

Trains a real model on Fashion-MNIST across N MPI processes: rank 0 is the parameter server,
ranks 1..N-1 are workers that compute real gradients on their shard of the training set.
Each policy runs in turn, on fresh server and workers. Each worker's iterations are stretched
to its speed profile (sleeping until the profile's iteration time has passed), so a 2-core
machine can host a heterogeneous cluster. Afterwards rank 0 replays the same profile, policy
and measured push/pull cost in cadence's simulator and prints both.

  mpirun --allow-run-as-root --oversubscribe -np 5 cadence-train --json

options:
  --policy CONFIG    a make_controller config (bsp, asp, ssp:<s>, dssp:<s_L>:<s_U>,
                     elastic:<R>) over the parameter server, or a collective mode over
                     all-reduce among the workers (rank 0 only measures): periodic:<k>
                     (average every k local steps) or elastic-avg:<R>[:...] (ElasticBSP over
                     collectives, elastic_averager); repeat to compare several (default: bsp,
                     asp, ssp:3, dssp:3:15, elastic:15)
  --profile NAME     per-worker speed profile (default hetero16); see the list below
  --seconds S        wall-clock seconds of training per policy (default 30)
  --seed K           seed of the profile's iteration times, the data order and the initial
                     weights (default 1)
  --data DIR         Fashion-MNIST directory (default /usr/share/datasets/fashion-mnist,
                     from the Debian package dataset-fashion-mnist)
  --model NAME       mlp (784-hidden-10, ReLU; default) or softmax (softmax regression, fast)
  --hidden N         hidden units of the mlp (default 256)
  --lr X             SGD step the server applies per push (default 0.05)
  --batch N          examples per worker iteration (default 32)
  --eval-every S     seconds between the snapshots of the server's weights whose test
                     accuracy makes the curve (default 1; evaluated after the run)
  --train-limit N    train on the first N training images (default: all 60000)
  --test-limit N     evaluate the curve on the first N test images (default 1000); the
                     final accuracy always uses the whole test set
  --evict-after S    the server evicts a worker silent for S seconds (default: never)
  --json             one JSON array on stdout (rank 0), one object per policy
  --csv              one CSV row per policy (at most one of --json and --csv)
  --curves FILE      also write the accuracy curves (policy,seconds,accuracy) to FILE
  --trace FILE       also write each parameter-server policy's iteration trace (per worker
                     and iteration: start, compute, push, pull) for cadence-sim --trace;
                     with several policies, one file each: FILE-<policy> (docs/trace.md)
  --help             this text

profiles:
)";
  for (const auto& p : train::profile_catalog()) std::cout << "  " << p.name << ": " << p.description << "\n";
}

struct options {
  std::vector<std::string> policies;
  std::string profile{train::default_profile_name};
  double seconds = 30;
  std::uint64_t seed = 1;
  std::string data = default_data;
  std::string model = "mlp";
  std::size_t hidden = 256;
  double lr = 0.05;
  std::size_t batch = 32;
  double eval_every = 1;
  std::size_t train_limit = 0;
  std::size_t test_limit = 1000;
  std::optional<double> evict_after;
  bool json = false, csv = false, help = false;
  std::string curves;
  std::string trace;
};

options parse(int argc, char** argv) {
  options o;
  cadence::tools::flag_reader args(argc, argv);
  args.at_most_one_of({"--json", "--csv"});
  args.at_most_once({"--profile", "--seconds", "--seed", "--data", "--model", "--hidden", "--lr", "--batch",
                     "--eval-every", "--train-limit", "--test-limit", "--evict-after", "--curves", "--trace"});
  while (args.next()) {
    const std::string_view flag = args.flag();
    if (flag == "--help" || flag == "-h") {
      args.no_value();
      o.help = true;
    } else if (flag == "--policy") {
      o.policies.emplace_back(args.value());
    } else if (flag == "--profile") {
      o.profile = std::string(args.value());
    } else if (flag == "--seconds") {
      o.seconds = cadence::tools::parse_flag_real(flag, args.value(), false, 86400);
    } else if (flag == "--seed") {
      o.seed = cadence::tools::parse_flag_integer<std::uint64_t>(flag, args.value(), 0, UINT64_MAX);
    } else if (flag == "--data") {
      o.data = std::string(args.value());
      if (o.data.empty()) throw usage_error("--data: expected a directory, got ''");
    } else if (flag == "--model") {
      o.model = std::string(args.value());
      if (o.model != "mlp" && o.model != "softmax")
        throw usage_error("--model: expected mlp or softmax, got '" + o.model + "'");
    } else if (flag == "--hidden") {
      o.hidden = cadence::tools::parse_flag_integer<std::size_t>(flag, args.value(), 1, 65536);
    } else if (flag == "--lr") {
      o.lr = cadence::tools::parse_flag_real(flag, args.value(), false, 1e6);
    } else if (flag == "--batch") {
      o.batch = cadence::tools::parse_flag_integer<std::size_t>(flag, args.value(), 1, 1u << 16);
    } else if (flag == "--eval-every") {
      o.eval_every = cadence::tools::parse_flag_real(flag, args.value(), false, 86400);
    } else if (flag == "--train-limit") {
      o.train_limit = cadence::tools::parse_flag_integer<std::size_t>(flag, args.value(), 1, SIZE_MAX);
    } else if (flag == "--test-limit") {
      o.test_limit = cadence::tools::parse_flag_integer<std::size_t>(flag, args.value(), 1, SIZE_MAX);
    } else if (flag == "--evict-after") {
      o.evict_after = cadence::tools::parse_flag_real(flag, args.value(), false, 86400);
    } else if (flag == "--json") {
      args.no_value();
      o.json = true;
    } else if (flag == "--csv") {
      args.no_value();
      o.csv = true;
    } else if (flag == "--curves") {
      o.curves = std::string(args.value());
    } else if (flag == "--trace") {
      o.trace = std::string(args.value());
    } else {
      args.unknown();
    }
  }
  if (o.seconds / o.eval_every > 10000)
    throw usage_error("--eval-every: " + std::to_string(o.eval_every) + " s over a " + std::to_string(o.seconds) +
                      " s run means more than 10000 snapshots; use --eval-every >= " +
                      std::to_string(o.seconds / 10000));
  if (o.policies.empty()) o.policies.assign(std::begin(default_policies), std::end(default_policies));
  return o;
}

// The two models behind one face.
class any_model {
public:
  any_model(const options& o, std::size_t features, std::size_t classes) {
    if (o.model == "mlp")
      mlp_ = std::make_unique<train::mlp>(features, o.hidden, classes);
    else
      softmax_ = std::make_unique<train::softmax_regression>(features, classes, o.batch);
  }
  std::size_t parameter_count() const { return mlp_ ? mlp_->parameter_count() : softmax_->parameter_count(); }
  void initialize(cadence::span<float> w, std::uint64_t seed) const {
    if (mlp_)
      mlp_->initialize(w, seed);
    else
      std::fill(w.begin(), w.end(), 0.0f);
  }
  void gradient(cadence::span<const float> w, const train::dataset& d, cadence::span<const std::uint32_t> b,
                cadence::span<float> g) {
    if (mlp_)
      mlp_->gradient(w, d, b, g);
    else
      softmax_->gradient(w, d, b, g);
  }
  train::evaluation evaluate(cadence::span<const float> w, const train::dataset& d, std::size_t limit) {
    return mlp_ ? mlp_->evaluate(w, d, limit) : softmax_->evaluate(w, d, limit);
  }
  std::string describe() const {
    return mlp_ ? "784-" + std::to_string(mlp_->hidden()) + "-10 MLP" : std::string("softmax regression");
  }

private:
  std::unique_ptr<train::mlp> mlp_;
  std::unique_ptr<train::softmax_regression> softmax_;
};

// A collective mode ("periodic:<k>" or "elastic-avg:<R>[:...]") rather than a controller.
bool is_collective(const std::string& policy) {
  return policy.rfind("periodic:", 0) == 0 || policy.rfind("elastic-avg:", 0) == 0;
}
// The mode as cadence::sim::simulate_collective and the adapters spell it.
std::string collective_mode(const std::string& policy) {
  return policy.rfind("elastic-avg:", 0) == 0 ? "elastic:" + policy.substr(12) : policy;
}

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// What a worker sends rank 0 after each policy (doubles, so one MPI type does).
struct worker_summary {
  double iterations = 0;
  double overruns = 0;
  double evicted = 0;
  double timings = 0;
  double max_local_steps = 0;  // collective modes: most local steps between two merges
};
constexpr int summary_words = 5;

// Server 0's update rule: SGD, plus the snapshots of the weights that make the curve (the
// weights at time t are those before the first push after t), the count of pushes within the
// run, and the progress line.
struct server_side {
  clock_type::time_point start;
  double seconds = 0;
  double eval_every = 1;
  float lr = 0.05f;
  std::size_t params = 0;
  std::vector<double> snapshot_times;
  std::vector<float> snapshots;  // back to back, params each
  std::uint64_t in_time = 0;
  const cadence::exchange::ps_stats* stats = nullptr;
  std::size_t evictions_seen = 0;
  double next_progress = 0;
  bool tty = false;
  std::string label;

  void snapshot_until(double t, const float* w) {
    for (;;) {
      const double next = static_cast<double>(snapshot_times.size()) * eval_every;
      if (next > t || next > seconds + 1e-9) return;
      snapshot_times.push_back(next);
      snapshots.insert(snapshots.end(), w, w + params);
    }
  }
  void progress(double t) {
    if (stats != nullptr && stats->evictions.size() > evictions_seen) {
      for (std::size_t k = evictions_seen; k < stats->evictions.size(); ++k)
        std::fprintf(stderr, "%scadence-train: %s: worker %u evicted at %.1f s: %s\n", tty ? "\n" : "", label.c_str(),
                     static_cast<unsigned>(stats->evictions[k].worker), t, stats->evictions[k].reason.c_str());
      evictions_seen = stats->evictions.size();
    }
    if (t < next_progress) return;
    next_progress = t + (tty ? 0.5 : 10.0);
    std::fprintf(stderr, "%scadence-train: %s: %.0f/%.0f s, %llu pushes%s", tty ? "\r" : "", label.c_str(),
                 std::min(t, seconds), seconds, static_cast<unsigned long long>(in_time), tty ? "   " : "\n");
    std::fflush(stderr);
  }
};

struct sgd_with_snapshots {
  server_side* s;
  void operator()(float* w, const float* g, std::size_t n, cadence::worker_id) const {
    const double t = since(s->start);
    s->snapshot_until(t, w);
    for (std::size_t i = 0; i < n; ++i) w[i] -= s->lr * g[i];
    if (t <= s->seconds) ++s->in_time;
    s->progress(t);
  }
};

using ps_options = cadence::exchange::ps_options;
using comm_type = cadence::transport::mpi_communicator;

ps_options make_ps_options(const options& o) {
  ps_options po;
  po.servers = 1;
  po.keep_log = true;
  if (o.evict_after) po.evict_after = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(*o.evict_after));
  // A parked worker waits at most for the slowest iteration (or the eviction); a run-length
  // bound keeps a wedged run from waiting the default 300 s.
  po.reply_timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(o.seconds + 60));
  return po;
}

cadence::transport::mpi_options make_mpi_options() {
  cadence::transport::mpi_options mo;
  // Five ranks share two cores: a waiting rank must give its core to the computing ones
  // soon (the default spins 200 ms, which would steal the profile's compute time).
  mo.spin_for = std::chrono::microseconds(2000);
  mo.poll_sleep = std::chrono::microseconds(50);
  return mo;
}

// Runs one policy on rank 0 (the server); returns its report (the simulated part filled in
// later).
train::policy_report serve(const options& o, const std::string& policy, std::size_t index, any_model& model,
                           const train::dataset& test, std::size_t workers) {
  comm_type comm(MPI_COMM_WORLD, make_mpi_options(), cadence::transport::deadline(std::chrono::seconds(120)));
  const std::size_t params = model.parameter_count();
  std::vector<float> w0(params);
  model.initialize(w0, o.seed);
  server_side side;
  side.seconds = o.seconds;
  side.eval_every = o.eval_every;
  side.lr = static_cast<float>(o.lr);
  side.params = params;
  side.tty = isatty(2) != 0;
  side.label = policy + " [" + std::to_string(index + 1) + "/" + std::to_string(o.policies.size()) + "]";
  const ps_options po = make_ps_options(o);
  cadence::exchange::parameter_server<comm_type, cadence::any_controller, float, sgd_with_snapshots> server(
      comm, params, w0.data(), cadence::make_controller(policy, workers), sgd_with_snapshots{&side}, po);
  side.stats = &server.stats();
  MPI_Barrier(MPI_COMM_WORLD);
  side.start = clock_type::now();
  server.run();
  const double ran = since(side.start);
  if (side.tty) std::fprintf(stderr, "\n");
  const std::vector<float> final_w(server.weights().begin(), server.weights().end());
  side.snapshot_until(o.seconds, final_w.data());  // quiet tail: the weights did not change

  train::policy_report r;
  r.policy = server.controller().config();
  r.workers = workers;
  r.seconds = o.seconds;
  r.iterations = side.in_time;
  r.iterations_per_second = static_cast<double>(side.in_time) / o.seconds;
  const auto& st = server.stats();
  for (const auto v : st.max_start_staleness) r.max_staleness = std::max<std::int64_t>(r.max_staleness, v);
  r.p99_staleness = train::percentile(st.start_staleness, 0.99);
  for (const auto& e : st.evictions) r.evicted.push_back(static_cast<int>(e.worker));
  std::sort(r.evicted.begin(), r.evicted.end());
  for (std::size_t k = 0; k < side.snapshot_times.size(); ++k) {
    const cadence::span<const float> w(side.snapshots.data() + k * params, params);
    const auto e = model.evaluate(w, test, o.test_limit);
    r.curve.push_back({side.snapshot_times[k], e.accuracy});
    r.best_accuracy = std::max(r.best_accuracy, e.accuracy);
  }
  r.final_accuracy = model.evaluate(final_w, test, 0).accuracy;
  r.time_to_70 = train::time_to(r.curve, 0.70);
  r.time_to_80 = train::time_to(r.curve, 0.80);
  (void)ran;
  return r;
}

// Runs one policy on a worker rank: returns its push_pull timings and summary.
worker_summary work(const options& o, any_model& model, const train::dataset& shard, const cadence::sim::scenario& prof,
                    std::vector<train::exchange_timing>& timings) {
  comm_type comm(MPI_COMM_WORLD, make_mpi_options(), cadence::transport::deadline(std::chrono::seconds(120)));
  const ps_options po = make_ps_options(o);
  cadence::exchange::ps_worker<comm_type> worker(comm, model.parameter_count(), po);
  const auto id = static_cast<std::size_t>(worker.id());
  cadence::sim::iteration_sampler sampler(prof.workers[id], cadence::sim::mix_seed(o.seed, id));
  train::detail::shard_walk walk(0, static_cast<std::uint32_t>(shard.size()), o.batch, cadence::sim::mix_seed(o.seed + 1, id));
  std::vector<float> w(model.parameter_count()), g(model.parameter_count());
  worker_summary sum;
  timings.clear();
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    worker.pull(w.data());
    const auto start = clock_type::now();
    for (;;) {
      const auto t0 = clock_type::now();
      const double at = std::chrono::duration<double>(t0 - start).count();
      if (at >= o.seconds) break;
      const double d = sampler.next(at);
      model.gradient(w, shard, walk.next(), g);
      const auto until = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(d));
      if (clock_type::now() > until) sum.overruns += 1;
      std::this_thread::sleep_until(until);
      const auto p0 = clock_type::now();
      worker.push_pull(g.data(), w.data());
      timings.push_back({std::chrono::duration<double>(p0 - start).count(), since(p0)});
      sum.iterations += 1;
    }
    worker.finish();
  } catch (const cadence::worker_error& e) {
    // Evicted (e.g. stopped with SIGSTOP past --evict-after): the server goes on without us.
    sum.evicted = 1;
    std::fprintf(stderr, "cadence-train: worker %zu: %s\n", id, e.what());
  }
  sum.timings = static_cast<double>(timings.size());
  return sum;
}

// Collective modes, on a worker rank: local SGD steps stretched to the profile, merged by the
// adapter over an all-reduce among the workers only. Every merge also all-reduces a stop vote,
// so all ranks leave after the same merge (the first one after any rank passed the run's end).
// Worker 0 keeps the merged weights at each --eval-every and sends them to rank 0.
worker_summary work_collective(const options& o, const std::string& policy, any_model& model,
                               const train::dataset& shard, const cadence::sim::scenario& prof,
                               std::vector<train::exchange_timing>& timings, std::uint64_t& counted) {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 1, 0, &sub);
  worker_summary sum;
  {
    comm_type comm(sub, make_mpi_options(), cadence::transport::deadline(std::chrono::seconds(120)));
    const auto id = static_cast<std::size_t>(comm.rank());
    const std::size_t params = model.parameter_count();
    const float lr = static_cast<float>(o.lr * static_cast<double>(comm.size()));
    const std::string mode = collective_mode(policy);
    std::optional<cadence::exchange::periodic_averager<comm_type>> periodic;
    std::optional<cadence::exchange::elastic_averager<comm_type>> elastic;
    if (mode.rfind("periodic:", 0) == 0)
      periodic.emplace(comm, static_cast<std::size_t>(std::stoull(mode.substr(9))));
    else
      elastic.emplace(comm, mode);
    cadence::sim::iteration_sampler sampler(prof.workers[id], cadence::sim::mix_seed(o.seed, id));
    train::detail::shard_walk walk(0, static_cast<std::uint32_t>(shard.size()), o.batch,
                                   cadence::sim::mix_seed(o.seed + 1, id));
    std::vector<float> w(params), g(params), stop(1);
    model.initialize(w, o.seed);
    std::vector<float> merged = w;  // the model of the last merge
    std::vector<double> snap_times;
    std::vector<float> snaps;
    auto snapshot_until = [&](double t) {
      for (;;) {
        const double next = static_cast<double>(snap_times.size()) * o.eval_every;
        if (next > t || next > o.seconds + 1e-9) return;
        snap_times.push_back(next);
        snaps.insert(snaps.end(), merged.begin(), merged.end());
      }
    };
    timings.clear();
    counted = 0;
    std::int64_t local = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = clock_type::now();
    for (;;) {
      const auto t0 = clock_type::now();
      const double at = std::chrono::duration<double>(t0 - start).count();
      const double d = sampler.next(at);
      model.gradient(w, shard, walk.next(), g);
      const auto until = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(d));
      if (clock_type::now() > until) sum.overruns += 1;
      std::this_thread::sleep_until(until);
      for (std::size_t k = 0; k < params; ++k) w[k] -= lr * g[k];
      sum.iterations += 1;
      ++local;
      const bool due = periodic ? periodic->step_done() : elastic->step_done(clock_type::now() - t0);
      if (!due) continue;
      const auto s0 = clock_type::now();
      const double s_at = std::chrono::duration<double>(s0 - start).count();
      stop[0] = s_at >= o.seconds ? 1.0f : 0.0f;
      if (periodic)
        periodic->sync(w, stop);
      else
        elastic->sync(w, stop);
      const double end = since(start);
      timings.push_back({s_at, since(s0)});
      sum.max_local_steps = std::max(sum.max_local_steps, static_cast<double>(local));
      if (end <= o.seconds) counted += static_cast<std::uint64_t>(local);
      local = 0;
      if (id == 0) {
        snapshot_until(end);
        merged = w;
      }
      if (stop[0] > 0) break;
    }
    if (id == 0) {
      snapshot_until(o.seconds);
      // The curve and the final model go to rank 0, which has the test set.
      const int n = static_cast<int>(snap_times.size());
      MPI_Send(&n, 1, MPI_INT, 0, 7, MPI_COMM_WORLD);
      MPI_Send(snap_times.data(), n, MPI_DOUBLE, 0, 7, MPI_COMM_WORLD);
      MPI_Send(snaps.data(), static_cast<int>(snaps.size()), MPI_FLOAT, 0, 7, MPI_COMM_WORLD);
      MPI_Send(merged.data(), static_cast<int>(params), MPI_FLOAT, 0, 7, MPI_COMM_WORLD);
    }
  }
  MPI_Comm_free(&sub);
  sum.timings = static_cast<double>(timings.size());
  return sum;
}

// Collective modes, on rank 0: no server; it receives worker 0's snapshots and measures them.
train::policy_report observe_collective(const options& o, const std::string& policy, any_model& model,
                                        const train::dataset& test, std::size_t workers) {
  MPI_Comm none = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, 0, &none);
  MPI_Barrier(MPI_COMM_WORLD);
  if (isatty(2) == 0) std::fprintf(stderr, "cadence-train: %s: running over all-reduce among the workers\n", policy.c_str());
  const std::size_t params = model.parameter_count();
  int n = 0;
  MPI_Recv(&n, 1, MPI_INT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  std::vector<double> times(static_cast<std::size_t>(n));
  std::vector<float> snaps(static_cast<std::size_t>(n) * params), final_w(params);
  MPI_Recv(times.data(), n, MPI_DOUBLE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Recv(snaps.data(), static_cast<int>(snaps.size()), MPI_FLOAT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Recv(final_w.data(), static_cast<int>(params), MPI_FLOAT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  train::policy_report r;
  r.policy = policy;
  r.transport = "mpi-allreduce";
  r.workers = workers;
  r.seconds = o.seconds;
  for (std::size_t k = 0; k < times.size(); ++k) {
    const auto e = model.evaluate(cadence::span<const float>(snaps.data() + k * params, params), test, o.test_limit);
    r.curve.push_back({times[k], e.accuracy});
    r.best_accuracy = std::max(r.best_accuracy, e.accuracy);
  }
  r.final_accuracy = model.evaluate(final_w, test, 0).accuracy;
  r.time_to_70 = train::time_to(r.curve, 0.70);
  r.time_to_80 = train::time_to(r.curve, 0.80);
  return r;
}

int run(int argc, char** argv, int rank, int size) {
  const options o = parse(argc, argv);
  if (o.help) {
    if (rank == 0) print_help();
    return 0;
  }
  if (size < 2)
    throw usage_error("needs at least 2 MPI ranks (1 server + at least 1 worker), got " + std::to_string(size) +
                      "; run it as: mpirun -np 5 cadence-train ...");
  const auto workers = static_cast<std::size_t>(size - 1);
  cadence::sim::scenario prof;
  try {
    prof = train::make_profile(o.profile, workers, o.seconds, o.seed);
  } catch (const cadence::invalid_parameter_error& e) {
    throw usage_error(std::string("--profile: ") + e.what());
  }
  for (const auto& p : o.policies) {
    try {
      if (is_collective(p)) {
        cadence::sim::scenario tiny = prof;
        tiny.seconds = 0.5;
        (void)cadence::sim::simulate_collective(collective_mode(p), tiny);  // parses the mode
      } else {
        (void)cadence::make_controller(p, workers);
      }
    } catch (const cadence::error& e) {
      throw usage_error(std::string("--policy: ") + e.what());
    }
  }
  train::train_test_data data;
  try {
    data = train::load_fashion_mnist(o.data);
  } catch (const cadence::error& e) {
    throw usage_error(std::string("--data: ") + e.what());
  }
  const std::size_t n_train = o.train_limit == 0 ? data.train.size() : std::min(o.train_limit, data.train.size());
  if (n_train < workers)
    throw usage_error("--train-limit: " + std::to_string(n_train) + " images for " + std::to_string(workers) +
                      " workers; every worker needs at least one");
  any_model model(o, data.train.features(), 10);

  // Who is who, with the pids (to stop a worker by hand: see docs/train.md).
  std::vector<int> pids(static_cast<std::size_t>(size));
  int pid = static_cast<int>(getpid());
  MPI_Gather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::string list;
    for (int r = 0; r < size; ++r) list += (r ? " " : "") + std::to_string(pids[static_cast<std::size_t>(r)]);
    std::fprintf(stderr,
                 "cadence-train: %s on Fashion-MNIST (%zu training images in %zu shards, batch %zu, lr %g); profile "
                 "%s, %g s per policy, seed %llu\ncadence-train: rank pids: %s (rank 0 serves; rank r is worker r-1)\n",
                 model.describe().c_str(), n_train, workers, o.batch, o.lr, o.profile.c_str(), o.seconds,
                 static_cast<unsigned long long>(o.seed), list.c_str());
  }

  // Each rank keeps only what it needs: the server the test set, a worker its shard.
  train::dataset test, shard;
  if (rank == 0) {
    test = std::move(data.test);
  } else {
    const std::size_t p = static_cast<std::size_t>(rank - 1);
    const std::size_t first = p * n_train / workers, last = (p + 1) * n_train / workers;
    shard.rows = data.train.rows;
    shard.cols = data.train.cols;
    shard.classes = data.train.classes;
    shard.labels.assign(data.train.labels.begin() + static_cast<std::ptrdiff_t>(first),
                        data.train.labels.begin() + static_cast<std::ptrdiff_t>(last));
    shard.images.assign(data.train.images.begin() + static_cast<std::ptrdiff_t>(first * shard.features()),
                        data.train.images.begin() + static_cast<std::ptrdiff_t>(last * shard.features()));
  }
  data = {};

  std::vector<train::policy_report> reports;
  for (std::size_t k = 0; k < o.policies.size(); ++k) {
    const std::string& policy = o.policies[k];
    train::policy_report r;
    worker_summary mine;
    std::vector<train::exchange_timing> timings;
    std::uint64_t counted = 0;
    const bool collective = is_collective(policy);
    if (rank == 0)
      r = collective ? observe_collective(o, policy, model, test, workers) : serve(o, policy, k, model, test, workers);
    else
      mine = collective ? work_collective(o, policy, model, shard, prof, timings, counted)
                        : work(o, model, shard, prof, timings);
    double mine_counted = static_cast<double>(counted), total_counted = 0;
    MPI_Reduce(&mine_counted, &total_counted, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);

    // Rank 0 collects every worker's summary and push_pull timings.
    std::vector<worker_summary> sums(static_cast<std::size_t>(size));
    MPI_Gather(&mine, summary_words, MPI_DOUBLE, sums.data(), summary_words, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    std::vector<int> counts(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size));
    int mine_count = static_cast<int>(2 * timings.size());
    MPI_Gather(&mine_count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    int total = 0;
    for (int q = 0; q < size; ++q) {
      displs[static_cast<std::size_t>(q)] = total;
      total += counts[static_cast<std::size_t>(q)];
    }
    std::vector<double> all(static_cast<std::size_t>(std::max(total, 1)));
    MPI_Gatherv(timings.data(), mine_count, MPI_DOUBLE, all.data(), counts.data(), displs.data(), MPI_DOUBLE, 0,
                MPI_COMM_WORLD);
    if (rank != 0) continue;

    std::vector<std::vector<train::exchange_timing>> per_worker(workers);
    double iterations = 0, overruns = 0;
    for (std::size_t p = 0; p < workers; ++p) {
      const auto q = static_cast<std::size_t>(p + 1);
      const auto* t = all.data() + displs[q];
      for (int i = 0; i + 1 < counts[q]; i += 2) per_worker[p].push_back({t[i], t[i + 1]});
      iterations += sums[q].iterations;
      overruns += sums[q].overruns;
      if (collective)  // the most local steps between merges: a local model's lag
        r.max_staleness = std::max<std::int64_t>(r.max_staleness, static_cast<std::int64_t>(sums[q].max_local_steps));
    }
    if (collective) {
      r.iterations = static_cast<std::uint64_t>(total_counted);
      r.iterations_per_second = total_counted / o.seconds;
      r.p99_staleness = r.max_staleness;
    }
    r.transfer_seconds = train::transfer_seconds(per_worker);
    if (!o.trace.empty() && !collective)
      cadence::write_iteration_trace_file(train::trace_file_for(o.trace, policy, o.policies.size()),
                                          train::trace_from_timings(per_worker, r.transfer_seconds));
    r.wait_fraction = train::wait_fraction(per_worker, r.transfer_seconds, o.seconds);
    r.overrun_fraction = iterations > 0 ? overruns / iterations : 0;

    // The simulator on the same profile, policy and measured transfer cost.
    cadence::sim::scenario s = prof;
    if (collective) {
      cadence::sim::collective_options co;
      co.allreduce_seconds = r.transfer_seconds;
      const auto m = cadence::sim::simulate_collective(collective_mode(policy), s, co);
      r.simulated_iterations_per_second = m.steps_per_second;
      r.simulated_wait_fraction = m.wait_fraction;
    } else {
      s.push_seconds = s.pull_seconds = r.transfer_seconds / 2;
      cadence::sim::run_options ro;
      ro.time_controller = false;
      const auto m = cadence::sim::simulate(policy, s, ro);
      r.simulated_iterations_per_second = m.iterations_per_second;
      r.simulated_wait_fraction = m.wait_fraction;
    }
    char t80[32] = "-";
    if (std::isfinite(r.time_to_80)) std::snprintf(t80, sizeof t80, "%.1f s", r.time_to_80);
    std::fprintf(stderr,
                 "cadence-train: %s: %.2f it/s (simulated %.2f, error %.1f%%), wait %.1f%% (simulated %.1f%%, error "
                 "%.1f%% = %.1f points), t@80%% %s, final %.1f%%, transfer %.2f ms, compute overran the profile in %.1f%% of "
                 "iterations\n",
                 r.policy.c_str(), r.iterations_per_second, r.simulated_iterations_per_second,
                 100 * train::relative_error(r.simulated_iterations_per_second, r.iterations_per_second),
                 100 * r.wait_fraction, 100 * r.simulated_wait_fraction,
                 100 * train::relative_error(r.simulated_wait_fraction, r.wait_fraction),
                 100 * std::fabs(r.simulated_wait_fraction - r.wait_fraction), t80,
                 100 * r.final_accuracy, 1e3 * r.transfer_seconds, 100 * r.overrun_fraction);
    reports.push_back(std::move(r));
  }
  if (rank != 0) return 0;

  if (!o.curves.empty()) {
    std::ofstream f(o.curves);
    f << train::curves_csv(reports);
    if (!f) throw cadence::error("--curves: cannot write '" + o.curves + "'");
  }
  if (o.json) {
    std::fputs(train::to_json(reports).c_str(), stdout);
  } else if (o.csv) {
    std::fputs(train::to_csv(reports).c_str(), stdout);
  } else {
    std::printf("%-14s %7s %7s %7s %7s %8s %7s %6s %13s %8s %13s %13s\n", "policy", "final", "best", "t@70%",
                "t@80%", "iters", "it/s", "wait%", "stale p99/max", "evicted", "sim it/s(err)", "sim wait(err)");
    for (const auto& r : reports) {
      auto secs = [](double v) { return std::isfinite(v) ? std::to_string(static_cast<int>(std::lround(v))) + "s" : std::string("-"); };
      std::string ev;
      for (int e : r.evicted) ev += (ev.empty() ? "" : ",") + std::to_string(e);
      char sim_it[32], sim_wait[32];
      std::snprintf(sim_it, sizeof sim_it, "%.1f(%.0f%%)", r.simulated_iterations_per_second,
                    100 * train::relative_error(r.simulated_iterations_per_second, r.iterations_per_second));
      std::snprintf(sim_wait, sizeof sim_wait, "%.1f%%(%.0f%%)", 100 * r.simulated_wait_fraction,
                    100 * train::relative_error(r.simulated_wait_fraction, r.wait_fraction));
      std::printf("%-14s %6.1f%% %6.1f%% %7s %7s %8llu %7.1f %5.1f%% %6lld/%-6lld %8s %13s %13s\n", r.policy.c_str(),
                  100 * r.final_accuracy, 100 * r.best_accuracy, secs(r.time_to_70).c_str(),
                  secs(r.time_to_80).c_str(), static_cast<unsigned long long>(r.iterations), r.iterations_per_second,
                  100 * r.wait_fraction, static_cast<long long>(r.p99_staleness),
                  static_cast<long long>(r.max_staleness), ev.empty() ? "-" : ev.c_str(), sim_it, sim_wait);
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 0;
  // Every rank parses the same command line and reads the same files, so a usage error is
  // the same everywhere: each rank stops before any communication, rank 0 alone says why.
  try {
    rc = run(argc, argv, rank, size);
  } catch (const usage_error& e) {
    if (rank == 0) std::fprintf(stderr, "cadence-train: error: %s\n", e.what());
    rc = 2;
  } catch (const std::exception& e) {
    // A failure of one rank mid-run (a lost server, a transfer past its deadline): the others
    // may wait for it in a collective, so end the whole job rather than hang.
    std::fprintf(stderr, "cadence-train (rank %d): error: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
