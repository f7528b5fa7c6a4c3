// Named simulator scenarios shortened for tests, shared by the simulator test files.
#pragma once

#include <cadence/sim/scenarios.hpp>

#include <string>

namespace cadence::test {

/// Every named scenario, shortened so a test file runs in well under a second at -O2
/// (failure8 runs long enough for its worker to die and be removed).
inline sim::scenario short_scenario(const std::string& name, std::uint64_t seed = 1) {
  sim::scenario s = sim::make_scenario(name, 0, seed);
  s.seconds = name == "large1000" ? 3.0 : (name == "failure8" ? 80.0 : 30.0);
  return s;
}

}  // namespace cadence::test
