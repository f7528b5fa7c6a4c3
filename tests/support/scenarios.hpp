// Named simulator scenarios shortened for tests, shared by the simulator test files.
#pragma once

#include <cadence/sim/scenarios.hpp>

#include <string>

namespace cadence::test {

/// Every named scenario, shortened so a test file runs in well under a second at -O2
/// (failure8 runs long enough for its worker to die and be removed).
/// large100k runs here with large1000's 1000 workers (the same model); its full size is
/// tested once, briefly, in sim/scenarios_test.cpp, and run in full by cadence-bench-sim.
inline sim::scenario short_scenario(const std::string& name, std::uint64_t seed = 1) {
  const bool huge = name == "large100k";
  sim::scenario s = sim::make_scenario(name, huge ? 1000 : 0, seed);
  s.seconds = name == "large1000" || huge ? 3.0 : (name == "failure8" ? 80.0 : 30.0);
  return s;
}

}  // namespace cadence::test
