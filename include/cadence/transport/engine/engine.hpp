// The progress engine under the host backends (MPI, gloo): the operations in flight in issue
// order, the progress pass that advances them (point to point independently, collectives one at
// a time), the one wait loop with its deadline, the failure latch, and the argument checks at
// every start. A backend derives from it (static dispatch, no virtual call per pass) and keeps
// only what is native: how an operation is posted, tested, withdrawn or abandoned.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/arguments.hpp>
#include <cadence/transport/engine/latch.hpp>
#include <cadence/transport/engine/operation.hpp>
#include <cadence/transport/engine/signature.hpp>
#include <cadence/transport/engine/work.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport {
template <class Engine, class Op, class Handle>
class basic_work;
}

namespace cadence::transport::detail {

/// What an unfinished operation waits for: whom a deadline error names, why, and (for a backend
/// that blocks in a native wait rather than polling) what to block on.
struct waiting {
  std::vector<int> peers;
  std::string note;
  const void* native = nullptr;  // the backend's own handle (a gloo buffer), or null
  bool native_recv = true;       // whether that handle's wait is a receive's
};

/// What a receive polled by try_recv does when its deadline passes (the backend decides).
struct poll_outcome {
  bool withdrawn = false;  // it was withdrawn: try_recv returns nullopt
  bool retry = false;      // a message won the race: the next pass completes it
  std::optional<std::chrono::milliseconds> extend;  // its data is arriving: wait this much more
};

// A backend `B : progress_engine<B, Op>` (Op derives from `operation`) provides, for `Op& o`:
//  0. start_allreduce(name, buf, count, t, op, average, d*), start_broadcast(buf, bytes, root,
//     d*), start_send(buf, bytes, dst, tag, d*), start_recv(name, buf, bytes, src, tag, d*):
//     each checks (new_allreduce, ...), posts what is native and enqueues, returning the
//     operation (d is null for the asynchronous forms).
//  1. progress_p2p(o): advances a send or receive as far as it goes without blocking.
//  2. activate(o), progress_collective(o): starts a collective once the one before it is done
//     (activate runs once, with o.active already set), then advances it. Collectives run one at
//     a time, in issue order, so the k-th collective of every rank meets the k-th.
//  3. awaited(o) -> waiting: whom o waits for now, for errors (and where to block).
//  4. at_poll_deadline(o, extended) -> poll_outcome: try_recv's deadline passed.
//  5. idle(o, until, since, timed): waits a little (spins, sleeps, or blocks natively on what
//     awaited(o) names, up to `until`) when a pass left o unfinished; `since` is when the wait
//     began, `timed` whether it is a handle's wait_until.
//  6. on_fail(ops): the communicator failed; withdraws or abandons what is in flight (the
//     engine then marks the unfinished ones failed and forgets them).
//  7. cancel_op(o) noexcept -> bool: the work handle's cancel (communicator.hpp, requirement 4).
//  8. Optionally before_progress() (taken in first, every pass), on_enter(c) (checks before a
//     call, such as the calling thread) and on_abort() (wakes a native wait; any thread).
// Errors: any transport_error thrown by a pass fails the communicator (contract b).
template <class Derived, class Op>
class progress_engine {
public:
  using op_type = Op;
  using op_ptr = std::shared_ptr<Op>;
  /// Its work handles can wait until a time that is no failure (basic_work::wait_until).
  static constexpr bool work_has_wait_until = true;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  using work_type = basic_work<Derived, Op>;

  // ---- the communicator concept (communicator.hpp): every blocking call is its asynchronous
  // form waited at once. The backend starts each (start_allreduce, start_broadcast, start_send,
  // start_recv: checks, record, native post), the engine waits. ----

  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, deadline d = {}) {
    wait_op(*derived().start_allreduce("allreduce", buf, count, t, op, false, &d), d);
  }
  /// The mean over ranks, in place (f32, f64): divided in the ring's last reduce step or the
  /// small path's copy out (communicator.hpp, "averaging all-reduce").
  void allreduce_average(void* buf, std::size_t count, dtype t, deadline d = {}) {
    wait_op(*derived().start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, &d), d);
  }
  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    wait_op(*derived().start_broadcast(buf, bytes, root, &d), d);
  }
  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    wait_op(*derived().start_send(buf, bytes, dst, tag, &d), d);
  }
  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto o = derived().start_recv("recv", buf, bytes, src, tag, &d);
    wait_op(*o, d);
    return o->source;
  }
  /// recv() that treats a deadline with no matching message as "nothing yet": returns
  /// std::nullopt and the communicator stays usable (communicator.hpp, try_recv); a deadline
  /// already passed polls once. The backend's class comment says how its receive is withdrawn.
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto o = derived().start_recv("try_recv", buf, bytes, src, tag, nullptr);
    if (!wait_op(*o, d, /*poll=*/true)) return std::nullopt;
    return o->source;
  }

  /// The asynchronous forms (communicator.hpp): they start the operation and return at once.
  work_type iallreduce(void* buf, std::size_t count, dtype t, reduce_op op) {
    return work(derived().start_allreduce("allreduce", buf, count, t, op, false, nullptr));
  }
  work_type iallreduce_average(void* buf, std::size_t count, dtype t) {
    return work(derived().start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, nullptr));
  }
  work_type ibroadcast(void* buf, std::size_t bytes, int root) {
    return work(derived().start_broadcast(buf, bytes, root, nullptr));
  }
  work_type isend(const void* buf, std::size_t bytes, int dst, int tag) {
    return work(derived().start_send(buf, bytes, dst, tag, nullptr));
  }
  work_type irecv(void* buf, std::size_t bytes, int src, int tag) {
    return work(derived().start_recv("recv", buf, bytes, src, tag, nullptr));
  }

  /// Any thread. A call blocked on the owning thread wakes and throws; later calls throw.
  void abort() noexcept {
    latch_.abort();
    derived().on_abort();
  }
  bool failed() const noexcept { return latch_.failed(); }

protected:
  explicit progress_engine(const char* backend) noexcept : backend_(backend) {}
  progress_engine(const progress_engine&) = delete;
  progress_engine& operator=(const progress_engine&) = delete;
  ~progress_engine() = default;

  Derived& derived() noexcept { return static_cast<Derived&>(*this); }

  // ---- hooks with a default (a backend defines its own to change them) ----

  void before_progress() {}
  void on_enter(const call_info&) {}
  void on_abort() noexcept {}

  // ---- calls ----

  call_info begin(const char* name) { return {backend_, name, ++calls_, rank_, size_, deadline::clock::now()}; }
  /// Contract b: the first failure again, or "aborted", before anything else.
  void enter(const call_info& c) {
    derived().on_enter(c);
    latch_.enter(c);
  }

  // The record of call `c`: `bytes` bytes with `peer` (a broadcast's root, a send's destination,
  // a receive's source; none for an all-reduce).
  op_ptr make(op_kind what, const call_info& c, std::size_t bytes, int peer = -1) {
    auto o = std::make_shared<Op>();
    o->what = what;
    o->c = c;
    o->bytes = bytes;
    o->peer = peer;
    return o;
  }

  // ---- starting: the checks, the record, its collective index ----

  op_ptr new_allreduce(const char* name, void* buf, std::size_t count, dtype t, reduce_op r, bool average,
                       const deadline* d, allreduce_rules rules = {}) {
    const call_info c = begin(name);
    enter(c);
    auto o = make(op_kind::allreduce, c, check_allreduce(c, buf, count, t, r, average, d, rules));
    o->buf = buf;
    o->count = count;
    o->type = t;
    o->rop = r;
    o->average = average;
    o->sig = collective_signature::allreduce(++collectives_, count, t, r, average);
    return o;
  }

  op_ptr new_broadcast(void* buf, std::size_t bytes, int root, const deadline* d) {
    const call_info c = begin("broadcast");
    enter(c);
    check_broadcast(c, buf, bytes, root, d);
    auto o = make(op_kind::broadcast, c, bytes, root);
    o->buf = buf;
    o->sig = collective_signature::broadcast(++collectives_, bytes, root);
    return o;
  }

  op_ptr new_send(const void* buf, std::size_t bytes, int dst, int tag, const deadline* d, p2p_rules rules = {}) {
    return new_p2p(op_kind::send, "send", buf, nullptr, bytes, dst, tag, d, rules);
  }

  op_ptr new_recv(const char* name, void* buf, std::size_t bytes, int src, int tag, const deadline* d,
                  p2p_rules rules = {}) {
    return new_p2p(op_kind::recv, name, nullptr, buf, bytes, src, tag, d, rules);
  }

  // A send (from cbuf, to `peer`) or a receive (into buf, from `peer`): one path for both, so
  // the two differ only in which arguments are checked.
  op_ptr new_p2p(op_kind what, const char* name, const void* cbuf, void* buf, std::size_t bytes, int peer, int tag,
                 const deadline* d, p2p_rules rules) {
    const call_info c = begin(name);
    enter(c);
    if (what == op_kind::send)
      check_send(c, cbuf, bytes, peer, tag, d, rules);
    else
      check_recv(c, buf, bytes, peer, tag, d, rules);
    auto o = make(what, c, bytes, peer);
    o->cbuf = cbuf;
    o->buf = buf;
    o->tag = tag;
    if (what == op_kind::send) o->source = peer;  // a send's source_or_peer() is its destination
    return o;
  }

  /// In flight from now on; every start moves what is in flight.
  void enqueue(const op_ptr& o) {
    ops_.push_back(o);
    progress();
  }

  // ---- the progress pass ----

  /// Advances every operation in flight as far as it goes without waiting, in issue order;
  /// collectives one at a time. A transport_error fails the communicator (and is rethrown).
  void progress() {
    try {
      derived().before_progress();
      bool collective_busy = false;
      for (std::size_t i = 0; i < ops_.size(); ++i) {
        Op& o = *ops_[i];
        if (o.finished()) continue;
        if (!o.collective()) {
          derived().progress_p2p(o);
          continue;
        }
        if (collective_busy) continue;
        if (!o.active) {
          o.active = true;
          derived().activate(o);
        }
        if (!o.done) derived().progress_collective(o);
        if (!o.done) collective_busy = true;
      }
    } catch (const transport_error& e) {
      fail(e);
    }
    while (!ops_.empty() && ops_.front()->finished()) ops_.pop_front();
  }

  /// Until `o` completes, the deadline passes or the communicator is aborted. With `poll`
  /// (try_recv, a receive): at the deadline the backend withdraws it (false) or extends the
  /// wait for data already arriving. With `timed` (a handle's wait_until): at the deadline it
  /// returns false, which is no failure.
  bool wait_op(Op& o, const deadline& d, bool poll = false, bool timed = false) {
    deadline limit = d;
    bool extended = false;
    const auto since = deadline::clock::now();
    for (;;) {
      if (o.orphan) throw destroyed(o.c);
      if (latch_.has_failure() && !o.done) latch_.rethrow();
      progress();
      if (o.done) return true;
      if (o.cancelled) return false;
      if (latch_.aborted()) fail(failure_latch::aborted_while(o.c, derived().awaited(o).peers));
      const bool passed = limit.passed();  // once: the uses below must agree
      if (timed && passed) return false;
      if (passed) {
        if (poll && o.what == op_kind::recv) {
          const poll_outcome p = derived().at_poll_deadline(o, extended);
          if (p.withdrawn) return false;
          if (p.extend) {
            limit = deadline(*p.extend);
            extended = true;
            continue;
          }
          if (p.retry) continue;
        }
        const waiting w = derived().awaited(o);
        fail(deadline_error(o.c, w.peers.empty() ? others_or_self() : w.peers, w.note));
      }
      derived().idle(o, limit.time_point(), since, timed);
    }
  }

  // ---- failures ----

  /// The first failure sticks; what is in flight is withdrawn or abandoned (on_fail) and fails
  /// with it; the error is thrown.
  [[noreturn]] void fail(transport_error e) {
    latch_.record(std::move(e));
    derived().on_fail(ops_);
    for (auto& o : ops_)
      if (!o->finished()) o->failed = true;
    ops_.clear();
    latch_.rethrow();
  }

  /// Runs `f` (a native post outside a progress pass); a transport_error fails the communicator.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const transport_error& e) {
      fail(e);
    }
  }

  static transport_error destroyed(const call_info& c) {
    return transport_error(describe(c) + ": its communicator was destroyed");
  }

  /// Takes `o` out of the operations in flight (a receive withdrawn).
  void forget(const Op& o) {
    ops_.erase(std::remove_if(ops_.begin(), ops_.end(), [&](const op_ptr& p) { return p.get() == &o; }),
               ops_.end());
  }

  /// The destructor's part: whether nothing was in flight; handles still held become orphans
  /// (they throw, or cancel() returns true).
  bool orphan_all() noexcept {
    const bool idle = ops_.empty();
    for (auto& o : ops_) o->orphan = true;
    ops_.clear();
    return idle;
  }

  std::vector<int> others() const { return ranks_except(rank_, size_); }
  std::vector<int> others_or_self() const { return detail::others_or_self(rank_, size_); }

  // ---- what the work handle calls ----

  template <class, class, class>
  friend class cadence::transport::basic_work;
  work_type work(op_ptr o) { return work_access::make<work_type>(&derived(), std::move(o)); }

  bool work_test(Op& o) {
    enter(o.c);
    progress();
    return o.done || o.cancelled;
  }
  void work_wait(Op& o, const deadline& d) {
    enter(o.c);
    wait_op(o, d);
  }
  bool work_wait_until(Op& o, deadline::clock::time_point t) {
    enter(o.c);
    return wait_op(o, deadline::at(t), false, /*timed=*/true);
  }
  bool work_cancel(Op& o) noexcept { return derived().cancel_op(o); }

  // ---- state ----

  const char* backend_;
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t calls_ = 0;       // every call, for error messages
  std::int64_t collectives_ = 0;  // the collective index the signatures carry
  failure_latch latch_;
  std::deque<op_ptr> ops_;  // in flight, in issue order; handles share them
};

}  // namespace cadence::transport::detail
