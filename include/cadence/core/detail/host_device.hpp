// CADENCE_HOST_DEVICE marks small functions that CUDA device code calls too (the Thrust
// ZipLine's functors and the row searches they share with the CPU variants): __host__
// __device__ under nvcc, nothing for g++ and clang.
#pragma once

#if defined(__CUDACC__)
#  define CADENCE_HOST_DEVICE __host__ __device__
#else
#  define CADENCE_HOST_DEVICE
#endif
