// The published ZipLine algorithms (Zhao et al., Machine Learning 2021): zipline (Algorithm 2),
// zipline_opt (its leftmost-row pruning) and zipline_opt_bs (binary search via an n x R matrix).
// They are the reference points for speed ratios; zipline_fast is what to call in production.
#pragma once

#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/workspace.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace cadence {
namespace detail {

/// Algorithm 2 on the merged timeline. Z holds at most one point per row, in time order, in
/// zt/zr[head, tail). When `prune` is set (zipline_opt) an arrival whose row owns Z's leftmost
/// point pops it in O(1) instead of searching Z linearly and shifting its tail.
template <bool prune, class T>
void zipline_paper(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out,
                   const char* who) {
  validate(rows);
  zipline_check_sizes(rows, who);
  const std::size_t n = rows.size();
  zipline_merge_sorted(rows, ws);
  const auto& pts = ws.points();
  auto& zt = ws.zt();
  auto& zr = ws.zr();
  const std::size_t cap = 2 * n;
  zt.resize(cap);
  zr.resize(cap);
  std::size_t head = 0, tail = 0;
  bool found = false;
  T best{}, best_b{};
  for (const auto& pt : pts) {
    bool removed = false;
    if constexpr (prune) {
      if (tail > head && zr[head] == pt.row) {
        ++head;
        removed = true;
      }
    }
    if (!removed) {
      // Linear search for the arriving row's previous point; replace it (erase + append keeps
      // Z in time order, so the leftmost point stays at head).
      for (std::size_t k = head; k < tail; ++k) {
        if (zr[k] == pt.row) {
          std::copy(zt.begin() + static_cast<std::ptrdiff_t>(k + 1),
                    zt.begin() + static_cast<std::ptrdiff_t>(tail),
                    zt.begin() + static_cast<std::ptrdiff_t>(k));
          std::copy(zr.begin() + static_cast<std::ptrdiff_t>(k + 1),
                    zr.begin() + static_cast<std::ptrdiff_t>(tail),
                    zr.begin() + static_cast<std::ptrdiff_t>(k));
          --tail;
          break;
        }
      }
    }
    if (tail == cap) {
      std::copy(zt.begin() + static_cast<std::ptrdiff_t>(head), zt.end(), zt.begin());
      std::copy(zr.begin() + static_cast<std::ptrdiff_t>(head), zr.end(), zr.begin());
      tail -= head;
      head = 0;
    }
    zt[tail] = pt.t;
    zr[tail] = pt.row;
    ++tail;
    if (tail - head == n) {
      // Z holds every row: evaluate, then drop the leftmost point (the paper's step).
      const T d = zipline_spread(pt.t, zt[head]);
      // Times never decrease along the scan, so the first minimum has the smallest barrier.
      if (!found || d < best) {
        best = d;
        best_b = pt.t;
        found = true;
      }
      ++head;
    }
  }
  zipline_finish(rows, best, best_b, out);
}

}  // namespace detail

/// ZipLine as published (Algorithm 2): merge all points on one timeline and scan it with a
/// set Z of at most one point per row; an arriving point replaces its row's old point, found
/// by linear search; when Z holds every row its spread is evaluated and its leftmost point is
/// dropped. O(N log N + N n) time for N points in n rows (O(R n^2) for n rows of R points).
/// Pick it only as the reference that other variants are measured against.
template <class T>
void zipline(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  detail::zipline_paper<false>(rows, ws, out, "zipline");
}

/// Convenience overload: allocates a workspace and a result.
template <class T>
zipline_result<T> zipline(rows_view<T> rows) {
  return detail::solve_with_fresh_workspace<T>(rows, zipline<T>);
}

/// zipline with the paper's pruning: when the arriving point's row owns Z's leftmost point,
/// that point is popped in O(1) instead of searched for. Same worst case as zipline; faster
/// when rows advance in lock step (equal intervals), where the pruning fires on most arrivals.
template <class T>
void zipline_opt(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  detail::zipline_paper<true>(rows, ws, out, "zipline_opt");
}

/// Convenience overload: allocates a workspace and a result.
template <class T>
zipline_result<T> zipline_opt(rows_view<T> rows) {
  return detail::solve_with_fresh_workspace<T>(rows, zipline_opt<T>);
}

/// zipline with an auxiliary n x R matrix (one entry per point: its position on the merged
/// timeline). An arriving e_p[i] can only replace e_p[i-1]; its slot in the time-ordered Z is
/// found by binary search and marked removed (Z is compacted when its buffer fills), so each
/// arrival costs O(log n): O(N log N) in all, O(R n log n) for n rows of R points.
template <class T>
void zipline_opt_bs(rows_view<T> rows, zipline_workspace<T>& ws, zipline_result<T>& out) {
  validate(rows);
  detail::zipline_check_sizes(rows, "zipline_opt_bs");
  const std::size_t n = rows.size();
  detail::zipline_merge_sorted(rows, ws);
  const auto& pts = ws.points();
  auto& aux = ws.aux();    // aux[row_begin(p) + i]: merged position of e_p[i]
  auto& seen = ws.first(); // points of each row met so far
  auto& z = ws.last();     // Z: merged positions, ascending, with tombstones
  auto& dead = ws.zr();    // dead[k] != 0: slot k of Z was replaced
  aux.resize(pts.size());
  seen.assign(n, 0);
  for (std::size_t j = 0; j < pts.size(); ++j) {
    const std::uint32_t r = pts[j].row;
    aux[rows.row_begin(r) + seen[r]++] = j;
  }
  seen.assign(n, 0);
  const std::size_t cap = 2 * n + 1;
  z.resize(cap);
  dead.resize(cap);
  std::size_t head = 0, tail = 0, alive = 0;
  bool found = false;
  T best{}, best_b{};
  for (std::size_t j = 0; j < pts.size(); ++j) {
    const std::uint32_t r = pts[j].row;
    const std::size_t i = seen[r]++;
    if (i > 0) {
      const std::size_t prev = aux[rows.row_begin(r) + i - 1];
      const auto b = z.begin() + static_cast<std::ptrdiff_t>(head);
      const auto e = z.begin() + static_cast<std::ptrdiff_t>(tail);
      const auto it = std::lower_bound(b, e, prev);
      if (it != e && *it == prev) {
        const auto k = static_cast<std::size_t>(it - z.begin());
        if (!dead[k]) {
          dead[k] = 1;
          --alive;
        }
      }
    }
    if (tail == cap) {
      std::size_t w = 0;
      for (std::size_t k = head; k < tail; ++k)
        if (!dead[k]) {
          z[w] = z[k];
          dead[w] = 0;
          ++w;
        }
      head = 0;
      tail = w;
    }
    z[tail] = j;
    dead[tail] = 0;
    ++tail;
    ++alive;
    if (alive == n) {
      while (dead[head]) ++head;
      const T d = detail::zipline_spread(pts[j].t, pts[z[head]].t);
      if (!found || d < best) {
        best = d;
        best_b = pts[j].t;
        found = true;
      }
      ++head;
      --alive;
    }
  }
  detail::zipline_finish(rows, best, best_b, out);
}

/// Convenience overload: allocates a workspace and a result.
template <class T>
zipline_result<T> zipline_opt_bs(rows_view<T> rows) {
  return detail::solve_with_fresh_workspace<T>(rows, zipline_opt_bs<T>);
}

}  // namespace cadence
