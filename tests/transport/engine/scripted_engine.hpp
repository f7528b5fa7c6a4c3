// A tiny backend on the progress engine (include/cadence/transport/engine/engine.hpp) whose
// operations do only what the test scripts: each completes on the progress pass the test names
// (or never), fails on its next pass when told to, and its receives meet try_recv's deadline
// with the poll outcomes the test queues. Everything the engine asks of it is logged, so the
// tests see the engine's order of calls, not a network's.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/arguments.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/operation.hpp>
#include <cadence/transport/engine/work.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace cadence_scripted_engine {

namespace ct = cadence::transport;
namespace cd = cadence::transport::detail;

struct scripted_op : cd::operation {
  int passes = 0;          // progress passes that reached it
  int complete_on = -1;    // the pass on which it completes (-1: not until the test says)
  bool fail_next = false;  // its next pass throws transport_error
};

class scripted : public cd::progress_engine<scripted, scripted_op> {
  using base = cd::progress_engine<scripted, scripted_op>;

public:
  scripted(int rank, int size) : base("scripted") {
    rank_ = rank;
    size_ = size;
  }
  ~scripted() { orphan_all(); }
  scripted(const scripted&) = delete;
  scripted& operator=(const scripted&) = delete;

  ct::capability_flags capabilities() const noexcept { return {}; }

  // ---- what the test scripts ----

  /// Operations started from now on complete on this pass of theirs (-1: never, until released).
  int complete_on = -1;
  /// Whom every unfinished operation waits for (awaited()).
  cd::waiting waits_for{{1}, "scripted wait"};
  /// What try_recv's deadline gets, in order (then a default outcome: nothing to offer).
  std::deque<cd::poll_outcome> poll_outcomes;
  /// At try_recv's deadline the receive is made to complete on its next pass (a message that
  /// won the race, or data arriving).
  bool arrives_at_deadline = false;
  /// Argument rules the starts pass to the engine's checks.
  cd::allreduce_rules rules{};
  cd::p2p_rules p2p{};
  /// Runs on the owning thread each time a wait idles.
  std::function<void()> on_idle;

  /// The engine's calls into the backend, in order: "activate #k", "on_fail N", "poll deadline".
  std::vector<std::string> log;
  /// Every operation started, in issue order.
  std::vector<op_ptr> started;
  std::atomic<int> idles{0};
  std::atomic<int> aborts_seen{0};

  /// The operation completes on its next pass.
  static void release(scripted_op& o) { o.complete_on = o.passes + 1; }
  /// Its next pass throws.
  static void fail_next(scripted_op& o) { o.fail_next = true; }

  int seq() const noexcept { return static_cast<int>(calls_); }
  std::int64_t collectives() const noexcept { return collectives_; }
  std::size_t in_flight() const noexcept { return ops_.size(); }

private:
  friend base;

  op_ptr start_allreduce(const char* name, void* buf, std::size_t count, ct::dtype t, ct::reduce_op op, bool average,
                         const ct::deadline* d) {
    return begin_op(new_allreduce(name, buf, count, t, op, average, d, rules));
  }
  op_ptr start_broadcast(void* buf, std::size_t bytes, int root, const ct::deadline* d) {
    return begin_op(new_broadcast(buf, bytes, root, d));
  }
  op_ptr start_send(const void* buf, std::size_t bytes, int dst, int tag, const ct::deadline* d) {
    auto o = new_send(buf, bytes, dst, tag, d, p2p);
    o->active = true;
    return begin_op(o);
  }
  op_ptr start_recv(const char* name, void* buf, std::size_t bytes, int src, int tag, const ct::deadline* d) {
    auto o = new_recv(name, buf, bytes, src, tag, d, p2p);
    o->active = true;
    return begin_op(o);
  }
  op_ptr begin_op(op_ptr o) {
    o->complete_on = complete_on;
    started.push_back(o);
    enqueue(o);
    return o;
  }

  void activate(scripted_op& o) { log.push_back("activate #" + std::to_string(o.sig.index)); }
  void progress_collective(scripted_op& o) { pass(o); }
  void progress_p2p(scripted_op& o) { pass(o); }
  void pass(scripted_op& o) {
    ++o.passes;
    if (o.fail_next) throw cadence::transport_error(cd::describe(o.c) + ": scripted failure");
    if (o.complete_on > 0 && o.passes >= o.complete_on) {
      o.done = true;
      if (o.what == cd::op_kind::recv) o.source = o.peer == ct::any_source ? size_ - 1 : o.peer;
    }
  }

  cd::waiting awaited(scripted_op&) { return waits_for; }

  cd::poll_outcome at_poll_deadline(scripted_op& o, bool extended) {
    log.push_back(extended ? "poll deadline (extended)" : "poll deadline");
    cd::poll_outcome p;
    if (!poll_outcomes.empty()) {
      p = poll_outcomes.front();
      poll_outcomes.pop_front();
    }
    if (p.withdrawn) {
      o.cancelled = true;
      forget(o);
    } else if (arrives_at_deadline) {
      release(o);
    }
    return p;
  }

  void idle(scripted_op&, ct::deadline::clock::time_point, ct::deadline::clock::time_point, bool) {
    idles.fetch_add(1);
    if (on_idle) on_idle();
    std::this_thread::yield();
  }

  void on_fail(std::deque<op_ptr>& ops) noexcept {
    int unfinished = 0;
    for (const auto& o : ops) unfinished += o->finished() ? 0 : 1;
    log.push_back("on_fail " + std::to_string(unfinished));
  }

  bool cancel_op(scripted_op& o) noexcept {
    if (o.what != cd::op_kind::recv) return false;  // goes on in the background
    o.cancelled = true;
    forget(o);
    return true;
  }

  void on_abort() noexcept { aborts_seen.fetch_add(1); }
};

/// What most engine tests start from: rank 0 of two and a buffer of two floats (a fixture:
/// TEST_CASE_FIXTURE(rank0_of_two, ...)).
struct rank0_of_two {
  scripted b{0, 2};
  float buf[2] = {};
};

}  // namespace cadence_scripted_engine
