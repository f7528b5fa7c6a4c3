// Test support: runs a body on one thread per rank of an in-process world, so a suite can
// exercise ranks as threads; an exception escaping a rank fails the test, naming the rank. Also
// the harness the shared suites (exchange/collective_suite.hpp, exchange/ps_suite.hpp) take: a fresh world per run.
#pragma once

#include <cadence/transport/inproc.hpp>

#include "support/events.hpp"

#include <doctest/doctest.h>

#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cadence_test {

/// body(comm) on one thread per rank of `world`, each with the rank's communicator.
template <class Body>
void run_inproc_ranks(cadence::transport::inproc_world& world, Body body) {
  std::mutex m;
  std::vector<std::string> escaped;
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        cadence::transport::inproc_communicator c = world.join(r);
        body(c);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        escaped.push_back("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : escaped) FAIL_CHECK(e);
}

/// A suite's harness: run(body) calls body(comm) on every rank of a fresh world of N ranks, with
/// fresh current_events() for the ranks to signal each other.
template <int N>
struct inproc_harness {
  template <class Body>
  static void run(Body body) {
    cadence::transport::inproc_world world(N);
    const events ev;
    const scoped_events scope(ev);
    run_inproc_ranks(world, body);
  }
};

}  // namespace cadence_test

// The suites' names for the worlds, declared once here so that test files sharing a unity
// build do not declare them twice.
TYPE_TO_STRING_AS("inproc_4", cadence_test::inproc_harness<4>);
TYPE_TO_STRING_AS("inproc_3", cadence_test::inproc_harness<3>);
