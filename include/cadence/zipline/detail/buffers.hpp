// The vectors behind zipline_workspace: every variant's scratch, kept out of the workspace's
// public face (the variants reach them through detail::zipline_workspace_access).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cadence::detail {

/// One point of the merged timeline: its time and the row it belongs to.
template <class T>
struct zipline_point {
  T t;
  std::uint32_t row;
  std::uint32_t key;  ///< scratch for the variant (zipline_fast: the point's fine bucket)
};

/// Every buffer a ZipLine variant needs; one variant's roles are another's free scratch, so
/// a workspace shared by all of them holds no more than the hungriest needs.
template <class T>
struct zipline_buffers {
  /// The merged timeline (paper variants); zipline_fast's bucket-sorted points.
  std::vector<zipline_point<T>> points;
  /// zipline_fast's scatter into coarse buckets.
  std::vector<zipline_point<T>> staging;
  /// zipline_fast's packed (key << row_bits | row) records and their radix-sort buffers, in
  /// 64 bits and, when key and row fit, in 32 bits.
  std::vector<std::uint64_t> keys;
  std::vector<std::uint64_t> keys_tmp;
  std::vector<std::uint32_t> keys32;
  std::vector<std::uint32_t> keys32_tmp;
  /// zipline_paper_opt_bs: the merged position of every point.
  std::vector<std::size_t> aux;
  /// zipline_fast: per-row counts of the sliding window.
  std::vector<std::uint32_t> counts;
  /// zipline_fast: radix-digit and bucket histograms.
  std::vector<std::uint32_t> buckets;
  /// zipline_paper_opt_bs: points met per row, and Z.
  std::vector<std::size_t> first;
  std::vector<std::size_t> last;
  /// zipline_fast: each row's largest gap between neighbours.
  std::vector<T> gaps;
  /// zipline_fast: the swept subset's trimmed rows, as a separate() rows_view (a pointer to
  /// each of its k ranges and k + 1 offsets).
  std::vector<const T*> sub_rows;
  std::vector<std::size_t> sub_offsets;
  /// Z's times and rows (zipline_paper, zipline_paper_opt); zipline_paper_opt_bs: Z's
  /// tombstones in zr; zipline_fast: the sampled gaps in zt.
  std::vector<T> zt;
  std::vector<std::uint32_t> zr;

  /// zipline_fast: how many subsets the last call swept (0: every row at once; 1: the first
  /// subset passed its check; 2: it did not, and the certified superset was swept). Tests and
  /// benchmarks read it.
  int subset_rounds = 0;

  /// Bytes held (capacities, not sizes: what stays allocated between calls).
  std::size_t bytes() const noexcept {
    const auto held = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
    return held(points) + held(staging) + held(keys) + held(keys_tmp) + held(keys32) +
           held(keys32_tmp) + held(aux) + held(counts) + held(buckets) + held(first) +
           held(last) + held(gaps) + held(sub_rows) + held(sub_offsets) + held(zt) + held(zr);
  }
};

}  // namespace cadence::detail
