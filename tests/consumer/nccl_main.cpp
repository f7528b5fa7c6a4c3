// A trainer that moves device buffers over NCCL through the exported cadence::nccl, bootstrapped
// over the in-process communicator. Without a GPU it reports the clean construction error and
// exits 0, so the consumer test runs it everywhere.
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/communicator.hpp>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>

int main() {
  using namespace cadence::transport;
  inproc_world boot(1);
  auto b = boot.join(0);
  try {
    nccl_communicator comm(real_nccl_api(), b, 0, {}, std::chrono::seconds(30));
    float* dev = nullptr;
    if (cudaMalloc(&dev, 2 * sizeof(float)) != cudaSuccess) return 1;
    const float g[2] = {2.0f, 4.0f};
    cudaMemcpy(dev, g, sizeof g, cudaMemcpyHostToDevice);
    comm.allreduce(dev, 2, dtype::f32, reduce_op::sum, std::chrono::seconds(10));
    float back[2] = {};
    cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost);
    cudaFree(dev);
    if (back[0] != 2.0f || back[1] != 4.0f) return 1;
    std::puts("consumer nccl ok");
  } catch (const cadence::transport_error& e) {
    std::printf("consumer nccl: no usable GPU here (%s)\n", e.what());
  }
  return 0;
}
