// Test support: the number of seeded trials a property test runs. Under AddressSanitizer (the CI
// build at -O0, several times slower) a fifth of them, at least one: ASan is there for memory
// errors, which show on the first trials as on the last; the Release build runs every trial.
// Used by the controllers', the ring's and the Thrust ZipLine's property tests.
#pragma once

#include <cstdint>

namespace cadence_test {

#if defined(__SANITIZE_ADDRESS__)
#define CADENCE_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CADENCE_TEST_UNDER_ASAN 1
#endif
#endif

#ifdef CADENCE_TEST_UNDER_ASAN
inline constexpr std::uint64_t sanitized_trial_divisor = 5;
#else
inline constexpr std::uint64_t sanitized_trial_divisor = 1;
#endif

/// `n` trials, or a fifth of them (at least one) under AddressSanitizer.
constexpr std::uint64_t sanitized_trials(std::uint64_t n) {
  return n / sanitized_trial_divisor > 0 ? n / sanitized_trial_divisor : 1;
}

}  // namespace cadence_test
