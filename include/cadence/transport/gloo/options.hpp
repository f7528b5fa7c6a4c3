/// \file
/// \ingroup transport
/// The gloo backend's options (target cadence::gloo): the rendezvous (a folder or a TCP store),
/// the address to bind, the sizes that choose between inline messages, the ring and chunks, the
/// bounds on what is held, and the waits of construction and shutdown. Include
/// `<cadence/transport/gloo/communicator.hpp>`, which includes this.
#pragma once

#include <cadence/transport/tcp_store.hpp>

#include <chrono>
#include <cstddef>
#include <string>

namespace cadence::transport {
/// \addtogroup transport
/// @{

/// What a gloo_communicator is built with: where the ranks meet, the address it binds, the
/// message sizes that choose its protocols, and its waits.
struct gloo_options {
  /// The rendezvous folder (gloo::rendezvous::FileStore) every rank can reach, typically on a
  /// shared file system or, on one host, a temporary folder. It must exist and be writable.
  /// Not used when `rendezvous` is set.
  std::string store_path;
  /// Rendezvous over TCP instead of a folder, for hosts that share no file system: the
  /// "host:port" of a tcp_store_server (transport/tcp_store.hpp) every rank can reach.
  std::string rendezvous;
  /// How the TCP rendezvous is guarded: the job secret every rank holds (the store then serves
  /// only holders of it), or an open store asked for by name (tcp_store_options). gloo's own
  /// data connections are not authenticated by gloo: see docs/transports.md, "Security".
  tcp_store_options store;
  /// With `rendezvous`: rank 0 serves the store itself, binding that address (so its host
  /// must be one of rank 0's addresses, or 0.0.0.0 with the others given rank 0's), for the
  /// construction only: it closes the port once every rank has connected. Clear it when the
  /// job serves a store there for longer (cadence-train's rank 0 serves one for the whole job,
  /// which every communicator of the job shares under its own prefix).
  bool serve_rendezvous = true;
  /// Names this communicator inside the folder or store (its keys are under that name), so
  /// several communicators, or survivors forming a new one after a peer died, share one.
  /// Must be fresh: keys left by an earlier job under the same prefix would be read as peers.
  std::string prefix = "cadence";
  /// The address our TCP device binds; peers connect to it. Loopback by default (one host).
  std::string hostname = "127.0.0.1";
  /// A network interface ("eth0") to bind instead of hostname, when not empty.
  std::string interface_name;
  /// Point to point messages and collectives of at most this many bytes travel in one framed
  /// message through buffers the communicator owns (a send returns as soon as it is posted,
  /// the way MPI's eager protocol does; an all-reduce runs recursive doubling, log2(n)
  /// exchanges of the buffer); larger ones announce their size in a header and then move
  /// between the caller's buffers directly (a send waits for its receiver).
  std::size_t eager_bytes = 64 * 1024;
  /// All-reduces larger than eager_bytes run as a ring (reduce-scatter, then allgather) on the
  /// caller's buffer, in chunks of this many bytes, pipelined; large broadcasts move in chunks
  /// too. Every rank must be given the same eager_bytes and chunk_bytes. 1 MiB: with fewer,
  /// smaller pieces gloo's device threads wake more often per segment, and a 4 MiB all-reduce
  /// on two ranks reached 84-93% of gloo's own against 99.7-101.5% with 1 MiB (docs/results.md,
  /// "gloo against the native call"). Smaller buffers than a segment's piece move as one piece.
  std::size_t chunk_bytes = 1024 * 1024;
  /// Small sends kept until known to be received (gloo has no test that does not block): at
  /// this many, a send first waits, with its deadline, for the oldest to be received (usually
  /// long done). Bounds the memory held to this many copies of up to eager_bytes.
  std::size_t max_eager_in_flight = 64;
  /// Construction polls the folder or store for the other ranks' arrival at this interval.
  std::chrono::milliseconds store_poll{5};
  /// How long a try_recv whose deadline passed while a large message's header arrived waits
  /// for the message's data (sent right behind the header), rather than leave half of it.
  std::chrono::milliseconds body_wait{10000};
  /// How long the destructor of a communicator that has not failed waits for its small sends
  /// to be received (a send returns before that) before it closes the connections.
  std::chrono::milliseconds shutdown_wait{5000};
  /// gloo writes to its sockets with writev(2), without MSG_NOSIGNAL, so a write to a peer
  /// that has died raises SIGPIPE, whose default action kills the whole process, survivors
  /// included. When set, construction sets SIGPIPE to SIG_IGN if it is still at its default
  /// (a handler or disposition the program chose is left alone); the write then fails with
  /// EPIPE and the call reports the peer as lost. This is the one process-wide effect of the
  /// backend (PyTorch and gRPC ignore SIGPIPE for the same reason); clear it to manage SIGPIPE
  /// yourself.
  bool ignore_sigpipe = true;
};

/// @}
}  // namespace cadence::transport
