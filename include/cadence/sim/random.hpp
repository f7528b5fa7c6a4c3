/// \file
/// \ingroup sim
/// Seeded random numbers for the cluster simulator, with the distributions written out here
/// (Box-Muller and friends) so a seed gives the same run under every standard library.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// SplitMix64's finaliser: the seed of independent stream number `stream` under one `seed`,
/// well separated from the others.
inline std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stream) noexcept {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// One reproducible stream of random numbers. std::mt19937_64's output is fixed by the
/// standard, but std::normal_distribution and the others are not, so they are done by hand.
class random_stream {
public:
  /// The stream a seed names: the same seed gives the same numbers on every platform.
  explicit random_stream(std::uint64_t seed) : engine_(seed) {}

  /// Uniform on [0, 1), 53 random bits.
  double uniform() noexcept { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

  /// Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log() stays finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 6.283185307179586476925 * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

  /// Log-normal with the given mean and coefficient of variation cv (stddev / mean).
  double lognormal(double mean, double cv) noexcept {
    const double sigma2 = std::log1p(cv * cv);
    return mean * std::exp(std::sqrt(sigma2) * normal() - 0.5 * sigma2);
  }

  /// Exponential with the given mean.
  double exponential(double mean) noexcept { return -mean * std::log(1.0 - uniform()); }

  /// True with probability p.
  bool bernoulli(double p) noexcept { return uniform() < p; }

private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// @}
}  // namespace cadence::sim
