// Test support for the tests on the real NCCL (communicator_test.cpp, exchange_gpu_test.cpp):
// how many GPUs there are, a test's skip when it has too few, a one-rank world on the first GPU,
// and two ranks as threads, each on its own GPU.
#pragma once

#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/communicator.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <exception>
#include <string>
#include <thread>

namespace cadence_nccl_gpu_test {

/// The GPUs CUDA sees (0 where cudaGetDeviceCount fails: no driver or no device).
inline int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/// Whether there are fewer than `need` GPUs, in which case the test skips `what` and says so
/// (NCCL refuses two ranks of one communicator on one device).
inline bool too_few_gpus(int need, const std::string& what) {
  if (gpus() >= need) return false;
  if (need == 1)
    MESSAGE("no GPU: " << what << " skipped");
  else
    MESSAGE("fewer than " << need << " GPUs: " << what << " skipped (NCCL refuses two ranks on one GPU)");
  return true;
}

/// A world of one rank: an in-process control communicator and a real NCCL one over it.
struct one_gpu_rank {
  cadence::transport::inproc_world boot{1};
  cadence::transport::inproc_communicator control = boot.join(0);
  cadence::transport::nccl_communicator c{cadence::transport::real_nccl_api(), control, 0, {},
                                          std::chrono::seconds(30)};
};

/// body(r, control, bulk) on ranks 0 and 1 of a world of two, rank 1 on a thread of its own:
/// an in-process control communicator and a real NCCL one over it. An exception escaping a
/// rank (rank threads cannot REQUIRE) fails the test with its message.
template <class Body>
void run_two_gpu_ranks(Body&& body) {
  cadence::transport::inproc_world world(2);
  std::string errors[2];
  auto rank = [&](int r) {
    try {
      auto control = world.join(r);
      cadence::transport::nccl_communicator bulk(cadence::transport::real_nccl_api(), control, r, {},
                                                 std::chrono::seconds(60));
      body(r, control, bulk);
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread t1(rank, 1);
  rank(0);
  t1.join();
  CHECK_MESSAGE(errors[0].empty(), errors[0]);
  CHECK_MESSAGE(errors[1].empty(), errors[1]);
}

}  // namespace cadence_nccl_gpu_test
