#include <cadence/sim/metrics.hpp>

#include <doctest/doctest.h>

using cadence::sim::histogram_quantile;

TEST_CASE("histogram quantiles are the smallest bucket holding at least that share of the mass") {
  const std::vector<std::uint64_t> h{5, 0, 4, 1};  // 10 pushes at staleness 0, 2, 2.., 3
  CHECK(histogram_quantile(h, 0.5) == 0);
  CHECK(histogram_quantile(h, 0.51) == 2);
  CHECK(histogram_quantile(h, 0.9) == 2);
  CHECK(histogram_quantile(h, 0.99) == 3);
  CHECK(histogram_quantile(h, 1.0) == 3);
  CHECK(histogram_quantile({}, 0.5) == 0);
  CHECK(histogram_quantile({0, 0}, 0.5) == 0);
}
