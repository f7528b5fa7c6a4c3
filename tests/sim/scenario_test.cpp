#include <cadence/sim/scenario.hpp>

#include "sim/steady_scenarios.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using namespace cadence;
using namespace cadence::sim;

namespace {
scenario two_workers() { return test::steady_scenario("pair", {0.1, 0.1}, 0, 0, 10); }
}  // namespace

TEST_CASE("scenario validation names the scenario and the field that cannot run") {
  CHECK_NOTHROW(validate(two_workers()));
  scenario s = two_workers();
  s.push_seconds = -1;
  CHECK_THROWS_WITH_AS(validate(s), doctest::Contains("scenario 'pair': push_seconds must be finite and >= 0"),
                       invalid_parameter_error);
  s = two_workers();
  s.seconds = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(validate(s), doctest::Contains("seconds must be finite"));
  s = two_workers();
  s.seconds = 0;
  CHECK_THROWS_WITH(validate(s), doctest::Contains("set a run length"));
  s = two_workers();
  s.workers.clear();
  CHECK_THROWS_WITH(validate(s), doctest::Contains("needs at least one worker"));
  s = two_workers();
  for (auto& w : s.workers) w.fails_at = 5;
  CHECK_THROWS_WITH(validate(s), doctest::Contains("at least one must survive"));
  s = two_workers();
  s.workers[1].pull_seconds = -1;
  CHECK_THROWS_WITH_AS(validate(s),
                       doctest::Contains("scenario 'pair': worker 1: pull_seconds (its own link) must be finite and >= 0"),
                       invalid_parameter_error);
}

TEST_CASE("a worker's push and pull cost is its own link's when it has one, else the scenario's") {
  scenario s = two_workers();
  s.push_seconds = 0.01;
  s.pull_seconds = 0.02;
  s.workers[1].push_seconds = 0.1;
  CHECK(push_seconds_of(s, 0) == 0.01);
  CHECK(pull_seconds_of(s, 0) == 0.02);
  CHECK(push_seconds_of(s, 1) == 0.1);
  CHECK(pull_seconds_of(s, 1) == 0.02);
  s.workers[1].pull_seconds = 0.0;  // a link of its own may be free
  CHECK(pull_seconds_of(s, 1) == 0.0);
}
