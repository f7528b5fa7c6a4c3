/// \file
/// \ingroup transport
/// The MPI backend (target cadence::mpi): a communicator over a caller-owned MPI_Comm whose
/// every operation is non-blocking MPI driven by the shared progress engine on the owning
/// thread, so no call can hang on a peer and any operation can run in the background (work
/// handles). The all-reduces are the shared algorithms (transport/algorithms/) over MPI point
/// to point; the broadcast is MPI_Ibcast, posted once the root's announcement agrees.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/doubling.hpp>
#include <cadence/transport/algorithms/ring.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/pacing.hpp>
#include <cadence/transport/engine/work.hpp>
#include <cadence/transport/mpi/detail/layout.hpp>
#include <cadence/transport/mpi/detail/wire.hpp>
#include <cadence/transport/mpi/options.hpp>

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport {
/// \addtogroup transport
/// @{

class mpi_communicator;

namespace detail {
/// An MPI operation: the engine's record and its native request.
struct mpi_op : operation {
  MPI_Request req = MPI_REQUEST_NULL;       // point to point, broadcast
  MPI_Datatype layout = MPI_DATATYPE_NULL;  // a derived type for a message above the limit
  std::unique_ptr<unsigned char[]> stage;   // the bounce copy (send, broadcast)
  bool posted = false;                      // broadcast: MPI_Ibcast is posted
  const char* note = "";                    // point to point: what a deadline error adds
};
}  // namespace detail

/// A started MPI operation (iallreduce, iallreduce_average, ibroadcast, isend, irecv): the
/// engine's work handle (engine/work.hpp). cancel() withdraws a receive; a send or a collective
/// cannot be withdrawn (MPI cannot cancel a send in Open MPI, and the peers need our part of a
/// collective): cancel() returns false and the operation goes on in the background, driven by
/// later calls, so its buffer must stay valid.
using mpi_work = basic_work<mpi_communicator, detail::mpi_op>;

/// Models transport::communicator over MPI, with try_recv, the asynchronous operations and the
/// averaging all-reduce. Construction is collective over `comm` (it duplicates it, so our
/// traffic never matches the caller's); `comm` stays the caller's and must outlive this object.
/// Only the thread that constructed it may call it, or use its work handles (MPI needs at least
/// MPI_THREAD_FUNNELED, or MPI_THREAD_SERIALIZED when that thread is not the main one), except
/// abort() and failed(), which any thread may call: abort() only raises a flag that the owning
/// thread's polling sees, so MPI is never entered from two threads.
///
/// Progress: every operation is non-blocking MPI plus the protocols' steps (the all-reduces are
/// point-to-point protocols: their reductions run on the owning thread). They advance only when
/// the owning thread is inside the communicator: in any call, in a handle's test() or wait(). An
/// asynchronous all-reduce overlaps computation as far as the caller polls (the bucketed
/// all-reducer polls in every mark_ready()). Collectives run one after the other in issue order;
/// point-to-point operations run beside them.
///
/// What it survives (Open MPI 4.1): a stalled rank is detected by the deadline and named, and
/// the survivors' communicators fail cleanly; they may go on over a new communicator that
/// excludes it (MPI_Comm_create_group involves only the survivors). A crashed rank is not
/// survivable: Open MPI's runtime kills the whole job (capabilities().survives_lost_peer is
/// false), and before it does, only the deadline sees the loss.
///
/// try_recv posts its receive and cancels it at the deadline; MPI either cancels it or completes
/// it, never half of it, so a message is never lost between two calls.
///
/// After a failed all-reduce Open MPI may still read (never write: receives are cancelled) the
/// caller's buffer, until the process ends, for the ring's sends it cannot withdraw: collectives
/// are fail-stop, so keep the buffer allocated for the rest of the job.
///
/// Neither copyable nor movable (MPI and the handles hold pointers into it): hold it in a
/// std::unique_ptr to hand it around. Destroy it before its handles are used again.
class mpi_communicator : public detail::progress_engine<mpi_communicator, detail::mpi_op> {
  using base = detail::progress_engine<mpi_communicator, detail::mpi_op>;

public:
  // ---- construction and shutdown ----

  /// This rank's communicator over `comm` with `options`, set up within deadline `d`
  /// (collective: every rank of `comm` constructs one). Throws invalid_parameter_error when MPI
  /// is not initialized, its thread level is too low for the calling thread, or an option is
  /// out of range.
  explicit mpi_communicator(MPI_Comm comm, mpi_options options = {}, deadline d = {})
      : base("mpi"), options_(options), pace_{options.spin_for, options.poll_sleep},
        owner_(std::this_thread::get_id()), wire_(options_) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      throw invalid_parameter_error("cadence::transport::mpi_communicator: MPI is not initialized");
    int provided = 0, is_main = 0;
    MPI_Query_thread(&provided);
    MPI_Is_thread_main(&is_main);
    if (provided < MPI_THREAD_FUNNELED || (!is_main && provided < MPI_THREAD_SERIALIZED))
      throw invalid_parameter_error(
          "cadence::transport::mpi_communicator: MPI was initialized with thread level " +
          std::to_string(provided) + ", too low for a communicator owned by " +
          (is_main ? std::string("the main thread (needs MPI_THREAD_FUNNELED)")
                   : std::string("another thread (needs MPI_THREAD_SERIALIZED)")));
    if (options_.max_message_bytes == 0 || options_.max_message_bytes > static_cast<std::size_t>(INT_MAX))
      throw invalid_parameter_error("cadence::transport::mpi_communicator: max_message_bytes " +
                                    std::to_string(options_.max_message_bytes) + " is not in [1, INT_MAX]");
    if (options_.ring_piece_bytes == 0)
      throw invalid_parameter_error("cadence::transport::mpi_communicator: ring_piece_bytes must be > 0");
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    const detail::call_info c{"mpi", "construction", 0, rank_, size_, deadline::clock::now()};
    detail::check_deadline(c, d);
    duplicate(c, comm, d);
  }

  /// On the owning thread, before MPI_Finalize. Every message sent on the communicator must
  /// have been received by then. The duplicates are freed only when nothing can still arrive
  /// on them: Open MPI gives a freed context id to the next communicator, which would then
  /// receive the stragglers as its own. So a healthy communicator first waits (at most
  /// options.shutdown_wait) for its peers' announcements of the last broadcast; one that failed,
  /// was aborted, had operations in flight or abandoned one leaks its duplicates and buffers
  /// instead. Handles still held become orphans: they throw, or cancel() returns true.
  ~mpi_communicator() {
    on_fail(ops_);
    const bool idle = orphan_all();
    const bool clean = idle && !dirty_ && !wire_.dirty() && !latch_.has_failure() && !latch_.aborted() &&
                       wire_.drained();
    wire_.close(clean);
    if (clean) {
      MPI_Comm_free(&data_);
    } else {
      for (auto& a : abandoned_) a.release();  // MPI may read or write them: never freed
    }
  }

  // ---- the communicator concept: the engine's calls (allreduce, ..., try_recv, iallreduce,
  // ..., abort, failed), this backend's capabilities ----

  // ---- the lending sends: no bounce copy (options.hpp, lend_t) ----

  using base::isend;
  using base::send;

  /// send() of `bytes` bytes from `buf` to rank `dst` with tag `tag` within deadline `d`, a
  /// buffer the caller lends (lend_t: valid and unchanged until MPI is done with it, for the rest
  /// of the process if the send fails): never copied, whatever mpi_options::bounce_buffers says.
  /// Otherwise as send().
  void send(const void* buf, std::size_t bytes, int dst, int tag, lend_t, deadline d = {}) {
    wait_op(*start_send(buf, bytes, dst, tag, &d, /*lent=*/true), d);
  }
  /// isend() of `bytes` bytes from `buf` to rank `dst` with tag `tag`, a buffer the caller lends
  /// (as the send above): never copied.
  mpi_work isend(const void* buf, std::size_t bytes, int dst, int tag, lend_t) {
    return work(start_send(buf, bytes, dst, tag, nullptr, /*lent=*/true));
  }
  /// Whether a send that is not lent is copied (mpi_options::bounce_buffers): a caller that
  /// would have to copy into a buffer of its own to lend it need not when this is false.
  bool bounces_sends() const noexcept { return options_.bounce_buffers; }

  /// What this backend offers beyond the concept: any_source only (a crashed rank is seen by
  /// the deadline alone, and Open MPI takes the job down with it).
  capability_flags capabilities() const noexcept {
    capability_flags f;
    f.any_source = true;
    f.detects_lost_peer = false;   // a crashed rank is seen only by the deadline
    f.survives_lost_peer = false;  // Open MPI 4.1 takes the job down with it
    f.device_buffers = false;
    return f;
  }

private:
  friend base;
  using op_t = detail::mpi_op;

  // Map of this class (the engine holds the calls, the latch and the operations in flight).
  // Only the owning thread (owner_, checked by on_enter) enters MPI; other threads touch only
  // the latch's atomics (failed(), abort()). data_ carries point-to-point messages and
  // broadcasts; the wire (wire_) owns the second duplicate, which carries the announcements
  // and the all-reduces' protocols. Buffers MPI may still touch after a failure go to
  // abandoned_ and are never freed; dirty_ says that a request was given up inside MPI.

  // ---- construction ----

  // MPI_Comm_idup, polled: a missing rank must not hang construction past its deadline. MPI
  // writes the new handles when the duplication completes, possibly after a timeout has
  // destroyed this object, so they land in storage that is leaked in that case. One duplication
  // at a time: with both outstanding, one rank's construction once never completed while its
  // peer's had (about 1 run in 20); several outstanding idups on one communicator are a known
  // trouble spot of Open MPI's context id agreement (open-mpi/ompi#2025).
  void duplicate(const detail::call_info& c, MPI_Comm comm, const deadline& d) {
    auto dups = std::make_unique<MPI_Comm[]>(2);
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    auto check = [&](int rc) {
      if (rc == MPI_SUCCESS) return;
      dups.release();  // a duplication may be posted: never freed
      throw transport_error(detail::describe(c) + ": " + detail::mpi_error_string(rc));
    };
    for (int i = 0; i < 2; ++i) {
      check(MPI_Comm_idup(comm, &dups[i], &reqs[i]));
      for (;;) {
        int done = 0;
        check(MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE));
        if (done) break;
        if (d.passed()) {
          dups.release();  // MPI may still write them: never freed
          throw detail::deadline_error(c, others(), "the other ranks did not construct theirs");
        }
        pace_.pause(c.started);
      }
    }
    data_ = dups[0];
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(dups[1], MPI_ERRORS_RETURN);
    wire_.open(dups[1], rank_, size_);
  }

  // ---- starting operations ----

  static void require_mpi_type(const detail::call_info& c, dtype t) { (void)detail::mpi_type(c, t); }

  op_ptr start_allreduce(const char* name, void* buf, std::size_t count, dtype t, reduce_op r, bool average,
                         const deadline* d) {
    auto o = new_allreduce(name, buf, count, t, r, average, d, {false, &require_mpi_type});
    o->ring = size_ > 1 && o->bytes > wire_.inline_capacity();
    enqueue(o);
    return o;
  }

  op_ptr start_broadcast(void* buf, std::size_t bytes, int root, const deadline* d) {
    auto o = new_broadcast(buf, bytes, root, d);
    if (bytes > static_cast<std::size_t>(INT_MAX))
      detail::bad_argument(o->c, std::to_string(bytes) + " bytes exceed MPI's int count");
    // Announced at once: a rank waiting on a collective ahead of this one still learns that we
    // have started it, and every rank sees arguments that differ.
    guarded([&] { wire_.send_notices(o->c, others(), o->sig); });
    wire_.expect_notices(o->sig.index);
    enqueue(o);
    return o;
  }

  op_ptr start_send(const void* buf, std::size_t bytes, int dst, int tag, const deadline* d, bool lent = false) {
    auto o = new_send(buf, bytes, dst, tag, d, {/*self=*/true});
    o->note = "the matching recv was not posted";
    // Open MPI cannot cancel a send: one that fails stays posted and MPI reads its buffer
    // until the receiver takes it. So the bytes go from a buffer the communicator can leak,
    // unless the caller lent its own for that long.
    const void* from = bytes ? buf : &dummy_;
    if (options_.bounce_buffers && !lent && bytes != 0) {
      o->stage.reset(new unsigned char[bytes]);
      std::memcpy(o->stage.get(), buf, bytes);
      from = o->stage.get();
    }
    int n = 0;
    const MPI_Datatype type = message_type(o->c, bytes, o->layout, n);
    guarded([&] { detail::check_mpi(o->c, MPI_Isend(from, n, type, dst, tag, data_, &o->req)); });
    o->active = true;
    enqueue(o);
    return o;
  }

  op_ptr start_recv(const char* name, void* buf, std::size_t bytes, int src, int tag, const deadline* d) {
    auto o = new_recv(name, buf, bytes, src, tag, d, {/*self=*/true});
    o->note = "no matching message arrived";
    // Posted for exactly `bytes`: a longer message fails with MPI_ERR_TRUNCATE, a shorter one
    // is caught by its count at completion.
    void* target = (bytes == 0 || buf == nullptr) ? static_cast<void*>(&dummy_) : buf;
    int n = 0;
    const MPI_Datatype type = message_type(o->c, bytes, o->layout, n);
    guarded([&] {
      detail::check_mpi(o->c, MPI_Irecv(target, n, type, src == any_source ? MPI_ANY_SOURCE : src, tag, data_, &o->req));
    });
    o->active = true;
    enqueue(o);
    return o;
  }

  // The datatype and count one message of `bytes` travels as: MPI_BYTE up to the limit, else a
  // derived type (blocks of max_message_bytes, then the rest), created into `made` (the op frees
  // it when it completes).
  MPI_Datatype message_type(const detail::call_info& c, std::size_t bytes, MPI_Datatype& made, int& n) {
    detail::mpi_layout l;
    try {
      l = detail::mpi_layout_of(bytes, options_.max_message_bytes);
    } catch (const std::length_error& e) {
      detail::bad_argument(c, e.what());
    }
    if (l.plain()) {
      n = static_cast<int>(l.rest);
      return MPI_BYTE;
    }
    guarded([&] {
      MPI_Datatype block = MPI_DATATYPE_NULL, blocks = MPI_DATATYPE_NULL;
      detail::check_mpi(c, MPI_Type_contiguous(static_cast<int>(l.block), MPI_BYTE, &block));
      detail::check_mpi(c, MPI_Type_contiguous(static_cast<int>(l.blocks), block, &blocks));
      int lengths[2] = {1, static_cast<int>(l.rest)};
      MPI_Aint offsets[2] = {0, static_cast<MPI_Aint>(l.blocks * l.block)};
      MPI_Datatype types[2] = {blocks, MPI_BYTE};
      detail::check_mpi(c, MPI_Type_create_struct(l.rest != 0 ? 2 : 1, lengths, offsets, types, &made));
      detail::check_mpi(c, MPI_Type_commit(&made));
      MPI_Type_free(&block);
      MPI_Type_free(&blocks);
    });
    n = 1;
    return made;
  }

  // ---- the engine's hooks ----

  void on_enter(const detail::call_info& c) {
    if (std::this_thread::get_id() != owner_)
      detail::bad_argument(c, "called from a thread that does not own the communicator "
                              "(only the constructing thread may call MPI through it)");
  }

  // No before_progress(): the peers' notices are taken in when a collective looks one up
  // (mpi_wire::notice_of drains them). Testing every notice receive on every pass of a wait,
  // as this did, made the ring all-reduce 1.3-1.5x slower from 2 MiB under Open MPI (2 ranks
  // on 2 cores, bench/compare_builds.py against the build before the engine).

  void activate(op_t& o) {
    if (o.what == detail::op_kind::broadcast) return;  // posted by progress_broadcast, after the check
    if (size_ == 1) {
      o.done = true;  // nothing to exchange; an average over one rank is the value itself
      return;
    }
    if (o.ring)
      detail::ring_allreduce<detail::mpi_wire>::start(wire_, o);
    else
      detail::small_allreduce<detail::mpi_wire>::start(wire_, o);
  }

  void progress_collective(op_t& o) {
    if (o.what == detail::op_kind::broadcast)
      progress_broadcast(o);
    else if (o.ring)
      detail::ring_allreduce<detail::mpi_wire>::advance(wire_, o);
    else
      detail::small_allreduce<detail::mpi_wire>::advance(wire_, o);
  }

  detail::waiting awaited(op_t& o) {
    if (o.what == detail::op_kind::send || o.what == detail::op_kind::recv)
      return {o.peer == any_source ? others() : std::vector<int>{o.peer}, o.note};
    if (!o.active) {  // the collective ahead of it is what it waits for
      for (const auto& p : ops_)
        if (p.get() != &o && p->collective() && p->active && !p->finished()) return awaited(*p);
      return {others(), "the collectives before it have not completed"};
    }
    if (o.what == detail::op_kind::broadcast) return broadcast_awaited(o);
    if (o.ring) return detail::ring_allreduce<detail::mpi_wire>::awaited(wire_, o);
    return detail::small_allreduce<detail::mpi_wire>::awaited(wire_, o);
  }

  detail::poll_outcome at_poll_deadline(op_t& o, bool) {
    detail::poll_outcome p;
    if (withdraw(o))
      p.withdrawn = true;
    else
      p.retry = true;  // the message won the race: the next progress completes it
    return p;
  }

  void idle(op_t&, deadline::clock::time_point, deadline::clock::time_point since, bool timed) {
    if (timed)
      std::this_thread::yield();  // an idle caller: the peers' processes may need the core
    else
      pace_.pause(since);
  }

  // Every operation in flight is withdrawn (receives) or abandoned (sends, collectives: their
  // buffers are leaked).
  void on_fail(std::deque<op_ptr>& ops) noexcept {
    bool collective = false;
    for (auto& o : ops) {
      if (o->finished()) continue;
      abandon(*o);
      collective = collective || (o->what == detail::op_kind::allreduce && o->active);
    }
    if (collective) wire_.abandon();
  }

  bool cancel_op(op_t& o) noexcept {
    if (o.what != detail::op_kind::recv) return false;              // goes on in the background
    if (std::this_thread::get_id() != owner_) return false;         // never enter MPI elsewhere
    try {
      withdraw(o);
    } catch (...) {
      // it completed with an error, which failed the communicator: nothing more
    }
    return true;
  }

  // ---- the broadcast: MPI_Ibcast once the root's announcement agrees ----

  // Every announcement of this broadcast that has come must equal ours.
  void check_agreement(const op_t& o) {
    for (int p : others())
      if (const auto* n = wire_.peek_notice(p, o.sig.index); n != nullptr && *n != o.sig)
        throw transport_error(detail::describe(o.c) + ": " + detail::arguments_differ(o.sig, rank_, *n, p));
  }

  void progress_broadcast(op_t& o) {
    check_agreement(o);
    const bool root = o.peer == rank_;
    if (!o.posted) {
      // Receivers wait for the root's announcement first (an MPI collective given mismatched
      // sizes may crash), unless told not to.
      if (!root && options_.verify_before_posting && wire_.peek_notice(o.peer, o.sig.index) == nullptr) return;
      void* data = o.bytes ? o.buf : static_cast<void*>(&dummy_);
      if (options_.bounce_buffers) {
        o.stage.reset(new unsigned char[std::max<std::size_t>(o.bytes, 1)]);
        if (root && o.bytes != 0) std::memcpy(o.stage.get(), o.buf, o.bytes);
        data = o.stage.get();
      }
      detail::check_mpi(o.c, MPI_Ibcast(data, static_cast<int>(o.bytes), MPI_BYTE, o.peer, data_, &o.req));
      o.posted = true;
    }
    if (o.req != MPI_REQUEST_NULL) {
      int done = 0;
      const int rc = MPI_Test(&o.req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        // Most often the ranks' arguments differed; the announcements say so more clearly.
        wire_.drain();
        check_agreement(o);
        throw transport_error(detail::describe(o.c) + ": " + detail::mpi_error_string(rc));
      }
      if (!done) return;
    }
    // A receiver returns once the root's notice is in and agrees; the root, as in MPI_Bcast,
    // waits for nobody.
    if (!root && wire_.peek_notice(o.peer, o.sig.index) == nullptr) return;
    if (!root && o.stage && o.bytes != 0) std::memcpy(o.buf, o.stage.get(), o.bytes);
    o.stage.reset();
    o.done = true;
  }

  detail::waiting broadcast_awaited(op_t& o) {
    std::vector<int> missing;
    for (int p : others())
      if (wire_.peek_notice(p, o.sig.index) == nullptr) missing.push_back(p);
    if (!missing.empty()) return {missing, "they never started this collective"};
    const std::string note = "every rank arrived; MPI did not complete";
    return {o.peer == rank_ ? others() : std::vector<int>{o.peer}, note};
  }

  // ---- point to point ----

  void progress_p2p(op_t& o) {
    int done = 0;
    MPI_Status status;
    const int rc = MPI_Test(&o.req, &done, &status);
    if (rc != MPI_SUCCESS)  // single-completion calls return the request's error
      throw transport_error(detail::describe(o.c) + ": " + detail::mpi_error_string(rc) +
                            (detail::mpi_truncated(rc) ? " (a message longer than the receive buffer; sizes "
                                                         "must match exactly)"
                                                       : ""));
    if (!done) return;
    if (o.what == detail::op_kind::recv) {
      o.source = status.MPI_SOURCE;
      check_received(o, status);
    }
    free_layout(o);
    o.stage.reset();
    o.done = true;
  }

  void check_received(const op_t& o, const MPI_Status& status) {
    MPI_Count received = 0;
    MPI_Get_elements_x(&status, MPI_BYTE, &received);
    if (static_cast<std::size_t>(received) != o.bytes)
      fail(transport_error(detail::describe(o.c) + ": rank " + std::to_string(status.MPI_SOURCE) + " sent " +
                           std::to_string(received) + " bytes with tag " + std::to_string(o.tag) + " but rank " +
                           std::to_string(rank_) + " received into " + std::to_string(o.bytes) + " bytes"));
  }

  static void free_layout(op_t& o) {
    if (o.layout != MPI_DATATYPE_NULL) MPI_Type_free(&o.layout);
  }

  // A receive not matched yet is cancelled: true when the cancel won (nothing arrived), false
  // when the message came first (it is complete now).
  bool withdraw(op_t& o) {
    if (o.what != detail::op_kind::recv || o.finished()) return o.cancelled;
    MPI_Status status;
    MPI_Cancel(&o.req);
    MPI_Wait(&o.req, &status);
    int cancelled = 0;
    MPI_Test_cancelled(&status, &cancelled);
    free_layout(o);
    if (cancelled) {
      o.cancelled = true;
      forget(o);
      return true;
    }
    o.source = status.MPI_SOURCE;  // it completed: the request is spent
    check_received(o, status);
    o.done = true;
    return false;
  }

  // An operation given up (a failure, the destructor): receives cancelled, sends and
  // broadcasts released with their buffers leaked. All-reduces are the wire's.
  void abandon(op_t& o) noexcept {
    switch (o.what) {
      case detail::op_kind::recv:
        if (o.req != MPI_REQUEST_NULL) {
          MPI_Cancel(&o.req);
          MPI_Wait(&o.req, MPI_STATUS_IGNORE);
        }
        free_layout(o);
        return;
      case detail::op_kind::send:
        if (o.req != MPI_REQUEST_NULL) {
          int done = 0;
          if (MPI_Test(&o.req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) {
            MPI_Request_free(&o.req);  // Open MPI cannot cancel a send: it completes on its own
            dirty_ = true;
          }
        }
        if (o.stage) abandoned_.push_back(std::move(o.stage));
        free_layout(o);
        return;
      case detail::op_kind::broadcast:
        if (o.req != MPI_REQUEST_NULL) {
          o.req = MPI_REQUEST_NULL;  // MPI cannot cancel a collective: it still owns it
          dirty_ = true;
          if (o.stage) abandoned_.push_back(std::move(o.stage));
        }
        return;
      case detail::op_kind::allreduce: return;
    }
  }

  // ---- state (the map above says who touches what) ----

  mpi_options options_;
  detail::polling_pace pace_;
  std::thread::id owner_;
  MPI_Comm data_ = MPI_COMM_NULL;  // point to point and broadcasts
  detail::mpi_wire wire_;          // announcements and the all-reduces' protocols
  bool dirty_ = false;             // a request was released or abandoned: never free the duplicates
  std::vector<std::unique_ptr<unsigned char[]>> abandoned_;  // buffers MPI may still touch
  unsigned char dummy_ = 0;  // MPI wants a valid address even for zero bytes
};

/// @}
}  // namespace cadence::transport
