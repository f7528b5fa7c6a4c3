// Writes simulation results as a human-readable table, one JSON array, or CSV; the formats
// cadence-sim prints and docs/plots/*.py read.
#pragma once

#include <cadence/sim/metrics.hpp>

#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

namespace cadence::sim {

namespace detail {

inline std::string format_number(double v, const char* fmt = "%.9g") {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(ch)));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

/// The columns of --json and --csv, in order: name and value as JSON text.
inline std::vector<std::pair<std::string, std::string>> fields(const run_metrics& m) {
  const bool elastic = m.supersteps > 0;
  auto num = [](double v) { return format_number(v); };
  auto integer = [](auto v) { return std::to_string(v); };
  return {
      {"policy", json_string(m.policy)},
      {"scenario", json_string(m.scenario)},
      {"seed", integer(m.seed)},
      {"workers", integer(m.workers)},
      {"removed_workers", integer(m.removed_workers)},
      {"simulated_seconds", num(m.simulated_seconds)},
      {"iterations", integer(m.iterations)},
      {"iterations_per_second", num(m.iterations_per_second)},
      {"wait_fraction", num(m.wait_fraction)},
      {"wait_seconds", num(m.wait_seconds)},
      {"mean_wait", num(m.mean_wait_per_iteration)},
      {"max_staleness", integer(m.max_staleness)},
      {"max_start_staleness", integer(m.max_start_staleness)},
      {"staleness_p50", integer(histogram_quantile(m.staleness_histogram, 0.50))},
      {"staleness_p99", integer(histogram_quantile(m.staleness_histogram, 0.99))},
      {"barriers", integer(m.barriers)},
      {"barrier_source", json_string(m.barriers_from_policy ? "policy" : "release_events")},
      {"release_events", integer(m.release_events)},
      {"supersteps", integer(m.supersteps)},
      {"superstep_iterations_mean", elastic ? num(m.superstep_iterations_mean) : "null"},
      {"superstep_iterations_min", elastic ? integer(m.superstep_iterations_min) : "null"},
      {"superstep_iterations_max", elastic ? integer(m.superstep_iterations_max) : "null"},
      {"controller_ns_per_push", format_number(m.controller_ns_per_push, "%.1f")},
  };
}

}  // namespace detail

/// One JSON array, one object per run, fields as in detail::fields; ends with a newline.
inline void write_json(std::ostream& os, const std::vector<run_metrics>& runs) {
  os << "[";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    os << (i ? ",\n " : "\n ") << "{";
    const auto f = detail::fields(runs[i]);
    for (std::size_t k = 0; k < f.size(); ++k)
      os << (k ? ", " : "") << detail::json_string(f[k].first) << ": " << f[k].second;
    os << "}";
  }
  os << (runs.empty() ? "]\n" : "\n]\n");
}

/// A header row and one row per run, same columns as the JSON; null becomes an empty cell.
inline void write_csv(std::ostream& os, const std::vector<run_metrics>& runs) {
  const auto header = detail::fields(run_metrics{});
  for (std::size_t k = 0; k < header.size(); ++k) os << (k ? "," : "") << header[k].first;
  os << "\n";
  for (const auto& r : runs) {
    const auto f = detail::fields(r);
    for (std::size_t k = 0; k < f.size(); ++k) {
      std::string v = f[k].second;
      if (v == "null") v.clear();
      if (!v.empty() && v.front() == '"') v = v.substr(1, v.size() - 2);
      os << (k ? "," : "") << v;
    }
    os << "\n";
  }
}

/// An aligned comparison table for a terminal.
inline void write_table(std::ostream& os, const std::vector<run_metrics>& runs) {
  char line[256];
  std::snprintf(line, sizeof line, "%-22s %10s %7s %11s %9s %9s %10s %9s %10s\n", "policy",
                "iter/s", "wait%", "wait/iter", "stale.max", "stale.p99", "barriers", "superstep",
                "ctrl ns");
  os << line;
  for (const auto& m : runs) {
    std::string superstep = "-";
    if (m.supersteps > 0) {
      char b[48];
      std::snprintf(b, sizeof b, "%llu-%llu",
                    static_cast<unsigned long long>(m.superstep_iterations_min),
                    static_cast<unsigned long long>(m.superstep_iterations_max));
      superstep = b;
    }
    std::snprintf(line, sizeof line, "%-22s %10.1f %6.1f%% %9.2fms %9lld %9zu %10llu %9s %10.0f\n",
                  m.policy.c_str(), m.iterations_per_second, 100.0 * m.wait_fraction,
                  1e3 * m.mean_wait_per_iteration, static_cast<long long>(m.max_staleness),
                  histogram_quantile(m.staleness_histogram, 0.99),
                  static_cast<unsigned long long>(m.barriers), superstep.c_str(),
                  m.controller_ns_per_push);
    os << line;
  }
}

}  // namespace cadence::sim
