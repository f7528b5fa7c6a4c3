// zipline/variant.hpp: names, parsing and the dispatcher; and the property that every CPU
// variant returns exactly zipline_brute_force's answer (spread, barrier, choice) on every input.
#include <cadence/zipline/brute_force.hpp>
#include <cadence/zipline/variant.hpp>

#include "support/ragged_rows.hpp"
#include "support/separate_rows.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using cadence::rows_view;
using cadence::zipline_result;
using cadence::zipline_variant;

constexpr zipline_variant all_variants[] = {zipline_variant::paper, zipline_variant::paper_opt,
                                            zipline_variant::paper_opt_bs, zipline_variant::fast};

using cadence::test::ragged_rows;

/// n rows of 1..max_len strictly increasing values base + step * k for k in [0, span): small
/// spans make equal timestamps across rows common.
template <class T>
ragged_rows<T> random_rows(std::mt19937_64& rng, std::size_t max_n, std::size_t max_len,
                           std::uint64_t span, T base, T step) {
  ragged_rows<T> r;
  const std::size_t n = 1 + static_cast<std::size_t>(rng() % max_n);
  for (std::size_t p = 0; p < n; ++p) {
    const std::size_t len = 1 + static_cast<std::size_t>(rng() % max_len);
    std::vector<T> row;
    std::uint64_t k = rng() % span;
    for (std::size_t i = 0; i < len && k < span; ++i) {
      row.push_back(static_cast<T>(base + static_cast<T>(k) * step));
      k += 1 + rng() % 4;
    }
    r.add(row);
  }
  return r;
}

template <class T>
void check_all_variants(rows_view<T> rows, cadence::zipline_workspace<T>& ws) {
  const auto expected = cadence::zipline_brute_force(rows);
  zipline_result<T> got;
  for (const auto v : all_variants) {
    CAPTURE(cadence::to_string(v));
    cadence::zipline_solve(v, rows, ws, got);
    REQUIRE(got.spread == expected.spread);
    REQUIRE(got.barrier == expected.barrier);
    REQUIRE(got.choice == expected.choice);
  }
  CHECK(cadence::zipline(rows) == expected);
  CHECK(cadence::zipline_paper(rows) == expected);
  CHECK(cadence::zipline_paper_opt(rows) == expected);
  CHECK(cadence::zipline_paper_opt_bs(rows) == expected);
  CHECK(cadence::zipline_fast(rows) == expected);
  // The same rows, each in its own allocation (rows_view::separate), read in place.
  const cadence::test::separate_rows<T> separate(rows);
  for (const auto v : all_variants) {
    CAPTURE(cadence::to_string(v));
    cadence::zipline_solve(v, separate.view(), ws, got);
    REQUIRE(got == expected);
  }
}

// check_all_variants, and the answer they all gave (the brute force's) is the one given.
template <class T>
void check_answer(const ragged_rows<T>& rows, cadence::zipline_workspace<T>& ws, T spread, T barrier,
                  const std::vector<std::size_t>& choice) {
  check_all_variants(rows.view(), ws);
  const auto res = cadence::zipline_brute_force(rows.view());
  CHECK(res.spread == spread);
  CHECK(res.barrier == barrier);
  CHECK(res.choice == choice);
}

// `iterations` inputs random_rows<T>(rng, max_n, max_len, span(rng), base, step) drawn from
// one seed, each checked on every variant against the brute force.
template <class T>
void check_random_inputs(std::uint64_t seed, int iterations, std::size_t max_n, std::size_t max_len,
                         std::uint64_t (*span)(std::mt19937_64&), T base, T step) {
  std::mt19937_64 rng(seed);
  cadence::zipline_workspace<T> ws;
  for (int iter = 0; iter < iterations; ++iter) {
    const auto rows = random_rows<T>(rng, max_n, max_len, span(rng), base, step);
    check_all_variants(rows.view(), ws);
  }
}

// Spans of 1..40 grid steps: small ones make equal timestamps across rows common.
std::uint64_t small_span(std::mt19937_64& rng) { return 1 + rng() % 40; }

// Every input spans S grid steps.
template <std::uint64_t S>
std::uint64_t fixed_span(std::mt19937_64&) {
  return S;
}

}  // namespace

TEST_CASE("variant names round-trip through parse_zipline_variant and to_string") {
  for (const auto v : all_variants) CHECK(cadence::parse_zipline_variant(cadence::to_string(v)) == v);
  CHECK(cadence::to_string(zipline_variant::paper_opt_bs) == "opt-bs");
}

TEST_CASE("the run-time names configs and command lines use still pick the same algorithms") {
  CHECK(cadence::parse_zipline_variant("zipline") == zipline_variant::paper);
  CHECK(cadence::parse_zipline_variant("opt") == zipline_variant::paper_opt);
  CHECK(cadence::parse_zipline_variant("opt-bs") == zipline_variant::paper_opt_bs);
  CHECK(cadence::parse_zipline_variant("fast") == zipline_variant::fast);
}

TEST_CASE("an unknown variant name is a parse_error that lists the valid names") {
  for (const char* bad : {"", "Fast", "opt_bs", "thrust", "zipline "}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(cadence::parse_zipline_variant(bad), cadence::parse_error);
    CHECK_THROWS_WITH(cadence::parse_zipline_variant(bad),
                      doctest::Contains("valid: zipline, opt, opt-bs, fast"));
  }
  CHECK_THROWS_WITH(cadence::parse_zipline_variant("bogus"), doctest::Contains("'bogus'"));
}

TEST_CASE("every variant returns the brute-force answer on thousands of random integer inputs") {
  check_random_inputs<int>(20240601, 3000, 7, 8, small_span, -20, 1);
}

TEST_CASE("every variant returns the brute-force answer on thousands of random double inputs") {
  check_random_inputs<double>(77, 3000, 7, 8, small_span, -3.5, 0.25);
}

TEST_CASE("every variant returns the brute-force answer on wide random inputs") {
  check_random_inputs<std::int64_t>(5, 200, 40, 30, fixed_span<400>, 1000, 7);
}

TEST_CASE("values near the limits of the timestamp type do not overflow any variant") {
  // Each subcase from the same seed (doctest runs the test case once per subcase).
  constexpr std::uint64_t seed = 99;
  using i64 = std::numeric_limits<std::int64_t>;
  using u64 = std::numeric_limits<std::uint64_t>;
  SUBCASE("int64 just below its maximum") {
    check_random_inputs<std::int64_t>(seed, 500, 6, 6, fixed_span<30>, i64::max() - 40, 1);
  }
  SUBCASE("int64 just above its minimum") {
    check_random_inputs<std::int64_t>(seed, 500, 6, 6, fixed_span<30>, i64::min(), 1);
  }
  SUBCASE("int64 spanning almost its whole range") {
    const std::int64_t step = i64::max() / 16;
    check_random_inputs<std::int64_t>(seed, 500, 6, 6, fixed_span<16>, -8 * step, step);
  }
  SUBCASE("uint64 just below its maximum") {
    check_random_inputs<std::uint64_t>(seed, 500, 6, 6, fixed_span<30>, u64::max() - 40, 1);
  }
  SUBCASE("uint64 spanning its whole range") {
    check_random_inputs<std::uint64_t>(seed, 500, 6, 6, fixed_span<20>, 0, u64::max() / 20);
  }
  SUBCASE("int8 around zero") {
    check_random_inputs<std::int8_t>(seed, 500, 6, 6, fixed_span<120>, -60, 1);
  }
  SUBCASE("uint8 up to its maximum") {
    check_random_inputs<std::uint8_t>(seed, 500, 6, 6, fixed_span<255>, 0, 1);
  }
  SUBCASE("double values near its maximum") {
    const double big = std::numeric_limits<double>::max() / 4;
    check_random_inputs<double>(seed, 300, 6, 6, fixed_span<30>, big, big / 64);
  }
}

TEST_CASE("equal timestamps across rows do not change the answer") {
  cadence::zipline_workspace<int> ws;
  SUBCASE("all rows identical") {
    check_answer(ragged_rows<int>(std::vector<std::vector<int>>(5, {1, 4, 9})), ws, 0, 1,
                 std::vector<std::size_t>(5, 0));
  }
  SUBCASE("a tie at the barrier between rows of different lengths") {
    check_answer(ragged_rows<int>({{0, 10}, {5, 10}, {10}}), ws, 0, 10, {1, 1, 0});
  }
  SUBCASE("two optimal windows: the smaller barrier wins") {
    check_answer(ragged_rows<int>({{0, 100}, {3, 103}}), ws, 3, 3, {0, 0});
  }
}

TEST_CASE("a single row and rows of length one have the obvious answers") {
  cadence::zipline_workspace<double> ws;
  check_answer(ragged_rows<double>({{2.5, 3.0, 7.0}}), ws, 0.0, 2.5, {0});
  check_answer(ragged_rows<double>({{4.0}, {1.0}, {9.0}}), ws, 8.0, 9.0, {0, 0, 0});
}

TEST_CASE("matrix, ragged and separate layouts of the same rows give the same answer") {
  std::mt19937_64 rng(3);
  cadence::zipline_workspace<double> ws;
  for (int iter = 0; iter < 200; ++iter) {
    const std::size_t n = 1 + rng() % 10, r = 1 + rng() % 10;
    std::vector<double> m(n * r);
    std::vector<std::size_t> off(n + 1);
    for (std::size_t p = 0; p < n; ++p) {
      double t = static_cast<double>(rng() % 50);
      for (std::size_t i = 0; i < r; ++i) m[p * r + i] = t += static_cast<double>(1 + rng() % 9);
      off[p + 1] = (p + 1) * r;
    }
    const auto mat = rows_view<double>::matrix(m.data(), n, r);
    const auto rag = rows_view<double>::ragged(m.data(), off.data(), n);
    check_all_variants(mat, ws);
    const cadence::test::separate_rows<double> sep(mat);
    for (const auto v : all_variants) {
      CHECK(cadence::zipline_solve(v, mat) == cadence::zipline_solve(v, rag));
      CHECK(cadence::zipline_solve(v, mat) == cadence::zipline_solve(v, sep.view()));
    }
  }
}

TEST_CASE("a reused workspace gives the same answers as fresh ones across sizes") {
  std::mt19937_64 rng(11);
  cadence::zipline_workspace<std::int64_t> ws;
  zipline_result<std::int64_t> out;
  for (int iter = 0; iter < 300; ++iter) {
    const std::size_t max_n = (iter % 3 == 0) ? 60 : 4;
    const auto rows = random_rows<std::int64_t>(rng, max_n, 20, 200, 0, 3);
    for (const auto v : all_variants) {
      cadence::zipline_solve(v, rows.view(), ws, out);
      CHECK(out == cadence::zipline_solve(v, rows.view()));
    }
  }
}

TEST_CASE("bad input is rejected by every variant with a message naming the problem") {
  cadence::zipline_workspace<double> ws;
  zipline_result<double> out;
  ragged_rows<double> empty_row, unsorted, repeated, with_nan, with_inf;
  empty_row.add({1.0});
  empty_row.add({});
  unsorted.add({1.0, 3.0, 2.0});
  repeated.add({1.0, 1.0});
  with_nan.add({1.0, std::nan("")});
  with_inf.add({1.0});
  with_inf.add({std::numeric_limits<double>::infinity()});
  using cadence::test::separate_rows;
  const separate_rows<double> empty_row_s(empty_row.view()), unsorted_s(unsorted.view()),
      repeated_s(repeated.view()), with_nan_s(with_nan.view()), with_inf_s(with_inf.view());
  for (const auto v : all_variants) {
    // Distinct names make one subcase per variant inside the loop.
    SUBCASE(cadence::to_string(v).data()) {
      CHECK_THROWS_WITH_AS(cadence::zipline_solve(v, rows_view<double>(), ws, out),
                           doctest::Contains("n = 0"), cadence::zipline_input_error);
      // Ragged rows, then the same rows each in its own allocation: the same errors.
      for (const bool sep : {false, true}) {
        CAPTURE(sep);
        CHECK_THROWS_WITH_AS(
            cadence::zipline_solve(v, sep ? empty_row_s.view() : empty_row.view(), ws, out),
            doctest::Contains("row 1 is empty"), cadence::zipline_input_error);
        CHECK_THROWS_WITH_AS(
            cadence::zipline_solve(v, sep ? unsorted_s.view() : unsorted.view(), ws, out),
            doctest::Contains("row 0 is not strictly increasing at index 2"),
            cadence::zipline_input_error);
        CHECK_THROWS_AS(cadence::zipline_solve(v, sep ? repeated_s.view() : repeated.view(), ws, out),
                        cadence::zipline_input_error);
        CHECK_THROWS_WITH_AS(
            cadence::zipline_solve(v, sep ? with_nan_s.view() : with_nan.view(), ws, out),
            doctest::Contains("not finite (nan)"), cadence::zipline_input_error);
        CHECK_THROWS_WITH_AS(
            cadence::zipline_solve(v, sep ? with_inf_s.view() : with_inf.view(), ws, out),
            doctest::Contains("row 1 index 0 is not finite (inf)"), cadence::zipline_input_error);
      }
    }
  }
}

TEST_CASE("integer inputs whose range overflows the type are rejected") {
  ragged_rows<std::int64_t> r;
  r.add({std::numeric_limits<std::int64_t>::min()});
  r.add({std::numeric_limits<std::int64_t>::max()});
  for (const auto v : all_variants)
    CHECK_THROWS_WITH_AS(cadence::zipline_solve(v, r.view()),
                         doctest::Contains("cannot represent"), cadence::zipline_input_error);
}
