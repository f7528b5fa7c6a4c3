// ElasticBSP over collectives: four ranks (threads of one in-process world) of unequal speed
// run local SGD steps on a toy model and meet at merge all-reduces placed by the plan that
// every rank computes from the exchanged step times. Swap inproc_communicator for
// mpi_communicator (or any communicator) and nothing else changes.
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/transport/inproc.hpp>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

int main() {
  using namespace cadence;
  constexpr int ranks = 4;
  transport::inproc_world world(ranks);
  std::mutex print;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      transport::inproc_communicator comm = world.join(r);
      exchange::elastic_averager<transport::inproc_communicator> avg(comm, "elastic:8:median:3");
      std::vector<float> w(16, 0.0f);                     // the model
      const std::int64_t step_us = 10000 * (1 + r % 4);  // rank 3 is 4x slower than rank 0
      std::int64_t steps = 0;
      while (avg.barriers() < 12) {
        for (float& x : w) x += 0.01f * static_cast<float>(r + 1);  // a "local SGD step"
        ++steps;
        // A trainer passes the measured time of its step; here it is simulated, not slept.
        if (!avg.step_done(step_us)) continue;
        const exchange::elastic_round ran = avg.round();
        avg.sync(w);  // merge (average) and plan the next barrier
        if (r == 0 && (avg.barriers() <= 3 || avg.barriers() % 4 == 0)) {
          std::lock_guard<std::mutex> lock(print);
          std::printf("barrier %2llu (%s): local steps per rank", static_cast<unsigned long long>(avg.barriers()),
                      ran.warmup ? "warm-up, BSP" : "planned");
          for (std::int64_t s : ran.steps) std::printf(" %lld", static_cast<long long>(s));
          std::printf("; next barrier predicted at %lld us\n",
                      static_cast<long long>(avg.round().predicted_barrier_us));
        }
      }
      std::lock_guard<std::mutex> lock(print);
      std::printf("rank %d: %lld local steps, at most %lld between barriers (R = %zu), w[0] = %g\n", r,
                  static_cast<long long>(steps), static_cast<long long>(avg.max_local_steps()),
                  avg.lookahead(), static_cast<double>(w[0]));
    });
  }
  for (auto& t : threads) t.join();
}
