// A thread-safe wrapper that turns a pure controller into a blocking one for in-process
// training: each worker thread calls push() after its update and blocks until released.
#pragma once

#include <cadence/controllers/controller.hpp>
#include <cadence/core/error.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence {

/// Wraps any synchronization_controller C behind one mutex. Timestamps come from `Clock`
/// (seconds since construction), read under the lock so they are monotone in decision order.
/// Never deadlocks silently: a controller that leaves every worker waiting throws
/// deadlock_error to the pushing thread, and a timed wait names whom it waited for.
template <class C, class Clock = std::chrono::steady_clock>
class blocking_controller {
  CADENCE_REQUIRE_CONTROLLER(C);

public:
  explicit blocking_controller(C controller)
      : controller_(std::move(controller)), start_(Clock::now()) {}

  /// Worker p finished an iteration: records the push and blocks until p may proceed.
  /// With a timeout, throws timeout_error naming p, its clock and the workers it waited for;
  /// p then stays waiting in the controller and can resume with wait_for_release().
  void push(worker_id p, std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    std::unique_lock<std::mutex> lock(mutex_);
    const decision d = controller_.push(p, now());
    wake(d.released);
    if (!d.proceed) wait_locked(lock, p, timeout);
  }

  /// Resumes waiting after a timeout.
  void wait_for_release(worker_id p, std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (controller_.is_waiting(p)) wait_locked(lock, p, timeout);
  }

  /// Removes worker p (it died or left) and wakes whoever waited only for it. If p itself is
  /// blocked in push(), that call throws worker_error.
  void remove_worker(worker_id p) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto released = controller_.remove_worker(p);
    wake(released);
    if (p < generation_.size()) ++generation_[p];
    cv_.notify_all();
  }

  worker_id add_worker() {
    std::lock_guard<std::mutex> lock(mutex_);
    const worker_id p = controller_.add_worker();
    if (generation_.size() <= p) generation_.resize(std::size_t{p} + 1);
    return p;
  }

  /// Calls f(const C&) under the lock: consistent introspection while workers run.
  template <class F>
  decltype(auto) inspect(F&& f) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::forward<F>(f)(static_cast<const C&>(controller_));
  }

private:
  double now() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }

  void wake(span<const worker_id> released) {
    if (released.empty()) return;
    for (worker_id q : released) {
      if (generation_.size() <= q) generation_.resize(std::size_t{q} + 1);
      ++generation_[q];
    }
    cv_.notify_all();
  }

  void wait_locked(std::unique_lock<std::mutex>& lock, worker_id p,
                   std::optional<std::chrono::nanoseconds> timeout) {
    if (generation_.size() <= p) generation_.resize(std::size_t{p} + 1);
    const std::size_t seen = generation_[p];
    auto released = [&] { return generation_[p] != seen; };
    if (!timeout) {
      cv_.wait(lock, released);
    } else if (!cv_.wait_for(lock, *timeout, released)) {
      throw timeout_error(timeout_message(p, *timeout));
    }
    if (!controller_.is_active(p))
      throw worker_error("cadence::blocking_controller: worker " + std::to_string(p) +
                         " was removed while it waited");
  }

  std::string timeout_message(worker_id p, std::chrono::nanoseconds timeout) const {
    std::string who;
    for (worker_id q : controller_.waiting_for(p)) {
      if (!who.empty()) who += ", ";
      who += std::to_string(q) + " (clock " + std::to_string(controller_.clock(q)) + ")";
    }
    return "cadence::blocking_controller: worker " + std::to_string(p) + " at clock " +
           std::to_string(controller_.clock(p)) + " (" + controller_.config() + ") waited " +
           std::to_string(std::chrono::duration<double>(timeout).count()) + " s for " +
           (who.empty() ? std::string("the barrier") : "workers " + who);
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  C controller_;
  typename Clock::time_point start_;
  std::vector<std::size_t> generation_;  // per worker, bumped when it is released; grows lazily
};

}  // namespace cadence
