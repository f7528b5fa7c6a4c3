/// \file
/// \ingroup thrust
/// Data-parallel ZipLine on Thrust (sort, scan, search, reduce): one source that runs on the
/// device system of the including translation unit (CUDA, OpenMP or serial C++) and returns
/// exactly zipline_brute_force's answer. Not part of the umbrella header; link cadence::thrust.
/// Every entry point takes its input, then the workspace, then the result, then the stream.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/thrust/config.hpp>
#include <cadence/thrust/detail/device.hpp>
#include <cadence/thrust/detail/functors.hpp>
#include <cadence/thrust/detail/predict.hpp>
#include <cadence/thrust/detail/solve.hpp>
#include <cadence/thrust/detail/subset.hpp>
#include <cadence/thrust/workspace.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>

#include <thrust/sequence.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace cadence {
/// \addtogroup thrust
/// @{

namespace detail {
/// All of a separate() view's points, row after row, in staging.
template <class T>
void zl_gather_rows(rows_view<T> rows, std::vector<T>& staging) {
  staging.resize(rows.total());
  for (std::size_t p = 0; p < rows.size(); ++p)
    std::copy(rows[p].begin(), rows[p].end(), staging.begin() + static_cast<std::ptrdiff_t>(rows.row_begin(p)));
}

/// Queues the copy of all of rows' points, row after row, to dst. A separate() view is first
/// gathered into staging, so that one transfer moves it (staging must outlive the copy).
template <class T>
void zl_rows_to_device(T* dst, rows_view<T> rows, std::vector<T>& staging, device_stream stream) {
  const T* src = rows.values();
  if (!rows.is_contiguous()) {
    zl_gather_rows(rows, staging);
    src = staging.data();
  }
  zl_to_device(dst, src, rows.total(), stream);
}
}  // namespace detail

/// ZipLine on the Thrust device system, input on the host (matrix, ragged or separate rows). Returns
/// exactly zipline_brute_force(rows). Input that breaks the contract throws
/// zipline_input_error naming the row and index (checked in the solve's first pass, then
/// reported by validate); device failures throw device_error. Reuses ws's memory; work is
/// queued on stream (CUDA); the answer is written to out. On the CPU systems contiguous rows
/// are read in place, not copied.
template <class T>
void zipline_thrust(rows_view<T> rows, thrust_zipline_workspace& ws, zipline_result<T>& out,
                    device_stream stream = nullptr) {
  using detail::zl_index;
  if (rows.size() == 0) validate(rows);  // throws: no rows
  detail::zl_check_size(rows.total(), "zipline_thrust");
  const std::size_t n = rows.size();
  detail::zl_context ctx{"zipline_thrust", "copy input to device"};
  auto pol = detail::zl_policy(ws, stream);
  detail::zl_guard(ctx, [&] {
    std::vector<T> host_vals;  // these outlive the asynchronous copies (the solve synchronises)
    std::vector<zl_index> host_roff;
#if CADENCE_THRUST_CUDA
    T* dev_vals = detail::zl_buf<T>(ws, detail::zl_values, rows.total());
    detail::zl_rows_to_device(dev_vals, rows, host_vals, stream);
    const T* vals = dev_vals;
#else
    // Device memory is host memory: read contiguous rows where they are.
    const T* vals = rows.values();
    if (!rows.is_contiguous()) {
      detail::zl_gather_rows(rows, host_vals);
      vals = host_vals.data();
    }
#endif
    zl_index* roff = detail::zl_buf<zl_index>(ws, detail::zl_roff, n + 1);
    if (rows.is_matrix()) {
      ::thrust::sequence(pol, roff, roff + n + 1, zl_index(0), static_cast<zl_index>(rows.width()));
    } else {
      host_roff.resize(n + 1);
      for (std::size_t p = 0; p <= n; ++p)
        host_roff[p] = static_cast<zl_index>(rows.offsets()[p] - rows.offsets()[0]);
      detail::zl_to_device(roff, host_roff.data(), n + 1, stream);
    }
    detail::thrust_zipline_workspace_access::sweeps(ws) = detail::zl_solve_one(
        pol, ws, stream, ctx, vals, static_cast<const zl_index*>(roff), static_cast<zl_index>(n),
        out, [&] { validate(rows); });
  });
}

/// Convenience form: solves rows with a fresh workspace on the default stream.
template <class T>
zipline_result<T> zipline_thrust(rows_view<T> rows) {
  thrust_zipline_workspace ws;
  zipline_result<T> out;
  zipline_thrust(rows, ws, out);
  return out;
}

/// ZipLine on an n x r matrix already in device memory (row p at device_values[p*r ..]); on
/// the CPU systems "device memory" is ordinary memory. Validated on the device; a violation is
/// reported as cadence::validate would report it. Workspace ws, result out and stream as for
/// zipline_thrust.
template <class T>
void zipline_thrust_device(const T* device_values, std::size_t n, std::size_t r,
                           thrust_zipline_workspace& ws, zipline_result<T>& out,
                           device_stream stream = nullptr) {
  detail::zl_check_matrix_shape(n, r, "zipline_thrust_device");
  detail::zl_context ctx{"zipline_thrust_device", "input check"};
  detail::zl_solve_device_matrix(device_values, n, r, ws, out, stream, ctx);
}

/// Solves count independent instances in one pass (one segmented sort by instance, time, row);
/// out[k] equals zipline_thrust(instances[k]). Pays off for many small instances, where a
/// single solve is dominated by launch and transfer latency. Workspace ws and stream as for
/// zipline_thrust.
template <class T>
void zipline_thrust_batched(const rows_view<T>* instances, std::size_t count,
                            thrust_zipline_workspace& ws, std::vector<zipline_result<T>>& out,
                            device_stream stream = nullptr) {
  using detail::zl_index;
  out.resize(count);
  if (count == 0) return;
  std::size_t n_points = 0, rows = 0;
  for (std::size_t k = 0; k < count; ++k) {
    try {
      validate(instances[k]);
    } catch (const zipline_input_error& e) {
      throw zipline_input_error(std::string("instance ") + std::to_string(k) + ": " + e.what());
    }
    n_points += instances[k].total();
    rows += instances[k].size();
  }
  detail::zl_check_size(n_points, "zipline_thrust_batched");
  std::vector<zl_index> roff(rows + 1), ipoff(count + 1), rinst(rows);
  {
    std::size_t r = 0, pt = 0;
    for (std::size_t k = 0; k < count; ++k) {
      ipoff[k] = static_cast<zl_index>(pt);
      const auto& inst = instances[k];
      for (std::size_t p = 0; p < inst.size(); ++p, ++r) {
        roff[r] = static_cast<zl_index>(pt + inst.row_begin(p));
        rinst[r] = static_cast<zl_index>(k);
      }
      pt += inst.total();
    }
    roff[rows] = static_cast<zl_index>(pt);
    ipoff[count] = static_cast<zl_index>(pt);
  }
  detail::zl_context ctx{"zipline_thrust_batched", "copy input to device"};
  auto pol = detail::zl_policy(ws, stream);
  detail::zl_guard(ctx, [&] {
    T* vals = detail::zl_buf<T>(ws, detail::zl_values, n_points);
    zl_index* d_roff = detail::zl_buf<zl_index>(ws, detail::zl_roff, rows + 1);
    zl_index* d_ipoff = detail::zl_buf<zl_index>(ws, detail::zl_ipoff, count + 1);
    zl_index* d_rinst = detail::zl_buf<zl_index>(ws, detail::zl_rinst, rows);
    std::vector<T> host_vals;  // separate() instances, gathered (outlives the copies)
    std::size_t staged = 0;
    for (std::size_t k = 0; k < count; ++k)
      if (!instances[k].is_contiguous()) staged += instances[k].total();
    host_vals.reserve(staged);  // no reallocation while earlier copies are in flight
    for (std::size_t k = 0; k < count; ++k) {
      const auto& inst = instances[k];
      const T* src = inst.values();
      if (!inst.is_contiguous()) {
        const std::size_t at = host_vals.size();
        for (std::size_t p = 0; p < inst.size(); ++p)
          host_vals.insert(host_vals.end(), inst[p].begin(), inst[p].end());
        src = host_vals.data() + at;
      }
      detail::zl_to_device(vals + ipoff[k], src, inst.total(), stream);
    }
    detail::zl_to_device(d_roff, roff.data(), roff.size(), stream);
    detail::zl_to_device(d_ipoff, ipoff.data(), ipoff.size(), stream);
    detail::zl_to_device(d_rinst, rinst.data(), rinst.size(), stream);
    std::vector<zl_index> choice(rows);
    std::vector<detail::zl_candidate<T>> best(count);
    detail::zl_solve(pol, ws, stream, ctx, static_cast<const T*>(vals),
                     static_cast<zl_index>(n_points), d_roff, static_cast<zl_index>(rows),
                     static_cast<zl_index>(count), count > 1 ? d_ipoff : nullptr,
                     count > 1 ? d_rinst : nullptr, best.data(), choice.data());
    std::size_t r = 0;
    for (std::size_t k = 0; k < count; ++k) {
      detail::zl_store(best[k], choice.data() + r, instances[k].size(), out[k]);
      r += instances[k].size();
    }
  });
}

/// Convenience form of the batched solve: the count instances with a fresh workspace on the
/// default stream.
template <class T>
std::vector<zipline_result<T>> zipline_thrust_batched(const rows_view<T>* instances,
                                                      std::size_t count) {
  thrust_zipline_workspace ws;
  std::vector<zipline_result<T>> out;
  zipline_thrust_batched(instances, count, ws, out);
  return out;
}

/// ZipLine over predictions made on the device by the paper's last-interval predictor, so
/// only 2n timestamps cross the bus instead of n * r: worker p's next r pushes are
/// e[i] = last_push[p] + i * (last_push[p] - previous_push[p]), i = 1..r, and, as on the host,
/// a prediction not above the one before it (last_push[p] for the first; equal pushes give
/// a zero interval) becomes the next representable value above that one. The result equals
/// cadence::last_interval's predictions solved by zipline_thrust; choice[p] = i - 1.
/// Workspace ws, result out and stream as for zipline_thrust.
template <class T>
void zipline_thrust_predicted(const T* previous_push, const T* last_push, std::size_t n,
                              std::size_t r, thrust_zipline_workspace& ws, zipline_result<T>& out,
                              device_stream stream = nullptr) {
  const char* api = "zipline_thrust_predicted";
  detail::zl_check_matrix_shape(n, r, api);
  for (std::size_t p = 0; p < n; ++p) {
    const T a = previous_push[p], b = last_push[p];
    if (!detail::zl_history_predictable(a, b, r))
      throw zipline_input_error(std::string("cadence::") + api + ": worker " + std::to_string(p) +
                                ": pushes " + detail::timestamp_to_string(a) + " then " +
                                detail::timestamp_to_string(b) + " do not predict " +
                                std::to_string(r) + " increasing, representable push times");
  }
  detail::zl_context ctx{api, "copy push history to device"};
  auto pol = detail::zl_policy(ws, stream);
  T* vals = nullptr;
  detail::zl_guard(ctx, [&] {
    T* hist = detail::zl_buf<T>(ws, detail::zl_history, 2 * n);
    detail::zl_to_device(hist, previous_push, n, stream);
    detail::zl_to_device(hist + n, last_push, n, stream);
    ctx.step = "predict";
    vals = detail::zl_buf<T>(ws, detail::zl_values, n * r);
    detail::zl_predict_last_interval(pol, static_cast<const T*>(hist),
                                     static_cast<const T*>(hist + n), n, r, vals);
  });
  detail::zl_solve_device_matrix(static_cast<const T*>(vals), n, r, ws, out, stream, ctx);
}

/// Convenience form of the predicted solve: the r pushes after previous_push and last_push of
/// n workers, with a fresh workspace on the default stream.
template <class T>
zipline_result<T> zipline_thrust_predicted(const T* previous_push, const T* last_push,
                                           std::size_t n, std::size_t r) {
  thrust_zipline_workspace ws;
  zipline_result<T> out;
  zipline_thrust_predicted(previous_push, last_push, n, r, ws, out);
  return out;
}

/// @}
}  // namespace cadence
