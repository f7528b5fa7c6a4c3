// zipline_fast: the library's fastest single-core ZipLine. Trims points that cannot matter,
// radix-sorts the rest on exact integer keys (or, when the timestamps have none, bucket-sorts
// them by their offset from the smallest) and finds the answer with one sliding window.
// Returns exactly zipline_brute_force's answer.
#pragma once

#include <cadence/core/detail/bits.hpp>

#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/workspace.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

namespace cadence {
namespace detail {

/// Sorts one bucket [b, e) of the merged timeline by time. Buckets hold about one point on
/// spread-out data; clustered data falls back to std::sort, so the worst case stays
/// O(N log N).
template <class P>
void zipline_sort_bucket(P* b, P* e) {
  if (e - b <= 24) {
    for (P* i = b + 1; i < e; ++i) {
      const P v = *i;
      P* j = i;
      for (; j > b && v.t < (j - 1)->t; --j) *j = *(j - 1);
      *j = v;
    }
  } else {
    std::sort(b, e, [](const P& x, const P& y) { return x.t < y.t; });
  }
}

/// Upper bound for barriers: every optimal barrier is <= this (see zipline_fast).
template <class T>
T zipline_barrier_cap(T min_back, T spread_bound) {
  if constexpr (std::is_integral_v<T>) {
    T cut;
    if (detail::add_overflows(min_back, spread_bound, &cut)) return std::numeric_limits<T>::max();
    return cut;
  } else {
    // Twice the bound plus a few ulps absorbs every rounding in B - min_back <= spread_bound.
    T cut = static_cast<T>(min_back + static_cast<T>(2) * spread_bound);
    for (int k = 0; k < 4; ++k) cut = std::nextafter(cut, std::numeric_limits<T>::infinity());
    if (!std::isfinite(cut)) return std::numeric_limits<T>::max();
    return cut;
  }
}

/// Exact integer keys for the surviving points, when they exist: key(t) is a 32-bit integer
/// with t = value(key(t)) for every point, so keys order, tie and subtract exactly like the
/// timestamps (spread comparisons on keys equal those on T). Integers: t - base when the
/// range fits in 32 bits. Floating point: t * 2^s - base * 2^s when every point is an
/// integer multiple of 2^-s (s is chosen so keys stay below 2^31 and t * 2^s below 2^digits,
/// which makes every such difference, and every spread, exact); checked per point.
template <class T>
class zipline_exact_keys {
public:
  /// Whether [base, top] admits such keys at all (the per-point check comes on top).
  bool init(T base, T top) noexcept {
    if constexpr (std::is_integral_v<T>) {
      ubase_ = static_cast<std::uint64_t>(base);
      return static_cast<std::uint64_t>(top) - ubase_ <= 0xFFFFFFFFu;
    } else {
      int er = 0, ea = 0;
      (void)std::frexp(top - base, &er);
      (void)std::frexp(std::max(std::abs(base), std::abs(top)), &ea);
      constexpr int dig = (std::numeric_limits<T>::digits < 63 ? std::numeric_limits<T>::digits : 63) - 1;
      s_ = std::min(31 - er, dig - ea);
      if (s_ >= std::numeric_limits<T>::max_exponent - 1 ||
          s_ <= std::numeric_limits<T>::min_exponent)
        return false;
      // t * 2^s is exact unless it underflows: never for s >= 0; for s < 0, points of one
      // sign whose extremes scale to nonzero integers are all at least 1 in magnitude.
      if (s_ < 0 && !(base > T(0) || top < T(0))) return false;
      scale_ = std::ldexp(T(1), s_);
      unsigned bad = 0;
      ibase_ = scaled(base, bad);
      const std::int64_t itop = scaled(top, bad);
      if (s_ < 0) bad |= static_cast<unsigned>(ibase_ == 0 || itop == 0);
      return bad == 0;
    }
  }
  /// key(t) for base <= t <= top; sets bits of bad when t is not exactly representable.
  std::uint32_t key(T t, unsigned& bad) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      (void)bad;
      return static_cast<std::uint32_t>(static_cast<std::uint64_t>(t) - ubase_);
    } else {
      return static_cast<std::uint32_t>(scaled(t, bad) - ibase_);
    }
  }
  T value(std::uint32_t k) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(ubase_ + k);
    } else {
      return std::ldexp(static_cast<T>(ibase_ + static_cast<std::int64_t>(k)), -s_);
    }
  }

private:
  // t * 2^s as an integer (the product is exact, see init); sets bad if it is not one.
  std::int64_t scaled(T t, unsigned& bad) const noexcept {
    const T y = t * scale_;
    const auto i = static_cast<std::int64_t>(y);
    bad |= static_cast<unsigned>(static_cast<T>(i) != y);
    return i;
  }
  [[maybe_unused]] std::uint64_t ubase_ = 0;
  [[maybe_unused]] std::int64_t ibase_ = 0;
  [[maybe_unused]] T scale_{};
  [[maybe_unused]] int s_ = 0;
};

/// Radix digits for keys whose varying bits are bits [tz, tz + bits): one to three passes of
/// at most 11 bits (histograms stay in L1).
struct zipline_radix_plan {
  unsigned tz = 0, bits = 0, passes = 0, dbits = 0;
  explicit zipline_radix_plan(std::uint32_t orbits) noexcept {
    if (orbits == 0) return;
    tz = detail::countr_zero(orbits);
    bits = 32u - detail::countl_zero(orbits) - tz;
    passes = (bits + 10) / 11;
    dbits = (bits + passes - 1) / passes;
  }
};

/// Writes the record ((key >> tz) << rowbits | row) of every surviving point to rec, ORs the
/// keys into orbits and counts the P radix digits (dbits each) of key >> tz.
template <unsigned P, class Rec, class T>
void zipline_key_pass(rows_view<T> rows, const std::size_t* first, const std::size_t* last,
                      const zipline_exact_keys<T>& keys, const zipline_radix_plan& plan,
                      unsigned rowbits, Rec* rec, std::uint32_t* cnt, unsigned& bad,
                      std::uint32_t& orbits) {
  const unsigned tz = plan.tz, dbits = plan.dbits;
  const std::uint32_t mask = (std::uint32_t{1} << dbits) - 1;
  const std::size_t radix = std::size_t{1} << dbits;
  [[maybe_unused]] std::uint32_t* const c1 = cnt + radix;
  [[maybe_unused]] std::uint32_t* const c2 = cnt + 2 * radix;
  unsigned b = 0;
  std::uint32_t o = 0;
  for (std::size_t p = 0, n = rows.size(); p < n; ++p) {
    const T* const v = rows.values() + rows.row_begin(p);
    const Rec row = static_cast<Rec>(p);
    for (std::size_t i = first[p], e = last[p]; i < e; ++i) {
      const std::uint32_t k = keys.key(v[i], b);
      o |= k;
      const std::uint32_t d = k >> tz;
      *rec++ = static_cast<Rec>(static_cast<Rec>(d) << rowbits) | row;
      if constexpr (P > 0) ++cnt[d & mask];
      if constexpr (P > 1) ++c1[(d >> dbits) & mask];
      if constexpr (P > 2) ++c2[(d >> (2 * dbits)) & mask];
    }
  }
  bad |= b;
  orbits |= o;
}

/// LSD radix sort of the records on their key bits (histograms already counted), then the
/// sliding window (see zipline_fast) on integer keys, whose differences order exactly as the
/// spreads in T do. Writes the best window's compact keys.
template <class Rec>
void zipline_sort_sweep(Rec* rec, Rec* tmp, std::size_t total, std::size_t n,
                        const zipline_radix_plan& plan, unsigned rowbits, std::uint32_t* cnt,
                        std::uint32_t* cc, std::uint32_t& best_hi, std::uint32_t& best_lo) {
  const std::size_t radix = std::size_t{1} << plan.dbits;
  const Rec mask = static_cast<Rec>(radix - 1);
  for (unsigned q = 0; q < plan.passes; ++q) {
    std::uint32_t* const c = cnt + q * radix;
    std::uint32_t sum = 0;
    bool constant = false;
    for (std::size_t b = 0; b < radix; ++b) {
      const std::uint32_t x = c[b];
      constant |= x == total;
      c[b] = sum;
      sum += x;
    }
    if (constant) continue;  // every key has the same digit here
    const unsigned sh = rowbits + q * plan.dbits;
    for (std::size_t j = 0; j < total; ++j) {
      const Rec r = rec[j];
      tmp[c[(r >> sh) & mask]++] = r;
    }
    std::swap(rec, tmp);
  }

  const Rec rmask = static_cast<Rec>((Rec{1} << rowbits) - 1);
  const auto row = [&](std::size_t j) { return static_cast<std::size_t>(rec[j] & rmask); };
  const auto key = [&](std::size_t j) { return static_cast<std::uint32_t>(rec[j] >> rowbits); };
  std::size_t covered = 0, left = 0, i = 0;
  for (; covered < n; ++i) {  // until every row has appeared (total >= n points)
    if (cc[row(i)]++ == 0) ++covered;
    while (cc[row(left)] > 1) {
      --cc[row(left)];
      ++left;
    }
  }
  std::uint32_t hi_best = key(i - 1), lo_best = key(left);
  std::uint32_t best = hi_best - lo_best;
  // From here cc[row(left)] == 1 between steps, so the left end moves only when the new
  // point is of its row; and only then can the spread shrink (the right end never moves
  // back), so only then is it compared.
  std::size_t lrow = row(left);
  for (; i < total; ++i) {
    const std::size_t r = row(i);
    ++cc[r];
    if (r != lrow) continue;
    do {
      --cc[lrow];
      ++left;
      lrow = row(left);
    } while (cc[lrow] > 1);
    const std::uint32_t hi = key(i), lo = key(left);
    // Keys never decrease along the pass, so the first minimum has the smallest barrier.
    if (hi - lo < best) {
      best = hi - lo;
      hi_best = hi;
      lo_best = lo;
    }
  }
  best_hi = hi_best;
  best_lo = lo_best;
}

/// zipline_fast on exact keys: records (key << rowbits | row) in 32 bits when they fit
/// (64 otherwise), an LSD radix sort on the key bits that vary (one to three passes of <= 11
/// bits, counted while the records are written) and an integer sliding window. Returns
/// false, having written nothing to the result, when the points have no exact keys.
template <class T>
bool zipline_fast_exact(rows_view<T> rows, zipline_workspace<T>& ws, std::size_t total, T base,
                        T top, T& spread, T& barrier) {
  zipline_exact_keys<T> keys;
  if (!keys.init(base, top)) return false;
  const std::size_t n = rows.size();
  const std::size_t* const first = ws.first().data();
  const std::size_t* const last = ws.last().data();
  const unsigned rowbits32 = 64u - detail::countl_zero(std::uint64_t{n - 1});

  // The radix digits skip the low zero bits common to every key (a coarse grid such as whole
  // milliseconds, scaled up). Guess them from each row's first point and the largest (whose
  // key has the top bit), count the digits while writing the records, and redo the pass in
  // the rare case the guess was wrong.
  unsigned bad = 0;
  std::uint32_t guess = keys.key(top, bad);
  for (std::size_t p = 0; p < n; ++p)
    guess |= keys.key(rows.values()[rows.row_begin(p) + first[p]], bad);
  if (bad != 0) return false;
  auto& cntv = ws.buckets();
  auto& count = ws.counts();
  for (;;) {
    const zipline_radix_plan plan(guess);
    cntv.assign(3 * 2048, 0);
    std::uint32_t* const cnt = cntv.data();
    std::uint32_t orbits = 0;
    std::uint32_t best_hi = 0, best_lo = 0;
    const auto run = [&](auto* rec, auto* tmp, unsigned rowbits) {
      const auto pass = [&](auto p_) {
        zipline_key_pass<decltype(p_)::value>(rows, first, last, keys, plan, rowbits, rec, cnt,
                                              bad, orbits);
      };
      switch (plan.passes) {
        case 0: pass(std::integral_constant<unsigned, 0>{}); break;
        case 1: pass(std::integral_constant<unsigned, 1>{}); break;
        case 2: pass(std::integral_constant<unsigned, 2>{}); break;
        default: pass(std::integral_constant<unsigned, 3>{}); break;
      }
      if (bad != 0 || zipline_radix_plan(orbits).tz != plan.tz)
        return false;
      count.assign(n, 0);
      zipline_sort_sweep(rec, tmp, total, n, plan, rowbits, cnt, count.data(), best_hi, best_lo);
      return true;
    };
    bool done;
    if (rowbits32 < 32 && plan.bits + rowbits32 <= 32) {
      ws.keys32().resize(total);
      ws.keys32_tmp().resize(total);
      done = run(ws.keys32().data(), ws.keys32_tmp().data(), rowbits32);
    } else {
      ws.keys().resize(total);
      ws.keys_tmp().resize(total);
      done = run(ws.keys().data(), ws.keys_tmp().data(), 32u);
    }
    if (bad != 0) return false;
    if (done) {
      barrier = keys.value(best_hi << plan.tz);
      spread = zipline_spread(barrier, keys.value(best_lo << plan.tz));
      return true;
    }
    guess = orbits;  // the true common zero bits: the next pass is final
  }
}

}  // namespace detail

/// The fastest single-core ZipLine: O(N) time when the timestamps have exact keys (below) or
/// are spread out, O(N log N) worst case on clustered ones; O(N) workspace memory.
///
/// 0. Validation: one branch-free pass (strictly increasing rows with finite ends are
///    finite); only if it finds a problem does validate() run, for its exact message.
/// 1. Trim: with L = max_p first(p) no window exists before L, so each row keeps only its
///    latest point <= L onward; d(L) bounds the optimal spread, and since
///    d(B) >= B - min_p last(p), no barrier beyond min_p last(p) + d(L) can be optimal.
/// 2. Exact keys, when every surviving point has one (integers whose range fits in 32 bits;
///    floating point on a power-of-two grid, e.g. whole milliseconds, which is checked per
///    point): records (key << row_bits | row), 32 bits when they fit, written with their
///    radix-digit histograms in one pass; an LSD radix sort of 1-3 passes over only the key
///    bits that vary; the sliding window on integer keys (key differences order exactly as
///    the spreads in T do), where the left end can move, and the spread shrink, only when
///    the new point is of the left end's row.
/// 3. Otherwise a two-level bucket sort of the surviving points by their offset from the
///    smallest (integers: a shift; floating point: a scale): a scatter into a few hundred
///    coarse buckets, then, per coarse bucket and inside L1, a counting sort on the fine key
///    and an insertion pass (fine buckets hold 0-2 points on typical data), and the sliding
///    window over each coarse bucket right after it is sorted.
/// The sliding window: per-row counts in the window; the left end advances while its row
/// has a later point inside; a window covering every row and ending at B has spread
/// B - left, which equals d(B) once all points equal to B are in (earlier positions with
/// the same time only overestimate).
/// Pick it whenever you just want the answer; it is what zipline_solve's default runs.
template <class T>
void zipline_fast(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  using point = typename zipline_workspace<T>::point;
  if (!detail::zipline_rows_valid(rows)) validate(rows);  // throws the exact error
  detail::zipline_check_sizes(rows, "zipline_fast");
  const std::size_t n = rows.size();
  if (n == 1) {
    // Every point is a window of spread 0; the smallest barrier is the first point.
    detail::zipline_finish(rows, T{}, rows[0][0], out);
    return;
  }

  // 1. Trim.
  T max_front = rows[0].front(), min_back = rows[0].back();
  for (std::size_t p = 1; p < n; ++p) {
    const auto row = rows[p];
    if (row.front() > max_front) max_front = row.front();
    if (row.back() < min_back) min_back = row.back();
  }
  auto& first = ws.first();
  auto& last = ws.last();
  first.resize(n);
  last.resize(n);
  T base = max_front;
  for (std::size_t p = 0; p < n; ++p) {
    const auto row = rows[p];
    const std::size_t f = detail::zipline_upper_bound(row.data(), row.size(), max_front) - 1;
    first[p] = f;
    if (row[f] < base) base = row[f];
  }
  const T cut = detail::zipline_barrier_cap(min_back, detail::zipline_spread(max_front, base));
  std::size_t total = 0;
  T top = base;
  for (std::size_t p = 0; p < n; ++p) {
    const auto row = rows[p];
    const std::size_t e =
        first[p] + detail::zipline_upper_bound(row.data() + first[p], row.size() - first[p], cut);
    last[p] = e;
    total += e - first[p];
    if (row[e - 1] > top) top = row[e - 1];
  }

  {
    T spread{}, barrier{};
    if (detail::zipline_fast_exact(rows, ws, total, base, top, spread, barrier)) {
      detail::zipline_finish(rows, spread, barrier, out);
      return;
    }
  }

  // 2. + 3. Two-level bucket sort fused with the sliding window. Fine keys key(t) are
  //    monotone in t (offset from base, shifted or scaled so there are about two fine
  //    buckets per point); coarse keys are key >> fine_bits. One pass scatters points into
  //    coarse buckets (a few hundred sequential write streams, cache friendly); each coarse
  //    bucket is then counting-sorted on its fine keys inside L1, fixed up by insertion,
  //    and immediately swept while it is still in cache.
  constexpr unsigned fine_bits = 9;
  constexpr std::size_t fine_per_coarse = std::size_t{1} << fine_bits;
  std::size_t nb;
  const std::size_t target = 2 * total;
  [[maybe_unused]] unsigned shift = 0;
  [[maybe_unused]] double scale = 0;
  if constexpr (std::is_integral_v<T>) {
    const std::uint64_t range = static_cast<std::uint64_t>(top) - static_cast<std::uint64_t>(base);
    while ((range >> shift) >= target) ++shift;
    nb = static_cast<std::size_t>(range >> shift) + 1;
  } else {
    const double range = static_cast<double>(top - base);
    nb = target;
    scale = range > 0 ? static_cast<double>(nb) / range : 0.0;
  }
  const auto key = [&](T t) -> std::size_t {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<std::size_t>(
          (static_cast<std::uint64_t>(t) - static_cast<std::uint64_t>(base)) >> shift);
    } else {
      const double x = static_cast<double>(t - base) * scale;
      return x < static_cast<double>(nb - 1) ? static_cast<std::size_t>(x) : nb - 1;
    }
  };
  const std::size_t nc = (nb >> fine_bits) + 1;
  auto& cnt = ws.buckets();
  cnt.assign(nc + 1 + fine_per_coarse + 1, 0);
  std::uint32_t* const coarse = cnt.data();
  std::uint32_t* const fine = cnt.data() + nc + 1;

  // Row by row: reads are sequential, and with a few hundred coarse buckets every write
  // stream's head stays in L1.
  for (std::size_t p = 0; p < n; ++p) {
    const T* const v = rows[p].data();
    for (std::size_t i = first[p], e = last[p]; i < e; ++i) ++coarse[key(v[i]) >> fine_bits];
  }
  {
    std::uint32_t sum = 0;
    for (std::size_t c = 0; c < nc; ++c) {
      const std::uint32_t v = coarse[c];
      coarse[c] = sum;
      sum += v;
    }
    coarse[nc] = sum;
  }
  auto& stage = ws.staging();
  auto& pts = ws.points();
  stage.resize(total);
  pts.resize(total);
  point* const staged = stage.data();
  point* const data = pts.data();
  for (std::size_t p = 0; p < n; ++p) {
    const T* const v = rows[p].data();
    for (std::size_t i = first[p], e = last[p]; i < e; ++i) {
      const std::size_t k = key(v[i]);
      staged[coarse[k >> fine_bits]++] =
          point{v[i], static_cast<std::uint32_t>(p),
                static_cast<std::uint32_t>(k & (fine_per_coarse - 1))};
    }
  }
  // coarse[c] is now the end of bucket c, i.e. the start of bucket c + 1.

  auto& count = ws.counts();
  count.assign(n, 0);
  std::uint32_t* const cc = count.data();
  std::size_t covered = 0, left = 0;
  bool found = false;
  T best{}, best_b{};
  std::size_t cb = 0;
  for (std::size_t c = 0; c < nc; ++c) {
    const std::size_t ce = coarse[c];
    if (ce == cb) continue;
    // Counting sort of staged[cb, ce) on the low fine_bits of the key into data[cb, ce).
    std::fill(fine, fine + fine_per_coarse + 1, 0u);
    std::uint32_t widest = 0;
    for (std::size_t i = cb; i < ce; ++i) widest = std::max(widest, ++fine[staged[i].key + 1]);
    for (std::size_t b = 1; b <= fine_per_coarse; ++b) fine[b] += fine[b - 1];
    point* const out_b = data + cb;
    for (std::size_t i = cb; i < ce; ++i)
      out_b[fine[staged[i].key]++] = staged[i];
    if (widest <= 32) {
      // Few points per fine bucket: one insertion pass, with a predictable branch.
      for (std::size_t i = cb + 1; i < ce; ++i) {
        if (data[i].t < data[i - 1].t) {
          const point v = data[i];
          std::size_t j = i;
          for (; j > cb && v.t < data[j - 1].t; --j) data[j] = data[j - 1];
          data[j] = v;
        }
      }
    } else {
      // Clustered input: sort each fine bucket on its own (std::sort when large).
      // fine[b] is now the end of fine bucket b.
      std::size_t fb = 0;
      for (std::size_t b = 0; b < fine_per_coarse; ++b) {
        const std::size_t fe = fine[b];
        if (fe - fb > 1) detail::zipline_sort_bucket(out_b + fb, out_b + fe);
        fb = fe;
      }
    }
    // Sliding window over the freshly sorted points.
    std::size_t i = cb;
    for (; i < ce && !found; ++i) {  // until every row has appeared
      if (cc[data[i].row]++ == 0) ++covered;
      while (cc[data[left].row] > 1) {
        --cc[data[left].row];
        ++left;
      }
      if (covered == n) {
        best = detail::zipline_spread(data[i].t, data[left].t);
        best_b = data[i].t;
        found = true;
      }
    }
    for (; i < ce; ++i) {
      ++cc[data[i].row];
      while (cc[data[left].row] > 1) {
        --cc[data[left].row];
        ++left;
      }
      const T d = detail::zipline_spread(data[i].t, data[left].t);
      // Times never decrease along the pass, so the first minimum has the smallest barrier.
      if (d < best) {
        best = d;
        best_b = data[i].t;
      }
    }
    cb = ce;
  }
  detail::zipline_finish(rows, best, best_b, out);
}

/// Convenience overload: allocates a workspace and a result.
template <class T>
zipline_result<T> zipline_fast(rows_view<T> rows) {
  return detail::solve_with_fresh_workspace<T>(rows, zipline_fast<T>);
}

}  // namespace cadence
