// Shared by cadence-sim and cadence-race (not installed): the scenario named by the flags, the
// workers' own links (--link), and the bound on how much simulated work those flags may ask
// for. main's error handling is flags.hpp's guarded_main.
#pragma once

#include "flags.hpp"
#include <cadence/sim/scenarios.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace cadence::tools {

/// --scenario NAME (`scenario_help` says what it is) and --workers N, as cadence-sim and
/// cadence-race take them. The upper bound of --workers is make_scenario's, which
/// scenario_from_flags reports.
inline void add_cluster_flags(command_line& cli, std::string& scenario, std::size_t& workers,
                              const std::string& scenario_help) {
  cli.add_option("--scenario", scenario, scenario_help)->option_text("NAME");
  cli.add_option("--workers", workers, "number of workers (default: the scenario's own)")
      ->option_text("N")
      ->check(integer<std::size_t>(1, SIZE_MAX));
}

/// The scenario the flags name; a bad name is --scenario's error, a bad size --workers'.
inline sim::scenario scenario_from_flags(const std::string& name, std::size_t workers, std::uint64_t seed) {
  try {
    return sim::make_scenario(name, workers, seed);
  } catch (const invalid_parameter_error& e) {
    bool known = false;
    for (const auto& info : sim::scenario_catalog()) known = known || info.name == name;
    throw usage_error(std::string(known ? "--workers: " : "--scenario: ") + e.what());
  }
}

/// One worker's own link from the command line (--link W=PUSH[,PULL]): seconds for its push
/// and its pull; PULL defaults to PUSH.
struct link_flag {
  std::size_t worker = 0;
  double push = 0;
  double pull = 0;
};

/// Parses "W=PUSH[,PULL]" (a worker index, then seconds >= 0). Throws usage_error "expected
/// 'W=PUSH[,PULL]' (a worker and its push and pull seconds), got 'TEXT'", or parse_integer's and
/// parse_real's errors for the parts (CLI11 puts "--link: " before them).
inline link_flag parse_link(std::string_view text) {
  const auto eq = text.find('=');
  const std::string_view costs = eq == std::string_view::npos ? std::string_view() : text.substr(eq + 1);
  const auto comma = costs.find(',');
  if (eq == std::string_view::npos || costs.empty() || costs.find(',', comma + 1) != std::string_view::npos ||
      (comma != std::string_view::npos && comma + 1 == costs.size()))
    throw usage_error("expected 'W=PUSH[,PULL]' (a worker and its push and pull seconds), got '" + std::string(text) +
                      "'");
  link_flag l;
  l.worker = parse_integer<std::size_t>(text.substr(0, eq), 0, SIZE_MAX, "W");
  l.push = parse_real(costs.substr(0, comma), /*allow_zero=*/true);
  l.pull = comma == std::string_view::npos ? l.push : parse_real(costs.substr(comma + 1), true);
  return l;
}

/// Gives each named worker of s its own link (worker_model::push_seconds, pull_seconds), which
/// the scenario's push and pull cost do not override. Throws usage_error naming `flag` for a
/// worker the scenario does not have or one named twice.
inline void apply_links(sim::scenario& s, const std::vector<link_flag>& links, std::string_view flag) {
  for (std::size_t i = 0; i < links.size(); ++i) {
    const link_flag& l = links[i];
    if (l.worker >= s.workers.size())
      throw usage_error(std::string(flag) + ": worker " + std::to_string(l.worker) + " is out of range: the scenario has " +
                        std::to_string(s.workers.size()) + " workers (0.." + std::to_string(s.workers.size() - 1) + ")");
    for (std::size_t j = 0; j < i; ++j)
      if (links[j].worker == l.worker)
        throw usage_error(std::string(flag) + ": worker " + std::to_string(l.worker) + " given twice");
    s.workers[l.worker].push_seconds = l.push;
    s.workers[l.worker].pull_seconds = l.pull;
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
