// The small all-reduce, written once over a wire (algorithms/wire.hpp): recursive doubling,
// log2(n) exchanges of the whole buffer, for the latency-bound sizes. Every message carries the
// sender's signature and a summary of the lowest and highest arguments seen, so arguments that
// differ anywhere are reported on every rank, naming both sides.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/wire.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/operation.hpp>
#include <cadence/transport/engine/signature.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace cadence::transport::detail {

/// Recursive doubling over n ranks: p, the largest power of two <= n, ranks take part; the n - p
/// others (the even ranks below 2(n - p)) hand their data to the odd rank above them first and
/// take the result back last (MPICH's scheme).
struct doubling {
  int n = 1, p = 1, extra = 0;
  explicit doubling(int size) noexcept : n(size) {
    while (p * 2 <= n) p *= 2;
    extra = n - p;
  }
  /// A rank's index among the p, or -1 for a rank that only hands its data over.
  int inner(int rank) const noexcept {
    if (rank < 2 * extra) return rank % 2 == 0 ? -1 : rank / 2;
    return rank - extra;
  }
  int outer(int in) const noexcept { return in < extra ? 2 * in + 1 : in + extra; }
  int rounds() const noexcept {
    int r = 0;
    for (int m = 1; m < p; m *= 2) ++r;
    return r;
  }
};

/// The algorithm, over a wire W; its state lives in the operation. Phases: 0 handed over (a rank
/// outside the p), waiting for the result; 1 taking over a rank's data; 2 the rounds; 3 handing
/// the result back; 5 the copy out.
template <class W>
struct small_allreduce {
  static void start(W& w, operation& o) {
    const int rank = w.rank(), size = w.size();
    const doubling g(size);
    o.summary = collective_summary::of(o.sig, rank);
    // Beyond two ranks every rank tells every other that it has started, before any data: a
    // rank waiting on a partner can then name a peer that never started, and arguments that
    // differ anywhere fail every rank at once. Two ranks learn it from their one exchange.
    o.awaiting.assign(static_cast<std::size_t>(size), size > 2 ? 1 : 0);
    o.awaiting[static_cast<std::size_t>(rank)] = 0;
    if (size > 2) {
      std::vector<int> others;
      for (int p = 0; p < size; ++p)
        if (p != rank) others.push_back(p);
      w.send_notices(o.c, others, o.sig);
    }
    unsigned char* acc = w.out_data(o.bytes);
    if (o.bytes != 0) std::memcpy(acc, o.buf, o.bytes);
    const int in = g.inner(rank);
    if (in < 0) {
      o.phase = 0;
      w.expect(o.c, rank + 1, o.bytes);  // the result comes back from the same rank
      w.send_out(o.c, {rank + 1}, o.sig, o.summary, o.bytes);
    } else if (rank < 2 * g.extra) {
      o.phase = 1;
      w.expect(o.c, rank - 1, o.bytes);
    } else {
      begin_rounds(w, o);
    }
  }

  static void advance(W& w, operation& o) {
    const int rank = w.rank();
    for (;;) {
      take_notices(w, o);
      switch (o.phase) {
        case 0:
          if (!take(w, o, rank + 1, false)) return;
          o.phase = 5;
          break;
        case 1:
          if (!take(w, o, rank - 1, true)) return;
          begin_rounds(w, o);
          break;
        case 2: {
          if (!take(w, o, partner(w, o), true)) return;
          if (++o.round < doubling(w.size()).rounds())
            exchange(w, o);
          else
            end_rounds(w, o);
          break;
        }
        case 3:
          if (!w.out_sent(o.c)) return;
          o.phase = 5;
          break;
        case 5: {
          // Every notice in (none may be left for the next collective) and every send out.
          if (!missing(w, o).empty() || !w.notices_sent(o.c)) return;
          if (!o.summary.agree()) throw transport_error(describe(o.c) + ": " + o.summary.disagreement(o.sig.index));
          const unsigned char* acc = w.out_data(o.bytes);
          if (o.average)
            divide_into(o.buf, acc, o.count, o.type, static_cast<double>(w.size()));
          else if (o.bytes != 0)
            std::memcpy(o.buf, acc, o.bytes);
          o.done = true;
          return;
        }
        default: return;
      }
    }
  }

  /// Whom it waits for: the peers whose notice never came (they never started), else what its
  /// phase waits on. A missing notice first: until it is taken a peer's next message cannot
  /// arrive (a wire with one receive per peer), and that peer may wait for it to leave.
  static waiting awaited(W& w, const operation& o) {
    const std::vector<int> absent = missing(w, o);
    if (!absent.empty())
      return {absent, "they never started this collective", w.native(wire_point::notice_in, absent.front()), true};
    if (const std::vector<int> out = w.out_pending(); !out.empty())
      return {out, "it did not take this collective's message", w.native(wire_point::out, -1), false};
    const int p = partner(w, o);
    if (p >= 0) return {{p}, "in the all-reduce's exchanges", w.native(wire_point::data_in, p), true};
    return {w.notices_pending(), "it did not take this collective's notice", w.native(wire_point::notices_out, -1),
            false};
  }

private:
  static int partner(const W& w, const operation& o) {
    const doubling g(w.size());
    const int rank = w.rank();
    switch (o.phase) {
      case 0: return rank + 1;
      case 1: return rank - 1;
      case 2: return g.outer(g.inner(rank) ^ (1 << o.round));
      case 3: return rank - 1;
      default: return -1;
    }
  }

  static void begin_rounds(W& w, operation& o) {
    o.phase = 2;
    o.round = 0;
    if (doubling(w.size()).rounds() == 0) {
      end_rounds(w, o);
      return;
    }
    exchange(w, o);
  }

  // A round: the partner's message is expected before ours leaves (a wire whose large sends
  // wait for the matching receive would otherwise deadlock two partners that both send first).
  static void exchange(W& w, operation& o) {
    const int p = partner(w, o);
    w.expect(o.c, p, o.bytes);
    w.send_out(o.c, {p}, o.sig, o.summary, o.bytes);
  }

  static void end_rounds(W& w, operation& o) {
    if (w.rank() < 2 * doubling(w.size()).extra) {  // hand the result back to rank - 1
      o.phase = 3;
      w.send_out(o.c, {w.rank() - 1}, o.sig, o.summary, o.bytes);
    } else {
      o.phase = 5;
    }
  }

  static std::vector<int> missing(const W& w, const operation& o) {
    std::vector<int> v;
    for (int p = 0; p < w.size(); ++p)
      if (p != w.rank() && o.awaiting[static_cast<std::size_t>(p)]) v.push_back(p);
    return v;
  }

  /// A message of another collective altogether where this one's was due.
  [[noreturn]] static void refuse(const W& w, const operation& o, int p, const collective_signature& theirs) {
    if (theirs.is(collective_kind::shutdown)) {
      // A partner that left: the likelier cause is a peer that never started, if one is known.
      std::vector<int> absent = missing(w, o);
      absent.erase(std::remove(absent.begin(), absent.end(), p), absent.end());  // it did start: it left
      throw transport_error(describe(o.c) + ": rank " + std::to_string(p) +
                            " destroyed its communicator (it called shutdown) while this rank waited for it" +
                            (absent.empty() ? std::string()
                                            : "; " + rank_list(absent) + " never started this collective"));
    }
    throw transport_error(describe(o.c) + ": " + arguments_differ(o.sig, w.rank(), theirs, p));
  }

  // The notices that have arrived (each peer's comes before any data of it).
  static void take_notices(W& w, operation& o) {
    for (int p = 0; p < w.size(); ++p) {
      if (p == w.rank() || !o.awaiting[static_cast<std::size_t>(p)]) continue;
      coll_message m;
      if (!w.take(o.c, p, coll_stream::notice, o.sig.index, 0, m)) continue;
      if (m.sig != o.sig) refuse(w, o, p, m.sig);
      o.awaiting[static_cast<std::size_t>(p)] = 0;
      w.release(o.c, p, coll_stream::notice);
    }
  }

  // Partner p's message, once our own has left (the accumulator may change then): its summary
  // merged, its data folded in (`reduce`) or taken unless the arguments already differ.
  static bool take(W& w, operation& o, int p, bool reduce) {
    if (!w.out_sent(o.c)) return false;
    if (o.awaiting[static_cast<std::size_t>(p)]) return false;  // its notice comes first
    coll_message m;
    if (!w.take(o.c, p, coll_stream::data, o.sig.index, o.bytes, m)) return false;
    if (m.too_long)
      throw transport_error(describe(o.c) + ": rank " + std::to_string(p) + " sent a longer message in collective #" +
                            std::to_string(o.sig.index) + " than " + o.sig.describe() + " on rank " +
                            std::to_string(w.rank()) + " takes: the ranks' arguments differ");
    const collective_kind k = static_cast<collective_kind>(m.sig.kind);
    if (m.sig.index != o.sig.index || k == collective_kind::construction || k == collective_kind::shutdown ||
        k == collective_kind::broadcast)
      refuse(w, o, p, m.sig);  // not the same collective at all: no summary to read
    o.summary.merge(m.summary);
    if (o.summary.agree() && o.bytes != 0) {
      if (m.bytes != coll_message::unknown && m.bytes != o.bytes)
        throw transport_error(describe(o.c) + ": rank " + std::to_string(p) + " sent " + std::to_string(m.bytes) +
                              " bytes in collective #" + std::to_string(o.sig.index) + " where " +
                              o.sig.describe() + " takes " + std::to_string(o.bytes));
      unsigned char* acc = w.out_data(o.bytes);
      if (reduce)
        reduce_into(acc, m.data, o.count, o.type, o.rop);
      else
        std::memcpy(acc, m.data, o.bytes);
    }
    w.release(o.c, p, coll_stream::data);
    return true;
  }
};

}  // namespace cadence::transport::detail
