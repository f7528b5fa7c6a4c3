#include <cadence/zipline/brute_force.hpp>

#include "support/ragged_rows.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace cadence;

namespace {

// The definition itself: enumerate every one-per-row selection.
template <class T>
zipline_result<T> enumerate_all(const std::vector<std::vector<T>>& rows) {
  const std::size_t n = rows.size();
  std::vector<std::size_t> idx(n, 0);
  zipline_result<T> best;
  bool found = false;
  while (true) {
    T lo = rows[0][idx[0]], hi = lo;
    for (std::size_t p = 0; p < n; ++p) {
      lo = std::min(lo, rows[p][idx[p]]);
      hi = std::max(hi, rows[p][idx[p]]);
    }
    const T d = hi - lo;
    if (!found || d < best.spread || (d == best.spread && hi < best.barrier)) {
      best.spread = d;
      best.barrier = hi;
      found = true;
    }
    std::size_t p = 0;
    while (p < n && ++idx[p] == rows[p].size()) idx[p++] = 0;
    if (p == n) break;
  }
  best.choice.resize(n);
  for (std::size_t p = 0; p < n; ++p) {
    std::size_t i = 0;
    while (i + 1 < rows[p].size() && rows[p][i + 1] <= best.barrier) ++i;
    best.choice[p] = i;
  }
  return best;
}

}  // namespace

TEST_CASE("the brute-force oracle agrees with enumerating every selection") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t n = 1 + rng() % 4;
    std::vector<std::vector<std::int64_t>> rows(n);
    for (auto& r : rows) {
      const std::size_t len = 1 + rng() % 4;
      std::int64_t t = static_cast<std::int64_t>(rng() % 5);
      for (std::size_t i = 0; i < len; ++i) {
        r.push_back(t);
        t += 1 + static_cast<std::int64_t>(rng() % 4);
      }
    }
    const test::ragged_rows<std::int64_t> in(rows);
    CHECK(zipline_brute_force(in.view()) == enumerate_all(rows));
  }
}
