/// \file
/// \ingroup membership
/// A communicator over the members of the current quorum (quorum_view): its ranks are the
/// members, renumbered 0..size()-1, and its collectives run over the underlying communicator's
/// point-to-point calls among them only. The exchange adapters (bucketed_allreducer,
/// periodic_averager, elastic_averager) run on it unchanged; a member re-forms it after a fault.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/membership/detail/collective.hpp>
#include <cadence/membership/detail/core.hpp>
#include <cadence/membership/errors.hpp>
#include <cadence/membership/quorum.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/arguments.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// What a communicator that runs over a quorum offers (quorum_view, quorum_group): a lost
/// member is detected and survived by re-forming the quorum, not isolated (it fails the sync);
/// no any-source receive; device buffers where `device_buffers`.
inline transport::capability_flags quorum_capabilities(bool device_buffers) noexcept {
  transport::capability_flags f;
  f.any_source = false;
  f.detects_lost_peer = true;
  f.survives_lost_peer = true;
  f.isolates_lost_peer = false;
  f.device_buffers = device_buffers;
  return f;
}

template <class C>
class quorum_view;

/// A started operation of a quorum_view (iallreduce, iallreduce_average, ibroadcast, isend,
/// irecv): models the work handle of communicator.hpp. test() and wait() also take in the
/// membership's control messages, so a fault anywhere in the quorum fails the sync within a
/// poll. cancel() withdraws a receive; a collective cannot be withdrawn (false): it belongs to
/// the sync, and a failed sync's messages are drained by the member.
template <class C>
class quorum_work {
public:
  /// A complete handle.
  quorum_work() = default;
  /// Moves the operation.
  quorum_work(quorum_work&& o) noexcept
      : core_(std::exchange(o.core_, nullptr)), op_(std::move(o.op_)), p2p_(std::move(o.p2p_)),
        peer_(o.peer_) {
    o.p2p_.reset();
  }
  /// Moves the operation; an incomplete one held before is cancelled.
  quorum_work& operator=(quorum_work&& o) noexcept {
    if (this != &o) {
      cancel();
      core_ = std::exchange(o.core_, nullptr);
      op_ = std::move(o.op_);
      o.op_.reset();
      p2p_ = std::move(o.p2p_);
      o.p2p_.reset();
      peer_ = o.peer_;
    }
    return *this;
  }
  quorum_work(const quorum_work&) = delete;
  quorum_work& operator=(const quorum_work&) = delete;
  ~quorum_work() { cancel(); }

  /// Progresses without blocking; true once complete. Throws sync_failed when the quorum
  /// changed under the sync.
  bool test() {
    if (op_ != nullptr) return core_->test_op(*op_);
    if (p2p_) return p2p_test();
    return true;
  }
  /// Returns once complete; throws sync_failed when the quorum changed or `d` (or the op
  /// timeout) passed.
  void wait(transport::deadline d = {}) {
    if (op_ != nullptr) return core_->drive(*op_, d);
    if (!p2p_) return;
    while (!p2p_test()) {
      if (d.passed()) core_->fail("a point-to-point call on the view: the deadline passed waiting for rank " +
                                  std::to_string(peer_));
      detail::block_on(*p2p_, std::min(d.time_point(), detail::clock::now() + std::chrono::milliseconds(5)));
    }
  }
  /// The sender (view rank) of a completed irecv; the peer otherwise.
  int source() const noexcept { return peer_; }
  /// Withdraws a receive (true); a collective goes on for the sync's sake (false).
  bool cancel() noexcept {
    if (op_ != nullptr) return op_->complete();
    if (p2p_) return p2p_->cancel();
    return true;
  }

private:
  friend class quorum_view<C>;
  quorum_work(detail::core<C>* c, std::shared_ptr<detail::p2p_collective<C>> o) : core_(c), op_(std::move(o)) {}
  quorum_work(detail::core<C>* c, detail::work_t<C>&& w, int peer) : core_(c), p2p_(std::move(w)), peer_(peer) {}

  bool p2p_test() {
    try {
      return p2p_->test();
    } catch (const sync_failed&) {
      throw;
    } catch (const transport_error& e) {
      core_->fail(std::string("a point-to-point call on the view failed: ") + e.what());
    }
  }

  detail::core<C>* core_ = nullptr;
  std::shared_ptr<detail::p2p_collective<C>> op_;  // shared with the member: outlives a failed sync
  std::optional<detail::work_t<C>> p2p_;
  int peer_ = -1;
};

/// Models transport::communicator over the members of the current quorum, with the
/// asynchronous operations and the averaging all-reduce, so every exchange adapter runs on it.
/// rank() and size() are this member's place in the quorum and its size; both change when the
/// quorum re-forms (the adapters read them at every call). Calls are valid inside
/// member::transact() only: a fault fails the sync (sync_failed) and every later call of the
/// same sync throws the same; transact() re-forms the quorum and retries or discards the sync.
///
/// The collectives run over the underlying communicator's isend/irecv among the members
/// (detail/collective.hpp): up to member_options::small_bytes, every member sends its data to
/// every other and each reduces them in member order; above, a ring in pieces of piece_bytes on
/// the caller's buffer. Results are identical bit for bit on every member. Point-to-point calls
/// (send, recv; tags 0..255) are passed on to the communicator among the members; they are not
/// part of the drain, so use them only where both sides complete or fail together.
///
/// Owned by a member (member::view()); its owning thread only.
template <class C>
class quorum_view {
public:
  /// The work handle of the asynchronous operations.
  using work_type = quorum_work<C>;

  /// This member's rank in the quorum (0..size()-1: the members in ascending communicator rank).
  int rank() const noexcept { return core_->view_rank(); }
  /// Members of the quorum.
  int size() const noexcept { return static_cast<int>(core_->current().size()); }
  /// The quorum the view runs over now.
  const quorum& members() const noexcept { return core_->current(); }

  /// Collectives fail the sync, not the view, on a lost member (transact() re-forms it);
  /// host buffers.
  transport::capability_flags capabilities() const noexcept { return quorum_capabilities(false); }

  /// The all-reduce of `count` elements of dtype `t` at `buf` over the members with `op` (in
  /// place), within `d` and the op timeout.
  void allreduce(void* buf, std::size_t count, transport::dtype t, transport::reduce_op op, transport::deadline d = {}) {
    core_->drive(*start_allreduce("allreduce", buf, count, t, op, false, &d), d);
  }
  /// The mean of the `count` elements of dtype `t` at `buf` over the members (in place), within
  /// `d`: divided in the ring's last reduce step or the small path's copy.
  void allreduce_average(void* buf, std::size_t count, transport::dtype t, transport::deadline d = {}) {
    core_->drive(*start_allreduce("allreduce_average", buf, count, t, transport::reduce_op::sum, true, &d), d);
  }
  /// `bytes` from member `root` (a view rank) into every member's `buf`, within `d`.
  void broadcast(void* buf, std::size_t bytes, int root, transport::deadline d = {}) {
    core_->drive(*start_broadcast(buf, bytes, root, &d), d);
  }
  /// Sends `bytes` at `buf` to member `dst` (a view rank) with `tag` 0..255, within `d`.
  void send(const void* buf, std::size_t bytes, int dst, int tag, transport::deadline d = {}) {
    isend(buf, bytes, dst, tag).wait(d);
  }
  /// Receives `bytes` into `buf` from member `src` (a view rank) with `tag` 0..255, within `d`;
  /// returns `src`.
  int recv(void* buf, std::size_t bytes, int src, int tag, transport::deadline d = {}) {
    irecv(buf, bytes, src, tag).wait(d);
    return src;
  }

  /// allreduce() of `count` elements of dtype `t` at `buf` with `op`, started (communicator.hpp).
  work_type iallreduce(void* buf, std::size_t count, transport::dtype t, transport::reduce_op op) {
    return {core_, start_allreduce("allreduce", buf, count, t, op, false, nullptr)};
  }
  /// allreduce_average() of `count` elements of dtype `t` at `buf`, started.
  work_type iallreduce_average(void* buf, std::size_t count, transport::dtype t) {
    return {core_, start_allreduce("allreduce_average", buf, count, t, transport::reduce_op::sum, true, nullptr)};
  }
  /// broadcast() of `bytes` at `buf` from member `root`, started.
  work_type ibroadcast(void* buf, std::size_t bytes, int root) {
    return {core_, start_broadcast(buf, bytes, root, nullptr)};
  }
  /// send() of `bytes` at `buf` to member `dst` with `tag`, started.
  work_type isend(const void* buf, std::size_t bytes, int dst, int tag) {
    const transport::detail::call_info c = call("send");
    transport::detail::check_send(c, buf, bytes, dst, tag, nullptr);
    return start_p2p(c, "send to member ", dst, tag,
                     [&](auto& comm, int peer, int t) { return comm.isend(buf, bytes, peer, t); });
  }
  /// recv() of `bytes` into `buf` from member `src` with `tag`, started.
  work_type irecv(void* buf, std::size_t bytes, int src, int tag) {
    const transport::detail::call_info c = call("recv");
    transport::detail::check_recv(c, buf, bytes, src, tag, nullptr, {false, false});
    return start_p2p(c, "receive from member ", src, tag,
                     [&](auto& comm, int peer, int t) { return comm.irecv(buf, bytes, peer, t); });
  }

  /// Fails every later call of this member (any thread).
  void abort() noexcept {
    aborted_ = true;
    core_->abort();
  }
  /// Whether the current sync failed or the view was aborted.
  bool failed() const noexcept { return aborted_ || core_->txn_failed() || core_->broken(); }
  /// Fails the current sync on this member with `why` (throws sync_failed): for a communicator
  /// beside the view whose call failed (quorum_group's data communicator), so that its fault
  /// takes the membership's path: member::transact() re-forms the quorum and every survivor's
  /// sync fails with it (their next view call sees the abort).
  [[noreturn]] void fail(const std::string& why) { core_->fail(why); }

private:
  template <class>
  friend class member;
  explicit quorum_view(detail::core<C>& c) : core_(&c) {}

  transport::detail::call_info call(const char* op) const {
    return {"quorum", op, ++calls_, rank(), size(), transport::deadline::clock::now()};
  }
  void check_user_tag(const transport::detail::call_info& c, int tag) const {
    if (tag >= detail::tags::user_tags)
      transport::detail::bad_argument(c, "tag " + std::to_string(tag) + " is beyond the view's 0.." +
                                             std::to_string(detail::tags::user_tags - 1));
  }
  void before_p2p(const char* what) {
    if (aborted_) throw transport_error(std::string("cadence::membership: ") + what + " on an aborted quorum view");
    if (!core_->in_transaction())
      throw invalid_parameter_error(std::string("cadence::membership: ") + what + " on a quorum view outside member::transact()");
  }
  // What isend and irecv share once their arguments are checked: the tag and the transaction
  // checks, then `start(comm, world rank, world tag)` on the member's communicator; a transport
  // failure fails the sync with "<what><peer> failed: ...".
  template <class Start>
  work_type start_p2p(const transport::detail::call_info& c, const char* what, int peer, int tag, Start start) {
    check_user_tag(c, tag);
    before_p2p(c.op);
    try {
      return {core_, start(core_->comm(), world(peer), core_->tag_map().user(tag)), peer};
    } catch (const transport_error& e) {
      core_->fail(std::string(what) + std::to_string(peer) + " failed: " + e.what());
    }
  }
  int world(int view_rank) const { return core_->current().ranks[static_cast<std::size_t>(view_rank)]; }

  std::shared_ptr<detail::p2p_collective<C>> start_allreduce(const char* name, void* buf, std::size_t count, transport::dtype t,
                                             transport::reduce_op op, bool average, const transport::deadline* d) {
    const transport::detail::call_info c = call(name);
    transport::detail::check_allreduce(c, buf, count, t, op, average, d);
    return start_collective(c, name, detail::op_kind::allreduce, buf, count, [&](auto& p) {
      p.type = t;
      p.rop = op;
      p.average = average;
    });
  }
  std::shared_ptr<detail::p2p_collective<C>> start_broadcast(void* buf, std::size_t bytes, int root, const transport::deadline* d) {
    const transport::detail::call_info c = call("broadcast");
    transport::detail::check_broadcast(c, buf, bytes, root, d);
    return start_collective(c, "broadcast", detail::op_kind::broadcast, buf, bytes, [&](auto& p) { p.root = root; });
  }
  // What every collective shares once its arguments are checked: fails on an aborted view, else
  // starts `kind` over `count` at `buf` with the view's piece sizes; `extra` sets the rest.
  template <class Extra>
  std::shared_ptr<detail::p2p_collective<C>> start_collective(const transport::detail::call_info& c, const char* name,
                                                               detail::op_kind kind, void* buf, std::size_t count,
                                                               Extra extra) {
    if (aborted_) throw transport_error(transport::detail::describe(c) + ": the view was aborted");
    typename detail::p2p_collective<C>::params p;
    p.kind = kind;
    p.buf = buf;
    p.count = count;
    extra(p);
    p.small_bytes = core_->options().small_bytes;
    p.piece_bytes = core_->options().piece_bytes;
    return core_->start_op(p, name);
  }

  detail::core<C>* core_;
  mutable std::uint64_t calls_ = 0;
  std::atomic<bool> aborted_{false};
};

/// @}
}  // namespace cadence::membership
