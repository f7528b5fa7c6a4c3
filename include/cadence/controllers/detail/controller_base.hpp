// What every Cadence controller shares: worker membership, clocks, waiting flags, the time
// check, the release buffer, and the error messages for misuse.
#pragma once

#include <cadence/controllers/controller.hpp>
#include <cadence/controllers/detail/clock_table.hpp>
#include <cadence/core/error.hpp>
#include <cadence/core/types.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace cadence::detail {

inline std::string format_time(timestamp t) {
  std::ostringstream os;
  os.precision(17);
  os << t;
  return os.str();
}

/// Throws invalid_parameter_error unless value <= bound, naming the policy, the parameter, its
/// value and the bound ("cadence::dssp: history = 5000 exceeds cadence::max_history = 1024").
inline void check_parameter_bound(const char* kind, const std::string& parameter,
                                  std::uintmax_t value, const char* bound_name,
                                  std::uintmax_t bound) {
  if (value > bound)
    throw invalid_parameter_error(std::string("cadence::") + kind + ": " + parameter + " = " +
                                  std::to_string(value) + " exceeds " + bound_name + " = " +
                                  std::to_string(bound));
}

/// Checks workers x per_worker (history, R) against a bound on their product; both factors
/// are already bounded, so the product cannot overflow.
inline void check_product_bound(const char* kind, std::size_t workers, const char* factor,
                                std::size_t per_worker, const char* bound_name,
                                std::size_t bound) {
  check_parameter_bound(kind,
                        std::string("workers x ") + factor + " (" + std::to_string(workers) +
                            " x " + std::to_string(per_worker) + ")",
                        std::uintmax_t{workers} * per_worker, bound_name, bound);
}

/// Ensures v can hold n elements without reallocating, growing geometrically so that adding
/// workers one at a time stays amortised O(1). Changes no element, so it is safe to call
/// before a change that must not fail halfway.
template <class T, class A>
void reserve_for(std::vector<T, A>& v, std::size_t n) {
  if (v.capacity() < n) v.reserve(n > 2 * v.capacity() ? n : 2 * v.capacity());
}

static_assert(max_workers < clock_table::none,
              "cadence: max_workers must leave clock_table::none free as a sentinel");

/// Base of the concrete controllers. Not part of the public interface: controllers are used
/// through their own classes, the synchronization_controller concept, or any_controller.
class controller_base {
public:
  /// Number of worker ids issued so far (active or removed).
  std::size_t worker_capacity() const noexcept { return state_.size(); }
  /// Number of active workers.
  std::size_t active_workers() const noexcept { return table_.active(); }
  bool is_active(worker_id p) const noexcept { return p < state_.size() && state_[p] != removed; }
  bool is_waiting(worker_id p) const {
    check_active(p, "is_waiting");
    return state_[p] == waiting;
  }
  std::size_t waiting_count() const noexcept { return waiting_; }
  /// Pushes worker p has made (its clock; a joiner starts at the slowest active clock).
  clock_value clock(worker_id p) const {
    check_active(p, "clock");
    return table_.clock(p);
  }
  /// Smallest clock among active workers (0 when none is active).
  clock_value min_clock() const noexcept { return table_.empty() ? 0 : table_.min(); }
  clock_value max_clock() const noexcept { return table_.empty() ? 0 : table_.max(); }
  /// c_p - c_min: how far worker p is ahead of the slowest active worker.
  clock_value staleness(worker_id p) const { return clock(p) - table_.min(); }
  /// The largest staleness over active workers right now.
  clock_value max_staleness() const noexcept {
    return table_.empty() ? 0 : table_.max() - table_.min();
  }
  /// Bytes of memory the controller holds (capacities of its buffers). This base part, what
  /// SSP, BSP and ASP hold, is 25 bytes per worker id (33 for DSSP's ordered clock table) plus
  /// the clock ring; policies with a push history or planning add theirs.
  std::size_t bytes_reserved() const noexcept {
    return state_.capacity() + released_.capacity() * sizeof(worker_id) + table_.bytes_reserved();
  }
  /// A hint that worker p will push soon: starts loading the state its push touches into the
  /// cache, so that a caller holding the next few pushes (a server's batch of messages, a
  /// simulator's event queue) overlaps their memory latency. Checks nothing and changes
  /// nothing observable; ids never issued are ignored. Like push, not safe to call
  /// concurrently with any other member (it keeps a few recent hints).
  void prefetch(worker_id p) const noexcept {
    if (p < state_.size()) prefetch_for_write(&state_[p]);
    table_.prefetch(p);
  }
  /// The time of the latest event seen (pushes only), or -inf before the first.
  timestamp last_time() const noexcept { return last_time_; }

protected:
  enum worker_state : unsigned char { running, waiting, removed };

  /// `ordered`: keep each clock's workers in the order they reached it (DSSP's tie-break).
  controller_base(const char* kind, std::size_t workers, bool ordered = false)
      : kind_(kind), table_(ordered) {
    check_parameter_bound(kind, "workers", workers, "cadence::max_workers", max_workers);
    state_.assign(workers, running);
    table_.reserve_workers(workers);
    released_.reserve(workers);  // a push releases at most every worker: never reallocates
    for (std::size_t p = workers; p-- > 0;) table_.insert_front(static_cast<worker_id>(p), 0);
  }

  // add_worker in two steps so that a policy can make its own room in between and commit only
  // when nothing can fail any more: a throwing add_worker changes nothing.

  /// Checks the id bound and makes room for one more worker; returns the id it will get.
  /// Changes nothing observable.
  worker_id reserve_new_worker() {
    const std::size_t p = state_.size();
    if (p >= max_workers)
      throw invalid_parameter_error(prefix() + "add_worker: workers = " + std::to_string(p + 1) +
                                    " ids would exceed cadence::max_workers = " +
                                    std::to_string(max_workers) +
                                    " (ids of removed workers are not reused)");
    reserve_for(state_, p + 1);
    reserve_for(released_, p + 1);
    table_.reserve_insert(static_cast<worker_id>(p));
    return static_cast<worker_id>(p);
  }
  /// Registers worker p (from reserve_new_worker) at the slowest active clock, or at the last
  /// one when none is active. Does not throw.
  void commit_new_worker(worker_id p) noexcept {
    state_.push_back(running);
    table_.insert_front(p, table_.min());  // when none is active, min() holds the last clock
  }

  /// Validates a push from p at time t (known, active, not waiting, time finite and monotone).
  void check_push(worker_id p, timestamp t) const {
    check_active(p, "push");
    if (state_[p] == waiting)
      throw worker_error(prefix() + "worker " + std::to_string(p) + " pushed at clock " +
                         std::to_string(table_.clock(p)) + " (t=" + format_time(t) +
                         ") while it is waiting to be released; a waiting worker must not push");
    if (!std::isfinite(t))
      throw time_error(prefix() + "worker " + std::to_string(p) + " pushed at a non-finite time (" +
                       format_time(t) + ") at clock " + std::to_string(table_.clock(p)));
    if (t < last_time_)
      throw time_error(prefix() + "worker " + std::to_string(p) + " pushed at t=" + format_time(t) +
                       " (clock " + std::to_string(table_.clock(p)) +
                       "), earlier than the previous push, by worker " +
                       std::to_string(last_pusher_) + " at t=" + format_time(last_time_) +
                       "; time must not go backwards across all workers (one timeline per "
                       "controller)");
  }

  /// Commits the time of an accepted push (after every check that can throw).
  void record_push_time(worker_id p, timestamp t) noexcept {
    last_time_ = t;
    last_pusher_ = p;
  }

  void check_active(worker_id p, const char* what) const {
    if (p >= state_.size())
      throw worker_error(prefix() + what + ": unknown worker " + std::to_string(p) + " (ids issued: " +
                         (state_.empty() ? std::string("none")
                                         : "0.." + std::to_string(state_.size() - 1)) +
                         ")");
    if (state_[p] == removed)
      throw worker_error(prefix() + what + ": worker " + std::to_string(p) + " was removed");
  }

  std::string prefix() const { return std::string("cadence::") + kind_ + ": "; }

  /// A push that makes its worker wait must leave someone running, or no push could ever
  /// release them (a bug in the policy). Checked before the push changes anything, so the
  /// deadlock_error leaves the controller as it was. Exact because in every policy here a push
  /// that waits releases nobody: under SSP and DSSP the slowest clock rises only when the
  /// pusher was alone at it, and then the pusher proceeds; under ElasticBSP only the last
  /// arrival at the barrier releases, and it proceeds.
  void check_wait_allowed() const {
    if (waiting_ + 1 >= table_.active()) throw_deadlock();
  }
  /// p waits; something else of the policy's (not the clock) will release it.
  void set_waiting(worker_id p) noexcept {
    state_[p] = waiting;
    ++waiting_;
  }
  /// p waits at its current clock until release_clocks() covers that clock.
  void set_waiting_at_clock(worker_id p) noexcept {
    set_waiting(p);
    table_.add_waiter(p);
  }
  void release(worker_id p) noexcept {
    state_[p] = running;
    --waiting_;
    released_.push_back(p);
  }
  /// Marks p removed; returns whether it was waiting.
  bool mark_removed(worker_id p) noexcept {
    const bool was_waiting = state_[p] == waiting;
    if (was_waiting) --waiting_;
    state_[p] = removed;
    table_.erase(p);
    return was_waiting;
  }

  /// Releases every worker that set_waiting_at_clock() made wait at a clock in [lo, hi]
  /// (clipped to the active range), lowest clock first, in the order they began to wait.
  void release_clocks(clock_value lo, clock_value hi) noexcept {
    if (waiting_ == 0 || table_.empty()) return;
    if (lo < table_.min()) lo = table_.min();
    if (hi > table_.max()) hi = table_.max();
    // An entry whose worker was removed while it waited is dropped here.
    table_.release_waiters(lo, hi, [this](worker_id q) {
      if (state_[q] == waiting) release(q);
    });
  }

  /// remove_worker for policies that release by clock: drops p, then releases the waiters
  /// that are now within `bound` of the (possibly risen) slowest clock.
  span<const worker_id> remove_releasing_within(worker_id p, clock_value bound) {
    check_active(p, "remove_worker");
    released_.clear();
    const clock_value old_min = table_.min();
    mark_removed(p);
    release_within(old_min, bound);
    return released_;
  }

  /// After c_min rose from old_min, releases the waiters that are now within `bound` of it.
  void release_within(clock_value old_min, clock_value bound) noexcept {
    // A waiter sits more than `bound` above c_min, so waiting_ > 0 implies a finite bound and
    // the sums below cannot overflow.
    if (waiting_ == 0 || table_.empty() || table_.min() == old_min) return;
    release_clocks(old_min + bound + 1, table_.min() + bound);
  }

  [[noreturn]] void throw_deadlock() const {
    throw deadlock_error(prefix() + "every active worker (" + std::to_string(table_.active()) +
                         ") is waiting, so no push can release them; this is a bug in the policy");
  }

  decision decide(bool proceed) const { return decision{proceed, span<const worker_id>(released_)}; }

  const char* kind_;
  clock_table table_;
  std::vector<unsigned char> state_;
  std::vector<worker_id> released_;
  std::size_t waiting_ = 0;
  timestamp last_time_ = -HUGE_VAL;
  worker_id last_pusher_ = 0;  // who pushed at last_time_, for the backwards-time message
};

}  // namespace cadence::detail
