#include <cadence/controllers/make_controller.hpp>

#include "support/message_of.hpp"

#include <doctest/doctest.h>

#include <string>

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
  CHECK_THROWS_WITH(make_controller("dssp:5:2", 2), doctest::Contains("policy 'dssp:5:2' for 2 workers: "));
  CHECK_THROWS_WITH(make_controller("dssp:5:2", 2), doctest::Contains("must be >= lower bound"));
  CHECK_THROWS_AS(make_controller("dssp:5:2", 2), invalid_parameter_error);
  CHECK_THROWS_WITH(make_controller("dssp:1:", 2), doctest::Contains("bad upper bound s_U ''"));
  CHECK_THROWS_WITH(make_controller("bsp:1", 2), doctest::Contains("must look like 'bsp'"));
  CHECK_THROWS_AS(make_controller("dssp:1:4:median", 2), parse_error);
  CHECK_THROWS_AS(make_controller("dssp:1:4:mean:0", 2), invalid_parameter_error);
  CHECK_THROWS_WITH(make_controller("dssp:1:4:oracle", 2), doctest::Contains("oracle"));
  CHECK_THROWS_WITH(make_controller("ssp:99999999999999999999", 2), doctest::Contains("bad staleness"));
}

TEST_CASE("make_controller enforces the constructors' bounds on memory-sizing parameters, naming the string") {
  // The same bound, checked before anything is allocated, with the config string in front.
  const auto same_bound = [](const char* config, std::size_t workers, auto direct) {
    CAPTURE(config);
    const std::string expected = test::message_of<invalid_parameter_error>(direct);
    CHECK(expected.find("exceeds") != std::string::npos);
    CHECK(test::message_of<invalid_parameter_error>(
              [&] { return make_controller(config, workers); }) ==
          "cadence: policy '" + std::string(config) + "' for " + std::to_string(workers) +
              " workers: " + expected);
  };
  same_bound("bsp", 1'000'000'000'000, [] { return bsp(1'000'000'000'000); });
  same_bound("asp", max_workers + 1, [] { return asp(max_workers + 1); });
  same_bound("ssp:3", max_workers + 1, [] { return ssp(max_workers + 1, 3); });
  same_bound("dssp:0:100000000000", 4, [] { return dssp(4, 0, 100'000'000'000); });
  same_bound("dssp:1:4:median:5", max_workers + 1, [] {
    return basic_dssp<median_interval>(max_workers + 1, 1, 4, median_interval(5));
  });
  same_bound("elastic:100000000", 4, [] { return elastic_bsp(4, 100'000'000); });
  same_bound("elastic:65536:opt-bs", 300,
             [] { return elastic_bsp(300, 65536, {}, zipline_variant::paper_opt_bs); });
  CHECK(test::message_of<invalid_parameter_error>(
            [] { return make_controller("elastic:100000000", 4); }) ==
        "cadence: policy 'elastic:100000000' for 4 workers: cadence::elastic_bsp: lookahead R = "
        "100000000 exceeds elastic_bsp::max_lookahead = 65536");
  // The bounds themselves are accepted.
  CHECK(make_controller("dssp:0:65536", 2).config() == "dssp:0:65536");
  CHECK(make_controller("elastic:65536", 2).config() == "elastic:65536:last:fast");
  // Errors from the predictor and variant parsers name the string too.
  CHECK_THROWS_WITH_AS(make_controller("dssp:1:4:median:65", 2),
                       doctest::Contains("policy 'dssp:1:4:median:65' for 2 workers: "
                                         "cadence::median_interval: k must be in [1, 64], got 65"),
                       invalid_parameter_error);
  CHECK_THROWS_WITH_AS(make_controller("elastic:15:fastest", 2),
                       doctest::Contains("policy 'elastic:15:fastest' for 2 workers: "),
                       parse_error);
}

TEST_CASE("a collective mode is told from a controller config by its kind alone") {
  for (const char* config : {"periodic:4", "periodic:0", "elastic-avg:15", "elastic-avg:8:median:3:opt-bs"}) {
    CAPTURE(config);
    CHECK(is_collective_config(config));
    // make_controller has no such kind: a trainer must route these to the averagers.
    CHECK_THROWS_AS((void)make_controller(config, 4), parse_error);
  }
  for (const char* config : {"bsp", "asp", "ssp:3", "dssp:3:15", "elastic:15", "elastic:15:median:5", "periodic",
                             "elastic-avg", "elastic_avg:15", "", "Periodic:4"}) {
    CAPTURE(config);
    CHECK_FALSE(is_collective_config(config));
  }
}

TEST_CASE("collective_mode spells the mode as the averagers and the simulator take it") {
  CHECK(collective_mode("periodic:4") == "periodic:4");
  CHECK(collective_mode("elastic-avg:15") == "elastic:15");
  CHECK(collective_mode("elastic-avg:8:median:3:opt-bs") == "elastic:8:median:3:opt-bs");
  // The elastic form reads as make_controller's elastic grammar, which elastic_averager uses.
  const auto parsed = detail::parse_elastic_config(collective_mode("elastic-avg:8:median:3:opt-bs"));
  CHECK(parsed.lookahead == 8);
  CHECK(parsed.predictor == "median:3");
  CHECK(parsed.variant == "opt-bs");
}

TEST_CASE("collective_mode refuses a controller config and names it") {
  CHECK_THROWS_WITH_AS(collective_mode("elastic:15"),
                       "cadence: policy 'elastic:15' is not a collective mode; expected periodic:<k> or "
                       "elastic-avg:<R>[:<predictor>][:<variant>]",
                       parse_error);
}
