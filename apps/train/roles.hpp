// cadence-train's roles: what one rank does under one policy. Rank 0 serves (a parameter
// server) or, under a collective mode, observes; the others work, through the server or
// merging among themselves; a process started with --rejoin replaces a killed worker. The
// collective modes' roles (work_collective, observe) are in collective_roles.hpp.
//
//   ---- the model ----                    any_model: the MLP or softmax regression
//   ---- the bookkeeping of an exchange -- worker_summary, server_side, push_log, ps options
//   ---- what a rank keeps ----            the profile, the data, each rank's part (rank_setup)
//   ---- the start of a policy ----        its communicator; every rank's start together
//   ---- serve ----                        rank 0 under a parameter-server policy
//   ---- work ----                         a worker under a parameter-server policy
//   ---- replace ----                      --rejoin: a worker's process started again
#pragma once

#include "idx.hpp"
#include "job.hpp"
#include "mlp.hpp"
#include "model.hpp"
#include "options.hpp"
#include "race.hpp"
#include "train.hpp"

#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/exchange/local_sgd/diloco.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/sim/collective.hpp>
#include <cadence/sim/simulator.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::train {

using clock_type = std::chrono::steady_clock;

// "diloco:<local-SGD config>" (exchange/local_sgd/options.hpp): DiLoCo among the workers, a
// collective mode of its own (the simulator's collective modes do not model it).
inline bool is_diloco_mode(std::string_view policy) noexcept { return policy.rfind("diloco:", 0) == 0; }
// Any mode over all-reduce among the workers: periodic:, elastic-avg: or diloco:.
inline bool is_collective_run(std::string_view policy) noexcept {
  return is_collective_config(policy) || is_diloco_mode(policy);
}

// ---- the model ----

// The two models behind one face.
class any_model {
public:
  any_model(const train_options& o, std::size_t features, std::size_t classes) {
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

// ---- the bookkeeping of an exchange ----

inline double since(clock_type::time_point t0) {
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
inline constexpr int summary_words = 6;

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

inline ps_options make_ps_options(const train_options& o, std::optional<int> initial_workers = std::nullopt) {
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
inline constexpr int tag_collect = 7;
// Rank 0's word to each worker after a policy's bookkeeping: go on (1) or stop (0).
inline constexpr int tag_verdict = 8;
// How long rank 0 waits, after a policy, for the record of a worker the server evicted. One
// that was only stopped sends it once resumed; one that sent nothing by then (MPI under
// mpirun --enable-recovery), or whose connection closed (gloo under launch-gloo.sh
// --survive-workers), is gone (killed): it is left out of everything after, and the remaining
// policies are skipped, since each policy's communicator is made over every rank.
inline constexpr std::chrono::seconds gone_grace{3};

// Tag of the start of a policy on its communicator when a rank joins it late (and of the
// ready/go start-up over zmq: start_open).
inline constexpr int tag_start = 9;
// Tag of the ranks' introductions over zmq (introduce_ranks), apart from tag_collect.
inline constexpr int tag_introduce = 10;

// ---- what a rank keeps ----

// The speed profile for `workers`, after checking it and every policy, so that a bad flag
// stops every rank before any communication.
inline cadence::sim::scenario checked_profile(const train_options& o, std::size_t workers) {
  cadence::sim::scenario prof;
  try {
    prof = train::make_profile(o.profile, workers, o.seconds, o.seed);
  } catch (const cadence::invalid_parameter_error& e) {
    throw tools::usage_error(std::string("--profile: ") + e.what());
  }
  for (const auto& p : o.policies) {
    try {
      if (is_diloco_mode(p)) {
        const auto c = cadence::exchange::parse_diloco_config(std::string_view(p).substr(7));
        cadence::exchange::check_diloco_options(c.options, cadence::exchange::outer_schedule(c.options.schedule, workers),
                                                "'" + p + "': ");
      } else if (is_collective_config(p)) {
        cadence::sim::scenario tiny = prof;
        tiny.seconds = 0.5;
        (void)cadence::sim::simulate_collective(collective_mode(p), tiny);  // parses the mode
      } else {
        (void)cadence::make_controller(p, workers);
      }
    } catch (const cadence::error& e) {
      throw tools::usage_error(std::string("--policy: ") + e.what());
    }
  }
  if (o.join_after && workers < 2)
    throw tools::usage_error("--join-after: needs at least 2 workers (the last one joins late), got " +
                             std::to_string(workers));
  if (o.join_after && is_collective_run(o.policies.front()))
    throw tools::usage_error("--join-after: the first policy must be a parameter-server one (a worker joins the server), "
                             "got '" + o.policies.front() + "'");
  return prof;
}

// Fashion-MNIST from --data; sets n_train to the training images used (--train-limit), at
// least one per worker.
inline train::train_test_data load_data(const train_options& o, std::size_t workers, std::size_t& n_train) {
  train::train_test_data data;
  try {
    data = train::load_fashion_mnist(o.data);
  } catch (const cadence::error& e) {
    throw tools::usage_error(std::string("--data: ") + e.what());
  }
  n_train = o.train_limit == 0 ? data.train.size() : std::min(o.train_limit, data.train.size());
  if (n_train < workers)
    throw tools::usage_error("--train-limit: " + std::to_string(n_train) + " images for " + std::to_string(workers) +
                             " workers; every worker needs at least one");
  return data;
}

// What one rank keeps of the data: the server the test set, a worker its shard of the first
// n_train training images.
struct rank_data {
  train::dataset test, shard;
};

inline rank_data keep_own_part(int rank, train::train_test_data data, std::size_t n_train, std::size_t workers) {
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

// What every rank sets up before the first policy, in this order: the profile (after checking
// the flags that need the job's size, so a bad one stops every rank before any
// communication), its push log, the data (n_train: the training images used) and the model.
struct rank_setup {
  rank_setup(const train_options& o, int rank, int size)
      : workers(static_cast<std::size_t>(size - 1)),
        prof(checked_profile(o, workers)),
        log(o.push_log, rank),
        data(load_data(o, workers, n_train)),
        model(o, data.train.features(), 10) {}
  std::size_t workers;
  cadence::sim::scenario prof;
  push_log log;
  std::size_t n_train = 0;
  train::train_test_data data;
  any_model model;
};

// ---- the start of a policy ----

// Whether policy k has a late rank (--join-after: the first policy, the last rank).
inline bool late_policy(const train_options& o, std::size_t k) { return o.join_after.has_value() && k == 0; }

// The communicator of policy k over every rank; with a late rank one that waits only for this
// rank's own registration (zmq), so the others start without it and it registers later. A
// joining process (`joiner_left`: the seconds left in the policy) waits for rank 0 no longer
// than the policy can still run, plus 10 s: a server whose members were all gone ended early.
template <class Job>
std::unique_ptr<typename Job::comm_type> connect_policy(Job& job, const train_options& o, std::size_t k,
                                                        std::optional<double> joiner_left = std::nullopt) {
  if constexpr (Job::joinable) {
    if (joiner_left)
      return job.connect_all(k, true, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::duration<double>(std::max(0.0, *joiner_left) + 10.0)));
    // Every rank waits only for its own registration (and rank 0's, within the start-up
    // deadline): rank 0 then finds who is ready point to point (start_open).
    (void)o;
    return job.connect_all(k, true, job.step_timeout());
  }
  return job.connect_all(k);
}

// A start-up step's log line on stderr, written at once: "cadence-train (rank R, pid P): start:
// STEP" as the step begins, and with ": done" or what it found as it ends. Process tests wait
// for these lines before they stop or kill a rank in that step (docs/train.md, "Start-up").
// Only over zmq, whose start-up survives a lost worker.
template <class Job>
void start_line(const Job& job, const std::string& step, const std::string& what = "") {
  if (!Job::joinable) return;
  const int rank = job.rank();
  std::fprintf(stderr, "cadence-train (rank %d, pid %ld): start: %s%s%s\n", rank, static_cast<long>(getpid()),
               step.c_str(), what.empty() ? "" : ": ", what.c_str());
  std::fflush(stderr);
}

// Seconds, for messages.
inline std::string seconds_text(std::chrono::nanoseconds t) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", std::chrono::duration<double>(t).count());
  return b;
}

// The start of a parameter-server policy over a communicator that isolates a lost peer (zmq),
// on rank 0: hears "ready" from every worker rank but `late` and those in `absent` (found
// absent before), all within one deadline `timeout`, and lets the ready ones go. Returns the
// ranks that were not ready, each with why (lost, or silent past the deadline): the caller
// drops their workers (parameter_server::drop_absent) and the policy starts without them.
template <class Comm>
std::vector<std::pair<int, std::string>> start_open(Comm& comm, int late, const std::vector<int>& absent,
                                                    std::chrono::nanoseconds timeout) {
  std::vector<std::pair<int, std::string>> missing;
  std::vector<int> ready;
  const cadence::transport::deadline d(timeout);
  for (int q = 1; q < comm.size(); ++q) {
    if (q == late) continue;
    if (std::find(absent.begin(), absent.end(), q) != absent.end()) {
      missing.emplace_back(q, "it did not introduce itself within --start-timeout " + seconds_text(timeout) + " s");
      continue;
    }
    unsigned char b = 0;
    try {
      if (comm.try_recv(&b, 1, q, tag_start, d)) {
        ready.push_back(q);
        continue;
      }
      missing.emplace_back(q, "not ready within --start-timeout " + seconds_text(timeout) + " s");
    } catch (const cadence::transport_error& e) {
      if (comm.failed()) throw;
      missing.emplace_back(q, std::string("lost while starting: ") + e.what());
    }
  }
  const cadence::transport::deadline go_by(timeout);
  for (const int q : ready) {
    unsigned char b = 1;
    try {
      comm.send(&b, 1, q, tag_start, go_by);
    } catch (const cadence::transport_error& e) {
      if (comm.failed()) throw;
      missing.emplace_back(q, std::string("lost while starting: ") + e.what());
    }
  }
  return missing;
}

// The worker's side of start_open: "ready", then rank 0's go, within `timeout` in all (a
// worker's bound: three --start-timeout, as rank 0 may wait one for the others first). Throws
// naming the step when rank 0 does not answer (gone, or it dropped this rank as absent: it
// came too late).
template <class Comm>
void start_open_worker(Comm& comm, const std::string& step, std::chrono::nanoseconds timeout) {
  unsigned char b = 0;
  const cadence::transport::deadline d(timeout);
  try {
    comm.send(&b, 1, 0, tag_start, d);
    comm.recv(&b, 1, 0, tag_start, d);
  } catch (const cadence::transport_error& e) {
    throw cadence::transport_error("start-up step '" + step + "': rank 0 did not let this worker start within " +
                                   seconds_text(timeout) + " s (it is gone, or it dropped this rank as absent: not "
                                   "ready within --start-timeout): " + e.what());
  }
}

inline double epoch_seconds() {
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

// ---- serve ----

// Runs one policy on rank 0 (the server); returns its report (the simulated part filled in
// later).
template <class Job>
train::policy_report serve(Job& job, const train_options& o, const std::string& policy, std::size_t index, any_model& model,
                           const train::dataset& test, std::size_t workers, push_log& log,
                           const std::vector<int>& absent = {}) {
  using comm_type = typename Job::comm_type;
  const bool late = late_policy(o, index);
  const std::string step = "policy " + std::to_string(index + 1);
  start_line(job, step + " connect");
  const auto connection = connect_policy(job, o, index);
  start_line(job, step + " connect", "done");
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
  side.start = clock_type::now();  // events before the start (drop_absent) show as at 0 s
  // A late rank is no member at first: its first pull makes it one under the next id.
  const std::size_t initial = late ? workers - 1 : workers;
  ps_options po = make_ps_options(o, late ? std::optional<int>(static_cast<int>(initial)) : std::nullopt);
  po.observer = [&side](const cadence::exchange::ps_event& e) { side.event(e); };
  po.keep_log = log.enabled();
  cadence::exchange::parameter_server<comm_type, cadence::any_controller, float, sgd_with_snapshots> server(
      comm, params, w0.data(), cadence::make_controller(policy, initial), sgd_with_snapshots{&side}, po);
  if constexpr (Job::joinable) {
    // Start-up over zmq: whoever is not ready in time (absent, or lost while starting) is
    // dropped now, and the policy starts without it.
    start_line(job, step + " ready");
    const auto missing = start_open(comm, late ? comm.size() - 1 : -1, absent, job.start_timeout());
    std::string dropped;
    for (const auto& m : missing) {
      server.drop_absent(static_cast<cadence::worker_id>(m.first - 1), "rank " + std::to_string(m.first) + ": " + m.second);
      dropped += (dropped.empty() ? "dropped " : ", ") + std::string("rank ") + std::to_string(m.first) + " (" +
                 m.second + ")";
    }
    start_line(job, step + " ready", dropped.empty() ? "done" : "done; " + dropped);
  } else {
    start_together(comm, late ? comm.size() - 1 : -1);
  }
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

// ---- work ----

// Runs one policy on a worker rank: returns its push_pull timings and summary.
template <class Job>
// `rejoin_for`: this process replaces a killed worker (--rejoin) and trains that long.
worker_summary work(Job& job, std::size_t index, const train_options& o, any_model& model, const train::dataset& shard,
                    const cadence::sim::scenario& prof, std::vector<train::exchange_timing>& timings, push_log& log,
                    std::optional<double> rejoin_for = std::nullopt) {
  using comm_type = typename Job::comm_type;
  const bool late_run = late_policy(o, index);
  const bool late_me = late_run && job.rank() == job.size() - 1 && !rejoin_for;
  // The late rank starts --join-after seconds after the others and trains until their end.
  if (late_me) std::this_thread::sleep_for(std::chrono::duration<double>(*o.join_after));
  const bool joining = late_me || rejoin_for.has_value();
  const double seconds = rejoin_for ? *rejoin_for : late_me ? o.seconds - *o.join_after : o.seconds;
  const std::string step = "policy " + std::to_string(index + 1);
  start_line(job, step + " connect");
  const auto connection = connect_policy(job, o, index, joining ? std::optional<double>(seconds) : std::nullopt);
  start_line(job, step + " connect", "done");
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
  if (!joining) {
    start_line(job, step + " ready");
    if constexpr (Job::joinable)
      start_open_worker(comm, step + " ready", job.worker_start_timeout());
    else
      start_together(comm, late_run ? comm.size() - 1 : -1);
    start_line(job, step + " ready", "done");
  }
  try {
    start_line(job, step + " first pull");
    worker.pull(w.data());  // a late or replacing process joins here
    start_line(job, step + " first pull", "done");
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

// ---- replace ----

// --rejoin: this process replaces a killed worker in its rank slot. It joins the policy now
// running (rank 0 names it and its start in the folder's "running") under a new worker id,
// trains until the policy's end, leaves and exits. It takes no part in the bookkeeping after
// the policy (the records of the process it replaces are lost with it), so rank 0 finds the
// rank gone then, reports, and skips the remaining policies.
template <class Job>
int replace_worker(Job& job, const train_options& o) {
  const int rank = job.rank();
  if (rank == 0) throw tools::usage_error("--rejoin: rank 0 is the server; only a worker's process can be replaced");
  rank_setup setup(o, rank, job.size());
  const rank_data own = keep_own_part(rank, std::move(setup.data), setup.n_train, setup.workers);
  std::size_t k = 0;
  double start = 0;
  if constexpr (Job::joinable) {
    if (!job.running(k, start))
      throw cadence::error("--rejoin: no policy has started (nothing published as 'running' in the rendezvous folder "
                           "or store): nothing to rejoin");
  }
  if (k >= o.policies.size() || is_collective_run(o.policies[k]))
    throw cadence::error("--rejoin: the running policy (number " + std::to_string(k + 1) +
                         ") is not a parameter-server policy of this command line");
  const double left = start + o.seconds - epoch_seconds();
  if (left <= 0) {
    std::fprintf(stderr, "cadence-train (rank %d): --rejoin: %s ended %.1f s ago; nothing to rejoin\n", rank,
                 o.policies[k].c_str(), -left);
    return 1;
  }
  std::vector<train::exchange_timing> timings;
  const worker_summary sum = work(job, k, o, setup.model, own.shard, setup.prof, timings, setup.log, left);
  std::fprintf(stderr, "cadence-train (rank %d): --rejoin: %s: %.0f iterations as a new worker; leaving (rank 0 counts "
               "this rank gone after the policy)\n", rank, o.policies[k].c_str(), sum.iterations);
  return 0;
}

}  // namespace cadence::train
