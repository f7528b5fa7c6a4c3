// In-process data-parallel training with worker threads: each thread computes, pushes, and
// blocks in blocking_controller::push until the policy lets it start its next iteration; a
// thread that is done calls finish() so nobody waits for it.
//
// Usage: cadence-example-threads_blocking [POLICY]   (default ssp:2; any make_controller
// string: bsp, asp, ssp:3, dssp:2:6, elastic:10, ...)
#include <cadence/cadence.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) try {
  using namespace std::chrono_literals;
  const std::string policy = argc > 1 ? argv[1] : "ssp:2";
  constexpr std::size_t workers = 4;

  // A worker silent for 10 s (its thread died or hung) is evicted, so the others never wait
  // for it forever; its next push or finish then throws cadence::worker_error saying why.
  cadence::blocking_options options;
  options.evict_after = 10s;
  cadence::blocking_controller<cadence::any_controller> sync(
      cadence::make_controller(policy, workers), options);

  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < workers; ++p) {
    threads.emplace_back([&sync, &failed, p] {
      const auto id = static_cast<cadence::worker_id>(p);
      // Shards of unequal size: worker p runs 30 + 10p iterations. Without finish(), the
      // workers still running would wait for a finished one at their next barrier.
      const int iterations = 30 + 10 * static_cast<int>(p);
      try {
        for (int i = 0; i < iterations; ++i) {
          std::this_thread::sleep_for(std::chrono::microseconds(100 * (p + 1)));  // "compute"
          // ... apply the update to the shared model here ...
          sync.push(id, 30s);  // throws timeout_error naming the stragglers after 30 s
        }
        sync.finish(id);
      } catch (const cadence::error& e) {  // an exception must not escape a std::thread
        std::fprintf(stderr, "worker %zu: %s\n", p, e.what());
        ++failed;
      }
    });
  }
  for (auto& t : threads) t.join();

  const std::string config = sync.inspect([](const cadence::any_controller& c) { return c.config(); });
  std::printf("%s: %zu workers ran 30..%zu iterations each; %d failed, %zu evicted\n",
              config.c_str(), workers, 30 + 10 * (workers - 1), failed.load(),
              sync.evictions().size());
  if (failed != 0) return 1;
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "threads_blocking: %s\n", e.what());
  return 1;
}
