// A trainer that moves bytes over gloo through the exported cadence::gloo: two ranks as threads,
// rendezvous through a temporary file store, TCP on 127.0.0.1.
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/gloo/communicator.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

int main() {
  char store[] = "/tmp/cadence-consumer-gloo-XXXXXX";
  if (::mkdtemp(store) == nullptr) return 1;
  int ok[2] = {0, 0};
  auto rank = [&](int r) {
    try {
      cadence::transport::gloo_options options;
      options.store_path = store;
      cadence::transport::gloo_communicator comm(r, 2, options, std::chrono::seconds(30));
      float g[2] = {2.0f + 2.0f * static_cast<float>(r), 4.0f};
      cadence::transport::allreduce_avg(comm, g, 2, cadence::transport::dtype::f32,
                                        std::chrono::seconds(10));
      ok[r] = g[0] == 3.0f && g[1] == 4.0f;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    }
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  const std::string rm = std::string("rm -rf ") + store;
  if (std::system(rm.c_str()) != 0) return 1;
  if (!ok[0] || !ok[1]) return 1;
  std::puts("consumer gloo ok");
  return 0;
}
