// Test inputs for the certified row subset (zipline_fast and the Thrust form, n >= 256): n rows
// of times stepping at rates spread widely (mode 0: the first subset passes its check),
// narrowly (1: a second subset is needed), all equal (2), and ragged rows ending early (3),
// each row as integers and as doubles (the integers in thousandths, nudged apart in mode 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace cadence::test {

/// Calls add(int_row, double_row) n times.
template <class Add>
void subset_rows(std::mt19937_64& rng, std::size_t n, std::size_t r, int mode, Add&& add) {
  for (std::size_t p = 0; p < n; ++p) {
    const std::int64_t step = mode == 0   ? 500 + static_cast<std::int64_t>(rng() % 1000)
                              : mode == 1 ? 990 + static_cast<std::int64_t>(rng() % 20)
                              : mode == 2 ? 1000
                                          : 100 + static_cast<std::int64_t>(rng() % 2000);
    std::int64_t t = static_cast<std::int64_t>(rng() % 1500);
    const std::size_t len = mode == 3 ? 1 + rng() % (2 * r) : r;
    std::vector<std::int64_t> row;
    for (std::size_t i = 0; i < len; ++i) {
      row.push_back(t);
      t += step + (mode == 3 ? static_cast<std::int64_t>(rng() % 300) : 0);
    }
    std::vector<double> drow;
    for (const auto x : row)
      drow.push_back(static_cast<double>(x) * 0.001 + (mode == 1 ? 1e-7 * static_cast<double>(p % 3) : 0.0));
    add(row, drow);
  }
}

}  // namespace cadence::test
