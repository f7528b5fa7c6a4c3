/// \file
/// \ingroup controllers
/// Dynamic Stale Synchronous Parallel (Zhao, An, Liu, Chen; ICDCS 2019): SSP whose threshold
/// adapts at run time within [s_L, s_U] from the workers' latest iteration intervals.
///
/// When to pick it: workers of different speeds and no good guess for SSP's s. The fastest
/// worker, once s_L ahead, is granted r* extra iterations chosen so that its next push lands
/// as close as possible to a push of the slowest worker, which shortens its wait.
#pragma once

#include <cadence/controllers/detail/controller_base.hpp>
#include <cadence/core/detail/aligned_allocator.hpp>
#include <cadence/predict/interval.hpp>
#include <cadence/predict/predictor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence {
/// \addtogroup controllers
/// @{

namespace detail {

/// DSSP's synchronization controller (docs/contract.md#the-synchronization-controller) on predicted push times: with the fast
/// worker's candidate stopping pushes p[0..np) and the slowest worker's predicted pushes
/// s[0..ns), both sorted, returns the i that minimises min_k |s[k] - p[i]|, the smallest such
/// i on ties. One forward pass with two pointers: O(np + ns).
inline std::size_t dssp_best_extension(const timestamp* p, std::size_t np, const timestamp* s,
                                       std::size_t ns) {
  std::size_t best_i = 0, k = 0;
  double best = HUGE_VAL;
  for (std::size_t i = 0; i < np; ++i) {
    // Move k to the first s[k] >= p[i] (or the last one); the nearest is s[k] or s[k-1].
    while (k + 1 < ns && s[k] < p[i]) ++k;
    double d = std::fabs(s[k] - p[i]);
    if (k > 0) d = std::min(d, std::fabs(s[k - 1] - p[i]));
    if (d < best) {
      best = d;
      best_i = i;
    }
  }
  return best_i;
}

}  // namespace detail

/// DSSP(s_L, s_U) over a push-time predictor P. On a push from p (docs/contract.md#3-dssp):
/// 1. c_p += 1 and p's push history shifts (on every push of every worker);
/// 2. if p holds extra iterations (r_p > 0), it uses one and proceeds;
/// 3. else if c_p - c_min <= s_L it proceeds;
/// 4. else if p is the fastest worker, the synchronization controller picks r* and p proceeds
///    with r_p = r* - 1 when r* > 0 (p runs exactly r* iterations past the s_L check);
/// 5. else p waits until c_p - c_min <= s_L.
/// The controller compares P_0 = p's latest push and P_1.. = its predicted next pushes with
/// the slowest worker's predicted pushes S_0..S_{r_max}. With the paper's last_interval (the
/// default) that is exactly P_i = A_p + i I_p and S_k = A_slow + (k+1) I_slow; other
/// predictors (mean, median, EWMA of recent intervals) make it robust to one noisy interval.
/// Guarantee: no worker starts an iteration more than s_U clocks ahead of the slowest. The
/// controller searches r in [0, min(r_max, s_U + 1 - (c_p - c_min))]: on the first grant (at
/// staleness s_L + 1) that is the paper's [0, r_max]; the cap only bites on a second grant in a
/// row, which the paper leaves open and which could otherwise exceed s_U.
/// With s_L = s_U it decides exactly like ssp(s_L). Every push is O(1) amortised plus
/// O(r_max) when the controller runs; nothing is allocated per push.
template <class P = last_interval>
class basic_dssp : public detail::controller_base {
  static_assert(is_predictor_v<P, timestamp>,
                "cadence::basic_dssp<P>: P must model the predictor concept for double "
                "timestamps (see cadence/predict/predictor.hpp)");

public:
  /// Most extra iterations the synchronization controller may consider, r_max = s_U - s_L.
  /// It sizes two scratch buffers of r_max + 1 predictions (1 MiB at the bound) and each run
  /// of the controller costs O(r_max). 2^16 is thousands of times the docs' example
  /// (dssp:3:15, r_max = 12); a wider range is ASP in all but name.
  static constexpr clock_value max_extension = clock_value{1} << 16;

  /// `workers` workers at clock 0 under thresholds s_lower (s_L >= 0) and s_upper (s_U >= s_L,
  /// at most max_extension above it), with `predictor` for every worker.
  /// `history` in [2, cadence::max_history]: how many of each worker's latest push times the
  /// predictor sees (default: 2 for last_interval, which needs no more, else 16); workers x
  /// history <= cadence::max_history_entries. Throws invalid_parameter_error naming the
  /// parameter, its value and the bound.
  basic_dssp(std::size_t workers, clock_value s_lower, clock_value s_upper, P predictor = P(),
             std::size_t history = std::is_same_v<P, last_interval> ? 2 : 16)
      : controller_base("dssp", workers, /*ordered=*/true),
        s_lower_(s_lower),
        s_upper_(s_upper),
        history_(history),
        predictor_(std::move(predictor)) {
    if (s_lower < 0)
      throw invalid_parameter_error("cadence::dssp: lower staleness bound s_L must be >= 0, got " +
                                    std::to_string(s_lower));
    if (s_upper < s_lower)
      throw invalid_parameter_error("cadence::dssp: upper bound s_U (" + std::to_string(s_upper) +
                                    ") must be >= lower bound s_L (" + std::to_string(s_lower) + ")");
    detail::check_parameter_bound("dssp", "r_max = s_U - s_L",
                                  static_cast<std::uintmax_t>(s_upper - s_lower),
                                  "dssp::max_extension", max_extension);
    if (history < 2)
      throw invalid_parameter_error("cadence::dssp: history must be >= 2 pushes, got " +
                                    std::to_string(history));
    detail::check_parameter_bound("dssp", "history", history, "cadence::max_history", max_history);
    detail::check_product_bound("dssp", workers, "history", history,
                                "cadence::max_history_entries", max_history_entries);
    cells_.resize(workers * stride());
    for (worker_id q = 0; q < workers; ++q) init_record(q);
    const auto r_max = static_cast<std::size_t>(s_upper - s_lower);
    scratch_history_.resize(history_);
    fast_.resize(r_max + 1);
    slow_.resize(r_max + 1);
  }

  /// Worker p finished an iteration at time t. Throws worker_error or time_error as ssp does,
  /// and whatever the predictor throws other than time_error (which means "no extension");
  /// a push that throws changes nothing.
  decision push(worker_id p, timestamp t) {
    check_push(p, t);
    // Decide from the state as it will be after the push, then commit: the predictor, the
    // deadlock check and the ring growth all run before the first change.
    const clock_value c = table_.clock(p) + 1;
    const clock_value gap = c - table_.min_after_advance(p);
    clock_value extra = extra_of(p);
    bool proceed = true, grant = false;
    if (extra > 0) {
      --extra;
    } else if (gap > s_lower_) {
      // Only the fastest worker (the largest clock once it has pushed) may be granted more.
      const clock_value r = c >= table_.max() ? controller(p, t, gap) : 0;
      proceed = grant = r > 0;
      if (grant) extra = r - 1;
    }
    if (!proceed) check_wait_allowed();
    table_.reserve_advance(p);

    record_push_time(p, t);
    released_.clear();
    cell* const r = record(p);
    r[ring_at + static_cast<std::size_t>(r[pushes_at].i) % history_].t = t;
    ++r[pushes_at].i;
    r[extra_at].i = extra;
    if (grant) ++grants_;
    const clock_value old_min = table_.min();
    table_.advance(p);
    release_within(old_min, s_lower_);
    if (!proceed) set_waiting_at_clock(p);
    return decide(proceed);
  }

  /// A hint that worker p will push soon (see controller_base::prefetch): also loads its
  /// record (allowance, push count and push ring; one cache line with the default history).
  void prefetch(worker_id p) const noexcept {
    controller_base::prefetch(p);
    if (std::size_t{p} >= worker_capacity()) return;
    detail::prefetch_for_write(record(p));
  }

  /// Removes worker p and releases whoever waited only for it; throws worker_error, changing
  /// nothing, for an unknown or removed worker.
  span<const worker_id> remove_worker(worker_id p) { return remove_releasing_within(p, s_lower_); }

  /// Adds a worker at the slowest active clock; returns its id. Throws
  /// invalid_parameter_error, changing nothing, past cadence::max_workers ids or
  /// cadence::max_history_entries push times.
  worker_id add_worker() {
    const worker_id p = reserve_new_worker();
    detail::check_product_bound("dssp", std::size_t{p} + 1, "history", history_,
                                "cadence::max_history_entries", max_history_entries);
    detail::reserve_for(cells_, cells_.size() + stride());
    commit_new_worker(p);  // nothing from here on can throw
    cells_.resize(cells_.size() + stride());
    init_record(p);
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
    return extra_of(p);
  }
  /// Bytes held: the base's, a record of 16 + 8 x history per worker (allowance, push count
  /// and push ring, one flat buffer), plus the O(r_max) scratch.
  std::size_t bytes_reserved() const noexcept {
    const auto held = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
    return controller_base::bytes_reserved() + held(cells_) + held(scratch_history_) +
           held(fast_) + held(slow_);
  }
  /// How many times the synchronization controller granted r* > 0.
  std::size_t grants() const noexcept { return grants_; }
  /// s_L: a worker at most this far ahead of the slowest always proceeds.
  clock_value lower_bound() const noexcept { return s_lower_; }
  /// s_U: the bound the extra iterations never take a worker past.
  clock_value upper_bound() const noexcept { return s_upper_; }
  /// The staleness no worker ever exceeds when it starts an iteration: s_U.
  clock_value staleness_bound() const noexcept { return s_upper_; }
  /// The predictor of push times, shared by every worker.
  const P& predictor() const noexcept { return predictor_; }
  /// "dssp:<s_L>:<s_U>", followed by ":<predictor>" unless it is the default last_interval.
  std::string config() const {
    std::string c = "dssp:" + std::to_string(s_lower_) + ":" + std::to_string(s_upper_);
    if constexpr (!std::is_same_v<P, last_interval>) {
      // Appended piecewise: g++ 12 warns (-Wrestrict, a false positive) on ":" + string.
      c += ':';
      c += predictor_.name();
    }
    return c;
  }

private:
  // Worker q's latest push times, oldest first, in scratch_history_: the recorded ones, then
  // `t` when `pending` (the push being decided, not recorded yet).
  span<const timestamp> history_of(worker_id q, bool pending, timestamp t) {
    const cell* const r = record(q);
    const auto recorded = static_cast<std::size_t>(r[pushes_at].i);
    const std::size_t pushes = recorded + (pending ? 1 : 0);
    const std::size_t have = pushes < history_ ? pushes : history_;
    for (std::size_t i = 0; i < have; ++i) {
      const std::size_t k = pushes - have + i;
      scratch_history_[i] = k == recorded ? t : r[ring_at + k % history_].t;
    }
    return span<const timestamp>(scratch_history_.data(), have);
  }

  // The synchronization controller for p's push at t, which will make p the fastest worker,
  // `gap` clocks ahead of the slowest. Reads the state as it will be after the push, and
  // writes only scratch buffers, so whatever the predictor throws changes nothing.
  clock_value controller(worker_id p, timestamp t, clock_value gap) {
    const clock_value max_i = std::min(s_upper_ - s_lower_, s_upper_ + 1 - gap);
    if (max_i <= 0 || pushes_of(p) + 1 < 2) return 0;
    // The slowest worker: smallest clock, ties to the oldest latest push (the bucket's head).
    // gap > 0, so p is not alone at the smallest clock and that clock stays.
    const worker_id slow = table_.head_of_min_after_advance(p);
    if (pushes_of(slow) < 2) return 0;
    const auto np = static_cast<std::size_t>(max_i) + 1;
    const auto ns = static_cast<std::size_t>(s_upper_ - s_lower_) + 1;
    try {
      const span<const timestamp> hp = history_of(p, true, t);
      fast_[0] = hp.back();
      predictor_.predict(hp, np - 1, fast_.data() + 1);
      predictor_.predict(history_of(slow, false, t), ns, slow_.data());
    } catch (const time_error&) {  // predictions beyond what a double holds: no extension
      return 0;
    }
    // A predicted interval of zero (equal push times) comes back as one representable step,
    // because predictions are strictly increasing. Candidates that far apart carry no
    // duration: every i would tie, and the tie goes to i = 0 as the paper's formula gives.
    if (np > 1 && fast_[1] <= std::nextafter(fast_[0], HUGE_VAL)) return 0;
    return static_cast<clock_value>(detail::dssp_best_extension(fast_.data(), np, slow_.data(), ns));
  }

  clock_value s_lower_, s_upper_;
  std::size_t history_;
  P predictor_;
  // Each worker's record, stride() cells at p * stride(): its allowance r_p (cell extra_at),
  // its push count (pushes_at) and its latest `history_` push times (from ring_at, slot
  // pushes % history). One record, not three arrays, so that at 10^6 workers a push misses
  // on one line of its own, not three: with the default history of 2 a record is 32 bytes and
  // the buffer starts on a cache line, so no record straddles two.
  union cell {
    std::int64_t i;  // extra_at and pushes_at
    timestamp t;     // the ring
  };
  static constexpr std::size_t extra_at = 0, pushes_at = 1, ring_at = 2;
  std::size_t stride() const noexcept { return ring_at + history_; }
  cell* record(worker_id p) noexcept { return cells_.data() + std::size_t{p} * stride(); }
  const cell* record(worker_id p) const noexcept {
    return cells_.data() + std::size_t{p} * stride();
  }
  clock_value extra_of(worker_id p) const noexcept { return record(p)[extra_at].i; }
  std::int64_t pushes_of(worker_id p) const noexcept { return record(p)[pushes_at].i; }
  void init_record(worker_id p) noexcept {
    cell* const r = record(p);
    r[extra_at].i = 0;
    r[pushes_at].i = 0;
    for (std::size_t k = 0; k < history_; ++k) r[ring_at + k].t = 0.0;
  }
  std::vector<cell, detail::aligned_allocator<cell>> cells_;
  std::vector<timestamp> scratch_history_, fast_, slow_;
  std::size_t grants_ = 0;
};

/// DSSP with the paper's last-interval predictor.
using dssp = basic_dssp<last_interval>;

/// @}
}  // namespace cadence
