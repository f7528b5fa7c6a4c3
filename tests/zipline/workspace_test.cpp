// zipline/workspace.hpp: one workspace serves every variant in turn, reports the memory it
// holds, and clear() returns that memory without breaking later calls.
#include <cadence/zipline/brute_force.hpp>
#include <cadence/zipline/variant.hpp>
#include <cadence/zipline/workspace.hpp>

#include <doctest/doctest.h>

#include <vector>

TEST_CASE("one workspace can be shared by all variants in turn and cleared between calls") {
  const double a[] = {1.0, 2.0, 3.5, 8.0, 2.25, 6.0, 9.0, 12.0, 3.0, 4.0, 5.0, 6.5};
  const auto rows = cadence::rows_view<double>::matrix(a, 3, 4);
  const auto expected = cadence::zipline_brute_force(rows);
  cadence::zipline_workspace<double> ws;
  cadence::zipline_result<double> out;
  CHECK(ws.bytes_reserved() == 0);
  using cadence::zipline_variant;
  for (const auto v : {zipline_variant::fast, zipline_variant::paper, zipline_variant::paper_opt_bs,
                       zipline_variant::paper_opt}) {
    CAPTURE(cadence::to_string(v));
    cadence::zipline_solve(v, rows, ws, out);
    CHECK(out == expected);
    CHECK(ws.bytes_reserved() > 0);
    ws.clear();
    CHECK(ws.bytes_reserved() == 0);
    cadence::zipline_solve(v, rows, ws, out);
    CHECK(out == expected);
  }
  CHECK(expected.spread == 1.0);
  CHECK(expected.barrier == 3.0);
  CHECK(expected.choice == std::vector<std::size_t>{1, 0, 0});
}

TEST_CASE("a workspace holds what the largest input needed, whichever variant ran") {
  std::vector<int> big(40 * 30), small(4 * 3);
  for (std::size_t k = 0; k < big.size(); ++k) big[k] = static_cast<int>(k % 30 * 7 + k / 30);
  for (std::size_t k = 0; k < small.size(); ++k) small[k] = static_cast<int>(k % 3 * 5 + k / 3);
  const auto big_rows = cadence::rows_view<int>::matrix(big.data(), 40, 30);
  const auto small_rows = cadence::rows_view<int>::matrix(small.data(), 4, 3);
  cadence::zipline_workspace<int> ws;
  cadence::zipline_result<int> out;
  using cadence::zipline_variant;
  for (const auto v : {zipline_variant::paper, zipline_variant::paper_opt,
                       zipline_variant::paper_opt_bs, zipline_variant::fast})
    cadence::zipline_solve(v, big_rows, ws, out);
  const std::size_t held = ws.bytes_reserved();
  for (const auto v : {zipline_variant::fast, zipline_variant::paper_opt_bs,
                       zipline_variant::paper_opt, zipline_variant::paper}) {
    CAPTURE(cadence::to_string(v));
    cadence::zipline_solve(v, small_rows, ws, out);
    CHECK(out == cadence::zipline_brute_force(small_rows));
    cadence::zipline_solve(v, big_rows, ws, out);
    CHECK(out == cadence::zipline_brute_force(big_rows));
    CHECK(ws.bytes_reserved() == held);
  }
}
