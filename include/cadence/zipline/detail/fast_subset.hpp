// zipline_fast's outer step: search only the rows that can decide the answer. When every row
// left out has a point inside the subset's optimal window, the subset's answer is the
// input's; one search per row left out checks it.
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

/// Whether every row outside the subset (buf.first[p] == buf.last[p]; its trimmed range in
/// full_first/full_last) has a point in the window [B - d, B] of the subset's answer w, i.e.
/// B - pred_p(B) <= d in T. Rows that do not are added to the subset (their ranges restored)
/// and counted in `added`.
template <class T>
bool zipline_subset_covers(rows_view<T> rows, zipline_buffers<T>& buf,
                           const std::size_t* full_first, const std::size_t* full_last,
                           zipline_window<T> w, std::size_t& added) {
  const std::size_t n = rows.size();
  std::size_t* const first = buf.first.data();
  std::size_t* const last = buf.last.data();
  added = 0;
  for (std::size_t p = 0; p < n; ++p) {
    if (first[p] != last[p]) continue;  // in the subset (trimmed ranges are never empty)
    const std::size_t f = full_first[p], e = full_last[p];
    const T* const v = rows.row_data(p) + f;
    // v[0] <= L <= B (every barrier of the subset is >= L), so j >= 1.
    const std::size_t j = zipline_upper_bound_interpolated(v, e - f, w.barrier);
    if (zipline_spread(w.barrier, v[j - 1]) > w.spread) {
      first[p] = f;
      last[p] = e;
      ++added;
    }
  }
  return added == 0;
}

/// The trimmed totals of the rows in buf.first/buf.last's non-empty ranges.
template <class T>
zipline_trimmed<T> zipline_subset_totals(rows_view<T> rows, const zipline_buffers<T>& buf,
                                         const zipline_trimmed<T>& trim) {
  std::size_t total = 0, in = 0;
  T base{}, top{};
  for (std::size_t p = 0, n = rows.size(); p < n; ++p) {
    const std::size_t f = buf.first[p], e = buf.last[p];
    if (f == e) continue;
    const T* const v = rows.row_data(p);
    if (in == 0 || v[f] < base) base = v[f];
    if (in == 0 || v[e - 1] > top) top = v[e - 1];
    ++in;
    total += e - f;
  }
  return {total, base, top, in, trim.cut, trim.front_row};
}

/// The optimal window over the trimmed rows, sweeping a subset of them when it provably gives
/// the same answer. Let d(B) = B - min_p pred_p(B) over barriers B >= L, and d_S the same over
/// a subset S that holds the row defining L (so its barriers are >= L); d_S <= d everywhere
/// (T's subtraction is monotone, so this holds for rounded spreads too). Let (d_S*, B_S*) be
/// S's optimum with the smallest barrier. If every row outside S has a point in
/// [B_S* - d_S*, B_S*] (checked as B_S* - pred_p(B_S*) <= d_S* in T, one interpolated search
/// per row), then d(B_S*) = d_S*, so d_S* is the optimal spread; and a barrier B < B_S* with
/// d(B) = d_S* would make S's latest barrier B' <= B (same minimum over S) have
/// d_S(B') <= d(B) = d_S*, an optimum of S before B_S*, which cannot be. So S's answer is the
/// input's, exactly.
/// Round 1 takes about n/32 + 192 rows with the largest gap G_p (buf.gaps, from validation):
/// rows whose gaps are all at most d_S* always have a point in the window, so the large-gap
/// rows are the ones that can fail. If one fails, round 2 takes every row with G_p > d_S* and
/// every row whose trimmed range reaches its last point: a superset whose rows left out each
/// have a point within G_p <= d_S* before any barrier (the gap that follows it ends beyond
/// the cut), so it needs no check (the bound the previous version checked round 1 against,
/// every left-out G_p <= d_S*, which failed at n = 1000 on the generator's data).
/// On the generator's timestamps (rows step at different rates) round 1 passes: at n = 1000
/// it sweeps 22% of the rows where the G_p bound needed 20% and then 33%. Further rounds
/// adding only the failing rows were tried: the optimum of each subset moved to where another
/// left-out row had a hole, and on rows with irregular gaps they cost more than they saved.
template <class T>
zipline_window<T> zipline_fast_search(rows_view<T> rows, zipline_buffers<T>& buf,
                                      const zipline_trimmed<T>& trim) {
  const std::size_t n = rows.size();
  const std::size_t want = n / 32 + 192;
  buf.subset_rounds = 0;
  if (n < 256 || want >= n) return zipline_fast_sweep(rows, buf, trim);
  const T* const gaps = buf.gaps.data();
  std::vector<std::size_t>& first = buf.first;
  std::vector<std::size_t>& last = buf.last;
  auto& full_first = buf.aux;
  auto& full_last = buf.full_last;
  full_first.assign(first.begin(), first.end());
  full_last.assign(last.begin(), last.end());
  // Round 1: the rows whose gap exceeds the (want + 1)-th largest, and the row defining L.
  auto& pick = buf.zt;
  pick.assign(gaps, gaps + n);
  std::nth_element(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(want), pick.end(),
                   [](T a, T b) { return a > b; });
  const T theta = pick[want];
  for (std::size_t p = 0; p < n; ++p)
    if (!(gaps[p] > theta) && p != trim.front_row) last[p] = first[p];
  for (int round = 1;; ++round) {
    const zipline_window<T> w = zipline_fast_sweep(rows, buf, zipline_subset_totals(rows, buf, trim));
    buf.subset_rounds = round;
    std::size_t added = 0;
    if (round == 2 || zipline_subset_covers(rows, buf, full_first.data(), full_last.data(), w, added))
      return w;  // round 2 is certified by construction (see above)
    for (std::size_t p = 0; p < n; ++p)
      if (gaps[p] > w.spread || full_last[p] == rows.row_size(p)) {
        first[p] = full_first[p];
        last[p] = full_last[p];
      }
  }
}

}  // namespace cadence::detail
