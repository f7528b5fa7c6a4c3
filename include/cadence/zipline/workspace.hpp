// Scratch memory shared by every ZipLine variant, so a controller that plans a barrier per
// superstep reuses one workspace and its hot loop stops allocating after the first call.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace cadence {

/// Buffers reused across calls of any ZipLine variant (zipline, zipline_opt, zipline_opt_bs,
/// zipline_fast, zipline_solve). Buffers only grow: once a workspace has served an input of
/// n rows and N points, later calls with inputs no larger do not allocate (zipline_fast:
/// inputs of the same kind; it keeps separate buffers for exact keys in 32 and in 64 bits
/// and for timestamps without exact keys, each grown on its first use). Not thread-safe:
/// use one workspace per thread. Its contents between calls are unspecified.
template <class T>
class zipline_workspace {
public:
  /// One point of the merged timeline: its time and the row it belongs to.
  struct point {
    T t;
    std::uint32_t row;
    std::uint32_t key;  ///< scratch for the variant (zipline_fast: the point's fine bucket)
  };

  /// Releases all memory (the next call allocates again).
  void clear() noexcept {
    // Swapping with empty vectors frees the memory (assigning {} would keep the capacity).
    std::vector<point>().swap(points_);
    std::vector<point>().swap(staging_);
    std::vector<std::uint64_t>().swap(keys_);
    std::vector<std::uint64_t>().swap(keys_tmp_);
    std::vector<std::uint32_t>().swap(keys32_);
    std::vector<std::uint32_t>().swap(keys32_tmp_);
    std::vector<std::size_t>().swap(aux_);
    std::vector<std::uint32_t>().swap(counts_);
    std::vector<std::uint32_t>().swap(buckets_);
    std::vector<std::size_t>().swap(first_);
    std::vector<std::size_t>().swap(last_);
    std::vector<T>().swap(zt_);
    std::vector<std::uint32_t>().swap(zr_);
  }

  // Accessors for the variants (and for tests that check reuse); their meaning is an
  // implementation detail that may change between releases.
  std::vector<point>& points() noexcept { return points_; }
  std::vector<point>& staging() noexcept { return staging_; }
  /// zipline_fast's packed (key << row_bits | row) records and their radix-sort buffers, in
  /// 64 bits and, when key and row fit, in 32 bits.
  std::vector<std::uint64_t>& keys() noexcept { return keys_; }
  std::vector<std::uint64_t>& keys_tmp() noexcept { return keys_tmp_; }
  std::vector<std::uint32_t>& keys32() noexcept { return keys32_; }
  std::vector<std::uint32_t>& keys32_tmp() noexcept { return keys32_tmp_; }
  std::vector<std::size_t>& aux() noexcept { return aux_; }
  std::vector<std::uint32_t>& counts() noexcept { return counts_; }
  std::vector<std::uint32_t>& buckets() noexcept { return buckets_; }
  std::vector<std::size_t>& first() noexcept { return first_; }
  std::vector<std::size_t>& last() noexcept { return last_; }
  std::vector<T>& zt() noexcept { return zt_; }
  std::vector<std::uint32_t>& zr() noexcept { return zr_; }

private:
  std::vector<point> points_;
  std::vector<point> staging_;
  std::vector<std::uint64_t> keys_;
  std::vector<std::uint64_t> keys_tmp_;
  std::vector<std::uint32_t> keys32_;
  std::vector<std::uint32_t> keys32_tmp_;
  std::vector<std::size_t> aux_;
  std::vector<std::uint32_t> counts_;
  std::vector<std::uint32_t> buckets_;
  std::vector<std::size_t> first_;
  std::vector<std::size_t> last_;
  std::vector<T> zt_;
  std::vector<std::uint32_t> zr_;
};

namespace detail {

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
std::size_t zipline_upper_bound(const T* v, std::size_t len, T x) noexcept {
  if (len == 0) return 0;
  std::size_t lo = 0;
  while (len > 1) {
    const std::size_t half = len / 2;
    lo = v[lo + half] <= x ? lo + half : lo;
    len -= half;
  }
  return lo + static_cast<std::size_t>(v[lo] <= x);
}

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
    out.choice[p] = zipline_upper_bound(row.data(), row.size(), barrier) - 1;
  }
}

/// The merged timeline: every point as (time, row), sorted by time, then row.
template <class T>
void zipline_merge_sorted(rows_view<T> rows, zipline_workspace<T>& ws) {
  auto& pts = ws.points();
  pts.resize(rows.total());
  std::size_t k = 0;
  for (std::size_t p = 0; p < rows.size(); ++p)
    for (const T v : rows[p]) pts[k++] = {v, static_cast<std::uint32_t>(p), 0};
  std::sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) {
    return a.t < b.t || (a.t == b.t && a.row < b.row);
  });
}

}  // namespace detail
}  // namespace cadence
