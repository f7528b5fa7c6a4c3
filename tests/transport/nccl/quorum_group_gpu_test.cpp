// quorum_group over the real NCCL (membership/nccl/group.hpp with real_nccl_api(), target
// cadence::nccl). CI builds and links it: the abort-and-rebuild path is compiled against the
// real NCCL and CUDA headers there. Without a GPU every case says so and returns (the fake-NCCL
// tests in quorum_group_test.cpp check the protocol). On one GPU: a quorum of one builds its
// communicator, averages a device buffer over it three times, and the group's communicator is
// aborted when the group goes. With two GPUs or more: two members, one lost before its NCCL
// all-reduce; the other's wait fails at the op timeout, it aborts, re-forms alone, rebuilds with
// a new unique id and commits the retried sync.
#include <cadence/membership/member.hpp>
#include <cadence/membership/nccl/group.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/communicator.hpp>

#include "membership/group_ranks.hpp"

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cadence_nccl_quorum_group_gpu_test {
namespace {

using namespace cadence_membership_test;

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

mb::member_options gpu_options() {
  mb::member_options o;
  o.timeouts = mb::timeouts::scaled(std::chrono::milliseconds(1000));  // op 4 s: NCCL init included
  o.join_timeout = std::chrono::seconds(60);
  return o;
}

// Member `rank` of `world` on GPU `rank`: `host` is its state (the membership's, in host
// memory); each sync copies it to the device, averages it over the group and copies it back.
// `lost_at`: the sync inside which it is lost (0: never). Ranks 0..n-1 on a thread each.
std::vector<group_result> gpu_members(int n, std::uint64_t syncs, std::uint64_t lost_at, int lost_rank) {
  inproc_world world(n);
  return run_ranks<group_result>(world, n, [&](int rank, inproc_communicator& c, group_result& out) {
    cuda_check(cudaSetDevice(rank), "cudaSetDevice");
    mb::member<inproc_communicator> m(c, gpu_options());
    std::vector<float> host(1024, 1.0f);
    m.add_state(host);
    float* dev = nullptr;
    cuda_check(cudaMalloc(&dev, host.size() * sizeof(float)), "cudaMalloc");
    auto g = mb::make_nccl_group(m, cadence::transport::real_nccl_api(), rank);
    m.start();
    while (m.committed() < syncs) {
      for (std::size_t i = 0; i < host.size(); ++i) host[i] += static_cast<float>((rank + 1) * (i % 5));
      const bool dies = rank == lost_rank && lost_at != 0 && m.committed() + 1 == lost_at;
      g->transact(
          [&] {
            if (dies) lose(world, rank, *g);
            cuda_check(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
            g->allreduce_average(dev, host.size(), dtype::f32);
            cuda_check(cudaMemcpy(host.data(), dev, host.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
          },
          {host});
    }
    finish(m, *g, out);
    g.reset();  // aborted, on this thread
    cudaFree(dev);
  });
}

TEST_CASE("nccl quorum_group (GPU): a quorum of one builds, averages on the device, and aborts when it goes" *
          doctest::timeout(120)) {
  if (gpu_count() < 1) {
    MESSAGE("no GPU: the real NCCL quorum_group is compiled and linked only");
    return;
  }
  const group_result r = gpu_members(1, 3, 0, -1).front();
  CHECK_MESSAGE(r.error == "", r.error);
  CHECK(r.committed == 3);
  CHECK(r.group.builds == 1);
  CHECK(r.data_size == 1);
  MESSAGE("NCCL build (one rank) took " << r.group.max_build_seconds << " s");
}

TEST_CASE("nccl quorum_group (GPU): a member lost before its NCCL all-reduce; the other aborts, rebuilds, retries" *
          doctest::timeout(180)) {
  if (gpu_count() < 2) {
    MESSAGE("fewer than two GPUs: skipped");
    return;
  }
  const auto res = gpu_members(2, 5, 3, 1);  // rank 1 lost inside sync 3
  CHECK(res[1].error == "killed");
  CHECK_MESSAGE(res[0].error == "", res[0].error);
  CHECK(res[0].committed == 5);
  CHECK(res[0].group.builds >= 2);
  CHECK(res[0].group.data_failures >= 1);
  CHECK(res[0].data_size == 1);
  MESSAGE("rank 0: last error: " << res[0].group.last_error << "; longest build " << res[0].group.max_build_seconds
                                 << " s");
}

}  // namespace
}  // namespace cadence_nccl_quorum_group_gpu_test
