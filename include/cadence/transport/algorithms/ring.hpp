// The ring all-reduce, written once over a wire (algorithms/wire.hpp): reduce-scatter, then
// allgather, in pieces, pipelined, bandwidth-optimal for large buffers; and the ring's schedule
// (which segment each step sends and receives), which the ZeroMQ backend's ring shares.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/wire.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/operation.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace cadence::transport::detail {

/// Over n ranks: in reduce-scatter step s, rank r sends segment r - s to its right neighbour
/// and adds segment r - s - 1 from its left one; after n - 1 steps it owns segment r + 1 fully
/// reduced, and n - 1 allgather steps pass the reduced segments around. Segments move in pieces
/// of `piece` bytes.
struct ring_schedule {
  int n = 1, r = 0;
  std::size_t count = 0;  // elements of the whole buffer
  std::size_t esize = 1;  // bytes per element
  std::size_t piece = 8;  // bytes per piece, a multiple of esize

  /// The first element of segment `seg`.
  std::size_t first(int seg) const noexcept {
    return count * static_cast<std::size_t>(seg) / static_cast<std::size_t>(n);
  }
  std::size_t seg_bytes(int seg) const noexcept { return (first(seg + 1) - first(seg)) * esize; }
  std::size_t pieces(int seg) const noexcept { return chunk_count(seg_bytes(seg), piece); }
  std::size_t piece_len(int seg, std::size_t k) const noexcept { return chunk_length(seg_bytes(seg), piece, k); }
  /// Where piece k of segment seg starts in the buffer, in bytes.
  std::size_t offset(int seg, std::size_t k) const noexcept { return first(seg) * esize + k * piece; }
  /// The largest segment rounded up to whole pieces: what a scratch buffer must hold.
  std::size_t scratch_bytes() const noexcept {
    const std::size_t largest = (count + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n) * esize;
    return (largest + piece - 1) / piece * piece;
  }
  int steps() const noexcept { return 2 * (n - 1); }
  bool reduces(int s) const noexcept { return s < n - 1; }
  int seg_out(int s) const noexcept { return reduces(s) ? (r - s + n) % n : (r + 1 - (s - (n - 1)) + 2 * n) % n; }
  int seg_in(int s) const noexcept { return reduces(s) ? (r - s - 1 + 2 * n) % n : (r - (s - (n - 1)) + 2 * n) % n; }
  int left() const noexcept { return (r + n - 1) % n; }
  int right() const noexcept { return (r + 1) % n; }
};

/// The algorithm over a wire W; its state lives in the operation. Every rank sends every other
/// rank a notice and takes theirs before anything is written into the caller's buffer (phase
/// 0): until then receives go into scratch, each posted for a whole piece (the longest any rank
/// sends, so arguments that differ can garble scratch but never overrun a buffer). A mismatch
/// therefore fails the call before anything reaches the caller's buffer. The notices leave
/// first, so that no piece delays them. Step 0's pieces then leave from the caller's buffer at
/// once where the wire reads it early (wire.hpp, 8); elsewhere its first `early_bytes` leave
/// from copies (the first piece from the staging buffer, the next ones from scratch0 beyond
/// what the receives use) and the rest once the ranks agreed: the ring's first step moves while
/// the notices travel instead of after them. Phase 1 runs the steps, each step's receives posted
/// a step ahead; phase 2 waits for the last sends. Any rank count and element count: one rank is
/// done at once, and a segment left empty (fewer elements than ranks) moves no piece.
template <class W>
struct ring_allreduce {
  static ring_schedule schedule(const W& w, const operation& o) {
    const std::size_t esize = dtype_size(o.type);
    return {w.size(), w.rank(), o.count, esize, w.piece_bytes(esize)};
  }

  /// Step 0's bytes sent from copies before the ranks agree, where the wire does not read the
  /// caller's buffer early: at least one piece. About what gloo's loopback link moves while the
  /// notices are exchanged (1.3 GB/s for 300-600 us on the 2-core machine; docs/results.md,
  /// "gloo against the native call"), so that step 0 has arrived when the ranks agree instead
  /// of starting then. The copies (about 40 us for 512 KiB there) cost a fraction of the time they
  /// save; each scratch buffer grows by at most this much less a piece.
  static constexpr std::size_t early_bytes = std::size_t{1} << 20;

  /// The pieces of step 0 sent before agreement from copies (0 where the wire reads the
  /// caller's buffer early and sends all of them from it).
  static std::size_t early_pieces(const W& w, const ring_schedule& g) {
    if (w.reads_caller_early()) return 0;
    return std::min(g.pieces(g.seg_out(0)), std::max<std::size_t>(1, early_bytes / g.piece));
  }

  static void start(W& w, operation& o) {
    const ring_schedule g = schedule(w, o);
    if (g.n == 1) {  // the buffer is the result: nothing to send, nobody to wait for
      o.done = true;
      return;
    }
    const std::size_t early = early_pieces(w, g);
    // Pieces 1 .. early - 1 are copied to scratch0 past the receives' scratch_bytes().
    w.bulk_begin(o.c, o.buf, o.bytes, g.scratch_bytes() + (early > 1 ? (early - 1) * g.piece : 0));
    o.sent_by.assign(static_cast<std::size_t>(g.steps()), 0);
    o.sends_done = 0;
    o.posted_step = -1;
    post(w, o, g, 0);
    if (g.steps() > 1 && g.reduces(1)) post(w, o, g, 1);
    o.awaiting.assign(static_cast<std::size_t>(g.n), 1);
    o.awaiting[static_cast<std::size_t>(g.r)] = 0;
    std::vector<int> others;
    for (int p = 0; p < g.n; ++p)
      if (p != g.r) others.push_back(p);
    w.send_notices(o.c, others, o.sig);
    const int seg = g.seg_out(0);
    if (w.reads_caller_early()) {
      w.expose();
      for (std::size_t k = 0; k < g.pieces(seg); ++k) send(w, o, g, 0, seg, k);
    } else {
      const unsigned char* caller = w.bulk_base(bulk_region::caller);
      for (std::size_t k = 0; k < early; ++k) {
        const std::size_t len = g.piece_len(seg, k);
        const bulk_region from = k == 0 ? bulk_region::staging : bulk_region::scratch0;
        const std::size_t at = k == 0 ? 0 : g.scratch_bytes() + (k - 1) * g.piece;
        std::memcpy(w.bulk_base(from) + at, caller + g.offset(seg, k), len);
        w.bulk_send(o.c, g.right(), from, at, len);
        ++o.sent_by[0];
      }
    }
    o.phase = 0;
  }

  static void advance(W& w, operation& o) {
    const ring_schedule g = schedule(w, o);
    if (o.phase == 0) {
      // Every notice that has come is taken, so that a deadline names only the ranks whose
      // notice is still missing.
      bool missing = false;
      for (int p = 0; p < g.n; ++p) {
        if (!o.awaiting[static_cast<std::size_t>(p)]) continue;
        coll_message m;
        if (!w.take(o.c, p, coll_stream::notice, o.sig.index, 0, m)) {
          missing = true;
          continue;
        }
        if (m.sig != o.sig) throw transport_error(describe(o.c) + ": " + arguments_differ(o.sig, g.r, m.sig, p));
        o.awaiting[static_cast<std::size_t>(p)] = 0;
        w.release(o.c, p, coll_stream::notice);
      }
      if (missing) return;
      if (!w.reads_caller_early()) {
        w.expose();  // from here on the wire reads and writes the caller's buffer
        const int seg = g.seg_out(0);
        for (std::size_t k = early_pieces(w, g); k < g.pieces(seg); ++k) send(w, o, g, 0, seg, k);
      }
      o.phase = 1;
      o.step = 0;
      o.piece = 0;
    }
    while (o.phase == 1 && o.step < g.steps()) {
      const int s = o.step;
      if (!post(w, o, g, s)) return;
      post(w, o, g, s + 1);  // a step ahead, when its memory is free
      const int seg = g.seg_in(s);
      while (o.piece < g.pieces(seg)) {
        std::size_t got = coll_message::unknown;
        if (!w.bulk_recv_done(o.c, g.left(), got)) return;
        const std::size_t k = o.piece, len = g.piece_len(seg, k);
        if (got != coll_message::unknown && got != len)
          throw transport_error(describe(o.c) + ": in the ring all-reduce, rank " + std::to_string(g.left()) +
                                " sent a piece of " + std::to_string(got) + " bytes where " + std::to_string(len) +
                                " were due (the ranks' piece sizes differ)");
        if (g.reduces(s)) {
          unsigned char* at = w.bulk_base(bulk_region::caller) + g.offset(seg, k);
          const unsigned char* in = w.bulk_base(s % 2 == 0 ? bulk_region::scratch0 : bulk_region::scratch1) + k * g.piece;
          if (o.average && s == g.n - 2)
            reduce_divide_into(at, in, len / g.esize, o.type, static_cast<double>(g.n));
          else
            reduce_into(at, in, len / g.esize, o.type, o.rop);
        }
        if (s + 1 < g.steps()) send(w, o, g, s + 1, seg, k);  // segment seg_in(s) is seg_out(s + 1)
        ++o.piece;
      }
      ++o.step;
      o.piece = 0;
    }
    o.phase = 2;
    const std::size_t total = std::accumulate(o.sent_by.begin(), o.sent_by.end(), std::size_t{0});
    while (o.sends_done < total) {
      if (!w.bulk_send_done(o.c, g.right())) return;
      ++o.sends_done;
    }
    if (!w.notices_sent(o.c)) return;
    w.bulk_end(o.c);
    o.done = true;
  }

  static waiting awaited(W& w, const operation& o) {
    const ring_schedule g = schedule(w, o);
    if (o.phase == 0) {
      std::vector<int> absent;
      for (int p = 0; p < g.n; ++p)
        if (o.awaiting[static_cast<std::size_t>(p)]) absent.push_back(p);
      if (!absent.empty())
        return {absent, "they never started this collective; in the ring all-reduce",
                w.native(wire_point::notice_in, absent.front()), true};
    }
    if (o.phase <= 1 && o.step < g.steps())
      return {{g.left()}, "in the ring all-reduce", w.native(wire_point::bulk_in, g.left()), true};
    if (o.sends_done < std::accumulate(o.sent_by.begin(), o.sent_by.end(), std::size_t{0}))
      return {{g.right()}, "in the ring all-reduce", w.native(wire_point::bulk_out, g.right()), false};
    return {w.notices_pending(), "it did not take this collective's notice", w.native(wire_point::notices_out, -1),
            false};
  }

private:
  static void send(W& w, operation& o, const ring_schedule& g, int step, int seg, std::size_t k) {
    w.bulk_send(o.c, g.right(), bulk_region::caller, g.offset(seg, k), g.piece_len(seg, k));
    ++o.sent_by[static_cast<std::size_t>(step)];
  }

  // Posts step t's receives, in step order and at most a step ahead; false while its memory is
  // not free: a reduce-scatter step reuses the scratch of step t - 2 (consumed by now), an
  // allgather step writes the segment that reduce-scatter step t - (n - 1) sent, so on a wire
  // that may not post over a pending send, that step's sends must have completed first.
  static bool post(W& w, operation& o, const ring_schedule& g, int t) {
    if (t >= g.steps() || o.posted_step >= t) return true;
    if (o.posted_step != t - 1) return false;
    if (!g.reduces(t) && !W::posts_over_delivered_sends) {
      std::size_t needed = 0;
      for (int j = 0; j <= t - (g.n - 1); ++j) needed += o.sent_by[static_cast<std::size_t>(j)];
      while (o.sends_done < needed && w.bulk_send_done(o.c, g.right())) ++o.sends_done;
      if (o.sends_done < needed) return false;
    }
    const int seg = g.seg_in(t);
    for (std::size_t k = 0; k < g.pieces(seg); ++k) {
      if (g.reduces(t))
        w.bulk_recv(o.c, g.left(), t % 2 == 0 ? bulk_region::scratch0 : bulk_region::scratch1, k * g.piece, g.piece);
      else
        w.bulk_recv(o.c, g.left(), bulk_region::caller, g.offset(seg, k), g.piece_len(seg, k));
    }
    o.posted_step = t;
    return true;
  }
};

}  // namespace cadence::transport::detail
