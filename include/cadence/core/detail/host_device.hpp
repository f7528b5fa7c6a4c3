// CADENCE_HOST_DEVICE marks small functions that CUDA device code calls too (the Thrust
// ZipLine's functors and the row searches they share with the CPU variants): __host__
// __device__ under nvcc, nothing for g++ and clang.
#pragma once

#if defined(__CUDACC__)
#  define CADENCE_HOST_DEVICE __host__ __device__
#else
#  define CADENCE_HOST_DEVICE
#endif

// CADENCE_HOST_DEVICE, and inlined wherever the compiler allows it: for a per-row loop body
// shared by a CPU pass and a device functor (g++ kept zipline_row_increasing out of line,
// which cost 5% at n = 1000).
#if defined(__CUDACC__)
#  define CADENCE_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#  define CADENCE_HOST_DEVICE_INLINE __attribute__((always_inline)) inline
#else
#  define CADENCE_HOST_DEVICE_INLINE inline
#endif
