// cadence-train's pieces without MPI: the MLP's gradient against finite differences, its
// learning, the profiles against the simulator's scenarios and the report arithmetic
// (report_test.cpp checks the JSON and CSV shapes).
#include "mlp.hpp"
#include "train.hpp"

#include <cadence/sim/random.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::train;

namespace {

// A small labelled set: 3 classes of 6-pixel images, each class a noisy prototype.
dataset tiny(std::size_t n, std::uint64_t seed) {
  dataset d;
  d.rows = 2;
  d.cols = 3;
  d.classes = 3;
  sim::random_stream rng(seed);
  for (std::size_t i = 0; i < n; ++i) {
    const auto y = static_cast<std::uint8_t>(i % 3);
    d.labels.push_back(y);
    for (std::size_t j = 0; j < 6; ++j)
      d.images.push_back(static_cast<float>((j % 3 == y ? 0.8 : 0.1) + 0.1 * rng.uniform()));
  }
  return d;
}

double loss_at(mlp& m, const std::vector<float>& w, const dataset& d, const std::vector<std::uint32_t>& batch) {
  std::vector<float> g(m.parameter_count());
  return m.gradient(w, d, batch, g);
}

}  // namespace

TEST_CASE("mlp: the gradient matches central finite differences in every parameter") {
  const dataset d = tiny(12, 3);
  mlp m(6, 5, 3);
  std::vector<float> w(m.parameter_count());
  m.initialize(w, 7);
  // Non-zero biases, so that their gradients are exercised away from the initial point.
  for (std::size_t k = 0; k < w.size(); ++k) w[k] += 0.05f * static_cast<float>(std::sin(static_cast<double>(k)));
  const std::vector<std::uint32_t> batch = {0, 1, 2, 3, 4, 7, 11};
  std::vector<float> g(m.parameter_count());
  m.gradient(w, d, batch, g);
  const float h = 1e-2f;
  std::size_t checked = 0;
  for (std::size_t k = 0; k < w.size(); ++k) {
    std::vector<float> wp(w), wm(w);
    wp[k] += h;
    wm[k] -= h;
    const double numeric = (loss_at(m, wp, d, batch) - loss_at(m, wm, d, batch)) / (2 * static_cast<double>(h));
    CAPTURE(k);
    CHECK(g[k] == doctest::Approx(numeric).epsilon(2e-2).scale(1e-2));
    ++checked;
  }
  CHECK(checked == 5 * 6 + 5 + 3 * 5 + 3);
}

TEST_CASE("mlp: SGD on the gradient learns a separable set; initialize is seeded") {
  const dataset d = tiny(60, 5);
  mlp m(6, 8, 3);
  std::vector<float> w(m.parameter_count()), w2(m.parameter_count()), w3(m.parameter_count());
  m.initialize(w, 1);
  m.initialize(w2, 1);
  m.initialize(w3, 2);
  CHECK(w == w2);
  CHECK(w != w3);
  const double before = m.evaluate(w, d).loss;
  std::vector<float> g(m.parameter_count());
  std::vector<std::uint32_t> all(d.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  for (int step = 0; step < 300; ++step) {
    m.gradient(w, d, all, g);
    for (std::size_t k = 0; k < w.size(); ++k) w[k] -= 0.5f * g[k];
  }
  const evaluation after = m.evaluate(w, d);
  CHECK(after.loss < before / 4);
  CHECK(after.accuracy == 1.0);
}

TEST_CASE("mlp: bad sizes are rejected") {
  CHECK_THROWS_AS(mlp(0, 4, 3), invalid_parameter_error);
  CHECK_THROWS_AS(mlp(6, 4, 1), invalid_parameter_error);
  mlp m(6, 4, 3);
  const dataset d = tiny(3, 1);
  std::vector<float> w(m.parameter_count() - 1), g(m.parameter_count());
  const std::vector<std::uint32_t> batch = {0};
  CHECK_THROWS_WITH_AS(m.gradient(w, d, batch, g), doctest::Contains("expected 43"), invalid_parameter_error);
}

TEST_CASE("profiles: the simulator's scenarios at the job's size; unknown names list the known ones") {
  const sim::scenario h = make_profile("hetero16", 4, 30, 9);
  const sim::scenario ref = sim::make_scenario("hetero16", 4, 9);
  REQUIRE(h.workers.size() == 4);
  for (std::size_t p = 0; p < 4; ++p) {
    CHECK(h.workers[p].iteration_seconds == ref.workers[p].iteration_seconds);
    CHECK(h.workers[p].jitter_cv == ref.workers[p].jitter_cv);
  }
  CHECK(h.workers[0].iteration_seconds == 0.10);
  CHECK(h.workers[3].iteration_seconds == 0.17);
  CHECK(h.seconds == 30);
  CHECK(h.push_seconds == 0);
  CHECK(h.seed == 9);

  const sim::scenario s = make_profile("straggler3x", 4, 30, 1);
  CHECK(s.workers[0].iteration_seconds == 0.10);
  CHECK(s.workers[3].iteration_seconds == 0.30);
  const sim::scenario slow = make_profile("slowdown", 4, 60, 1);
  CHECK(slow.workers[0].drift_per_second == 0);
  CHECK(std::exp(slow.workers[3].drift_per_second * 60) == doctest::Approx(3.0));
  const sim::scenario j = make_profile("jitter", 2, 10, 1);
  CHECK(j.workers[1].straggle_probability > 0);
  for (const auto& info : profile_catalog()) {
    CAPTURE(info.name);
    const sim::scenario any = make_profile(info.name, 4, 20, 3);
    CHECK_NOTHROW(sim::validate(any));
    CHECK(any.workers.size() == 4);
    // Every profile runs in the simulator (which cadence-train feeds it to).
    CHECK(sim::simulate("bsp", any).iterations > 0);
  }
  CHECK_THROWS_WITH_AS(make_profile("nope", 4, 30, 1),
                       "cadence::train: unknown profile 'nope'; known profiles: homogeneous, hetero2, hetero16, "
                       "straggler3x, jitter, slowdown",
                       invalid_parameter_error);
}

TEST_CASE("report arithmetic: percentiles, transfer cost, wait fraction, time to accuracy") {
  CHECK(percentile(std::vector<int>{}, 0.5) == 0);
  CHECK(percentile(std::vector<int>{5, 1, 3, 2, 4}, 0.99) == 5);
  CHECK(percentile(std::vector<int>{5, 1, 3, 2, 4}, 0.5) == 3);
  CHECK(percentile(std::vector<int>{5, 1, 3, 2, 4}, 0.0) == 1);

  // Worker 0 never waits (1 ms transfers), worker 1 waits 49 ms of each 50 ms exchange.
  std::vector<std::vector<exchange_timing>> t(2);
  for (int i = 0; i < 100; ++i) t[0].push_back({0.1 * i, 0.001});
  for (int i = 0; i < 20; ++i) t[1].push_back({0.5 * i, 0.050});
  const double transfer = transfer_seconds(t);
  CHECK(transfer == doctest::Approx(0.001));
  // 20 x 49 ms = 0.98 s of waiting over 2 workers x 10 s.
  CHECK(wait_fraction(t, transfer, 10) == doctest::Approx(0.98 / 20));
  // Exchanges after the end do not count; one that straddles it counts up to the end.
  t[1].push_back({10.5, 1.0});
  t[1].push_back({9.99, 1.0});
  CHECK(wait_fraction(t, transfer, 10) == doctest::Approx((0.98 + 0.01) / 20));

  const std::vector<accuracy_point> curve = {{0, 0.1}, {1, 0.65}, {2, 0.72}, {3, 0.69}, {4, 0.81}};
  CHECK(time_to(curve, 0.70) == 2);
  CHECK(time_to(curve, 0.80) == 4);
  CHECK(std::isnan(time_to(curve, 0.9)));
  CHECK(relative_error(11, 10) == doctest::Approx(0.1));
}

TEST_CASE("each worker's transfer is its blocked time beyond its parked time, per push_pull") {
  // Worker 0 on a fast link: 10 push_pulls of 30 ms, of which the server parked it 200 ms in
  // all (BSP, waiting for worker 1): 10 ms each is the transfer. Worker 1 on a slow link: 10 of
  // 90 ms, never parked. Worker 2 is gone (no push_pulls): it measured nothing.
  std::vector<std::vector<exchange_timing>> t(3);
  for (int i = 0; i < 10; ++i) t[0].push_back({0.2 * i, 0.030});
  for (int i = 0; i < 10; ++i) t[1].push_back({0.2 * i, 0.090});
  const std::vector<double> costs = worker_transfer_seconds(t, {0.2, 0.0, 0.0});
  REQUIRE(costs.size() == 3);
  CHECK(costs[0] == doctest::Approx(0.010));
  CHECK(costs[1] == doctest::Approx(0.090));
  CHECK(std::isnan(costs[2]));
  // The one reported cost is the median of those measured; the gone worker gets it too.
  CHECK(median_transfer_seconds(costs) == doctest::Approx(0.010));  // nearest rank of 2
  const std::vector<double> filled = filled_transfer_seconds(costs);
  CHECK(filled[2] == doctest::Approx(0.010));
  CHECK(filled[1] == doctest::Approx(0.090));
  // The wait is then what the server parked: 200 ms of worker 0, none of worker 1's slow
  // transfer, over 3 workers x 2 s. One cost for all (the 5th percentile of every push_pull,
  // 30 ms here) would miss worker 0's wait and count 60 ms of worker 1's link per push_pull.
  CHECK(wait_fraction(t, filled, 2) == doctest::Approx(0.2 / 6));
  CHECK(wait_fraction(t, transfer_seconds(t), 2) == doctest::Approx(0.6 / 6));
  // A clock read a little apart may make the parked time exceed the blocked time: never < 0.
  CHECK(worker_transfer_seconds(t, {0.5, 0.0, 0.0})[0] == 0.0);
  // Missing parked times count as 0; no worker measured anything: median 0.
  CHECK(worker_transfer_seconds(t, {})[1] == doctest::Approx(0.090));
  CHECK(median_transfer_seconds({std::nan(""), std::nan("")}) == 0.0);
}
