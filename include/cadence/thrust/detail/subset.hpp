// The Thrust ZipLine for one instance (docs/thrust.md#the-certified-subset): zipline_fast's
// trim and certified row subset (zipline/detail/fast_trim.hpp, fast_subset.hpp) in data-parallel
// steps, with the sort-and-sweep of solve.hpp run on the subset's points only.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/thrust/config.hpp>
#include <cadence/thrust/detail/device.hpp>
#include <cadence/thrust/detail/functors.hpp>
#include <cadence/thrust/detail/row_functors.hpp>
#include <cadence/thrust/detail/solve.hpp>
#include <cadence/thrust/workspace.hpp>
#include <cadence/zipline/detail/fast_subset.hpp>
#include <cadence/zipline/detail/fast_trim.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>

#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/scan.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>
#include <thrust/transform_scan.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace cadence::detail {

// The first subset's threshold from a strided sample of the rows' gaps, as zipline_fast
// (zipline_sampled_threshold): only the sample crosses to the host.
template <class T, class Policy>
T zl_gap_threshold(Policy& pol, thrust_zipline_workspace& ws, device_stream stream,
                   const zl_row_info<T>* info, zl_index n, zl_index want) {
  namespace th = ::thrust;
  const th::counting_iterator<zl_index> zero(0);
  const zl_index s = n < zipline_gap_sample ? n : static_cast<zl_index>(zipline_gap_sample);
  T* sample = zl_buf<T>(ws, zl_sample, s);
  th::transform(pol, zero, zero + s, sample, zl_sampled_gap<T>{info, n / s});
  std::vector<T> host(s);
  zl_to_host(host.data(), static_cast<const T*>(sample), s, stream);
  return zipline_sampled_threshold(host, n, want);
}

// Subsets with fewer points are swept serially on the CPU systems (zl_sweep_rows).
inline constexpr zl_index zl_serial_sweep_points = zl_index{1} << 16;

// Compacts the trimmed ranges of the rows flagged in `in` and sweeps them (solve.hpp): the
// subset's optimal spread and its smallest barrier.
template <class T, class Policy>
zl_candidate<T> zl_sweep_rows(Policy& pol, thrust_zipline_workspace& ws, device_stream stream,
                              zl_context& ctx, const T* vals, const zl_index* roff, zl_index n,
                              const zipline_trim_bounds<T>& bounds, const unsigned char* in) {
  namespace th = ::thrust;
  const th::counting_iterator<zl_index> zero(0);
  ctx.step = "compact the row subset";
  zl_index* sub_rows = zl_buf<zl_index>(ws, zl_sub_rows, n);
  const auto k = static_cast<zl_index>(th::copy_if(pol, zero, zero + n, in, sub_rows, zl_is_set{}) - sub_rows);
  zl_range* sub_range = zl_buf<zl_range>(ws, zl_sub_range, k);
  th::transform(pol, sub_rows, sub_rows + k, sub_range,
                zl_trim_range<T>{vals, roff, bounds.front, bounds.cut});
  zl_index* sub_roff = zl_buf<zl_index>(ws, zl_sub_roff, std::size_t{k} + 1);
  th::fill(pol, sub_roff, sub_roff + 1, zl_index(0));
  th::transform_inclusive_scan(pol, zero, zero + k, sub_roff + 1,
                               zl_trimmed_count{sub_range}, th::plus<zl_index>());
  zl_index total = 0;
  zl_to_host(&total, static_cast<const zl_index*>(sub_roff + k), 1, stream);
  T* sub_vals = zl_buf<T>(ws, zl_sub_values, total);
  const auto sweep = [&](auto& p) {
    th::for_each(p, zero, zero + k, zl_gather_row<T>{vals, sub_range, sub_roff, sub_vals});
    zl_candidate<T> best{};
    zl_solve(p, ws, stream, ctx, static_cast<const T*>(sub_vals), total,
             static_cast<const zl_index*>(sub_roff), k, zl_index(1), nullptr, nullptr, &best,
             static_cast<zl_index*>(nullptr));
    return best;
  };
#if !CADENCE_THRUST_CUDA
  // On the CPU systems a small subset is swept on the calling thread: its dozen steps would
  // each wake the OpenMP threads (with passive waits, about 2 ms in all at 10^5 rows, R = 15).
  if (total < zl_serial_sweep_points) {
    auto seq = ::thrust::seq;
    return sweep(seq);
  }
#endif
  return sweep(pol);
}

// One instance in device memory: vals (row after row), roff (n + 1 offsets into vals).
// 1. One pass over every row: the contract check, its largest gap and its ends; then their
//    summary. On a violation, on_invalid() runs (it throws the exact error, from the host's
//    validate).
// 2. zipline_fast's trim (zipline_fast_trim_bounds): each row keeps its latest point <= L
//    onward and its points up to a cut bounded from the largest gap, with no pass of its
//    own; a row's range is searched for only when a sweep reads it.
// 3. From n = 256 rows, the sweep runs on a subset of rows: those with the widest gaps (about
//    zipline_subset_want(n) of them) and the row defining L. If every row left out has its
//    choice in the subset's optimal window, the subset's answer is the input's; otherwise a
//    second subset, certified by construction, is swept (the proof: zipline_fast_search in
//    zipline/detail/fast_subset.hpp).
// 4. The choices are the searches of step 3's check (one per row). Returns the sweeps run
//    (1 or 2; tests).
template <class T, class Policy, class OnInvalid>
int zl_solve_one(Policy& pol, thrust_zipline_workspace& ws, device_stream stream, zl_context& ctx,
                 const T* vals, const zl_index* roff, zl_index n, zipline_result<T>& out,
                 OnInvalid&& on_invalid) {
  namespace th = ::thrust;
  const th::counting_iterator<zl_index> zero(0);
  const auto reject = [&] {
    on_invalid();
    throw zipline_input_error(std::string("cadence::") + ctx.api +
                              ": the input breaks the ZipLine contract");  // not reached
  };
  ctx.step = "row pass";
  zl_row_info<T>* info = zl_buf<zl_row_info<T>>(ws, zl_row_infos, n);
  th::transform(pol, zero, zero + n, info, zl_scan_row<T>{vals, roff});
  const zl_rows_summary<T> sum = th::transform_reduce(
      pol, zero, zero + n, zl_info_summary<T>{info},
      zl_rows_summary<T>{0, std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest(),
                         std::numeric_limits<T>::lowest(), std::numeric_limits<zl_index>::max(),
                         std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest()},
      zl_summary_merge<T>{});
  if (sum.bad != 0 || !zipline_span_ok(sum.lo, sum.hi)) reject();
  const zipline_trim_bounds<T> bounds = zipline_fast_trim_bounds(
      zipline_row_ends<T>{sum.max_front, sum.front_row, sum.min_back, sum.max_gap});

  ctx.step = "choose the row subset";
  unsigned char* in = zl_buf<unsigned char>(ws, zl_in_subset, n);
  const auto want = static_cast<zl_index>(zipline_subset_want(n));
  const bool subset = n >= 256 && want < n;
  if (subset) {
    const T theta = zl_gap_threshold(pol, ws, stream, static_cast<const zl_row_info<T>*>(info), n, want);
    th::transform(pol, zero, zero + n, in, zl_pick_wide_rows<T>{info, theta, sum.front_row});
  } else {
    th::fill(pol, in, in + n, static_cast<unsigned char>(1));
  }
  int sweeps = 1;
  zl_candidate<T> best = zl_sweep_rows(pol, ws, stream, ctx, vals, roff, n, bounds, in);
  zl_choice_check* choice = zl_buf<zl_choice_check>(ws, zl_choice, n);
  ctx.step = "choice search and cover check";
  // Rows are loaded ahead on the CPU systems once the input outgrows L2 (zipline_fast's rule;
  // there roff is host memory).
  zl_index ahead_rows = 0;
#if !CADENCE_THRUST_CUDA
  if (std::size_t{roff[n] - roff[0]} * sizeof(T) > zipline_prefetch_bytes) ahead_rows = n;
#endif
  th::transform(pol, zero, zero + n, choice,
                zl_choose_and_check<T>{vals, roff, subset ? in : nullptr, best.b, best.d,
                                       ahead_rows});
  if (subset && th::transform_reduce(pol, choice, choice + n, zl_uncovered_count{}, zl_index(0),
                                     th::plus<zl_index>()) != 0) {
    ctx.step = "choose the certified row subset";
    th::transform(pol, zero, zero + n, in, zl_pick_certified_rows<T>{info, in, best.d, bounds.cut});
    best = zl_sweep_rows(pol, ws, stream, ctx, vals, roff, n, bounds, in);
    sweeps = 2;
    ctx.step = "choice search";
    th::transform(pol, zero, zero + n, choice,
                  zl_choose_and_check<T>{vals, roff, nullptr, best.b, best.d, ahead_rows});
  }
  std::vector<zl_choice_check> host(n);
  ctx.step = "copy results to host";
  zl_to_host(host.data(), static_cast<const zl_choice_check*>(choice), n, stream);
  out.spread = best.d;
  out.barrier = best.b;
  out.choice.resize(n);
  for (std::size_t p = 0; p < n; ++p) out.choice[p] = host[p].choice;
  return sweeps;
}

// An n x r matrix in device memory; on a violation it is copied to the host so that
// cadence::validate reports the row and index exactly as for host input.
template <class T>
void zl_solve_device_matrix(const T* vals, std::size_t n, std::size_t r,
                            thrust_zipline_workspace& ws, zipline_result<T>& out,
                            device_stream stream, zl_context& ctx) {
  namespace th = ::thrust;
  auto pol = zl_policy(ws, stream);
  zl_guard(ctx, [&] {
    ctx.step = "row offsets";
    zl_index* roff = zl_buf<zl_index>(ws, zl_roff, n + 1);
    th::sequence(pol, roff, roff + n + 1, zl_index(0), static_cast<zl_index>(r));
    thrust_zipline_workspace_access::sweeps(ws) =
        zl_solve_one(pol, ws, stream, ctx, vals, static_cast<const zl_index*>(roff),
                     static_cast<zl_index>(n), out, [&] {
                       std::vector<T> host(n * r);
                       zl_to_host(host.data(), vals, host.size(), stream);
                       validate(rows_view<T>::matrix(host.data(), n, r));
                     });
  });
}

}  // namespace cadence::detail
