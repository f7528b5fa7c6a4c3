/// \file
/// \ingroup sim
/// A simulated all-reduce cluster for the collective adapters: BSP, periodic averaging and
/// ElasticBSP over collectives (the elastic_planner the averager runs) on a scenario's step times.
#pragma once

#include <cadence/controllers/elastic_planner.hpp>
#include <cadence/core/error.hpp>
#include <cadence/sim/detail/run.hpp>
#include <cadence/sim/random.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenario.hpp>
#include <cadence/sim/worker_model.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// Totals of one collective mode on one scenario. Times are simulated seconds.
struct collective_metrics {
  std::string mode;      ///< "bsp", "periodic:<k>" or the elastic planner's canonical config
  std::string scenario;      ///< scenario name
  std::uint64_t seed = 0;    ///< the scenario's seed, so the run can be repeated
  std::size_t workers = 0;   ///< ranks
  double simulated_seconds = 0;  ///< from t = 0 to the end of the last merge counted
  std::uint64_t steps = 0;       ///< local steps of all ranks
  double steps_per_second = 0;   ///< steps / simulated_seconds
  ///@{
  /// Seconds ranks sat at a barrier waiting for the slowest, and its share of rank time.
  double wait_seconds = 0;
  double wait_fraction = 0;
  ///@}
  /// Share of rank time inside the merge all-reduces (barriers x allreduce_seconds).
  double allreduce_fraction = 0;
  std::uint64_t barriers = 0;  ///< merges (one all-reduce each)
  ///@{
  /// Mean local steps per rank between two barriers, and the most any rank ran.
  double steps_per_barrier = 0;
  std::int64_t max_local_steps = 0;
  ///@}
  /// ElasticBSP: barriers planned as BSP (warm-up and fallbacks).
  std::uint64_t bsp_barriers = 0;
};

namespace detail {

// The columns of write_collective_json and write_collective_csv, in order, with one run's values.
inline row collective_row(const collective_metrics& r) {
  row v = run_row("mode", r.mode, r);
  v.add("wait_seconds", r.wait_seconds).add("wait_fraction", r.wait_fraction);
  v.add("allreduce_fraction", r.allreduce_fraction).add("barriers", r.barriers);
  v.add("steps_per_barrier", r.steps_per_barrier).add("max_local_steps", r.max_local_steps);
  return v.add("bsp_barriers", r.bsp_barriers);
}

}  // namespace detail

/// How simulate_collective runs, beside the mode and the scenario.
struct collective_options {
  /// Seconds of one merge all-reduce; negative: the links' cost (link_allreduce_seconds).
  double allreduce_seconds = -1;
  /// Called now and then with the fraction done.
  std::function<void(double)> progress;
};

/// What one merge all-reduce costs on s's links when no allreduce_seconds is given: the slowest
/// push plus the slowest pull over the workers (each its own link's, else the scenario's). A
/// synchronous all-reduce finishes only when every rank's contribution is in and every rank
/// has the result, so one slow link paces every merge; with no link of its own anywhere this
/// is the scenario's push + pull cost.
inline double link_allreduce_seconds(const scenario& s) {
  double push = 0, pull = 0;
  for (std::size_t p = 0; p < s.workers.size(); ++p) {
    push = std::max(push, push_seconds_of(s, p));
    pull = std::max(pull, pull_seconds_of(s, p));
  }
  return push + pull;
}

namespace detail {

// "bsp" -> 1, "periodic:<k>" -> k, else 0 (elastic).
inline std::size_t fixed_period(std::string_view mode) {
  if (mode == "bsp") return 1;
  if (mode.substr(0, 9) == "periodic:") {
    const std::string_view k = mode.substr(9);
    std::size_t v = 0;
    const auto [ptr, ec] = std::from_chars(k.data(), k.data() + k.size(), v);
    if (k.empty() || ec != std::errc() || ptr != k.data() + k.size() || v < 1)
      throw parse_error("cadence::sim: bad period in collective mode '" + std::string(mode) +
                        "': expected periodic:<k> with k >= 1");
    return v;
  }
  if (mode.substr(0, 8) == "elastic:") return 0;
  throw parse_error("cadence::sim: unknown collective mode '" + std::string(mode) +
                    "'; expected bsp, periodic:<k> or elastic:<R>[:<predictor>][:<variant>]");
}

// What a collective mode runs for n ranks: every rank `period` local steps a round, or, for
// "elastic:...", period 0 and the planner that sets each round's steps.
struct collective_schedule {
  std::size_t period;
  std::unique_ptr<exchange::elastic_planner> planner;
};
inline collective_schedule parse_collective_mode(std::string_view mode, std::size_t n) {
  const std::size_t period = fixed_period(mode);
  if (period != 0) return {period, nullptr};
  return {0, std::make_unique<exchange::elastic_planner>(mode, n)};
}

}  // namespace detail

/// Simulates `mode` ("bsp", "periodic:<k>", "elastic:<R>[:...]") on an all-reduce cluster: all
/// ranks start a round together; rank p runs its local steps (1, k, or the plan's), each as long
/// as the scenario's model draws; the merge starts when the slowest rank arrives and takes
/// allreduce_seconds (default: link_allreduce_seconds, the slowest link's); the next round
/// starts after it. ElasticBSP plans with exchange::elastic_planner on the rounded-up integer
/// microseconds of each step, exactly what elastic_averager does on a real cluster. Worker failures are not modelled (collectives are
/// fail-stop: the adapters throw). Runs until the scenario's seconds or iterations per worker.
/// `opt` sets the all-reduce cost and a progress callback. Throws parse_error or
/// invalid_parameter_error for a bad mode or scenario.
inline collective_metrics simulate_collective(std::string_view mode, const scenario& s,
                                              const collective_options& opt = {}) {
  validate(s);
  const std::size_t n = s.workers.size();
  auto [period, planner] = detail::parse_collective_mode(mode, n);
  const double cost = opt.allreduce_seconds >= 0 ? opt.allreduce_seconds : link_allreduce_seconds(s);

  collective_metrics m;
  m.mode = planner ? planner->config() : std::string(mode);
  std::vector<iteration_sampler> sampler = detail::start_run(s, m);
  const std::size_t w = planner ? planner->record_words() : 0;
  std::vector<std::int64_t> records(n * w, 0);
  detail::step_history durations(n, planner ? planner->history() : 0);
  exchange::elastic_round round;
  if (planner) round = planner->bsp_round(0);
  std::vector<double> end(n);
  std::vector<std::int64_t> steps(n, static_cast<std::int64_t>(period));

  const bool timed = s.seconds > 0;
  const std::uint64_t target = timed ? 0 : s.iterations * n;
  double t0 = 0, wait = 0;
  std::uint64_t rounds = 0;
  for (;;) {
    if (planner) steps = round.steps;
    double last = t0;
    std::uint64_t round_steps = 0;
    for (std::size_t p = 0; p < n; ++p) {
      double t = t0;
      for (std::int64_t i = 0; i < steps[p]; ++i) {
        const double d = sampler[p].next(t);
        t += d;
        if (planner) durations.record(p, d);
      }
      end[p] = t;
      last = std::max(last, t);
      round_steps += static_cast<std::uint64_t>(steps[p]);
    }
    if (timed && last + cost > s.seconds) break;
    for (std::size_t p = 0; p < n; ++p) {
      wait += last - end[p];
      m.max_local_steps = std::max(m.max_local_steps, steps[p]);
    }
    m.steps += round_steps;
    ++m.barriers;
    if (planner) {
      if (round.warmup) ++m.bsp_barriers;
      for (std::size_t p = 0; p < n; ++p) {
        std::int64_t* rec = records.data() + p * w;
        rec[0] = steps[p];
        durations.write(p, rec + 1, rec + 2);
      }
      round = planner->plan(records, round.barrier + 1);
    }
    t0 = last + cost;
    if (!timed && m.steps >= target) break;
    if (opt.progress && (++rounds & 0xFF) == 0)
      opt.progress(timed ? t0 / s.seconds : static_cast<double>(m.steps) / static_cast<double>(target));
  }
  m.simulated_seconds = timed ? s.seconds : t0;
  const double rank_seconds = static_cast<double>(n) * m.simulated_seconds;
  m.steps_per_second = detail::per_second(static_cast<double>(m.steps), m.simulated_seconds);
  m.wait_seconds = wait;
  m.wait_fraction = detail::per_second(wait, rank_seconds);
  m.allreduce_fraction = detail::per_second(static_cast<double>(m.barriers) * cost, m.simulated_seconds);
  m.steps_per_barrier = m.barriers > 0 ? static_cast<double>(m.steps) / static_cast<double>(m.barriers * n) : 0;
  if (opt.progress) opt.progress(1.0);
  return m;
}

/// Writes runs to os as an aligned table, one row per run: mode, steps/s, wait %,
/// all-reduce %, barriers, steps per barrier.
inline void write_collective_table(std::ostream& os, const std::vector<collective_metrics>& runs) {
  os << detail::table_line<256>("%-26s %10s %7s %7s %9s %10s %9s\n", "mode", "steps/s", "wait%", "comm%",
                                "barriers", "steps/bar", "max local");
  for (const auto& r : runs)
    os << detail::table_line<256>("%-26s %10.1f %6.1f%% %6.1f%% %9llu %10.2f %9lld\n", r.mode.c_str(),
                                  r.steps_per_second, 100 * r.wait_fraction, 100 * r.allreduce_fraction,
                                  static_cast<unsigned long long>(r.barriers), r.steps_per_barrier,
                                  static_cast<long long>(r.max_local_steps));
}

/// Writes runs to os as one JSON array, one object per run with every field of
/// collective_metrics under its own name; ends with a newline.
inline void write_collective_json(std::ostream& os, const std::vector<collective_metrics>& runs) {
  detail::write_json_rows(os, runs, detail::collective_row);
}

/// Writes runs to os as CSV: a header row and one row per run, the same fields as
/// write_collective_json.
inline void write_collective_csv(std::ostream& os, const std::vector<collective_metrics>& runs) {
  detail::write_csv_rows(os, runs, detail::collective_row);
}

/// @}
}  // namespace cadence::sim
