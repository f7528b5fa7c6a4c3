#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/runtime/blocking_controller.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace cadence;
using namespace std::chrono_literals;

namespace {

// Runs `workers` threads of different speeds for `iterations` pushes each through a blocking
// SSP-family controller, recording the largest staleness any running worker ever had.
template <class C>
clock_value run_threads(blocking_controller<C>& bc, std::size_t workers, int iterations) {
  std::atomic<clock_value> worst{0};
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < workers; ++p) {
    threads.emplace_back([&, p] {
      const auto id = static_cast<worker_id>(p);
      for (int i = 0; i < iterations; ++i) {
        // Worker p's "iteration": busier for higher ids, so speeds differ.
        std::this_thread::sleep_for(std::chrono::microseconds(20 * (p + 1)));
        bc.push(id, 10s);
        const clock_value s = bc.inspect([&](const C& c) {
          // Running now, so within the bound; record the worst gap seen by a running worker.
          return c.is_waiting(id) ? 0 : c.staleness(id);
        });
        clock_value prev = worst.load();
        while (s > prev && !worst.compare_exchange_weak(prev, s)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return worst.load();
}

}  // namespace

TEST_CASE("blocking ssp keeps real threads of different speeds within s clocks" * doctest::timeout(60)) {
  blocking_controller<ssp> bc(ssp(4, 2));
  const clock_value worst = run_threads(bc, 4, 200);
  CHECK(worst <= 2);
  bc.inspect([](const ssp& c) {
    for (worker_id p = 0; p < 4; ++p) CHECK(c.clock(p) == 200);
    CHECK(c.waiting_count() == 0);
  });
}

TEST_CASE("blocking bsp is a barrier per iteration for real threads" * doctest::timeout(60)) {
  blocking_controller<bsp> bc(bsp(3));
  CHECK(run_threads(bc, 3, 150) == 0);
}

TEST_CASE("blocking dssp keeps real threads within s_U clocks" * doctest::timeout(60)) {
  blocking_controller<dssp> bc(dssp(4, 1, 4));
  CHECK(run_threads(bc, 4, 200) <= 4);
}

TEST_CASE("blocking elastic_bsp runs real threads through its barriers; finished workers leave" *
          doctest::timeout(60)) {
  // Under ElasticBSP a worker's barrier iteration is planned, so a worker that stops after a
  // fixed count must leave (remove_worker) or the others would wait for it at the barrier.
  blocking_controller<elastic_bsp> bc(elastic_bsp(3, 5));
  std::vector<std::thread> threads;
  for (worker_id p = 0; p < 3; ++p) {
    threads.emplace_back([&bc, p] {
      for (int i = 0; i < 120; ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(30 * (p + 1)));
        bc.push(p, 10s);
      }
      bc.remove_worker(p);
    });
  }
  for (auto& t : threads) t.join();
  bc.inspect([](const elastic_bsp& c) {
    CHECK(c.active_workers() == 0);
    CHECK(c.barriers() > 0);
    CHECK(c.waiting_count() == 0);
  });
}

TEST_CASE("a timed wait names the workers it waited for" * doctest::timeout(30)) {
  blocking_controller<bsp> bc(bsp(3));
  std::string message;
  try {
    bc.push(0, 50ms);
  } catch (const timeout_error& e) {
    message = e.what();
  }
  CHECK(message.find("worker 0 at clock 1 (bsp) waited") != std::string::npos);
  CHECK(message.find("for workers 1 (clock 0), 2 (clock 0)") != std::string::npos);
  // Still waiting in the controller: another push is refused, a resumed wait works.
  CHECK_THROWS_AS(bc.push(0, 10ms), worker_error);
  std::thread one([&] { bc.push(1, 10s); });
  std::thread two([&] { bc.push(2, 10s); });
  bc.wait_for_release(0, 10s);
  one.join();
  two.join();
  bc.inspect([](const bsp& c) { CHECK(c.waiting_count() == 0); });
}

TEST_CASE("removing a dead worker wakes the threads that waited for it" * doctest::timeout(30)) {
  blocking_controller<bsp> bc(bsp(3));
  std::thread a([&] { bc.push(0, 10s); });
  std::thread b([&] { bc.push(1, 10s); });
  // Wait until both block, then declare worker 2 dead.
  while (bc.inspect([](const bsp& c) { return c.waiting_count(); }) < 2) std::this_thread::yield();
  bc.remove_worker(2);
  a.join();
  b.join();
  bc.inspect([](const bsp& c) {
    CHECK(c.active_workers() == 2);
    CHECK(c.waiting_count() == 0);
  });
}

TEST_CASE("a worker removed while it waits gets an error instead of hanging" * doctest::timeout(30)) {
  blocking_controller<bsp> bc(bsp(2));
  std::string message;
  std::thread a([&] {
    try {
      bc.push(0, 10s);
    } catch (const worker_error& e) {
      message = e.what();
    }
  });
  while (bc.inspect([](const bsp& c) { return c.waiting_count(); }) < 1) std::this_thread::yield();
  bc.remove_worker(0);
  a.join();
  CHECK(message.find("worker 0 was removed while it waited") != std::string::npos);
  const worker_id p = bc.add_worker();
  CHECK(p == 2);
}
