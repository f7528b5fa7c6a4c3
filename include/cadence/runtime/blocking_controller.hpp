/// \file
/// \ingroup runtime
/// A thread-safe wrapper that turns a pure controller into a blocking one for in-process
/// training: each worker thread calls push() after its update and blocks until released, and
/// finish() when it is done; optionally, a worker that falls silent is evicted.
#pragma once

#include <cadence/controllers/controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/runtime/liveness.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence {
/// \addtogroup runtime
/// @{

/// How a blocking_controller watches over its workers.
struct blocking_options {
  /// Evict a worker silent for this long: running (not waiting to be released) without a
  /// push() or finish(). Its silence counts from its last push, its release, or, before its
  /// first push, from construction or add_worker(). Disabled (nullopt) by default. It must
  /// cover a worker's slowest iteration, the first one (warm-up) included, with a margin: an
  /// evicted worker cannot come back.
  std::optional<std::chrono::nanoseconds> evict_after;
};

/// A worker blocking_controller evicted for silence.
struct eviction {
  /// The evicted worker.
  worker_id worker = 0;
  /// Its clock (pushes made) when it was evicted.
  clock_value clock = 0;
  /// How long it had been silent when a thread noticed: at least evict_after.
  std::chrono::nanoseconds silent_for{};
  /// When, on the wrapper's Clock, counted from the wrapper's construction.
  std::chrono::nanoseconds at{};
};

namespace detail {
/// Why a worker is no longer part of a blocking_controller's policy.
enum class blocking_departure : unsigned char { present, finished, evicted, removed };
}  // namespace detail

/// Wraps any synchronization_controller C behind one mutex, for worker threads in one process.
///
/// A worker thread calls push(p) after each update (it blocks until the policy releases it)
/// and finish(p) once when it is done, so nobody waits for it at a barrier it will never reach.
/// Never deadlocks silently: a controller that leaves every worker waiting throws
/// deadlock_error to the pushing thread, a timed wait names whom it waited for, and with
/// `evict_after` a worker that stops calling (its thread died or hung) is evicted in any phase
/// of any policy, which releases whoever waited for it.
///
/// Two clocks, on purpose. The controller's timestamps and the silence deadlines come from
/// `Clock` (seconds since construction, read under the lock, so monotone in decision order);
/// a test can pass a clock it moves by hand to decide exactly who is silent. The timeout of a
/// push() is how long the calling thread may block, measured on std::chrono::steady_clock
/// whatever Clock is, so it stays a real-time guard even under such a test clock.
///
/// Silence is checked whenever a thread calls push, finish, wait_for_release, add_worker,
/// remove_worker or check_liveness, and whenever a blocked thread wakes; blocked threads sleep
/// no later than the next deadline, so a dead peer is noticed even when nobody calls in.
template <class C, class Clock = std::chrono::steady_clock>
class blocking_controller {
  CADENCE_REQUIRE_CONTROLLER(C);

public:
  /// The clock of the controller's timestamps and of the silence deadlines.
  using clock_type = Clock;

  /// Takes the controller, run as options say; its timestamps, and its workers' silence,
  /// count from now on Clock. Throws invalid_parameter_error for an evict_after that is not
  /// positive.
  explicit blocking_controller(C controller, blocking_options options = {})
      : controller_(std::move(controller)), options_(options), start_(Clock::now()) {
    if (options_.evict_after) {
      if (*options_.evict_after <= std::chrono::nanoseconds::zero())
        throw invalid_parameter_error(
            "cadence::blocking_controller: evict_after must be > 0, got " +
            std::to_string(std::chrono::duration<double>(*options_.evict_after).count()) + " s");
      liveness_.emplace(std::chrono::ceil<typename Clock::duration>(*options_.evict_after));
    }
    slots_.resize(controller_.worker_capacity());
    // Workers already in the controller are expected to call within evict_after from now.
    for (worker_id p = 0; p < slots_.size(); ++p) {
      if (!controller_.is_active(p)) continue;
      if (controller_.is_waiting(p)) {
        if (liveness_) liveness_->excuse(p);
      } else {
        hear(p, start_);
      }
    }
  }

  /// Worker p finished an iteration: records the push and blocks until p may proceed.
  /// With a timeout, throws timeout_error naming p, its clock and the workers it waited for;
  /// p then stays waiting in the controller and can resume with wait_for_release().
  /// Throws worker_error if p already left (finished, evicted or removed), saying how.
  void push(worker_id p, std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    std::unique_lock<std::mutex> lock(mutex_);
    const time_point now = Clock::now();
    check_present(p, "push");
    hear(p, now);  // first, so a late but live worker is not evicted by its own push
    evict_silent(now);
    const decision d = controller_.push(p, seconds_since_start(now));
    wake(d.released, now);
    if (!d.proceed) {
      if (liveness_) liveness_->excuse(p);  // blocked on us: alive however long it waits
      wait_locked(lock, p, timeout);
    }
  }

  /// Worker p is done (its last push made, or it stops early): takes it out of the policy and
  /// wakes whoever waited only for it (a barrier completes without it). Call it once, from
  /// p's thread. Never waits for other workers, and throws only if p already left
  /// (worker_error saying how: finished, evicted or removed) or was never issued.
  void finish(worker_id p) {
    std::lock_guard<std::mutex> lock(mutex_);
    const time_point now = Clock::now();
    check_present(p, "finish");
    leave(p, detail::blocking_departure::finished, now);
    evict_silent(now);
  }

  /// Resumes waiting after a timeout: blocks until p is released, with push()'s timeout and
  /// errors; returns at once if p no longer waits.
  void wait_for_release(worker_id p, std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    std::unique_lock<std::mutex> lock(mutex_);
    const time_point now = Clock::now();
    check_present(p, "wait_for_release");
    evict_silent(now);
    if (controller_.is_waiting(p)) wait_locked(lock, p, timeout);
  }

  /// Removes worker p from another thread (a failure detector, say) and wakes whoever waited
  /// only for it; if p itself is blocked in push(), that call throws worker_error. Returns
  /// false and changes nothing if p already left, since a detector may race with p's
  /// finish() or its eviction; throws worker_error for an id never issued.
  bool remove_worker(worker_id p) {
    std::lock_guard<std::mutex> lock(mutex_);
    const time_point now = Clock::now();
    check_issued(p, "remove_worker");
    if (slots_[p].left != detail::blocking_departure::present) return false;
    leave(p, detail::blocking_departure::removed, now);
    evict_silent(now);
    return true;
  }

  /// Adds a worker; its silence (with evict_after) counts from now until its first push.
  worker_id add_worker() {
    std::lock_guard<std::mutex> lock(mutex_);
    const time_point now = Clock::now();
    evict_silent(now);
    const worker_id p = controller_.add_worker();
    slots_.resize(controller_.worker_capacity());
    hear(p, now);
    return p;
  }

  /// Evicts every worker silent past evict_after now and returns those evictions (none when
  /// evict_after is disabled). Threads calling in already do this; a watchdog or a test can
  /// call it to check at a moment of its choosing.
  std::vector<eviction> check_liveness() {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t before = evictions_.size();
    evict_silent(Clock::now());
    return std::vector<eviction>(evictions_.begin() + static_cast<std::ptrdiff_t>(before),
                                 evictions_.end());
  }

  /// Every eviction so far, in the order they happened.
  std::vector<eviction> evictions() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return evictions_;
  }

  /// The options it was built with.
  const blocking_options& options() const noexcept { return options_; }

  /// Calls f(const C&) under the lock: consistent introspection while workers run.
  template <class F>
  decltype(auto) inspect(F&& f) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::forward<F>(f)(static_cast<const C&>(controller_));
  }

private:
  using time_point = typename Clock::time_point;
  using wait_clock = std::chrono::steady_clock;

  // The longest single sleep: a longer wait is cut and resumed by the loop, so that a far
  // deadline or timeout cannot overflow the condition variable's own clock arithmetic.
  static constexpr std::chrono::hours max_sleep{1};

  struct slot {
    std::size_t generation = 0;  // bumped when p is released or leaves: ends its blocked push
    detail::blocking_departure left = detail::blocking_departure::present;
    clock_value clock = 0;       // its clock when it left
    std::size_t eviction = 0;    // its record in evictions_, when evicted
  };

  double seconds_since_start(time_point now) const {
    return std::chrono::duration<double>(now - start_).count();
  }

  void check_issued(worker_id p, const char* what) const {
    if (p < slots_.size()) return;
    throw worker_error("cadence::blocking_controller: " + std::string(what) + ": unknown worker " +
                       std::to_string(p) + " (ids issued: " +
                       (slots_.empty() ? std::string("none")
                                       : "0.." + std::to_string(slots_.size() - 1)) +
                       ")");
  }

  void check_present(worker_id p, const char* what) const {
    check_issued(p, what);
    if (slots_[p].left != detail::blocking_departure::present)
      throw worker_error("cadence::blocking_controller: worker " + std::to_string(p) +
                         " cannot " + what + ": it " + how_it_left(p));
  }

  std::string how_it_left(worker_id p) const {
    const slot& s = slots_[p];
    const std::string at = " at clock " + std::to_string(s.clock);
    switch (s.left) {
      case detail::blocking_departure::finished:
        return "finished" + at + " (finish() was called)";
      case detail::blocking_departure::removed:
        return "was removed" + at + " (remove_worker() was called)";
      case detail::blocking_departure::evicted: {
        const eviction& e = evictions_[s.eviction];
        return "was evicted" + at + " after " +
               std::to_string(std::chrono::duration<double>(e.silent_for).count()) +
               " s of silence (no push or finish for evict_after = " +
               std::to_string(std::chrono::duration<double>(*options_.evict_after).count()) +
               " s)";
      }
      case detail::blocking_departure::present:
        break;
    }
    return "is still present";
  }

  // p is alive at `now`, unless it waits in the controller (then it stays excused).
  void hear(worker_id p, time_point now) {
    if (liveness_ && controller_.is_active(p) && !controller_.is_waiting(p))
      liveness_->heard(p, now);
  }

  // Released workers start their next iteration now, so their silence counts from now.
  void wake(span<const worker_id> released, time_point now) {
    if (released.empty()) return;
    for (worker_id q : released) {
      ++slots_[q].generation;
      if (liveness_) liveness_->heard(q, now);
    }
    cv_.notify_all();
  }

  void leave(worker_id p, detail::blocking_departure how, time_point now) {
    const clock_value c = controller_.clock(p);
    const span<const worker_id> released = controller_.remove_worker(p);
    slot& s = slots_[p];
    s.left = how;
    s.clock = c;
    ++s.generation;
    if (liveness_) liveness_->forget(p);
    wake(released, now);
    cv_.notify_all();  // p's own push, if another thread made it leave while it waited
  }

  void evict_silent(time_point now) {
    if (!liveness_) return;
    const std::optional<time_point> due = liveness_->next_deadline();
    if (!due || now < *due) return;  // the common case, O(1): nobody is silent yet
    // Silent workers are running, never waiting, so evicting one cannot release another.
    for (const worker_id q : liveness_->silent(now)) {
      eviction e;
      e.worker = q;
      e.silent_for =
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - *liveness_->last_heard(q));
      e.at = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_);
      leave(q, detail::blocking_departure::evicted, now);
      e.clock = slots_[q].clock;
      slots_[q].eviction = evictions_.size();
      evictions_.push_back(e);
    }
  }

  void wait_locked(std::unique_lock<std::mutex>& lock, worker_id p,
                   std::optional<std::chrono::nanoseconds> timeout) {
    const std::size_t seen = slots_[p].generation;
    std::optional<wait_clock::time_point> give_up;
    if (timeout)
      give_up = detail::add_saturated(wait_clock::now(),
                                      std::max(*timeout, std::chrono::nanoseconds::zero()));
    while (slots_[p].generation == seen) {
      std::chrono::nanoseconds sleep = max_sleep;
      bool timed = false;
      if (give_up) {
        const auto left = *give_up - wait_clock::now();
        if (left <= wait_clock::duration::zero()) throw timeout_error(timeout_message(p, *timeout));
        sleep = std::min(sleep, std::chrono::ceil<std::chrono::nanoseconds>(left));
        timed = true;
      }
      if (liveness_) {
        // Timed even with nobody watched: a worker heard later (add_worker) notifies no one,
        // so this thread must look again by itself, at the latest after max_sleep.
        timed = true;
        if (const std::optional<time_point> due = liveness_->next_deadline()) {
          const auto until = std::min<typename Clock::duration>(
              *due - Clock::now(), std::chrono::duration_cast<typename Clock::duration>(max_sleep));
          sleep = std::min(sleep, std::chrono::ceil<std::chrono::nanoseconds>(until));
        }
      }
      if (timed)
        cv_.wait_for(lock, sleep);
      else
        cv_.wait(lock);
      // Waking is a chance to notice a dead peer, and the only one when nobody else calls in.
      if (slots_[p].generation == seen) evict_silent(Clock::now());
    }
    if (slots_[p].left != detail::blocking_departure::present)
      throw worker_error("cadence::blocking_controller: worker " + std::to_string(p) +
                         " stopped waiting: it " + how_it_left(p));
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
  blocking_options options_;
  time_point start_;
  std::optional<liveness_tracker<time_point>> liveness_;  // engaged when evict_after is set
  std::vector<slot> slots_;                               // per worker id issued
  std::vector<eviction> evictions_;
};

/// @}
}  // namespace cadence
