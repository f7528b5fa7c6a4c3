// Shared by cadence-sim and cadence-race (not installed): the scenario named by the flags and
// the bound on how much simulated work those flags may ask for. main's error handling is
// cli.hpp's guarded_main.
#pragma once

#include "cli.hpp"
#include <cadence/sim/scenarios.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace cadence::tools {

inline sim::scenario scenario_from_flags(const std::string& name, std::size_t workers, std::uint64_t seed) {
  try {
    return sim::make_scenario(name, workers, seed);
  } catch (const invalid_parameter_error& e) {
    bool known = false;
    for (const auto& info : sim::scenario_catalog()) known = known || info.name == name;
    throw usage_error(std::string(known ? "--workers: " : "--scenario: ") + e.what());
  }
}

/// The most pushes a tool simulates per policy: at the simulator's 5-8 million pushes per
/// second about 15-20 s. Much more would look like a hang, since nothing prints until the end.
inline constexpr std::uint64_t max_simulated_pushes = 100'000'000;

/// The fastest worker's mean iteration time in s (whose workers are as make_scenario gives
/// them: at least one, each with iteration_seconds > 0).
inline double fastest_iteration_seconds(const sim::scenario& s) {
  double fastest = s.workers.front().iteration_seconds;
  for (const auto& w : s.workers) fastest = std::min(fastest, w.iteration_seconds);
  return fastest;
}

/// Pushes a run of s makes: iterations x workers, or for a timed run at most about
/// seconds x workers / fastest_iteration_seconds (every worker at the fastest pace, pushes and
/// pulls free). A double, so that absurd flags cannot overflow it.
inline double estimated_pushes(const sim::scenario& s) {
  const auto n = static_cast<double>(s.workers.size());
  if (s.seconds > 0) return s.seconds * n / fastest_iteration_seconds(s);
  return static_cast<double>(s.iterations) * n;
}

/// Throws usage_error when s (workers as for fastest_iteration_seconds) would simulate more than max_simulated_pushes,
/// naming `flag` (the flag that set the run length, or --workers when the scenario's own
/// length is used), the numbers and the bound: "--seconds: 1e+12 simulated s x 16 workers /
/// 0.1 s (the fastest iteration) is about 1.6e+14 pushes; the bound is 100000000 pushes per
/// policy (lower --seconds or --workers)".
inline void check_simulated_work(const sim::scenario& s, std::string_view flag) {
  const double pushes = estimated_pushes(s);
  if (pushes <= static_cast<double>(max_simulated_pushes)) return;
  char what[160];
  if (s.seconds > 0)
    std::snprintf(what, sizeof what,
                  "%g simulated s x %zu workers / %g s (the fastest iteration) is about %.3g pushes",
                  s.seconds, s.workers.size(), fastest_iteration_seconds(s), pushes);
  else if (pushes < 9007199254740992.0)  // 2^53: the double product is exact
    std::snprintf(what, sizeof what, "%llu iterations x %zu workers is %.0f pushes",
                  static_cast<unsigned long long>(s.iterations), s.workers.size(), pushes);
  else
    std::snprintf(what, sizeof what, "%llu iterations x %zu workers is about %.3g pushes",
                  static_cast<unsigned long long>(s.iterations), s.workers.size(), pushes);
  throw usage_error(std::string(flag) + ": " + what + "; the bound is " +
                    std::to_string(max_simulated_pushes) + " pushes per policy (lower " +
                    (s.seconds > 0 ? "--seconds" : "--iterations") + " or --workers)");
}

}  // namespace cadence::tools
