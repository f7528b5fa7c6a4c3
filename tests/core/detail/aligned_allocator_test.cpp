#include <cadence/core/detail/aligned_allocator.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

using cadence::detail::aligned_allocator;

TEST_CASE("aligned_allocator: every block starts on the boundary, through growth and copies") {
  std::vector<double, aligned_allocator<double>> v;
  for (int k = 0; k < 1000; ++k) {
    v.push_back(k);
    REQUIRE(reinterpret_cast<std::uintptr_t>(v.data()) % 64 == 0);
  }
  const auto copy = v;
  CHECK(reinterpret_cast<std::uintptr_t>(copy.data()) % 64 == 0);
  CHECK(copy == v);
  // Large blocks (mmap'd by glibc, page + 16 without the alignment) too.
  std::vector<char, aligned_allocator<char, 4096>> big(std::size_t{1} << 22);
  CHECK(reinterpret_cast<std::uintptr_t>(big.data()) % 4096 == 0);
}

TEST_CASE("aligned_allocator: a size past what the address space holds throws bad_array_new_length") {
  aligned_allocator<double> a;
  CHECK_THROWS_AS((void)a.allocate(static_cast<std::size_t>(-1) / 4), std::bad_array_new_length);
}
