// In-process data-parallel training with worker threads: each thread computes, pushes, and
// blocks in blocking_controller::push until the policy lets it start its next iteration.
#include <cadence/cadence.hpp>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

int main() {
  using namespace std::chrono_literals;
  constexpr std::size_t workers = 4;
  constexpr int iterations = 50;
  cadence::blocking_controller<cadence::ssp> sync(cadence::ssp(workers, 2));

  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < workers; ++p) {
    threads.emplace_back([&sync, p] {
      const auto id = static_cast<cadence::worker_id>(p);
      for (int i = 0; i < iterations; ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(100 * (p + 1)));  // "compute"
        // ... apply the update to the shared model here ...
        sync.push(id, 30s);  // throws timeout_error naming the stragglers after 30 s
      }
    });
  }
  for (auto& t : threads) t.join();
  sync.inspect([](const cadence::ssp& c) {
    std::printf("all %zu workers finished at clock %lld; max staleness now %lld\n",
                c.active_workers(), static_cast<long long>(c.min_clock()),
                static_cast<long long>(c.max_staleness()));
  });
  return 0;
}
