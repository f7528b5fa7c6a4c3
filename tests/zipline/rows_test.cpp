#include <cadence/zipline/rows.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace cadence;

TEST_CASE("rows_view exposes matrix and ragged layouts alike") {
  const std::vector<double> m{1, 2, 3, 4, 5, 6};
  const auto v = rows_view<double>::matrix(m.data(), 2, 3);
  CHECK(v.size() == 2);
  CHECK(v.total() == 6);
  CHECK(v.is_matrix());
  CHECK(v[1][0] == 4);
  const std::vector<std::size_t> off{2, 3, 6};  // offsets need not start at 0
  const auto r = rows_view<double>::ragged(m.data(), off.data(), 2);
  CHECK(r.total() == 4);
  CHECK(r.row_size(0) == 1);
  CHECK(r[0][0] == 3);
  CHECK(r[1].back() == 6);
  CHECK(r.values()[0] == 3);
  CHECK(r.is_contiguous());
}

TEST_CASE("rows_view reads separately allocated rows in place") {
  const std::vector<double> a{1, 2, 3}, b{7}, c{4, 5};
  const double* const rows[] = {a.data(), b.data(), c.data()};
  const std::vector<std::size_t> off{10, 13, 14, 16};  // lengths 3, 1, 2; need not start at 0
  const auto v = rows_view<double>::separate(rows, off.data(), 3);
  CHECK(v.size() == 3);
  CHECK(v.total() == 6);
  CHECK_FALSE(v.is_matrix());
  CHECK_FALSE(v.is_contiguous());
  CHECK(v.values() == nullptr);
  CHECK(v.row_size(1) == 1);
  CHECK(v.row_begin(2) == 4);  // place among all points, row after row
  CHECK(v.row_data(1) == b.data());
  CHECK(v[0].data() == a.data());
  CHECK(v[2].back() == 5);
  CHECK(v.row_pointers() == rows);
  CHECK(v.offsets() == off.data());
  const std::vector<std::size_t> bad_off{0, 3, 3, 5};  // row 1 empty
  CHECK_THROWS_WITH(validate(rows_view<double>::separate(rows, bad_off.data(), 3)),
                    doctest::Contains("row 1 is empty"));
  const std::vector<double> down{3, 2};
  const double* const bad_rows[] = {a.data(), down.data()};
  CHECK_THROWS_WITH(validate(rows_view<double>::separate(bad_rows, off.data() + 1, 2)),
                    doctest::Contains("row 1 is not strictly increasing at index 1 (3 then 2)"));
}

TEST_CASE("validate names the row and index of bad input") {
  const std::vector<double> bad{1, 2, 2};
  CHECK_THROWS_WITH(validate(rows_view<double>::matrix(bad.data(), 1, 3)),
                    doctest::Contains("row 0 is not strictly increasing at index 2 (2 then 2)"));
  const std::vector<double> nan{1, std::numeric_limits<double>::quiet_NaN()};
  CHECK_THROWS_WITH(validate(rows_view<double>::matrix(nan.data(), 2, 1)),
                    doctest::Contains("row 1 index 0 is not finite (nan)"));
  CHECK_THROWS_WITH(validate(rows_view<double>::matrix(nan.data(), 0, 1)), doctest::Contains("n = 0"));
  const std::vector<std::size_t> off{0, 1, 1};
  CHECK_THROWS_WITH(validate(rows_view<double>::ragged(bad.data(), off.data(), 2)),
                    doctest::Contains("row 1 is empty"));
  const std::vector<std::int64_t> wide{std::numeric_limits<std::int64_t>::min(),
                                       std::numeric_limits<std::int64_t>::max()};
  CHECK_THROWS_WITH(validate(rows_view<std::int64_t>::matrix(wide.data(), 2, 1)),
                    doctest::Contains("a range the timestamp type cannot represent"));
  CHECK_THROWS_AS(validate(rows_view<std::int64_t>::matrix(wide.data(), 2, 1)), zipline_input_error);
}

TEST_CASE("the validation pass's row check and gaps equal a plain loop's, vectorized or not") {
  // zipline_rows_valid_gaps (zipline_fast's first pass; SSE2 on x86-64 for double rows) must
  // accept exactly the rows validate accepts and report each row's largest neighbour gap.
  std::mt19937_64 rng(41);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (int iter = 0; iter < 4000; ++iter) {
    const std::size_t m = 1 + rng() % 40;  // every tail of the 8-point steps, overlapped or not
    std::vector<double> row(m);
    double t = static_cast<double>(rng() % 100) - 50.0;
    for (auto& x : row) x = t += 0.25 * static_cast<double>(1 + rng() % 40);
    const int fault = static_cast<int>(rng() % 6);  // 0-1: none; else one bad point anywhere
    if (fault >= 2 && m >= 2) {
      const std::size_t at = 1 + rng() % (m - 1);
      row[at] = fault == 2 ? row[at - 1] : fault == 3 ? row[at - 1] - 1.0 : fault == 4 ? nan : inf;
    }
    bool want_ok = std::isfinite(row.front()) && std::isfinite(row.back());
    double want_gap = 0;
    for (std::size_t i = 1; i < m; ++i) {
      want_ok = want_ok && row[i - 1] < row[i];
      want_gap = std::max(want_gap, row[i] - row[i - 1]);
    }
    const auto v = rows_view<double>::matrix(row.data(), 1, m);
    double gap = -1;
    CAPTURE(iter);
    CAPTURE(m);
    REQUIRE(cadence::detail::zipline_rows_valid_gaps(v, &gap) == want_ok);
    bool threw = false;
    try {
      validate(v);
    } catch (const zipline_input_error&) {
      threw = true;
    }
    REQUIRE(threw == !want_ok);
    if (want_ok) REQUIRE(gap == want_gap);
  }
  // The rows' ends the trim needs, read in the same pass: L's first row on ties.
  const std::vector<std::int64_t> v{1, 5, 9, 3, 4, 8, 3, 7, 20, 2, 6, 10};
  std::vector<std::int64_t> gaps(4);
  cadence::detail::zipline_row_ends<std::int64_t> ends{};
  REQUIRE(cadence::detail::zipline_rows_valid_gaps(rows_view<std::int64_t>::matrix(v.data(), 4, 3), gaps.data(), &ends));
  CHECK(ends.max_front == 3);
  CHECK(ends.front_row == 1);
  CHECK(ends.min_back == 8);
  CHECK(ends.max_gap == 13);
  CHECK(gaps == std::vector<std::int64_t>{4, 4, 13, 4});
}
