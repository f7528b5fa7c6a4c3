// The fuzz targets' check: a condition that must hold for every input. When it does not, the
// target names itself, the condition and its line, and aborts (libFuzzer keeps the input).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace cadence_fuzz {

[[noreturn]] inline void check_failed(const char* target, const char* condition, int line) {
  std::fprintf(stderr, "%s: %s failed at line %d\n", target, condition, line);
  std::abort();
}

}  // namespace cadence_fuzz

/// Aborts, naming `target`, the condition and its line, unless `cond` holds.
#define CADENCE_FUZZ_CHECK(target, cond)                                  \
  do {                                                                    \
    if (!(cond)) ::cadence_fuzz::check_failed(target, #cond, __LINE__); \
  } while (0)
