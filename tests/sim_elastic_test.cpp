#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include "support/scenarios.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace cadence;
using namespace cadence::sim;
using test::short_scenario;

TEST_CASE("elasticbsp completes its barriers on every scenario and bounds each superstep by R" *
          doctest::timeout(60)) {
  for (const auto& info : scenario_catalog()) {
    for (std::size_t r : {1u, 15u, 60u}) {
      CAPTURE(info.name);
      CAPTURE(r);
      const scenario s = short_scenario(info.name);
      // The concrete controller and the one built from its config string run identically.
      elastic_bsp direct(s.workers.size(), r);
      any_controller a = make_controller("elastic:" + std::to_string(r), s.workers.size());
      const run_metrics m = simulate(direct, s);
      const run_metrics m2 = simulate(a, s);
      const auto* e = a.target<elastic_bsp>();
      REQUIRE(e != nullptr);
      CHECK(m.iterations == m2.iterations);
      CHECK(m.barriers == direct.barriers());
      CHECK(m2.barriers_from_policy);
      CHECK(m2.barriers == e->barriers());
      CHECK(e->fallbacks() == 0);
      if (m2.barriers > 0) {
        CHECK(m2.superstep_iterations_max == e->max_superstep_iterations());
        // Two monitoring pushes at least, then j_p in [1, R].
        CHECK(m2.superstep_iterations_min >= 3);
      }
      CHECK(m2.wait_fraction < 1.0);
    }
  }
}

TEST_CASE("on a heterogeneous cluster elasticbsp waits less than bsp and its staleness exceeds bsp's") {
  const scenario s = short_scenario("hetero16");
  const run_metrics bsp_run = simulate("bsp", s);
  const run_metrics elastic_run = simulate("elastic:15", s);
  CHECK(elastic_run.wait_fraction < bsp_run.wait_fraction);
  CHECK(elastic_run.iterations_per_second > bsp_run.iterations_per_second);
  CHECK(elastic_run.max_staleness > bsp_run.max_staleness);
}

TEST_CASE("a larger lookahead R gives fewer barriers") {
  const scenario s = short_scenario("hetero16");
  const run_metrics small = simulate("elastic:5", s);
  const run_metrics large = simulate("elastic:60", s);
  CHECK(large.barriers < small.barriers);
  CHECK(large.superstep_iterations_max > small.superstep_iterations_max);
}
