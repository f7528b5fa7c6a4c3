// Rows owned by a test and seen ragged (values + offsets, the general layout of rows_view),
// built row by row; and the row-subset tests' inputs (subset_rows.hpp) stored that way.
#pragma once

#include <cadence/zipline/rows.hpp>

#include "support/subset_rows.hpp"

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace cadence::test {

template <class T>
struct ragged_rows {
  std::vector<T> values;
  std::vector<std::size_t> offsets{0};
  ragged_rows() = default;
  /// The given rows, in order.
  explicit ragged_rows(const std::vector<std::vector<T>>& rows) {
    for (const auto& row : rows) add(row);
  }
  void add(const std::vector<T>& row) {
    values.insert(values.end(), row.begin(), row.end());
    offsets.push_back(values.size());
  }
  rows_view<T> view() const {
    return rows_view<T>::ragged(values.data(), offsets.data(), offsets.size() - 1);
  }
};

/// One trial of the row-subset tests (zipline_fast and the Thrust form): n = 256 + [0, extra)
/// rows (so n >= 256 always takes the subset path) of r in [3, 14] points, in mode trial % 4 of
/// subset_rows, as integers and as doubles.
struct subset_trial {
  std::size_t n = 0, r = 0;
  int mode = 0;
  ragged_rows<std::int64_t> ints;
  ragged_rows<double> doubles;
};

inline subset_trial draw_subset_trial(std::mt19937_64& rng, int trial, std::uint64_t extra) {
  subset_trial t;
  t.n = 256 + rng() % extra;
  t.r = 3 + rng() % 12;
  t.mode = trial % 4;
  subset_rows(rng, t.n, t.r, t.mode, [&](const auto& row, const auto& drow) {
    t.ints.add(row);
    t.doubles.add(drow);
  });
  return t;
}

}  // namespace cadence::test
