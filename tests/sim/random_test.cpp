#include <cadence/sim/random.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

using cadence::sim::mix_seed;
using cadence::sim::random_stream;

namespace {
struct moments {
  double mean = 0, variance = 0;
};
template <class Draw>
moments sample(Draw&& draw, int n) {
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = draw();
    sum += x;
    sum2 += x * x;
  }
  const double mean = sum / n;
  return {mean, sum2 / n - mean * mean};
}
}  // namespace

TEST_CASE("a random stream repeats exactly for the same seed and differs for another") {
  random_stream a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const double x = a.normal();
    CHECK(x == b.normal());
    differs = differs || x != c.normal();
  }
  CHECK(differs);
}

TEST_CASE("uniform draws lie in [0, 1) and the first one is fixed by mt19937_64's definition") {
  random_stream r(5489);  // std::mt19937_64's default seed: its first output is standardised
  const double first = r.uniform();
  CHECK(first == static_cast<double>(14514284786278117030ULL >> 11) * 0x1.0p-53);
  for (int i = 0; i < 10000; ++i) {
    const double u = r.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
  }
}

TEST_CASE("normal draws have mean 0 and variance 1") {
  random_stream r(7);
  const auto m = sample([&] { return r.normal(); }, 200000);
  CHECK(m.mean == doctest::Approx(0.0).epsilon(0.01).scale(1.0));
  CHECK(m.variance == doctest::Approx(1.0).epsilon(0.01));
}

TEST_CASE("log-normal draws have the requested mean and coefficient of variation") {
  random_stream r(11);
  const auto m = sample([&] { return r.lognormal(0.17, 0.2); }, 200000);
  CHECK(m.mean == doctest::Approx(0.17).epsilon(0.01));
  CHECK(std::sqrt(m.variance) / m.mean == doctest::Approx(0.2).epsilon(0.03));
}

TEST_CASE("exponential draws are positive with the requested mean") {
  random_stream r(13);
  const auto m = sample([&] { return r.exponential(3.0); }, 200000);
  CHECK(m.mean == doctest::Approx(3.0).epsilon(0.02));
}

TEST_CASE("mixed seeds give distinct streams for neighbouring workers") {
  std::vector<std::uint64_t> seeds;
  for (std::uint64_t p = 0; p < 1000; ++p) seeds.push_back(mix_seed(1, p));
  for (std::size_t i = 1; i < seeds.size(); ++i) CHECK(seeds[i] != seeds[i - 1]);
  CHECK(mix_seed(1, 0) != mix_seed(2, 0));
}
