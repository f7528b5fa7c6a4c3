#include <cadence/zipline/result.hpp>

#include <doctest/doctest.h>

TEST_CASE("zipline results compare equal only when spread, barrier and every choice agree") {
  const cadence::zipline_result<int> a{3, 10, {1, 2}};
  CHECK(a == cadence::zipline_result<int>{3, 10, {1, 2}});
  CHECK(a != cadence::zipline_result<int>{4, 10, {1, 2}});
  CHECK(a != cadence::zipline_result<int>{3, 11, {1, 2}});
  CHECK(a != cadence::zipline_result<int>{3, 10, {1, 3}});
  CHECK(a != cadence::zipline_result<int>{3, 10, {1}});
}
