// The broadcast, written once over a wire (algorithms/wire.hpp): the root sends its signature
// and, up to the wire's inline capacity, its data in one message to every rank; a larger
// buffer follows in pieces. A receiver checks the root's signature before anything is posted on
// its buffer. As MPI_Bcast: the root is done once its data has left; a receiver that never takes
// it is named.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/wire.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/operation.hpp>

#include <cstddef>
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
    const std::size_t n = inline_data ? o.bytes : 0;
    unsigned char* out = w.out_data(n);
    if (n != 0) std::memcpy(out, o.buf, n);
    w.send_out(o.c, others, o.sig, collective_summary::of(o.sig, w.rank()), n);
    o.phase = 1;
    o.sent_by.assign(static_cast<std::size_t>(w.size()), 0);
    if (inline_data) return;
    w.bulk_begin(o.c, o.buf, o.bytes, 0);
    w.expose();
    const std::size_t piece = w.piece_bytes(1), pieces = chunk_count(o.bytes, piece);
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
    const std::size_t piece = w.piece_bytes(1), pieces = chunk_count(o.bytes, piece);
    if (o.phase == 0) {
      const bool inline_data = o.bytes <= w.inline_capacity();
      coll_message m;
      if (!w.take(o.c, o.peer, coll_stream::data, o.sig.index, inline_data ? o.bytes : 0, m)) return;
      if (m.sig != o.sig || m.too_long)
        throw transport_error(describe(o.c) + ": " + arguments_differ(o.sig, w.rank(), m.sig, o.peer));
      if (inline_data) {
        if (o.bytes != 0) std::memcpy(o.buf, m.data, o.bytes);
        w.release(o.c, o.peer, coll_stream::data);
        o.done = true;
        return;
      }
      w.release(o.c, o.peer, coll_stream::data);
      w.bulk_begin(o.c, o.buf, o.bytes, 0);
      w.expose();
      for (std::size_t k = 0; k < pieces; ++k)
        w.bulk_recv(o.c, o.peer, bulk_region::caller, k * piece, chunk_length(o.bytes, piece, k));
      o.piece = pieces;
      o.phase = 2;
    }
    while (o.piece > 0) {
      std::size_t got = coll_message::unknown;
      if (!w.bulk_recv_done(o.c, o.peer, got)) return;
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
