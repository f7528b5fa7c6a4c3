// A small synthetic classification problem for the train tests: each class is a random
// prototype image plus noise, so it is (nearly) linearly separable and learns in seconds.
#pragma once

#include <cadence/sim/random.hpp>
#include "idx.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cadence_test {

inline cadence::train::dataset synthetic(std::size_t n, std::size_t side, std::size_t classes, double noise,
                                         std::uint64_t seed, std::uint64_t prototype_seed = 42) {
  cadence::sim::random_stream proto_rng(prototype_seed), rng(seed);
  const std::size_t f = side * side;
  std::vector<float> proto(classes * f);
  for (float& v : proto) v = static_cast<float>(proto_rng.uniform());
  cadence::train::dataset d;
  d.rows = d.cols = side;
  d.classes = classes;
  d.images.resize(n * f);
  d.labels.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::size_t>(rng.uniform() * static_cast<double>(classes)) % classes;
    d.labels[i] = static_cast<std::uint8_t>(c);
    for (std::size_t j = 0; j < f; ++j) {
      const double v = proto[c * f + j] + noise * rng.normal();
      d.images[i * f + j] = static_cast<float>(v < 0 ? 0 : (v > 1 ? 1 : v));
    }
  }
  return d;
}

inline cadence::train::train_test_data synthetic_split(std::size_t train, std::size_t test) {
  return {synthetic(train, 6, 4, 0.35, 1), synthetic(test, 6, 4, 0.35, 2)};
}

}  // namespace cadence_test
