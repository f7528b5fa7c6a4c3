// zipline_fast: the library's fastest single-core ZipLine. Trims points that cannot matter,
// bucket-sorts the rest by their offset from the smallest and finds the answer in one
// sliding-window pass. Returns exactly zipline_brute_force's answer.
#pragma once

#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/workspace.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

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
    if (__builtin_add_overflow(min_back, spread_bound, &cut)) return std::numeric_limits<T>::max();
    return cut;
  } else {
    // Twice the bound plus a few ulps absorbs every rounding in B - min_back <= spread_bound.
    T cut = static_cast<T>(min_back + static_cast<T>(2) * spread_bound);
    for (int k = 0; k < 4; ++k) cut = std::nextafter(cut, std::numeric_limits<T>::infinity());
    if (!std::isfinite(cut)) return std::numeric_limits<T>::max();
    return cut;
  }
}

}  // namespace detail

/// The fastest single-core ZipLine (O(N + sort of the surviving points), O(N) memory).
///
/// 1. Trim: with L = max_p first(p) no window exists before L, so each row keeps only its
///    latest point <= L onward; d(L) bounds the optimal spread, and since
///    d(B) >= B - min_p last(p), no barrier beyond min_p last(p) + d(L) can be optimal.
/// 2. Bucket sort the surviving points by their offset from the smallest (integers: a shift;
///    floating point: a scale), then sort inside buckets (typically 0-2 points).
/// 3. One sliding-window pass: per-row counts in the window; the left end advances while its
///    row has a later point inside; a window covering every row ending at B has spread
///    B - left, which equals d(B) once all points equal to B are in.
/// Pick it whenever you just want the answer; it is what zipline_solve's default runs.
template <class T>
void zipline_fast(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  using point = typename zipline_workspace<T>::point;
  validate(rows);
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
    const auto f = static_cast<std::size_t>(
                       std::upper_bound(row.begin(), row.end(), max_front) - row.begin()) -
                   1;
    first[p] = f;
    if (row[f] < base) base = row[f];
  }
  const T cut = detail::zipline_barrier_cap(min_back, detail::zipline_spread(max_front, base));
  std::size_t total = 0;
  T top = base;
  for (std::size_t p = 0; p < n; ++p) {
    const auto row = rows[p];
    const auto e = static_cast<std::size_t>(
        std::upper_bound(row.begin() + first[p], row.end(), cut) - row.begin());
    last[p] = e;
    total += e - first[p];
    if (row[e - 1] > top) top = row[e - 1];
  }

  // 2. Bucket sort by offset from base: key(t) is monotone in t, so sorting inside buckets
  //    sorts everything.
  auto& cnt = ws.buckets();
  auto& pts = ws.points();
  pts.resize(total);
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
  cnt.assign(nb + 1, 0);
  // Column by column: the k-th points of all rows lie close in time, so the random accesses
  // to cnt and pts stay within a cache-sized region (row by row they sweep the whole range).
  const T* const vals = rows.values();
  std::size_t width = 0;
  for (std::size_t p = 0; p < n; ++p) {
    first[p] += rows.row_begin(p);
    last[p] += rows.row_begin(p);
    width = std::max(width, last[p] - first[p]);
  }
  for (std::size_t k = 0; k < width; ++k)
    for (std::size_t p = 0; p < n; ++p) {
      const std::size_t i = first[p] + k;
      if (i < last[p]) ++cnt[key(vals[i])];
    }
  std::uint32_t max_bucket = cnt[0];
  for (std::size_t b = 1; b < nb; ++b) {
    max_bucket = std::max(max_bucket, cnt[b]);
    cnt[b] += cnt[b - 1];
  }
  for (std::size_t k = 0; k < width; ++k)
    for (std::size_t p = 0; p < n; ++p) {
      const std::size_t i = first[p] + k;
      if (i < last[p]) pts[--cnt[key(vals[i])]] = point{vals[i], static_cast<std::uint32_t>(p)};
    }
  cnt[nb] = static_cast<std::uint32_t>(total);
  point* const data = pts.data();
  if (max_bucket <= 32) {
    // Few points per bucket: one insertion pass over the whole timeline costs O(N) plus the
    // inversions inside buckets, and its branch is predictable.
    for (std::size_t i = 1; i < total; ++i) {
      if (data[i].t < data[i - 1].t) {
        const point v = data[i];
        std::size_t j = i;
        for (; j > 0 && v.t < data[j - 1].t; --j) data[j] = data[j - 1];
        data[j] = v;
      }
    }
  } else {
    for (std::size_t b = 0; b < nb; ++b)
      if (cnt[b + 1] - cnt[b] > 1) detail::zipline_sort_bucket(data + cnt[b], data + cnt[b + 1]);
  }

  // 3. Sliding window.
  auto& count = ws.counts();
  count.assign(n, 0);
  std::size_t covered = 0, left = 0, i = 0;
  for (; i < total && covered < n; ++i)
    if (count[data[i].row]++ == 0) ++covered;
  // Rows all appear by the first point equal to max_front (at latest), so covered == n here.
  while (count[data[left].row] > 1) {
    --count[data[left].row];
    ++left;
  }
  T best_b = data[i - 1].t;
  T best = detail::zipline_spread(best_b, data[left].t);
  std::uint32_t* const c = count.data();
  for (; i < total; ++i) {
    ++c[data[i].row];
    // The left end moves about once per point: one branch-free step, then a loop that rarely
    // runs, keeps the hot loop free of mispredicted branches.
    while (c[data[left].row] > 1) {
      --c[data[left].row];
      ++left;
    }
    const T d = detail::zipline_spread(data[i].t, data[left].t);
    // Times never decrease along the pass, so the first minimum has the smallest barrier.
    if (d < best) {
      best = d;
      best_b = data[i].t;
    }
  }
  detail::zipline_finish(rows, best, best_b, out);
}

/// Convenience overload: allocates a workspace and a result.
template <class T>
zipline_result<T> zipline_fast(rows_view<T> rows) {
  zipline_workspace<T> ws;
  zipline_result<T> out;
  zipline_fast(rows, ws, out);
  return out;
}

}  // namespace cadence
