// Jitter-free scenarios for the simulator tests that work their expected counts out by hand:
// every worker computes in a constant time, so each event time is known in advance.
#pragma once

#include <cadence/sim/scenario.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace cadence::test {

/// A scenario named `name` with one worker per entry of `iteration_seconds`, each computing in
/// exactly that time, the scenario's push and pull costs, run for `seconds`.
inline sim::scenario steady_scenario(std::string name,
                                     std::initializer_list<double> iteration_seconds,
                                     double push_seconds, double pull_seconds, double seconds) {
  sim::scenario s;
  s.name = std::move(name);
  for (const double d : iteration_seconds) {
    sim::worker_model m;
    m.iteration_seconds = d;
    s.workers.push_back(m);
  }
  s.push_seconds = push_seconds;
  s.pull_seconds = pull_seconds;
  s.seconds = seconds;
  return s;
}

/// Two ranks at 0.1 s and 0.3 s per step, 5 ms each way (merges of 10 ms), for 30 s.
inline sim::scenario steady_pair() {
  return steady_scenario("steady_pair", {0.1, 0.3}, 0.005, 0.005, 30);
}

/// s run until the cluster has made `iterations` pushes per worker on average, not for a time.
inline sim::scenario iteration_limited(sim::scenario s, std::uint64_t iterations) {
  s.seconds = 0;
  s.iterations = iterations;
  return s;
}

}  // namespace cadence::test
