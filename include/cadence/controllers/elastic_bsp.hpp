/// \file
/// \ingroup controllers
/// ElasticBSP (Zhao et al., ICDM 2019): workers run asynchronously between barriers, and each
/// barrier is placed where the predicted spread of arrival times is smallest (ZipLine).
///
/// When to pick it: heterogeneous or jittery workers where BSP wastes time waiting and ASP's
/// unbounded staleness hurts accuracy. It bounds the work between two barriers (monitoring
/// pushes plus at most R), not the clock gap: a worker twice as fast runs about twice as many
/// iterations per superstep, so c_p - c_min grows without bound, as under ASP.
#pragma once

#include <cadence/controllers/detail/controller_base.hpp>
#include <cadence/core/detail/aligned_allocator.hpp>
#include <cadence/predict/any_predictor.hpp>
#include <cadence/zipline/variant.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cadence {
/// \addtogroup controllers
/// @{

/// The current ElasticBSP plan, for observability.
struct elastic_plan {
  /// False during monitoring (no barrier planned yet).
  bool planned = false;
  ///@{
  /// Predicted time of the barrier (the latest chosen push) and the predicted spread of the
  /// chosen pushes (the fastest worker's predicted wait).
  timestamp barrier = 0;
  timestamp spread = 0;
  ///@}
  /// Time at which the plan was made.
  timestamp planned_at = 0;
  /// Per worker id: pushes still to make before waiting at the barrier (0 for a worker that
  /// already waits, -1 for a worker that is not part of this superstep).
  std::vector<clock_value> remaining;
};

/// ElasticBSP over a predictor type P (any is_predictor_v<P, timestamp>; any_predictor by
/// default, so the predictor can be picked at run time).
/// The cycle after every barrier (docs/contract.md#4-elasticbsp):
/// 1. monitoring: everyone proceeds until every participating worker has pushed twice;
/// 2. prediction: P maps each worker's pushes since the barrier to its next R push times;
/// 3. planning: the ZipLine variant picks, per worker, j_p in [1, R] iterations to run;
/// 4. running: a worker that made its j_p pushes waits; when all wait, all are released.
/// Fallbacks: with fewer than two participating workers, or predictions the search rejects
/// (non-finite), no barrier is planned and monitoring restarts at once. A worker that joins
/// takes part from the next monitoring phase and runs freely until then. Removing a worker
/// that others wait for completes the barrier without it.
template <class P = any_predictor<timestamp>>
class basic_elastic_bsp : public detail::controller_base {
  static_assert(is_predictor_v<P, timestamp>,
                "cadence::basic_elastic_bsp<P>: P must model the predictor concept for double "
                "timestamps (see cadence/predict/predictor.hpp)");

public:
  /// Most predicted pushes per worker (R). 2^16 is hundreds of times the R the docs measure
  /// (2 to 120; beyond about 30 predictions are already less accurate); R also bounds the
  /// iterations a worker runs between barriers.
  static constexpr std::size_t max_lookahead = std::size_t{1} << 16;
  /// Most points in one plan, workers x R, counted over worker ids issued. The rows take 8
  /// bytes a point and the ZipLine workspace a few times that, so 2^24 points keep planning
  /// under about 1 GiB; cadence::max_workers with R <= 16 fits.
  static constexpr std::size_t max_plan_points = std::size_t{1} << 24;

  /// `workers` workers at clock 0, their pushes predicted by `predictor` and the barrier placed
  /// by ZipLine `variant`.
  /// `lookahead` R in [1, max_lookahead] predicted pushes per worker; `history` in
  /// [2, cadence::max_history] is how many of a worker's latest pushes since the barrier the
  /// predictor sees; workers x R <= max_plan_points and workers x history <=
  /// cadence::max_history_entries. Throws invalid_parameter_error naming the parameter, its
  /// value and the bound.
  basic_elastic_bsp(std::size_t workers, std::size_t lookahead, P predictor = P(),
                    zipline_variant variant = zipline_variant::fast, std::size_t history = 16)
      : controller_base("elastic_bsp", workers),
        lookahead_(lookahead),
        history_(history),
        predictor_(std::move(predictor)),
        variant_(variant) {
    if (lookahead < 1)
      throw invalid_parameter_error("cadence::elastic_bsp: lookahead R must be >= 1, got 0");
    detail::check_parameter_bound("elastic_bsp", "lookahead R", lookahead,
                                  "elastic_bsp::max_lookahead", max_lookahead);
    if (history < 2)
      throw invalid_parameter_error("cadence::elastic_bsp: history must be >= 2 pushes, got " +
                                    std::to_string(history));
    detail::check_parameter_bound("elastic_bsp", "history", history, "cadence::max_history",
                                  max_history);
    check_worker_bounds(workers);
    w_.resize(workers);
    for (worker& w : w_) w.participating = 1;
    ring_.assign(workers * history_, 0.0);
    participants_ = workers;
    last_superstep_.assign(workers, 0);
    // Planning room for every worker, so that planning allocates only in the ZipLine workspace.
    rows_.resize(workers * lookahead_);
    history_buf_.resize(history_);
    row_worker_.reserve(workers);
    result_.choice.reserve(workers);
  }

  /// Worker p finished an iteration at time t. Throws worker_error or time_error as ssp does,
  /// and whatever planning throws other than the documented fallbacks (an exception from the
  /// predictor, std::bad_alloc from the ZipLine workspace); a push that throws changes nothing.
  decision push(worker_id p, timestamp t) {
    check_push(p, t);
    // Decide first, then commit: the plan this push may complete (prediction and search, into
    // scratch buffers), the deadlock check and the ring growth all run before the first change.
    worker& w = w_[p];
    step next = step::run;
    if (w.participating) {
      if (!planned_) {
        if (ready_ + (w.since_barrier == 1 ? 1 : 0) == participants_)
          next = solve_plan(p, t, detail::clock_table::none) ? step::plan : step::fallback;
      } else if (w.remaining == 1) {
        next = arrived_ + 1 == participants_ ? step::complete : step::wait;
      }
    }
    if (next == step::wait) check_wait_allowed();
    table_.reserve_advance(p);

    record_push_time(p, t);
    released_.clear();
    table_.advance(p);
    if (w.superstep_pushes != counter_max) ++w.superstep_pushes;
    if (!w.participating) return decide(true);
    if (!planned_) {
      record(p, t);
      if (w.since_barrier == 2) ++ready_;
      if (next == step::plan) commit_plan(t);
      if (next == step::fallback) fallback();
      return decide(true);
    }
    --w.remaining;
    if (next == step::complete) complete_barrier(p);  // p reached the barrier last
    if (next != step::wait) return decide(true);
    ++arrived_;
    set_waiting(p);
    return decide(false);
  }

  /// A hint that worker p will push soon (see controller_base::prefetch): also loads its
  /// state and the start of its push ring.
  void prefetch(worker_id p) const noexcept {
    controller_base::prefetch(p);
    if (p >= w_.size()) return;
    detail::prefetch_for_write(&w_[p]);
    detail::prefetch_for_write(ring_.data() + std::size_t{p} * history_);
  }

  /// Removes worker p; if others wait at the barrier only for it, the barrier completes, and
  /// if everyone left is ready, the plan is made. Throws worker_error for an unknown or
  /// removed worker, or what planning throws (as for push); a throwing call changes nothing.
  span<const worker_id> remove_worker(worker_id p) {
    check_active(p, "remove_worker");
    worker& w = w_[p];
    const bool was_waiting = state_[p] == waiting;
    // Decide first (planning may throw), then commit.
    step next = step::run;
    if (w.participating) {
      const std::size_t left = participants_ - 1;
      const std::size_t ready = ready_ - (!planned_ && w.since_barrier >= 2 ? 1 : 0);
      if (left == 0)
        next = step::restart;
      else if (planned_ && arrived_ - (was_waiting ? 1 : 0) == left)
        next = step::complete;
      else if (!planned_ && ready == left)
        next = solve_plan(detail::clock_table::none, 0, p) ? step::plan : step::fallback;
    }

    released_.clear();
    mark_removed(p);
    if (!w.participating) return released_;
    w.participating = false;
    --participants_;
    if (was_waiting) --arrived_;
    if (!planned_ && w.since_barrier >= 2) --ready_;
    switch (next) {
      case step::restart: start_monitoring(); break;
      case step::complete: complete_barrier(detail::clock_table::none); break;
      case step::plan: commit_plan(last_time_); break;
      case step::fallback: fallback(); break;
      case step::run: case step::wait: break;  // a removal neither runs nor waits
    }
    return released_;
  }

  /// Adds a worker (it takes part from the next monitoring phase); returns its id. Throws
  /// invalid_parameter_error, changing nothing, past cadence::max_workers ids or the bounds on
  /// workers x R and workers x history.
  worker_id add_worker() {
    const worker_id p = reserve_new_worker();
    const std::size_t n = std::size_t{p} + 1;
    check_worker_bounds(n);
    // Make room for everything the new worker needs, planning included; then commit.
    detail::reserve_for(w_, n);
    detail::reserve_for(ring_, n * history_);
    detail::reserve_for(last_superstep_, n);
    detail::reserve_for(rows_, n * lookahead_);
    detail::reserve_for(row_worker_, n);
    detail::reserve_for(result_.choice, n);
    commit_new_worker(p);  // nothing from here on can throw
    w_.push_back(worker{});
    ring_.resize(n * history_, 0.0);
    last_superstep_.push_back(0);
    rows_.resize(n * lookahead_);
    if (participants_ == 0) start_monitoring();  // the next monitoring phase starts now
    return p;
  }

  /// Whom p waits for during running: the participating workers that have not reached the
  /// barrier yet.
  std::vector<worker_id> waiting_for(worker_id p) const {
    check_active(p, "waiting_for");
    std::vector<worker_id> out;
    if (!planned_) return out;
    for (worker_id q = 0; q < w_.size(); ++q)
      if (q != p && is_active(q) && w_[q].participating && state_[q] != waiting) out.push_back(q);
    return out;
  }

  /// The plan in force (planned = false during monitoring).
  elastic_plan plan() const {
    elastic_plan out = plan_;
    out.planned = planned_;
    out.remaining.assign(w_.size(), -1);
    if (planned_)
      for (worker_id q = 0; q < w_.size(); ++q)
        if (is_active(q) && w_[q].participating) out.remaining[q] = w_[q].remaining;
    return out;
  }
  /// Bytes held: the base's, 24 per worker (16 of state, 8 for
  /// last_superstep_iterations()), 8 x history per worker (the push rings, one flat buffer)
  /// and planning_bytes_reserved().
  std::size_t bytes_reserved() const noexcept {
    const auto held = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
    return controller_base::bytes_reserved() + held(w_) + held(ring_) + held(last_superstep_) +
           planning_bytes_reserved();
  }
  /// Bytes held for planning: the predicted rows (8 x R per worker), the row map and choices
  /// (12 per worker) and the ZipLine workspace (it grows on the first plan).
  std::size_t planning_bytes_reserved() const noexcept {
    const auto held = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
    return held(rows_) + held(history_buf_) + held(row_worker_) + held(result_.choice) +
           ws_.bytes_reserved();
  }
  /// Barriers completed so far.
  std::size_t barriers() const noexcept { return barriers_; }
  /// Supersteps that ended without a barrier (the fallback: fewer than two participants or
  /// predictions the search rejected).
  std::size_t fallbacks() const noexcept { return fallbacks_; }
  /// Pushes each worker made in the last completed superstep (indexed by worker id): its
  /// monitoring pushes plus the j_p the plan gave it.
  const std::vector<std::size_t>& last_superstep_iterations() const noexcept {
    return last_superstep_;
  }
  /// The largest per-superstep iteration count of any worker so far.
  std::size_t max_superstep_iterations() const noexcept { return max_superstep_; }
  /// True while no barrier is planned: every push proceeds (see cadence::supersteps).
  bool is_monitoring() const noexcept { return !planned_; }
  /// R: the most pushes predicted per worker, so the farthest a barrier is planned ahead.
  std::size_t lookahead() const noexcept { return lookahead_; }
  /// The predictor of push times, shared by every worker.
  const P& predictor() const noexcept { return predictor_; }
  /// The ZipLine variant that places the barriers.
  zipline_variant variant() const noexcept { return variant_; }
  /// "elastic:<R>:<predictor>:<variant>", every field spelled out, for make_controller().
  std::string config() const {
    return "elastic:" + std::to_string(lookahead_) + ":" + std::string(predictor_.name()) + ":" +
           std::string(to_string(variant_));
  }

private:
  // Per worker, 16 bytes; its latest `history_` push times since the barrier live in the flat
  // ring_ (row p at p * history_, slot ring_pos), so the controller makes no allocation per
  // worker: three buffers hold every worker's state, whatever n.
  static constexpr std::uint32_t counter_max = 0xFFFFFFFFu;
  struct worker {
    std::uint32_t since_barrier = 0;     // monitoring pushes since the superstep began (saturates)
    std::uint32_t superstep_pushes = 0;  // pushes in this superstep (saturates)
    std::int32_t remaining = 0;          // running: pushes left before the barrier (<= R)
    std::uint16_t ring_pos = 0;          // the ring slot the next push goes to (< history)
    std::uint8_t participating = 0;
  };
  static_assert(sizeof(worker) <= 16, "cadence::elastic_bsp: per-worker state must stay compact");
  static_assert(max_history <= 0xFFFFu, "cadence::elastic_bsp: ring_pos must hold a history slot");
  static_assert(max_lookahead <= 0x7FFFFFFF, "cadence::elastic_bsp: remaining must hold R");

  // What a push or a removal will do once it commits, decided before anything changes.
  enum class step { run, plan, fallback, wait, complete, restart };

  void check_worker_bounds(std::size_t workers) const {
    detail::check_product_bound("elastic_bsp", workers, "lookahead R", lookahead_,
                                "elastic_bsp::max_plan_points", max_plan_points);
    detail::check_product_bound("elastic_bsp", workers, "history", history_,
                                "cadence::max_history_entries", max_history_entries);
  }

  void record(worker_id p, timestamp t) noexcept {
    worker& w = w_[p];
    ring_[std::size_t{p} * history_ + w.ring_pos] = t;
    const std::size_t next = std::size_t{w.ring_pos} + 1;
    w.ring_pos = static_cast<std::uint16_t>(next == history_ ? 0 : next);
    if (w.since_barrier != counter_max) ++w.since_barrier;
  }

  void start_monitoring() noexcept {
    planned_ = false;
    ready_ = 0;
    arrived_ = 0;
    participants_ = 0;
    for (worker_id q = 0; q < w_.size(); ++q) {
      worker& w = w_[q];
      w.since_barrier = 0;
      w.ring_pos = 0;
      w.remaining = 0;
      w.participating = is_active(q) ? 1 : 0;
      if (w.participating) ++participants_;
    }
  }

  void end_superstep() noexcept {
    for (worker_id q = 0; q < w_.size(); ++q) {
      last_superstep_[q] = w_[q].superstep_pushes;
      if (w_[q].superstep_pushes > max_superstep_) max_superstep_ = w_[q].superstep_pushes;
      w_[q].superstep_pushes = 0;
    }
  }

  // Prediction and planning into the scratch buffers (rows_, row_worker_, result_), as if
  // worker `pushed` had recorded its push at `t` and worker `leaving` were gone: the caller
  // commits only afterwards, so whatever this throws changes nothing. Returns false for the
  // documented fallback (fewer than two participants, or predictions the search rejects).
  bool solve_plan(worker_id pushed, timestamp t, worker_id leaving) {
    const std::size_t n = participants_ - (leaving == detail::clock_table::none ? 0 : 1);
    if (n < 2) return false;
    const std::size_t r = lookahead_;
    row_worker_.clear();
    for (worker_id q = 0; q < w_.size(); ++q) {
      const worker& w = w_[q];
      if (q == leaving || !is_active(q) || !w.participating) continue;
      // The latest pushes in time order, oldest first, then the push being decided: the m
      // recorded ones end just before ring_pos.
      const bool pending = q == pushed;
      const std::size_t recorded = w.since_barrier < history_ ? w.since_barrier : history_;
      const std::size_t have =
          recorded + (pending ? 1 : 0) < history_ ? recorded + (pending ? 1 : 0) : history_;
      const std::size_t m = have - (pending ? 1 : 0);
      const timestamp* const ring = ring_.data() + std::size_t{q} * history_;
      std::size_t k = (w.ring_pos + history_ - m) % history_;
      for (std::size_t i = 0; i < m; ++i) {
        history_buf_[i] = ring[k];
        k = k + 1 == history_ ? 0 : k + 1;
      }
      if (pending) history_buf_[have - 1] = t;
      try {
        predictor_.predict(span<const timestamp>(history_buf_.data(), have), r,
                           rows_.data() + row_worker_.size() * r);
      } catch (const time_error&) {  // a prediction beyond what a double holds
        return false;
      }
      row_worker_.push_back(q);
    }
    for (std::size_t i = 0; i < n * r; ++i)
      if (!std::isfinite(rows_[i])) return false;
    const auto rows = rows_view<timestamp>::matrix(rows_.data(), n, r);
    try {
      zipline_solve(variant_, rows, ws_, result_);
    } catch (const zipline_input_error&) {
      return false;
    }
    return true;
  }

  // Puts the plan solve_plan left in the scratch buffers in force.
  void commit_plan(timestamp now) noexcept {
    planned_ = true;
    arrived_ = 0;
    plan_.barrier = result_.barrier;
    plan_.spread = result_.spread;
    plan_.planned_at = now;
    for (std::size_t i = 0; i < row_worker_.size(); ++i)
      w_[row_worker_[i]].remaining = static_cast<std::int32_t>(result_.choice[i]) + 1;
  }

  void fallback() noexcept {
    ++fallbacks_;
    end_superstep();
    start_monitoring();
  }

  // Everyone waiting is released; `last` (the final arrival, if any) proceeds directly.
  void complete_barrier(worker_id last) noexcept {
    for (worker_id q = 0; q < w_.size(); ++q)
      if (q != last && is_active(q) && state_[q] == waiting) release(q);
    ++barriers_;
    end_superstep();
    start_monitoring();
  }

  std::size_t lookahead_, history_;
  P predictor_;
  zipline_variant variant_;
  std::vector<worker, detail::aligned_allocator<worker>> w_;
  // Worker p's push ring at [p * history_, (p + 1) * history_).
  std::vector<timestamp, detail::aligned_allocator<timestamp>> ring_;
  std::size_t participants_ = 0, ready_ = 0, arrived_ = 0;
  bool planned_ = false;
  elastic_plan plan_;
  std::size_t barriers_ = 0, fallbacks_ = 0, max_superstep_ = 0;
  std::vector<std::size_t> last_superstep_;
  // Planning scratch, sized for every worker id at construction and add_worker and reused
  // every superstep; its contents between plans mean nothing.
  std::vector<timestamp> rows_, history_buf_;
  std::vector<worker_id> row_worker_;
  zipline_workspace<timestamp> ws_;
  zipline_result<timestamp> result_;
};

/// ElasticBSP with a predictor chosen at run time (the form make_controller builds).
using elastic_bsp = basic_elastic_bsp<any_predictor<timestamp>>;

/// @}
}  // namespace cadence
