#include <cadence/controllers/make_controller.hpp>

#include <doctest/doctest.h>

using namespace cadence;

TEST_CASE("make_controller builds each policy from its config string and round-trips it") {
  for (const char* config : {"bsp", "asp", "ssp:0", "ssp:3", "dssp:3:15", "dssp:0:0", "dssp:3:15:median:5",
                             "dssp:1:4:ewma:0.5", "dssp:1:4:last"}) {
    CAPTURE(config);
    any_controller c = make_controller(config, 4);
    CHECK(c.config() == config);
    CHECK(c.active_workers() == 4);
    CHECK(make_controller(c.config(), 4).config() == config);
  }
  CHECK(make_controller("ssp:3", 2).target<ssp>()->staleness_bound() == 3);
  CHECK(make_controller("dssp:2:9", 2).target<dssp>()->upper_bound() == 9);
}

TEST_CASE("make_controller rejects bad strings with a message naming what was wrong") {
  CHECK_THROWS_AS(make_controller("", 2), parse_error);
  CHECK_THROWS_WITH(make_controller("bssp", 2), doctest::Contains("unknown policy 'bssp'"));
  CHECK_THROWS_WITH(make_controller("ssp", 2), doctest::Contains("must look like 'ssp:<s>'"));
  CHECK_THROWS_WITH(make_controller("ssp:x", 2), doctest::Contains("bad staleness s 'x'"));
  CHECK_THROWS_WITH(make_controller("ssp:-1", 2), doctest::Contains("expected an integer >= 0"));
  CHECK_THROWS_WITH(make_controller("ssp:3:4", 2), doctest::Contains("must look like"));
  CHECK_THROWS_WITH(make_controller("dssp:3", 2), doctest::Contains("must look like 'dssp:<s_L>:<s_U>[:<predictor>]'"));
  CHECK_THROWS_WITH(make_controller("dssp:5:2", 2), doctest::Contains("must be >= lower bound"));
  CHECK_THROWS_AS(make_controller("dssp:5:2", 2), invalid_parameter_error);
  CHECK_THROWS_WITH(make_controller("dssp:1:", 2), doctest::Contains("bad upper bound s_U ''"));
  CHECK_THROWS_WITH(make_controller("bsp:1", 2), doctest::Contains("must look like 'bsp'"));
  CHECK_THROWS_AS(make_controller("dssp:1:4:median", 2), parse_error);
  CHECK_THROWS_AS(make_controller("dssp:1:4:mean:0", 2), invalid_parameter_error);
  CHECK_THROWS_WITH(make_controller("dssp:1:4:oracle", 2), doctest::Contains("oracle"));
  CHECK_THROWS_WITH(make_controller("ssp:99999999999999999999", 2), doctest::Contains("bad staleness"));
}
