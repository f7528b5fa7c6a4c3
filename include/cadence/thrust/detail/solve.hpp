// The Thrust ZipLine's sort-and-sweep for one or many instances (the problem:
// docs/contract.md#5-zipline; the parallel form: docs/thrust.md): batches run it on all their
// points, a single instance on its certified row subset (subset.hpp).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/thrust/config.hpp>
#include <cadence/thrust/detail/device.hpp>
#include <cadence/thrust/detail/functors.hpp>
#include <cadence/thrust/workspace.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/gather.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/scatter.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace cadence::detail {

// vals: all points, row after row, instance after instance; roff: rows + 1 point offsets; for
// m > 1 instances, ipoff (m + 1 point offsets) and rinst (instance of each row) on the device.
// Writes one best candidate per instance to best_host and, unless choice_host is null, the
// choices (local indices, row after row) to choice_host.
template <class T, class Policy>
void zl_solve(Policy& pol, thrust_zipline_workspace& ws, device_stream stream, zl_context& ctx,
              const T* vals, zl_index n_points, const zl_index* roff, zl_index rows, zl_index m,
              const zl_index* ipoff, const zl_index* rinst, zl_candidate<T>* best_host,
              zl_index* choice_host) {
  namespace th = ::thrust;
  const th::counting_iterator<zl_index> zero(0);
  T* keys = zl_buf<T>(ws, zl_keys, n_points);
  zl_index* perm = zl_buf<zl_index>(ws, zl_perm, n_points);
  zl_index* pos = zl_buf<zl_index>(ws, zl_pos, n_points);
  zl_index* next = zl_buf<zl_index>(ws, zl_next, n_points);
  unsigned char* last = zl_buf<unsigned char>(ws, zl_last, n_points);
  zl_index* choice = choice_host ? zl_buf<zl_index>(ws, zl_choice, rows) : nullptr;
  zl_index* ikey = nullptr;
  zl_index* first_valid = nullptr;
  zl_candidate<T>* best = nullptr;
  if (m > 1) {
    ikey = zl_buf<zl_index>(ws, zl_ikey, n_points);
    first_valid = zl_buf<zl_index>(ws, zl_first_valid, m);
    best = zl_buf<zl_candidate<T>>(ws, zl_best, m);
  }

  // 1. Sort all points by time (stable: equal times keep row order), then by instance.
  ctx.step = "sort by time";
  th::copy(pol, vals, vals + n_points, keys);
  th::sequence(pol, perm, perm + n_points);
  th::stable_sort_by_key(pol, keys, keys + n_points, perm);
  if (m > 1) {
    ctx.step = "sort by instance";
    th::transform(pol, zero, zero + n_points, ikey, zl_instance_of{perm, ipoff, m});
    th::stable_sort_by_key(pol, ikey, ikey + n_points, perm);
    th::gather(pol, perm, perm + n_points, vals, keys);
  }

  // 2. Next position of the same row, and its prefix maximum.
  ctx.step = "next position of each row";
  th::scatter(pol, zero, zero + n_points, perm, pos);
  th::fill(pol, last, last + n_points, static_cast<unsigned char>(0));
  th::for_each(pol, zero, zero + rows, zl_mark_row_end{roff, last});
  th::transform(pol, zero, zero + n_points, next,
                zl_next_position{perm, pos, last, ikey, ipoff, n_points});
  zl_index single_first_valid = 0;
  if (m > 1) {
    th::reduce_by_key(pol, rinst, rinst + rows,
                      th::make_transform_iterator(zero, zl_first_position{pos, roff}),
                      th::make_discard_iterator(), first_valid, zl_equal{}, zl_max{});
  } else {
    single_first_valid = th::transform_reduce(pol, zero, zero + rows, zl_first_position{pos, roff},
                                              zl_index(0), zl_max{});
  }
  ctx.step = "prefix maximum";
  th::inclusive_scan(pol, next, next + n_points, next, zl_max{});

  // 3. Tightest window start for every end position (reusing pos).
  ctx.step = "window starts";
  zl_index* start = pos;
  th::fill(pol, start, start + n_points, zl_index(0));
  th::for_each(pol, zero, zero + n_points, zl_mark_window_start{next, start});
  th::inclusive_scan(pol, start, start + n_points, start, zl_max{});

  // 4. Arg-min over (spread, barrier), then each row's choice.
  ctx.step = "arg-min reduce";
  const zl_window_candidate<T> cand{keys, start, ikey, first_valid, single_first_valid};
  T single_barrier{};
  if (m > 1) {
    th::reduce_by_key(pol, ikey, ikey + n_points, th::make_transform_iterator(zero, cand),
                      th::make_discard_iterator(), best, zl_equal{}, zl_candidate_min<T>{});
  } else {
    best_host[0] = th::transform_reduce(pol, zero + single_first_valid, zero + n_points, cand,
                                        zl_candidate<T>{T(), T(), 0}, zl_candidate_min<T>{});
    single_barrier = best_host[0].b;
  }
  if (m > 1) zl_to_host(best_host, best, m, stream);
  if (choice_host == nullptr) return;
  ctx.step = "choice search";
  th::transform(pol, zero, zero + rows, choice,
                zl_choose<T>{vals, roff, rinst, best, single_barrier});
  ctx.step = "copy results to host";
  zl_to_host(choice_host, choice, rows, stream);
}

template <class T>
void zl_store(const zl_candidate<T>& c, const zl_index* choice, std::size_t rows,
              zipline_result<T>& out) {
  out.spread = c.d;
  out.barrier = c.b;
  out.choice.assign(choice, choice + rows);
}

}  // namespace cadence::detail
