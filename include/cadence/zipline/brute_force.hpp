/// \file
/// \ingroup zipline
/// The ZipLine oracle: tries every point as the barrier. Slow (O(N n log R)) and obviously
/// correct, it defines the exact answer (ties included) that every fast variant must return.
#pragma once

#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>

namespace cadence {
/// \addtogroup zipline
/// @{

/// The exact ZipLine answer for rows, by trying every point as the barrier. For tests and
/// for checking a faster variant; throws zipline_input_error for input validate() rejects.
template <class T>
zipline_result<T> zipline_brute_force(rows_view<T> rows) {
  validate(rows);
  const std::size_t n = rows.size();
  zipline_result<T> best;
  bool found = false;
  for (std::size_t q = 0; q < n; ++q) {
    for (const T b : rows[q]) {
      // For barrier b, each row's best partner is its latest point <= b.
      T lo = b;
      bool ok = true;
      for (std::size_t p = 0; p < n && ok; ++p) {
        const auto row = rows[p];
        auto it = std::upper_bound(row.begin(), row.end(), b);
        if (it == row.begin()) {
          ok = false;
        } else {
          lo = std::min(lo, *(it - 1));
        }
      }
      if (!ok) continue;
      const T d = b - lo;
      if (!found || d < best.spread || (d == best.spread && b < best.barrier)) {
        best.spread = d;
        best.barrier = b;
        found = true;
      }
    }
  }
  best.choice.resize(n);
  for (std::size_t p = 0; p < n; ++p) {
    const auto row = rows[p];
    best.choice[p] =
        static_cast<std::size_t>(std::upper_bound(row.begin(), row.end(), best.barrier) -
                                 row.begin()) -
        1;
  }
  return best;
}

/// @}
}  // namespace cadence
