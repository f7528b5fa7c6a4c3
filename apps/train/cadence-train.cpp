// cadence-train: trains a real model on Fashion-MNIST across processes, MPI (mpirun) or gloo
// or ZeroMQ (launch-gloo.sh) (rank 0 serves, the others compute real gradients on their shards) under each
// policy in turn, with per-worker speed profiles, and holds the simulator's prediction of the
// same run against what it measured.
#include "cli.hpp"
#include "idx.hpp"
#include "job.hpp"
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

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <cstring>
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

// ---- the command line: --help, the options, parse ----

void print_help() {
  std::cout <<
R"(usage: mpirun -np N cadence-train [options]
       launch-gloo.sh -n N cadence-train --transport gloo|zmq [options]

Trains a real model on Fashion-MNIST across N processes (MPI ranks, or gloo or ZeroMQ
processes that launch-gloo.sh starts): rank 0 is the parameter server, ranks 1..N-1 are workers that
compute real gradients on their shard of the training set.
Each policy runs in turn, on fresh server and workers. Each worker's iterations are stretched
to its speed profile (sleeping until the profile's iteration time has passed), so a 2-core
machine can host a heterogeneous cluster. Afterwards rank 0 replays the same profile, policy
and measured push/pull cost in cadence's simulator and prints both.

  mpirun --allow-run-as-root --oversubscribe -np 5 cadence-train --json
  apps/train/launch-gloo.sh -n 5 cadence-train --transport gloo --json
  apps/train/launch-gloo.sh -n 5 --survive-workers cadence-train --transport zmq --json

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
  --evict-after S    the server evicts a worker silent for S seconds (default: the run's
                     seconds + 60, so a killed worker cannot hold the run forever)
  --json             one JSON array on stdout (rank 0), one object per policy
  --csv              one CSV row per policy (at most one of --json and --csv)
  --curves FILE      also write the accuracy curves (policy,seconds,accuracy) to FILE
  --trace FILE       also write each parameter-server policy's iteration trace (per worker
                     and iteration: start, compute, push, pull) for cadence-sim --trace;
                     with several policies, one file each: FILE-<policy> (docs/trace.md)
  --join-after S     zmq: the last rank is a worker that joins the first policy S seconds
                     after the others started it (S < --seconds; the first policy must be a
                     parameter-server one): the server starts with one worker fewer, and
                     the late one joins under the next worker id and trains until the
                     policy's end
  --rejoin           zmq: this process replaces a killed worker in its rank slot (a wrapper
                     restarts it with the same flags plus this one): it joins the policy
                     now running under a new worker id, trains until its end and exits; it
                     takes no part in the bookkeeping after the policy, so rank 0 counts the
                     rank gone then and skips the remaining policies
  --push-log FILE    for fault tests: each rank appends to FILE.rank<r>, one line
                     "<policy index> <worker id> <iteration>" per push: rank 0 the pushes its
                     server applied (after each parameter-server policy), a worker each push
                     acknowledged to it (push_pull returned; written at once)
  --transport T      mpi (default; the ranks mpirun started), gloo or zmq (processes that
                     talk over TCP and meet in a shared folder or at rank 0's TCP store;
                     launch-gloo.sh starts them and sets rank, size and store). zmq isolates
                     a lost peer: the server outlives a worker killed at any moment; over
                     gloo a worker that dies while the server talks to it fails the server's
                     communicator
  --rank R           gloo, zmq: this process's rank (default: $CADENCE_TRAIN_RANK)
  --size N           gloo, zmq: the number of processes (default: $CADENCE_TRAIN_SIZE)
  --store DIR        gloo, zmq: the rendezvous folder, empty and shared by all the processes
                     of one run (default: $CADENCE_TRAIN_STORE)
  --rendezvous H:P   gloo, zmq, instead of --store: rank 0 serves a TCP store at H:P (one
                     of its own addresses) for the whole run and the others reach it there,
                     so hosts need no shared folder (default: $CADENCE_TRAIN_RENDEZVOUS)
  --address A        gloo, zmq: the address this process binds and the others reach it by
                     (default: $CADENCE_TRAIN_ADDR, else 127.0.0.1)
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
  std::string push_log;
  std::optional<double> join_after;  // zmq: the last rank joins the first policy this late
  bool rejoin = false;               // zmq: this process replaces a killed worker
  std::string transport = "mpi";
  std::optional<int> rank, size;  // gloo
  std::string store;              // gloo, zmq: a shared folder ...
  std::string rendezvous;         // ... or rank 0's TCP store
  std::string address;            // gloo, zmq
};

options parse(int argc, char** argv) {
  options o;
  cadence::tools::flag_reader args(argc, argv);
  args.at_most_one_of({"--json", "--csv"});
  args.at_most_once({"--profile", "--seconds", "--seed", "--data", "--model", "--hidden", "--lr", "--batch",
                     "--eval-every", "--train-limit", "--test-limit", "--evict-after", "--curves", "--trace",
                     "--push-log", "--join-after",
                     "--transport", "--rank", "--size", "--store", "--rendezvous", "--address"});
  args.at_most_one_of({"--store", "--rendezvous"});
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
    } else if (flag == "--join-after") {
      o.join_after = cadence::tools::parse_flag_real(flag, args.value(), true, 86400);
    } else if (flag == "--rejoin") {
      args.no_value();
      o.rejoin = true;
    } else if (flag == "--push-log") {
      o.push_log = std::string(args.value());
      if (o.push_log.empty()) throw usage_error("--push-log: expected a file name, got ''");
    } else if (flag == "--transport") {
      o.transport = std::string(args.value());
      if (o.transport != "mpi" && o.transport != "gloo" && o.transport != "zmq")
        throw usage_error("--transport: expected mpi, gloo or zmq, got '" + o.transport + "'");
    } else if (flag == "--rank") {
      o.rank = cadence::tools::parse_flag_integer<int>(flag, args.value(), 0, 1 << 20);
    } else if (flag == "--size") {
      o.size = cadence::tools::parse_flag_integer<int>(flag, args.value(), 1, 1 << 20);
    } else if (flag == "--store") {
      o.store = std::string(args.value());
    } else if (flag == "--rendezvous") {
      o.rendezvous = std::string(args.value());
      if (o.rendezvous.empty()) throw usage_error("--rendezvous: expected HOST:PORT, got ''");
    } else if (flag == "--address") {
      o.address = std::string(args.value());
    } else {
      args.unknown();
    }
  }
  const std::string fixed = o.transport == "mpi" ? "MPI job" : "gloo mesh, fixed at rendezvous";
  if (o.join_after && o.transport != "zmq")
    throw usage_error("--join-after: needs --transport zmq (a process cannot join a running " + fixed +
                      "), got --transport " + o.transport);
  if (o.rejoin && o.transport != "zmq")
    throw usage_error("--rejoin: needs --transport zmq (a process cannot join a running " + fixed +
                      "), got --transport " + o.transport);
  if (o.join_after && !(*o.join_after < o.seconds))
    throw usage_error("--join-after: " + cadence::tools::detail::number_text(*o.join_after) +
                      " s must be less than --seconds " + cadence::tools::detail::number_text(o.seconds) +
                      " (the late worker joins the running policy)");
  if (o.seconds / o.eval_every > 10000)
    throw usage_error("--eval-every: " + std::to_string(o.eval_every) + " s over a " + std::to_string(o.seconds) +
                      " s run means more than 10000 snapshots; use --eval-every >= " +
                      std::to_string(o.seconds / 10000));
  if (o.policies.empty()) o.policies.assign(std::begin(default_policies), std::end(default_policies));
  return o;
}

// ---- the model, the policies and the bookkeeping of an exchange ----

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
  // Parameter-server modes: the id server 0 gave this worker (-1: none), which finds its
  // parked time in the server's stats (ids need not be rank - 1: a worker that joins late or
  // comes back gets the next free one).
  double id = -1;
};
constexpr int summary_words = 6;

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
  // The server's observer: evictions, joins and refusals as they happen.
  void event(const cadence::exchange::ps_event& e) {
    using kind = cadence::exchange::ps_event::kind;
    if (e.what == kind::finished) return;
    const char* what = e.what == kind::evicted ? "evicted" : e.what == kind::joined ? "joined" : "refused";
    std::fprintf(stderr, "%scadence-train: %s: worker %u %s at %.1f s: %s\n", tty ? "\n" : "", label.c_str(),
                 static_cast<unsigned>(e.worker), what, since(start), e.reason.c_str());
    std::fflush(stderr);
  }
  void progress(double t) {
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

// --push-log: this rank's record of pushes, FILE.rank<r>, lines "<policy index> <worker id>
// <iteration>" (rank 0: applied by its server; a worker: acknowledged to it). Opened for
// appending (a process restarted in the same rank slot adds to its predecessor's lines) and
// written with one write(2) per batch of lines, so nothing waits in a buffer for a kill -9.
class push_log {
public:
  push_log(const std::string& base, int rank) {
    if (base.empty()) return;
    path_ = base + ".rank" + std::to_string(rank);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) throw cadence::error("--push-log: cannot open '" + path_ + "': " + std::strerror(errno));
  }
  push_log(const push_log&) = delete;
  push_log& operator=(const push_log&) = delete;
  ~push_log() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool enabled() const noexcept { return fd_ >= 0; }
  static std::string line(std::size_t policy, std::uint64_t worker, std::int64_t iteration) {
    return std::to_string(policy) + " " + std::to_string(worker) + " " + std::to_string(iteration) + "\n";
  }
  void write(const std::string& text) {
    if (fd_ < 0) return;
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw cadence::error("--push-log: cannot write '" + path_ + "': " + std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
  }

private:
  std::string path_;
  int fd_ = -1;
};

using ps_options = cadence::exchange::ps_options;

ps_options make_ps_options(const options& o, std::optional<int> initial_workers = std::nullopt) {
  using seconds = std::chrono::duration<double>;
  const auto ns = [](double s) { return std::chrono::duration_cast<std::chrono::nanoseconds>(seconds(s)); };
  ps_options po;
  po.servers = 1;
  po.initial_workers = initial_workers;
  // By default a worker silent for longer than the run plus a minute is evicted: no healthy
  // worker is (a parked one sends heartbeats), and a killed or stopped one would otherwise keep
  // the server waiting for its finish() forever.
  const double evict = o.evict_after ? *o.evict_after : o.seconds + 60;
  po.evict_after = ns(evict);
  // The other timeouts follow from it: a reply that has not left within transfer_timeout drops
  // its worker (between 5 s and a minute: a model slice on a LAN takes far less), and a worker
  // waits for its reply no longer than its straggler's eviction plus that transfer plus 10 s.
  const double transfer = std::clamp(evict, 5.0, 60.0);
  po.transfer_timeout = ns(transfer);
  po.reply_timeout = ns(evict + transfer + 10);
  return po;
}

// Tag of the bookkeeping between policies on the job's world communicator.
constexpr int tag_collect = 7;
// Rank 0's word to each worker after a policy's bookkeeping: go on (1) or stop (0).
constexpr int tag_verdict = 8;
// How long rank 0 waits, after a policy, for the record of a worker the server evicted. One
// that was only stopped sends it once resumed; one that sent nothing by then (MPI under
// mpirun --enable-recovery), or whose connection closed (gloo under launch-gloo.sh
// --survive-workers), is gone (killed): it is left out of everything after, and the remaining
// policies are skipped, since each policy's communicator is made over every rank.
constexpr std::chrono::seconds gone_grace{3};

// Tag of the start of a policy on its communicator when a rank joins it late.
constexpr int tag_start = 9;

// ---- one policy on one rank: the server, a worker, and their collective-mode forms ----

// Whether policy k has a late rank (--join-after: the first policy, the last rank).
bool late_policy(const options& o, std::size_t k) { return o.join_after.has_value() && k == 0; }

// The communicator of policy k over every rank; with a late rank one that waits only for this
// rank's own registration (zmq), so the others start without it and it registers later. A
// joining process (`joiner_left`: the seconds left in the policy) waits for rank 0 no longer
// than the policy can still run, plus 10 s: a server whose members were all gone ended early.
template <class Job>
std::unique_ptr<typename Job::comm_type> connect_policy(Job& job, const options& o, std::size_t k,
                                                        std::optional<double> joiner_left = std::nullopt) {
  if constexpr (Job::joinable) {
    if (joiner_left)
      return job.connect_all(k, true, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::duration<double>(std::max(0.0, *joiner_left) + 10.0)));
    if (late_policy(o, k) || o.rejoin) return job.connect_all(k, true);
  }
  return job.connect_all(k);
}

double epoch_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The start of a policy: a barrier, or with a late rank (`late` >= 0) rank 0 hears from every
// other rank but that one and then lets them go (a barrier would wait for the late one).
template <class Comm>
void start_together(Comm& comm, int late) {
  if (late < 0) {
    cadence::transport::barrier(comm, train::connect_timeout);
    return;
  }
  const cadence::transport::deadline d(train::connect_timeout);
  unsigned char b = 0;
  if (comm.rank() != 0) {
    comm.send(&b, 1, 0, tag_start, d);
    comm.recv(&b, 1, 0, tag_start, d);
    return;
  }
  for (int q = 1; q < comm.size(); ++q)
    if (q != late) comm.recv(&b, 1, q, tag_start, d);
  for (int q = 1; q < comm.size(); ++q)
    if (q != late) comm.send(&b, 1, q, tag_start, d);
}

// Runs one policy on rank 0 (the server); returns its report (the simulated part filled in
// later).
template <class Job>
train::policy_report serve(Job& job, const options& o, const std::string& policy, std::size_t index, any_model& model,
                           const train::dataset& test, std::size_t workers, push_log& log) {
  using comm_type = typename Job::comm_type;
  const bool late = late_policy(o, index);
  const auto connection = connect_policy(job, o, index);
  comm_type& comm = *connection;
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
  // A late rank is no member at first: its first pull makes it one under the next id.
  const std::size_t initial = late ? workers - 1 : workers;
  ps_options po = make_ps_options(o, late ? std::optional<int>(static_cast<int>(initial)) : std::nullopt);
  po.observer = [&side](const cadence::exchange::ps_event& e) { side.event(e); };
  po.keep_log = log.enabled();
  cadence::exchange::parameter_server<comm_type, cadence::any_controller, float, sgd_with_snapshots> server(
      comm, params, w0.data(), cadence::make_controller(policy, initial), sgd_with_snapshots{&side}, po);
  start_together(comm, late ? comm.size() - 1 : -1);
  side.start = clock_type::now();
  if constexpr (Job::joinable) job.publish_running(index, epoch_seconds());  // for --rejoin
  // Tests wait for this line before they stop or kill a worker.
  std::fprintf(stderr, "%scadence-train: %s: running\n", side.tty ? "\n" : "", side.label.c_str());
  std::fflush(stderr);
  server.run();
  const double ran = since(side.start);
  if (log.enabled()) {
    std::string lines;
    for (const auto& e : server.stats().log) lines += push_log::line(index, e.worker, e.iteration);
    log.write(lines);
  }
  if (side.tty) std::fprintf(stderr, "\n");
  const std::vector<float> final_w(server.weights().begin(), server.weights().end());
  side.snapshot_until(o.seconds, final_w.data());  // quiet tail: the weights did not change

  train::policy_report r;
  r.policy = server.controller().config();
  r.transport = std::string(job.name()) + "-ps";
  r.workers = workers;
  r.seconds = o.seconds;
  r.iterations = side.in_time;
  r.iterations_per_second = static_cast<double>(side.in_time) / o.seconds;
  const auto& st = server.stats();
  for (const auto v : st.max_start_staleness) r.max_staleness = std::max<std::int64_t>(r.max_staleness, v);
  r.p99_staleness = cadence::exchange::histogram_percentile(st.staleness_histogram, 99.0);
  for (const auto& e : st.evictions) r.evicted.push_back(static_cast<int>(e.worker));
  std::sort(r.evicted.begin(), r.evicted.end());
  r.parked_seconds = st.parked_seconds;
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
template <class Job>
// `rejoin_for`: this process replaces a killed worker (--rejoin) and trains that long.
worker_summary work(Job& job, std::size_t index, const options& o, any_model& model, const train::dataset& shard,
                    const cadence::sim::scenario& prof, std::vector<train::exchange_timing>& timings, push_log& log,
                    std::optional<double> rejoin_for = std::nullopt) {
  using comm_type = typename Job::comm_type;
  const bool late_run = late_policy(o, index);
  const bool late_me = late_run && job.rank() == job.size() - 1 && !rejoin_for;
  // The late rank starts --join-after seconds after the others and trains until their end.
  if (late_me) std::this_thread::sleep_for(std::chrono::duration<double>(*o.join_after));
  const bool joining = late_me || rejoin_for.has_value();
  const double seconds = rejoin_for ? *rejoin_for : late_me ? o.seconds - *o.join_after : o.seconds;
  const auto connection = connect_policy(job, o, index, joining ? std::optional<double>(seconds) : std::nullopt);
  comm_type& comm = *connection;
  const ps_options po =
      make_ps_options(o, late_run ? std::optional<int>(job.size() - 2) : std::nullopt);
  cadence::exchange::ps_worker<comm_type> worker(comm, model.parameter_count(), po);
  const auto id = static_cast<std::size_t>(worker.id());
  cadence::sim::iteration_sampler sampler(prof.workers[id], cadence::sim::mix_seed(o.seed, id));
  train::detail::shard_walk walk(0, static_cast<std::uint32_t>(shard.size()), o.batch, cadence::sim::mix_seed(o.seed + 1, id));
  std::vector<float> w(model.parameter_count()), g(model.parameter_count());
  worker_summary sum;
  timings.clear();
  if (!joining) start_together(comm, late_run ? comm.size() - 1 : -1);
  try {
    worker.pull(w.data());  // a late or replacing process joins here
    const auto start = clock_type::now();
    for (;;) {
      const auto t0 = clock_type::now();
      const double at = std::chrono::duration<double>(t0 - start).count();
      if (at >= seconds) break;
      const double d = sampler.next(at);
      model.gradient(w, shard, walk.next(), g);
      const auto until = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(d));
      if (clock_type::now() > until) sum.overruns += 1;
      std::this_thread::sleep_until(until);
      const auto p0 = clock_type::now();
      worker.push_pull(g.data(), w.data());
      log.write(push_log::line(index, worker.id(), worker.iteration()));  // acknowledged
      timings.push_back({std::chrono::duration<double>(p0 - start).count(), since(p0)});
      sum.iterations += 1;
    }
    worker.finish();
  } catch (const cadence::worker_error& e) {
    // Evicted (e.g. stopped with SIGSTOP past --evict-after): the server goes on without us.
    sum.evicted = 1;
    std::fprintf(stderr, "cadence-train: worker %zu: %s\n", id, e.what());
  }
  sum.id = static_cast<double>(worker.id());  // the server's, known since the first pull
  sum.timings = static_cast<double>(timings.size());
  return sum;
}

// Collective modes, on a worker rank: local SGD steps stretched to the profile, merged by the
// adapter over an all-reduce among the workers only. Every merge also all-reduces a stop vote,
// so all ranks leave after the same merge (the first one after any rank passed the run's end).
// Worker 0 keeps the merged weights at each --eval-every and sends them to rank 0.
template <class Job>
worker_summary work_collective(Job& job, std::size_t index, const options& o, const std::string& policy,
                               any_model& model, const train::dataset& shard, const cadence::sim::scenario& prof,
                               std::vector<train::exchange_timing>& timings, std::uint64_t& counted) {
  using comm_type = typename Job::comm_type;
  auto connection = job.connect_workers(index);
  worker_summary sum;
  {
    comm_type& comm = *connection;
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
    cadence::transport::barrier(job.world(), train::connect_timeout);
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
      auto& world = job.world();
      const cadence::transport::deadline d(train::connect_timeout);
      const std::uint64_t n = snap_times.size();
      world.send(&n, sizeof n, 0, tag_collect, d);
      if (n != 0) {
        world.send(snap_times.data(), n * sizeof(double), 0, tag_collect, d);
        world.send(snaps.data(), snaps.size() * sizeof(float), 0, tag_collect, d);
      }
      world.send(merged.data(), params * sizeof(float), 0, tag_collect, d);
    }
  }
  job.disconnect_workers(connection);
  sum.timings = static_cast<double>(timings.size());
  return sum;
}

// Collective modes, on rank 0: no server; it receives worker 0's snapshots and measures them.
template <class Job>
train::policy_report observe_collective(Job& job, std::size_t index, const options& o, const std::string& policy,
                                        any_model& model, const train::dataset& test, std::size_t workers) {
  auto none = job.connect_workers(index);  // collective under MPI; rank 0 takes no part
  auto& world = job.world();
  cadence::transport::barrier(world, train::connect_timeout);
  if (isatty(2) == 0) std::fprintf(stderr, "cadence-train: %s: running over all-reduce among the workers\n", policy.c_str());
  const std::size_t params = model.parameter_count();
  // Worker 0 (rank 1) sends when the run ends: wait as long as the run, and then some.
  const cadence::transport::deadline d(std::chrono::duration<double>(o.seconds) + train::connect_timeout);
  std::uint64_t n = 0;
  world.recv(&n, sizeof n, 1, tag_collect, d);
  std::vector<double> times(static_cast<std::size_t>(n));
  std::vector<float> snaps(static_cast<std::size_t>(n) * params), final_w(params);
  if (n != 0) {
    world.recv(times.data(), times.size() * sizeof(double), 1, tag_collect, d);
    world.recv(snaps.data(), snaps.size() * sizeof(float), 1, tag_collect, d);
  }
  world.recv(final_w.data(), params * sizeof(float), 1, tag_collect, d);
  job.disconnect_workers(none);
  train::policy_report r;
  r.policy = policy;
  r.transport = std::string(job.name()) + "-allreduce";
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

// ---- run, phase by phase: before the first policy (every rank) ----

// The speed profile for `workers`, after checking it and every policy, so that a bad flag
// stops every rank before any communication.
cadence::sim::scenario checked_profile(const options& o, std::size_t workers) {
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
  if (o.join_after && workers < 2)
    throw usage_error("--join-after: needs at least 2 workers (the last one joins late), got " +
                      std::to_string(workers));
  if (o.join_after && is_collective(o.policies.front()))
    throw usage_error("--join-after: the first policy must be a parameter-server one (a worker joins the server), "
                      "got '" + o.policies.front() + "'");
  return prof;
}

// Fashion-MNIST from --data; sets n_train to the training images used (--train-limit), at
// least one per worker.
train::train_test_data load_data(const options& o, std::size_t workers, std::size_t& n_train) {
  train::train_test_data data;
  try {
    data = train::load_fashion_mnist(o.data);
  } catch (const cadence::error& e) {
    throw usage_error(std::string("--data: ") + e.what());
  }
  n_train = o.train_limit == 0 ? data.train.size() : std::min(o.train_limit, data.train.size());
  if (n_train < workers)
    throw usage_error("--train-limit: " + std::to_string(n_train) + " images for " + std::to_string(workers) +
                      " workers; every worker needs at least one");
  return data;
}

// Every rank's pid to rank 0, which says who is who (to stop a worker by hand: see
// docs/train.md) and what the run is; makes the job's control communicator meanwhile.
template <class Job>
void introduce_ranks(Job& job, const options& o, const any_model& model, std::size_t n_train, std::size_t workers) {
  const int size = job.size();
  const auto pids = train::gather_to_root(job.world(), {static_cast<double>(getpid())}, tag_collect,
                                          train::connect_timeout);
  (void)job.control();  // made now, while every rank is there
  if (job.rank() != 0) return;
  std::string list;
  for (int r = 0; r < size; ++r)
    list += (r ? " " : "") + std::to_string(static_cast<long long>(pids[static_cast<std::size_t>(r)].at(0)));
  std::fprintf(stderr,
               "cadence-train: %s on Fashion-MNIST (%zu training images in %zu shards, batch %zu, lr %g); profile "
               "%s, %g s per policy, seed %llu\ncadence-train: rank pids: %s (rank 0 serves; rank r is worker r-1)\n",
               model.describe().c_str(), n_train, workers, o.batch, o.lr, o.profile.c_str(), o.seconds,
               static_cast<unsigned long long>(o.seed), list.c_str());
}

// What one rank keeps of the data: the server the test set, a worker its shard of the first
// n_train training images.
struct rank_data {
  train::dataset test, shard;
};

rank_data keep_own_part(int rank, train::train_test_data data, std::size_t n_train, std::size_t workers) {
  rank_data mine;
  if (rank == 0) {
    mine.test = std::move(data.test);
    return mine;
  }
  train::dataset& shard = mine.shard;
  const std::size_t p = static_cast<std::size_t>(rank - 1);
  const std::size_t first = p * n_train / workers, last = (p + 1) * n_train / workers;
  shard.rows = data.train.rows;
  shard.cols = data.train.cols;
  shard.classes = data.train.classes;
  shard.labels.assign(data.train.labels.begin() + static_cast<std::ptrdiff_t>(first),
                      data.train.labels.begin() + static_cast<std::ptrdiff_t>(last));
  shard.images.assign(data.train.images.begin() + static_cast<std::ptrdiff_t>(first * shard.features()),
                      data.train.images.begin() + static_cast<std::ptrdiff_t>(last * shard.features()));
  return mine;
}

// ---- run, phase by phase: each policy ----

// What one rank measured under one policy: rank 0 the report, a worker its summary, its
// push_pull timings and (collective modes) the iterations it counted within the run.
struct policy_part {
  train::policy_report report;
  worker_summary summary;
  std::vector<train::exchange_timing> timings;
  std::uint64_t counted = 0;
};

template <class Job>
policy_part run_policy(Job& job, std::size_t k, const options& o, any_model& model, const rank_data& data,
                       const cadence::sim::scenario& prof, std::size_t workers, push_log& log) {
  const std::string& policy = o.policies[k];
  const bool collective = is_collective(policy);
  policy_part part;
  if (job.rank() == 0)
    part.report = collective ? observe_collective(job, k, o, policy, model, data.test, workers)
                             : serve(job, o, policy, k, model, data.test, workers, log);
  else
    part.summary = collective ? work_collective(job, k, o, policy, model, data.shard, prof, part.timings, part.counted)
                              : work(job, k, o, model, data.shard, prof, part.timings, log);
  return part;
}

// Rank 0 collects every worker's count, summary and push_pull timings, as one record:
// [counted, summary (summary_words, in worker_summary's order), then (start, seconds) per
// push_pull]. On rank 0 the records by rank, with `gone` set to the evicted workers' ranks that
// sent nothing in time.
template <class Job>
std::vector<std::vector<double>> gather_records(Job& job, const policy_part& part, std::vector<int>& gone) {
  const worker_summary& mine = part.summary;
  std::vector<double> record{static_cast<double>(part.counted), mine.iterations, mine.overruns, mine.evicted,
                             mine.timings, mine.max_local_steps, mine.id};
  for (const auto& t : part.timings) {
    record.push_back(t.start);
    record.push_back(t.seconds);
  }
  std::vector<int> may_be_gone;
  for (const int e : part.report.evicted) may_be_gone.push_back(e + 1);  // rank 0 only: its report
  return train::gather_to_root(job.world(), record, tag_collect, train::connect_timeout, may_be_gone, gone_grace,
                               gone);
}

// Rank 0 tells every worker still there whether to go on (no worker is gone); each worker
// learns it. Returns the verdict on every rank. Over a communicator that isolates a lost peer
// (zmq), a worker found lost now (killed after it sent its record) joins `gone` and the
// verdict on rank 0 becomes stop; the workers told to go on before are then left waiting for
// the next policy's rendezvous until train::connect_timeout (so a kill in this short window
// after a policy, with policies left, costs the survivors that long; never the server).
template <class Job>
bool share_verdict(Job& job, std::vector<int>& gone) {
  double go = 0;
  if (job.rank() != 0) {
    job.control().recv(&go, sizeof go, 0, tag_verdict, train::connect_timeout);
    return go != 0;
  }
  go = gone.empty() ? 1 : 0;
  auto& control = job.control();
  std::vector<int> lost;
  for (int q = 1; q < job.size(); ++q) {
    if (std::find(gone.begin(), gone.end(), q) != gone.end()) continue;
    try {
      control.send(&go, sizeof go, q, tag_verdict, train::connect_timeout);
    } catch (const cadence::transport_error&) {
      if (!control.capabilities().isolates_lost_peer || control.failed()) throw;
      lost.push_back(q);
    }
  }
  gone.insert(gone.end(), lost.begin(), lost.end());
  return go != 0 && lost.empty();
}

// Rank 0: fills r's measured part from the workers' records (a gone worker's counts as no
// iterations): the iterations of a collective mode, the transfer costs, the wait and overrun
// fractions; writes the policy's iteration trace with --trace. Parameter-server modes: each
// worker's own transfer cost is its blocked time beyond what server 0 parked its pushes
// (r.parked_seconds, found by the worker id in its record); collective modes: one merge cost.
void add_measurements(train::policy_report& r, std::vector<std::vector<double>>& records, const std::vector<int>& gone,
                      const options& o, const std::string& policy, std::size_t workers) {
  const bool collective = is_collective(policy);
  const auto size = static_cast<int>(workers + 1);
  constexpr std::size_t head = 1 + summary_words;
  for (const int q : gone) {  // no iterations known, no worker id
    records[static_cast<std::size_t>(q)].assign(head, 0.0);
    records[static_cast<std::size_t>(q)][head - 1] = -1;
  }
  double total_counted = 0;
  std::vector<worker_summary> sums(static_cast<std::size_t>(size));
  for (int q = 0; q < size; ++q) {
    const auto& rec = records[static_cast<std::size_t>(q)];
    if (rec.size() < head || (rec.size() - head) % 2 != 0)
      throw cadence::error("rank " + std::to_string(q) + " sent a malformed summary of " + std::to_string(rec.size()) +
                           " values");
    total_counted += rec[0];
    sums[static_cast<std::size_t>(q)] = {rec[1], rec[2], rec[3], rec[4], rec[5], rec[6]};
  }

  std::vector<std::vector<train::exchange_timing>> per_worker(workers);
  double iterations = 0, overruns = 0;
  for (std::size_t p = 0; p < workers; ++p) {
    const auto q = static_cast<std::size_t>(p + 1);
    const auto& rec = records[q];
    for (std::size_t i = head; i + 1 < rec.size(); i += 2) per_worker[p].push_back({rec[i], rec[i + 1]});
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
  if (collective) {
    r.transfer_seconds = train::transfer_seconds(per_worker);
    r.worker_transfer_seconds.assign(workers, r.transfer_seconds);
    r.wait_fraction = train::wait_fraction(per_worker, r.transfer_seconds, o.seconds);
  } else {
    std::vector<double> parked(workers, 0.0);
    for (std::size_t p = 0; p < workers; ++p) {
      const double id = sums[p + 1].id;
      if (id >= 0 && id < static_cast<double>(r.parked_seconds.size()))
        parked[p] = r.parked_seconds[static_cast<std::size_t>(id)];
    }
    r.worker_transfer_seconds = train::worker_transfer_seconds(per_worker, parked);
    r.transfer_seconds = train::median_transfer_seconds(r.worker_transfer_seconds);
    const std::vector<double> costs = train::filled_transfer_seconds(r.worker_transfer_seconds);
    if (!o.trace.empty())
      cadence::write_iteration_trace_file(train::trace_file_for(o.trace, policy, o.policies.size()),
                                          train::trace_from_timings(per_worker, costs));
    r.wait_fraction = train::wait_fraction(per_worker, costs, o.seconds);
  }
  r.overrun_fraction = iterations > 0 ? overruns / iterations : 0;
}

// Rank 0: the simulator on the same profile, policy and measured transfer costs: under a
// parameter-server policy each worker's own as its link (half push, half pull), so a worker on
// a slow link is slow in the simulator too; under a collective mode the one merge cost.
void add_simulated(train::policy_report& r, const cadence::sim::scenario& prof, const std::string& policy) {
  cadence::sim::scenario s = prof;
  if (is_collective(policy)) {
    cadence::sim::collective_options co;
    co.allreduce_seconds = r.transfer_seconds;
    const auto m = cadence::sim::simulate_collective(collective_mode(policy), s, co);
    r.simulated_iterations_per_second = m.steps_per_second;
    r.simulated_wait_fraction = m.wait_fraction;
  } else {
    s.push_seconds = s.pull_seconds = r.transfer_seconds / 2;
    const std::vector<double> costs = train::filled_transfer_seconds(r.worker_transfer_seconds);
    for (std::size_t p = 0; p < s.workers.size() && p < costs.size(); ++p)
      s.workers[p].push_seconds = s.workers[p].pull_seconds = costs[p] / 2;
    cadence::sim::run_options ro;
    ro.time_controller = false;
    const auto m = cadence::sim::simulate(policy, s, ro);
    r.simulated_iterations_per_second = m.iterations_per_second;
    r.simulated_wait_fraction = m.wait_fraction;
  }
}

// Rank 0's line on stderr after each policy: measured against simulated.
void print_policy_line(const train::policy_report& r) {
  char t80[32] = "-";
  if (std::isfinite(r.time_to_80)) std::snprintf(t80, sizeof t80, "%.1f s", r.time_to_80);
  std::string links;  // parameter-server modes: each worker's own transfer ("-": none measured)
  const bool ps = r.transport.size() > 3 && r.transport.compare(r.transport.size() - 3, 3, "-ps") == 0;
  for (std::size_t p = 0; ps && p < r.worker_transfer_seconds.size(); ++p) {
    char cell[32] = "-";
    if (!std::isnan(r.worker_transfer_seconds[p]))
      std::snprintf(cell, sizeof cell, "%.2f", 1e3 * r.worker_transfer_seconds[p]);
    links += (p ? "/" : "") + std::string(cell);
  }
  if (!links.empty()) links = " (median; per worker " + links + " ms)";
  std::fprintf(stderr,
               "cadence-train: %s: %.2f it/s (simulated %.2f, error %.1f%%), wait %.1f%% (simulated %.1f%%, error "
               "%.1f%% = %.1f points), t@80%% %s, final %.1f%%, transfer %.2f ms%s, compute overran the profile in %.1f%% "
               "of iterations\n",
               r.policy.c_str(), r.iterations_per_second, r.simulated_iterations_per_second,
               100 * train::relative_error(r.simulated_iterations_per_second, r.iterations_per_second),
               100 * r.wait_fraction, 100 * r.simulated_wait_fraction,
               100 * train::relative_error(r.simulated_wait_fraction, r.wait_fraction),
               100 * std::fabs(r.simulated_wait_fraction - r.wait_fraction), t80,
               100 * r.final_accuracy, 1e3 * r.transfer_seconds, links.c_str(), 100 * r.overrun_fraction);
}

// Rank 0, when evicted workers sent nothing after policy k: who is gone and which policies
// are skipped.
void print_gone(const options& o, std::size_t k, const std::vector<int>& gone) {
  std::string who, skipped;
  for (const int q : gone) who += (who.empty() ? "" : ", ") + std::to_string(q - 1) + " (rank " + std::to_string(q) + ")";
  for (std::size_t j = k + 1; j < o.policies.size(); ++j) skipped += (skipped.empty() ? "" : ", ") + o.policies[j];
  std::fprintf(stderr,
               "cadence-train: %s: worker %s sent nothing after the policy (evicted and silent for %lld s, or "
               "its connection closed): gone (killed?); %s\n",
               o.policies[k].c_str(), who.c_str(), static_cast<long long>(gone_grace.count()),
               skipped.empty() ? "the run reports" : ("the remaining policies are skipped: " + skipped).c_str());
}

// ---- run, phase by phase: the results (rank 0) ----

// Rank 0, at the end: --curves, then the reports as JSON, CSV or a table on stdout.
void print_reports(const options& o, const std::vector<train::policy_report>& reports) {
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
}

// ---- run, and main ----

// --rejoin: this process replaces a killed worker in its rank slot. It joins the policy now
// running (rank 0 names it and its start in the folder's "running") under a new worker id,
// trains until the policy's end, leaves and exits. It takes no part in the bookkeeping after
// the policy (the records of the process it replaces are lost with it), so rank 0 finds the
// rank gone then, reports, and skips the remaining policies.
template <class Job>
int replace_worker(Job& job, const options& o) {
  const int rank = job.rank();
  if (rank == 0) throw usage_error("--rejoin: rank 0 is the server; only a worker's process can be replaced");
  const auto workers = static_cast<std::size_t>(job.size() - 1);
  const cadence::sim::scenario prof = checked_profile(o, workers);
  push_log log(o.push_log, rank);
  std::size_t n_train = 0;
  train::train_test_data data = load_data(o, workers, n_train);
  any_model model(o, data.train.features(), 10);
  const rank_data own = keep_own_part(rank, std::move(data), n_train, workers);
  std::size_t k = 0;
  double start = 0;
  if constexpr (Job::joinable) {
    if (!job.running(k, start))
      throw cadence::error("--rejoin: no policy has started (nothing published as 'running' in the rendezvous folder "
                           "or store): nothing to rejoin");
  }
  if (k >= o.policies.size() || is_collective(o.policies[k]))
    throw cadence::error("--rejoin: the running policy (number " + std::to_string(k + 1) +
                         ") is not a parameter-server policy of this command line");
  const double left = start + o.seconds - epoch_seconds();
  if (left <= 0) {
    std::fprintf(stderr, "cadence-train (rank %d): --rejoin: %s ended %.1f s ago; nothing to rejoin\n", rank,
                 o.policies[k].c_str(), -left);
    return 1;
  }
  std::vector<train::exchange_timing> timings;
  const worker_summary sum = work(job, k, o, model, own.shard, prof, timings, log, left);
  std::fprintf(stderr, "cadence-train (rank %d): --rejoin: %s: %.0f iterations as a new worker; leaving (rank 0 counts "
               "this rank gone after the policy)\n", rank, o.policies[k].c_str(), sum.iterations);
  return 0;
}

// A whole run on this rank: check the flags, load and split the data, then each policy in turn
// (run it, gather the workers' records on rank 0, agree whether to go on, and on rank 0 add
// the measured and simulated figures), and rank 0 prints the reports. A worker found gone
// after a policy ends the run there: its communicators are made over every rank.
template <class Job>
int run(Job& job, const options& o) {
  if constexpr (Job::joinable) {
    if (o.rejoin) return replace_worker(job, o);
  }
  const int rank = job.rank();
  const auto workers = static_cast<std::size_t>(job.size() - 1);
  const cadence::sim::scenario prof = checked_profile(o, workers);
  push_log log(o.push_log, rank);
  std::size_t n_train = 0;
  train::train_test_data data = load_data(o, workers, n_train);
  any_model model(o, data.train.features(), 10);
  introduce_ranks(job, o, model, n_train, workers);
  // Each rank keeps only what it needs; the rest is freed here.
  const rank_data own = keep_own_part(rank, std::move(data), n_train, workers);

  std::vector<train::policy_report> reports;
  for (std::size_t k = 0; k < o.policies.size(); ++k) {
    const std::string& policy = o.policies[k];
    policy_part part = run_policy(job, k, o, model, own, prof, workers, log);
    std::vector<int> gone;
    auto records = gather_records(job, part, gone);
    const bool go_on = share_verdict(job, gone);
    if (rank != 0) {
      if (!go_on) {  // a worker is gone: the remaining policies are skipped
        job.note_gone();
        break;
      }
      continue;
    }
    train::policy_report& r = part.report;
    add_measurements(r, records, gone, o, policy, workers);
    add_simulated(r, prof, policy);
    print_policy_line(r);
    reports.push_back(std::move(r));
    if (!gone.empty()) {
      job.note_gone();
      print_gone(o, k, gone);
      break;
    }
  }
  if (rank != 0) return 0;
  print_reports(o, reports);
  return 0;
}

// Checks what needs the job (its size), then runs.
template <class Job>
int checked_run(Job& job, const options& o, const std::optional<std::string>& parse_error) {
  if (parse_error) throw usage_error(*parse_error);
  if (o.help) {
    if (job.rank() == 0) print_help();
    return 0;
  }
  if (job.size() < 2)
    throw usage_error(std::string("needs at least 2 ") + (std::string(job.name()) == "mpi" ? "MPI " : "") +
                      "ranks (1 server + at least 1 worker), got " +
                      std::to_string(job.size()) + "; run it as: " +
                      (std::string(job.name()) == "mpi" ? std::string("mpirun -np 5 cadence-train ...")
                                                        : "launch-gloo.sh -n 5 cadence-train --transport " +
                                                              std::string(job.name()) + " ..."));
  return run(job, o);
}

// Every rank parses the same command line and reads the same files, so a usage error is the
// same everywhere: each rank stops before any communication, rank 0 alone says why. A failure
// of one rank mid-run (a lost server, a transfer past its deadline) ends the whole job, since
// the others may wait for it.
template <class Job>
int guarded_run(Job& job, const options& o, const std::optional<std::string>& parse_error) {
  try {
    return checked_run(job, o, parse_error);
  } catch (const usage_error& e) {
    if (job.rank() == 0) std::fprintf(stderr, "cadence-train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cadence-train (rank %d): error: %s\n", job.rank(), e.what());
    std::fflush(stderr);
    std::fflush(stdout);
    job.abort_all();
  }
}

// --transport gloo or zmq: rank, size and folder from the flags or the environment.
int main_launched(options o, std::optional<std::string> parse_error) {
  auto from_env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  auto env_int = [&](const char* name, const char* flag, int min) -> std::optional<int> {
    const std::string v = from_env(name);
    if (v.empty()) return std::nullopt;
    try {
      return cadence::tools::parse_flag_integer<int>(std::string(flag) + " (from $" + name + ")", v, min, 1 << 20);
    } catch (const usage_error& e) {
      if (!parse_error) parse_error = e.what();
      return std::nullopt;
    }
  };
  if (!o.rank) o.rank = env_int("CADENCE_TRAIN_RANK", "--rank", 0);
  if (!o.size) o.size = env_int("CADENCE_TRAIN_SIZE", "--size", 1);
  if (o.store.empty() && o.rendezvous.empty()) {
    o.store = from_env("CADENCE_TRAIN_STORE");
    o.rendezvous = from_env("CADENCE_TRAIN_RENDEZVOUS");
    if (!o.store.empty() && !o.rendezvous.empty() && !parse_error)
      parse_error = "$CADENCE_TRAIN_STORE and $CADENCE_TRAIN_RENDEZVOUS are both set; give one (or --store or "
                    "--rendezvous)";
  }
  if (!parse_error && !o.help) {
    if (!o.rank || !o.size || (o.store.empty() && o.rendezvous.empty()))
      parse_error = "--transport " + o.transport +
                    " needs --rank, --size and --store or --rendezvous (or $CADENCE_TRAIN_RANK, $CADENCE_TRAIN_SIZE, "
                    "$CADENCE_TRAIN_STORE or $CADENCE_TRAIN_RENDEZVOUS); launch-gloo.sh sets them";
    else if (*o.rank >= *o.size)
      parse_error = "--rank " + std::to_string(*o.rank) + " is out of range for --size " + std::to_string(*o.size) +
                    " (ranks 0.." + std::to_string(*o.size - 1) + ")";
  }
  if (parse_error && (!o.rank || !o.size || *o.rank >= *o.size)) {  // no rank 0 to speak: each says it
    std::fprintf(stderr, "cadence-train: error: %s\n", parse_error->c_str());
    return 2;
  }
  if (o.address.empty()) o.address = from_env("CADENCE_TRAIN_ADDR");
  if (o.address.empty()) o.address = "127.0.0.1";
  // Where the processes meet. Rank 0 serves the TCP store from here to its exit; a store it
  // cannot serve (the port is taken, the address is not its own) is its error to report.
  std::optional<train::meeting_point> meet;
  if (!parse_error) {
    try {
      meet = o.rendezvous.empty() ? train::meeting_point::folder(o.store)
                                  : train::meeting_point::tcp(o.rendezvous, o.rank.value_or(0) == 0 && !o.rejoin);
    } catch (const std::exception& e) {
      parse_error = "--rendezvous " + o.rendezvous + ": " + e.what();
    }
  }
  if (!meet) meet = train::meeting_point::folder(o.store);  // unused: the run reports parse_error
  if (o.transport == "zmq") {
#if CADENCE_TRAIN_HAS_ZMQ
    train::zmq_job job(o.rank.value_or(0), o.size.value_or(1), std::move(*meet), o.address);
    return guarded_run(job, o, parse_error);
#else
    std::fprintf(stderr, "cadence-train: error: --transport zmq: this build has no ZeroMQ (install libzmq3-dev "
                         "and rebuild)\n");
    return 2;
#endif
  }
#if CADENCE_TRAIN_HAS_GLOO
  train::gloo_job job(o.rank.value_or(0), o.size.value_or(1), std::move(*meet), o.address);
  return guarded_run(job, o, parse_error);
#else
  std::fprintf(stderr, "cadence-train: error: --transport gloo: this build has no gloo (install libgloo-dev and "
                       "rebuild)\n");
  return 2;
#endif
}

// Which transport, before anything starts: MPI_Init must not run in gloo or zmq processes.
bool launched(int argc, char** argv) {
  bool gloo = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    // Anything but mpi takes the launched path, which reports a bad value without starting MPI.
    if (a == "--transport" && i + 1 < argc) gloo = std::string_view(argv[i + 1]) != "mpi";
    if (a.rfind("--transport=", 0) == 0) gloo = a != "--transport=mpi";
  }
  return gloo;
}

}  // namespace

int main(int argc, char** argv) {
  const bool gloo = launched(argc, argv);
  options o;
  std::optional<std::string> parse_error;
  try {
    o = parse(argc, argv);
  } catch (const usage_error& e) {
    parse_error = e.what();
  }
  if (gloo) return main_launched(std::move(o), std::move(parse_error));
#if CADENCE_TRAIN_HAS_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  bool gone = false;
  {
    train::mpi_job job;
    rc = guarded_run(job, o, parse_error);
    gone = job.gone();
  }  // its communicators go before MPI_Finalize
  if (gone) {  // a killed rank: MPI_Finalize could wait for it (mpi_job::note_gone)
    std::fflush(nullptr);
    std::_Exit(rc);
  }
  MPI_Finalize();
  return rc;
#else
  std::fprintf(stderr, "cadence-train: error: this build has no MPI; use --transport gloo or zmq\n");
  return 2;
#endif
}
