/// \file
/// \ingroup sim
/// What a simulated run measures, per run and per worker: throughput, waiting, staleness (the
/// clock gap at start, and updates behind), barriers, superstep sizes, the controller's cost.
#pragma once

#include <cadence/core/types.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// Per-worker totals. Times are simulated seconds.
struct worker_metrics {
  /// The worker's group in the scenario (worker_model::label), for reports.
  std::string label;
  /// Pushes the worker made (completed iterations).
  std::uint64_t iterations = 0;
  /// Seconds the worker was alive during the run (until the end, or until it died).
  double alive_seconds = 0;
  /// Compute seconds of its completed iterations.
  double compute_seconds = 0;
  /// Seconds spent idle between a push that did not proceed and its release.
  double wait_seconds = 0;
  /// Number of pushes after which it had to wait.
  std::uint64_t waits = 0;
  /// Largest clock gap at which it started an iteration (see run_metrics::max_start_staleness).
  clock_value max_start_staleness = 0;
  /// Most updates behind of one of its pushes (see run_metrics::updates_behind_histogram).
  std::uint64_t max_updates_behind = 0;
  /// Set when the worker died during the run.
  bool failed = false;
};

/// Totals of one run of one policy on one scenario.
struct run_metrics {
  std::string policy;    ///< controller.config()
  std::string scenario;  ///< scenario name
  std::uint64_t seed = 0;    ///< the scenario's seed, so the run can be repeated
  std::size_t workers = 0;  ///< workers at the start
  std::size_t removed_workers = 0;  ///< workers that died and were removed during the run

  /// The run's length: the horizon for time-limited runs, else the time of the last push.
  double simulated_seconds = 0;
  /// Pushes by all workers (iterations of the cluster).
  std::uint64_t iterations = 0;
  /// iterations / simulated_seconds.
  double iterations_per_second = 0;

  /// Total seconds workers spent waiting for a release.
  double wait_seconds = 0;
  /// wait_seconds / the workers' total alive time: the share of GPU time lost to waiting.
  double wait_fraction = 0;
  /// wait_seconds / iterations: average idle time per iteration.
  double mean_wait_per_iteration = 0;

  /// Staleness as the policies bound it: the clock gap c_p - c_min (over active workers, as the
  /// controller sees it) when the server lets worker p start an iteration, at t = 0 or when it
  /// proceeds or is released. 0 under bsp, <= s under ssp(s), <= s_U under dssp(s_L, s_U);
  /// unbounded under asp and elastic (there it grows with the speed gap, by design). The gap
  /// right after a push is not reported: a worker may push one clock past the bound and then
  /// wait, which says nothing about the weights anyone computes on.
  clock_value max_start_staleness = 0;
  /// histogram[k] = iteration starts at clock gap k, up to max_start_staleness (the last bucket
  /// also counts everything above run_options::histogram_buckets - 1).
  std::vector<std::uint64_t> start_staleness_histogram;

  /// Staleness of the weights a gradient was computed on, for every policy: the number of
  /// other pushes the server applied between the worker's pull (its go-ahead) and the arrival
  /// of its push. Under bsp a round's pushes arrive one by one on the same weights, so up to
  /// n - 1; under asp about n - 1 on average and more behind a straggler.
  /// histogram[k] = pushes k updates behind (bucketed like start_staleness_histogram).
  std::vector<std::uint64_t> updates_behind_histogram;
  std::uint64_t max_updates_behind = 0;  ///< the largest k with a push k updates behind
  double mean_updates_behind = 0;        ///< updates behind, averaged over every push

  /// Barriers the policy completed during the run, for policies that count their own
  /// (ElasticBSP, through cadence::supersteps); empty for the others, whose waits end in
  /// release events rather than barriers.
  std::optional<std::uint64_t> barriers;
  /// Events (pushes or removals) that released at least one waiting worker, for every policy.
  /// Under bsp every global barrier is one release event (the last arrival releases everyone).
  std::uint64_t release_events = 0;

  ///@{
  /// Superstep policies only (0 otherwise), over every (completed superstep, live worker) pair:
  /// the pushes the worker made between the two barriers, as mean, min and max; the most of
  /// them it made while the superstep was monitoring; and the most it made after the barrier
  /// was planned. ElasticBSP bounds the last by its lookahead R, so a superstep's iterations
  /// are at most its monitoring pushes plus R.
  double superstep_iterations_mean = 0;
  std::uint64_t superstep_iterations_min = 0;
  std::uint64_t superstep_iterations_max = 0;
  std::uint64_t superstep_monitoring_max = 0;
  std::uint64_t superstep_planned_max = 0;
  ///@}

  ///@{
  /// Wall-clock time spent inside controller.push() (not deterministic), and per push.
  double controller_seconds = 0;
  double controller_ns_per_push = 0;
  ///@}
  ///@{
  /// Wall-clock time of the whole simulation (not deterministic) and simulated push events
  /// handled per wall-clock second: the simulator's own speed.
  double wall_seconds = 0;
  double events_per_second = 0;
  ///@}

  /// per_worker[p]: worker p's totals.
  std::vector<worker_metrics> per_worker;
};

/// The smallest k such that at least fraction q of histogram h's mass is at or below k.
inline std::size_t histogram_quantile(const std::vector<std::uint64_t>& h, double q) {
  std::uint64_t total = 0;
  for (auto v : h) total += v;
  if (total == 0) return 0;
  const double want = q * static_cast<double>(total);
  std::uint64_t seen = 0;
  for (std::size_t k = 0; k < h.size(); ++k) {
    seen += h[k];
    if (static_cast<double>(seen) >= want && seen > 0) return k;
  }
  return h.size() - 1;
}

/// @}
}  // namespace cadence::sim
