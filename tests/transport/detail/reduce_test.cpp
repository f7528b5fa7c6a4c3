// cadence/transport/detail/reduce.hpp: the averaging division the backends fuse into their last
// pass, and the chunk arithmetic that keeps every message below a backend's limit, checked at
// sizes above 4 GiB without allocating them.
#include <cadence/transport/detail/reduce.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace cadence::transport;
using namespace cadence::transport::detail;

TEST_CASE("the fused division gives the bits of a sum followed by a division, for every rank count") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1e6, 1e6);
  for (int n = 1; n <= 9; ++n) {
    std::vector<double> acc(257), in(257), fused, separate;
    for (std::size_t i = 0; i < acc.size(); ++i) {
      acc[i] = u(rng);
      in[i] = u(rng);
    }
    fused = acc;
    reduce_divide_into(fused.data(), in.data(), fused.size(), dtype::f64, n);
    separate = acc;
    reduce_into(separate.data(), in.data(), separate.size(), dtype::f64, reduce_op::sum);
    for (double& v : separate) v /= n;
    CHECK(fused == separate);
    std::vector<float> f(acc.begin(), acc.end()), g(in.begin(), in.end()), h = f;
    reduce_divide_into(f.data(), g.data(), f.size(), dtype::f32, n);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = (h[i] + g[i]) / static_cast<float>(n);
    CHECK(f == h);
  }
}

TEST_CASE("division by a power of two is multiplication by its reciprocal; other counts divide") {
  CHECK(power_of_two(1));
  CHECK(power_of_two(2));
  CHECK(power_of_two(64));
  CHECK_FALSE(power_of_two(3));
  CHECK_FALSE(power_of_two(12));
  // 1/3 is not exact: division keeps 3 * k / 3 == k, multiplication by 0.333... would not.
  std::vector<float> v = {3.0f, 9.0f, 3e7f, 0.3f};
  std::vector<float> out(v.size());
  divide_into(out.data(), v.data(), v.size(), dtype::f32, 3.0);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 3.0f);
  CHECK(out[2] == 1e7f);
  CHECK(out[3] == 0.3f / 3.0f);
  CHECK(averageable(dtype::f32));
  CHECK(averageable(dtype::f64));
  CHECK_FALSE(averageable(dtype::i32));
  CHECK_FALSE(averageable(dtype::u8));
}

TEST_CASE("chunks cover any size exactly, above 4 GiB too, and never exceed the limit") {
  static_assert(sizeof(std::size_t) >= 8, "the cases below need 64-bit sizes");
  const std::size_t gib = std::size_t{1} << 30;
  CHECK(chunk_count(0, gib) == 0);
  CHECK(chunk_count(1, gib) == 1);
  CHECK(chunk_count(gib, gib) == 1);
  CHECK(chunk_count(gib + 1, gib) == 2);
  // A 4 GiB f32 tensor on two ranks: each ring segment is 2 GiB, more than MPI's int count.
  const std::size_t segment = (std::size_t{4} << 30) / 2;
  CHECK(segment > static_cast<std::size_t>(std::numeric_limits<int>::max()));
  const std::size_t piece = element_limit(std::size_t{1} << 30, sizeof(float));
  CHECK(chunk_count(segment, piece) == 2);
  CHECK(chunk_length(segment, piece, 0) == piece);
  CHECK(chunk_length(segment, piece, 1) == piece);
  // An odd size far above 4 GiB: the pieces add up to it, the last one shorter.
  const std::size_t odd = (std::size_t{9} << 30) + 12345;
  const std::size_t limit = element_limit(std::numeric_limits<int>::max(), 8);
  CHECK(limit % 8 == 0);
  CHECK(limit <= static_cast<std::size_t>(std::numeric_limits<int>::max()));
  std::size_t total = 0;
  for (std::size_t k = 0; k < chunk_count(odd, limit); ++k) {
    CHECK(chunk_length(odd, limit, k) <= limit);
    CHECK(chunk_length(odd, limit, k) > 0);
    total += chunk_length(odd, limit, k);
  }
  CHECK(total == odd);
  // A limit below one element still moves whole elements.
  CHECK(element_limit(3, 8) == 8);
  CHECK(element_limit(20, 8) == 16);
}
