/// \file
/// \ingroup sim
/// Writes simulation results as a human-readable table, one JSON array, or CSV; the formats
/// cadence-sim prints and docs/plots/*.py read.
#pragma once

#include <cadence/sim/metrics.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

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

/// One run as the JSON and CSV writers print it: its columns in order, each a name and a value:
/// numbers as format_number writes them, integers in decimal, bools as true and false, strings
/// escaped in quotes for JSON and as they are for CSV.
class row {
public:
  row& add(const char* name, double v) { return push(name, format_number(v), false); }
  row& add(const char* name, bool v) { return push(name, v ? "true" : "false", false); }
  row& add(const char* name, const std::string& v) { return push(name, v, true); }
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  row& add(const char* name, I v) {
    return push(name, std::to_string(v), false);
  }

  std::size_t size() const noexcept { return cells_.size(); }
  const char* name(std::size_t k) const { return cells_[k].name; }
  std::string json(std::size_t k) const { return cells_[k].string ? json_string(cells_[k].text) : cells_[k].text; }
  const std::string& text(std::size_t k) const { return cells_[k].text; }

private:
  struct cell {
    const char* name;
    std::string text;
    bool string;
  };
  row& push(const char* name, std::string text, bool string) {
    cells_.push_back({name, std::move(text), string});
    return *this;
  }
  std::vector<cell> cells_;
};

/// Writes runs to os as one JSON array, one object per run and line with the members
/// row_of(run) gives, in its order; ends with a newline.
template <class Run, class RowOf>
void write_json_rows(std::ostream& os, const std::vector<Run>& runs, RowOf row_of) {
  os << "[";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const row v = row_of(runs[i]);
    os << (i ? ",\n " : "\n ") << "{";
    for (std::size_t k = 0; k < v.size(); ++k) os << (k ? ", \"" : "\"") << v.name(k) << "\": " << v.json(k);
    os << "}";
  }
  os << "\n]\n";
}

/// Writes runs to os as CSV: a header line with the column names, then one line per run; the
/// column named `quoted` (one whose values may hold commas) in double quotes.
template <class Run, class RowOf>
void write_csv_rows(std::ostream& os, const std::vector<Run>& runs, RowOf row_of, std::string quoted = {}) {
  const row header = row_of(Run{});
  for (std::size_t k = 0; k < header.size(); ++k) os << (k ? "," : "") << header.name(k);
  os << "\n";
  for (const auto& r : runs) {
    const row v = row_of(r);
    for (std::size_t k = 0; k < v.size(); ++k) {
      os << (k ? "," : "");
      if (quoted == v.name(k)) os << '"' << v.text(k) << '"';
      else os << v.text(k);
    }
    os << "\n";
  }
}

/// The columns of --json and --csv, in order: name and value as JSON text. A field that does
/// not apply to the run's policy is null (barriers and superstep sizes for non-superstep
/// policies), so a reader never mistakes a stand-in for the real quantity.
inline std::vector<std::pair<std::string, std::string>> fields(const run_metrics& m) {
  const bool superstep = m.barriers.has_value();
  const bool sampled = superstep && *m.barriers > 0;
  auto num = [](double v) { return format_number(v); };
  auto integer = [](auto v) { return std::to_string(v); };
  auto superstep_integer = [&](std::uint64_t v) { return sampled ? integer(v) : "null"; };
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
      {"start_staleness_max", integer(m.max_start_staleness)},
      {"start_staleness_p50", integer(histogram_quantile(m.start_staleness_histogram, 0.50))},
      {"start_staleness_p99", integer(histogram_quantile(m.start_staleness_histogram, 0.99))},
      {"updates_behind_mean", num(m.mean_updates_behind)},
      {"updates_behind_p99", integer(histogram_quantile(m.updates_behind_histogram, 0.99))},
      {"updates_behind_max", integer(m.max_updates_behind)},
      {"barriers", superstep ? integer(*m.barriers) : "null"},
      {"release_events", integer(m.release_events)},
      {"superstep_iterations_mean", sampled ? num(m.superstep_iterations_mean) : "null"},
      {"superstep_iterations_min", superstep_integer(m.superstep_iterations_min)},
      {"superstep_iterations_max", superstep_integer(m.superstep_iterations_max)},
      {"superstep_monitoring_max", superstep_integer(m.superstep_monitoring_max)},
      {"superstep_planned_max", superstep_integer(m.superstep_planned_max)},
      {"controller_ns_per_push", format_number(m.controller_ns_per_push, "%.1f")},
      {"events_per_second", format_number(m.events_per_second, "%.0f")},
  };
}

/// One line (or cell) of a table for a terminal: fmt and args as printf formats them, cut to
/// N - 1 characters (the table writers' fixed line buffers).
template <std::size_t N, class... Args>
std::string table_line(const char* fmt, Args... args) {
  char line[N];
  std::snprintf(line, sizeof line, fmt, args...);
  return line;
}

/// Table cells shared by cadence-sim and cadence-race: the clock gap at start as "P99/MAX",
/// updates behind as "MEAN/P99/MAX".
inline std::string start_staleness_cell(const run_metrics& m) {
  return std::to_string(histogram_quantile(m.start_staleness_histogram, 0.99)) + "/" +
         std::to_string(m.max_start_staleness);
}
inline std::string updates_behind_cell(const run_metrics& m) {
  return table_line<64>("%.1f/%zu/%llu", m.mean_updates_behind, histogram_quantile(m.updates_behind_histogram, 0.99),
                        static_cast<unsigned long long>(m.max_updates_behind));
}
/// Fewest-most iterations per superstep, then the two parts of its bound as observed: the most
/// monitoring pushes and the most planned pushes (at most R) of a worker, as "MIN-MAX (MON+PLAN)";
/// "-" for a policy without supersteps or a run that reached no barrier.
inline std::string superstep_cell(const run_metrics& m) {
  if (!m.barriers || *m.barriers == 0) return "-";
  return table_line<64>("%llu-%llu (%llu+%llu)", static_cast<unsigned long long>(m.superstep_iterations_min),
                        static_cast<unsigned long long>(m.superstep_iterations_max),
                        static_cast<unsigned long long>(m.superstep_monitoring_max),
                        static_cast<unsigned long long>(m.superstep_planned_max));
}

}  // namespace detail

/// Writes runs to os as one JSON array, one object per run with the keys of cadence-sim --json
/// (docs/tools.md); ends with a newline.
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

/// Writes runs to os as CSV: a header row and one row per run, the same columns as
/// write_json; null becomes an empty cell.
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

/// Writes runs to os as an aligned comparison table for a terminal; columns as cadence-sim
/// --help explains them.
/// "-" where a column does not apply to the policy.
inline void write_table(std::ostream& os, const std::vector<run_metrics>& runs) {
  os << detail::table_line<256>("%-20s %7s %6s %9s %13s %19s %8s %14s %7s\n", "policy", "iter/s", "wait%",
                                "wait/iter", "stale p99/max", "behind mean/p99/max", "barriers", "superstep",
                                "ctrl ns");
  for (const auto& m : runs) {
    const std::string barriers = m.barriers ? std::to_string(*m.barriers) : "-";
    os << detail::table_line<256>("%-20s %7.1f %5.1f%% %7.2fms %13s %19s %8s %14s %7.0f\n", m.policy.c_str(),
                                  m.iterations_per_second, 100.0 * m.wait_fraction, 1e3 * m.mean_wait_per_iteration,
                                  detail::start_staleness_cell(m).c_str(), detail::updates_behind_cell(m).c_str(),
                                  barriers.c_str(), detail::superstep_cell(m).c_str(), m.controller_ns_per_push);
  }
}

/// @}
}  // namespace cadence::sim
