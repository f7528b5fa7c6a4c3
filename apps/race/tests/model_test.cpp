#include "synthetic.hpp"

#include "model.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

using cadence::train::softmax_regression;

TEST_CASE("softmax_regression's gradient matches finite differences of its loss") {
  const auto d = cadence_test::synthetic(16, 3, 4, 0.3, 7);
  softmax_regression m(d.features(), d.classes, 8);
  std::vector<float> w(m.parameter_count());
  cadence::sim::random_stream rng(3);
  for (float& v : w) v = static_cast<float>(0.5 * rng.normal());
  const std::vector<std::uint32_t> batch = {0, 3, 5, 6, 9, 11, 12, 15};
  std::vector<float> g(m.parameter_count()), scratch(m.parameter_count());
  const double loss = m.gradient(w, d, batch, g);
  CHECK(loss > 0);
  // Loss in double from the model itself (evaluate() on a dataset holding only the batch).
  cadence::train::dataset sub = d;
  sub.images.clear();
  sub.labels.clear();
  for (const auto i : batch) {
    sub.images.insert(sub.images.end(), d.image(i), d.image(i) + d.features());
    sub.labels.push_back(d.labels[i]);
  }
  CHECK(m.evaluate(w, sub).loss == doctest::Approx(loss).epsilon(1e-6));
  for (std::size_t k = 0; k < w.size(); ++k) {
    const float keep = w[k];
    const float h = 1e-2f;
    w[k] = keep + h;
    const double up = m.evaluate(w, sub).loss;
    w[k] = keep - h;
    const double down = m.evaluate(w, sub).loss;
    w[k] = keep;
    CAPTURE(k);
    CHECK(g[k] == doctest::Approx((up - down) / (2.0 * static_cast<double>(h))).epsilon(2e-2).scale(1e-2));
  }
}

TEST_CASE("sgd on a separable problem reaches high accuracy") {
  const auto train = cadence_test::synthetic(600, 6, 4, 0.35, 1);
  const auto test = cadence_test::synthetic(300, 6, 4, 0.35, 2);
  softmax_regression m(train.features(), train.classes, 20);
  std::vector<float> w(m.parameter_count(), 0.0f), g(m.parameter_count());
  std::vector<std::uint32_t> idx(20);
  const double before = m.evaluate(w, test).loss;
  for (int step = 0; step < 300; ++step) {
    std::iota(idx.begin(), idx.end(), static_cast<std::uint32_t>((step * 20) % 600));
    m.gradient(w, train, idx, g);
    softmax_regression::sgd_step(w, g, 0.5f);
  }
  const auto e = m.evaluate(w, test);
  CHECK(e.accuracy > 0.95);
  CHECK(e.loss < before);
}

TEST_CASE("the model rejects weights, gradients and batches of the wrong size") {
  const auto d = cadence_test::synthetic(8, 2, 3, 0.1, 1);
  softmax_regression m(d.features(), d.classes, 4);
  std::vector<float> w(m.parameter_count()), g(m.parameter_count()), short_w(3);
  const std::vector<std::uint32_t> five = {0, 1, 2, 3, 4}, none;
  CHECK_THROWS_WITH_AS(m.gradient(short_w, d, five, g),
                       "cadence::train::softmax_regression::gradient: weights have 3 values, expected 15",
                       cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(m.gradient(w, d, five, g),
                       "cadence::train::softmax_regression::gradient: batch of 5 examples, expected 1..4",
                       cadence::invalid_parameter_error);
  CHECK_THROWS_AS(m.gradient(w, d, none, g), cadence::invalid_parameter_error);
  CHECK_THROWS_AS(softmax_regression::sgd_step(w, short_w, 0.1f), cadence::invalid_parameter_error);
  CHECK_THROWS_AS(softmax_regression(4, 1, 1), cadence::invalid_parameter_error);
}
