/// \file
/// \ingroup zipline
/// The published ZipLine algorithms (Zhao et al., Machine Learning 2021) under their paper's
/// names: zipline_paper (ZipLine, Algorithm 2), zipline_paper_opt (ZipLineOpt, its
/// leftmost-row pruning) and zipline_paper_opt_bs (ZipLineOptBS, binary search through an
/// n x R matrix). They are the reference points for speed ratios; for answers call
/// cadence::zipline (fast.hpp), which returns the same result much faster.
#pragma once

#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/detail/paper.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/workspace.hpp>

namespace cadence {
/// \addtogroup zipline
/// @{

namespace detail {

/// ZipLine's Algorithm 2 on ws's buffers: the whole scan of spec section 5, "zipline" (merge,
/// scan with Z, linear search and replace, evaluate d and drop the leftmost), and with `prune`
/// also "zipline_opt" (the leftmost point's row checked before the search). The two public
/// names are this one algorithm with the pruning off and on; errors carry the name called.
template <bool prune, class T>
void zipline_paper_algorithm2(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  zipline_paper_scan<prune>(rows, zipline_workspace_access::buffers(ws), out,
                            prune ? "zipline_paper_opt" : "zipline_paper");
}

}  // namespace detail

/// ZipLine as published (Algorithm 2): merge all points on one timeline and scan it with a
/// set Z of at most one point per row; an arriving point replaces its row's old point, found
/// by linear search; when Z holds every row its spread is evaluated and its leftmost point is
/// dropped. O(N log N + N n) time for N points in n rows (O(R n^2) for n rows of R points).
/// Pick it only as the reference that other variants are measured against.
/// Takes rows, ws and out as cadence::zipline does.
template <class T>
void zipline_paper(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  detail::zipline_paper_algorithm2<false>(rows, ws, out);
}

/// zipline_paper with the paper's pruning: when the arriving point's row owns Z's leftmost
/// point, that point is popped in O(1) instead of searched for. Same worst case; faster when
/// rows advance in lock step (equal intervals), where the pruning fires on most arrivals.
/// Takes rows, ws and out as cadence::zipline does.
template <class T>
void zipline_paper_opt(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  detail::zipline_paper_algorithm2<true>(rows, ws, out);
}

/// Convenience overload of zipline_paper: solves rows with a workspace and a result it allocates.
template <class T>
zipline_result<T> zipline_paper(rows_view<T> rows) {
  return detail::solve_with_fresh_workspace<T>(rows, zipline_paper<T>);
}

/// Convenience overload of zipline_paper_opt: solves rows with a workspace and a result it
/// allocates.
template <class T>
zipline_result<T> zipline_paper_opt(rows_view<T> rows) {
  return detail::solve_with_fresh_workspace<T>(rows, zipline_paper_opt<T>);
}

/// zipline_paper with an auxiliary n x R matrix (one entry per point: its position on the
/// merged timeline). An arriving e_p[i] can only replace e_p[i-1]; its slot in the
/// time-ordered Z is found by binary search and marked removed (Z is compacted when its
/// buffer fills), so each arrival costs O(log n): O(N log N) in all, O(R n log n) for n rows
/// of R points.
/// Takes rows, ws and out as cadence::zipline does.
template <class T>
void zipline_paper_opt_bs(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  detail::zipline_paper_opt_bs_scan(rows, detail::zipline_workspace_access::buffers(ws), out);
}

/// Convenience overload: solves rows with a workspace and a result it allocates.
template <class T>
zipline_result<T> zipline_paper_opt_bs(rows_view<T> rows) {
  return detail::solve_with_fresh_workspace<T>(rows, zipline_paper_opt_bs<T>);
}

/// @}
}  // namespace cadence
