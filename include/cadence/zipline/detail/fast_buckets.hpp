// zipline_fast's path for timestamps without exact keys (arbitrary fractions, integer ranges
// over 32 bits): a two-level bucket sort of the surviving points fused with the sliding window.
#pragma once

#include <cadence/zipline/detail/buffers.hpp>
#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/detail/fast_trim.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace cadence::detail {

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

/// Fine keys key(t) are monotone in t (offset from base, shifted or scaled so there are about
/// two fine buckets per point); coarse keys are key >> fine_bits. One pass scatters points
/// into coarse buckets (a few hundred sequential write streams, cache friendly); each coarse
/// bucket is then counting-sorted on its fine keys inside L1, fixed up by insertion, and
/// immediately swept while it is still in cache.
template <class T>
zipline_window<T> zipline_fast_buckets(rows_view<T> rows, zipline_buffers<T>& buf,
                                       const zipline_extent<T>& extent) {
  using point = zipline_point<T>;
  const std::size_t n = rows.size();
  const std::size_t total = rows.total();
  const T base = extent.base, top = extent.top;
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
  auto& cnt = buf.buckets;
  cnt.assign(nc + 1 + fine_per_coarse + 1, 0);
  std::uint32_t* const coarse = cnt.data();
  std::uint32_t* const fine = cnt.data() + nc + 1;

  // Row by row: reads are sequential, and with a few hundred coarse buckets every write
  // stream's head stays in L1.
  for (std::size_t p = 0; p < n; ++p) {
    const T* const v = rows.row_data(p);
    for (std::size_t i = 0, e = rows.row_size(p); i < e; ++i) ++coarse[key(v[i]) >> fine_bits];
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
  auto& stage = buf.staging;
  auto& pts = buf.points;
  stage.resize(total);
  pts.resize(total);
  point* const staged = stage.data();
  point* const data = pts.data();
  for (std::size_t p = 0; p < n; ++p) {
    const T* const v = rows.row_data(p);
    for (std::size_t i = 0, e = rows.row_size(p); i < e; ++i) {
      const std::size_t k = key(v[i]);
      staged[coarse[k >> fine_bits]++] =
          point{v[i], static_cast<std::uint32_t>(p),
                static_cast<std::uint32_t>(k & (fine_per_coarse - 1))};
    }
  }
  // coarse[c] is now the end of bucket c, i.e. the start of bucket c + 1.

  auto& count = buf.counts;
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
        if (fe - fb > 1) zipline_sort_bucket(out_b + fb, out_b + fe);
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
      if (covered == n) {  // every row of the view has points
        best = zipline_spread(data[i].t, data[left].t);
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
      const T d = zipline_spread(data[i].t, data[left].t);
      // Times never decrease along the pass, so the first minimum has the smallest barrier.
      if (d < best) {
        best = d;
        best_b = data[i].t;
      }
    }
    cb = ce;
  }
  return {best, best_b};
}

}  // namespace cadence::detail
