#include <cadence/core/span.hpp>

#include <doctest/doctest.h>

#include <numeric>
#include <type_traits>
#include <vector>

TEST_CASE("span views vectors, arrays and pointer ranges without copying") {
  std::vector<int> v{1, 2, 3, 4};
  cadence::span<const int> s(v);
  CHECK(s.size() == 4);
  CHECK(s.data() == v.data());
  CHECK(std::accumulate(s.begin(), s.end(), 0) == 10);
  CHECK(s.front() == 1);
  CHECK(s.back() == 4);
  CHECK(s.subspan(1, 2)[1] == 3);
  int a[3] = {7, 8, 9};
  cadence::span<int> m(a);
  m[0] = 70;
  CHECK(a[0] == 70);
  CHECK(cadence::span<const int>().empty());
  static_assert(std::is_trivially_copyable_v<cadence::span<const int>>);
  static_assert(!std::is_constructible_v<cadence::span<int>, const std::vector<int>&>);
}
