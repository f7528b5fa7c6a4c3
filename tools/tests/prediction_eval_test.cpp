// tools/prediction_eval.hpp: the plan times of a replay, and each predictor's error and real
// barrier cost, checked against a history worked out by hand.
#include "prediction_eval.hpp"

#include <cadence/io/push_history.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>

namespace {

// Worker 0 pushes every 100 ms; worker 1 at 0, 150, then speeds up to 70 ms once (220) and
// settles at 150 ms: 370, 520, 670, 820.
template <class T = std::int64_t>
cadence::push_history<T> history() {
  std::istringstream in("0:0,100,200,300,400,500,600,700,800,\n1:0,150,220,370,520,670,820,\n");
  return cadence::read_push_history<T>(in);
}

}  // namespace

TEST_CASE("plans follow ElasticBSP's cycle on the best barrier in hindsight") {
  // R = 2. First plan at 150 (both have pushed twice): futures 200,300 and 220,370; the best
  // barrier pairs 200 with 220 (spread 20). Two pushes after 220 each: 400 and 520, so the
  // next plan is at 520: futures 600,700 and 670,820, best 700 with 670 (spread 30). After
  // 700 worker 0 pushes once more only: the replay ends.
  const auto h = history();
  const auto plans = cadence::tools::evaluation_plans(h, 2);
  REQUIRE(plans.size() == 2);
  CHECK(plans[0].at == 150);
  CHECK(plans[0].first == std::vector<std::size_t>{2, 2});
  CHECK(plans[0].best.spread == 20);
  CHECK(plans[0].best.barrier == 220);
  CHECK(plans[1].at == 520);
  CHECK(plans[1].first == std::vector<std::size_t>{6, 5});
  CHECK(plans[1].best.spread == 30);
  CHECK(plans[1].best.barrier == 700);
  CHECK(cadence::tools::evaluation_plans(h, 6).empty());
}

TEST_CASE("the last-interval predictor's errors and its barrier's real wait are exact") {
  // Plan 1: worker 1 is predicted at 300, 450 (its last interval, 150) but pushes at 220, 370:
  // errors 80, 80. ZipLine on the predictions picks 300 and 300 (spread 0); really they come
  // at 300 and 220, a wait of 80 where 20 was possible. Plan 2: both predicted exactly;
  // wait 30 = best. Errors 0,0,80,80,0,0,0,0: mean 20, p90 80.
  const auto h = history();
  const auto plans = cadence::tools::evaluation_plans(h, 2);
  const auto q = cadence::tools::evaluate_predictor(h, plans, 2, cadence::make_predictor<std::int64_t>("last"), 16);
  CHECK(q.predictor == "last");
  CHECK(q.plans == 2);
  CHECK(q.points == 8);
  CHECK(q.mean_abs_error == 20.0);
  CHECK(q.p90_abs_error == 80);
  CHECK(q.max_abs_error == 80);
  CHECK(q.wait_total == 110);
  CHECK(q.best_wait_total == 50);
  CHECK(q.predicted_wait_total == 30);
  CHECK(q.wait_mean() == 55.0);
}

TEST_CASE("a predictor with a longer memory is judged on the same plans") {
  // mean:8 at plan 2 sees worker 1's four intervals (mean 130): 650, 780 against 670, 820
  // (errors 20, 40). ZipLine then picks 600 and 650 (spread 50, the smaller of two tied
  // barriers); really 600 and 670: a wait of 70 where 30 was possible.
  const auto h = history();
  const auto plans = cadence::tools::evaluation_plans(h, 2);
  const auto q = cadence::tools::evaluate_predictor(h, plans, 2, cadence::make_predictor<std::int64_t>("mean:8"), 16);
  CHECK(q.mean_abs_error == 27.5);
  CHECK(q.wait_total == 150);
  CHECK(q.best_wait_total == 50);
  CHECK(q.predicted_wait_total == 50);
  // With a history of 2 pushes mean:8 is the last interval again.
  const auto short_memory =
      cadence::tools::evaluate_predictor(h, plans, 2, cadence::make_predictor<std::int64_t>("mean:8"), 2);
  CHECK(short_memory.wait_total == 110);
}

TEST_CASE("decimal histories give the same answers in seconds") {
  std::istringstream in("0:0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,\n1:0,0.15,0.22,0.37,0.52,0.67,0.82,\n");
  const auto h = cadence::read_push_history<double>(in);
  const auto plans = cadence::tools::evaluation_plans(h, 2);
  REQUIRE(plans.size() == 2);
  const auto q = cadence::tools::evaluate_predictor(h, plans, 2, cadence::make_predictor<double>("last"), 16);
  CHECK(q.mean_abs_error == doctest::Approx(0.020));
  CHECK(q.wait_total == doctest::Approx(0.110));
}

TEST_CASE("a history too short for R names the worker and the counts") {
  const auto h = history();
  CHECK(cadence::tools::too_short_message(h, 6, "history h.txt") ==
        "history h.txt is too short for lookahead R = 6: the first plan is at 150 (when every worker has pushed "
        "twice), after which worker 1 pushes only 5 times; a plan needs R = 6 pushes of every worker after it (use a "
        "smaller --lookahead or a longer history)");
}

TEST_CASE("repeated timestamps in a recorded history are one choice for the hindsight barrier") {
  std::istringstream in("0:0,10,20,20,30,40,\n1:0,15,25,35,45,55,\n");
  const auto h = cadence::read_push_history<std::int64_t>(in);
  const auto plans = cadence::tools::evaluation_plans(h, 3);
  REQUIRE_FALSE(plans.empty());
  // Plan at 15: futures 20,20,30 and 25,35,45; best 20 or 30 with 25: spread 5, barrier 25.
  CHECK(plans[0].best.spread == 5);
  CHECK(plans[0].best.barrier == 25);
  CHECK(plans[0].best.choice == std::vector<std::size_t>{0, 0});
}
