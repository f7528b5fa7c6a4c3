/// \file
/// \ingroup thrust
/// Which Thrust device system this translation unit targets, and the small portable pieces
/// (host/device macro, stream handle, error translation) that let one source build for CUDA,
/// OpenMP and serial C++. Include a cadence/thrust header only from code built with cadence::thrust.
#pragma once

#include <cadence/core/detail/host_device.hpp>
#include <cadence/core/error.hpp>

#include <thrust/detail/config.h>

#include <string>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#  if !defined(__CUDACC__)
#    error "cadence/thrust: THRUST_DEVICE_SYSTEM is CUDA, so this file must be compiled by nvcc (a .cu source); use CADENCE_THRUST_DEVICE_SYSTEM=OMP or CPP for host compilers"
#  endif
#  include <cuda_runtime_api.h>
#  define CADENCE_THRUST_CUDA 1
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP || THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP
#  define CADENCE_THRUST_CUDA 0
#else
#  error "cadence/thrust: THRUST_DEVICE_SYSTEM must be CUDA, OMP or CPP (TBB is not supported)"
#endif

namespace cadence {
/// \addtogroup thrust
/// @{

/// The stream device work is queued on: a cudaStream_t under CUDA (nullptr: the default
/// stream), and an ignored placeholder on the CPU systems so the same call compiles everywhere.
#if CADENCE_THRUST_CUDA
using device_stream = cudaStream_t;
#else
using device_stream = void*;
#endif

/// The Thrust device system this translation unit was built for: "cuda", "omp" or "cpp".
inline const char* thrust_device_system_name() noexcept {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  return "cuda";
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
  return "omp";
#else
  return "cpp";
#endif
}

namespace detail {

#if CADENCE_THRUST_CUDA
/// Turns a CUDA status into cadence::device_error naming the operation and the CUDA error.
inline void cuda_check(cudaError_t status, const char* operation) {
  if (status == cudaSuccess) return;
  throw device_error(std::string("cadence::zipline_thrust: ") + operation + " failed: " +
                     cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}
#endif

}  // namespace detail
/// @}
}  // namespace cadence
