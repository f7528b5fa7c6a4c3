// Test support: runs a body once per rank, each on a thread of its own, and fails the test
// with every exception that escaped one (ranks of the thread-based transport tests); and the
// harness the shared suites take over such ranks. Ranks as processes: processes.hpp.
#pragma once

#include "support/events.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cadence_test {

/// Runs body(rank) on n threads; an exception that escapes a rank is printed at once (the
/// others may be waiting for that rank) and reported as a test failure after all have joined.
template <class Body>
void run_threads(int n, Body body) {
  std::mutex m;
  std::vector<std::string> errors;
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        errors.push_back("rank " + std::to_string(r) + " threw: " + e.what());
        std::fprintf(stderr, "%s\n", errors.back().c_str());
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) FAIL_CHECK(e);
}

/// A suite's harness (transport/conformance.hpp) over ranks as threads of this process:
/// run(body) makes a fresh World (what the ranks of one run share: a store folder, a
/// rendezvous address) and fresh current_events(), then calls body(world.join(r, N)) on N
/// threads, each rank with a communicator of its own.
template <int N, class World>
struct threads_harness {
  template <class Body>
  static void run(Body body) {
    World world;
    const events ev;
    const scoped_events scope(ev);
    run_threads(N, [&](int r) {
      auto c = world.join(r, N);
      body(c);
    });
  }
};

}  // namespace cadence_test
