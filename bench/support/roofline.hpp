// The roofline of the command-line benchmarks (cadence-bench-transport, -exchange, -ps): this
// machine's memory copy bandwidth, measured in the same run, and each row's limit derived from
// the native call it is timed against and the bytes its path must copy beyond that call:
//
//   limit_us = raw_us + extra_bytes / copy_rate
//   of_native = raw_us / ours_us        of_limit = limit_us / ours_us
//
// raw_us is the native call's time (all-reduce, or ping-pong) measured beside ours; extra_bytes
// what the row's path logically must copy per operation on top of it (a copying bucket copies
// the data in and out: 2 x bytes; a bucket view or an in-place merge: 0; the parameter server
// over MPI with bounce buffers: the gradient's and the weights' bounce copies, 2 x bytes); and
// copy_rate the bytes per second one such copy gets while the ranks that copy at the same time
// share the machine (shared_rate()), measured at the size the row copies (copy_rates). A path
// with no required copy has limit = raw. Not part of the library; docs/results.md explains the
// model and shows the tables.
#pragma once

#include "report.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence_bench {

/// The machine's memory copy bandwidth in GB/s (bytes copied per second / 1e9): one thread
/// copying alone, and two threads copying at once (their bytes together).
struct copy_bandwidth {
  double one_thread_gbps = 0;
  double two_threads_gbps = 0;

  /// The rate each of `copiers` copies gets when they run at the same time: one thread's rate
  /// alone, else the two threads' aggregate shared among them (the development machine has two
  /// cores; more copiers than that only share the same memory bandwidth).
  double shared_rate(int copiers) const {
    if (copiers <= 1) return one_thread_gbps;
    return two_threads_gbps / copiers;
  }
};

namespace detail {

/// Seconds for `threads` threads each to memcpy its own `bytes` `times` times at once (the
/// slowest one's time, from a common start).
inline double timed_copies(std::vector<std::unique_ptr<char[]>>& from, std::vector<std::unique_ptr<char[]>>& to,
                           std::size_t bytes, int times, int threads) {
  using steady = std::chrono::steady_clock;
  std::vector<double> seconds(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  const auto start = steady::now() + std::chrono::milliseconds(2);  // every thread started by then
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const auto k = static_cast<std::size_t>(t);
      while (steady::now() < start) {
      }
      for (int i = 0; i < times; ++i) std::memcpy(to[k].get(), from[k].get(), bytes);
      seconds[k] = std::chrono::duration<double>(steady::now() - start).count();
    });
  for (auto& th : pool) th.join();
  return *std::max_element(seconds.begin(), seconds.end());
}

}  // namespace detail

/// Measures copy_bandwidth for copies of `bytes`: blocks of back-to-back memcpys of `bytes` (at
/// least 16 MiB a block) by one thread, then by two threads at once, each the best of `reps`
/// blocks (the pages touched first). A row's copies of 1 MiB run from this machine's caches,
/// 16 MiB and more from memory: the rate is measured at the size the row copies. Run it where
/// no other rank of the job is busy (before the ranks start, or while they wait without
/// spinning).
inline copy_bandwidth measure_copy_bandwidth(std::size_t bytes, int reps = 5) {
  bytes = std::max<std::size_t>(bytes, 64);
  const int times = static_cast<int>(std::max<std::size_t>(1, (std::size_t{16} << 20) / bytes));
  std::vector<std::unique_ptr<char[]>> from, to;
  for (int t = 0; t < 2; ++t) {
    from.emplace_back(new char[bytes]);
    to.emplace_back(new char[bytes]);
    std::memset(from.back().get(), 1 + t, bytes);
    std::memset(to.back().get(), 0, bytes);
  }
  copy_bandwidth bw;
  for (int threads = 1; threads <= 2; ++threads) {
    double best = 0;
    for (int rep = 0; rep < reps; ++rep)
      best = std::max(best, static_cast<double>(threads) * times * static_cast<double>(bytes) /
                                detail::timed_copies(from, to, bytes, times, threads));
    (threads == 1 ? bw.one_thread_gbps : bw.two_threads_gbps) = best / 1e9;
  }
  return bw;
}

/// The copy bandwidth at each size a benchmark measures (its rows' bytes).
class copy_rates {
public:
  copy_rates() = default;
  /// Measures each of `sizes` (measure_copy_bandwidth).
  explicit copy_rates(const std::vector<std::size_t>& sizes) {
    for (std::size_t b : sizes) rates_.emplace_back(b, measure_copy_bandwidth(b));
  }
  /// Rates measured elsewhere (another rank's), in the order of `sizes`.
  copy_rates(const std::vector<std::size_t>& sizes, const std::vector<copy_bandwidth>& rates) {
    for (std::size_t k = 0; k < sizes.size() && k < rates.size(); ++k) rates_.emplace_back(sizes[k], rates[k]);
  }
  /// The rate measured at `bytes`, else at the nearest size above it (the largest last).
  copy_bandwidth at(std::size_t bytes) const {
    for (const auto& [b, bw] : rates_)
      if (b >= bytes) return bw;
    return rates_.empty() ? copy_bandwidth{} : rates_.back().second;
  }
  const std::vector<std::pair<std::size_t, copy_bandwidth>>& all() const noexcept { return rates_; }

  /// "PROGRAM: memory copy (the roofline's), GB/s by one thread / two at once: 1024 B a/b, ..."
  /// on stderr (the JSON on stdout stays one array).
  void report(const char* program) const {
    std::string text = std::string(program) + ": memory copy (the roofline's), GB/s by one thread / two at once:";
    for (const auto& [b, bw] : rates_)
      text += " " + std::to_string(b) + " B " + formatted("%.2f", bw.one_thread_gbps) + "/" +
              formatted("%.2f", bw.two_threads_gbps) + ";";
    text.back() = '\n';
    std::fputs(text.c_str(), stderr);
  }

  /// The table title's note: the rates at the largest size.
  std::string note() const {
    const copy_bandwidth bw = rates_.empty() ? copy_bandwidth{} : rates_.back().second;
    return "memory copy of " + std::to_string(rates_.empty() ? 0 : rates_.back().first) + " B " +
           formatted("%.2f", bw.one_thread_gbps) + " GB/s (1 thread), " + formatted("%.2f", bw.two_threads_gbps) +
           " GB/s (2 threads)";
  }

private:
  std::vector<std::pair<std::size_t, copy_bandwidth>> rates_;
};

/// The model: the native call's time plus the time to copy `extra_bytes` at `copy_gbps`, in µs.
inline double limit_us(double raw_us, double extra_bytes, double copy_gbps) {
  if (extra_bytes <= 0) return raw_us;
  return raw_us + extra_bytes / (copy_gbps * 1e3);  // bytes / (GB/s) = ns; / 1e3 -> µs
}

/// Adds the roofline's keys to a row, after the keys it has: `copy_gbps` (the rate one copy of
/// this row gets), `extra_bytes`, `limit_us`, `of_native` (raw_us / ours_us) and `of_limit`
/// (limit_us / ours_us).
inline void add_roofline(row& r, double raw_us, double ours_us, double extra_bytes, double copy_gbps) {
  using cadence::tools::decimals;
  const double limit = limit_us(raw_us, extra_bytes, copy_gbps);
  r["copy_gbps"] = decimals(copy_gbps, 3);
  r["extra_bytes"] = static_cast<std::size_t>(extra_bytes);
  r["limit_us"] = decimals(limit, 3);
  r["of_native"] = decimals(raw_us / ours_us, 4);
  r["of_limit"] = decimals(limit / ours_us, 4);
}

/// The same keys, null: a row the model does not cover (bsp_overlap).
inline void add_no_roofline(row& r) {
  for (const char* key : {"copy_gbps", "extra_bytes", "limit_us", "of_native", "of_limit"}) r[key] = nullptr;
}

/// The table's roofline columns: the limit's time, and of_native and of_limit in percent.
inline std::vector<column> roofline_columns() {
  const auto percent = [](std::string header, std::string key) {
    return column{std::move(header), 9,
                  [key](const row& r) { return formatted("%.1f%%", 100.0 * r.at(key).get<double>()); }};
  };
  return {number_column("limit us", 10, "limit_us", "%.1f"), percent("of native", "of_native"),
          percent("of limit", "of_limit")};
}

}  // namespace cadence_bench
