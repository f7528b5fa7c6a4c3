/// \file
/// \ingroup transport
/// The ZeroMQ backend's options and peer states: what a rank binds, where it registers, how
/// fast a silent peer counts as lost, and the bounds on what a peer may queue here. Include
/// `<cadence/transport/zmq/communicator.hpp>`, which includes this.
#pragma once

#include <cadence/transport/secret.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace cadence::transport {
/// \addtogroup transport
/// @{

/// What this rank knows of a peer. A rank slot starts absent (no process registered in it yet),
/// is alive from its registration, and lost once its connection closed, fell silent past the
/// heartbeat timeout or it left; a process registering again in a lost (or alive) slot makes it
/// alive again under a new incarnation. Lost is final for an incarnation: nothing retries.
enum class zmq_peer_state : std::uint8_t { absent, alive, lost };

/// The name of `s` as messages write it ("alive"), or "unknown".
constexpr const char* zmq_peer_state_name(zmq_peer_state s) noexcept {
  switch (s) {
    case zmq_peer_state::absent: return "absent";
    case zmq_peer_state::alive: return "alive";
    case zmq_peer_state::lost: return "lost";
  }
  return "unknown";
}

/// Whom construction waits for. `all`: every rank has registered (a fixed world, as the other
/// backends). `self`: this rank's own registration only, so a parameter server starts before its
/// workers and workers join a running job; calls then wait for the peers they need.
enum class zmq_wait_for : std::uint8_t { all, self };

/// What a rank refused so far (zmq_communicator::stats()).
struct zmq_stats {
  std::size_t malformed = 0;            ///< messages that failed their own checks
  std::size_t dropped_peers = 0;        ///< peers dropped for such a message, or beyond an allowance
  std::size_t refused_connections = 0;  ///< connections that did not prove the job secret
};

/// What a zmq_communicator is built with: where it binds and registers, whom construction waits
/// for, its heartbeats, message sizes and bounds, and how its connections are guarded.
struct zmq_options {
  /// Rank 0 binds it, every other rank connects to it to register: a TCP address all ranks
  /// reach, "tcp://10.0.0.1:29500". Rank 0 may give port 0 ("tcp://127.0.0.1:0", tests) and
  /// learn the port it got from on_rendezvous_bound. Required.
  std::string rendezvous;
  /// This rank's own data endpoint, bound by it; peers connect to the address it binds. Port 0
  /// takes any free port. It must name an address the peers reach this host by: a wildcard
  /// host (*, 0.0.0.0) is refused, since peers cannot connect to it.
  std::string endpoint = "tcp://127.0.0.1:0";
  /// Whom construction waits for: every rank (`all`), or this rank's registration (`self`).
  zmq_wait_for wait_for = zmq_wait_for::all;
  /// ZMTP heartbeats on every connection (ZMQ_HEARTBEAT_IVL): ZeroMQ's I/O thread pings each
  /// peer this often, whether or not the application calls the communicator.
  std::chrono::milliseconds heartbeat_interval{1000};
  /// A peer silent this long after a ping (ZMQ_HEARTBEAT_TIMEOUT, also the handshake limit and
  /// the TTL asked of the peer) is lost: a stopped process, a hung host, a cut link. A crashed
  /// process is lost at once (its connections close). Seconds in production; tests use less.
  std::chrono::milliseconds heartbeat_timeout{5000};
  /// Point-to-point messages up to this size travel at once, copied, with their header (a send
  /// completes when ZeroMQ has taken its copy). Larger ones move from the caller's buffer without
  /// a copy: at once if they fit a quarter of credit_bytes, else announced first and sent once the
  /// receiver has posted a matching receive (rendezvous); such a send completes when ZeroMQ has
  /// let go of the buffer.
  std::size_t eager_bytes = 64 * 1024;
  /// Large messages, large broadcasts and the ring all-reduce move in pieces of this size, each a
  /// ZeroMQ message read from the caller's buffer without a copy: the ring forwards a piece as
  /// soon as it is reduced. Every rank must be given the same chunk_bytes and eager_bytes.
  std::size_t chunk_bytes = 512 * 1024;
  /// Per peer: the bytes of messages sent at once (plus 64 per message of any kind) it may have
  /// sent here that no receive has taken yet. A sender that reaches it waits until the receiver
  /// takes some (credits flow back): the bound on what a receiver that stops receiving holds for
  /// one peer. At least 4 * (eager_bytes + 64).
  std::size_t credit_bytes = std::size_t{4} << 20;
  /// The destructor of a communicator waits at most this long for its last messages (and a
  /// goodbye to every live peer) to leave.
  std::chrono::milliseconds shutdown_wait{2000};
  /// A try_recv that matched a large message just before its deadline waits this long for the
  /// message's data (already on its way) rather than leave half of it.
  std::chrono::milliseconds body_wait{10000};
  /// ZeroMQ I/O threads of this communicator's context (ZMQ_IO_THREADS).
  int io_threads = 1;
  /// The job secret every rank holds. Every socket authenticates its peers with CURVE keys
  /// derived from it and encrypts what it sends (the default security): a process without it
  /// cannot connect, register, take a slot or send a message. Empty with `security ==
  /// authenticated` is refused: give one, or ask for wire_security::open by name.
  job_secret secret;
  /// `open`: no authentication, no encryption; only when asked for by name, and only with
  /// loopback endpoints unless `force_open_on_network`.
  wire_security security = wire_security::authenticated;
  /// With `open`: endpoints other than loopback too.
  bool force_open_on_network = false;
  /// Per peer: the bytes of collective messages held for collectives this rank has not started
  /// yet (a root's broadcasts issued ahead of this rank's calls). A peer that sends more is
  /// dropped (lost, with the reason); raise it where a root broadcasts more than this ahead of
  /// slow receivers. For a collective in progress the bound is its own: twice its bytes. The
  /// other bounds on what a peer may make this rank hold are credit_bytes (point to point) and
  /// the largest legal frame, which every socket enforces (ZMQ_MAXMSGSIZE: a larger one closes
  /// the connection).
  std::size_t max_inbox_bytes = std::size_t{1} << 30;
  /// Called on the owning thread, inside a call, for each peer dropped for a malformed or
  /// excessive message and each connection the authentication refused, with a line that names
  /// the peer (or address) and what was wrong: for a program's log.
  std::function<void(const std::string&)> on_event;
  /// Called on rank 0 with the rendezvous address it bound (port 0 resolved), before it waits
  /// for anyone: a launcher publishes it there.
  std::function<void(const std::string&)> on_rendezvous_bound;
};

/// @}
}  // namespace cadence::transport
