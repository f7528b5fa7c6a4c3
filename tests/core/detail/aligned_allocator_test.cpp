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

TEST_CASE("aligned_allocator: blocks of 2 MiB and more start on a 2 MiB boundary") {
  // Where they are offered for transparent huge pages (Linux); smaller ones keep Align.
  using cadence::detail::huge_page_bytes;
  std::vector<double, aligned_allocator<double>> v;
  for (std::size_t n = 1; n <= (huge_page_bytes / sizeof(double)) * 4; n *= 2) {
    v.assign(n, 1.5);
    const auto at = reinterpret_cast<std::uintptr_t>(v.data());
    CAPTURE(n);
    REQUIRE(at % 64 == 0);
    if (v.capacity() * sizeof(double) >= huge_page_bytes) REQUIRE(at % huge_page_bytes == 0);
    CHECK(v.back() == 1.5);  // usable throughout
  }
  CHECK(aligned_allocator<double>::alignment_for(huge_page_bytes - 1) == 64);
  CHECK(aligned_allocator<double>::alignment_for(huge_page_bytes) == huge_page_bytes);
  CHECK((aligned_allocator<char, std::size_t{4} << 20>::alignment_for(huge_page_bytes)) ==
        std::size_t{4} << 20);
}

TEST_CASE("aligned_allocator: a size past what the address space holds throws bad_array_new_length") {
  aligned_allocator<double> a;
  CHECK_THROWS_AS((void)a.allocate(static_cast<std::size_t>(-1) / 4), std::bad_array_new_length);
}
