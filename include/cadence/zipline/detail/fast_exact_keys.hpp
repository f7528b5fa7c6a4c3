// zipline_fast's path for timestamps with exact 32-bit integer keys (integers in a 32-bit
// range, floating point on a power-of-two grid): packed records, an LSD radix sort on the key
// bits that vary, and the sliding window on integer keys.
#pragma once

#include <cadence/core/detail/bits.hpp>

#include <cadence/zipline/detail/buffers.hpp>
#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/detail/fast_trim.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

namespace cadence::detail {

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

/// Writes the record ((key >> tz) << rowbits | row) of every point of the trimmed rows to rec,
/// ORs the keys into orbits and counts the P radix digits (dbits each) of key >> tz.
template <unsigned P, class Rec, class T>
void zipline_key_pass(rows_view<T> rows, const zipline_exact_keys<T>& keys,
                      const zipline_radix_plan& plan, unsigned rowbits, Rec* rec,
                      std::uint32_t* cnt, unsigned& bad, std::uint32_t& orbits) {
  const unsigned tz = plan.tz, dbits = plan.dbits;
  const std::uint32_t mask = (std::uint32_t{1} << dbits) - 1;
  const std::size_t radix = std::size_t{1} << dbits;
  [[maybe_unused]] std::uint32_t* const c1 = cnt + radix;
  [[maybe_unused]] std::uint32_t* const c2 = cnt + 2 * radix;
  unsigned b = 0;
  std::uint32_t o = 0;
  for (std::size_t p = 0, n = rows.size(); p < n; ++p) {
    const T* const v = rows.row_data(p);
    const Rec row = static_cast<Rec>(p);
    for (std::size_t i = 0, e = rows.row_size(p); i < e; ++i) {
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
/// spreads in T do; cc is a zeroed count per row of the input (n rows; the window must cover
/// every row that has points). Writes the best window's compact keys.
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
  // The window ending at position i starts at left(i), the earliest point still the latest of
  // its row. With die[j] the position of the next point of j's row (never: 2^32 - 1),
  // left(i) = min{j : die[j] > i}, so j is the left end exactly for i in
  // [max(M_j, j, cover), max(M_j, die[j])), M_j = max(die[0..j-1]), cover the first position
  // where every row has appeared. Keys never decrease, so j's best window ends at the first
  // i of that range: one candidate per point, each computed without a branch on the data
  // (the sweep that moved the left end point by point mispredicted at about a quarter of the
  // points, at every change of the left end's row). The first minimum in j order has the
  // smallest i, hence the smallest barrier.
  Rec* const die = tmp;  // the radix sort's spare buffer
  for (std::size_t j = total; j-- > 0;) {
    const std::size_t r = row(j);
    die[j] = static_cast<Rec>(static_cast<std::uint32_t>(cc[r] - 1u));  // 0 - 1: never
    cc[r] = static_cast<std::uint32_t>(j + 1);
  }
  std::uint32_t cover = 0;  // the latest first appearance, + 1 (rows without points hold 0)
  for (std::size_t r = 0; r < n; ++r) cover = cc[r] > cover ? cc[r] : cover;
  cover -= 1;
  // Spreads in 64 bits: 2^32 - 1 is a real spread (keys may use all 32 bits), 2^32 is none.
  constexpr std::uint64_t none = std::uint64_t{1} << 32;
  std::uint64_t best = none;
  std::uint32_t hi_best = 0, lo_best = 0, m = 0;
  for (std::size_t j = 0; j < total; ++j) {
    const auto dj = static_cast<std::uint32_t>(die[j]);
    const std::uint32_t jj = static_cast<std::uint32_t>(j);
    std::uint32_t at = m > jj ? m : jj;
    at = at > cover ? at : cover;
    m = dj > m ? dj : m;
    const bool valid = at < m;
    const std::uint32_t lo = key(j), hi = key(valid ? at : jj);
    const std::uint64_t spread = valid ? std::uint64_t{hi - lo} : none;
    if (spread < best) {
      best = spread;
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
/// nothing when the points have no exact keys.
template <class T>
std::optional<zipline_window<T>> zipline_fast_exact(rows_view<T> rows, zipline_buffers<T>& buf,
                                                    const zipline_extent<T>& extent) {
  zipline_exact_keys<T> keys;
  if (!keys.init(extent.base, extent.top)) return std::nullopt;
  const std::size_t n = rows.size();
  const std::size_t total = rows.total();
  // Bits for a row index; none for a single row (a subset may hold only the row defining L).
  const unsigned rowbits32 = n > 1 ? 64u - detail::countl_zero(std::uint64_t{n - 1}) : 0u;

  // The radix digits skip the low zero bits common to every key (a coarse grid such as whole
  // milliseconds, scaled up). Guess them from each row's first point and the largest (whose
  // key has the top bit), count the digits while writing the records, and redo the pass in
  // the rare case the guess was wrong.
  unsigned bad = 0;
  std::uint32_t guess = keys.key(extent.top, bad);
  for (std::size_t p = 0; p < n; ++p) guess |= keys.key(rows.row_data(p)[0], bad);
  if (bad != 0) return std::nullopt;
  auto& cntv = buf.buckets;
  auto& count = buf.counts;
  for (;;) {
    const zipline_radix_plan plan(guess);
    cntv.assign(3 * 2048, 0);
    std::uint32_t* const cnt = cntv.data();
    std::uint32_t orbits = 0;
    std::uint32_t best_hi = 0, best_lo = 0;
    const auto run = [&](auto* rec, auto* tmp, unsigned rowbits) {
      const auto pass = [&](auto p_) {
        zipline_key_pass<decltype(p_)::value>(rows, keys, plan, rowbits, rec, cnt, bad, orbits);
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
      buf.keys32.resize(total);
      buf.keys32_tmp.resize(total);
      done = run(buf.keys32.data(), buf.keys32_tmp.data(), rowbits32);
    } else {
      buf.keys.resize(total);
      buf.keys_tmp.resize(total);
      done = run(buf.keys.data(), buf.keys_tmp.data(), 32u);
    }
    if (bad != 0) return std::nullopt;
    if (done) {
      const T barrier = keys.value(best_hi << plan.tz);
      return zipline_window<T>{zipline_spread(barrier, keys.value(best_lo << plan.tz)), barrier};
    }
    guess = orbits;  // the true common zero bits: the next pass is final
  }
}

}  // namespace cadence::detail
