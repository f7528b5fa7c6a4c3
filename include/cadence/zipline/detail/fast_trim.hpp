// zipline_fast's first step: drop the points no optimal window can contain, so both sort paths
// (exact keys, buckets) see only the survivors.
#pragma once

#include <cadence/core/detail/bits.hpp>

#include <cadence/zipline/detail/buffers.hpp>
#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/rows.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

namespace cadence::detail {

/// Upper bound for barriers: every optimal barrier is <= this (see zipline_fast_trim).
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

/// What the trim leaves: row p keeps [buf.first[p], buf.last[p]), and these totals.
template <class T>
struct zipline_trimmed {
  std::size_t total;  ///< surviving points
  T base;             ///< the smallest surviving point
  T top;              ///< the largest surviving point
  std::size_t rows;   ///< rows with surviving points (the sweep's cover target)
  T cut;              ///< no optimal barrier lies beyond it
  std::size_t front_row;  ///< a row whose first point is L = max_p first(p)
};

/// With L = max_p first(p) no window exists before L, so each row keeps only its latest
/// point <= L onward; d(L) bounds the optimal spread, and since d(B) >= B - min_p last(p),
/// no barrier beyond min_p last(p) + d(L) can be optimal. Two searches
/// per row (interpolated: one or two cache lines on evenly spaced rows). Needs n >= 2 valid
/// rows.
template <class T>
zipline_trimmed<T> zipline_fast_trim(rows_view<T> rows, zipline_buffers<T>& buf) {
  const std::size_t n = rows.size();
  T max_front = rows[0].front(), min_back = rows[0].back();
  std::size_t front_row = 0;
  for (std::size_t p = 1; p < n; ++p) {
    const auto row = rows[p];
    if (row.front() > max_front) {
      max_front = row.front();
      front_row = p;
    }
    if (row.back() < min_back) min_back = row.back();
  }
  auto& first = buf.first;
  auto& last = buf.last;
  first.resize(n);
  last.resize(n);
  T base = max_front;
  for (std::size_t p = 0; p < n; ++p) {
    const auto row = rows[p];
    const std::size_t f = zipline_upper_bound_interpolated(row.data(), row.size(), max_front) - 1;
    first[p] = f;
    if (row[f] < base) base = row[f];
  }
  const T cut = zipline_barrier_cap(min_back, zipline_spread(max_front, base));
  std::size_t total = 0;
  T top = base;
  for (std::size_t p = 0; p < n; ++p) {
    const auto row = rows[p];
    const std::size_t e =
        first[p] + zipline_upper_bound_interpolated(row.data() + first[p], row.size() - first[p], cut);
    last[p] = e;
    total += e - first[p];
    if (row[e - 1] > top) top = row[e - 1];
  }
  return {total, base, top, n, cut, front_row};
}

}  // namespace cadence::detail
