#include <cadence/controllers/ssp.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <string>

using namespace cadence;
using namespace cadence::sim;

TEST_CASE("every catalogued scenario builds, validates and has its default size") {
  const auto catalog = scenario_catalog();
  CHECK(catalog.size() >= 7);
  bool has_default = false;
  for (const auto& info : catalog) {
    CAPTURE(info.name);
    const scenario s = make_scenario(info.name);
    CHECK(s.name == info.name);
    CHECK(s.workers.size() == info.default_workers);
    CHECK_NOTHROW(validate(s));
    has_default = has_default || info.name == default_scenario_name;
  }
  CHECK(has_default);
}

TEST_CASE("a scenario can be resized and reseeded") {
  const scenario s = make_scenario("hetero16", 40, 99);
  CHECK(s.workers.size() == 40);
  CHECK(s.seed == 99);
  std::size_t slow = 0;
  for (const auto& w : s.workers) slow += w.iteration_seconds > 0.15;
  CHECK(slow == 20);
  const scenario f = make_scenario("failure8", 3);
  CHECK(std::isfinite(f.workers[1].fails_at));
}

TEST_CASE("the heterogeneous pair is about 1.7x apart, as in the DSSP paper") {
  const scenario s = make_scenario("hetero2");
  REQUIRE(s.workers.size() == 2);
  CHECK(s.workers[1].iteration_seconds / s.workers[0].iteration_seconds == doctest::Approx(1.7));
}

TEST_CASE("an unknown scenario name is an error that lists the known ones") {
  try {
    make_scenario("nope");
    FAIL("no error");
  } catch (const invalid_parameter_error& e) {
    CHECK(std::string(e.what()).find("'nope'") != std::string::npos);
    CHECK(std::string(e.what()).find("hetero16") != std::string::npos);
  }
  CHECK_THROWS_AS(make_scenario("failure8", 1), invalid_parameter_error);
}

TEST_CASE("a scenario that cannot run is an invalid_parameter_error naming the field") {
  auto message = [](const scenario& s) {
    try {
      validate(s);
    } catch (const invalid_parameter_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  scenario s = make_scenario("homogeneous");
  CHECK(message(s) == "no error");
  scenario bad = s;
  bad.workers.clear();
  CHECK(message(bad).find("at least one worker") != std::string::npos);
  bad = s;
  bad.push_seconds = -1;
  CHECK(message(bad).find("push_seconds") != std::string::npos);
  bad = s;
  bad.pull_seconds = INFINITY;
  CHECK(message(bad).find("pull_seconds") != std::string::npos);
  bad = s;
  bad.seconds = 0;
  bad.iterations = 0;
  CHECK(message(bad).find("run length") != std::string::npos);
  bad = s;
  bad.failure_detection_seconds = -2;
  CHECK(message(bad).find("failure_detection_seconds") != std::string::npos);
  bad = s;
  for (auto& w : bad.workers) w.fails_at = 10;
  CHECK(message(bad).find("at least one must survive") != std::string::npos);
  bad = s;
  bad.workers[3].iteration_seconds = -1;
  CHECK(message(bad).find("'homogeneous': worker 3: iteration_seconds") != std::string::npos);
}

TEST_CASE("large100k is large1000's cluster at 10^5 workers, and a short run of it keeps SSP's bound") {
  const scenario s = make_scenario("large100k");
  REQUIRE(s.workers.size() == 100000);
  CHECK(s.seconds == 60);
  CHECK(s.push_seconds == 0.010);
  const scenario small = make_scenario("large1000");
  for (std::size_t p = 0; p < 6; ++p) {
    CHECK(s.workers[p].iteration_seconds == small.workers[p].iteration_seconds);
    CHECK(s.workers[p].label == small.workers[p].label);
  }
  // 60 simulated seconds at about 0.13 s an iteration: under cadence-sim's 10^8-push bound.
  CHECK(static_cast<double>(s.workers.size()) * s.seconds / 0.10 < 1e8);
  // A quarter of a simulated second at full size (every worker pushes once or twice).
  scenario brief = s;
  brief.seconds = 0.25;
  ssp c(s.workers.size(), 3);
  const run_metrics m = simulate(c, brief);
  CHECK(m.iterations > 100000);
  CHECK(m.max_start_staleness <= 3);
  CHECK(m.per_worker.size() == 100000);
}
