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

/// What the trim leaves of the rows a sweep reads: these totals.
template <class T>
struct zipline_trimmed {
  std::size_t total;  ///< surviving points
  T base;             ///< the smallest surviving point
  T top;              ///< the largest surviving point
  std::size_t rows;   ///< rows with surviving points (the sweep's cover target)
};

/// The trim's bounds, before any row's end is searched for.
template <class T>
struct zipline_trim_bounds {
  T cut;                  ///< no optimal barrier lies beyond it
  std::size_t front_row;  ///< the first row whose first point is L = max_p first(p)
};

/// With L = max_p first(p) no window exists before L, so each row keeps only its latest
/// point <= L onward (buf.first[p]); d(L) bounds the optimal spread, and since
/// d(B) >= B - min_p last(p), no barrier beyond cut = min_p last(p) + d(L) can be optimal.
/// One interpolated search per row (one or two cache lines on evenly spaced rows); the
/// trim's end (zipline_fast_trim_end) is searched for only in the rows a sweep reads.
/// Sizes and sets buf.first. Needs n >= 2 valid rows and their ends
/// (from zipline_rows_valid_gaps).
template <class T>
zipline_trim_bounds<T> zipline_fast_trim_start(rows_view<T> rows, zipline_buffers<T>& buf,
                                               const zipline_row_ends<T>& ends) {
  const std::size_t n = rows.size();
  const T max_front = ends.max_front;
  auto& first = buf.first;
  first.resize(n);
  T base = max_front;
  const bool far = zipline_prefetch_pays(rows);
  for (std::size_t p = 0; p < n; ++p) {
    if (far) zipline_prefetch_ahead(rows, p, max_front, [](std::size_t) { return std::size_t{0}; });
    const auto row = rows[p];
    const std::size_t f = zipline_upper_bound_interpolated(row.data(), row.size(), max_front) - 1;
    first[p] = f;
    if (row[f] < base) base = row[f];
  }
  return {zipline_barrier_cap(ends.min_back, zipline_spread(max_front, base)), ends.front_row};
}

/// One past row p's last point <= cut (its trimmed range starts at first).
template <class T>
std::size_t zipline_fast_trim_end(rows_view<T> rows, std::size_t p, std::size_t first, T cut) {
  const auto row = rows[p];
  return first + zipline_upper_bound_interpolated(row.data() + first, row.size() - first, cut);
}

/// The totals of a view of trimmed rows (each row its surviving range, never empty).
template <class T>
zipline_trimmed<T> zipline_trimmed_totals(rows_view<T> rows) {
  const std::size_t n = rows.size();
  T base{}, top{};
  for (std::size_t p = 0; p < n; ++p) {
    const T* const v = rows.row_data(p);
    const T lo = v[0], hi = v[rows.row_size(p) - 1];
    if (p == 0 || lo < base) base = lo;
    if (p == 0 || hi > top) top = hi;
  }
  return {rows.total(), base, top, n};
}

}  // namespace cadence::detail
