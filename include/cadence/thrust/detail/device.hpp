// What the Thrust ZipLine needs around its kernels: the index type and size limits, the
// execution policy, host/device copies, the workspace's buffers, and the translation of
// Thrust and CUDA failures into cadence::device_error naming the step that failed.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/thrust/config.hpp>
#include <cadence/thrust/workspace.hpp>

#include <thrust/execution_policy.h>
#include <thrust/system_error.h>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#  include <thrust/system/cuda/error.h>
#  include <thrust/system/cuda/execution_policy.h>
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
#  include <thrust/system/omp/execution_policy.h>
#else
#  include <thrust/system/cpp/execution_policy.h>
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>

namespace cadence::detail {

// 32-bit positions halve the memory traffic of the scans and the sort's payload; inputs are
// limited to 2^32 - 2 points in all (a million workers x 4000 predicted pushes).
using zl_index = std::uint32_t;
inline constexpr std::size_t zl_max_points = std::numeric_limits<zl_index>::max() - 1;

// The API name and the step running, so a device failure says what failed.
struct zl_context {
  const char* api;
  const char* step;
};

inline auto zl_policy(thrust_zipline_workspace& ws, device_stream stream) {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  // Temporary storage comes from the workspace's pool instead of cudaMalloc on every call.
  // nosync: the steps queue back to back; the reductions and the final copies synchronise.
  return ::thrust::cuda::par_nosync(temp_allocator{&thrust_zipline_workspace_access::pool(ws)})
      .on(stream);
#else
  // On the CPU systems malloc is cheap and the OpenMP sort allocates from many threads at
  // once, so Thrust's own temporary allocation is kept.
  (void)ws;
  (void)stream;
#  if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
  return ::thrust::omp::par;
#  else
  return ::thrust::cpp::par;
#  endif
#endif
}

// One copy of count U between host and device memory, to the device or back to the host (the
// CPU systems share one memory: a memcpy). A copy back waits for the stream, so the host can
// read what it got.
template <class U>
void zl_copy(U* dst, const U* src, std::size_t count, bool to_device, device_stream stream) {
  if (count == 0) return;
#if CADENCE_THRUST_CUDA
  cuda_check(cudaMemcpyAsync(dst, src, count * sizeof(U), to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                             stream),
             to_device ? "cudaMemcpyAsync host to device" : "cudaMemcpyAsync device to host");
  if (!to_device) cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#else
  (void)to_device;
  (void)stream;
  std::memcpy(dst, src, count * sizeof(U));
#endif
}

template <class U>
void zl_to_device(U* dst, const U* src, std::size_t count, device_stream stream) {
  zl_copy(dst, src, count, true, stream);
}

template <class U>
void zl_to_host(U* dst, const U* src, std::size_t count, device_stream stream) {
  zl_copy(dst, src, count, false, stream);
}

// Runs f, turning Thrust's and CUDA's failures into cadence::device_error with the API, the
// step and (under CUDA) the CUDA error name.
template <class F>
void zl_guard(zl_context& ctx, F&& f) {
  try {
    f();
  } catch (const ::thrust::system_error& e) {
    std::string msg = std::string("cadence::") + ctx.api + ": " + ctx.step + " failed: ";
#if CADENCE_THRUST_CUDA
    if (e.code().category() == ::thrust::cuda_category())
      msg += std::string(cudaGetErrorName(static_cast<cudaError_t>(e.code().value()))) + ": ";
#endif
    throw device_error(msg + e.what());
  }
#if CADENCE_THRUST_CUDA
  catch (const std::bad_alloc& e) {
    throw device_error(std::string("cadence::") + ctx.api + ": " + ctx.step +
                       " failed: out of device memory (" + e.what() + ")");
  }
#endif
}

// The workspace's buffers, by role.
enum zl_buffer : std::size_t {
  zl_values,
  zl_keys,
  zl_perm,
  zl_pos,
  zl_next,
  zl_last,
  zl_roff,
  zl_choice,
  zl_ikey,
  zl_ipoff,
  zl_rinst,
  zl_first_valid,
  zl_best,
  zl_history,
  zl_row_infos,
  zl_sub_range,
  zl_in_subset,
  zl_sample,
  zl_sub_rows,
  zl_sub_roff,
  zl_sub_values,
  zl_buffer_count,
};
static_assert(zl_buffer_count == thrust_zipline_workspace_access::buffer_count,
              "thrust_zipline_workspace holds one allocation per zl_buffer");

template <class U>
U* zl_buf(thrust_zipline_workspace& ws, zl_buffer b, std::size_t count) {
  return thrust_zipline_workspace_access::buffer(ws, b).get<U>(count);
}

inline void zl_check_size(std::size_t points, const char* api) {
  if (points > zl_max_points)
    throw zipline_input_error(std::string("cadence::") + api + ": " + std::to_string(points) +
                              " points in all, more than the " + std::to_string(zl_max_points) +
                              " the Thrust solver indexes");
}

inline void zl_check_matrix_shape(std::size_t n, std::size_t r, const char* api) {
  if (n == 0) throw zipline_input_error("cadence::zipline: no rows (n = 0)");
  if (r == 0) throw zipline_input_error("cadence::zipline: row 0 is empty");
  if (n > zl_max_points / r)
    throw zipline_input_error(std::string("cadence::") + api + ": " + std::to_string(n) + " x " +
                              std::to_string(r) + " points, more than the " +
                              std::to_string(zl_max_points) + " the Thrust solver indexes");
}

}  // namespace cadence::detail
