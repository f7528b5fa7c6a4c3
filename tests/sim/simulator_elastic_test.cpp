#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/predict/interval.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include "support/scenarios.hpp"

#include <doctest/doctest.h>

#include <string>
#include <utility>

using namespace cadence;
using namespace cadence::sim;
using test::short_scenario;

namespace {

// Runs one ElasticBSP controller (concrete, or behind any_controller: `elastic` is the held
// object either way) and checks what the simulator reports against the controller's own counts
// and against the bound: between two barriers a worker makes its monitoring pushes plus at most R.
template <class Controller, class Elastic>
void check_elastic_run(Controller& c, const Elastic& elastic, const scenario& s, std::size_t r) {
  const run_metrics m = simulate(c, s);
  REQUIRE(m.barriers.has_value());
  CHECK(*m.barriers == elastic.barriers());
  CHECK(m.barriers == supersteps(c)->barriers);
  CHECK(m.wait_fraction < 1.0);
  if (*m.barriers == 0) return;
  CHECK(m.release_events > 0);
  CHECK(m.superstep_planned_max >= 1);
  CHECK(m.superstep_planned_max <= r);
  CHECK(m.superstep_iterations_max <= m.superstep_monitoring_max + r);
  if (elastic.fallbacks() == 0) {
    // Two monitoring pushes at least, then j_p in [1, R]; the same sizes the controller saw.
    CHECK(m.superstep_iterations_min >= 3);
    CHECK(m.superstep_iterations_max == elastic.max_superstep_iterations());
  }
}

}  // namespace

TEST_CASE("every elasticbsp flavour reports its barriers and keeps each superstep within monitoring + R" *
          doctest::timeout(120)) {
  using last_bsp = basic_elastic_bsp<last_interval>;
  using median_bsp = basic_elastic_bsp<median_interval>;
  for (const auto& info : scenario_catalog()) {
    for (const std::uint64_t seed : {1u, 2u}) {
      for (const std::size_t r : {1u, 15u, 60u}) {
        CAPTURE(info.name);
        CAPTURE(seed);
        CAPTURE(r);
        const scenario s = short_scenario(info.name, seed);
        const std::size_t n = s.workers.size();
        // Not SUBCASEs: doctest enters a subcase once per run, not once per loop iteration.
        {
          INFO("elastic_bsp (run-time predictor)");
          elastic_bsp c(n, r);
          check_elastic_run(c, c, s, r);
        }
        {
          INFO("basic_elastic_bsp<last_interval>");
          last_bsp c(n, r);
          check_elastic_run(c, c, s, r);
        }
        {
          INFO("any_controller holding basic_elastic_bsp<last_interval>");
          any_controller a = last_bsp(n, r);
          check_elastic_run(a, *a.target<last_bsp>(), s, r);
        }
        {
          INFO("any_controller holding basic_elastic_bsp<median_interval> with ZipLineOptBS");
          any_controller a = median_bsp(n, r, median_interval(5), zipline_variant::paper_opt_bs);
          check_elastic_run(a, *a.target<median_bsp>(), s, r);
        }
        {
          INFO("any_controller from a config string");
          any_controller a = make_controller("elastic:" + std::to_string(r) + ":ewma:0.5", n);
          check_elastic_run(a, *a.target<elastic_bsp>(), s, r);
        }
      }
    }
  }
}

namespace {

// Two policies' runs on the same shortened hetero16 cluster.
std::pair<run_metrics, run_metrics> on_hetero16(const std::string& a, const std::string& b) {
  const scenario s = short_scenario("hetero16");
  return {simulate(a, s), simulate(b, s)};
}

}  // namespace

TEST_CASE("on a heterogeneous cluster elasticbsp waits less than bsp and its clock gap exceeds bsp's") {
  const auto [bsp_run, elastic_run] = on_hetero16("bsp", "elastic:15");
  CHECK(elastic_run.wait_fraction < bsp_run.wait_fraction);
  CHECK(elastic_run.iterations_per_second > bsp_run.iterations_per_second);
  // The clock gap grows with the speed gap, by design; the superstep stays bounded.
  CHECK(elastic_run.max_start_staleness > 100);
  CHECK(bsp_run.max_start_staleness == 0);
}

TEST_CASE("a larger lookahead R gives fewer barriers") {
  const auto [small, large] = on_hetero16("elastic:5", "elastic:60");
  CHECK(large.barriers < small.barriers);
  CHECK(large.superstep_iterations_max > small.superstep_iterations_max);
}
