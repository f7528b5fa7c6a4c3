/// \file
/// \ingroup sim
/// The named scenarios shared by cadence-sim, the tests, the benchmark and docs/results.md:
/// homogeneous, heterogeneous GPUs, transient stragglers, a 1000-worker cluster, drift, failure.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/sim/scenario.hpp>

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// One entry of the catalog: its name, default size and what it models.
struct scenario_info {
  std::string name;             ///< what make_scenario and the tools' --scenario take
  std::size_t default_workers;  ///< workers when none is asked for
  std::string description;      ///< one line on what it models
};

/// The scenario every tool uses when none is named.
inline constexpr std::string_view default_scenario_name = "hetero16";

/// Every named scenario, in the order tools list them.
inline std::vector<scenario_info> scenario_catalog() {
  return {
      {"homogeneous", 8, "identical workers, 0.10 s/iteration with 5% normal jitter"},
      {"hetero2", 2,
       "the DSSP paper's pair: a GTX 1080 Ti (0.10 s) and a GTX 1060 (0.17 s, 1.7x slower), "
       "3% log-normal jitter"},
      {"hetero16", 16,
       "half 1080 Ti (0.10 s), half 1060 (0.17 s), 5% log-normal jitter (the default)"},
      {"stragglers64", 64,
       "identical 0.10 s workers, 5% normal jitter; each iteration has a 0.2% chance to start a "
       "straggler episode (4x slower, mean 3 s)"},
      {"large1000", 1000,
       "three GPU classes (0.10, 0.13, 0.17 s) round-robin, 10% log-normal jitter, rare 3x "
       "stragglers; 10 ms push and pull"},
      {"large100k", 100000,
       "large1000's cluster at 10^5 workers: three GPU classes round-robin, 10% log-normal "
       "jitter, rare 3x stragglers; 10 ms push and pull"},
      {"drift8", 8,
       "workers start equal (0.10 s); worker p slows gradually until the last one is 2x slower "
       "at 300 s (thermal throttling)"},
      {"failure8", 8,
       "identical 0.10 s workers, 5% normal jitter; worker n/2 dies at 60 s and the server "
       "removes it 2 s later (heartbeat timeout)"},
  };
}

namespace detail {

inline worker_model gpu(double seconds, jitter_kind kind, double cv, const char* label) {
  worker_model m;
  m.iteration_seconds = seconds;
  m.jitter = kind;
  m.jitter_cv = cv;
  m.label = label;
  return m;
}

inline scenario base_scenario(std::string_view name, std::string description, double seconds) {
  scenario s;
  s.name = std::string(name);
  s.description = std::move(description);
  s.push_seconds = 0.005;
  s.pull_seconds = 0.005;
  s.seconds = seconds;
  return s;
}

}  // namespace detail

/// Builds the named scenario with `workers` workers (0: its default size), its random
/// streams drawn from `seed`. Throws
/// invalid_parameter_error for an unknown name (listing the known ones) or a bad size.
inline scenario make_scenario(std::string_view name, std::size_t workers = 0, std::uint64_t seed = 1) {
  const auto catalog = scenario_catalog();
  const scenario_info* info = nullptr;
  for (const auto& c : catalog)
    if (c.name == name) info = &c;
  if (info == nullptr) {
    std::string known;
    for (const auto& c : catalog) known += (known.empty() ? "" : ", ") + c.name;
    throw invalid_parameter_error("cadence::sim: unknown scenario '" + std::string(name) +
                                  "'; known scenarios: " + known);
  }
  const std::size_t n = workers == 0 ? info->default_workers : workers;
  if (n > 1000000)
    throw invalid_parameter_error("cadence::sim: scenario '" + std::string(name) +
                                  "': at most 1000000 workers, got " + std::to_string(n));
  if (name == "failure8" && n < 2)
    throw invalid_parameter_error(
        "cadence::sim: scenario 'failure8' needs at least 2 workers (one of them dies), got " +
        std::to_string(n));

  scenario s;
  if (name == "homogeneous") {
    s = detail::base_scenario(name, info->description, 300);
    for (std::size_t p = 0; p < n; ++p) s.workers.push_back(detail::gpu(0.10, jitter_kind::normal, 0.05, "gpu"));
  } else if (name == "hetero2" || name == "hetero16") {
    s = detail::base_scenario(name, info->description, 300);
    const double cv = name == "hetero2" ? 0.03 : 0.05;
    for (std::size_t p = 0; p < n; ++p)
      s.workers.push_back(p < (n + 1) / 2 ? detail::gpu(0.10, jitter_kind::lognormal, cv, "1080Ti")
                                          : detail::gpu(0.17, jitter_kind::lognormal, cv, "1060"));
  } else if (name == "stragglers64") {
    s = detail::base_scenario(name, info->description, 120);
    for (std::size_t p = 0; p < n; ++p) {
      worker_model m = detail::gpu(0.10, jitter_kind::normal, 0.05, "gpu");
      m.straggle_probability = 0.002;
      m.straggle_factor = 4.0;
      m.straggle_seconds = 3.0;
      s.workers.push_back(m);
    }
  } else if (name == "large1000" || name == "large100k") {
    s = detail::base_scenario(name, info->description, 60);
    s.push_seconds = s.pull_seconds = 0.010;
    static constexpr double times[3] = {0.10, 0.13, 0.17};
    static constexpr const char* labels[3] = {"fast", "mid", "slow"};
    for (std::size_t p = 0; p < n; ++p) {
      worker_model m = detail::gpu(times[p % 3], jitter_kind::lognormal, 0.10, labels[p % 3]);
      m.straggle_probability = 0.0005;
      m.straggle_factor = 3.0;
      m.straggle_seconds = 2.0;
      s.workers.push_back(m);
    }
  } else if (name == "drift8") {
    s = detail::base_scenario(name, info->description, 300);
    for (std::size_t p = 0; p < n; ++p) {
      worker_model m = detail::gpu(0.10, jitter_kind::normal, 0.05, "gpu");
      const double share = n > 1 ? static_cast<double>(p) / static_cast<double>(n - 1) : 0.0;
      m.drift_per_second = share * std::log(2.0) / 300.0;
      s.workers.push_back(m);
    }
  } else {  // failure8
    s = detail::base_scenario(name, info->description, 180);
    s.failure_detection_seconds = 2.0;
    for (std::size_t p = 0; p < n; ++p) s.workers.push_back(detail::gpu(0.10, jitter_kind::normal, 0.05, "gpu"));
    s.workers[n / 2].fails_at = 60.0;
  }
  s.seed = seed;
  return s;
}

/// @}
}  // namespace cadence::sim
