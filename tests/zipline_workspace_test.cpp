// zipline/workspace.hpp: one workspace serves every variant in turn, and clear() returns its
// memory without breaking later calls.
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
  for (const auto v : {cadence::zipline_variant::fast, cadence::zipline_variant::zipline,
                       cadence::zipline_variant::opt_bs, cadence::zipline_variant::opt}) {
    cadence::zipline_solve(v, rows, ws, out);
    CHECK(out == expected);
    ws.clear();
    CHECK(ws.points().capacity() == 0);
    cadence::zipline_solve(v, rows, ws, out);
    CHECK(out == expected);
  }
  CHECK(expected.spread == 1.0);
  CHECK(expected.barrier == 3.0);
  CHECK(expected.choice == std::vector<std::size_t>{1, 0, 0});
}
