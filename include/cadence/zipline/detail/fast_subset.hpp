// zipline_fast's outer step: search only the rows that can decide the answer. A row whose
// every gap is at most the optimal spread of the others cannot change the optimum, so a
// sweep over a subset of rows, checked against the largest gap left out, is exact.
#pragma once

#include <cadence/zipline/detail/buffers.hpp>
#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/detail/fast_buckets.hpp>
#include <cadence/zipline/detail/fast_exact_keys.hpp>
#include <cadence/zipline/detail/fast_trim.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace cadence::detail {

/// Sorts the points in buf.first/buf.last's ranges (exact keys, else buckets) and sweeps them.
template <class T>
zipline_window<T> zipline_fast_sweep(rows_view<T> rows, zipline_buffers<T>& buf,
                                     const zipline_trimmed<T>& trim) {
  const auto exact = zipline_fast_exact(rows, buf, trim);
  return exact ? *exact : zipline_fast_buckets(rows, buf, trim);
}

/// The optimal window over the trimmed rows, sweeping a subset of them when it provably gives
/// the same answer. With d(B) = B - min_p pred_p(B) over barriers B in [L, cut], each row's
/// age a_p(B) = B - pred_p(B) is below the gap after pred_p(B), so at most G_p, the row's
/// largest gap (buf.gaps, from validation); a row whose trimmed range reaches its last point
/// has no gap after it and is always searched. For a subset S (always holding the row that
/// defines L, so its barriers are >= L) with d_S <= d and G_out = max over the other rows of
/// G_p: if min d_S >= G_out, then d(B) = d_S(B) for every B, and the sweep over S returns the
/// whole input's spread and smallest barrier exactly (T's subtraction is monotone, so this
/// holds for rounded spreads too). Round 1 takes about n/32 + 128 rows with the largest G_p;
/// if min d_S falls short of G_out, round 2 takes every row with G_p > min d_S, a superset
/// whose own minimum can only be larger, so it always passes. On timestamps whose rows step
/// at different rates (the generator's, most real clusters), few rows have gaps near the
/// optimal spread and the sweep reads a few percent of the points at n = 10^5.
template <class T>
zipline_window<T> zipline_fast_search(rows_view<T> rows, zipline_buffers<T>& buf,
                                      const zipline_trimmed<T>& trim) {
  const std::size_t n = rows.size();
  const std::size_t want = n / 32 + 128;
  if (n < 256 || want >= n) return zipline_fast_sweep(rows, buf, trim);
  const T* const gaps = buf.gaps.data();
  std::vector<std::size_t>& first = buf.first;
  std::vector<std::size_t>& last = buf.last;
  auto& full_first = buf.aux;
  auto& full_last = buf.full_last;
  full_first.assign(first.begin(), first.end());
  full_last.assign(last.begin(), last.end());
  const auto forced = [&](std::size_t p) {
    return p == trim.front_row || full_last[p] == rows.row_size(p);
  };
  // Round 1's threshold: the (want + 1)-th largest gap, so that about `want` rows are in.
  auto& pick = buf.zt;
  pick.assign(gaps, gaps + n);
  std::nth_element(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(want), pick.end(),
                   [](T a, T b) { return a > b; });
  T theta = pick[want];
  for (int round = 0; round < 2; ++round) {
    std::size_t total = 0, in = 0;
    bool out = false;
    T g_out{}, base{}, top{};
    for (std::size_t p = 0; p < n; ++p) {
      const std::size_t f = full_first[p], e = full_last[p];
      if (gaps[p] > theta || forced(p)) {
        const T* const v = rows.row_data(p);
        if (in == 0 || v[f] < base) base = v[f];
        if (in == 0 || v[e - 1] > top) top = v[e - 1];
        ++in;
        total += e - f;
        first[p] = f;
        last[p] = e;
      } else {
        if (!out || gaps[p] > g_out) g_out = gaps[p];
        out = true;
        first[p] = last[p] = f;
      }
    }
    if (!out) break;  // every row is in: the plain sweep below
    const zipline_trimmed<T> sub{total, base, top, in, trim.cut, trim.front_row};
    const zipline_window<T> w = zipline_fast_sweep(rows, buf, sub);
    if (!(w.spread < g_out)) return w;  // certified: the rows left out cannot matter
    theta = w.spread;                   // round 2 takes every row with G_p > min d_S
  }
  first.assign(full_first.begin(), full_first.end());
  last.assign(full_last.begin(), full_last.end());
  return zipline_fast_sweep(rows, buf, trim);
}

}  // namespace cadence::detail
