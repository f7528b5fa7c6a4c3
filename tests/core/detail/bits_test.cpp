#include <cadence/core/detail/bits.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

using namespace cadence::detail;

TEST_CASE("checked arithmetic reports overflow exactly at the type's limits") {
  using L = std::numeric_limits<std::int64_t>;
  std::int64_t r = 0;
  CHECK_FALSE(add_overflows<std::int64_t>(L::max() - 1, 1, &r));
  CHECK(r == L::max());
  CHECK(add_overflows<std::int64_t>(L::max(), 1, &r));
  CHECK(add_overflows<std::int64_t>(L::min(), -1, &r));
  CHECK_FALSE(sub_overflows<std::int64_t>(0, L::max(), &r));
  CHECK(r == -L::max());
  CHECK(sub_overflows<std::int64_t>(L::min(), 1, &r));
  CHECK(sub_overflows<std::int64_t>(0, L::min(), &r));
  CHECK_FALSE(mul_overflows<std::int64_t>(L::max() / 2, 2, &r));
  CHECK(mul_overflows<std::int64_t>(L::max() / 2 + 1, 2, &r));
  CHECK(mul_overflows<std::int64_t>(-1, L::min(), &r));
  std::uint32_t u = 0;
  CHECK(add_overflows<std::uint32_t>(0xffffffffu, 1u, &u));
  CHECK(sub_overflows<std::uint32_t>(0u, 1u, &u));
  CHECK_FALSE(mul_overflows<std::uint32_t>(0x10000u, 0xffffu, &u));
  CHECK(u == 0xffff0000u);
}

TEST_CASE("bit counts match their definitions") {
  CHECK(countr_zero(std::uint32_t{1}) == 0);
  CHECK(countr_zero(std::uint32_t{0x80000000u}) == 31);
  CHECK(countr_zero(std::uint32_t{12}) == 2);
  CHECK(countl_zero(std::uint32_t{1}) == 31);
  CHECK(countl_zero(std::uint32_t{0x80000000u}) == 0);
  CHECK(countl_zero(std::uint64_t{1}) == 63);
  CHECK(countl_zero(std::uint64_t{0xffu}) == 56);
}
