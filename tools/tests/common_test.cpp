// common.hpp: the flags cannot ask the simulator for more work than max_simulated_pushes, and
// the error says the rule with the numbers that broke it.
#include "common.hpp"

#include <doctest/doctest.h>

#include <cadence/sim/scenarios.hpp>

namespace {

cadence::sim::scenario two_workers(double fast, double slow) {
  auto s = cadence::sim::make_scenario("hetero2");
  s.workers.at(0).iteration_seconds = fast;
  s.workers.at(1).iteration_seconds = slow;
  return s;
}

}  // namespace

TEST_CASE("a timed run is estimated as seconds x workers / the fastest iteration time") {
  auto s = two_workers(0.5, 0.1);
  s.seconds = 100;
  CHECK(cadence::tools::estimated_pushes(s) == doctest::Approx(2000.0));
  s.seconds = 0;
  s.iterations = 30;
  CHECK(cadence::tools::estimated_pushes(s) == 60.0);
}

TEST_CASE("a run up to max_simulated_pushes passes and one beyond names the flag and the bound") {
  auto s = two_workers(0.1, 0.2);
  s.seconds = 5e6;  // 2 workers / 0.1 s: exactly 1e8 pushes
  CHECK_NOTHROW(cadence::tools::check_simulated_work(s, "--seconds"));
  s.seconds = 1e12;
  CHECK_THROWS_WITH_AS(cadence::tools::check_simulated_work(s, "--seconds"),
                       "--seconds: 1e+12 simulated s x 2 workers / 0.1 s (the fastest iteration) "
                       "is about 2e+13 pushes; the bound is 100000000 pushes per policy (lower "
                       "--seconds or --workers)",
                       cadence::tools::usage_error);
}

TEST_CASE("a run of iterations is bounded by iterations x workers") {
  auto s = two_workers(0.1, 0.2);
  s.seconds = 0;
  s.iterations = 50000000;
  CHECK_NOTHROW(cadence::tools::check_simulated_work(s, "--iterations"));
  s.iterations = 50000001;
  CHECK_THROWS_WITH_AS(cadence::tools::check_simulated_work(s, "--iterations"),
                       "--iterations: 50000001 iterations x 2 workers is 100000002 pushes; the "
                       "bound is 100000000 pushes per policy (lower --iterations or --workers)",
                       cadence::tools::usage_error);
}

TEST_CASE("--link W=PUSH[,PULL] gives one worker its own link; PULL defaults to PUSH") {
  using cadence::tools::parse_link;
  const auto both = parse_link("3=0.045,0.02");
  CHECK(both.worker == 3);
  CHECK(both.push == 0.045);
  CHECK(both.pull == 0.02);
  const auto one = parse_link("0=0.1");
  CHECK(one.worker == 0);
  CHECK(one.pull == 0.1);
  CHECK(parse_link("1=0").push == 0.0);
  for (const char* bad : {"3", "3=", "=0.1", "3=0.1,", "3=0.1,0.2,0.3", "3,0.1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_link(bad), cadence::tools::usage_error);
  }
  CHECK_THROWS_WITH(parse_link("3"), "expected 'W=PUSH[,PULL]' (a worker and its push and pull seconds), got '3'");
  CHECK_THROWS_WITH(parse_link("x=0.1"), "W 'x' is not an integer");
  CHECK_THROWS_WITH(parse_link("1=-0.1"), "expected a number >= 0, got '-0.1'");
}

TEST_CASE("links go to the workers they name, which must exist and be named once") {
  auto s = two_workers(0.1, 0.2);
  s.push_seconds = s.pull_seconds = 0.005;
  cadence::tools::apply_links(s, {{1, 0.05, 0.04}}, "--link");
  CHECK(!s.workers[0].push_seconds);
  CHECK(*s.workers[1].push_seconds == 0.05);
  CHECK(*s.workers[1].pull_seconds == 0.04);
  CHECK_THROWS_WITH_AS(cadence::tools::apply_links(s, {{2, 0.05, 0.05}}, "--link"),
                       "--link: worker 2 is out of range: the scenario has 2 workers (0..1)",
                       cadence::tools::usage_error);
  CHECK_THROWS_WITH_AS(cadence::tools::apply_links(s, {{0, 0.05, 0.05}, {0, 0.1, 0.1}}, "--link"),
                       "--link: worker 0 given twice", cadence::tools::usage_error);
}
