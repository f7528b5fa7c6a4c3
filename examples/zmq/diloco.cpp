// Streaming DiLoCo that survives a lost rank, over ZeroMQ (exchange::diloco_member,
// include/cadence/exchange/local_sgd/membership.hpp): four ranks (threads of this process, each
// with its own ZeroMQ communicator over 127.0.0.1) train a least-squares model with DiLoCo,
// `fixed:8,fragments=2,delay=2,outer=nesterov:0.7:0.9` by default (any config string on the
// command line). The model: 128 weights fitted to a synthetic regression (y = a . x* + noise,
// the same on every run), each rank taking full-batch SGD steps on its own 64 rows; every 4
// steps one half of the weights (a fragment) is all-reduced and stepped by the outer optimizer
// on a background thread while the next 2 inner steps go on.
//
// After 6 fragments' syncs, rank 1 drops out abruptly with a fragment in flight: its thread
// returns between the fragment's send point and its completion point, its diloco_member joins
// the fragment's thread and its communicator closes (peers see it lost at once, as after
// kill -9). The survivors' next fragment's transaction, in flight on their fragment threads,
// fails; they re-form without rank 1, run it again without its pseudo-gradient and go on. A new
// communicator takes rank 1's slot and join()s; a fragment's transaction admits it with the
// global weights, the outer optimizer's state and the counters, and all train 8 more commits
// (at least 20 in all). Prints each rank's outer steps, the loss (mean squared error over the
// members' rows) of the global weights before and after (the replacement's "before" is at its
// admission), and the replacement's join time; fails (exit 1) when the members' global_hash()
// or commits differ or a rank did not finish.
//
// With --holder, rank 0 is no member: it only holds the rendezvous, and rank 1, the one that
// drops out, is the quorum's leader (as in zmq/membership.cpp).
//
// With --checkpoint, every member then takes checkpoint(), and a new job of 2 ranks (another
// rendezvous, new communicators and members) restore()s the first member's and trains 10
// commits on all the rows; it must start from the first job's last loss and end with one
// global_hash() on both ranks.
//
//   build-*/bin/cadence-example-zmq_diloco [config] [--holder] [--checkpoint]
#include <cadence/exchange/local_sgd/membership.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include "../membership_job.hpp"  // the four ranks as threads, the rendezvous, the final check

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mb = cadence::membership;
namespace ex = cadence::exchange;
using cadence::transport::zmq_communicator;
using cadence::transport::zmq_options;
using glue = ex::diloco_member<zmq_communicator>;
using namespace membership_job;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t features = 128, rows = 64;  // per rank
constexpr std::uint64_t commits = 20;             // every member commits at least this often
constexpr std::uint64_t with_replacement = 8;     // and this often after the replacement's admission
constexpr std::uint64_t drop_after = 6;           // fragments completed before rank 1 drops out
constexpr float lr = 0.02f;                       // the inner SGD's rate

// The synthetic regression: rank r's shard (rows r*64 .. r*64+63 of one matrix), a fixed
// pseudo-random function of the row and column, so every run and every rank sees the same data.
float uniform(std::uint64_t i) {
  i = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  i = (i ^ (i >> 31)) * 0x94d049bb133111ebull;
  return static_cast<float>(static_cast<double>(i >> 11) / 9007199254740992.0 * 2.0 - 1.0);  // [-1, 1)
}
float a(std::size_t row, std::size_t col) { return uniform(row * features + col); }
float target(std::size_t row) {
  float y = 0.1f * uniform(1u << 30 | row);  // the noise
  for (std::size_t c = 0; c < features; ++c) y += a(row, c) * uniform((1ull << 40) + c);  // x*
  return y;
}

// Rank r of the first job trains on shard r; the members' shards (all four, or 1..3 with
// --holder) are the ones the loss is measured on.
struct data {
  std::vector<float> x, y;  // every shard's rows, x row-major
  std::size_t first = 0;    // the first member's shard
  explicit data(bool holder) : first(holder ? 1 : 0) {
    for (std::size_t r = 0; r < ranks * rows; ++r) {
      for (std::size_t c = 0; c < features; ++c) x.push_back(a(r, c));
      y.push_back(target(r));
    }
  }
  float residual(const std::vector<float>& w, std::size_t r) const {
    float e = -y[r];
    for (std::size_t c = 0; c < features; ++c) e += x[r * features + c] * w[c];
    return e;
  }
  // The mean squared error over the members' shards.
  double loss(const std::vector<float>& w) const {
    double sum = 0;
    for (std::size_t r = first * rows; r < y.size(); ++r) sum += static_cast<double>(residual(w, r)) * residual(w, r);
    return sum / static_cast<double>(y.size() - first * rows);
  }
  // One full-batch gradient step on `shards`.
  void step(std::vector<float>& w, const std::vector<std::size_t>& shards) const {
    std::vector<float> g(features, 0.0f);
    for (std::size_t k : shards)
      for (std::size_t r = k * rows; r < (k + 1) * rows; ++r) {
        const float e = residual(w, r);
        for (std::size_t c = 0; c < features; ++c) g[c] += e * x[r * features + c];
      }
    const float scale = lr * 2.0f / static_cast<float>(rows * shards.size());
    for (std::size_t c = 0; c < features; ++c) w[c] -= scale * g[c];
  }
};

struct config {
  ex::diloco_config diloco;
  bool checkpoint = false;
  std::vector<ex::diloco_checkpoint> saved = std::vector<ex::diloco_checkpoint>(ranks);  // --checkpoint
  std::vector<double> loss = std::vector<double>(ranks, 0.0);  // each member's last loss
};

std::vector<float> global_weights(glue& dm) {
  const auto g = dm.adapter().global_weights();
  return std::vector<float>(g.begin(), g.end());
}

std::string ms(double seconds) { return std::to_string(static_cast<long long>(seconds * 1000)) + " ms"; }

// Inner steps and outer syncs until `done()` holds at a point with nothing in flight (the member
// is read only there: in flight, it belongs to the fragment's thread), or until `leave()` holds
// (rank 1 dropping out). Returns the fragments' transactions that sync() completed.
template <class Done, class Leave>
std::uint64_t train(glue& dm, std::vector<float>& w, const std::vector<std::size_t>& shards, const data& d, Done done,
                    Leave leave) {
  std::uint64_t completed = 0;
  for (;;) {
    if (!dm.in_flight() && done()) return completed;
    if (leave(completed)) return completed;
    d.step(w, shards);
    if (!dm.step_done(1000)) continue;
    if (dm.sync().attempts != 0) ++completed;  // attempts 0: a send point only
  }
}

void run(int rank, bool replacement, shared& s, config& cfg, const data& d) {
  const auto began = std::chrono::steady_clock::now();
  const member_setup set = setup_for(rank, replacement, s);
  zmq_communicator comm(rank, ranks, set.zmq, cadence::transport::deadline(30s));
  mb::member<zmq_communicator> m(comm, set.member);
  std::vector<float> w(features, 0.0f);
  glue dm(m, {ex::tensor_ref(w.data(), w.size())}, ex::make_outer_optimizer(cfg.diloco.outer), cfg.diloco.options);
  const auto t0 = std::chrono::steady_clock::now();
  if (replacement)
    dm.join();  // returns admitted, with the global weights in w
  else
    dm.start();
  const auto now = std::chrono::steady_clock::now();
  const double joined = std::chrono::duration<double>(now - began).count(),
               join_call = std::chrono::duration<double>(now - t0).count();
  const double before = d.loss(w);
  const bool streaming = cfg.diloco.options.delay != 0;
  // The process in rank 1's slot now (its nonce), to tell its replacement from it.
  const mb::quorum& q0 = m.current();
  const std::uint64_t first = replacement ? 0 : q0.nonces[static_cast<std::size_t>(q0.index_of(victim))];
  // The commit after which the quorum held the replacement (the same on every member).
  std::uint64_t admitted = replacement ? m.committed() : 0;
  // Until `commits` commits and `with_replacement` more after the replacement's admission (every
  // member then stops at the same commit). Rank 1 leaves with a fragment in flight (delay 0:
  // right after a sync): returning, dm joins the fragment's thread and the communicator closes.
  const std::uint64_t completed = train(
      dm, w, {static_cast<std::size_t>(rank)}, d,
      [&] {
        const mb::quorum& q = m.current();
        if (admitted == 0 && q.contains(victim) && !q.holds(victim, first)) admitted = m.committed();
        return admitted != 0 && m.committed() >= std::max(commits, admitted + with_replacement);
      },
      [&](std::uint64_t done) {
        return rank == victim && !replacement && done >= drop_after && (dm.in_flight() || !streaming);
      });
  if (rank == victim && !replacement) {
    say(s, "rank 1 drops out" + std::string(dm.in_flight() ? " with a fragment in flight" : "") + " after " +
               std::to_string(completed) + " syncs");
    return;
  }
  dm.finish();  // completes a fragment in flight, then the closing sync
  const mb::member_stats st = m.stats();
  const std::uint64_t hash = dm.global_hash();
  say(s, "rank " + std::to_string(rank) + (replacement ? " (replacement)" : "") + ": " +
             std::to_string(dm.adapter().outer_steps()) + " outer steps (" +
             std::to_string(dm.adapter().fragment_steps()) + " fragment steps, " + std::to_string(m.committed()) +
             " commits), loss " + std::to_string(before) + (replacement ? " at its admission" : "") + " -> " +
             std::to_string(d.loss(global_weights(dm))) + ", " + std::to_string(st.reconfigurations) + " quorums, " +
             std::to_string(st.failed_syncs) + " failed syncs, replacement admitted after commit " +
             std::to_string(admitted) +
             (replacement ? ", admitted " + ms(joined) + " after its start (join() " + ms(join_call) +
                                ", state received in " + ms(st.state_receive_seconds) + ")"
                          : std::string()) +
             ", global hash " + std::to_string(hash));
  record(s, rank, hash, m.committed());
  std::lock_guard<std::mutex> lock(s.m);
  cfg.loss[static_cast<std::size_t>(rank)] = d.loss(global_weights(dm));
  if (cfg.checkpoint) cfg.saved[static_cast<std::size_t>(rank)] = dm.checkpoint();
}

// --checkpoint: a new job of 2 ranks (its own rendezvous and communicators) restores what the
// first job's first member saved and trains on, rank r on every other member shard from the
// r-th. Returns whether it went on from the saved loss and its members ended with one hash.
bool restart(const config& cfg, const data& d, bool holder) {
  const std::size_t first = holder ? 1 : 0;
  const std::uint64_t more = 10;  // commits of the new job
  shared s;
  std::vector<std::uint64_t> hash(2, 0);
  std::vector<double> before(2, 0.0);
  bool failed = false;
  auto body = [&](int rank) {
    try {
      mb::member_options opts;
      opts.timeouts = mb::timeouts::scaled(1000ms);
      zmq_communicator comm(rank, 2, options_for(rank, s, opts.timeouts), cadence::transport::deadline(30s));
      mb::member<zmq_communicator> m(comm, opts);
      std::vector<float> w(features, 0.0f);
      glue dm(m, {ex::tensor_ref(w.data(), w.size())}, ex::make_outer_optimizer(cfg.diloco.outer), cfg.diloco.options);
      dm.restore(cfg.saved[first]);  // every member the same checkpoint (start() broadcasts the first's)
      dm.start();
      before[static_cast<std::size_t>(rank)] = d.loss(w);
      std::vector<std::size_t> shards;
      for (std::size_t k = first + static_cast<std::size_t>(rank); k < ranks; k += 2) shards.push_back(k);
      (void)train(dm, w, shards, d, [&] { return m.committed() >= more; }, [](std::uint64_t) { return false; });
      dm.finish();
      const auto r = static_cast<std::size_t>(rank);
      hash[r] = dm.global_hash();
      say(s, "restored rank " + std::to_string(rank) + ": " + std::to_string(dm.adapter().outer_steps()) +
                 " outer steps in all, loss " + std::to_string(before[r]) + " -> " +
                 std::to_string(d.loss(global_weights(dm))) + ", global hash " + std::to_string(hash[r]));
    } catch (const std::exception& e) {
      say(s, "restored rank " + std::to_string(rank) + " failed: " + e.what());
      std::lock_guard<std::mutex> lock(s.m);
      failed = true;
    }
  };
  std::thread t0(body, 0), t1(body, 1);
  t0.join();
  t1.join();
  // The restored job starts from the saved global weights: the first job's last loss.
  return !failed && hash[0] == hash[1] && before[0] == cfg.loss[first] && before[1] == cfg.loss[first];
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  shared s;
  std::string spec = "fixed:8,fragments=2,delay=2,outer=nesterov:0.7:0.9";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--holder")
      s.holder = true;
    else if (arg == "--checkpoint")
      cfg.checkpoint = true;
    else if (!arg.empty() && arg[0] != '-')
      spec = arg;
    else {
      std::fprintf(stderr, "cadence-example-zmq_diloco: unknown argument '%s' (argument %d); usage: "
                           "cadence-example-zmq_diloco [config] [--holder] [--checkpoint]\n", arg.c_str(), i);
      return 2;
    }
  }
  try {
    cfg.diloco = ex::parse_diloco_config(spec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cadence-example-zmq_diloco: %s\n", e.what());
    return 2;
  }
  // This example reads the member between a fragment's completion point and the next send
  // point (in flight it belongs to the fragment's thread): there must be a step between them.
  const ex::diloco_options& o = cfg.diloco.options;
  try {
    const ex::outer_schedule sched(o.schedule, ranks);  // names a bad schedule now, not on every rank
    if (o.delay != 0 && !sched.timed()) {
      const std::size_t h = sched.period(), f = std::max<std::size_t>(o.fragments, 1);
      std::vector<std::size_t> at;
      for (std::size_t k = 0; k < f; ++k) at.push_back((k + 1) * h / f % h);
      std::sort(at.begin(), at.end());
      std::size_t gap = at.front() + h - at.back();
      for (std::size_t k = 1; k < f; ++k) gap = std::min(gap, at[k] - at[k - 1]);
      if (o.delay >= gap) {
        std::fprintf(stderr,
                     "cadence-example-zmq_diloco: config '%s': delay=%zu leaves no step between a fragment's "
                     "completion and the next send (%zu steps apart), where this example checks whether to stop; "
                     "use delay < %zu\n",
                     spec.c_str(), static_cast<std::size_t>(o.delay), gap, gap);
        return 2;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cadence-example-zmq_diloco: config '%s': %s\n", spec.c_str(), e.what());
    return 2;
  }
  const data d(s.holder);
  std::printf("config %s, %zu features, %zu rows per rank\n", spec.c_str(), features, rows);
  const int rc = run_ranks(s, commits, [&](int r, bool replacement) { run(r, replacement, s, cfg, d); });
  if (rc != 0 || !cfg.checkpoint) return rc;
  const bool ok = restart(cfg, d, s.holder);
  std::printf("%s\n", ok ? "ok: the restored job went on from the checkpoint with the same state on both ranks"
                         : "FAILED: the restored job");
  return ok ? 0 : 1;
}
