// Dynamic Stale Synchronous Parallel (Zhao, An, Liu, Chen; ICDCS 2019): SSP whose threshold
// adapts at run time within [s_L, s_U] from the workers' latest iteration intervals.
//
// When to pick it: workers of different speeds and no good guess for SSP's s. The fastest
// worker, once s_L ahead, is granted r* extra iterations chosen so that its next push lands
// as close as possible to a push of the slowest worker, which shortens its wait.
#pragma once

#include <cadence/controllers/detail/controller_base.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace cadence {

namespace detail {

/// DSSP's synchronization controller (spec section 3): with P_i = last_p + i*interval_p for
/// i in [0, max_i] and S_k = last_s + (k+1)*interval_s for k in [0, max_k], returns the i that
/// minimises min_k |S_k - P_i|, the smallest such i on ties. Both sequences are sorted, so
/// one forward pass with two pointers does it in O(max_i + max_k).
inline clock_value dssp_best_extension(timestamp last_p, timestamp interval_p, timestamp last_s,
                                       timestamp interval_s, clock_value max_i,
                                       clock_value max_k) {
  clock_value best_i = 0;
  double best = HUGE_VAL;
  clock_value k = 0;
  for (clock_value i = 0; i <= max_i; ++i) {
    const timestamp pi = last_p + static_cast<double>(i) * interval_p;
    // Move k to the first S_k >= P_i (or the last one); the nearest is S_k or S_{k-1}.
    while (k < max_k && last_s + static_cast<double>(k + 1) * interval_s < pi) ++k;
    double d = std::fabs(last_s + static_cast<double>(k + 1) * interval_s - pi);
    if (k > 0) {
      const double before = std::fabs(last_s + static_cast<double>(k) * interval_s - pi);
      if (before < d) d = before;
    }
    if (d < best) {
      best = d;
      best_i = i;
    }
  }
  return best_i;
}

}  // namespace detail

/// DSSP(s_L, s_U). On a push from p (spec section 3):
/// 1. c_p += 1 and p's two latest push times shift (on every push of every worker);
/// 2. if p holds extra iterations (r_p > 0), it uses one and proceeds;
/// 3. else if c_p - c_min <= s_L it proceeds;
/// 4. else if p is the fastest worker, the synchronization controller picks r* and p proceeds
///    with r_p = r* - 1 when r* > 0 (p runs exactly r* iterations past the s_L check);
/// 5. else p waits until c_p - c_min <= s_L.
/// Guarantee: no worker starts an iteration more than s_U clocks ahead of the slowest. The
/// controller searches r in [0, min(r_max, s_U + 1 - (c_p - c_min))]: on the first grant (at
/// staleness s_L + 1) that is the paper's [0, r_max]; the cap only bites on a second grant in a
/// row, which the paper leaves open and which could otherwise exceed s_U.
/// With s_L = s_U it decides exactly like ssp(s_L). Every push is O(1) amortised plus
/// O(r_max) when the controller runs.
class dssp : public detail::controller_base {
public:
  dssp(std::size_t workers, clock_value s_lower, clock_value s_upper)
      : controller_base("dssp", workers), s_lower_(s_lower), s_upper_(s_upper) {
    if (s_lower < 0)
      throw invalid_parameter_error("cadence::dssp: lower staleness bound s_L must be >= 0, got " +
                                    std::to_string(s_lower));
    if (s_upper < s_lower)
      throw invalid_parameter_error("cadence::dssp: upper bound s_U (" + std::to_string(s_upper) +
                                    ") must be >= lower bound s_L (" + std::to_string(s_lower) + ")");
    extra_.assign(workers, 0);
    latest_.assign(workers, 0.0);
    previous_.assign(workers, 0.0);
    pushes_.assign(workers, 0);
  }

  decision push(worker_id p, timestamp t) {
    check_push(p, t);
    last_time_ = t;
    released_.clear();
    previous_[p] = latest_[p];
    latest_[p] = t;
    ++pushes_[p];
    const clock_value old_min = table_.min();
    table_.advance(p);
    release_within(old_min, s_lower_);

    const clock_value gap = table_.clock(p) - table_.min();
    bool proceed = false;
    if (extra_[p] > 0) {
      --extra_[p];
      proceed = true;
    } else if (gap <= s_lower_) {
      proceed = true;
    } else if (table_.clock(p) == table_.max()) {
      const clock_value r = controller(p, gap);
      if (r > 0) {
        extra_[p] = r - 1;
        proceed = true;
        ++grants_;
      }
    }
    if (!proceed) set_waiting(p);
    return decide(proceed);
  }

  span<const worker_id> remove_worker(worker_id p) { return remove_releasing_within(p, s_lower_); }

  worker_id add_worker() {
    const worker_id p = add_worker_at_min();
    extra_.push_back(0);
    latest_.push_back(0.0);
    previous_.push_back(0.0);
    pushes_.push_back(0);
    return p;
  }

  /// Active workers that p waits for: those more than s_L clocks behind it.
  std::vector<worker_id> waiting_for(worker_id p) const {
    const clock_value c = clock(p);
    std::vector<worker_id> out;
    for (worker_id q = 0; q < state_.size(); ++q)
      if (state_[q] != removed && table_.clock(q) < c - s_lower_) out.push_back(q);
    return out;
  }

  /// Extra iterations worker p may still run past the s_L check (r_p).
  clock_value extra_iterations(worker_id p) const {
    check_active(p, "extra_iterations");
    return extra_[p];
  }
  /// How many times the synchronization controller granted r* > 0.
  std::size_t grants() const noexcept { return grants_; }
  clock_value lower_bound() const noexcept { return s_lower_; }
  clock_value upper_bound() const noexcept { return s_upper_; }
  /// The staleness no worker ever exceeds when it starts an iteration: s_U.
  clock_value staleness_bound() const noexcept { return s_upper_; }
  std::string config() const {
    return "dssp:" + std::to_string(s_lower_) + ":" + std::to_string(s_upper_);
  }

private:
  // The synchronization controller for the fastest worker p, `gap` clocks ahead of c_min.
  clock_value controller(worker_id p, clock_value gap) const {
    const clock_value max_i = std::min(s_upper_ - s_lower_, s_upper_ + 1 - gap);
    if (max_i <= 0 || pushes_[p] < 2) return 0;
    // The slowest worker: smallest clock, ties to the oldest latest push (the bucket's head).
    const worker_id slow = table_.head(table_.min());
    if (pushes_[slow] < 2) return 0;
    return detail::dssp_best_extension(latest_[p], latest_[p] - previous_[p], latest_[slow],
                                       latest_[slow] - previous_[slow], max_i,
                                       s_upper_ - s_lower_);
  }

  clock_value s_lower_, s_upper_;
  std::vector<clock_value> extra_;
  std::vector<timestamp> latest_, previous_;
  std::vector<std::size_t> pushes_;
  std::size_t grants_ = 0;
};

}  // namespace cadence
