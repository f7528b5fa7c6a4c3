#include <cadence/core/types.hpp>

#include <doctest/doctest.h>

#include <limits>

TEST_CASE("a default decision waits and releases nobody; unbounded staleness never binds") {
  const cadence::decision d;
  CHECK_FALSE(d.proceed);
  CHECK(d.released.empty());
  CHECK(cadence::unbounded_staleness == std::numeric_limits<cadence::clock_value>::max());
  static_assert(std::numeric_limits<cadence::worker_id>::max() >= 4'000'000'000u);
}
