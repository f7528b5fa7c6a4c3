/// \file
/// \ingroup io
/// A synthetic push-history generator like the ElasticBSP authors' published one: each worker
/// pushes at its own constant interval from a random start. Seeded and library-independent.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/io/push_history.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace cadence {
/// \addtogroup io
/// @{

/// Parameters of generate_push_history.
struct generator_options {
  std::size_t workers = 0;         ///< n >= 1
  std::size_t pushes = 0;          ///< pushes per worker, >= 1
  std::int64_t interval_lo = 1000; ///< smallest per-worker interval, ms, >= 1
  std::int64_t interval_hi = 1500; ///< largest per-worker interval, ms, >= interval_lo
  std::uint64_t seed = 1;          ///< std::mt19937_64 seed
};

namespace detail {

/// Uniform integer in [0, bound) by rejection sampling on raw mt19937_64 output, so results
/// are identical on every standard library (std::uniform_int_distribution is not).
inline std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t bound) {
  const std::uint64_t limit =
      std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % bound;
  std::uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % bound;
}

}  // namespace detail

/// Worker p (id p, for p = 0..n-1) draws its interval I_p uniformly from
/// [interval_lo, interval_hi] and its start S_p uniformly from [0, I_p), in that order, then
/// pushes at S_p + j * I_p for j = 0..pushes-1, all fields read from o. Throws
/// invalid_parameter_error for bad options (naming the field).
inline push_history<std::int64_t> generate_push_history(const generator_options& o) {
  if (o.workers == 0)
    throw invalid_parameter_error("cadence::generate_push_history: workers must be >= 1");
  if (o.pushes == 0)
    throw invalid_parameter_error("cadence::generate_push_history: pushes must be >= 1");
  if (o.interval_lo < 1 || o.interval_hi < o.interval_lo)
    throw invalid_parameter_error(
        "cadence::generate_push_history: need 1 <= interval_lo <= interval_hi, got " +
        std::to_string(o.interval_lo) + "," + std::to_string(o.interval_hi));
  const auto hi = static_cast<std::uint64_t>(o.interval_hi);
  if (o.pushes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / hi - 1)
    throw invalid_parameter_error(
        "cadence::generate_push_history: pushes * interval_hi overflows 64-bit milliseconds");
  std::mt19937_64 rng(o.seed);
  const auto width = static_cast<std::uint64_t>(o.interval_hi - o.interval_lo) + 1;
  push_history<std::int64_t> h;
  std::vector<std::int64_t> row(o.pushes);
  for (std::size_t p = 0; p < o.workers; ++p) {
    const auto interval =
        o.interval_lo + static_cast<std::int64_t>(detail::uniform_below(rng, width));
    const auto start =
        static_cast<std::int64_t>(detail::uniform_below(rng, static_cast<std::uint64_t>(interval)));
    for (std::size_t j = 0; j < o.pushes; ++j)
      row[j] = start + static_cast<std::int64_t>(j) * interval;
    h.add(static_cast<std::int64_t>(p), span<const std::int64_t>(row.data(), row.size()));
  }
  return h;
}

/// @}
}  // namespace cadence
