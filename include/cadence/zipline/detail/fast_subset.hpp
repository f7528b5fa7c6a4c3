// zipline_fast's outer step: search only the rows that can decide the answer. When every row
// left out has a point inside the subset's optimal window, the subset's answer is the
// input's; the search that finds each row's choice checks it.
#pragma once

#include <cadence/zipline/detail/buffers.hpp>
#include <cadence/zipline/detail/common.hpp>
#include <cadence/zipline/detail/fast_buckets.hpp>
#include <cadence/zipline/detail/fast_exact_keys.hpp>
#include <cadence/zipline/detail/fast_trim.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace cadence::detail {

/// The rows a sweep reads, each cut to its trimmed range, as one separate() view over
/// buf.sub_rows and buf.sub_offsets: the sorts then touch only these rows, and their
/// per-row counts and the row field of their records are sized by the subset, not by n
/// (at 10^6 rows, the 12k rows of the first subset take 14 bits of a record instead of 20).
template <class T>
class zipline_subset {
public:
  explicit zipline_subset(zipline_buffers<T>& buf)
      : rows_(buf.sub_rows), offsets_(buf.sub_offsets) {
    rows_.clear();
    offsets_.assign(1, 0);
  }
  /// Adds a trimmed range of len >= 1 points starting at from.
  void add(const T* from, std::size_t len) {
    rows_.push_back(from);
    offsets_.push_back(offsets_.back() + len);
  }
  rows_view<T> view() const noexcept {
    return rows_view<T>::separate(rows_.data(), offsets_.data(), rows_.size());
  }

private:
  std::vector<const T*>& rows_;
  std::vector<std::size_t>& offsets_;
};

/// Sorts the points of the trimmed rows (exact keys, else buckets) and sweeps them.
template <class T>
zipline_window<T> zipline_fast_sweep(rows_view<T> trimmed, zipline_buffers<T>& buf) {
  const zipline_extent<T> extent = zipline_extent_of(trimmed);
  const auto exact = zipline_fast_exact(trimmed, buf, extent);
  return exact ? *exact : zipline_fast_buckets(trimmed, buf, extent);
}

/// How many rows the first subset takes: 192 + min(n / 32, 12 sqrt(n)). The rows that can
/// decide the answer are those whose largest gap exceeds the optimal spread, and as n grows
/// that spread nears the largest gaps: on the generator's rows they are 26% of the rows at
/// n = 1000, 7.9% at 10^4, 2.6% at 10^5 and 0.79% at 10^6 (7876 rows), growing like sqrt(n).
/// n / 32 alone took 31k rows at 10^6, whose records no longer fit 32 bits.
inline std::size_t zipline_subset_want(std::size_t n) noexcept {
  const auto root = static_cast<std::size_t>(12.0 * std::sqrt(static_cast<double>(n)));
  return 192 + (n / 32 < root ? n / 32 : root);
}

/// The first subset takes the rows whose largest gap exceeds a threshold chosen so that
/// about `want` rows do: the (want + 1)-th largest of the gaps of every (n / s)-th row,
/// s = min(n, zipline_gap_sample), scaled to the sample. Exact for n <= zipline_gap_sample;
/// beyond, a selection over all n gaps cost more than the rest of the search at 10^6 rows.
/// Any threshold gives the exact answer (the check certifies it); this one sizes the subset.
inline constexpr std::size_t zipline_gap_sample = 4096;

/// The threshold from the sampled gaps (reordered).
template <class T>
T zipline_sampled_threshold(std::vector<T>& sample, std::size_t n, std::size_t want) {
  const std::size_t k = want * sample.size() / n;
  std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(k), sample.end(),
                   [](T a, T b) { return a > b; });
  return sample[k];
}

/// Each row's choice for barrier B (its latest point <= B; B >= L, so there is one) into
/// choice, and the number of rows left out of the subset (left_out(p)) whose choice is not in
/// [B - d, B], checked as B - pred_p(B) <= d in T. A left_out that is always false: the
/// choices only.
template <class T, class LeftOut>
std::size_t zipline_choose_and_check(rows_view<T> rows, zipline_window<T> w, LeftOut left_out,
                                     std::size_t* choice) {
  std::size_t uncovered = 0;
  const std::size_t n = rows.size();
  const bool far = zipline_prefetch_pays(rows);
  for (std::size_t p = 0; p < n; ++p) {
    if (far) zipline_prefetch_ahead(rows, p, w.barrier);
    const T* const v = rows.row_data(p);
    const std::size_t j = zipline_upper_bound_interpolated(v, rows.row_size(p), w.barrier) - 1;
    choice[p] = j;
    uncovered +=
        static_cast<std::size_t>(left_out(p) && zipline_spread(w.barrier, v[j]) > w.spread);
  }
  return uncovered;
}

/// The optimal window over the trimmed rows, and each row's choice, sweeping a subset of the
/// rows when it provably gives the same answer. Let d(B) = B - min_p pred_p(B) over barriers
/// B in [L, cut], and d_S the same over a subset S that holds the row defining L (so its
/// barriers are >= L); d_S <= d everywhere (T's subtraction is monotone, so this holds for
/// rounded spreads too). Let (d_S*, B_S*) be S's optimum with the smallest barrier. If every
/// row outside S has a point in [B_S* - d_S*, B_S*] (checked as B_S* - pred_p(B_S*) <= d_S*
/// in T, with the search that finds each row's choice), then d(B_S*) = d_S*, so d_S* is the
/// optimal spread; and a barrier B < B_S* with d(B) = d_S* would make S's latest barrier
/// B' <= B (same minimum over S) have d_S(B') <= d(B) = d_S*, an optimum of S before B_S*,
/// which cannot be. So S's answer is the input's, exactly.
/// Round 1 takes about zipline_subset_want(n) rows with the largest gap G_p (buf.gaps, from
/// validation): rows whose gaps are all at most d_S* always have a point in the window, so
/// the large-gap rows are the ones that can fail. If one fails, round 2 adds every row with
/// G_p > d_S* and every row whose trimmed range reaches its last point (last <= cut): a
/// superset whose rows left out each have a point within G_p <= d_S* <= d_S2* before any
/// barrier (the gap that follows it ends beyond the cut), so it needs no check.
/// On the generator's timestamps (rows step at different rates) round 1 passes: at n = 1000
/// it sweeps 22% of the rows, at 10^6 1.2%. Further rounds adding only the failing rows were
/// tried: the optimum of each subset moved to where another left-out row had a hole, and on
/// rows with irregular gaps they cost more than they saved. A row's trimmed range is searched
/// for only when a sweep reads it.
template <class T>
zipline_window<T> zipline_fast_search(rows_view<T> rows, zipline_buffers<T>& buf,
                                      zipline_trim_bounds<T> bounds, std::size_t* choice) {
  const std::size_t n = rows.size();
  const std::size_t want = zipline_subset_want(n);
  zipline_subset<T> subset(buf);
  const auto include = [&](std::size_t p) {
    const T* const v = rows.row_data(p);
    const zipline_row_range r =
        zipline_fast_trim_range(v, rows.row_size(p), bounds.front, bounds.cut);
    subset.add(v + r.first, r.end - r.first);
  };
  const auto none_left_out = [](std::size_t) { return false; };
  buf.subset_rounds = 0;
  if (n < 256 || want >= n) {
    for (std::size_t p = 0; p < n; ++p) include(p);
    const zipline_window<T> w = zipline_fast_sweep(subset.view(), buf);
    zipline_choose_and_check(rows, w, none_left_out, choice);
    return w;
  }
  const T* const gaps = buf.gaps.data();
  // Round 1: the rows whose gap exceeds the sampled threshold, and the row defining L.
  auto& sample = buf.zt;
  const std::size_t s = n < zipline_gap_sample ? n : zipline_gap_sample;
  sample.resize(s);
  for (std::size_t i = 0; i < s; ++i) sample[i] = gaps[i * (n / s)];
  const T theta = zipline_sampled_threshold(sample, n, want);
  const std::size_t front = bounds.front_row;
  const auto left_out = [&](std::size_t p) { return !(gaps[p] > theta || p == front); };
  for (std::size_t p = 0; p < n; ++p)
    if (!left_out(p)) include(p);
  zipline_window<T> w = zipline_fast_sweep(subset.view(), buf);
  buf.subset_rounds = 1;
  if (zipline_choose_and_check(rows, w, left_out, choice) == 0) return w;
  // Round 2, certified by construction (see above): round 1's rows and these.
  for (std::size_t p = 0; p < n; ++p)
    if (left_out(p) && (gaps[p] > w.spread || !(bounds.cut < rows[p].back()))) include(p);
  w = zipline_fast_sweep(subset.view(), buf);
  buf.subset_rounds = 2;
  zipline_choose_and_check(rows, w, none_left_out, choice);
  return w;
}

}  // namespace cadence::detail
