// The wire: what a host backend offers the collective algorithms written once in this folder
// (recursive doubling, the ring, the broadcast), so that MPI and gloo differ only in how bytes
// move, not in the protocol. The requirements, each with its reason, are below.
#pragma once

#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/signature.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>

namespace cadence::transport::detail {

/// The collective channel a wire keeps per peer carries two streams: notices (a signature and a
/// summary, no data) and data messages (the same head, then data).
enum class coll_stream : std::uint8_t { notice, data };

/// Where a bulk piece is read from or written to.
enum class bulk_region : std::uint8_t { scratch0, scratch1, staging, caller };

/// What a blocked wait waits on, for a backend that blocks in a native wait.
enum class wire_point : std::uint8_t { notice_in, data_in, out, notices_out, bulk_in, bulk_out };

/// A message of the collective channel as the wire hands it over, valid until release().
struct coll_message {
  static constexpr std::size_t unknown = std::numeric_limits<std::size_t>::max();
  collective_signature sig{};
  collective_summary summary{};
  const unsigned char* data = nullptr;
  std::size_t bytes = unknown;  // data bytes that came, when the wire can tell
  bool too_long = false;        // longer than the data the receive could take
};

// A type W is a wire when, for `W& w`, a call_info c, ranks p and `to` (a list of ranks):
//  1. w.rank(), w.size(). The algorithms derive partners and segments from them.
//  2. w.inline_capacity(): the largest payload of one collective message. All-reduces of more
//     bytes take the ring (bulk pieces); smaller ones and broadcasts up to it travel inline.
//     At least 8 * size(), so an all-reduce with fewer elements than ranks always fits.
//     w.piece_bytes(element_size): a ring piece, a multiple of the element size.
//  3. Outgoing messages: w.out_data(n) is the data part of the wire's one outgoing message (at
//     least n bytes; the small all-reduce accumulates in it); w.send_out(c, to, sig, summary, n)
//     sends [sig | summary | n bytes of it] to each of `to`; w.out_sent(c) says whether every
//     such send has left (until then neither the head nor the data may change).
//     w.send_notices(c, to, sig) sends a notice (no data) to each of `to` from a buffer of its
//     own, so a notice and a data message may be in flight together; w.notices_sent(c) likewise.
//     w.out_pending() and w.notices_pending() name the ranks whose send has not been seen to
//     complete, from what is known (no progress, no throw): for deadline errors.
//  4. Incoming messages: w.take(c, p, stream, index, capacity, m) hands over p's next message of
//     that stream (of collective `index`, for a wire that keeps notices by index) if it has
//     come; `capacity` is the most data the algorithm accepts (a wire that posts receives on
//     demand posts one that size). Messages of one peer arrive in the order it sent them.
//     w.release(c, p, stream) ends the use of m (a wire reposts its receive). w.expect(c, p, n)
//     announces that p's next data message (up to n bytes) is due before anything is sent to
//     p: a wire that posts receives on demand posts it now, so two partners that both send
//     before they receive never wait for each other's receive (a large MPI send does).
//  5. Bulk pieces (the ring): w.bulk_begin(c, buf, bytes, scratch) registers the caller's buffer
//     and grows the two scratch buffers to `scratch` bytes and the staging buffer to a piece;
//     w.bulk_base(region) is a region's first byte; w.bulk_recv(c, p, region, offset, capacity)
//     and w.bulk_send(c, p, region, offset, n) post one piece; w.bulk_recv_done(c, p, got) and
//     w.bulk_send_done(c, p) complete the oldest posted receive from (send to) p if it has
//     completed, setting `got` to the bytes received or coll_message::unknown. Pieces between
//     two ranks complete in the order they were posted. w.expose() says that from now on the
//     caller's buffer may be read or written by the wire; w.bulk_end(c) that it no longer is.
//  6. W::posts_over_delivered_sends: whether a receive may be posted into memory that a send
//     still counted as pending reads, once the data that receive will get proves the send was
//     delivered (gloo: yes; MPI: no, a send buffer is the send's until it completes).
//  7. w.native(point, p) -> the handle a blocked wait on that point blocks on (null: poll).
//  8. w.reads_caller_early(): whether the ring may send from the caller's buffer before every
//     rank's notice has agreed (it exposes the buffer at its start, and still writes into it
//     only after agreement). True where a failure leaves a send reading the caller's buffer
//     anyway (MPI: a send cannot be withdrawn; the buffer stays the send's, as documented):
//     step 0 then moves at once instead of waiting a notice round. False where a failure with
//     the buffer exposed costs more than the copy (gloo: it closes every connection): step 0's
//     first ring_allreduce::early_bytes (at least a piece) then leave from copies (the staging
//     buffer, then scratch0 past the receives' part) and the rest once the ranks agreed.
// Every member may throw transport_error (a lost peer, a refused post): the engine then fails
// the communicator. What a wire does with what is in flight when that happens is its own.

}  // namespace cadence::transport::detail
