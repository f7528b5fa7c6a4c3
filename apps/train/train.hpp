// cadence-train's pieces that need no MPI: the per-worker speed profiles (the simulator's
// scenarios at any worker count), the measurements of one policy's real run (report.hpp prints
// them), and the arithmetic that turns raw timings into wait fractions and percentiles.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/sim/scenario.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/worker_model.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cadence::train {

/// One speed profile: a name and what it models.
struct profile_info {
  std::string name;
  std::string description;
};

inline constexpr std::string_view default_profile_name = "hetero16";

/// Every profile cadence-train knows, in the order --help lists them.
inline std::vector<profile_info> profile_catalog() {
  return {
      {"homogeneous", "identical workers, 0.10 s/iteration, 5% normal jitter (the simulator's homogeneous)"},
      {"hetero2", "the simulator's hetero2 at n workers: half at 0.10 s (1080 Ti), half at 0.17 s (1060), 3% log-normal jitter"},
      {"hetero16", "the simulator's hetero16 at n workers: half at 0.10 s, half at 0.17 s, 5% log-normal jitter "
                   "(two fast and two slow at about 2:1 with 4 workers; the default)"},
      {"straggler3x", "0.10 s workers, 5% log-normal jitter, the last one 3x slower (0.30 s)"},
      {"jitter", "0.10 s workers with heavy 40% log-normal jitter and transient 3x straggler episodes "
                 "(1% chance per iteration, mean 1 s)"},
      {"slowdown", "0.10 s workers, 5% normal jitter; the last one slows down as the run goes on until it is "
                   "3x slower at the end (the simulator's drift, as in drift8)"},
  };
}

/// The named profile as a simulator scenario for `workers` workers and a run of `seconds`
/// (push and pull cost 0: cadence-train measures them and fills them in for the simulator).
/// Throws invalid_parameter_error listing the known profiles for an unknown name.
inline sim::scenario make_profile(std::string_view name, std::size_t workers, double seconds, std::uint64_t seed) {
  const auto catalog = profile_catalog();
  const profile_info* info = nullptr;
  for (const auto& c : catalog)
    if (c.name == name) info = &c;
  if (info == nullptr) {
    std::string known;
    for (const auto& c : catalog) known += (known.empty() ? "" : ", ") + c.name;
    throw invalid_parameter_error("cadence::train: unknown profile '" + std::string(name) + "'; known profiles: " + known);
  }
  if (workers == 0) throw invalid_parameter_error("cadence::train: profile '" + std::string(name) + "' needs >= 1 worker");
  if (!(seconds > 0) || !std::isfinite(seconds))
    throw invalid_parameter_error("cadence::train: profile run length must be > 0 s");
  sim::scenario s;
  if (name == "homogeneous" || name == "hetero2" || name == "hetero16") {
    s = sim::make_scenario(name, workers, seed);  // the simulator's own, at this size
  } else {
    s = sim::make_scenario("homogeneous", workers, seed);
    for (auto& w : s.workers) {
      w.jitter = sim::jitter_kind::lognormal;
      w.jitter_cv = 0.05;
    }
    if (name == "straggler3x") {
      s.workers.back().iteration_seconds = 0.30;
      s.workers.back().label = "straggler";
    } else if (name == "jitter") {
      for (auto& w : s.workers) {
        w.jitter_cv = 0.40;
        w.straggle_probability = 0.01;
        w.straggle_factor = 3.0;
        w.straggle_seconds = 1.0;
      }
    } else {  // slowdown
      for (auto& w : s.workers) {
        w.jitter = sim::jitter_kind::normal;
        w.jitter_cv = 0.05;
      }
      s.workers.back().drift_per_second = std::min(1.0, std::log(3.0) / seconds);
      s.workers.back().label = "slowing";
    }
  }
  s.name = std::string(name);
  s.description = info->description;
  s.push_seconds = 0;
  s.pull_seconds = 0;
  s.seconds = seconds;
  s.iterations = 0;
  s.seed = seed;
  return s;
}

/// The value at quantile q in [0, 1] of v (nearest rank on a sorted copy); 0 for an empty v.
template <class T>
T percentile(std::vector<T> v, double q) {
  if (v.empty()) return T{};
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(q * static_cast<double>(v.size()));
  const auto i = static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size()))) - 1;
  return v[i];
}

/// One push_pull as a worker saw it: when it started (seconds since the worker's start) and
/// how long it blocked.
struct exchange_timing {
  double start = 0;
  double seconds = 0;
};

/// One cost for every worker's exchange when nothing tells the wait from the transfer (the
/// collective modes' merges): the 5th percentile of every exchange of the run. Some exchanges
/// never wait under every policy (the last arrival at each merge), so the low tail is the
/// transfer.
inline double transfer_seconds(const std::vector<std::vector<exchange_timing>>& per_worker) {
  std::vector<double> all;
  for (const auto& w : per_worker)
    for (const auto& t : w) all.push_back(t.seconds);
  return percentile(all, 0.05);
}

/// Each worker's own transfer cost in the parameter-server modes, in seconds per push_pull:
/// what its push_pulls blocked beyond the time server 0 kept its pushes parked (the policy's
/// wait, ps_stats::parked_seconds), over its push_pulls: (sum of blocked - parked) / count, at
/// least 0. That is moving the bytes both ways and queueing at the server, which a slow link
/// stretches for its own worker alone. parked[p] is worker p's parked time (0 when missing).
/// A worker with no push_pulls (gone before it sent its timings) measured nothing: NaN.
inline std::vector<double> worker_transfer_seconds(const std::vector<std::vector<exchange_timing>>& per_worker,
                                                   const std::vector<double>& parked) {
  std::vector<double> out(per_worker.size(), std::nan(""));
  for (std::size_t p = 0; p < per_worker.size(); ++p) {
    if (per_worker[p].empty()) continue;
    double blocked = 0;
    for (const auto& t : per_worker[p]) blocked += t.seconds;
    const double waited = p < parked.size() ? parked[p] : 0.0;
    out[p] = std::max(0.0, blocked - waited) / static_cast<double>(per_worker[p].size());
  }
  return out;
}

/// The median of the costs that were measured (not NaN); 0 when none was. The one transfer
/// cost cadence-train reports for a parameter-server policy.
inline double median_transfer_seconds(const std::vector<double>& measured) {
  std::vector<double> known;
  for (const double c : measured)
    if (!std::isnan(c)) known.push_back(c);
  return percentile(known, 0.5);
}

/// Every worker's cost for the simulator and the trace: `measured`, each NaN (a worker that
/// measured nothing) replaced by the median of the others (median_transfer_seconds).
inline std::vector<double> filled_transfer_seconds(std::vector<double> measured) {
  const double median = median_transfer_seconds(measured);
  for (double& c : measured)
    if (std::isnan(c)) c = median;
  return measured;
}

/// Share of the workers' time in [0, seconds) spent blocked in push_pull beyond each worker's
/// own transfer cost (transfer[p]): sum over push_pulls started before `seconds` of
/// max(0, blocked - transfer[p]), cut at the end of the run, over workers x seconds. With the
/// costs of worker_transfer_seconds, a worker's waits add up (before the cut and the max) to
/// the time server 0 parked its pushes: what the policy cost it. The simulator's wait_fraction
/// means the same: idle between a push's arrival and the worker's release, over the workers'
/// time. A worker without a cost (NaN, or none given) counts its whole blocked time.
inline double wait_fraction(const std::vector<std::vector<exchange_timing>>& per_worker,
                            const std::vector<double>& transfer, double seconds) {
  if (per_worker.empty() || !(seconds > 0)) return 0;
  double wait = 0;
  for (std::size_t p = 0; p < per_worker.size(); ++p) {
    const double cost = p < transfer.size() && !std::isnan(transfer[p]) ? transfer[p] : 0.0;
    for (const auto& t : per_worker[p]) {
      if (t.start >= seconds) continue;
      const double waited = std::max(0.0, t.seconds - cost);
      wait += std::min(waited, seconds - t.start);
    }
  }
  return wait / (static_cast<double>(per_worker.size()) * seconds);
}

/// wait_fraction with one transfer cost for every worker (the collective modes' merge cost).
inline double wait_fraction(const std::vector<std::vector<exchange_timing>>& per_worker, double transfer,
                            double seconds) {
  return wait_fraction(per_worker, std::vector<double>(per_worker.size(), transfer), seconds);
}

/// One accuracy measurement of the server's weights.
struct accuracy_point {
  double seconds = 0;
  double accuracy = 0;
};

/// First time the curve reached `target`, or NaN (JSON null) when it never did.
inline double time_to(const std::vector<accuracy_point>& curve, double target) {
  for (const auto& p : curve)
    if (p.accuracy >= target) return p.seconds;
  return std::nan("");
}

/// What one policy did on the real processes, and what the simulator predicts for it.
struct policy_report {
  std::string policy;
  std::string transport = "mpi-ps";
  std::size_t workers = 0;
  double seconds = 0;
  std::uint64_t iterations = 0;  ///< pushes the server applied within [0, seconds)
  double iterations_per_second = 0;
  double wait_fraction = 0;
  std::int64_t max_staleness = 0;   ///< clock gap at iteration start, largest
  std::int64_t p99_staleness = 0;   ///< and its 99th percentile
  double final_accuracy = 0;        ///< the final weights on the whole test set
  double best_accuracy = 0;         ///< best point of the curve
  double time_to_70 = std::nan("");  ///< NaN: never reached
  double time_to_80 = std::nan("");
  std::vector<int> evicted;          ///< worker ids
  /// Measured push + pull per exchange: parameter-server modes the median of
  /// worker_transfer_seconds, collective modes the merge's (the 5th percentile).
  double transfer_seconds = 0;
  /// Per worker (rank - 1): its own push + pull cost, fed to the simulator as its link
  /// (parameter-server modes: worker_transfer_seconds, NaN for a worker that measured nothing,
  /// which the simulator gives the others' median; collective modes: the merge cost for all).
  std::vector<double> worker_transfer_seconds;
  /// Server 0's ps_stats::parked_seconds, by worker id (parameter-server modes, rank 0 only).
  std::vector<double> parked_seconds;
  double overrun_fraction = 0;       ///< iterations whose real compute outlasted the profile
  double simulated_iterations_per_second = 0;
  double simulated_wait_fraction = 0;
  std::vector<accuracy_point> curve;  ///< on the evaluation subset of the test set
};

/// |simulated - measured| / measured; NaN when measured is 0.
inline double relative_error(double simulated, double measured) {
  return measured != 0 ? std::fabs(simulated - measured) / std::fabs(measured) : std::nan("");
}

}  // namespace cadence::train
