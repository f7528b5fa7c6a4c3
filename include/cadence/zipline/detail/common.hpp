// The steps every ZipLine variant shares: the size limit, the spread expression, the
// branch-free row search, the choice rule that finishes every variant, and the merged timeline.
#pragma once

#include <cadence/core/detail/bits.hpp>
#include <cadence/core/detail/host_device.hpp>
#include <cadence/core/error.hpp>
#include <cadence/zipline/detail/buffers.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/workspace.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace cadence::detail {

/// The body of every variant's convenience overload: one call with a fresh workspace and
/// result (they allocate; reuse a workspace in loops).
template <class T>
zipline_result<T> solve_with_fresh_workspace(
    rows_view<T> rows, void (*solve)(rows_view<T>, zipline_workspace<T>&, zipline_result<T>&)) {
  zipline_workspace<T> ws;
  zipline_result<T> out;
  solve(rows, ws, out);
  return out;
}

/// Row indices are stored as 32 bits to halve the merged timeline's footprint.
template <class T>
void zipline_check_sizes(rows_view<T> rows, const char* who) {
  if (rows.size() > std::numeric_limits<std::uint32_t>::max() ||
      rows.total() > std::numeric_limits<std::uint32_t>::max())
    throw zipline_input_error(std::string("cadence::") + who + ": " +
                              std::to_string(rows.total()) + " points in " +
                              std::to_string(rows.size()) +
                              " rows exceed the 2^32 - 1 this variant supports");
}

/// Spread of a window [lo, b] in T (the same expression in every variant and the oracle, so
/// floating-point spreads compare bit for bit).
template <class T>
constexpr T zipline_spread(T b, T lo) noexcept {
  return static_cast<T>(b - lo);
}

/// std::upper_bound(v, v + len, x) - v for sorted v, without unpredictable branches (zipline_fast's
/// trim and every variant's choices run one or two per row).
template <class T>
CADENCE_HOST_DEVICE std::size_t zipline_upper_bound(const T* v, std::size_t len, T x) noexcept {
  if (len == 0) return 0;
  std::size_t lo = 0;
  while (len > 1) {
    const std::size_t half = len / 2;
    lo = v[lo + half] <= x ? lo + half : lo;
    len -= half;
  }
  return lo + static_cast<std::size_t>(v[lo] <= x);
}

/// zipline_upper_bound starting from a guess: gallops from index g towards the answer, then
/// binary-searches the last stride. Same result for any g; O(log |answer - g|) probes, so a
/// good guess costs one or two cache lines where a binary search over a long row costs
/// several (what the trim and the choices pay per row at 10^5 workers and more).
template <class T>
CADENCE_HOST_DEVICE std::size_t zipline_upper_bound_from(const T* v, std::size_t len, T x,
                                                         std::size_t g) noexcept {
  if (len == 0) return 0;
  if (g >= len) g = len - 1;
  if (v[g] <= x) {  // the answer is in (g, len]
    std::size_t lo = g + 1, step = 1;
    while (lo + step - 1 < len && v[lo + step - 1] <= x) {
      lo += step;
      step *= 2;
    }
    const std::size_t hi = lo + step - 1 < len ? lo + step - 1 : len;
    return lo + zipline_upper_bound(v + lo, hi - lo, x);
  }
  std::size_t hi = g, step = 1;  // v[hi] > x: the answer is in [0, hi]
  while (hi >= step && v[hi - step] > x) {
    hi -= step;
    step *= 2;
  }
  const std::size_t lo = hi >= step ? hi - step + 1 : 0;
  return lo + zipline_upper_bound(v + lo, hi - lo, x);
}

/// Where zipline_upper_bound_interpolated starts: x interpolated between the row's ends
/// (len >= 2), exact for arithmetic rows.
template <class T>
CADENCE_HOST_DEVICE std::size_t zipline_interpolated_guess(const T* v, std::size_t len, T x) noexcept {
  const double a = static_cast<double>(v[0]), b = static_cast<double>(v[len - 1]);
  const double f = (static_cast<double>(x) - a) / (b - a) * static_cast<double>(len - 1);
  if (f >= static_cast<double>(len - 1)) return len - 1;
  return f > 0 ? static_cast<std::size_t>(f) : 0;
}

/// zipline_upper_bound for a row whose points are roughly evenly spaced (predicted push
/// times): the guess interpolates x between the row's ends, exact for arithmetic rows.
template <class T>
CADENCE_HOST_DEVICE std::size_t zipline_upper_bound_interpolated(const T* v, std::size_t len,
                                                                 T x) noexcept {
  if (len < 16) return zipline_upper_bound(v, len, x);
  return zipline_upper_bound_from(v, len, x, zipline_interpolated_guess(v, len, x));
}

/// Inputs larger than this (bytes) are searched with zipline_prefetch_search ahead; smaller
/// ones sit in L2 after validation, where the hints only cost (measured at n = 1000, R = 150).
inline constexpr std::size_t zipline_prefetch_bytes = std::size_t{4} << 20;

/// Whether rows are large enough for their searches to be loaded ahead.
template <class T>
bool zipline_prefetch_pays(rows_view<T> rows) noexcept {
  return rows.total() * sizeof(T) > zipline_prefetch_bytes;
}

/// Loads ahead what zipline_upper_bound_interpolated(v, len, x) will read, for loops that
/// search row after row (the trim, the choices): stage 1 the row's ends, stage 2 (a few rows
/// later, once the ends are in the cache) the guessed point. The searches' misses then
/// overlap instead of following one another.
template <class T>
void zipline_prefetch_search(const T* v, std::size_t len, T x, int stage) noexcept {
  if (stage == 1) {
    prefetch_for_read(v);
    prefetch_for_read(v + len - 1);
  } else if (len >= 16) {
    prefetch_for_read(v + zipline_interpolated_guess(v, len, x));
  }
}

/// In a loop that searches row after row for x, at row p: stage 1 for row p + 16, stage 2
/// for row p + 8 (their searches then overlap this one's).
template <class T>
void zipline_prefetch_ahead(rows_view<T> rows, std::size_t p, T x) noexcept {
  const auto load = [&](std::size_t q, int stage) {
    if (q < rows.size()) zipline_prefetch_search(rows.row_data(q), rows.row_size(q), x, stage);
  };
  load(p + 16, 1);
  load(p + 8, 2);
}

/// What a variant's search finds before zipline_finish: the optimal spread and its smallest
/// barrier.
template <class T>
struct zipline_window {
  T spread;
  T barrier;
};

/// Writes spread, barrier and choice (each row's latest point <= barrier) into out.
/// Every variant finds (spread, barrier) its own way and finishes here, so the choice rule
/// is implemented once.
template <class T>
void zipline_finish(rows_view<T> rows, T spread, T barrier, zipline_result<T>& out) {
  const std::size_t n = rows.size();
  out.spread = spread;
  out.barrier = barrier;
  out.choice.resize(n);
  for (std::size_t p = 0; p < n; ++p) {
    const auto row = rows[p];
    out.choice[p] = zipline_upper_bound_interpolated(row.data(), row.size(), barrier) - 1;
  }
}

/// The merged timeline in buf.points: every point as (time, row), sorted by time, then row.
template <class T>
void zipline_merge_sorted(rows_view<T> rows, zipline_buffers<T>& buf) {
  auto& pts = buf.points;
  pts.resize(rows.total());
  std::size_t k = 0;
  for (std::size_t p = 0; p < rows.size(); ++p)
    for (const T v : rows[p]) pts[k++] = {v, static_cast<std::uint32_t>(p), 0};
  std::sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) {
    return a.t < b.t || (a.t == b.t && a.row < b.row);
  });
}

}  // namespace cadence::detail
