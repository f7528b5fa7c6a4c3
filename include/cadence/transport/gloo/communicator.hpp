/// \file
/// \ingroup transport
/// The gloo backend (target cadence::gloo): a communicator over a gloo TCP context, found by a
/// file-store rendezvous or a TCP store (transport/tcp_store.hpp), whose every wait has a
/// deadline and names the peer it waits for, and whose operations run in the background (work
/// handles), driven by the calling thread through the shared progress engine. Its parts:
/// options.hpp, detail/rendezvous.hpp (finding the peers), detail/link.hpp (gloo's buffers and
/// waits), detail/wire.hpp (the collectives' messages), detail/p2p.hpp (point to point).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/broadcast.hpp>
#include <cadence/transport/algorithms/doubling.hpp>
#include <cadence/transport/algorithms/ring.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/work.hpp>
#include <cadence/transport/gloo/detail/link.hpp>
#include <cadence/transport/gloo/detail/p2p.hpp>
#include <cadence/transport/gloo/detail/rendezvous.hpp>
#include <cadence/transport/gloo/detail/wire.hpp>
#include <cadence/transport/gloo/options.hpp>
#include <cadence/transport/tcp_store.hpp>

#include <gloo/context.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport {
/// \addtogroup transport
/// @{

class gloo_communicator;

/// A started gloo operation (iallreduce, iallreduce_average, ibroadcast, isend, irecv): the
/// engine's work handle (engine/work.hpp). Its wait_until() blocks in gloo's waits (the thread
/// sleeps meanwhile). cancel() withdraws a receive whose header has not arrived (the gloo
/// receive stays posted for the next one, as try_recv's does); a send, a collective, or a
/// receive whose data is arriving cannot be withdrawn: cancel() returns false and it goes on in
/// the background.
using gloo_work = basic_work<gloo_communicator, detail::gloo_op>;

/// Models transport::communicator over gloo's TCP transport, with try_recv, the asynchronous
/// operations and the averaging all-reduce.
///
/// Construction is collective: every rank of `size` constructs one with the same store folder
/// (or TCP rendezvous address) and prefix. A rank that never arrives makes the others throw
/// transport_error naming it when the deadline passes.
///
/// Threads: one thread calls it (and uses its work handles) at a time (the calls are not
/// synchronized); abort() and failed() may be called from any thread. gloo's own device thread
/// moves the bytes; the communicator's protocol steps (the ring's reductions, posting the next
/// pieces, a message's data after its header) run on the calling thread, whenever it is inside
/// the communicator: any call, a handle's test() or wait(). Collectives run one after the other
/// in issue order; point-to-point operations run beside them.
///
/// What it survives: a peer that crashes or is killed (even with SIGKILL) closes its TCP
/// connections, which the kernel reports at once; a call waiting for that peer throws
/// transport_error naming it as lost, without waiting for its deadline
/// (capabilities().detects_lost_peer). The survivors keep running and may form a new
/// communicator among themselves under a fresh prefix (survives_lost_peer). A receive from
/// any_source waits on no particular connection: it sees a crash only through its deadline.
///
/// try_recv (the concept's optional receive) is offered: at its deadline it returns
/// std::nullopt and the receive stays posted in gloo, to serve the next receive of that source
/// and tag (docs/transports.md, "try_recv"), so a parameter server runs over gloo. gloo cannot
/// cancel a receive, and its own wait timeout closes every connection of the context, so no
/// wait here lets gloo time out: a timer thread wakes the wait at the deadline instead. A large
/// message whose header came just before the deadline gets options.body_wait more for its data.
///
/// A failure while an operation on a caller's buffer is posted (the ring, a large message)
/// closes the connections at once, so gloo never touches that buffer afterwards; the peers
/// then see this rank as lost. Other failures leave the connections open until the destructor,
/// which says goodbye to every peer before it closes them.
///
/// Test without waiting needs gloo's TCP transport (the folder rendezvous always makes one):
/// over a context of another transport, test() and the background progress of several
/// operations in flight throw invalid_parameter_error; the blocking calls work.
///
/// Neither copyable nor movable (gloo and the handles hold pointers into it): hold it in a
/// std::unique_ptr.
class gloo_communicator : public detail::progress_engine<gloo_communicator, detail::gloo_op> {
  using base = detail::progress_engine<gloo_communicator, detail::gloo_op>;

public:
  // ---- construction and shutdown ----

  /// Rank `rank` of `size` ranks, found through options.store_path, or over TCP at
  /// options.rendezvous, within deadline `d`. Throws
  /// invalid_parameter_error for a store folder that does not exist or is not writable, or a
  /// rendezvous address that does not parse or resolve (before waiting), and transport_error
  /// naming the missing ranks when the others do not all arrive before `d` (rank 0, when the
  /// TCP store it should serve never answers).
  gloo_communicator(int rank, int size, gloo_options options, deadline d = {})
      : base("gloo"), options_(std::move(options)), link_(latch_), wire_(link_, options_), p2p_(link_, options_) {
    rank_ = rank;
    size_ = size;
    const detail::call_info c{"gloo", "construction", 0, rank_, size_, deadline::clock::now()};
    if (size_ < 1 || rank_ < 0 || rank_ >= size_)
      detail::bad_argument(c, "rank " + std::to_string(rank_) + " is out of range for size " + std::to_string(size_));
    detail::check_deadline(c, d);
    if (options_.prefix.empty() || options_.prefix.find('/') != std::string::npos)
      detail::bad_argument(c, "the store prefix must be a non-empty name without '/', not \"" + options_.prefix + "\"");
    std::optional<tcp_store_server> server;  // rank 0's, when it serves the store: until setup is done
    link_.adopt(detail::gloo_rendezvous(c, options_, rank_, size_, d, server));
    setup(c, d);
  }

  /// Over a connected gloo `context` the caller made (any transport, any rendezvous), with
  /// `options` and setup finished within deadline `d`. The communicator takes it over: it posts receives on its own slots (above gloo's collectives,
  /// so gloo's algorithms may still share it) and closes its connections when it fails or is
  /// destroyed.
  explicit gloo_communicator(std::shared_ptr<::gloo::Context> context, gloo_options options = {}, deadline d = {})
      : base("gloo"), options_(std::move(options)), link_(latch_), wire_(link_, options_), p2p_(link_, options_) {
    if (!context) throw invalid_parameter_error("cadence::transport[gloo]: construction: null gloo context");
    rank_ = context->rank;
    size_ = context->size;
    const detail::call_info c{"gloo", "construction", 0, rank_, size_, deadline::clock::now()};
    detail::check_deadline(c, d);
    link_.adopt(std::move(context));
    setup(c, d);
  }

  /// Leaves gracefully, then closes the connections and frees the buffers gloo may refer to.
  /// Unless its connections are already closed, it first waits (at most options.shutdown_wait)
  /// for its small sends to be received and for every peer's goodbye: closing a TCP connection
  /// with unread bytes resets it, and a reset destroys data the peer has not read yet, such as
  /// the last collective's (or, after a failure, the message that tells a peer why). A peer
  /// still calling collectives sees "rank r called shutdown". With operations still in flight
  /// it closes at once (they may be on callers' buffers); their handles become orphans.
  ~gloo_communicator() {
    const bool idle = orphan_all();
    if (link_.context() && !link_.closed() && idle) {
      // Even after abort(): an aborted communicator leaves gracefully too.
      const deadline until = options_.shutdown_wait;
      const detail::call_info c{"gloo", "shutdown", 0, rank_, size_, deadline::clock::now()};
      try {
        if (!failed()) p2p_.finish_sends(c, until);
      } catch (...) {
        // A lost peer, or one that never receives: the goodbye still goes to the others.
      }
      if (size_ > 1) wire_.goodbye(c, until, collectives_ + 1);
    }
    link_.close();
  }

  // ---- the communicator concept: the engine's calls (allreduce, ..., try_recv, iallreduce,
  // ..., abort, failed), this backend's capabilities ----

  /// The gloo context, e.g. to run gloo's own algorithms beside ours (the benchmark does).
  const std::shared_ptr<::gloo::Context>& context() const noexcept { return link_.context(); }

  /// What this backend offers beyond the concept: any_source, and lost peers detected (a
  /// closed connection) and survived; a lost peer fails the communicator.
  capability_flags capabilities() const noexcept {
    capability_flags f;
    f.any_source = true;
    f.detects_lost_peer = true;   // a closed connection; any_source receives see only the deadline
    f.survives_lost_peer = true;  // survivors continue, and may rendezvous anew without it
    f.device_buffers = false;
    return f;
  }

private:
  friend base;
  using op_t = detail::gloo_op;
  using ring = detail::ring_allreduce<detail::gloo_wire>;
  using small = detail::small_allreduce<detail::gloo_wire>;
  using root_broadcast = detail::root_broadcast<detail::gloo_wire>;

  // Map of this class (the engine holds the calls, the latch and the operations in flight):
  // options_; link_ (the gloo context, its buffers' waits, the timer); wire_ (the collectives'
  // buffers); p2p_ (point to point). Declared in that order, so the buffers go before the
  // context, and only after the connections are closed.

  void setup(const detail::call_info& c, const deadline& d) {
    detail::gloo_ignore_sigpipe(options_);
    p2p_.set_world(rank_, size_);
    wire_.setup(c, d, rank_, size_);
  }

  // ---- starting operations ----

  op_ptr start_allreduce(const char* name, void* buf, std::size_t count, dtype t, reduce_op r, bool average,
                         const deadline* d) {
    auto o = new_allreduce(name, buf, count, t, r, average, d);
    o->ring = size_ > 1 && o->bytes > wire_.inline_capacity();
    enqueue(o);
    return o;
  }

  op_ptr start_broadcast(void* buf, std::size_t bytes, int root, const deadline* d) {
    auto o = new_broadcast(buf, bytes, root, d);
    enqueue(o);
    return o;
  }

  op_ptr start_send(const void* buf, std::size_t bytes, int dst, int tag, const deadline* d) {
    auto o = new_send(buf, bytes, dst, tag, d);
    guarded([&] { p2p_.start_send(*o, d); });
    if (!o->done) enqueue(o);  // a small message is buffered: complete at once
    return o;
  }

  op_ptr start_recv(const char* name, void* buf, std::size_t bytes, int src, int tag, const deadline* d) {
    auto o = new_recv(name, buf, bytes, src, tag, d);
    o->active = true;
    enqueue(o);
    return o;
  }

  // ---- the engine's hooks ----

  void on_abort() noexcept { link_.wake(); }

  void activate(op_t& o) {
    if (size_ == 1) {
      o.done = true;  // nothing to exchange; an average over one rank is the value itself
      return;
    }
    by_algorithm(o, [&](auto algorithm) { algorithm.start(wire_, o); });
  }

  void progress_collective(op_t& o) {
    by_algorithm(o, [&](auto algorithm) { algorithm.advance(wire_, o); });
  }

  // The algorithm that moves collective `o` (root_broadcast, ring or small), handed to `step` as
  // a value of its empty type, so starting and advancing choose it by the same rule.
  template <class Step>
  static void by_algorithm(const op_t& o, Step step) {
    if (o.what == detail::op_kind::broadcast)
      step(root_broadcast{});
    else if (o.ring)
      step(ring{});
    else
      step(small{});
  }

  void progress_p2p(op_t& o) {
    if (o.what == detail::op_kind::send)
      p2p_.progress_send(o);
    else
      p2p_.progress_recv(o);
  }

  detail::waiting awaited(op_t& o) {
    if (!o.collective()) return p2p_.awaited(o);
    if (!o.active) {  // the collective ahead of it is what it waits for
      for (const auto& p : ops_)
        if (p.get() != &o && p->collective() && p->active && !p->finished()) return awaited(*p);
      return {others(), "the collectives before it have not completed"};
    }
    if (o.what == detail::op_kind::broadcast) return root_broadcast::awaited(wire_, o);
    return o.ring ? ring::awaited(wire_, o) : small::awaited(wire_, o);
  }

  // A receive whose header has not come leaves (its gloo receive stays posted for the next);
  // one whose data is arriving gets body_wait more, once.
  detail::poll_outcome at_poll_deadline(op_t& o, bool extended) {
    detail::poll_outcome p;
    if (o.phase == 0) {
      withdraw(o);
      p.withdrawn = true;
    } else if (!extended) {
      p.extend = options_.body_wait;
    }
    return p;
  }

  // Blocks on the buffer `o` (or the collective ahead of it) waits on; in slices when other
  // operations in flight may need this thread: a receive (its data follows its header only once
  // this thread posts for it). Sends finish in gloo's device thread; collectives run one at a
  // time, and those queued behind cannot start before.
  void idle(op_t& o, deadline::clock::time_point until, deadline::clock::time_point, bool) {
    const detail::waiting w = awaited(o);
    if (w.native == nullptr) {
      std::this_thread::yield();
      return;
    }
    for (const auto& p : ops_)
      if (!p->finished() && p.get() != &o && p->what == detail::op_kind::recv) {
        until = std::min(until, deadline::clock::now() + std::chrono::milliseconds(2));
        break;
      }
    auto* ub = static_cast<detail::gloo_buffer*>(const_cast<void*>(w.native));
    guarded([&] { link_.block(o.c, *ub, w.native_recv, w.peers.empty() ? others_or_self() : w.peers, until); });
  }

  // No receive or send of ours may complete into (or from) a caller's buffer after a failure:
  // with one posted, the connections close now (the peers then see this rank as lost).
  // Otherwise only the communicator's own buffers are involved, and they stay open until the
  // destructor's goodbye, so the peers learn what happened instead of seeing a reset.
  void on_fail(std::deque<op_ptr>& ops) noexcept {
    bool exposed = wire_.exposed();
    for (const auto& o : ops) exposed = exposed || (!o->finished() && o->exposed);
    if (exposed) link_.close();
  }

  bool cancel_op(op_t& o) noexcept {
    if (o.what != detail::op_kind::recv || o.phase != 0) return false;  // goes on in the background
    withdraw(o);
    return true;
  }

  void withdraw(op_t& o) {
    o.cancelled = true;
    forget(o);
  }

  // ---- state (the map above says who touches what) ----

  gloo_options options_;
  detail::gloo_link link_;
  detail::gloo_wire wire_;
  detail::gloo_p2p p2p_;
};

/// @}
}  // namespace cadence::transport
