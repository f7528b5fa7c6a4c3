/// \file
/// \ingroup zipline
/// The answer every ZipLine variant returns, identical across variants by contract
/// (docs/contract.md#5-zipline): the minimum spread, the smallest optimal barrier, and each row's choice.
#pragma once

#include <cstddef>
#include <vector>

namespace cadence {
/// \addtogroup zipline
/// @{

/// What a ZipLine search found: equal for every variant on the same input (the oracle is
/// zipline_brute_force).
template <class T>
struct zipline_result {
  /// Minimum over all one-per-row selections Z of max(Z) - min(Z).
  T spread{};
  /// max(Z*) of the optimal selection with the smallest such maximum.
  T barrier{};
  /// choice[p]: index of the latest element of row p that is <= barrier.
  std::vector<std::size_t> choice;

  /// Equal when spread, barrier and every choice agree: how tests hold a variant to the oracle.
  friend bool operator==(const zipline_result& a, const zipline_result& b) {
    return a.spread == b.spread && a.barrier == b.barrier && a.choice == b.choice;
  }
  /// Not operator==.
  friend bool operator!=(const zipline_result& a, const zipline_result& b) { return !(a == b); }
};

/// @}
}  // namespace cadence
