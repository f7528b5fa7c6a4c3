/// \file
/// \ingroup controllers
/// Stale Synchronous Parallel (Ho et al., NIPS 2013) and its two limits: BSP = SSP(0), a
/// barrier every iteration, and ASP = SSP(infinity), no waiting at all.
///
/// When to pick which:
/// - bsp: the model is sensitive to staleness or workers are nearly identical (waiting is cheap).
/// - ssp: workers differ a little and you know a staleness your model tolerates.
/// - asp: throughput matters most and the model tolerates arbitrarily stale weights.
/// If you cannot guess s, prefer dssp (adapts within [s_L, s_U]) or elastic (predicts barriers).
#pragma once

#include <cadence/controllers/detail/controller_base.hpp>

#include <string>
#include <vector>

namespace cadence {
/// \addtogroup controllers
/// @{

/// SSP(s): after its push, worker p proceeds iff c_p - c_min <= s; otherwise it waits and is
/// released as soon as c_min rises enough. Every push and removal is O(1) amortised.
class ssp : public detail::controller_base {
public:
  /// n workers with ids 0..n-1, all at clock 0; s >= 0 is the staleness bound.
  ssp(std::size_t workers, clock_value s) : ssp(workers, s, "ssp") {}

  /// Worker p finished an iteration at time t. Throws worker_error for an unknown, removed or
  /// waiting worker and time_error for a non-finite time or one earlier than the last push; a
  /// push that throws changes nothing.
  decision push(worker_id p, timestamp t) {
    check_push(p, t);
    // Decide from the clocks as they will be, then commit: nothing below the reserve throws.
    const bool proceed = table_.clock(p) + 1 - table_.min_after_advance(p) <= s_;
    if (!proceed) check_wait_allowed();
    table_.reserve_advance(p);
    record_push_time(p, t);
    released_.clear();
    const clock_value old_min = table_.min();
    table_.advance(p);
    release_within(old_min, s_);
    if (!proceed) set_waiting_at_clock(p);
    return decide(proceed);
  }

  /// Removes worker p (it left or died) and releases whoever waited only for it. Throws
  /// worker_error, changing nothing, for an unknown or removed worker.
  span<const worker_id> remove_worker(worker_id p) { return remove_releasing_within(p, s_); }

  /// Adds a worker at the slowest active clock (it pulls the current weights); returns its id.
  /// Throws invalid_parameter_error, changing nothing, past cadence::max_workers ids.
  worker_id add_worker() {
    const worker_id p = reserve_new_worker();
    commit_new_worker(p);
    return p;
  }

  /// Active workers that p waits for: those more than s clocks behind it.
  std::vector<worker_id> waiting_for(worker_id p) const {
    const clock_value c = clock(p);
    std::vector<worker_id> out;
    if (s_ == unbounded_staleness) return out;
    for (worker_id q = 0; q < state_.size(); ++q)
      if (state_[q] != removed && table_.clock(q) < c - s_) out.push_back(q);
    return out;
  }

  /// The staleness bound s (unbounded_staleness for ASP).
  clock_value staleness_bound() const noexcept { return s_; }
  /// The config string that make_controller() accepts to build this policy.
  std::string config() const {
    if (kind_ == std::string("ssp")) return "ssp:" + std::to_string(s_);
    return kind_;
  }

protected:
  /// For bsp and asp: the bound s, and the name config() reports instead of "ssp:<s>".
  ssp(std::size_t workers, clock_value s, const char* kind) : controller_base(kind, workers), s_(s) {
    if (s < 0)
      throw invalid_parameter_error("cadence::ssp: staleness bound s must be >= 0, got " +
                                    std::to_string(s));
  }

private:
  clock_value s_;
};

/// Bulk Synchronous Parallel: a barrier after every iteration. Decides exactly like ssp(0).
class bsp : public ssp {
public:
  /// n workers with ids 0..n-1, all at clock 0.
  explicit bsp(std::size_t workers) : ssp(workers, 0, "bsp") {}
};

/// Asynchronous Parallel: nobody ever waits. Decides exactly like ssp with an infinite bound,
/// and still tracks clocks so staleness can be observed.
class asp : public ssp {
public:
  /// n workers with ids 0..n-1, all at clock 0.
  explicit asp(std::size_t workers) : ssp(workers, unbounded_staleness, "asp") {}
};

/// @}
}  // namespace cadence
