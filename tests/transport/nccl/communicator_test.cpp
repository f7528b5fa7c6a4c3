// The real NCCL path (cadence::nccl). Without a GPU (CI) it checks that construction fails
// cleanly, naming cudaGetDeviceCount's error; on a GPU (bench/gpu/run.sh) it runs a one-rank
// communicator through every dtype and op with exact checks, and the abort-on-deadline path of
// an init whose second rank never joins NCCL; with two GPUs or more, the parameter server's
// NCCL form (headers on an in-process control communicator, bulk over NCCL).
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/communicator.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include "gpu_ranks.hpp"
#include "transport/conformance.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

static_assert(is_communicator_v<nccl_communicator>);

using cadence_conformance::expect_throw;
using cadence_nccl_gpu_test::too_few_gpus;

namespace {

// Host values of `t` for the small integers the checks use (exact in every dtype).
std::vector<unsigned char> encode(dtype t, const std::vector<int>& v) {
  std::vector<unsigned char> out(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    unsigned char* p = out.data() + i * dtype_size(t);
    const auto f = static_cast<float>(v[i]);
    switch (t) {
      case dtype::f32: std::memcpy(p, &f, 4); break;
      case dtype::f64: { const double d = v[i]; std::memcpy(p, &d, 8); break; }
      case dtype::i32: { const std::int32_t x = v[i]; std::memcpy(p, &x, 4); break; }
      case dtype::i64: { const std::int64_t x = v[i]; std::memcpy(p, &x, 8); break; }
      case dtype::u8: *p = static_cast<unsigned char>(v[i]); break;
      case dtype::bf16: {
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const auto h = static_cast<std::uint16_t>(bits >> 16);
        std::memcpy(p, &h, 2);
        break;
      }
      case dtype::f16: {  // small non-negative integers only
        std::uint16_t h = 0;
        if (v[i] != 0) {
          int e = 0;
          const float m = std::frexp(f, &e);
          h = static_cast<std::uint16_t>(((e - 1 + 15) << 10) |
                                         static_cast<int>(std::lround((m * 2.0f - 1.0f) * 1024.0f)));
        }
        std::memcpy(p, &h, 2);
        break;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the real NCCL communicator: fails cleanly without a GPU, computes exactly with one" *
          doctest::timeout(120)) {
  inproc_world boot(1);
  auto b = boot.join(0);
  if (cadence_nccl_gpu_test::gpus() < 1) {
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    MESSAGE("no GPU (cudaGetDeviceCount: " << std::string(cudaGetErrorString(rc)) << "): checking the clean failure");
    expect_throw<transport_error>(0, [&] { nccl_communicator c(real_nccl_api(), b, 0, {}, 10s); },
                                  {"construction on rank 0 of 1", "cudaGetDeviceCount failed", cudaGetErrorString(rc)});
    return;
  }
  nccl_communicator c(real_nccl_api(), b, 0, {}, 30s);
  CHECK(c.capabilities().device_buffers);
  const std::vector<int> values = {0, 1, 2, 3, 7, 15, 31, 64};
  for (dtype t : {dtype::f32, dtype::f64, dtype::i32, dtype::i64, dtype::u8, dtype::f16, dtype::bf16}) {
    for (reduce_op op : {reduce_op::sum, reduce_op::min, reduce_op::max}) {
      const auto host = encode(t, values);
      void* dev = nullptr;
      REQUIRE(cudaMalloc(&dev, host.size()) == cudaSuccess);
      REQUIRE(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess);
      c.allreduce(dev, values.size(), t, op, 30s);  // one rank: the result is the input
      std::vector<unsigned char> back(host.size());
      REQUIRE(cudaMemcpy(back.data(), dev, back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK_MESSAGE(back == host, "allreduce " << dtype_name(t) << " " << reduce_op_name(op));
      std::vector<unsigned char> zero(host.size(), 0);
      c.broadcast(dev, host.size(), 0, 30s);
      REQUIRE(cudaMemcpy(back.data(), dev, back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK_MESSAGE(back == host, "broadcast " << dtype_name(t));
      cudaFree(dev);
    }
  }
  CHECK_FALSE(c.failed());
}

TEST_CASE("a real NCCL init whose second rank never joins times out and aborts within the "
          "deadline" * doctest::timeout(120)) {
  if (too_few_gpus(1, "the init that times out")) return;
  // Rank 1 takes part in the bootstrap (the unique id broadcast and the readiness allgather,
  // done by hand here) but never calls NCCL, so rank 0's non-blocking init cannot complete.
  inproc_world boot(2);
  std::thread rank1([&] {
    auto b1 = boot.join(1);
    nccl_unique_id id{};
    b1.broadcast(&id, sizeof id, 0, 30s);
    const std::uint8_t ready = 1;
    std::uint8_t all[2] = {};
    allgather(b1, &ready, all, 1, 30s);
    std::this_thread::sleep_for(4s);  // alive past rank 0's deadline, never joining NCCL
  });
  auto b0 = boot.join(0);
  const auto t0 = steady::now();
  expect_throw<transport_error>(0, [&] { nccl_communicator c(real_nccl_api(), b0, 0, {}, 2s); },
                                {"deadline passed", "rank 1", "ncclCommAbort"});
  const double waited = std::chrono::duration<double>(steady::now() - t0).count();
  MESSAGE("init aborted after " << waited << " s (deadline 2 s)");
  CHECK(waited < 4.0);
  rank1.join();
}

TEST_CASE("the parameter server's NCCL form on real GPUs: a server and a worker, each on its "
          "own device" * doctest::timeout(120)) {
  if (too_few_gpus(2, "the parameter server over NCCL")) return;
  constexpr std::size_t model = 1 << 16;
  constexpr std::int64_t iterations = 20;
  std::vector<float> final_weights(model), expected(model, 1.0f);
  for (std::int64_t k = 1; k <= iterations; ++k)
    for (auto& w : expected) w -= 0.5f * static_cast<float>(k);
  // The update runs on the host through copies: a test has no kernel of its own (g++ only).
  struct host_sgd {
    void operator()(float* w, const float* g, std::size_t n, worker_id) const {
      std::vector<float> hw(n), hg(n);
      cudaMemcpy(hw.data(), w, n * sizeof(float), cudaMemcpyDeviceToHost);
      cudaMemcpy(hg.data(), g, n * sizeof(float), cudaMemcpyDeviceToHost);
      for (std::size_t i = 0; i < n; ++i) hw[i] -= 0.5f * hg[i];
      cudaMemcpy(w, hw.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    }
  };
  cadence_nccl_gpu_test::run_two_gpu_ranks([&](int r, inproc_communicator& control, nccl_communicator& bulk) {
    cudaSetDevice(r);
    float *a = nullptr, *b = nullptr;
    cudaMalloc(&a, model * sizeof(float));
    cudaMalloc(&b, model * sizeof(float));
    exchange::ps_options o;
    if (r == 0) {
      const std::vector<float> ones(model, 1.0f);
      cudaMemcpy(a, ones.data(), model * sizeof(float), cudaMemcpyHostToDevice);
      exchange::parameter_server<inproc_communicator, any_controller, float, host_sgd, nccl_communicator>
          server(control, bulk, model, a, b, make_controller("bsp", 1), host_sgd{}, o);
      server.run();
      cudaMemcpy(final_weights.data(), a, model * sizeof(float), cudaMemcpyDeviceToHost);
    } else {
      exchange::ps_worker<inproc_communicator, float, nccl_communicator> worker(control, bulk, model, o);
      worker.pull(b);
      for (std::int64_t k = 1; k <= iterations; ++k) {
        const std::vector<float> g(model, static_cast<float>(k));
        cudaMemcpy(a, g.data(), model * sizeof(float), cudaMemcpyHostToDevice);
        worker.push_pull(a, b);
      }
      worker.finish();
    }
    cudaFree(a);
    cudaFree(b);
  });
  CHECK(final_weights == expected);
}
