#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>

#include "support/schedule.hpp"

#include <doctest/doctest.h>

using namespace cadence;

TEST_CASE("any_controller decides exactly like the controller it holds") {
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    test::schedule_options opt;
    opt.workers = 2 + seed % 6;
    opt.events = 200;
    opt.remove_probability = 0.02;
    opt.add_probability = 0.02;
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
