// A backward pass's stand-in for cadence-bench-exchange's overlap rows: real arithmetic on a
// thread of its own pinned to one core (the "compute core"), while the rank's own thread, pinned
// to another (the "communication core"), drives the all-reduces. On a CPU-only machine this is
// the split a GPU makes: the kernels take the device, the host thread is free to communicate.
// Not part of the library.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace cadence_bench {

/// The cores this thread may run on, in order (empty where the platform cannot say).
inline std::vector<int> allowed_cores() {
  std::vector<int> out;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
#endif
  return out;
}

/// Pins the calling thread to `cores` (one or more); false where it cannot.
inline bool pin_to(const std::vector<int>& cores) {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cores) CPU_SET(c, &set);
  return !cores.empty() && pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
#else
  (void)cores;
  return false;
#endif
}

/// Pins the calling thread to one core for its lifetime, then gives it back its former cores.
class pinned_scope {
 public:
  explicit pinned_scope(int core) : before_(allowed_cores()) { ok_ = core >= 0 && pin_to({core}); }
  ~pinned_scope() {
    if (ok_) pin_to(before_);
  }
  pinned_scope(const pinned_scope&) = delete;
  pinned_scope& operator=(const pinned_scope&) = delete;
  bool ok() const noexcept { return ok_; }

 private:
  std::vector<int> before_;
  bool ok_ = false;
};

/// `units` of arithmetic: a dependent multiply-add chain in registers, no memory traffic (the
/// all-reduce keeps the memory bandwidth; what the two share is the machine's cores).
inline double burn(std::uint64_t units, double x = 1.0) {
  for (std::uint64_t i = 0; i < units * 64; ++i) x = x * 0.999999 + 1e-6;
  return x;
}

/// A thread, pinned to `core` (-1: not pinned), that runs backward passes on request: a pass is
/// `tensors` pieces of `units` each, the count of finished pieces published after each one (the
/// tensors' gradients, last layer first, as mark_ready() sees them).
class backward_thread {
 public:
  explicit backward_thread(int core) : thread_([this, core] { run(core); }) {}
  ~backward_thread() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  backward_thread(const backward_thread&) = delete;
  backward_thread& operator=(const backward_thread&) = delete;

  /// Starts a pass (the previous one must have finished).
  void start(int tensors, std::uint64_t units) {
    {
      std::lock_guard<std::mutex> l(m_);
      tensors_ = tensors;
      units_ = units;
      ready_.store(0, std::memory_order_relaxed);
      ++job_;
    }
    cv_.notify_all();
  }
  /// Pieces of the current pass finished so far.
  int ready() const noexcept { return ready_.load(std::memory_order_acquire); }
  /// Blocks (without spinning) until `n` pieces are finished.
  void wait_for(int n) {
    std::unique_lock<std::mutex> l(m_);
    done_.wait(l, [&] { return ready_.load(std::memory_order_relaxed) >= n; });
  }
  /// Whether the thread got its core.
  bool pinned() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return started_; });
    return pinned_;
  }

 private:
  void run(int core) {
    const bool ok = core >= 0 && pin_to({core});
    std::unique_lock<std::mutex> l(m_);
    pinned_ = ok;
    started_ = true;
    cv_.notify_all();
    unsigned long long seen = 0;
    for (;;) {
      cv_.wait(l, [&] { return stop_ || job_ != seen; });
      if (stop_) return;
      seen = job_;
      const int tensors = tensors_;
      const std::uint64_t units = units_;
      l.unlock();
      for (int k = 0; k < tensors; ++k) {
        sink_ = burn(units, sink_);
        {
          std::lock_guard<std::mutex> g(m_);
          ready_.store(k + 1, std::memory_order_release);
        }
        done_.notify_all();
        // Every rank's backward shares the compute core: a turn after each piece keeps the
        // ranks' passes in step, as a GPU per rank would. Without it the scheduler's time slice
        // (milliseconds, longer than a whole pass at 1 MiB) runs one rank's pass before its
        // peer's, and no bucket can start before the later rank's gradient exists.
        std::this_thread::yield();
      }
      l.lock();
    }
  }

  std::mutex m_;
  std::condition_variable cv_, done_;
  bool stop_ = false, started_ = false, pinned_ = false;
  unsigned long long job_ = 0;
  int tensors_ = 0;
  std::uint64_t units_ = 0;
  std::atomic<int> ready_{0};
  double sink_ = 1.0;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace cadence_bench
