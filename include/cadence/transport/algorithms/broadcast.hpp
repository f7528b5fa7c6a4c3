// The broadcast, written once over a wire (algorithms/wire.hpp): the root sends its signature
// and, up to the wire's inline capacity, its data in one message to every rank; a larger
// buffer follows in pieces, whose size that message gives (piece sizes are each process's
// option: the root's rule). A receiver checks the root's signature before anything is posted
// on its buffer, and each piece's length where the wire can tell it. As MPI_Bcast: the root is done once its data has left; a receiver that never takes
// it is named.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/wire.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/operation.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cadence::transport::detail {

/// Phases: the root 1 (sending); a receiver 0 (the root's message) and 2 (the pieces). The
/// root's pieces still to complete, per peer, live in sent_by; a receiver's in piece.
template <class W>
struct root_broadcast {
  static void start(W& w, operation& o) {
    const bool inline_data = o.bytes <= w.inline_capacity();
    if (w.rank() != o.peer) {
      o.phase = 0;
      return;
    }
    std::vector<int> others;
    for (int p = 0; p < w.size(); ++p)
      if (p != w.rank()) others.push_back(p);
    const std::size_t piece = w.piece_bytes(1), pieces = chunk_count(o.bytes, piece);
    const std::size_t n = inline_data ? o.bytes : sizeof(std::uint64_t);
    unsigned char* out = w.out_data(n);
    if (inline_data && n != 0) std::memcpy(out, o.buf, n);
    if (!inline_data) {
      const std::uint64_t announced = piece;
      std::memcpy(out, &announced, sizeof announced);
    }
    w.send_out(o.c, others, o.sig, collective_summary::of(o.sig, w.rank()), n);
    o.phase = 1;
    o.sent_by.assign(static_cast<std::size_t>(w.size()), 0);
    if (inline_data) return;
    w.bulk_begin(o.c, o.buf, o.bytes, 0);
    w.expose();
    for (int p : others)
      for (std::size_t k = 0; k < pieces; ++k) {
        w.bulk_send(o.c, p, bulk_region::caller, k * piece, chunk_length(o.bytes, piece, k));
        ++o.sent_by[static_cast<std::size_t>(p)];
      }
  }

  static void advance(W& w, operation& o) {
    if (w.rank() == o.peer) {
      for (int p = 0; p < w.size(); ++p) {
        auto& left = o.sent_by[static_cast<std::size_t>(p)];
        while (left > 0) {
          if (!w.bulk_send_done(o.c, p)) return;
          --left;
        }
      }
      if (!w.out_sent(o.c)) return;
      if (o.bytes > w.inline_capacity()) w.bulk_end(o.c);
      o.done = true;
      return;
    }
    if (o.phase == 0) {
      const bool inline_data = o.bytes <= w.inline_capacity();
      const std::size_t head = sizeof(std::uint64_t);
      coll_message m;
      if (!w.take(o.c, o.peer, coll_stream::data, o.sig.index, inline_data ? o.bytes : head, m)) return;
      if (m.too_long && m.sig.kind == 0)  // a wire that truncates hid the head: name the sizes
        throw transport_error(describe(o.c) + ": arguments differ across ranks in collective #" +
                              std::to_string(o.sig.index) + ": rank " + std::to_string(o.peer) +
                              " (the root) sent more than rank " + std::to_string(w.rank()) + "'s " +
                              o.sig.describe() + " takes");
      if (m.sig != o.sig || m.too_long)
        throw transport_error(describe(o.c) + ": " + arguments_differ(o.sig, w.rank(), m.sig, o.peer));
      if (inline_data) {
        if (o.bytes != 0) std::memcpy(o.buf, m.data, o.bytes);
        w.release(o.c, o.peer, coll_stream::data);
        o.done = true;
        return;
      }
      std::uint64_t announced = 0;
      if (m.bytes == coll_message::unknown || m.bytes == head) std::memcpy(&announced, m.data, head);
      w.release(o.c, o.peer, coll_stream::data);
      if (announced == 0)
        throw transport_error(describe(o.c) + ": rank " + std::to_string(o.peer) +
                              " (the root) sent a broadcast's head without its piece size");
      o.root_piece = static_cast<std::size_t>(announced);
      const std::size_t pieces = chunk_count(o.bytes, o.root_piece);
      w.bulk_begin(o.c, o.buf, o.bytes, 0);
      w.expose();
      for (std::size_t k = 0; k < pieces; ++k)
        w.bulk_recv(o.c, o.peer, bulk_region::caller, k * o.root_piece, chunk_length(o.bytes, o.root_piece, k));
      o.piece = pieces;
      o.phase = 2;
    }
    const std::size_t pieces = chunk_count(o.bytes, o.root_piece);
    while (o.piece > 0) {
      std::size_t got = coll_message::unknown;
      if (!w.bulk_recv_done(o.c, o.peer, got)) return;
      const std::size_t k = pieces - o.piece, due = chunk_length(o.bytes, o.root_piece, k);
      if (got != coll_message::unknown && got != due)
        throw transport_error(describe(o.c) + ": in the broadcast, rank " + std::to_string(o.peer) + " sent piece " +
                              std::to_string(k) + " of " + std::to_string(got) + " bytes where " +
                              std::to_string(due) + " were due");
      --o.piece;
    }
    w.bulk_end(o.c);
    o.done = true;
  }

  static waiting awaited(W& w, const operation& o) {
    if (w.rank() == o.peer) {
      for (int p = 0; p < w.size(); ++p)
        if (o.sent_by.size() > static_cast<std::size_t>(p) && o.sent_by[static_cast<std::size_t>(p)] > 0)
          return {{p}, "it did not take the broadcast's data", w.native(wire_point::bulk_out, p), false};
      return {w.out_pending(), "it did not take this collective's message", w.native(wire_point::out, -1), false};
    }
    if (o.phase == 0)
      return {{o.peer}, "they never started this collective", w.native(wire_point::data_in, o.peer), true};
    return {{o.peer}, "in the broadcast's data", w.native(wire_point::bulk_in, o.peer), true};
  }
};

}  // namespace cadence::transport::detail
