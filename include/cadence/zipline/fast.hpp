/// \file
/// \ingroup zipline
/// cadence::zipline, the ZipLine to call, and zipline_fast, the library's own algorithm that it
/// runs: trim the points that cannot matter, sort the rest in linear time (radix sort on exact
/// integer keys, else a bucket sort), one sliding window. Returns exactly
/// zipline_brute_force's answer. The paper's algorithms are in paper.hpp.
#pragma once

#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/detail/fast_buckets.hpp>
#include <cadence/zipline/detail/fast_exact_keys.hpp>
#include <cadence/zipline/detail/fast_subset.hpp>
#include <cadence/zipline/detail/fast_trim.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/workspace.hpp>

namespace cadence {
/// \addtogroup zipline
/// @{

/// The fastest single-core ZipLine: O(N) time when the timestamps have exact keys (below) or
/// are spread out, O(N log N) worst case on clustered ones; O(N) workspace memory.
///
/// 0. Validation: one branch-free pass (strictly increasing rows with finite ends are
///    finite) that also takes each row's largest gap and the rows' ends; only if it finds a
///    problem does validate() run, for its exact message.
/// 1. Trim: with L = max_p first(p) no window exists before L, so each row keeps only its
///    latest point <= L onward; d(L) bounds the optimal spread, and since
///    d(B) >= B - min_p last(p), no barrier beyond min_p last(p) + d(L) can be optimal.
///    d(L) is bounded by the largest gap (or L - min_p last(p)), known from validation, so
///    the trim needs no pass of its own: a row is searched for its range when a sweep
///    takes it.
/// 2. Exact keys, when every surviving point has one (integers whose range fits in 32 bits;
///    floating point on a power-of-two grid, e.g. whole milliseconds, which is checked per
///    point): records (key << row_bits | row), 32 bits when they fit, written with their
///    radix-digit histograms in one pass; an LSD radix sort of 1-3 passes over only the key
///    bits that vary; the sliding window on integer keys (key differences order exactly as
///    the spreads in T do), computed without branches on the data: from each point's next
///    point of the same row, the windows that start at each point, one candidate each.
/// 3. Otherwise a two-level bucket sort of the surviving points by their offset from the
///    smallest (integers: a shift; floating point: a scale): a scatter into a few hundred
///    coarse buckets, then, per coarse bucket and inside L1, a counting sort on the fine key
///    and an insertion pass (fine buckets hold 0-2 points on typical data), and the sliding
///    window over each coarse bucket right after it is sorted.
/// Steps 2-3 run on a certified subset of the rows (zipline_fast_search in
/// detail/fast_subset.hpp): the rows with the widest gaps; the search that finds every row's
/// choice checks that the rows left out do not change the answer.
/// The sliding window: per-row counts in the window; the left end advances while its row
/// has a later point inside; a window covering every row and ending at B has spread
/// B - left, which equals d(B) once all points equal to B are in (earlier positions with
/// the same time only overestimate).
/// Call it by this name to pin the algorithm (benchmarks); otherwise call cadence::zipline,
/// which takes rows, ws and out alike.
template <class T>
void zipline_fast(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  auto& buf = detail::zipline_workspace_access::buffers(ws);
  buf.gaps.resize(rows.size());
  detail::zipline_row_ends<T> ends{};
  if (!detail::zipline_rows_valid_gaps(rows, buf.gaps.data(), &ends)) validate(rows);  // exact error
  detail::zipline_check_sizes(rows, "zipline_fast");
  if (rows.size() == 1) {
    // Every point is a window of spread 0; the smallest barrier is the first point.
    detail::zipline_finish(rows, T{}, rows[0][0], out);
    return;
  }
  const detail::zipline_trim_bounds<T> bounds = detail::zipline_fast_trim_bounds(ends);
  out.choice.resize(rows.size());
  const detail::zipline_window<T> best = detail::zipline_fast_search(rows, buf, bounds, out.choice.data());
  out.spread = best.spread;
  out.barrier = best.barrier;
}

/// Convenience overload: solves rows with a workspace and a result it allocates.
template <class T>
zipline_result<T> zipline_fast(rows_view<T> rows) {
  return detail::solve_with_fresh_workspace<T>(rows, zipline_fast<T>);
}

/// ZipLine: for n rows of predicted push times, the one-per-row selection with the smallest
/// spread, its smallest barrier and each row's choice (docs/contract.md#5-zipline; identical in every
/// variant). Runs the library's fastest CPU algorithm, today zipline_fast. Reuse ws and out
/// across calls: once they have served the largest input, a call does not allocate. Throws
/// zipline_input_error, naming the row and index, on input that breaks the contract.
template <class T>
void zipline(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  zipline_fast(rows, ws, out);
}

/// Convenience overload: solves rows with a workspace and a result it allocates (reuse them
/// in loops).
template <class T>
zipline_result<T> zipline(rows_view<T> rows) {
  return zipline_fast(rows);
}

/// @}
}  // namespace cadence
