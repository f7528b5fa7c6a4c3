/// \file
/// \ingroup runtime
/// Who has gone silent: per-worker last-heard times and the workers silent past a deadline.
/// Pure (time is an argument), so the in-process blocking wrapper and a server that hears from
/// workers over a network apply one liveness rule, and tests can replay it exactly.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/types.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence {
/// \addtogroup runtime
/// @{

/// Where a worker stands with a liveness_tracker.
enum class liveness_state : unsigned char {
  untracked,  ///< never heard from, or forgotten (it left)
  watched,    ///< heard from; silent once the deadline has passed since then
  excused,    ///< blocked on us (waiting to be released): its silence is ours, not its own
};

namespace detail {

/// Seconds in a time difference, for messages: a plain number is taken as seconds already.
template <class D>
double liveness_seconds(const D& d) {
  if constexpr (std::is_arithmetic_v<D>)
    return static_cast<double>(d);
  else
    return std::chrono::duration<double>(d).count();
}

/// t + d, clamped to the largest time instead of overflowing: a deadline of years on a clock
/// counted in nanoseconds since boot must mean "never", not wrap into the past.
template <class Time, class D>
Time add_saturated(const Time& t, const D& d) {
  if constexpr (std::is_floating_point_v<Time>) {
    return t + d;  // saturates at infinity by itself
  } else {
    // Only a positive t can overflow: t <= 0 gives t + d <= the largest d.
    constexpr Time top = [] {
      if constexpr (std::is_integral_v<Time>)
        return std::numeric_limits<Time>::max();
      else
        return Time::max();
    }();
    if (t > Time{} && d > top - t) return top;
    return t + d;
  }
}

}  // namespace detail

/// Per worker, when it was last heard from; which workers have been silent for at least
/// `deadline`; and when the next one will be. The caller decides what counts as hearing from
/// a worker (a push, a heartbeat, a final "done") and what to do with the silent ones
/// (blocking_controller evicts them).
///
/// `Time` is `timestamp` (seconds, the controllers' time) by default, or any totally ordered
/// type whose difference `duration` compares and adds, such as a std::chrono::time_point.
/// Times passed to heard() must never go backwards: one clock, read in event order (under the
/// caller's lock). Not thread-safe on its own; the caller serializes calls.
///
/// Cost: heard, excuse, forget and next_deadline are O(1); silent(now) is O(workers it
/// returns). Watched workers sit in a list ordered by last-heard time, which stays sorted for
/// free because time never goes backwards: hearing from a worker moves it to the back.
template <class Time = timestamp>
class liveness_tracker {
public:
  /// The time type of heard() and silent().
  using time_type = Time;
  /// A difference of two times: what the deadline is.
  using duration = std::decay_t<decltype(std::declval<const Time&>() - std::declval<const Time&>())>;

  /// Workers silent for at least `deadline` (> 0) are reported.
  explicit liveness_tracker(duration deadline) : deadline_(deadline) {
    if (!(deadline > duration{}))  // also rejects NaN
      throw invalid_parameter_error("cadence::liveness_tracker: the deadline must be > 0, got " +
                                    std::to_string(detail::liveness_seconds(deadline)) + " s");
  }

  /// The silence after which a watched worker is reported.
  duration deadline() const noexcept { return deadline_; }

  /// Worker p was heard from at t: it is watched, and its silence counts from t.
  /// Throws time_error if t is earlier than a time already heard (the list order relies on
  /// it) or, for a floating-point Time, not finite.
  void heard(worker_id p, const Time& t) {
    if constexpr (std::is_floating_point_v<Time>) {
      if (!std::isfinite(t))
        throw time_error("cadence::liveness_tracker: worker " + std::to_string(p) +
                         " heard at a non-finite time (" + std::to_string(t) + ")");
    }
    if (latest_ && t < *latest_)
      throw time_error("cadence::liveness_tracker: worker " + std::to_string(p) +
                       " heard at a time " +
                       std::to_string(detail::liveness_seconds(*latest_ - t)) +
                       " s earlier than the latest one heard; time must not go backwards");
    grow(p);
    unlink(p);
    last_[p] = t;
    latest_ = t;
    link_back(p);
  }

  /// Worker p is blocked on the caller (waiting to be released), so it is alive however long
  /// it stays quiet: not reported until heard() again. Its last-heard time is kept.
  void excuse(worker_id p) {
    grow(p);
    unlink(p);
    state_[p] = liveness_state::excused;
  }

  /// Worker p left (finished, evicted, removed): never reported again unless heard() again.
  void forget(worker_id p) noexcept {
    if (p >= state_.size()) return;
    unlink(p);
    state_[p] = liveness_state::untracked;
  }

  /// Where p stands; untracked for an id never heard from.
  liveness_state state(worker_id p) const noexcept {
    return p < state_.size() ? state_[p] : liveness_state::untracked;
  }

  /// When p was last heard from (watched or excused), or nullopt when it is untracked.
  std::optional<Time> last_heard(worker_id p) const {
    if (state(p) == liveness_state::untracked) return std::nullopt;
    return last_[p];
  }

  /// Watched workers silent at `now` (now - last heard >= deadline), longest silent first.
  std::vector<worker_id> silent(const Time& now) const {
    std::vector<worker_id> out;
    for (worker_id q = head_; q != none && !(now - last_[q] < deadline_); q = next_[q])
      out.push_back(q);
    return out;
  }

  /// The earliest time at which a watched worker becomes silent (if nobody is heard from
  /// before then), or nullopt when nobody is watched: a waiting thread sleeps until then.
  std::optional<Time> next_deadline() const {
    if (head_ == none) return std::nullopt;
    return detail::add_saturated(last_[head_], deadline_);
  }

  /// Number of watched workers.
  std::size_t watched() const noexcept { return watched_; }

private:
  static constexpr worker_id none = std::numeric_limits<worker_id>::max();

  void grow(worker_id p) {
    if (p == none)
      throw worker_error("cadence::liveness_tracker: worker id " + std::to_string(p) +
                         " is reserved");
    if (p < state_.size()) return;
    const std::size_t n = std::size_t{p} + 1;
    state_.resize(n, liveness_state::untracked);
    last_.resize(n, Time{});
    prev_.resize(n, none);
    next_.resize(n, none);
  }

  void unlink(worker_id p) noexcept {
    if (state_[p] != liveness_state::watched) return;
    (prev_[p] == none ? head_ : next_[prev_[p]]) = next_[p];
    (next_[p] == none ? tail_ : prev_[next_[p]]) = prev_[p];
    prev_[p] = next_[p] = none;
    --watched_;
  }

  void link_back(worker_id p) noexcept {
    prev_[p] = tail_;
    next_[p] = none;
    (tail_ == none ? head_ : next_[tail_]) = p;
    tail_ = p;
    state_[p] = liveness_state::watched;
    ++watched_;
  }

  duration deadline_;
  std::vector<liveness_state> state_;
  std::vector<Time> last_;
  std::vector<worker_id> prev_, next_;  // the watched list, oldest last-heard first
  worker_id head_ = none, tail_ = none;
  std::size_t watched_ = 0;
  std::optional<Time> latest_;
};

/// @}
}  // namespace cadence
