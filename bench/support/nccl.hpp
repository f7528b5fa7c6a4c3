// What the command-line benchmarks' NCCL backends share: the raw side, NCCL's own communicators
// over GPUs 0..ranks-1 (one rank per GPU, as nccl-tests runs), after checking there are enough
// GPUs. Not part of the library.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace cadence_bench {

/// ncclCommInitAll over GPUs 0..ranks-1, destroyed with this object (after every rank's
/// thread has ended, whether they succeeded or not). Throws std::runtime_error when there is
/// no GPU or fewer GPUs than ranks, or NCCL fails.
class nccl_raw_comms {
public:
  explicit nccl_raw_comms(int ranks) : comms_(static_cast<std::size_t>(ranks)) {
    int devices = 0;
    const cudaError_t probe = cudaGetDeviceCount(&devices);
    if (probe != cudaSuccess || devices < 1)
      throw std::runtime_error(std::string("the nccl backend needs a GPU: cudaGetDeviceCount: ") +
                               (probe != cudaSuccess ? cudaGetErrorString(probe) : "no device"));
    if (ranks > devices)
      throw std::runtime_error("--ranks " + std::to_string(ranks) + " needs as many GPUs; " +
                               std::to_string(devices) + " found (NCCL takes one rank per GPU)");
    std::vector<int> devs(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) devs[static_cast<std::size_t>(r)] = r;
    if (ncclCommInitAll(comms_.data(), ranks, devs.data()) != ncclSuccess) {
      comms_.clear();
      throw std::runtime_error("ncclCommInitAll failed");
    }
  }
  nccl_raw_comms(const nccl_raw_comms&) = delete;
  nccl_raw_comms& operator=(const nccl_raw_comms&) = delete;
  ~nccl_raw_comms() {
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }
  /// Rank r's communicator.
  ncclComm_t operator[](int r) const { return comms_[static_cast<std::size_t>(r)]; }

private:
  std::vector<ncclComm_t> comms_;
};

/// The roofline's copy rate on a GPU (bench/support/roofline.hpp): GB/s of a device-to-device
/// cudaMemcpy of 64 MiB on the current device, timed with events, the best of 5.
inline double measure_device_copy_gbps() {
  const std::size_t bytes = std::size_t{64} << 20;
  void *from = nullptr, *to = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  double best = 0;
  const bool ok = cudaMalloc(&from, bytes) == cudaSuccess && cudaMalloc(&to, bytes) == cudaSuccess &&
                  cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess &&
                  cudaMemset(from, 1, bytes) == cudaSuccess &&
                  cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess;
  for (int rep = 0; ok && rep < 5; ++rep) {
    float ms = 0;
    cudaEventRecord(start);
    cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    if (cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) break;
    if (ms > 0) best = std::max(best, static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  if (stop) cudaEventDestroy(stop);
  if (start) cudaEventDestroy(start);
  cudaFree(to);
  cudaFree(from);
  if (best <= 0) throw std::runtime_error("the device copy bandwidth could not be measured (cudaMemcpy failed)");
  return best;
}

}  // namespace cadence_bench
