// The simulator's opt-in header gives scenarios, the simulator and its reports in one include.
#include <cadence/sim.hpp>

#include <doctest/doctest.h>

#include <sstream>

TEST_CASE("the simulator header runs a policy on a named scenario and reports it") {
  const auto run = cadence::sim::simulate("ssp:1", cadence::sim::make_scenario("hetero2"));
  CHECK(run.max_start_staleness <= 1);
  CHECK(run.iterations > 0);
}
