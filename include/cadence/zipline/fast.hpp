// zipline_fast: the library's fastest single-core ZipLine. Trims points that cannot matter,
// bucket-sorts the rest by their offset from the smallest and finds the answer with one
// sliding window. Returns exactly zipline_brute_force's answer.
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

/// The fastest single-core ZipLine: O(N) expected time on spread-out timestamps (bucket
/// sort), O(N log N) worst case on clustered ones; O(N) workspace memory.
///
/// 1. Trim: with L = max_p first(p) no window exists before L, so each row keeps only its
///    latest point <= L onward; d(L) bounds the optimal spread, and since
///    d(B) >= B - min_p last(p), no barrier beyond min_p last(p) + d(L) can be optimal.
/// 2. Two-level bucket sort of the surviving points by their offset from the smallest
///    (integers: a shift; floating point: a scale): a scatter into a few hundred coarse
///    buckets, then, per coarse bucket and inside L1, a counting sort on the fine key and an
///    insertion pass (fine buckets hold 0-2 points on typical data).
/// 3. A sliding window over each coarse bucket right after it is sorted: per-row counts in
///    the window; the left end advances while its row has a later point inside; a window
///    covering every row and ending at B has spread B - left, which equals d(B) once all
///    points equal to B are in (earlier positions with the same time only overestimate).
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
  zipline_workspace<T> ws;
  zipline_result<T> out;
  zipline_fast(rows, ws, out);
  return out;
}

}  // namespace cadence
