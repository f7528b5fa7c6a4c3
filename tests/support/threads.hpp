// Test support: runs a body once per rank, each on a thread of its own, and fails the test
// with every exception that escaped one (ranks of the thread-based transport tests).
#pragma once

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

}  // namespace cadence_test
