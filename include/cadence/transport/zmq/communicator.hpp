/// \file
/// \ingroup transport
/// The ZeroMQ backend (target cadence::zmq): a communicator over TCP made for a parameter
/// server that survives any worker failure and lets workers join or rejoin a running job. A
/// lost peer fails only the point-to-point calls that need it; a restarted process registers
/// again in its rank slot under a new incarnation. Layout, liveness and bounds:
/// `docs/transports.md#zmq`.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/posix.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/arguments.hpp>
#include <cadence/transport/engine/work.hpp>
#include <cadence/transport/zmq/detail/collectives.hpp>
#include <cadence/transport/zmq/detail/engine.hpp>
#include <cadence/transport/secret.hpp>
#include <cadence/transport/zmq/options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace cadence::transport {
/// \addtogroup transport
/// @{

// ---- the work handle ----

/// A started operation (iallreduce, ibroadcast, isend, irecv): the engine's work handle
/// (engine/work.hpp), which keeps the ZeroMQ engine alive. cancel() withdraws a send that has
/// not started to stream and any receive (pieces of a large message still on their way are then
/// dropped); it cannot withdraw a large send whose data ZeroMQ is reading from the buffer, nor a
/// collective (it runs on, for its peers' sake, in later calls): for those it returns false and
/// the buffer must stay valid until the communicator is destroyed. Only the communicator's
/// owning thread uses it.
using zmq_work = basic_work<detail::zmq_engine, detail::zmq_op, std::shared_ptr<detail::zmq_engine>>;

// ---- the communicator ----

/// Models transport::communicator over ZeroMQ, with try_recv and the asynchronous operations.
///
/// Sockets (the layout ps-lite and BytePS use): each rank binds one ROUTER at its endpoint and
/// keeps one DEALER per peer, connected to that peer's ROUTER, whose routing id names this rank
/// and its incarnation; a socket monitor on each DEALER reports its connection's fate. Rank 0
/// also binds the rendezvous ROUTER; every other rank keeps a DEALER to it.
///
/// Construction registers this rank with rank 0, which answers with the address table and tells
/// every live rank of each registration from then on, whenever rank 0 is inside a call. With
/// options.wait_for == all it returns once every rank has registered (or throws naming those
/// that did not by `d`); with `self`, once this rank is registered: a peer still absent is then
/// waited for by the point-to-point calls to it and by every collective.
///
/// Liveness: ZeroMQ's ZMTP heartbeats on every connection, run by its I/O thread whether or not
/// the application calls in. A crashed peer is lost at once (its connections close); a stopped
/// one, a hung host or a cut link once it has been silent for heartbeat_timeout. A lost peer
/// fails only the point-to-point operations that need it (capabilities().isolates_lost_peer):
/// failed() stays false and traffic with everyone else goes on. A collective that loses a peer
/// fails the communicator. A process that registers again in a rank slot gets a new incarnation
/// (incarnation(peer)); every rank then treats the slot as alive again and drops what the old
/// process had sent and no receive had taken.
///
/// Threads: ZeroMQ sockets are not thread-safe, so only the owning thread (the constructing
/// one) calls the communicator and its work handles; abort() and failed() may be called from any
/// thread (abort() touches the sockets only while the owning thread is outside every call).
/// Movable; a moved-from communicator may only be destroyed or assigned.
class zmq_communicator {
public:
  // ---- construction ----

  /// Rank `rank` of `size`: binds options.endpoint, registers with rank 0 at
  /// options.rendezvous (rank 0: binds it) and waits for whom options.wait_for says. Throws invalid_parameter_error for bad options (before
  /// waiting) and transport_error naming whom it waited for when `d` passes first.
  zmq_communicator(int rank, int size, zmq_options options, deadline d = {}) {
    const detail::call_info c{"zmq", "construction", 0, rank, size, deadline::clock::now()};
    if (size < 1 || rank < 0 || rank >= size)
      detail::bad_argument(c, "rank " + std::to_string(rank) + " is out of range for size " + std::to_string(size));
    detail::check_deadline(c, d);
    if (options.rendezvous.empty())
      detail::bad_argument(c, "zmq_options::rendezvous is empty: rank 0 binds it, the others register there "
                              "(\"tcp://host:port\")");
    if (options.endpoint.empty()) detail::bad_argument(c, "zmq_options::endpoint is empty");
    if (options.heartbeat_interval.count() <= 0 || options.heartbeat_timeout.count() <= 0)
      detail::bad_argument(c, "heartbeat_interval and heartbeat_timeout must be positive");
    if (options.chunk_bytes == 0) detail::bad_argument(c, "chunk_bytes must be positive");
    if (options.credit_bytes / 4 < options.eager_bytes + 64)
      detail::bad_argument(c, "credit_bytes (" + std::to_string(options.credit_bytes) +
                                  ") must be at least 4 * (eager_bytes + 64) = " +
                                  std::to_string(4 * (options.eager_bytes + 64)));
    check_security(c, options);
    engine_ = std::make_shared<detail::zmq_engine>(rank, size, std::move(options));
    engine_->start(c, d);
  }

  /// Takes over another communicator's rank, which may then only be destroyed or assigned.
  zmq_communicator(zmq_communicator&&) noexcept = default;
  /// Shuts this communicator's own rank down (as destruction does), then takes over `other`'s.
  zmq_communicator& operator=(zmq_communicator&& other) noexcept {
    if (this != &other) {
      if (engine_) engine_->shutdown();
      engine_ = std::move(other.engine_);
    }
    return *this;
  }
  zmq_communicator(const zmq_communicator&) = delete;
  zmq_communicator& operator=(const zmq_communicator&) = delete;

  /// Says goodbye to every live peer (they see this rank lost: "it left"), waits at most
  /// options.shutdown_wait for the last messages to leave, then closes every socket.
  ~zmq_communicator() {
    if (engine_) engine_->shutdown();
  }

  // ---- the communicator concept ----

  /// This rank, in [0, size()).
  int rank() const noexcept { return engine_->rank(); }
  /// The number of rank slots of the job.
  int size() const noexcept { return engine_->size(); }

  /// What this backend offers beyond the concept: all of it but device buffers (any_source,
  /// and lost peers detected, survived and isolated to the point-to-point calls that need them).
  capability_flags capabilities() const noexcept {
    capability_flags f;
    f.any_source = true;
    f.detects_lost_peer = true;   // a closed connection at once; silence after heartbeat_timeout
    f.survives_lost_peer = true;  // the survivors go on, with this communicator
    f.isolates_lost_peer = true;  // a lost peer fails only the point-to-point calls that need it
    f.device_buffers = false;
    return f;
  }

  /// Reduces the `count` elements of dtype `t` at `buf` with `op` across all ranks, in place,
  /// within deadline `d`.
  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, deadline d = {}) {
    engine_->wait(*start_allreduce(buf, count, t, op, &d), d, false);
  }
  /// Copies `bytes` bytes from rank `root`'s `buf` into every rank's `buf`, within deadline `d`.
  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    engine_->wait(*start_broadcast(buf, bytes, root, &d), d, false);
  }
  /// Sends `bytes` bytes from `buf` to rank `dst` with tag `tag`, within deadline `d`.
  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    engine_->wait(*start_send(buf, bytes, dst, tag, &d), d, false);
  }
  /// Receives `bytes` bytes into `buf` from rank `src` (or any_source) with tag `tag`, within
  /// deadline `d`, and returns the sender's rank.
  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    const auto op = start_recv("recv", buf, bytes, src, tag, &d);
    engine_->wait(*op, d, false);
    return op->from;
  }

  /// recv(buf, bytes, src, tag, d) that treats a deadline `d` with no matching message as
  /// "nothing yet": returns std::nullopt, consumes nothing and leaves the communicator usable; a
  /// deadline already passed polls once. A large message matched just before the deadline is still taken (within
  /// options.body_wait).
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    const auto op = start_recv("try_recv", buf, bytes, src, tag, nullptr);
    if (!engine_->wait(*op, d, /*poll=*/true)) return std::nullopt;
    return op->from;
  }

  /// Starts allreduce(buf, count, t, op) and returns its work handle at once (the asynchronous
  /// forms of communicator.hpp).
  zmq_work iallreduce(void* buf, std::size_t count, dtype t, reduce_op op) {
    return make_work(start_allreduce(buf, count, t, op, nullptr));
  }
  /// Starts broadcast(buf, bytes, root) and returns its work handle at once.
  zmq_work ibroadcast(void* buf, std::size_t bytes, int root) {
    return make_work(start_broadcast(buf, bytes, root, nullptr));
  }
  /// Starts send(buf, bytes, dst, tag) and returns its work handle at once.
  zmq_work isend(const void* buf, std::size_t bytes, int dst, int tag) {
    return make_work(start_send(buf, bytes, dst, tag, nullptr));
  }
  /// Starts recv(buf, bytes, src, tag) and returns its work handle at once.
  zmq_work irecv(void* buf, std::size_t bytes, int src, int tag) {
    return make_work(start_recv("recv", buf, bytes, src, tag, nullptr));
  }

  /// Marks the communicator failed (idempotent; any thread): a call blocked on the owning thread
  /// wakes and throws, and so does every later call, each naming itself. Every live peer is told
  /// (a goodbye that says "aborted", sent without waiting) and this rank's connections close, so
  /// that no heartbeat keeps it alive: each peer sees it lost at once, its operations with this
  /// rank fail naming it ("it aborted its communicator"), and a membership quorum re-forms
  /// without waiting out a timeout. The goodbye goes from here when the owning thread is outside
  /// every call, else from that thread as its call returns or throws. A new process may register
  /// in this rank's slot afterwards (a new incarnation), as after any loss.
  void abort() noexcept {
    if (engine_) engine_->abort();
  }
  /// Whether the communicator has failed or was aborted (any thread).
  bool failed() const noexcept { return engine_->failed(); }

  // ---- peers: liveness, incarnations, the rendezvous ----

  /// What this rank knows of `peer` (absent, alive, lost) as of its last call or poll(); this
  /// rank itself is alive. Owning thread only.
  zmq_peer_state peer_state(int peer) const {
    check_rank("peer_state", peer);
    return engine_->state_of(peer);
  }
  /// The peer_lost extension (communicator.hpp): peer_state(peer) is lost.
  bool peer_lost(int peer) const { return peer_state(peer) == zmq_peer_state::lost; }
  /// The peer_absent extension (communicator.hpp): no process has registered in `peer`'s slot
  /// yet (incarnation(peer) is 0).
  bool peer_absent(int peer) const { return incarnation(peer) == 0; }
  /// The incarnation of the process in `peer`'s slot (1 for the first, 2 after one restart, ...;
  /// 0 while absent), so an adapter tells a new process from the old one. incarnation(rank()) is
  /// this process's own. Owning thread only.
  std::uint64_t incarnation(int peer) const {
    check_rank("incarnation", peer);
    return engine_->incarnation_of(peer);
  }
  /// Takes in what has arrived (registrations, lost peers, messages) without waiting, so
  /// peer_state() and incarnation() are current; rank 0 answers registrations in it. Throws as a
  /// call after a failure or abort().
  void poll() { engine_->poll(engine_->begin("poll")); }

  /// What this rank refused so far: malformed messages, peers dropped for breaking the
  /// protocol, connections that did not prove the job secret (each also reported through
  /// zmq_options::on_event).
  zmq_stats stats() const noexcept { return engine_->stats(); }

  /// The data endpoint this rank bound (port 0 resolved).
  const std::string& endpoint() const noexcept { return engine_->endpoint(); }
  /// The rendezvous address: the one rank 0 bound (port 0 resolved), or the one others dialled.
  const std::string& rendezvous() const noexcept { return engine_->rendezvous_endpoint(); }

private:
  using op_kind = detail::zmq_op::kind;

  // Authenticated by default (CURVE from the job secret); open only by name, and then only on
  // loopback unless forced: a stranger on the network could otherwise register, take a slot or
  // send a message.
  static void check_security(const detail::call_info& c, const zmq_options& o) {
    if (o.security == wire_security::authenticated) {
      if (o.secret.empty())
        detail::bad_argument(c, "no job secret: set zmq_options::secret (job_secret::generate() on one process, "
                                "handed to the others), or ask for wire_security::open by name");
      if (zmq_has("curve") == 0)
        detail::bad_argument(c, "this libzmq cannot authenticate (built without CURVE, that is without "
                                "libsodium): install one that can, or ask for wire_security::open by name");
      return;
    }
    if (o.force_open_on_network) return;
    for (const std::string* address : {&o.endpoint, &o.rendezvous}) {
      if (address->rfind("tcp://", 0) != 0) continue;  // ipc:// and inproc:// stay on this host
      const detail::host_port hp = detail::parse_host_port(*address, detail::describe(c));
      if (!detail::is_loopback_host(hp.host))
        detail::bad_argument(c, "an open (unauthenticated) communicator on " + *address +
                                    " would take anyone who reaches it: use a job secret, or set "
                                    "force_open_on_network");
    }
  }

  zmq_work make_work(std::shared_ptr<detail::zmq_op> op) {
    return detail::work_access::make<zmq_work>(engine_, std::move(op));
  }

  void check_rank(const char* what, int peer) const {
    if (peer < 0 || peer >= size())
      throw invalid_parameter_error(std::string("cadence::transport[zmq]: ") + what + " on rank " +
                                    std::to_string(rank()) + ": rank " + std::to_string(peer) +
                                    " is out of range [0, " + std::to_string(size()) + ")");
  }

  std::shared_ptr<detail::zmq_coll_op> start_allreduce(void* buf, std::size_t count, dtype t, reduce_op op,
                                                       const deadline* d) {
    const detail::call_info c = engine_->begin("allreduce");
    engine_->enter(c);
    const std::size_t bytes = detail::check_allreduce(c, buf, count, t, op, false, d);
    const auto n = static_cast<std::size_t>(size());
    const bool ring = n > 1 && count >= n && bytes > std::max(engine_->options().eager_bytes, 8 * n);
    std::shared_ptr<detail::zmq_coll_op> o;
    if (ring)
      o = std::make_shared<detail::zmq_ring_allreduce>(c, buf, count, t, op);
    else
      o = std::make_shared<detail::zmq_allreduce_small>(c, buf, count, t, op);
    o->sig = {1, static_cast<std::uint8_t>(t), static_cast<std::uint8_t>(op), 0, count};
    engine_->submit_coll(o);
    return o;
  }

  std::shared_ptr<detail::zmq_coll_op> start_broadcast(void* buf, std::size_t bytes, int root, const deadline* d) {
    const detail::call_info c = engine_->begin("broadcast");
    engine_->enter(c);
    detail::check_broadcast(c, buf, bytes, root, d);
    auto o = std::make_shared<detail::zmq_broadcast>(c, buf, bytes, root);
    o->sig = {2, 0, 0, root, bytes};
    engine_->submit_coll(o);
    return o;
  }

  std::shared_ptr<detail::zmq_send_op> start_send(const void* buf, std::size_t bytes, int dst, int tag,
                                                  const deadline* d) {
    const detail::call_info c = engine_->begin("send");
    engine_->enter(c);
    detail::check_send(c, buf, bytes, dst, tag, d);
    auto o = std::make_shared<detail::zmq_send_op>(op_kind::send, c);
    o->buf = static_cast<const unsigned char*>(buf);
    o->bytes = bytes;
    o->peer = dst;
    o->tag = tag;
    engine_->submit_send(o);
    return o;
  }

  std::shared_ptr<detail::zmq_recv_op> start_recv(const char* name, void* buf, std::size_t bytes, int src, int tag,
                                                  const deadline* d) {
    const detail::call_info c = engine_->begin(name);
    engine_->enter(c);
    detail::check_recv(c, buf, bytes, src, tag, d);
    auto o = std::make_shared<detail::zmq_recv_op>(op_kind::recv, c);
    o->buf = static_cast<unsigned char*>(buf);
    o->bytes = bytes;
    o->peer = src;
    o->tag = tag;
    engine_->submit_recv(o);
    return o;
  }

  std::shared_ptr<detail::zmq_engine> engine_;
};

/// @}
}  // namespace cadence::transport
