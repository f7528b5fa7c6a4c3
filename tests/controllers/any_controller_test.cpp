#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/predict/interval.hpp>

#include "support/schedule.hpp"

#include <doctest/doctest.h>

using namespace cadence;

TEST_CASE("any_controller decides exactly like the controller it holds") {
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    const test::schedule_options opt{/*workers=*/2 + seed % 6, /*events=*/200,
                                     /*remove_probability=*/0.02, /*add_probability=*/0.02};
    SUBCASE("ssp") {
      any_controller a = ssp(opt.workers, 2);
      ssp b(opt.workers, 2);
      test::require_same_decisions(a, b, seed, opt);
    }
    SUBCASE("dssp") {
      any_controller a = dssp(opt.workers, 1, 6);
      dssp b(opt.workers, 1, 6);
      test::require_same_decisions(a, b, seed, opt);
    }
  }
}

TEST_CASE("copying an any_controller deep-copies its state") {
  any_controller a = bsp(2);
  a.push(0, 1.0);
  any_controller b = a;
  CHECK(b.is_waiting(0));
  b.push(1, 2.0);
  CHECK_FALSE(b.is_waiting(0));
  CHECK(a.is_waiting(0));
  any_controller c;
  CHECK_FALSE(c);
  CHECK_THROWS_WITH_AS(c.push(0, 1.0), doctest::Contains("any_controller: empty"), invalid_parameter_error);
  c = a;
  CHECK(c.config() == "bsp");
}

TEST_CASE("target gives access to the concrete controller") {
  any_controller a = dssp(3, 1, 4);
  REQUIRE(a.target<dssp>() != nullptr);
  CHECK(a.target<dssp>()->upper_bound() == 4);
  CHECK(a.target<ssp>() == nullptr);
  const any_controller& ca = a;
  CHECK(ca.target<dssp>()->lower_bound() == 1);
}

TEST_CASE("supersteps reports an elasticbsp's barriers whatever its predictor type and however it is held") {
  using last_bsp = basic_elastic_bsp<last_interval>;
  using median_bsp = basic_elastic_bsp<median_interval>;
  // Two workers, R = 1: two monitoring pushes each, then one planned push each; the second
  // planned push completes the barrier.
  auto run_one_superstep = [](auto& c) {
    REQUIRE(supersteps(c).has_value());
    CHECK(supersteps(c)->barriers == 0);
    CHECK(supersteps(c)->monitoring);
    c.push(0, 1.0);
    c.push(1, 1.5);
    c.push(0, 2.0);
    c.push(1, 3.0);  // every worker has pushed twice: the plan is made
    CHECK_FALSE(supersteps(c)->monitoring);
    CHECK_FALSE(c.push(0, 3.25).proceed);
    CHECK(c.push(1, 4.5).proceed);  // the last arrival completes the barrier
    CHECK(supersteps(c)->barriers == 1);
    CHECK(supersteps(c)->monitoring);
  };
  SUBCASE("concrete, predictor chosen at run time") {
    elastic_bsp c(2, 1);
    run_one_superstep(c);
  }
  SUBCASE("concrete, last_interval") {
    last_bsp c(2, 1);
    run_one_superstep(c);
  }
  SUBCASE("any_controller holding basic_elastic_bsp<last_interval>") {
    any_controller a = last_bsp(2, 1);
    run_one_superstep(a);
    CHECK(a.target<last_bsp>()->barriers() == 1);
  }
  SUBCASE("any_controller holding basic_elastic_bsp<median_interval>") {
    any_controller a = median_bsp(2, 1, median_interval(3));
    run_one_superstep(a);
    CHECK(a.target<median_bsp>()->barriers() == 1);
  }
}

TEST_CASE("supersteps is empty for policies without barriers of their own, concrete or held") {
  CHECK_FALSE(supersteps(ssp(2, 1)).has_value());
  CHECK_FALSE(supersteps(dssp(2, 1, 4)).has_value());
  CHECK_FALSE(supersteps(any_controller(bsp(2))).has_value());
  CHECK_FALSE(supersteps(any_controller(dssp(2, 1, 4))).has_value());
  CHECK_THROWS_AS(supersteps(any_controller()), invalid_parameter_error);
}

TEST_CASE("a call that throws through an any_controller leaves the held controller as it was") {
  for (const char* config : {"bsp", "ssp:2", "dssp:1:4", "elastic:3"}) {
    CAPTURE(config);
    any_controller c = make_controller(config, 3);
    const decision d = c.push(0, 1.0);
    const any_controller before = c;
    CHECK_THROWS_AS(c.push(3, 2.0), worker_error);
    CHECK_THROWS_AS(c.push(1, 0.5), time_error);
    if (!d.proceed) CHECK_THROWS_AS(c.push(0, 2.0), worker_error);
    CHECK_THROWS_AS(c.remove_worker(7), worker_error);
    test::require_same_state(c, before);
    any_controller reference = before;
    test::schedule_options opt;
    opt.events = 40;
    test::require_same_decisions(c, reference, 5, opt, 1.0);
  }
}
