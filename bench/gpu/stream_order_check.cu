// The NCCL adapters' stream ordering on a real GPU: a slow kernel writes the gradients on the
// caller's stream (the legacy default stream, or a stream of the caller's), then the adapter runs
// at once. The adapter's stream must wait for that kernel; the check reads the tensors back on a
// stream of its own that waits for nothing, right after the adapter returns: a missing wait
// shows as the old values (the kernel is still spinning), not the written ones. A control run
// skips the wait (an all-reduce enqueued on the communicator's stream directly) to show that the
// probe sees the difference on this GPU. One rank (an in-process bootstrap), one GPU.
//
//   nvcc -std=c++17 -O2 -arch=sm_90 -Iinclude bench/gpu/stream_order_check.cu -lnccl -o stream_order_check
//   ./stream_order_check        # prints one line per case and "stream order check: all ok"
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/communicator.hpp>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace cadence;
using namespace cadence::transport;
using namespace cadence::exchange;

// Every thread spins for `cycles` clock cycles, then writes `v`: the write lands long after the
// launch returns.
__global__ void slow_fill(float* p, std::size_t n, float v, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "stream order check: %s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}

long long spin_cycles() {
  int khz = 0;
  check_cuda(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0), "cudaDeviceGetAttribute");
  return static_cast<long long>(khz) * 200;  // about 200 ms
}

struct device_tensor {
  float* p = nullptr;
  std::size_t n = 0;
  explicit device_tensor(std::size_t count) : n(count) {
    check_cuda(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc");
    check_cuda(cudaMemset(p, 0, n * sizeof(float)), "cudaMemset");
  }
  ~device_tensor() { cudaFree(p); }
  device_tensor(const device_tensor&) = delete;
  device_tensor& operator=(const device_tensor&) = delete;
};

// The values as they are now, read on a stream that waits for nothing (not even the legacy
// default stream: it is non-blocking).
bool all_equal_now(const device_tensor& t, float v, cudaStream_t probe) {
  std::vector<float> host(t.n, -1.0f);
  check_cuda(cudaMemcpyAsync(host.data(), t.p, t.n * sizeof(float), cudaMemcpyDeviceToHost, probe), "probe copy");
  check_cuda(cudaStreamSynchronize(probe), "probe sync");
  for (float x : host)
    if (x != v) return false;
  return true;
}

int failures = 0;
void report(const std::string& what, bool ok) {
  std::printf("stream order check: %-58s %s\n", what.c_str(), ok ? "ok" : "WRONG (read the old values)");
  if (!ok) ++failures;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
    std::printf("stream order check: no GPU\n");
    return 1;
  }
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  const long long cycles = spin_cycles();
  cudaStream_t probe = nullptr, mine = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking), "probe stream");
  check_cuda(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), "caller stream");
  inproc_world boot(1);
  auto b = boot.join(0);
  nccl_communicator comm(real_nccl_api(), b, 0, {}, std::chrono::seconds(60));
  const float v = 7.0f;

  for (cudaStream_t caller : {static_cast<cudaStream_t>(nullptr), mine}) {
    const std::string on = caller == nullptr ? "(legacy default stream)" : "(the caller's stream)";
    {  // bucketed: one fused bucket (a, b: separate allocations), one in place (big)
      bucketed_allreducer_options o;
      o.bucket_bytes = 64 * 1024;
      o.stream = caller;
      bucketed_allreducer<nccl_communicator> red(comm, o);
      device_tensor a(1000), bb(3000), big(1 << 20);
      red.add(a.p, a.n);
      red.add(bb.p, bb.n);
      red.add(big.p, big.n);
      check_cuda(cudaDeviceSynchronize(), "sync");
      slow_fill<<<64, 256, 0, caller>>>(big.p, big.n, v, cycles);
      red.mark_ready(2);
      slow_fill<<<64, 256, 0, caller>>>(a.p, a.n, v, cycles);
      slow_fill<<<64, 256, 0, caller>>>(bb.p, bb.n, v, cycles);
      red.mark_ready(1);
      red.mark_ready(0);
      red.finish();
      report("bucketed_allreducer " + on, all_equal_now(a, v, probe) && all_equal_now(bb, v, probe) &&
                                              all_equal_now(big, v, probe));
      check_cuda(cudaDeviceSynchronize(), "sync");
    }
    {  // periodic: two tensors fused
      periodic_averager<nccl_communicator> avg(comm, 1, std::chrono::seconds(60), caller);
      device_tensor x(5000), y(777);
      check_cuda(cudaDeviceSynchronize(), "sync");
      slow_fill<<<64, 256, 0, caller>>>(x.p, x.n, v, cycles);
      slow_fill<<<64, 256, 0, caller>>>(y.p, y.n, v, cycles);
      avg.step_done();
      avg.sync(tensor_ref(x.p, x.n), tensor_ref(y.p, y.n));
      report("periodic_averager " + on, all_equal_now(x, v, probe) && all_equal_now(y, v, probe));
      check_cuda(cudaDeviceSynchronize(), "sync");
    }
    {  // elastic: one tensor, in place
      elastic_averager_options o;
      o.stream = caller;
      elastic_averager<inproc_communicator, nccl_communicator> avg(b, comm, "elastic:2", o);
      device_tensor x(100000);
      check_cuda(cudaDeviceSynchronize(), "sync");
      slow_fill<<<64, 256, 0, caller>>>(x.p, x.n, v, cycles);
      avg.step_done(100);
      avg.sync(tensor_ref(x.p, x.n));
      report("elastic_averager " + on, all_equal_now(x, v, probe));
      check_cuda(cudaDeviceSynchronize(), "sync");
    }
    if (caller == nullptr) {  // the communicator's own call without a stream
      device_tensor x(4096);
      check_cuda(cudaDeviceSynchronize(), "sync");
      slow_fill<<<64, 256>>>(x.p, x.n, v, cycles);
      comm.allreduce(x.p, x.n, dtype::f32, reduce_op::sum, std::chrono::seconds(60));
      report("nccl_communicator::allreduce " + on, all_equal_now(x, v, probe));
      check_cuda(cudaDeviceSynchronize(), "sync");
    }
  }

  // The control: no wait (the all-reduce on the communicator's stream itself); the probe must
  // see the old values, or this GPU cannot tell a missing wait from a present one.
  {
    device_tensor x(4096);
    check_cuda(cudaDeviceSynchronize(), "sync");
    slow_fill<<<64, 256, 0, mine>>>(x.p, x.n, v, cycles);
    comm.allreduce(x.p, x.n, dtype::f32, reduce_op::sum, comm.stream(), std::chrono::seconds(60));
    const bool saw_old = !all_equal_now(x, v, probe);
    std::printf("stream order check: %-58s %s\n", "control: no wait (the probe must see the old values)",
                saw_old ? "ok (it did)" : "INCONCLUSIVE (the kernel finished first)");
    if (!saw_old) ++failures;
    check_cuda(cudaDeviceSynchronize(), "sync");
  }
  cudaStreamDestroy(mine);
  cudaStreamDestroy(probe);
  std::printf("stream order check: %s\n", failures == 0 ? "all ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
