// A trainer that moves bytes over ZeroMQ through the exported cadence::zmq: two ranks as threads
// holding one job secret (authenticated and encrypted), rank 0's rendezvous on a port the system
// picks, TCP on 127.0.0.1.
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

int main() {
  std::mutex m;
  std::condition_variable bound;
  std::string rendezvous;
  int ok[2] = {0, 0};
  const auto secret = cadence::transport::job_secret::generate();
  auto rank = [&](int r) {
    try {
      cadence::transport::zmq_options options;
      options.secret = secret;
      if (r == 0) {
        options.rendezvous = "tcp://127.0.0.1:0";
        options.on_rendezvous_bound = [&](const std::string& a) {
          std::lock_guard<std::mutex> lock(m);
          rendezvous = a;
          bound.notify_all();
        };
      } else {
        std::unique_lock<std::mutex> lock(m);
        bound.wait(lock, [&] { return !rendezvous.empty(); });
        options.rendezvous = rendezvous;
      }
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
