// io/generator.hpp: the synthetic generator is deterministic per seed, honours its options
// and rejects bad ones.
#include <cadence/io/generator.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

TEST_CASE("the generator gives each worker a constant interval in range and a start below it") {
  cadence::generator_options o{/*workers=*/50, /*pushes=*/20};
  o.seed = 7;
  const auto h = cadence::generate_push_history(o);
  REQUIRE(h.size() == 50);
  for (std::size_t p = 0; p < h.size(); ++p) {
    CHECK(h.ids()[p] == static_cast<std::int64_t>(p));
    const auto row = h.row(p);
    REQUIRE(row.size() == 20);
    const std::int64_t interval = row[1] - row[0];
    CHECK(interval >= 1000);
    CHECK(interval <= 1500);
    CHECK(row[0] >= 0);
    CHECK(row[0] < interval);
    for (std::size_t j = 1; j < row.size(); ++j) CHECK(row[j] - row[j - 1] == interval);
  }
}

TEST_CASE("the same seed gives the same history and another seed a different one") {
  cadence::generator_options o{/*workers=*/10, /*pushes=*/5};
  const auto a = cadence::generate_push_history(o);
  CHECK(a == cadence::generate_push_history(o));
  o.seed = 2;
  CHECK(a != cadence::generate_push_history(o));
}

TEST_CASE("the generator's output is fixed across standard libraries") {
  // Pinned values: the distribution is implemented in Cadence, not taken from <random>.
  const auto h = cadence::generate_push_history({/*workers=*/2, /*pushes=*/2});
  const auto r0 = h.row(0), r1 = h.row(1);
  CHECK(std::vector<std::int64_t>{r0[0], r0[1], r1[0], r1[1]} == std::vector<std::int64_t>{78, 1194, 370, 1823});
}

TEST_CASE("bad generator options are invalid_parameter_errors naming the option") {
  // Each case spoils one field of valid options; the error must contain `names`.
  struct bad_options {
    void (*spoil)(cadence::generator_options&);
    const char* names;
  };
  const bad_options cases[] = {
      {[](cadence::generator_options& o) { o.workers = 0; }, "workers must be >= 1"},
      {[](cadence::generator_options& o) { o.pushes = 0; }, "pushes must be >= 1"},
      {[](cadence::generator_options& o) { o.interval_lo = 2000; }, "interval_lo"},
      {[](cadence::generator_options& o) { o.interval_lo = 0; o.interval_hi = 5; },
       "interval_lo <= interval_hi, got 0,5"},
  };
  for (const auto& c : cases) {
    cadence::generator_options o{/*workers=*/3, /*pushes=*/3};
    c.spoil(o);
    CHECK_THROWS_WITH_AS(cadence::generate_push_history(o), doctest::Contains(c.names),
                         cadence::invalid_parameter_error);
  }
}
