// The collective adapters' NCCL form on real GPUs (cadence::nccl; run by bench/gpu/run.sh).
// Without a GPU every case says so and returns (CI builds and links it; the fake NCCL tests in
// exchange_test.cpp check the logic there). On one GPU: the device helpers through the real
// table (ncclAvg, PreMulSum with a host scalar, cudaMemcpyAsync, cudaMemsetAsync, cudaMalloc),
// and every adapter on a one-rank communicator on a stream of the caller's, where a merge must
// give back the inputs exactly; with two GPUs or more, two ranks merging with each rule.
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/communicator.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include "gpu_ranks.hpp"

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;

using cadence_nccl_gpu_test::too_few_gpus;

namespace {

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// A device copy of a host vector, freed at scope exit. Throws (rank threads cannot REQUIRE).
template <class T>
struct device_vector {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_vector(const std::vector<T>& host) : n(host.size()) {
    cuda_check(cudaMalloc(&p, n * sizeof(T) + 1), "cudaMalloc");
    cuda_check(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~device_vector() { cudaFree(p); }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  std::vector<T> host() const {
    std::vector<T> out(n);
    cuda_check(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }
};

template <class T>
std::vector<T> iota_values(std::size_t n, int seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(static_cast<int>((i * 7 + static_cast<std::size_t>(seed) * 13) % 31) - 15);
  return v;
}

}  // namespace

TEST_CASE("the adapters' device helpers on a real GPU: ncclAvg, PreMulSum, async copies and "
          "device memory through the real table" * doctest::timeout(120)) {
  if (too_few_gpus(1, "the adapters' device helpers")) return;
  cadence_nccl_gpu_test::one_gpu_rank one;
  nccl_communicator& c = one.c;
  void* s = c.stream();
  const auto x = iota_values<float>(1000, 1);
  device_vector<float> d(x);
  c.allreduce_average(d.p, d.n, dtype::f32, s, 30s);  // one rank: the mean is the input
  CHECK(d.host() == x);
  c.allreduce_scaled(d.p, d.p, d.n, dtype::f32, 0.5, s, 30s);
  std::vector<float> halved(x);
  for (auto& v : halved) v *= 0.5f;
  CHECK(d.host() == halved);
  const auto y = iota_values<double>(257, 2);
  device_vector<double> from(y), to(std::vector<double>(257, 9.0));
  c.allreduce_scaled(from.p, to.p, y.size(), dtype::f64, -3.0, s, 30s);  // out of place
  std::vector<double> times3(y);
  for (auto& v : times3) v *= -3.0;
  CHECK(to.host() == times3);
  CHECK(from.host() == y);
  void* block = c.device_alloc(257 * sizeof(double));
  REQUIRE(block != nullptr);
  c.copy_async(block, from.p, 257 * sizeof(double), s);
  c.copy_async(to.p, block, 257 * sizeof(double), s);
  c.synchronize(s, 30s);
  CHECK(to.host() == y);
  c.zero_async(to.p, 257 * sizeof(double), s);
  c.synchronize(s, 30s);
  CHECK(to.host() == std::vector<double>(257, 0.0));
  c.device_free(block);
  CHECK_FALSE(c.failed());
}

TEST_CASE("every adapter on one real GPU, on the caller's stream: fused buckets, views, "
          "periodic and elastic merges give back the inputs exactly" * doctest::timeout(120)) {
  if (too_few_gpus(1, "the adapters on a GPU")) return;
  cadence_nccl_gpu_test::one_gpu_rank one;
  nccl_communicator& c = one.c;
  inproc_communicator& control = one.control;
  cudaStream_t mine = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
  {
    bucketed_allreducer_options o;
    o.bucket_bytes = 4096;  // some fused buckets, some tensors alone
    o.stream = mine;
    o.timeout = 30s;
    bucketed_allreducer<nccl_communicator> red(c, o);
    const std::size_t sizes[] = {1, 3, 17, 1000, 2, 5000, 7, 0, 255};
    std::vector<std::vector<float>> host;
    std::vector<std::unique_ptr<device_vector<float>>> dev;
    int seed = 0;
    for (std::size_t n : sizes) {
      host.push_back(iota_values<float>(n, ++seed));
      dev.push_back(std::make_unique<device_vector<float>>(host.back()));
      red.add(dev.back()->p, n);
    }
    double* view = red.add_view<double>(100);
    const auto v = iota_values<double>(100, 40);
    REQUIRE(cudaMemcpy(view, v.data(), 100 * sizeof(double), cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(red.buckets() < red.tensors());  // 4 buckets and 1 view bucket for 9 tensors
    red.average();
    red.average();
    for (std::size_t i = 0; i < host.size(); ++i) CHECK_MESSAGE(dev[i]->host() == host[i], "tensor " << i);
    std::vector<double> back(100);
    REQUIRE(cudaMemcpy(back.data(), view, 100 * sizeof(double), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(back == v);
  }
  {
    periodic_averager<nccl_communicator> avg(c, 2, 30s, mine);
    const auto x = iota_values<float>(333, 3);
    device_vector<float> d(x);
    for (int k = 0; k < 4; ++k)
      if (avg.step_done()) avg.sync(tensor_ref(d.p, d.n));
    CHECK(avg.barriers() == 2);
    CHECK(d.host() == x);
  }
  for (merge_rule rule : {merge_rule::average, merge_rule::step_weighted, merge_rule::summed_deltas}) {
    CAPTURE(merge_rule_name(rule));
    elastic_averager_options o;
    o.merge = rule;
    o.stream = mine;
    o.timeout = 30s;
    elastic_averager<inproc_communicator, nccl_communicator> avg(control, c, "elastic:4", o);
    const auto x = iota_values<double>(1024, 5);
    device_vector<double> d(x);
    const auto y = iota_values<float>(77, 6);
    device_vector<float> e(y);
    int syncs = 0;
    for (int k = 0; k < 20; ++k)
      if (avg.step_done(100)) {
        avg.sync(tensor_ref(d.p, d.n), tensor_ref(e.p, e.n));
        ++syncs;
      }
    CHECK(syncs == 1 + 4);  // one warm-up barrier, then every 4 local steps
    CHECK(d.host() == x);
    CHECK(e.host() == y);
  }
  cudaStreamDestroy(mine);
  CHECK_FALSE(c.failed());
}

TEST_CASE("two ranks on two real GPUs merge exactly with every rule" * doctest::timeout(120)) {
  if (too_few_gpus(2, "the two-rank merges")) return;
  std::vector<double> merged[2][3];
  cadence_nccl_gpu_test::run_two_gpu_ranks([&](int r, inproc_communicator& control, nccl_communicator& bulk) {
    int i = 0;
    for (merge_rule rule : {merge_rule::average, merge_rule::step_weighted, merge_rule::summed_deltas}) {
      elastic_averager_options o;
      o.merge = rule;
      o.timeout = 30s;
      elastic_averager<inproc_communicator, nccl_communicator> avg(control, bulk, "elastic:1", o);
      device_vector<double> d(std::vector<double>(64, 2.0 * r));  // 0 and 2
      avg.step_done(100);
      avg.sync(tensor_ref(d.p, d.n));  // every rule averages first: 1
      std::vector<double> next(64, 1.0 + 4.0 * r);  // deltas 0 and 4
      cuda_check(cudaMemcpy(d.p, next.data(), 64 * sizeof(double), cudaMemcpyHostToDevice), "cudaMemcpy");
      avg.step_done(100);
      avg.sync(tensor_ref(d.p, d.n));
      merged[r][i++] = d.host();
    }
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(merged[r][0] == std::vector<double>(64, 3.0));  // (1 + 5) / 2
    CHECK(merged[r][1] == std::vector<double>(64, 3.0));  // one step each: weights 1/2
    CHECK(merged[r][2] == std::vector<double>(64, 5.0));  // 1 + 0 + 4
  }
}
