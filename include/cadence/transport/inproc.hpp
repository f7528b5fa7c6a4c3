/// \file
/// \ingroup transport
/// The in-process backend: n ranks as threads of one process sharing a world, with the network
/// backends' matching and failure semantics plus fault injection (stall, kill, delay a link, a
/// fault at a chosen protocol step), so adapters are tested deterministically, without a
/// cluster, and under ThreadSanitizer. Its parts: inproc/options.hpp, inproc/detail/state.hpp
/// (the shared world and one operation's steps).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/arguments.hpp>
#include <cadence/transport/inproc/detail/state.hpp>
#include <cadence/transport/inproc/options.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence::transport {
/// \addtogroup transport
/// @{

class inproc_world;

// ---- the work handle ----

/// A started in-process operation (iallreduce, ibroadcast, isend, irecv): models the work
/// handle of communicator.hpp. cancel() always succeeds here: nothing touches the buffer after
/// it, though a collective's contribution, once made, still counts for the other ranks.
class inproc_work {
public:
  /// A complete handle of no operation.
  inproc_work() = default;
  /// Takes over another handle's operation, which leaves that handle complete.
  inproc_work(inproc_work&&) noexcept = default;
  /// Cancels this handle's own operation (as destroying it would), then takes over `other`'s.
  inproc_work& operator=(inproc_work&& other) noexcept {
    if (this != &other) {
      cancel();
      op_ = std::move(other.op_);
    }
    return *this;
  }
  inproc_work(const inproc_work&) = delete;
  inproc_work& operator=(const inproc_work&) = delete;
  ~inproc_work() { cancel(); }

  /// Makes progress without blocking; true once complete. Throws what the blocking call would.
  bool test() {
    if (op_ && op_->error) op_->error.rethrow();
    if (!op_ || op_->done || op_->cancelled) return true;
    std::unique_lock<std::mutex> lock(op_->state->mutex);
    auto wake = detail::inproc_clock::time_point::max();
    std::vector<int> waiting, lost;
    std::string note;
    if (op_->progress(detail::inproc_clock::now(), wake, waiting, lost, note)) return true;
    op_->throw_lost(lost);
    return false;
  }

  /// Returns once complete; when deadline `d` passes first, throws the deadline's error naming
  /// whom the operation waits for.
  void wait(deadline d = {}) {
    if (op_ && op_->error) op_->error.rethrow();
    if (!op_ || op_->done || op_->cancelled) return;
    std::unique_lock<std::mutex> lock(op_->state->mutex);
    op_->wait(lock, d, /*poll=*/false);
  }

  /// The sender of a completed receive (any_source); the peer otherwise.
  int source() const noexcept {
    if (!op_) return -1;
    return op_->what == detail::inproc_op::kind::recv && op_->posted ? op_->posted->from : op_->peer;
  }

  /// Withdraws the operation; always true here (nothing touches the buffer afterwards).
  bool cancel() noexcept {
    if (!op_ || op_->done || op_->cancelled) return true;
    std::lock_guard<std::mutex> lock(op_->state->mutex);
    op_->withdraw();
    op_->state->changed.notify_all();
    return true;
  }

private:
  friend class inproc_communicator;
  explicit inproc_work(std::shared_ptr<detail::inproc_op> op) : op_(std::move(op)) {}
  std::shared_ptr<detail::inproc_op> op_;
};

// ---- the communicator ----

/// One rank's view of an inproc_world: models transport::communicator, with try_recv and the
/// asynchronous operations. Owned and called by the thread that plays the rank; abort() and
/// failed() may be called from any thread (abort() wakes the owner's blocking call, which then
/// throws). Movable; a moved-from communicator may only be destroyed or assigned. Destroying it
/// tells the peers this rank is gone.
class inproc_communicator {
public:
  /// Takes over `other`'s rank; `other` may then only be destroyed or assigned.
  inproc_communicator(inproc_communicator&& other) noexcept
      : state_(std::move(other.state_)), rank_(other.rank_), incarnation_(other.incarnation_),
        calls_(other.calls_), collectives_(other.collectives_) {}
  /// Leaves this communicator's own rank (peers see it gone, as after destruction), then takes
  /// over `other`'s.
  inproc_communicator& operator=(inproc_communicator&& other) noexcept {
    if (this != &other) {
      leave();
      state_ = std::move(other.state_);
      rank_ = other.rank_;
      incarnation_ = other.incarnation_;
      calls_ = other.calls_;
      collectives_ = other.collectives_;
    }
    return *this;
  }
  inproc_communicator(const inproc_communicator&) = delete;
  inproc_communicator& operator=(const inproc_communicator&) = delete;
  ~inproc_communicator() { leave(); }

  /// This rank, in [0, size()).
  int rank() const noexcept { return rank_; }
  /// The number of ranks in the world.
  int size() const noexcept { return state_->size; }

  /// What this backend offers beyond the concept: all of it but device buffers (any_source,
  /// and lost peers detected at once, survived and isolated to the calls that need them).
  capability_flags capabilities() const noexcept {
    capability_flags f;
    f.any_source = true;
    f.detects_lost_peer = true;   // a killed thread is seen at once
    f.survives_lost_peer = true;  // nothing outside the world is affected
    f.isolates_lost_peer = true;  // a lost peer fails only the sends and receives that need it
    f.device_buffers = false;
    return f;
  }

  /// Reduces the `count` elements of dtype `t` at `buf` with `op` across all ranks, in place,
  /// within deadline `d`.
  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, deadline d = {}) {
    wait_now(start_allreduce("allreduce", buf, count, t, op, &d), d);
  }
  /// Replaces the `count` elements of dtype `t` (f32, f64) at `buf` by their mean over ranks,
  /// within deadline `d`: the sum divided by size() as it is copied out of the shared
  /// accumulator (communicator.hpp, "averaging all-reduce").
  void allreduce_average(void* buf, std::size_t count, dtype t, deadline d = {}) {
    wait_now(start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, &d, true), d);
  }
  /// Copies `bytes` bytes from rank `root`'s `buf` into every rank's `buf`, within deadline `d`.
  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    wait_now(start_broadcast("broadcast", buf, bytes, root, &d), d);
  }
  /// Sends `bytes` bytes from `buf` to rank `dst` with tag `tag`, within deadline `d`.
  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    wait_now(start_send("send", buf, bytes, dst, tag, &d), d);
  }
  /// Receives `bytes` bytes into `buf` from rank `src` (or any_source) with tag `tag`, within
  /// deadline `d`, and returns the sender's rank.
  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto op = start_recv("recv", buf, bytes, src, tag, &d);
    wait_now(op, d);
    return op->posted->from;
  }

  /// recv(buf, bytes, src, tag, d) that treats a deadline `d` with no matching message as
  /// "nothing yet": returns std::nullopt and the communicator stays usable (see try_recv in
  /// communicator.hpp).
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto op = start_recv("try_recv", buf, bytes, src, tag, nullptr);  // a passed deadline polls once
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!op->wait(lock, d, /*poll=*/true)) return std::nullopt;
    return op->posted->from;
  }

  /// Starts allreduce(buf, count, t, op) and returns its work handle at once (the asynchronous
  /// forms of communicator.hpp).
  inproc_work iallreduce(void* buf, std::size_t count, dtype t, reduce_op op) {
    return inproc_work(start_allreduce("allreduce", buf, count, t, op, nullptr));
  }
  /// Starts allreduce_average(buf, count, t) and returns its work handle at once.
  inproc_work iallreduce_average(void* buf, std::size_t count, dtype t) {
    return inproc_work(start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, nullptr, true));
  }
  /// Starts broadcast(buf, bytes, root) and returns its work handle at once.
  inproc_work ibroadcast(void* buf, std::size_t bytes, int root) {
    return inproc_work(start_broadcast("broadcast", buf, bytes, root, nullptr));
  }
  /// Starts send(buf, bytes, dst, tag) and returns its work handle at once.
  inproc_work isend(const void* buf, std::size_t bytes, int dst, int tag) {
    return inproc_work(start_send("send", buf, bytes, dst, tag, nullptr));
  }
  /// Starts recv(buf, bytes, src, tag) and returns its work handle at once.
  inproc_work irecv(void* buf, std::size_t bytes, int src, int tag) {
    return inproc_work(start_recv("recv", buf, bytes, src, tag, nullptr));
  }

  /// Marks the communicator failed (idempotent; any thread). A blocking call in progress on the
  /// owning thread wakes and throws, and so does every later call, each naming itself. Peers are
  /// not told: like a process that stops talking, this rank misses their deadlines.
  void abort() noexcept {
    if (!state_) return;
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->at(rank_).incarnation != incarnation_) return;
    state_->at(rank_).aborted = true;
    state_->changed.notify_all();
  }

  /// The peer_lost extension (communicator.hpp): `peer` was killed or destroyed its
  /// communicator, and no new process took its slot since (inproc_world::restart).
  bool peer_lost(int peer) const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (peer < 0 || peer >= static_cast<int>(state_->ranks.size()))
      throw invalid_parameter_error("cadence::transport[inproc]: peer_lost(" + std::to_string(peer) + ") on rank " +
                                    std::to_string(rank_) + ": rank out of range [0, " +
                                    std::to_string(state_->ranks.size()) + ")");
    return !state_->ranks[static_cast<std::size_t>(peer)].lost.empty();
  }

  /// Whether the communicator has failed, was aborted, or lost its slot to a restart (any
  /// thread).
  bool failed() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto& self = state_->ranks[static_cast<std::size_t>(rank_)];
    return self.incarnation != incarnation_ || self.failure.has_value() || self.aborted;
  }

private:
  friend class inproc_world;
  using op_ptr = std::shared_ptr<detail::inproc_op>;

  inproc_communicator(std::shared_ptr<detail::inproc_state> state, int rank)
      : state_(std::move(state)), rank_(rank), incarnation_(state_->at(rank).incarnation) {}

  op_ptr make_op(detail::inproc_op::kind what, const char* name) {
    auto op = std::make_shared<detail::inproc_op>();
    op->what = what;
    op->c = {"inproc", name, ++calls_, rank_, state_->size, detail::inproc_clock::now()};
    op->state = state_;
    op->rank = rank_;
    op->incarnation = incarnation_;
    return op;
  }

  op_ptr start_allreduce(const char* name, void* buf, std::size_t count, dtype t, reduce_op r,
                         const deadline* d, bool average = false) {
    auto op = make_op(detail::inproc_op::kind::allreduce, name);
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->throw_if_failed();
    const std::size_t bytes = detail::check_allreduce(op->c, buf, count, t, r, average, d);
    op->buf = buf;
    op->bytes = bytes;
    op->count = count;
    op->type = t;
    op->op = r;
    op->average = average;
    op->signature = average ? detail::signature_average(count, t) : detail::signature("allreduce", count, t, r);
    start(lock, op, -1, -1);
    return op;
  }

  op_ptr start_broadcast(const char* name, void* buf, std::size_t bytes, int root, const deadline* d) {
    auto op = make_op(detail::inproc_op::kind::broadcast, name);
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->throw_if_failed();
    detail::check_broadcast(op->c, buf, bytes, root, d);
    op->buf = buf;
    op->bytes = bytes;
    op->peer = root;
    op->signature = detail::signature("broadcast", bytes, root);
    start(lock, op, root, -1);
    return op;
  }

  op_ptr start_send(const char* name, const void* buf, std::size_t bytes, int dst, int tag, const deadline* d) {
    return start_p2p(detail::inproc_op::kind::send, name, buf, nullptr, bytes, dst, tag, d);
  }

  op_ptr start_recv(const char* name, void* buf, std::size_t bytes, int src, int tag, const deadline* d) {
    return start_p2p(detail::inproc_op::kind::recv, name, nullptr, buf, bytes, src, tag, d);
  }

  // A send (from cbuf, to `peer`) or a receive (into buf, from `peer`): one path for both, so
  // the two differ only in which arguments are checked.
  op_ptr start_p2p(detail::inproc_op::kind what, const char* name, const void* cbuf, void* buf, std::size_t bytes,
                   int peer, int tag, const deadline* d) {
    auto op = make_op(what, name);
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->throw_if_failed();
    if (what == detail::inproc_op::kind::send)
      detail::check_send(op->c, cbuf, bytes, peer, tag, d, {/*self=*/true});
    else
      detail::check_recv(op->c, buf, bytes, peer, tag, d, {/*self=*/true});
    op->cbuf = cbuf;
    op->buf = buf;
    op->bytes = bytes;
    op->peer = peer;
    op->tag = tag;
    start(lock, op, peer, tag);
    return op;
  }

  // Fires this rank's matching on_step trap, then takes part at once, or queues the op behind
  // the others this rank started while stalled. Collectives take their index now: issue order.
  void start(std::unique_lock<std::mutex>& lock, const op_ptr& op, int peer, int tag) {
    fire(lock, op->c, peer, tag);
    if (state_->at(rank_).incarnation != incarnation_)
      throw transport_error(detail::describe(op->c) + ": this rank is gone (a new process took its slot)");
    op->throw_if_failed();
    auto& self = state_->at(rank_);
    if (!self.lost.empty())
      op->fail(transport_error(detail::describe(op->c) + ": this rank is gone (" + self.lost + ")"));
    if (op->what == detail::inproc_op::kind::allreduce || op->what == detail::inproc_op::kind::broadcast)
      op->k = collectives_++;
    op->enter_pending();
    if (self.stalled || !self.unentered.empty())
      self.unentered.push_back(op);
    else
      op->enter();
  }

  void wait_now(const op_ptr& op, const deadline& d) {
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->wait(lock, d, /*poll=*/false);
  }

  // The first on_step trap of this rank that matches the call: counted down by skip, then
  // removed and run with the world unlocked (its action locks to kill, stall or delay).
  void fire(std::unique_lock<std::mutex>& lock, const detail::call_info& c, int peer, int tag);

  void leave() noexcept {
    if (!state_) return;
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto& self = state_->at(rank_);
    if (self.incarnation != incarnation_) return;  // a new process holds the slot now
    if (self.lost.empty()) self.lost = "its communicator was destroyed";
    state_->changed.notify_all();
  }

  std::shared_ptr<detail::inproc_state> state_;
  int rank_;
  int incarnation_ = 0;
  std::uint64_t calls_ = 0;        // every call, for error messages
  std::uint64_t collectives_ = 0;  // collectives only: the slot every rank's n-th one meets in
};

// ---- the world ----

/// n ranks in one process. Each thread takes its rank's communicator with join(r); the world
/// and its communicators share state, so either may outlive the other. Fault injection works
/// from any thread, at any time, and takes effect at the ranks' next wait.
class inproc_world {
public:
  /// A world of `size` ranks (at least 1) with `options`; throws invalid_parameter_error for a
  /// smaller size.
  explicit inproc_world(int size, inproc_options options = {}) {
    if (size < 1)
      throw invalid_parameter_error("cadence::transport::inproc_world: size " +
                                    std::to_string(size) + " is not at least 1");
    state_ = std::make_shared<detail::inproc_state>(size, options);
  }

  /// The number of ranks.
  int size() const noexcept { return state_->size; }

  /// Rank `rank`'s communicator, once per rank: two owners of one rank would break its ordering.
  inproc_communicator join(int rank) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("join", rank);
    auto& r = state_->at(rank);
    if (r.joined)
      throw invalid_parameter_error("cadence::transport::inproc_world: rank " +
                                    std::to_string(rank) + " has already joined");
    r.joined = true;
    return inproc_communicator(state_, rank);
  }

  /// A new process in the slot of rank `rank`, which must be gone (killed, or its communicator
  /// destroyed): a fresh communicator for it, with its own sequence numbers. What was sent to
  /// the old process and never taken is discarded; peers that saw it as lost see it alive again. A
  /// collective cannot span the restart (the others' collective count moved on): this is for
  /// point-to-point protocols that admit returning peers, such as the parameter server.
  inproc_communicator restart(int rank) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("restart", rank);
    auto& r = state_->at(rank);
    if (r.lost.empty())
      throw invalid_parameter_error("cadence::transport::inproc_world::restart: rank " + std::to_string(rank) +
                                    " is not gone (kill it, or destroy its communicator, first)");
    const int next = r.incarnation + 1;
    for (auto& m : r.mailbox) m->discarded = "its process was replaced by inproc_world::restart";
    r = detail::inproc_rank{};
    r.incarnation = next;
    r.joined = true;
    state_->changed.notify_all();
    return inproc_communicator(state_, rank);
  }

  /// Rank `rank` stops taking part: its next call waits without contributing until resume(),
  /// or until its deadline. Its peers see it miss theirs and name it.
  void stall(int rank) { set_stalled(rank, true); }
  /// Rank `rank`, stalled, takes part again.
  void resume(int rank) { set_stalled(rank, false); }

  /// Rank `rank` crashes: peers waiting for it (or starting to) throw transport_error naming it, and
  /// its own calls throw. Messages it sent before the kill are still delivered.
  void kill(int rank) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("kill", rank);
    state_->at(rank).lost = "killed by fault injection";
    state_->changed.notify_all();
  }

  /// Fault injection at a protocol step: `action(world)` runs once, on rank `rank`'s thread,
  /// when that rank enters the call `at` names, before that call takes part. It may kill, stall
  /// or delay any rank (that one too: its call then throws, or waits, as for a fault injected
  /// from outside) and tell the test where the run is, so a test injects "while the server
  /// sends worker 2's reply" or "while worker 0 waits for its reply" without guessing at times.
  /// Traps fire in the order they were set.
  void on_step(int rank, inproc_step at, std::function<void(inproc_world&)> action) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("on_step", rank);
    if (at.skip < 0)
      throw invalid_parameter_error("cadence::transport::inproc_world::on_step: negative skip");
    if (!action)
      throw invalid_parameter_error("cadence::transport::inproc_world::on_step: empty action");
    state_->traps.push_back({rank, std::move(at), std::move(action)});
  }

  /// Everything rank `src` sends to rank `dst`, messages and collective contributions, arrives
  /// `delay` later (zero restores the link). Applies to what is sent from now on.
  void delay_link(int src, int dst, std::chrono::nanoseconds delay) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("delay_link", src);
    check_rank("delay_link", dst);
    if (delay < delay.zero())
      throw invalid_parameter_error("cadence::transport::inproc_world::delay_link: negative delay");
    state_->delay[static_cast<std::size_t>(src) * static_cast<std::size_t>(state_->size) +
                  static_cast<std::size_t>(dst)] =
        std::chrono::duration_cast<detail::inproc_clock::duration>(delay);
  }

private:
  friend class inproc_communicator;
  explicit inproc_world(std::shared_ptr<detail::inproc_state> state) : state_(std::move(state)) {}

  void check_rank(const char* what, int rank) const {
    if (rank < 0 || rank >= state_->size)
      throw invalid_parameter_error(std::string("cadence::transport::inproc_world::") + what +
                                    ": rank " + std::to_string(rank) + " is out of range [0, " +
                                    std::to_string(state_->size) + ")");
  }
  void set_stalled(int rank, bool stalled) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank(stalled ? "stall" : "resume", rank);
    state_->at(rank).stalled = stalled;
    state_->changed.notify_all();
  }

  std::shared_ptr<detail::inproc_state> state_;
};

/// @}

inline void inproc_communicator::fire(std::unique_lock<std::mutex>& lock, const detail::call_info& c,
                                      int peer, int tag) {
  auto& traps = state_->traps;
  for (auto it = traps.begin(); it != traps.end(); ++it) {
    const inproc_step& at = it->at;
    if (it->rank != rank_ || (!at.op.empty() && at.op != c.op) || (at.peer && *at.peer != peer) ||
        (at.tag && *at.tag != tag))
      continue;
    if (it->at.skip > 0) {
      --it->at.skip;
      return;
    }
    auto action = std::move(it->action);
    traps.erase(it);
    lock.unlock();
    inproc_world world(state_);
    action(world);
    lock.lock();
    return;
  }
}

}  // namespace cadence::transport
