/// \file
/// \ingroup sim
/// A deterministic discrete-event simulator of a parameter-server cluster that drives a real
/// synchronization controller through its public interface and measures what the policy costs.
#pragma once

#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/controller.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/sim/event_queue.hpp>
#include <cadence/sim/metrics.hpp>
#include <cadence/sim/random.hpp>
#include <cadence/sim/scenario.hpp>
#include <cadence/sim/worker_model.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// Knobs of a run that do not change its simulated outcome.
struct run_options {
  /// Measure the wall-clock time of every controller.push() (two steady_clock reads a push).
  bool time_controller = true;
  /// Most buckets each histogram (clock gap at start, updates behind) grows to; the last one
  /// also counts larger values.
  std::size_t histogram_buckets = std::size_t{1} << 20;
  /// Called about every 65536 events with the fraction of the run done, in [0, 1].
  std::function<void(double)> progress;
  /// Observers that let a caller attach real work to the simulated cluster (the training race
  /// in apps/race/race.hpp computes and applies real gradients through them). Empty by
  /// default; they never change the simulated outcome, and an empty one costs one test.
  ///
  /// on_iteration_start(p, t): worker p starts computing an iteration at simulated time t
  /// (t = 0 for the first; otherwise its go-ahead time plus its pull cost). It is called while
  /// the server handles p's go-ahead, before any later push, so server state read here is
  /// exactly what p pulled.
  std::function<void(worker_id, double)> on_iteration_start;
  /// on_push(p, t): p's push reaches the server at time t; called just before
  /// controller.push(p, t), so an update applied here is visible to every worker the push
  /// releases. Not called for a push that a dead worker never completed.
  std::function<void(worker_id, double)> on_push;
};

namespace detail {

/// Counts value v in histogram h, growing h by doubling up to `buckets` (the last bucket
/// also counts everything larger), so a run with small values keeps a small histogram.
inline void count_in(std::vector<std::uint64_t>& h, std::uint64_t v, std::size_t buckets) {
  const auto bucket = static_cast<std::size_t>(std::min<std::uint64_t>(v, buckets - 1));
  if (bucket >= h.size()) h.resize(std::min(buckets, 2 * bucket + 1), 0);
  ++h[bucket];
}

/// Drops the empty buckets that count_in's doubling left at the end.
inline void trim(std::vector<std::uint64_t>& h) {
  while (h.size() > 1 && h.back() == 0) h.pop_back();
}

enum class phase : unsigned char { working, waiting, dead };

}  // namespace detail

/// Runs scenario s against controller c, which must be freshly built for s.workers.size()
/// workers (ids 0..n-1, no push yet). Each worker computes, pushes (its push cost later, its
/// own link's or the scenario's, the server calls c.push(p, arrival_time)), and either
/// proceeds (pulls, then computes again) or idles until a later push or removal releases it.
/// A worker that dies stops; after the failure-detection delay the server calls
/// c.remove_worker(p) and resumes whoever it releases. Everything in the result except the controller's wall-clock time is a pure
/// function of (s, policy). Throws invalid_parameter_error for a bad scenario or a controller
/// of the wrong size, deadlock_error if the run stops with workers waiting and nothing left to
/// release them, and whatever the controller throws. `opt`: what to measure and report.
template <class Controller,
          std::enable_if_t<!std::is_convertible_v<Controller&, std::string_view>, int> = 0>
run_metrics simulate(Controller& c, const scenario& s, const run_options& opt = {});

/// The cost of one iteration of one worker: compute, then push (compute end to the push's
/// arrival), then, once released, pull (go-ahead to the next compute's start).
struct iteration_costs {
  double compute = 0;  ///< seconds computing
  double push = 0;     ///< seconds from the end of compute to the push's arrival
  double pull = 0;     ///< seconds from the go-ahead to the next compute's start
};

/// Where the simulated workers' iteration costs come from: each worker's worker_model drawn
/// by its iteration_sampler, with its push and pull cost (its own link's, else the
/// scenario's: push_seconds_of, pull_seconds_of); what simulate uses.
/// A source (for simulate_with) is anything with `bool next(worker_id p, double now, iteration_costs& out)`:
/// the costs of p's iteration that starts computing at `now`, or false when p has none left
/// (a recorded trace that ran out), which ends the run at `now`.
class model_source {
public:
  /// Workers as scenario s models them, each seeded from s.seed; s must outlive the source.
  explicit model_source(const scenario& s) : s_(&s) {
    sampler_.reserve(s.workers.size());
    for (std::size_t p = 0; p < s.workers.size(); ++p) sampler_.emplace_back(s.workers[p], mix_seed(s.seed, p));
  }
  /// Writes the costs of p's iteration that starts computing at now into out; always true (a
  /// model never runs out).
  bool next(worker_id p, double now, iteration_costs& out) {
    out.compute = sampler_[p].next(now);
    out.push = push_seconds_of(*s_, p);
    out.pull = pull_seconds_of(*s_, p);
    return true;
  }

private:
  const scenario* s_;
  std::vector<iteration_sampler> sampler_;
};

/// simulate(c, s, opt) with the iteration costs taken from `source` (model_source,
/// sim::trace_source or a caller's own) instead of the scenario's worker models; the scenario
/// still gives the workers' count, labels and failures, the failure-detection delay and the
/// run length. A source that runs out ends the run when that worker would start its next
/// iteration (or at the scenario's length, if that comes first).
template <class Controller, class Source>
run_metrics simulate_with(Controller& c, const scenario& s, Source& source, const run_options& opt = {}) {
  CADENCE_REQUIRE_CONTROLLER(Controller);
  validate(s);
  const std::size_t n = s.workers.size();
  if (c.worker_capacity() != n || c.active_workers() != n)
    throw invalid_parameter_error("cadence::sim: scenario '" + s.name + "' has " + std::to_string(n) +
                                  " workers but the controller '" + std::string(c.config()) +
                                  "' was built for " + std::to_string(c.worker_capacity()) +
                                  " (active " + std::to_string(c.active_workers()) + ")");
  if (opt.histogram_buckets == 0)
    throw invalid_parameter_error("cadence::sim: run_options.histogram_buckets must be >= 1");

  run_metrics m;
  m.policy = c.config();
  m.scenario = s.name;
  m.seed = s.seed;
  m.workers = n;
  m.per_worker.resize(n);
  for (std::size_t p = 0; p < n; ++p) m.per_worker[p].label = s.workers[p].label;

  std::vector<detail::phase> state(n, detail::phase::working);
  // Pull cost after each worker's current push (its iteration's costs say it).
  std::vector<double> pull_after(n, 0.0);
  // The time at which a worker found its source exhausted: the run ends there.
  double exhausted_at = HUGE_VAL;
  std::vector<double> wait_since(n, 0.0), computing(n, 0.0);
  // m.iterations (pushes applied so far) when each worker last pulled the weights.
  std::vector<std::uint64_t> pulled(n, 0);
  std::uint64_t behind_sum = 0;

  const bool timed = s.seconds > 0;
  const double horizon = timed ? s.seconds : HUGE_VAL;
  const std::uint64_t target = timed ? UINT64_MAX : s.iterations * n;

  event_queue queue;
  queue.reserve(n + 2 * n);
  // A worker starts an iteration at `t`: draw its compute time and schedule the push. What it
  // computes on is the server's state now, at its go-ahead (the pull takes pull_seconds but
  // carries the weights as they were when it was sent).
  auto start_iteration = [&](worker_id p, double t) {
    iteration_costs k;
    if (!source.next(p, t, k)) {
      exhausted_at = std::min(exhausted_at, t);
      return;
    }
    computing[p] = k.compute;
    pull_after[p] = k.pull;
    pulled[p] = m.iterations;
    if (opt.on_iteration_start) opt.on_iteration_start(p, t);
    queue.push(t + k.compute + k.push, p, event_kind::push_arrives);
  };
  // The server lets p start an iteration at time t: record the clock gap the policies bound.
  auto let_go = [&](worker_id p, double t, double pull) {
    const clock_value gap = c.staleness(p);
    worker_metrics& w = m.per_worker[p];
    if (gap > w.max_start_staleness) w.max_start_staleness = gap;
    detail::count_in(m.start_staleness_histogram, static_cast<std::uint64_t>(gap), opt.histogram_buckets);
    start_iteration(p, t + pull);
  };
  auto resume = [&](span<const worker_id> released, double t) {
    if (!released.empty()) ++m.release_events;
    for (const worker_id q : released) {
      if (state[q] != detail::phase::waiting) continue;  // died while waiting: stays idle
      m.per_worker[q].wait_seconds += t - wait_since[q];
      state[q] = detail::phase::working;
      let_go(q, t, pull_after[q]);
    }
  };

  // Superstep policies (ElasticBSP behind any type or wrapper): the status after each event
  // tells whether the next push is a monitoring one and whether a barrier just completed.
  std::optional<superstep_status> steps = supersteps(c);
  const std::size_t barriers_at_start = steps ? steps->barriers : 0;
  std::vector<std::uint64_t> step_pushes(steps ? n : 0, 0), step_monitoring(steps ? n : 0, 0);
  std::uint64_t superstep_sum = 0, superstep_pairs = 0;
  m.superstep_iterations_min = UINT64_MAX;
  // Closes a superstep when the event just handled completed a barrier: one sample per live
  // worker (a removed one is not in the barrier; a dead one is about to be removed).
  auto after_event = [&]() {
    if (!steps) return;
    const std::size_t before = steps->barriers;
    steps = supersteps(c);
    if (steps->barriers == before) return;
    for (worker_id p = 0; p < n; ++p) {
      if (state[p] == detail::phase::dead) continue;
      const std::uint64_t k = step_pushes[p];
      superstep_sum += k;
      ++superstep_pairs;
      m.superstep_iterations_min = std::min(m.superstep_iterations_min, k);
      m.superstep_iterations_max = std::max(m.superstep_iterations_max, k);
      m.superstep_monitoring_max = std::max(m.superstep_monitoring_max, step_monitoring[p]);
      m.superstep_planned_max = std::max(m.superstep_planned_max, k - step_monitoring[p]);
    }
    std::fill(step_pushes.begin(), step_pushes.end(), 0);
    std::fill(step_monitoring.begin(), step_monitoring.end(), 0);
  };

  for (worker_id p = 0; p < n; ++p) let_go(p, 0.0, 0.0);
  for (worker_id p = 0; p < n; ++p) {
    const double f = s.workers[p].fails_at;
    if (std::isinf(f)) continue;
    queue.push(f, p, event_kind::worker_dies);
    queue.push(f + s.failure_detection_seconds, p, event_kind::worker_removed);
  }

  using wall = std::chrono::steady_clock;
  wall::duration in_controller{};
  const wall::time_point run_start = wall::now();
  double end = timed ? horizon : 0.0;
  std::uint64_t events = 0;
  const double progress_scale = timed ? 1.0 / horizon : 1.0 / static_cast<double>(target);
  bool finished = false;

  while (!queue.empty()) {
    if (queue.top().time > exhausted_at) {  // a worker ran out of iterations: the run ends there
      end = std::min(exhausted_at, horizon);
      finished = true;
      break;
    }
    if (queue.top().time > horizon) {
      finished = true;
      break;
    }
    const event e = queue.pop();
    const worker_id p = e.worker;
    const double t = e.time;
    if (opt.progress && (++events & 0xFFFF) == 0)
      opt.progress(timed ? t * progress_scale : static_cast<double>(m.iterations) * progress_scale);

    switch (e.kind) {
      case event_kind::push_arrives: {
        if (state[p] == detail::phase::dead) break;  // it died before this push arrived
        if (opt.on_push) opt.on_push(p, t);
        decision d;
        if (opt.time_controller) {
          const auto before = wall::now();
          d = c.push(p, t);
          in_controller += wall::now() - before;
        } else {
          d = c.push(p, t);
        }
        worker_metrics& w = m.per_worker[p];
        const std::uint64_t behind = m.iterations - pulled[p];
        behind_sum += behind;
        if (behind > w.max_updates_behind) w.max_updates_behind = behind;
        detail::count_in(m.updates_behind_histogram, behind, opt.histogram_buckets);
        ++m.iterations;
        ++w.iterations;
        w.compute_seconds += computing[p];
        if (steps) {
          ++step_pushes[p];
          if (steps->monitoring) ++step_monitoring[p];
        }
        // Release the others before p goes on: `d.released` is valid until the next call.
        resume(d.released, t);
        if (d.proceed) {
          let_go(p, t, pull_after[p]);
        } else {
          state[p] = detail::phase::waiting;
          wait_since[p] = t;
          ++w.waits;
        }
        after_event();
        if (m.iterations >= target) {
          end = t;
          finished = true;
        }
        break;
      }
      case event_kind::worker_dies: {
        if (state[p] == detail::phase::waiting) m.per_worker[p].wait_seconds += t - wait_since[p];
        state[p] = detail::phase::dead;
        m.per_worker[p].failed = true;
        m.per_worker[p].alive_seconds = t;
        break;
      }
      case event_kind::worker_removed: {
        ++m.removed_workers;
        resume(c.remove_worker(p), t);
        after_event();
        break;
      }
    }
    if (finished) break;
  }
  if (!finished && exhausted_at < HUGE_VAL) {  // ran out when nothing else was left to do
    end = std::min(exhausted_at, horizon);
    finished = true;
  }
  if (!finished) {
    // No event left before the end: only possible if every live worker waits for good.
    std::string waiting;
    for (worker_id p = 0; p < n; ++p)
      if (state[p] == detail::phase::waiting) waiting += (waiting.empty() ? "" : ", ") + std::to_string(p);
    throw deadlock_error("cadence::sim: policy '" + m.policy + "' on scenario '" + s.name +
                         "' stopped after " + std::to_string(m.iterations) +
                         " pushes with nothing left to release the waiting workers (" + waiting + ")");
  }

  m.simulated_seconds = end;
  detail::trim(m.start_staleness_histogram);
  detail::trim(m.updates_behind_histogram);
  double alive_total = 0;
  for (worker_id p = 0; p < n; ++p) {
    worker_metrics& w = m.per_worker[p];
    if (state[p] == detail::phase::waiting) w.wait_seconds += end - wait_since[p];
    if (!w.failed) w.alive_seconds = end;
    alive_total += w.alive_seconds;
    m.wait_seconds += w.wait_seconds;
    m.max_start_staleness = std::max(m.max_start_staleness, w.max_start_staleness);
    m.max_updates_behind = std::max(m.max_updates_behind, w.max_updates_behind);
  }
  m.iterations_per_second = end > 0 ? static_cast<double>(m.iterations) / end : 0.0;
  m.wait_fraction = alive_total > 0 ? m.wait_seconds / alive_total : 0.0;
  m.mean_wait_per_iteration = m.iterations > 0 ? m.wait_seconds / static_cast<double>(m.iterations) : 0.0;
  m.mean_updates_behind =
      m.iterations > 0 ? static_cast<double>(behind_sum) / static_cast<double>(m.iterations) : 0.0;
  if (steps) m.barriers = steps->barriers - barriers_at_start;
  if (superstep_pairs > 0) {
    m.superstep_iterations_mean = static_cast<double>(superstep_sum) / static_cast<double>(superstep_pairs);
  } else {
    m.superstep_iterations_min = 0;
  }
  m.controller_seconds = std::chrono::duration<double>(in_controller).count();
  m.controller_ns_per_push =
      m.iterations > 0 ? m.controller_seconds * 1e9 / static_cast<double>(m.iterations) : 0.0;
  m.wall_seconds = std::chrono::duration<double>(wall::now() - run_start).count();
  m.events_per_second = m.wall_seconds > 0 ? static_cast<double>(m.iterations) / m.wall_seconds : 0.0;
  if (opt.progress) opt.progress(1.0);
  return m;
}

template <class Controller,
          std::enable_if_t<!std::is_convertible_v<Controller&, std::string_view>, int>>
run_metrics simulate(Controller& c, const scenario& s, const run_options& opt) {
  model_source source(s);
  return simulate_with(c, s, source, opt);
}

/// Builds the policy from its config string (see make_controller) and runs scenario s as
/// simulate(c, s, opt) does.
inline run_metrics simulate(std::string_view policy, const scenario& s, const run_options& opt = {}) {
  validate(s);
  any_controller c = make_controller(policy, s.workers.size());
  return simulate(c, s, opt);
}

/// @}
}  // namespace cadence::sim
