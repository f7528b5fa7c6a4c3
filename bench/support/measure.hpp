// What the command-line benchmarks (cadence-bench-transport, -exchange, -ps) share: the
// nccl-tests arithmetic, the median of interleaved raw/ours pairs, and ranks as threads (a
// runner and a barrier). Not part of the library.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cadence_bench {

/// Bus bandwidth of an all-reduce of `bytes` over `ranks` taking `us` microseconds, in GB/s, as
/// nccl-tests computes it: algbw = bytes / t, busbw = algbw * 2(n-1)/n.
inline double allreduce_busbw(std::size_t bytes, int ranks, double us) {
  const double algbw = static_cast<double>(bytes) / (us * 1e-6) / 1e9;
  return algbw * 2.0 * (ranks - 1) / ranks;
}

/// Back-to-back operations per timed block: enough that tiny messages are not timer noise and
/// large ones do not take all day.
inline int iterations_for(std::size_t bytes, std::size_t budget_bytes, int most) {
  return static_cast<int>(std::clamp<std::size_t>(budget_bytes / std::max<std::size_t>(bytes, 1), 5,
                                                  static_cast<std::size_t>(most)));
}

/// The buffer sizes measured: min_bytes, then times `factor` while below max_bytes, and
/// max_bytes itself last.
inline std::vector<std::size_t> sizes(std::size_t min_bytes, std::size_t max_bytes, std::size_t factor) {
  std::vector<std::size_t> out;
  for (std::size_t b = min_bytes; b < max_bytes; b *= factor) out.push_back(b);
  out.push_back(max_bytes);
  return out;
}

/// Of (raw, ours) time pairs, the one with the median ratio: one noisy block does not decide.
inline std::pair<double, double> median_pair(std::vector<std::pair<double, double>> pairs) {
  std::sort(pairs.begin(), pairs.end(),
            [](const auto& a, const auto& b) { return a.second / a.first < b.second / b.first; });
  return pairs[pairs.size() / 2];
}

/// Runs body(rank) for ranks 0..ranks-1, each on a thread of its own, and waits for all of
/// them; then throws std::runtime_error with the message of the lowest rank that threw, if
/// any.
template <class Body>
void run_ranks_as_threads(int ranks, Body body) {
  // A rank's future keeps what escaped it; every rank has ended before the first is rethrown.
  std::vector<std::future<void>> ended;
  for (int r = 0; r < ranks; ++r) ended.push_back(std::async(std::launch::async, [&body, r] { body(r); }));
  for (auto& f : ended) f.wait();
  for (auto& f : ended) {
    try {
      f.get();
    } catch (const std::exception& e) {
      throw std::runtime_error(e.what());
    }
  }
}

/// Runs body(rank) for ranks 0..ranks-1 as run_ranks_as_threads does and returns what rank 0's
/// returned (the rows it printed for all).
template <class Body>
auto rank0_result(int ranks, Body body) -> decltype(body(0)) {
  decltype(body(0)) result;
  run_ranks_as_threads(ranks, [&](int r) {
    auto mine = body(r);
    if (r == 0) result = std::move(mine);
  });
  return result;
}

/// A reusable barrier that also sums one double per rank (C++17 has no std::barrier).
class summing_barrier {
public:
  explicit summing_barrier(int n) : n_(n) {}
  /// Throws std::runtime_error, naming the failure, once abandon() was called (before or while
  /// this rank waits): a rank that failed never arrives, and the others must not wait for ever.
  double arrive_and_sum(double v) {
    std::unique_lock<std::mutex> lock(m_);
    if (!broken_.empty()) throw std::runtime_error(broken_);
    const std::size_t gen = generation_;
    sum_ += v;
    if (++arrived_ == n_) {
      result_ = sum_;
      sum_ = 0;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen || !broken_.empty(); });
      if (generation_ == gen) throw std::runtime_error(broken_);
    }
    return result_;
  }
  /// A rank failed with `why`: every wait, now and later, throws "stopped: <why>".
  void abandon(const std::string& why) {
    std::lock_guard<std::mutex> lock(m_);
    if (broken_.empty()) broken_ = "stopped: " + why;
    cv_.notify_all();
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  std::size_t generation_ = 0;
  double sum_ = 0, result_ = 0;
  std::string broken_;  // set by abandon()
};

}  // namespace cadence_bench
