#include "synthetic.hpp"

#include <cadence/controllers/ssp.hpp>
#include <cadence/sim/scenarios.hpp>
#include "race.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>

namespace {

using cadence::train::race_options;
using cadence::train::race_result;
using cadence::train::run_race;

cadence::sim::scenario small_cluster(double seconds = 20) {
  cadence::sim::scenario s = cadence::sim::make_scenario("hetero2", 4);
  s.seconds = seconds;
  return s;
}

race_options small_options() {
  race_options o;
  o.learning_rate = 0.2;
  o.batch_size = 16;
  o.eval_every_seconds = 1.0;
  o.test_limit = 0;
  o.targets = {0.5, 0.9, 1.0};
  return o;
}

}  // namespace

TEST_CASE("asp and bsp both learn the synthetic problem, and bsp never starts stale") {
  const auto data = cadence_test::synthetic_split(800, 400);
  for (const char* policy : {"asp", "bsp"}) {
    CAPTURE(policy);
    const race_result r = run_race(policy, small_cluster(), data, small_options());
    REQUIRE(!r.curve.empty());
    CHECK(r.curve.front().seconds == 0);
    CHECK(r.curve.front().updates == 0);
    CHECK(r.curve.back().seconds == 20);
    CHECK(r.curve.size() == 21);
    CHECK(r.curve.back().updates == r.metrics.iterations);
    CHECK(r.final_test.accuracy > 0.9);
    CHECK(r.final_test_examples == 400);
    CHECK(r.best_accuracy >= r.curve.back().accuracy);
    REQUIRE(r.reached.size() == 3);
    CHECK(r.reached[0].reached());
    CHECK(r.reached[0].seconds <= r.reached[1].seconds);
    CHECK(r.curve.back().loss < r.curve.front().loss);
    if (std::string(policy) == "bsp") {
      CHECK(r.metrics.max_start_staleness == 0);
      // The server applies a round's four gradients one by one: three others land before the last.
      CHECK(r.metrics.max_updates_behind == 3);
    } else {
      CHECK(r.metrics.wait_fraction == 0);
      CHECK(r.metrics.max_start_staleness > 1);
    }
  }
}

TEST_CASE("the race is deterministic: the same seed gives the same curve, another seed another") {
  const auto data = cadence_test::synthetic_split(400, 200);
  race_options o = small_options();
  const auto s = small_cluster(6);
  const race_result a = run_race("ssp:2", s, data, o);
  const race_result b = run_race("ssp:2", s, data, o);
  REQUIRE(a.curve.size() == b.curve.size());
  for (std::size_t i = 0; i < a.curve.size(); ++i) {
    CHECK(a.curve[i].accuracy == b.curve[i].accuracy);
    CHECK(a.curve[i].loss == b.curve[i].loss);
    CHECK(a.curve[i].updates == b.curve[i].updates);
  }
  CHECK(a.final_test.loss == b.final_test.loss);
  o.seed = 2;
  const race_result c = run_race("ssp:2", s, data, o);
  CHECK(c.metrics.iterations == a.metrics.iterations);  // same cluster, other data order
  CHECK(c.final_test.loss != a.final_test.loss);
}

TEST_CASE("a concrete controller races exactly like the same policy from its config string") {
  const auto data = cadence_test::synthetic_split(400, 200);
  const auto s = small_cluster(5);
  cadence::ssp c(s.workers.size(), 1);
  const race_result a = run_race(c, s, data, small_options());
  const race_result b = run_race("ssp:1", s, data, small_options());
  CHECK(a.final_test.loss == b.final_test.loss);
  CHECK(a.metrics.iterations == b.metrics.iterations);
}

TEST_CASE("asp's gradients are staler than bsp's: more updates land between a pull and its push") {
  const auto data = cadence_test::synthetic_split(800, 400);
  auto s = cadence::sim::make_scenario("homogeneous", 16);
  s.seconds = 3;
  const race_options o = small_options();
  const race_result bsp = run_race("bsp", s, data, o);
  const race_result asp = run_race("asp", s, data, o);
  CHECK(asp.metrics.mean_updates_behind > 5);
  CHECK(bsp.metrics.max_updates_behind == 15);
  CHECK(asp.metrics.max_updates_behind > bsp.metrics.max_updates_behind);
}

TEST_CASE("the race reports the simulator's own staleness metrics for the same run") {
  const auto data = cadence_test::synthetic_split(400, 200);
  const auto s = small_cluster(6);
  for (const char* policy : {"ssp:2", "elastic:4"}) {
    CAPTURE(policy);
    const race_result r = run_race(policy, s, data, small_options());
    const cadence::sim::run_metrics m = cadence::sim::simulate(policy, s);
    CHECK(r.metrics.iterations == m.iterations);
    CHECK(r.metrics.start_staleness_histogram == m.start_staleness_histogram);
    CHECK(r.metrics.updates_behind_histogram == m.updates_behind_histogram);
    CHECK(r.metrics.mean_updates_behind == m.mean_updates_behind);
    CHECK(r.metrics.barriers == m.barriers);
    CHECK(r.metrics.superstep_iterations_max == m.superstep_iterations_max);
  }
}

TEST_CASE("an evaluation interval far below the run's length is rejected, not run for hours") {
  const auto data = cadence_test::synthetic_split(40, 10);
  race_options o = small_options();
  auto s = small_cluster(20);
  o.eval_every_seconds = 0.03125;  // 640 evaluations in 20 s
  CHECK_NOTHROW(cadence::train::detail::check_race(s, data, o));
  o.eval_every_seconds = 0.015625;  // 1280
  CHECK_THROWS_AS(cadence::train::detail::check_race(s, data, o), cadence::invalid_parameter_error);
  o.eval_every_seconds = 1e-6;
  CHECK_THROWS_WITH_AS(run_race("asp", s, data, o),
                       "cadence::train::run_race: eval_every_seconds 1e-06 means more than 1000 test "
                       "evaluations in 20 simulated s; use eval_every_seconds >= 0.02",
                       cadence::invalid_parameter_error);
  // A run limited by iterations has no length up front: the curve is bounded as it grows.
  s.seconds = 0;
  s.iterations = 50;
  CHECK_THROWS_WITH_AS(run_race("asp", s, data, o), doctest::Contains("more than 1000 test evaluations"),
                       cadence::invalid_parameter_error);
}

TEST_CASE("run_race rejects bad options with a message naming the option") {
  const auto data = cadence_test::synthetic_split(40, 10);
  const auto s = small_cluster(1);
  race_options o = small_options();
  o.learning_rate = 0;
  CHECK_THROWS_WITH_AS(run_race("bsp", s, data, o),
                       doctest::Contains("learning_rate must be finite and > 0"), cadence::invalid_parameter_error);
  o = small_options();
  o.batch_size = 0;
  CHECK_THROWS_WITH_AS(run_race("bsp", s, data, o), doctest::Contains("batch_size must be >= 1"),
                       cadence::invalid_parameter_error);
  o = small_options();
  o.train_limit = 3;
  CHECK_THROWS_WITH_AS(run_race("bsp", s, data, o),
                       "cadence::train::run_race: every worker needs at least one training example: 3 "
                       "examples for 4 workers",
                       cadence::invalid_parameter_error);
  o = small_options();
  o.targets = {1.5};
  CHECK_THROWS_AS(run_race("bsp", s, data, o), cadence::invalid_parameter_error);
}

TEST_CASE("a short race on the real Fashion-MNIST data reaches a sane accuracy" * doctest::timeout(120)) {
  const std::string dir = CADENCE_FASHION_MNIST_DIR;
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: " << dir << " not found (install the Debian package dataset-fashion-mnist)");
    return;
  }
  const auto data = cadence::train::load_fashion_mnist(dir);
  REQUIRE(data.train.size() == 60000);
  REQUIRE(data.test.size() == 10000);
  CHECK(data.train.rows == 28);
  auto s = cadence::sim::make_scenario("hetero2", 4);
  s.seconds = 10;
  race_options o;
  o.learning_rate = 0.02;
  o.train_limit = 4000;
  o.test_limit = 1000;
  const race_result r = run_race("asp", s, data, o);
  CHECK(r.final_test_examples == 10000);
  CHECK(r.final_test.accuracy > 0.6);
}
