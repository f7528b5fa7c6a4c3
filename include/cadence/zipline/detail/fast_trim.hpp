// zipline_fast's first step: drop the points no optimal window can contain, so both sort paths
// (exact keys, buckets) see only the survivors.
#pragma once

#include <cadence/core/detail/bits.hpp>
#include <cadence/core/detail/host_device.hpp>

#include <cadence/zipline/detail/buffers.hpp>
#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/rows.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

namespace cadence::detail {

/// Upper bound for barriers: every optimal barrier is <= this (see zipline_fast_trim_bounds).
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

/// The smallest and largest of the points a sweep reads (its view of trimmed rows gives the
/// rest: their count and the rows to cover).
template <class T>
struct zipline_extent {
  T base;  ///< the smallest surviving point
  T top;   ///< the largest surviving point
};

/// The trim's bounds, before any row is searched.
template <class T>
struct zipline_trim_bounds {
  T front;                ///< L = max_p first(p): no window ends before it
  T cut;                  ///< no optimal barrier lies beyond it
  std::size_t front_row;  ///< the first row whose first point is L
};

/// With L = max_p first(p) no window exists before L, so each row keeps only its latest
/// point <= L onward. No barrier beyond cut = min_p last(p) + U can be optimal, for any
/// U >= d(L) (d(B) >= B - min_p last(p), and d(L) bounds the optimal spread). Row p's latest
/// point <= L is within its largest gap G_p of L, or is its last point, so
/// d(L) <= U = max(max_p G_p, L - min_p last(p)): computed from what validation gathered, with
/// no pass over the rows (each row a sweep reads is searched for its range when it is
/// added: zipline_fast_trim_range). Rounding is monotone, so U bounds d(L) in T too.
/// Needs n >= 2 valid rows and their ends (from zipline_rows_valid_gaps).
template <class T>
zipline_trim_bounds<T> zipline_fast_trim_bounds(const zipline_row_ends<T>& ends) {
  T bound = ends.max_gap;
  if (ends.min_back < ends.max_front) {
    const T over = zipline_spread(ends.max_front, ends.min_back);
    if (over > bound) bound = over;
  }
  return {ends.max_front, zipline_barrier_cap(ends.min_back, bound), ends.front_row};
}

/// A trimmed range [first, end) of indices into a row.
struct zipline_row_range {
  std::size_t first;
  std::size_t end;
};

/// The trimmed range of a row of len points at v: from its latest point <= L (front) to one
/// past its last point <= cut. Two interpolated searches (one or two cache lines each on
/// evenly spaced rows). zipline_fast and the Thrust form (per subset row) alike.
template <class T>
CADENCE_HOST_DEVICE zipline_row_range zipline_fast_trim_range(const T* v, std::size_t len, T front,
                                                              T cut) noexcept {
  const std::size_t first = zipline_upper_bound_interpolated(v, len, front) - 1;
  return {first, first + zipline_upper_bound_interpolated(v + first, len - first, cut)};
}

/// The extent of a view of trimmed rows (each row its surviving range, never empty).
template <class T>
zipline_extent<T> zipline_extent_of(rows_view<T> rows) {
  const std::size_t n = rows.size();
  T base{}, top{};
  for (std::size_t p = 0; p < n; ++p) {
    const T* const v = rows.row_data(p);
    const T lo = v[0], hi = v[rows.row_size(p) - 1];
    if (p == 0 || lo < base) base = lo;
    if (p == 0 || hi > top) top = hi;
  }
  return {base, top};
}

}  // namespace cadence::detail
