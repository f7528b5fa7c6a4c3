// zipline/paper.hpp: the published variants (zipline_paper, zipline_paper_opt,
// zipline_paper_opt_bs) on worked examples and on inputs that exercise their Z buffers
// (compaction, replacement, pruning).
#include <cadence/zipline/brute_force.hpp>
#include <cadence/zipline/paper.hpp>

#include <doctest/doctest.h>

#include <random>
#include <vector>

namespace {

using cadence::rows_view;
using cadence::zipline_result;
using cadence::zipline_workspace;

using solver = void (*)(rows_view<int>, zipline_workspace<int>&, zipline_result<int>&);

struct named_solver {
  const char* name;
  solver fn;
};

const named_solver paper_variants[] = {
    {"zipline_paper", &cadence::zipline_paper<int>},
    {"zipline_paper_opt", &cadence::zipline_paper_opt<int>},
    {"zipline_paper_opt_bs", &cadence::zipline_paper_opt_bs<int>}};

}  // namespace

TEST_CASE("the paper variants solve the worked three-worker example") {
  // Worker 1 pushes every 3 ms, worker 2 every 4 ms, worker 3 every 5 ms.
  const int m[] = {3, 6, 9, 12, 15, 4, 8, 12, 16, 20, 5, 10, 15, 20, 25};
  const auto rows = rows_view<int>::matrix(m, 3, 5);
  for (const auto& v : paper_variants) {
    SUBCASE(v.name) {
      zipline_workspace<int> ws;
      zipline_result<int> out;
      v.fn(rows, ws, out);
      // At 16: worker 1's latest push is 15, worker 3's is 15; nothing tighter exists.
      CHECK(out.spread == 1);
      CHECK(out.barrier == 16);
      CHECK(out.choice == std::vector<std::size_t>{4, 3, 2});
    }
  }
}

TEST_CASE("the paper variants agree with the oracle on long rows that cycle Z many times") {
  std::mt19937_64 rng(12);
  for (const auto& v : paper_variants) {
    SUBCASE(v.name) {
      zipline_workspace<int> ws;
      zipline_result<int> out;
      for (int iter = 0; iter < 100; ++iter) {
        const std::size_t n = 1 + rng() % 20, r = 1 + rng() % 40;
        std::vector<int> m(n * r);
        for (std::size_t p = 0; p < n; ++p) {
          int t = static_cast<int>(rng() % 30);
          const int step = 1 + static_cast<int>(rng() % 6);
          for (std::size_t i = 0; i < r; ++i) m[p * r + i] = t += step;
        }
        const auto rows = rows_view<int>::matrix(m.data(), n, r);
        v.fn(rows, ws, out);
        CHECK(out == cadence::zipline_brute_force(rows));
      }
    }
  }
}

TEST_CASE("the convenience overloads return what the workspace overloads write") {
  const int m[] = {1, 5, 9, 2, 7, 11};
  const auto rows = rows_view<int>::matrix(m, 2, 3);
  zipline_workspace<int> ws;
  zipline_result<int> out;
  cadence::zipline_paper(rows, ws, out);
  CHECK(cadence::zipline_paper(rows) == out);
  CHECK(cadence::zipline_paper_opt(rows) == out);
  CHECK(cadence::zipline_paper_opt_bs(rows) == out);
  CHECK(out.spread == 1);
  CHECK(out.barrier == 2);
}
