// What the round-based simulators (simulate_collective, simulate_local_sgd) share: a run's
// identity and samplers, the step-time history their planners read, and rates over the run.
#pragma once

#include <cadence/sim/random.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenario.hpp>
#include <cadence/sim/worker_model.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cadence::sim::detail {

/// Names the run in m (scenario, seed, workers) and returns one sampler per worker of s, each
/// seeded from s.seed and the worker's index, so the same scenario repeats the same run.
template <class Metrics>
std::vector<iteration_sampler> start_run(const scenario& s, Metrics& m) {
  m.scenario = s.name;
  m.seed = s.seed;
  m.workers = s.workers.size();
  std::vector<iteration_sampler> sampler;
  sampler.reserve(s.workers.size());
  for (std::size_t p = 0; p < s.workers.size(); ++p) sampler.emplace_back(s.workers[p], mix_seed(s.seed, p));
  return sampler;
}

/// Each worker's last `history` step times in rounded-up integer microseconds (at least 1), the
/// records an elastic_planner or outer_schedule plans from, as a real rank would send them.
class step_history {
public:
  step_history(std::size_t workers, std::size_t history)
      : history_(history), ring_(workers, std::vector<std::int64_t>(history, 0)), recorded_(workers, 0) {}

  /// Worker p took `seconds` for one step; the oldest of its times drops out when full.
  void record(std::size_t p, double seconds) {
    ring_[p][recorded_[p] % history_] = static_cast<std::int64_t>(std::clamp(std::ceil(seconds * 1e6), 1.0, 1e12));
    ++recorded_[p];
  }

  /// Writes how many times p holds at *have and those times, oldest first, from head on.
  void write(std::size_t p, std::int64_t* have, std::int64_t* head) const {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(recorded_[p], history_));
    *have = static_cast<std::int64_t>(n);
    for (std::size_t i = 0; i < n; ++i) head[i] = ring_[p][(recorded_[p] - n + i) % history_];
  }

private:
  std::size_t history_;
  std::vector<std::vector<std::int64_t>> ring_;
  std::vector<std::uint64_t> recorded_;
};

/// amount / seconds, 0 for a run of no time.
inline double per_second(double amount, double seconds) { return seconds > 0 ? amount / seconds : 0; }

/// A round-based run's row as its reports start it: its name (mode or config) in a column of
/// its own, then scenario, seed, workers, simulated_seconds, steps and steps_per_second.
template <class Metrics>
row run_row(const char* column, const std::string& name, const Metrics& r) {
  row v;
  v.add(column, name).add("scenario", r.scenario).add("seed", r.seed).add("workers", r.workers);
  v.add("simulated_seconds", r.simulated_seconds).add("steps", r.steps).add("steps_per_second", r.steps_per_second);
  return v;
}

}  // namespace cadence::sim::detail
