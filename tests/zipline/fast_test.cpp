// zipline/fast.hpp: zipline_fast matches the oracle on the inputs its shortcuts are most
// likely to get wrong (trimming, clustered buckets, other timestamp types), stops allocating
// once its workspace has grown, and is what cadence::zipline runs.
#include <cadence/zipline/brute_force.hpp>
#include <cadence/zipline/fast.hpp>
#include <cadence/zipline/paper.hpp>

#include "support/message_of.hpp"
#include "support/ragged_rows.hpp"
#include "support/separate_rows.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using cadence::test::ragged_rows;

/// Rows like the ElasticBSP generator's predictions: constant per-row interval, random start.
template <class T>
ragged_rows<T> periodic_rows(std::mt19937_64& rng, std::size_t n, std::size_t r, std::uint64_t lo,
                            std::uint64_t hi, std::uint64_t start_spread) {
  ragged_rows<T> rows;
  for (std::size_t p = 0; p < n; ++p) {
    const auto interval = static_cast<T>(lo + rng() % (hi - lo + 1));
    const auto start = static_cast<T>(rng() % start_spread);
    std::vector<T> row(r);
    for (std::size_t i = 0; i < r; ++i) row[i] = static_cast<T>(start + static_cast<T>(i + 1) * interval);
    rows.add(row);
  }
  return rows;
}

}  // namespace

TEST_CASE("zipline_fast matches the oracle on generator-like periodic rows") {
  std::mt19937_64 rng(1);
  cadence::zipline_workspace<double> ws;
  cadence::zipline_result<double> out;
  for (int iter = 0; iter < 40; ++iter) {
    const auto rows = periodic_rows<double>(rng, 1 + rng() % 60, 1 + rng() % 20, 1000, 1500,
                                            1 + rng() % 20000);
    cadence::zipline_fast(rows.view(), ws, out);
    CHECK(out == cadence::zipline_brute_force(rows.view()));
  }
}

TEST_CASE("zipline_fast trims rows that start late or end early without losing the answer") {
  ragged_rows<std::int64_t> rows;
  rows.add({0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100});
  rows.add({44, 47});  // every row has a point by 46; the best window is [46, 50]
  rows.add({1, 2, 3, 43, 48, 90, 91, 92});
  rows.add({46, 200, 300});
  CHECK(cadence::zipline_fast(rows.view()) == cadence::zipline_brute_force(rows.view()));
  const auto res = cadence::zipline_fast(rows.view());
  CHECK(res.spread == 4);
  CHECK(res.barrier == 50);
  CHECK(res.choice == std::vector<std::size_t>{5, 1, 4, 0});
}

TEST_CASE("zipline_fast matches the oracle when most points share one bucket") {
  // A far outlier makes the buckets wide, so the cluster lands in very few of them and the
  // per-bucket sort fallback runs.
  std::mt19937_64 rng(8);
  for (int iter = 0; iter < 20; ++iter) {
    ragged_rows<std::int64_t> rows;
    rows.add({0, 1000000000});
    const std::size_t n = 2 + rng() % 30;
    for (std::size_t p = 0; p < n; ++p) {
      std::vector<std::int64_t> row;
      std::int64_t t = 500000000 + static_cast<std::int64_t>(rng() % 50);
      for (std::size_t i = 0, len = 20 + rng() % 60; i < len; ++i)
        row.push_back(t += 1 + static_cast<std::int64_t>(rng() % 3));
      rows.add(row);
    }
    CHECK(cadence::zipline_fast(rows.view()) == cadence::zipline_brute_force(rows.view()));
  }
}

TEST_CASE("zipline_fast works for float, long double and unsigned timestamps") {
  std::mt19937_64 rng(4);
  for (int iter = 0; iter < 50; ++iter) {
    const auto n = 1 + rng() % 12, r = 1 + rng() % 12;
    const auto f = periodic_rows<float>(rng, n, r, 3, 9, 40);
    CHECK(cadence::zipline_fast(f.view()) == cadence::zipline_brute_force(f.view()));
    const auto ld = periodic_rows<long double>(rng, n, r, 3, 9, 40);
    CHECK(cadence::zipline_fast(ld.view()) == cadence::zipline_brute_force(ld.view()));
    const auto u = periodic_rows<std::uint32_t>(rng, n, r, 3, 9, 40);
    CHECK(cadence::zipline_fast(u.view()) == cadence::zipline_brute_force(u.view()));
  }
}

TEST_CASE("zipline_fast does not grow its workspace or result once warmed up") {
  std::mt19937_64 rng(2);
  const auto big = periodic_rows<double>(rng, 200, 15, 1000, 1500, 3000);
  const auto small = periodic_rows<double>(rng, 50, 15, 1000, 1500, 3000);
  cadence::zipline_workspace<double> ws;
  cadence::zipline_result<double> out;
  cadence::zipline_fast(big.view(), ws, out);
  // Its buffers only grow, so an unchanged size means no buffer was allocated again.
  const std::size_t warmed = ws.bytes_reserved();
  CHECK(warmed > 0);
  const auto* choice = out.choice.data();
  for (int k = 0; k < 3; ++k) {
    cadence::zipline_fast(small.view(), ws, out);
    CHECK(out == cadence::zipline_brute_force(small.view()));
    cadence::zipline_fast(big.view(), ws, out);
    CHECK(ws.bytes_reserved() == warmed);
    CHECK(out.choice.data() == choice);
  }
}

TEST_CASE("cadence::zipline is zipline_fast: the same answers from the same workspace") {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 20; ++iter) {
    const auto rows = periodic_rows<double>(rng, 1 + rng() % 60, 1 + rng() % 20, 1000, 1500,
                                            1 + rng() % 20000);
    cadence::zipline_workspace<double> ws, fast_ws;
    cadence::zipline_result<double> out, fast_out;
    cadence::zipline(rows.view(), ws, out);
    cadence::zipline_fast(rows.view(), fast_ws, fast_out);
    CHECK(out == cadence::zipline_brute_force(rows.view()));
    CHECK(out == fast_out);
    CHECK(cadence::zipline(rows.view()) == out);
    // The paper's algorithms fill other buffers, so equal footprints pin the algorithm.
    CHECK(ws.bytes_reserved() == fast_ws.bytes_reserved());
  }
}

namespace {

/// Random strictly increasing rows: point k of the grid is value(k); grid positions advance
/// by 1..4, so equal values across rows are common.
template <class T, class F>
ragged_rows<T> grid_rows(std::mt19937_64& rng, std::size_t n, std::size_t len, std::uint64_t span,
                        F value) {
  ragged_rows<T> rows;
  for (std::size_t p = 0; p < n; ++p) {
    std::vector<T> row;
    std::uint64_t k = rng() % span;
    for (std::size_t i = 0; i < len; ++i, k += 1 + rng() % 4) row.push_back(value(k));
    rows.add(row);
  }
  return rows;
}

template <class T>
void check_fast(const ragged_rows<T>& rows) {
  CHECK(cadence::zipline_fast(rows.view()) == cadence::zipline_brute_force(rows.view()));
}

}  // namespace

TEST_CASE("zipline_fast's trim bound covers d(L), also when rows do not overlap") {
  // The trim bounds d(L) = L - min_p pred_p(L) by max(largest gap, L - min_p last(p)) from
  // validation alone; the cut must leave every barrier up to min_p last(p) + d(L).
  std::mt19937_64 rng(21);
  const auto check_bound = [](const auto& rows) {
    using T = typename std::decay_t<decltype(rows.values)>::value_type;
    const auto view = rows.view();
    std::vector<T> gaps(view.size());
    cadence::detail::zipline_row_ends<T> ends{};
    REQUIRE(cadence::detail::zipline_rows_valid_gaps(view, gaps.data(), &ends));
    T lowest = ends.max_front;  // min_p pred_p(L), by a linear scan
    for (std::size_t p = 0; p < view.size(); ++p) {
      const auto row = view[p];
      std::size_t j = 0;
      while (j + 1 < row.size() && row[j + 1] <= ends.max_front) ++j;
      if (row[j] < lowest) lowest = row[j];
    }
    const auto bounds = cadence::detail::zipline_fast_trim_bounds(ends);
    CHECK(bounds.front == ends.max_front);
    CHECK(bounds.front_row == ends.front_row);
    CHECK(!(bounds.cut < ends.min_back + (ends.max_front - lowest)));
  };
  for (int iter = 0; iter < 200; ++iter) {
    ragged_rows<std::int64_t> ints;
    ragged_rows<double> doubles;
    const std::size_t n = 2 + rng() % (iter % 4 == 0 ? 400 : 12);
    for (std::size_t p = 0; p < n; ++p) {
      // Starts spread far wider than the rows are long: some rows end before others start.
      const auto start = static_cast<std::int64_t>(rng() % 5000);
      const std::size_t len = 1 + rng() % 8;
      std::vector<std::int64_t> row(len);
      std::int64_t t = start;
      for (auto& x : row) x = (t += 1 + static_cast<std::int64_t>(rng() % 300));
      ints.add(row);
      std::vector<double> drow(row.begin(), row.end());
      for (auto& x : drow) x *= 0.1;  // no exact keys: the bucket path
      doubles.add(drow);
    }
    CAPTURE(iter);
    check_bound(ints);
    check_bound(doubles);
    CHECK(cadence::zipline_fast(ints.view()) == cadence::zipline_paper_opt_bs(ints.view()));
    CHECK(cadence::zipline_fast(doubles.view()) == cadence::zipline_paper_opt_bs(doubles.view()));
  }
  ragged_rows<std::int64_t> apart;
  apart.add({0, 1, 2});
  apart.add({10, 11});  // L = 10, min_p last(p) = 2: d(L) = 8, wider than every gap
  CHECK(cadence::zipline_fast(apart.view()) == cadence::zipline_brute_force(apart.view()));
  CHECK(cadence::zipline_fast(apart.view()).spread == 8);
}

TEST_CASE("zipline_fast matches the oracle on doubles without exact keys (general path)") {
  // Multiples of 0.1 and arbitrary reals are not on a power-of-two grid: the exact-key path
  // declines and the bucket sort with per-bucket insertion runs.
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int iter = 0; iter < 200; ++iter) {
    const std::size_t n = 1 + rng() % 30, len = 1 + rng() % 15;
    check_fast(grid_rows<double>(rng, n, len, 40, [](std::uint64_t k) { return 0.1 * static_cast<double>(k); }));
    check_fast(grid_rows<double>(rng, n, len, 40, [&](std::uint64_t k) {
      return static_cast<double>(k) + u(rng) * 0.5;
    }));
  }
}

TEST_CASE("zipline_fast's exact keys cover power-of-two grids, large offsets and zero") {
  std::mt19937_64 rng(13);
  for (int iter = 0; iter < 200; ++iter) {
    const std::size_t n = 1 + rng() % 30, len = 1 + rng() % 15;
    // Eighths around a million; epoch milliseconds; halves across zero.
    check_fast(grid_rows<double>(rng, n, len, 60, [](std::uint64_t k) { return 1e6 + static_cast<double>(k) / 8; }));
    check_fast(grid_rows<double>(rng, n, len, 60, [](std::uint64_t k) { return 1.7e12 + static_cast<double>(k); }));
    check_fast(grid_rows<double>(rng, n, len, 60, [](std::uint64_t k) { return static_cast<double>(k) / 2 - 15; }));
    // Values beyond 2^53 (a negative scale): of one sign, and straddling zero.
    check_fast(grid_rows<double>(rng, n, len, 60, [](std::uint64_t k) { return std::ldexp(1.0, 60) + static_cast<double>(k) * 1024; }));
    check_fast(grid_rows<double>(rng, n, len, 60, [](std::uint64_t k) { return (static_cast<double>(k) - 30) * std::ldexp(1.0, 58); }));
    // Subnormals around zero.
    check_fast(grid_rows<double>(rng, n, len, 60, [](std::uint64_t k) {
      return (static_cast<double>(k) - 30) * std::numeric_limits<double>::denorm_min();
    }));
    check_fast(grid_rows<float>(rng, n, len, 60, [](std::uint64_t k) { return static_cast<float>(k) / 4 + 3000.0f; }));
  }
}

TEST_CASE("zipline_fast recounts when a point has a low bit the rows' first points lack") {
  // Every row starts on a multiple of 8 (the guess of the keys' common zero bits) but later
  // points are odd; the answer must not change.
  std::mt19937_64 rng(14);
  for (int iter = 0; iter < 200; ++iter) {
    const std::size_t n = 2 + rng() % 20;
    ragged_rows<std::int64_t> rows;
    ragged_rows<double> drows;
    for (std::size_t p = 0; p < n; ++p) {
      std::vector<std::int64_t> row{8 * static_cast<std::int64_t>(rng() % 4)};
      for (std::size_t i = 0, len = rng() % 12; i < len; ++i)
        row.push_back(row.back() + 1 + static_cast<std::int64_t>(rng() % 9));
      rows.add(row);
      drows.add(std::vector<double>(row.begin(), row.end()));
    }
    check_fast(rows);
    check_fast(drows);
  }
}

TEST_CASE("zipline_fast uses 64-bit records when key and row do not fit in 32 bits") {
  std::mt19937_64 rng(15);
  for (int iter = 0; iter < 50; ++iter) {
    // Keys of about 30 bits and up to 300 rows (9 bits).
    const std::size_t n = 2 + rng() % 300;
    check_fast(grid_rows<std::int64_t>(rng, n, 1 + rng() % 6, 8, [](std::uint64_t k) {
      return static_cast<std::int64_t>(k) * 150000001;
    }));
    check_fast(grid_rows<std::uint32_t>(rng, n, 1 + rng() % 6, 8, [](std::uint64_t k) {
      return static_cast<std::uint32_t>(k * 100000001u);  // k < 40: no wrap
    }));
  }
}

TEST_CASE("zipline_fast handles surviving points that are all equal") {
  ragged_rows<double> rows;
  rows.add({1.0, 5.0, 9.0});
  rows.add({5.0});
  rows.add({5.0, 7.0});
  check_fast(rows);
  const auto res = cadence::zipline_fast(rows.view());
  CHECK(res.spread == 0.0);
  CHECK(res.barrier == 5.0);
  CHECK(res.choice == std::vector<std::size_t>{1, 0, 0});
  ragged_rows<std::int8_t> same;
  for (int p = 0; p < 4; ++p) same.add({-7});
  check_fast(same);
}

namespace {
template <class T>
std::string fast_error(cadence::rows_view<T> rows) {
  return cadence::test::message_of<cadence::zipline_input_error>(
      [&] { (void)cadence::zipline_fast(rows); });
}
template <class T>
std::string validate_error(cadence::rows_view<T> rows) {
  return cadence::test::message_of<cadence::zipline_input_error>([&] { cadence::validate(rows); });
}
}  // namespace

TEST_CASE("zipline_fast reports exactly validate's error when several problems exist") {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const std::vector<std::vector<std::vector<double>>> cases = {
      {{1, 2, 3}, {}, {nan}},               // empty row before a NaN row
      {{1, nan, 0}, {}},                    // NaN inside a row, then an empty row
      {{1, 3, 2, inf}, {5}},                // unsorted before an infinity in the same row
      {{-inf, 1}, {2, 1}},                  // -inf first
      {{1, 2}, {3, 4, 4, nan}},             // repeat in a later row
      {{0, 1e308}, {-1e308, 2}},            // span overflows
      {{1, 2}, {0.5, 1.5, 1.5}},            // the last pair only
  };
  for (const auto& c : cases) {
    ragged_rows<double> rows;
    for (const auto& r : c) rows.add(r);
    const std::string expected = validate_error(rows.view());
    CAPTURE(expected);
    CHECK(expected != cadence::test::no_exception);
    CHECK(fast_error(rows.view()) == expected);
  }
  ragged_rows<std::int32_t> wide;
  wide.add({std::numeric_limits<std::int32_t>::min(), 0});
  wide.add({5, std::numeric_limits<std::int32_t>::max()});
  CHECK(fast_error(wide.view()) == validate_error(wide.view()));
  CHECK(fast_error(cadence::rows_view<double>()) == validate_error(cadence::rows_view<double>()));
}

TEST_CASE("zipline_fast's general path sorts clustered fine buckets (non-dyadic doubles)") {
  // As the clustered int64 test, but with values off every power-of-two grid so the general
  // path runs: one huge fine bucket (std::sort) and, in the same coarse bucket, a few
  // points two fine buckets later (insertion sort).
  std::mt19937_64 rng(16);
  for (int iter = 0; iter < 20; ++iter) {
    ragged_rows<double> rows;
    rows.add({0.0, 1e9});
    const std::size_t n = 2 + rng() % 30;
    for (std::size_t p = 0; p < n; ++p) {
      std::vector<double> row;
      double t = 5e8 + 0.3 * static_cast<double>(rng() % 50);
      for (std::size_t i = 0, len = 20 + rng() % 60; i < len; ++i)
        row.push_back(t += 0.3 * static_cast<double>(1 + rng() % 3));
      if (p % 8 == 0) row.push_back(5.01e8 + 0.7 * static_cast<double>(p));
      rows.add(row);
    }
    check_fast(rows);
  }
  std::mt19937_64 rng2(17);
  for (int iter = 0; iter < 50; ++iter)  // integer keys wider than 32 bits
    check_fast(grid_rows<std::int64_t>(rng2, 1 + rng2() % 20, 1 + rng2() % 10, 30, [](std::uint64_t k) {
      return static_cast<std::int64_t>(k) * (std::int64_t{1} << 40) - (std::int64_t{1} << 44);
    }));
}

TEST_CASE("zipline_fast's row subset gives the whole input's answer, in one round or two") {
  // n >= 256 rows take the subset path: round 1 sweeps the rows with the largest gaps and
  // checks that every row left out has a point in its optimal window; round 2 (when one does
  // not) sweeps the certified superset. Steps spread widely (round 1 passes), narrowly (round
  // 2 needed), all equal, and rows ending early (left out, then checked like the others).
  std::mt19937_64 rng(7);
  int rounds_seen[3] = {0, 0, 0};
  for (int trial = 0; trial < 48; ++trial) {
    CAPTURE(trial);
    const auto [n, r, mode, ints, doubles] = cadence::test::draw_subset_trial(rng, trial, 1200);
    const auto want_ints = cadence::zipline_paper_opt_bs(ints.view());
    const auto want_doubles = cadence::zipline_paper_opt_bs(doubles.view());
    cadence::zipline_workspace<std::int64_t> ws;
    cadence::zipline_result<std::int64_t> got;
    cadence::zipline_fast(ints.view(), ws, got);
    CHECK(got == want_ints);
    const int rounds = cadence::detail::zipline_workspace_access::buffers(ws).subset_rounds;
    REQUIRE(rounds >= 0);
    REQUIRE(rounds <= 2);
    ++rounds_seen[rounds];
    CHECK(cadence::zipline_fast(doubles.view()) == want_doubles);
    // The subset, trim and key passes read rows through row_data: separate rows too.
    const cadence::test::separate_rows<std::int64_t> ints_s(ints.view());
    const cadence::test::separate_rows<double> doubles_s(doubles.view());
    CHECK(cadence::zipline_fast(ints_s.view()) == want_ints);
    CHECK(cadence::zipline_fast(doubles_s.view()) == want_doubles);
  }
  // Both ways out of the subset search were taken (n >= 256 always takes it).
  CHECK(rounds_seen[0] == 0);
  CHECK(rounds_seen[1] > 0);
  CHECK(rounds_seen[2] > 0);
}

TEST_CASE("zipline_fast's exact keys handle a spread of 2^32 - 1, the widest they hold") {
  // Keys are offsets in 32 bits; a spread of 2^32 - 1 is a real answer, not a sentinel.
  const std::int64_t w = 4294967295;  // 2^32 - 1
  ragged_rows<std::int64_t> two, three;
  two.add({0});
  two.add({w});
  three.add({0, w - 2});
  three.add({1, w - 1});
  three.add({w});
  for (const auto* rows : {&two, &three}) {
    const auto got = cadence::zipline_fast(rows->view());
    CHECK(got == cadence::zipline_brute_force(rows->view()));
  }
  CHECK(cadence::zipline_fast(two.view()).spread == w);
}
