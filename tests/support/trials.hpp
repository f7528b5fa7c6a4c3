// Test support: the number of seeded trials a property test runs. Under AddressSanitizer (the CI
// build at -O0, several times slower) a fifth of them, at least one: ASan is there for memory
// errors, which show on the first trials as on the last; the Release build runs every trial.
#pragma once

#include <cstdint>

namespace cadence_test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr std::uint64_t sanitized_trial_divisor = 5;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr std::uint64_t sanitized_trial_divisor = 5;
#else
inline constexpr std::uint64_t sanitized_trial_divisor = 1;
#endif
#else
inline constexpr std::uint64_t sanitized_trial_divisor = 1;
#endif

/// `n` trials, or a fifth of them (at least one) under AddressSanitizer.
constexpr std::uint64_t sanitized_trials(std::uint64_t n) {
  return n / sanitized_trial_divisor > 0 ? n / sanitized_trial_divisor : 1;
}

}  // namespace cadence_test
