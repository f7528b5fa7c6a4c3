// What a simulated run measures, per run and per worker: throughput, waiting, staleness,
// barriers, ElasticBSP's superstep sizes and the wall-clock cost of the controller.
#pragma once

#include <cadence/core/types.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace cadence::sim {

/// Per-worker totals. Times are simulated seconds.
struct worker_metrics {
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
  /// Largest c_p - c_min right after one of its pushes (see run_metrics::max_staleness).
  clock_value max_staleness = 0;
  /// Set when the worker died during the run.
  bool failed = false;
};

/// Totals of one run of one policy on one scenario.
struct run_metrics {
  std::string policy;    ///< controller.config()
  std::string scenario;  ///< scenario name
  std::uint64_t seed = 0;
  std::size_t workers = 0;  ///< workers at the start
  std::size_t removed_workers = 0;

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

  /// Staleness at push: c_p - c_min just after worker p's push has been counted, over active
  /// workers, as the controller sees it (controller.staleness(p)). A worker may push at
  /// staleness bound + 1 (it started within the bound, then got one ahead) and then waits;
  /// so max_staleness <= s + 1 under ssp(s), <= s_U + 1 under dssp, 1 under bsp.
  clock_value max_staleness = 0;
  /// Staleness at start: c_p - c_min when a worker is allowed to start its next iteration
  /// (it proceeds, or is released). This is what the bounds promise: <= s under ssp(s),
  /// <= s_U under dssp(s_L, s_U), 0 under bsp.
  clock_value max_start_staleness = 0;
  /// histogram[k] = pushes at staleness k, up to max_staleness (when max_staleness reaches
  /// run_options::staleness_buckets, the last bucket also counts everything above it).
  std::vector<std::uint64_t> staleness_histogram;

  /// Barriers. For a policy that reports them (ElasticBSP's barriers(): completed barriers)
  /// that count; otherwise the release events below. Under BSP every global barrier is exactly
  /// one release event (the last arrival releases everyone), so the two agree; under SSP and
  /// DSSP they count the times a straggler's push (or a removal) let waiting workers go; ASP
  /// has none.
  std::uint64_t barriers = 0;
  /// True when `barriers` came from the policy itself rather than from release events.
  bool barriers_from_policy = false;
  /// Events (pushes or removals) that released at least one waiting worker.
  std::uint64_t release_events = 0;

  /// ElasticBSP only (0 otherwise): supersteps observed, and over every (superstep, worker)
  /// pair the pushes the worker made between the two barriers (its monitoring pushes plus the
  /// planned ones), as mean, min and max.
  std::uint64_t supersteps = 0;
  double superstep_iterations_mean = 0;
  std::uint64_t superstep_iterations_min = 0;
  std::uint64_t superstep_iterations_max = 0;

  /// Wall-clock time spent inside controller.push() (not deterministic), and per push.
  double controller_seconds = 0;
  double controller_ns_per_push = 0;

  std::vector<worker_metrics> per_worker;
};

/// The smallest k such that at least fraction q of the histogram's mass is at or below k.
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

}  // namespace cadence::sim
