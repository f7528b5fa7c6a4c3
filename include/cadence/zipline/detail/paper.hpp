// The bodies of the published ZipLine algorithms (cadence/zipline/paper.hpp): Algorithm 2's
// scan of Z, with and without the leftmost-row pruning, and the binary-search variant.
#pragma once

#include <cadence/zipline/detail/buffers.hpp>
#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace cadence::detail {

/// Algorithm 2 on the merged timeline. Z holds at most one point per row, in time order, in
/// zt/zr[head, tail). When `prune` is set (zipline_paper_opt) an arrival whose row owns Z's
/// leftmost point pops it in O(1) instead of searching Z linearly and shifting its tail.
template <bool prune, class T>
void zipline_paper_scan(rows_view<T> rows, zipline_buffers<T>& buf, zipline_result<T>& out,
                        const char* who) {
  validate(rows);
  zipline_check_sizes(rows, who);
  const std::size_t n = rows.size();
  zipline_merge_sorted(rows, buf);
  const auto& pts = buf.points;
  auto& zt = buf.zt;
  auto& zr = buf.zr;
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

/// zipline_paper_opt_bs: Z holds merged positions, ascending, with tombstones; an arriving
/// e_p[i] finds e_p[i-1]'s slot by binary search (through the n x R matrix of merged
/// positions) and marks it removed; Z is compacted when its buffer fills.
template <class T>
void zipline_paper_opt_bs_scan(rows_view<T> rows, zipline_buffers<T>& buf,
                               zipline_result<T>& out) {
  validate(rows);
  zipline_check_sizes(rows, "zipline_paper_opt_bs");
  const std::size_t n = rows.size();
  zipline_merge_sorted(rows, buf);
  const auto& pts = buf.points;
  auto& aux = buf.aux;     // aux[row_begin(p) + i]: merged position of e_p[i]
  auto& seen = buf.first;  // points of each row met so far
  auto& z = buf.last;      // Z: merged positions, ascending, with tombstones
  auto& dead = buf.zr;     // dead[k] != 0: slot k of Z was replaced
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
      const T d = zipline_spread(pts[j].t, pts[z[head]].t);
      if (!found || d < best) {
        best = d;
        best_b = pts[j].t;
        found = true;
      }
      ++head;
      --alive;
    }
  }
  zipline_finish(rows, best, best_b, out);
}

}  // namespace cadence::detail
