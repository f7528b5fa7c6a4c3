// A trainer that moves bytes over ZeroMQ through the exported cadence::zmq: two ranks as threads,
// rank 0's rendezvous on a port the system picks, TCP on 127.0.0.1 (started as the benchmarks
// start theirs: bench/support/backends.hpp, which needs nothing but the standard library).
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include "../../bench/support/backends.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

int main() {
  cadence_bench::thread_rendezvous meet;
  int ok[2] = {0, 0};
  auto rank = [&](int r) {
    try {
      const auto options = cadence_bench::zmq_thread_options<cadence::transport::zmq_options>(r, meet);
      cadence::transport::zmq_communicator comm(r, 2, options, std::chrono::seconds(30));
      float g[2] = {2.0f + 2.0f * static_cast<float>(r), 4.0f};
      cadence::transport::allreduce_avg(comm, g, 2, cadence::transport::dtype::f32, std::chrono::seconds(10));
      ok[r] = g[0] == 3.0f && g[1] == 4.0f && comm.capabilities().isolates_lost_peer;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    }
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  if (!ok[0] || !ok[1]) return 1;
  std::puts("consumer zmq ok");
  return 0;
}
