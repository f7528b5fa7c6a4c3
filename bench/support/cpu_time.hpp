// CPU time beside the wall clock for cadence-bench-exchange's overlap rows: what the process's
// threads (user and system) used, so that a row can say what no schedule could hide on a machine
// whose communication needs the CPU too. Not part of the library.
#pragma once

#if defined(__unix__) || defined(__APPLE__)
#include <time.h>
#endif

namespace cadence_bench {

/// The CPU time every thread of this process has used so far, user and system together, in
/// microseconds (CLOCK_PROCESS_CPUTIME_ID); negative where the platform cannot say. It holds the
/// kernel's work in this process's system calls (loopback TCP's receive side runs there, in the
/// sender's call), except on a kernel that accounts interrupt time apart
/// (CONFIG_IRQ_TIME_ACCOUNTING), which charges soft-interrupt work to no process.
inline double process_cpu_us() {
#if defined(__unix__) || defined(__APPLE__)
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0)
    return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
#endif
  return -1;
}

}  // namespace cadence_bench
