/// \file
/// \ingroup transport
/// The MPI backend's options (target cadence::mpi): copies (and the lending sends that skip
/// them), when the ring starts, its pieces, the largest single message, polling and shutdown. Include
/// `<cadence/transport/mpi/communicator.hpp>`, which includes this.
#pragma once

#include <chrono>
#include <cstddef>

namespace cadence::transport {
/// \addtogroup transport
/// @{

/// The tag of mpi_communicator's lending sends, `send(buf, bytes, dst, tag, lend, d)` and
/// `isend(buf, bytes, dst, tag, lend)`: the caller lends `buf` to MPI and promises what the
/// bounce copy (mpi_options::bounce_buffers) would otherwise guarantee: the bytes stay valid
/// and unchanged until the send completed, and, if it never does (it failed on its deadline, was
/// abandoned, or its handle's cancel() said false), for the rest of the process. Such a send is
/// never copied. The parameter server lends what it owns and keeps that long (ps/options.hpp).
struct lend_t {
  explicit constexpr lend_t() = default;
};
/// The one value of lend_t, passed to a lending send.
inline constexpr lend_t lend{};

/// What an mpi_communicator is built with: its copies, its all-reduce protocols' sizes, its
/// polling and its shutdown wait.
struct mpi_options {
  /// The rule: a buffer MPI may still touch after the call that handed it over has failed
  /// must outlive that touch. Sends given `lend` (lend_t) are the caller's promise of that and
  /// are never copied, whatever this says; for the others this option decides who keeps it.
  /// True (the default): broadcasts (MPI_Ibcast) and sends run on a buffer the communicator
  /// owns, copied from and back to the caller's, so the caller may free its own as soon as the
  /// call returns, even on failure. MPI can cancel neither a collective nor (in Open MPI) a
  /// send: when one fails on its deadline its request stays posted, and if the late peer ever
  /// takes part, MPI reads or writes that buffer. With the copy the buffer is the
  /// communicator's, kept (leaked) for as long as MPI may touch it; without it (false), the
  /// caller must never free or reuse such a buffer. The all-reduces need no copy: they are our
  /// own point-to-point protocols, whose receives go into the communicator's scratch or are
  /// cancelled (see ring_min_bytes); receives are cancelled on failure and need none either.
  bool bounce_buffers = true;
  /// A broadcast receiver posts MPI_Ibcast only once the root has announced the same size (an
  /// MPI collective given mismatched sizes may corrupt memory or crash). The all-reduces check
  /// arguments in their own first messages and need no round of announcements first.
  bool verify_before_posting = true;
  /// All-reduces of at least this many bytes run as a ring (reduce-scatter, then allgather) of
  /// point-to-point messages on the caller's buffer, in pieces of ring_piece_bytes, each piece
  /// forwarded as soon as it is reduced; smaller ones by recursive doubling (log2(n) exchanges
  /// of the whole buffer with a header, through the communicator's scratch), which has the
  /// lower latency. SIZE_MAX turns the ring off.
  std::size_t ring_min_bytes = 256 * 1024;
  /// The ring's pieces: a piece goes on to the right neighbour as soon as it is reduced, while
  /// the next one is still arriving.
  std::size_t ring_piece_bytes = std::size_t{1} << 20;
  /// The largest single MPI message (MPI counts are int): a larger send or receive is one
  /// message of a derived datatype of blocks of this size, and ring pieces never exceed it.
  /// Tests lower it to exercise the arithmetic on small buffers.
  std::size_t max_message_bytes = std::size_t{1} << 30;
  /// Polling: the first waits spin on MPI_Test (latency); a call still waiting after this long
  /// sleeps `poll_sleep` between tests so a stalled job does not burn its cores.
  std::chrono::microseconds spin_for{200000};
  /// How long a wait sleeps between two MPI_Test once spin_for has passed.
  std::chrono::microseconds poll_sleep{50};
  /// How long the destructor waits for the peers' last announcements before it gives up and
  /// leaks the duplicated communicators rather than free them with messages in flight.
  std::chrono::milliseconds shutdown_wait{2000};
};

/// @}
}  // namespace cadence::transport
