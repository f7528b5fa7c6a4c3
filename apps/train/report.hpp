// cadence-train's report, on rank 0: the --json document (nlohmann/json), the --csv rows and
// the --curves file of every policy's measurements, the line on stderr after each policy, and
// the table on stdout at the end.
//
//   ---- JSON, CSV, curves ----      to_json, to_csv, curves_csv (docs/tools.md lists the keys)
//   ---- what rank 0 prints ----     print_policy_line, print_gone, print_reports
#pragma once

#include "json.hpp"
#include "options.hpp"
#include "train.hpp"

#include <cadence/core/error.hpp>
#include <cadence/sim/report.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace cadence::train {

// ---- JSON, CSV, curves ----

/// The --json document: one array, one object per policy, with exactly the keys scripts rely
/// on (docs/train.md): policy, transport, workers, seconds, iterations, iterations_per_second,
/// wait_fraction, max_staleness, final_accuracy, best_accuracy, time_to_70, time_to_80 (null
/// when not reached), evicted, worker_transfer_seconds (per worker, null for one that measured
/// nothing), simulated {iterations_per_second, wait_fraction}. Measured figures to 6
/// significant digits, times to accuracy to the millisecond.
inline std::string to_json(const std::vector<policy_report>& runs) {
  using tools::decimals;
  using tools::json;
  using tools::significant;
  auto doc = json::array();
  for (const policy_report& r : runs) {
    json links = json::array();
    for (const double s : r.worker_transfer_seconds) links.push_back(significant(s, 6));
    doc.push_back({{"policy", r.policy},
                   {"transport", r.transport},
                   {"workers", r.workers},
                   {"seconds", significant(r.seconds, 9)},
                   {"iterations", r.iterations},
                   {"iterations_per_second", significant(r.iterations_per_second, 6)},
                   {"wait_fraction", significant(r.wait_fraction, 6)},
                   {"max_staleness", r.max_staleness},
                   {"final_accuracy", significant(r.final_accuracy, 6)},
                   {"best_accuracy", significant(r.best_accuracy, 6)},
                   {"time_to_70", decimals(r.time_to_70, 3)},
                   {"time_to_80", decimals(r.time_to_80, 3)},
                   {"evicted", r.evicted},
                   {"worker_transfer_seconds", links},
                   {"simulated",
                    {{"iterations_per_second", significant(r.simulated_iterations_per_second, 6)},
                     {"wait_fraction", significant(r.simulated_wait_fraction, 6)}}}});
  }
  return tools::json_document(doc);
}

/// The accuracy curves (--curves FILE), for plots: policy,seconds,accuracy per point.
inline std::string curves_csv(const std::vector<policy_report>& runs) {
  std::string out = "policy,seconds,accuracy\n";
  char buf[64];
  for (const policy_report& r : runs)
    for (const accuracy_point& p : r.curve) {
      std::snprintf(buf, sizeof buf, ",%.3f,%.4f\n", p.seconds, p.accuracy);
      out += r.policy + buf;
    }
  return out;
}

/// The --csv document: a header, then one row per policy (evicted ids joined by ';').
inline std::string to_csv(const std::vector<policy_report>& runs) {
  using sim::detail::format_number;
  std::string out =
      "policy,transport,workers,seconds,iterations,iterations_per_second,wait_fraction,max_staleness,"
      "staleness_p99,final_accuracy,best_accuracy,time_to_70,time_to_80,evicted,"
      "simulated_iterations_per_second,simulated_wait_fraction\n";
  auto cell = [](double v, const char* fmt) { return std::isfinite(v) ? format_number(v, fmt) : std::string(); };
  for (const policy_report& r : runs) {
    std::string ev;
    for (std::size_t k = 0; k < r.evicted.size(); ++k) ev += (k ? ";" : "") + std::to_string(r.evicted[k]);
    out += r.policy + "," + r.transport + "," + std::to_string(r.workers) + "," + cell(r.seconds, "%g") + "," +
           std::to_string(r.iterations) + "," + cell(r.iterations_per_second, "%.6g") + "," +
           cell(r.wait_fraction, "%.6g") + "," + std::to_string(r.max_staleness) + "," +
           std::to_string(r.p99_staleness) + "," + cell(r.final_accuracy, "%.6g") + "," +
           cell(r.best_accuracy, "%.6g") + "," + cell(r.time_to_70, "%.3f") + "," + cell(r.time_to_80, "%.3f") +
           "," + ev + "," + cell(r.simulated_iterations_per_second, "%.6g") + "," +
           cell(r.simulated_wait_fraction, "%.6g") + "\n";
  }
  return out;
}

// ---- what rank 0 prints ----

// Rank 0's line on stderr after each policy: measured against simulated.
inline void print_policy_line(const train::policy_report& r) {
  char t80[32] = "-";
  if (std::isfinite(r.time_to_80)) std::snprintf(t80, sizeof t80, "%.1f s", r.time_to_80);
  std::string links;  // parameter-server modes: each worker's own transfer ("-": none measured)
  const bool ps = r.transport.size() > 3 && r.transport.compare(r.transport.size() - 3, 3, "-ps") == 0;
  for (std::size_t p = 0; ps && p < r.worker_transfer_seconds.size(); ++p) {
    char cell[32] = "-";
    if (!std::isnan(r.worker_transfer_seconds[p]))
      std::snprintf(cell, sizeof cell, "%.2f", 1e3 * r.worker_transfer_seconds[p]);
    links += (p ? "/" : "") + std::string(cell);
  }
  if (!links.empty()) links = " (median; per worker " + links + " ms)";
  if (r.policy.rfind("diloco:", 0) == 0) {  // a mode the simulator here does not model
    std::fprintf(stderr,
                 "cadence-train: %s: %.2f it/s, wait %.1f%% (not simulated), t@80%% %s, final %.1f%%, transfer %.2f ms, "
                 "compute overran the profile in %.1f%% of iterations\n",
                 r.policy.c_str(), r.iterations_per_second, 100 * r.wait_fraction, t80, 100 * r.final_accuracy,
                 1e3 * r.transfer_seconds, 100 * r.overrun_fraction);
    return;
  }
  std::fprintf(stderr,
               "cadence-train: %s: %.2f it/s (simulated %.2f, error %.1f%%), wait %.1f%% (simulated %.1f%%, error "
               "%.1f%% = %.1f points), t@80%% %s, final %.1f%%, transfer %.2f ms%s, compute overran the profile in %.1f%% "
               "of iterations\n",
               r.policy.c_str(), r.iterations_per_second, r.simulated_iterations_per_second,
               100 * train::relative_error(r.simulated_iterations_per_second, r.iterations_per_second),
               100 * r.wait_fraction, 100 * r.simulated_wait_fraction,
               100 * train::relative_error(r.simulated_wait_fraction, r.wait_fraction),
               100 * std::fabs(r.simulated_wait_fraction - r.wait_fraction), t80,
               100 * r.final_accuracy, 1e3 * r.transfer_seconds, links.c_str(), 100 * r.overrun_fraction);
}

// Rank 0, when evicted workers sent nothing after policy k (within `grace`): who is gone and
// which policies are skipped.
inline void print_gone(const train_options& o, std::size_t k, const std::vector<int>& gone,
                       std::chrono::seconds grace) {
  std::string who, skipped;
  for (const int q : gone) who += (who.empty() ? "" : ", ") + std::to_string(q - 1) + " (rank " + std::to_string(q) + ")";
  for (std::size_t j = k + 1; j < o.policies.size(); ++j) skipped += (skipped.empty() ? "" : ", ") + o.policies[j];
  std::fprintf(stderr,
               "cadence-train: %s: worker %s sent nothing after the policy (evicted and silent for %lld s, or "
               "its connection closed): gone (killed?); %s\n",
               o.policies[k].c_str(), who.c_str(), static_cast<long long>(grace.count()),
               skipped.empty() ? "the run reports" : ("the remaining policies are skipped: " + skipped).c_str());
}

// Rank 0, at the end: --curves, then the reports as JSON, CSV or a table on stdout.
inline void print_reports(const train_options& o, const std::vector<train::policy_report>& reports) {
  if (!o.curves.empty()) {
    std::ofstream f(o.curves);
    f << train::curves_csv(reports);
    if (!f) throw cadence::error("--curves: cannot write '" + o.curves + "'");
  }
  if (o.json) {
    std::fputs(train::to_json(reports).c_str(), stdout);
  } else if (o.csv) {
    std::fputs(train::to_csv(reports).c_str(), stdout);
  } else {
    std::printf("%-14s %7s %7s %7s %7s %8s %7s %6s %13s %8s %13s %13s\n", "policy", "final", "best", "t@70%",
                "t@80%", "iters", "it/s", "wait%", "stale p99/max", "evicted", "sim it/s(err)", "sim wait(err)");
    for (const auto& r : reports) {
      auto secs = [](double v) { return std::isfinite(v) ? std::to_string(static_cast<int>(std::lround(v))) + "s" : std::string("-"); };
      std::string ev;
      for (int e : r.evicted) ev += (ev.empty() ? "" : ",") + std::to_string(e);
      char sim_it[32], sim_wait[32];
      std::snprintf(sim_it, sizeof sim_it, "%.1f(%.0f%%)", r.simulated_iterations_per_second,
                    100 * train::relative_error(r.simulated_iterations_per_second, r.iterations_per_second));
      std::snprintf(sim_wait, sizeof sim_wait, "%.1f%%(%.0f%%)", 100 * r.simulated_wait_fraction,
                    100 * train::relative_error(r.simulated_wait_fraction, r.wait_fraction));
      if (r.policy.rfind("diloco:", 0) == 0) {  // not modelled by the simulator here
        std::snprintf(sim_it, sizeof sim_it, "-");
        std::snprintf(sim_wait, sizeof sim_wait, "-");
      }
      std::printf("%-14s %6.1f%% %6.1f%% %7s %7s %8llu %7.1f %5.1f%% %6lld/%-6lld %8s %13s %13s\n", r.policy.c_str(),
                  100 * r.final_accuracy, 100 * r.best_accuracy, secs(r.time_to_70).c_str(),
                  secs(r.time_to_80).c_str(), static_cast<unsigned long long>(r.iterations), r.iterations_per_second,
                  100 * r.wait_fraction, static_cast<long long>(r.p99_staleness),
                  static_cast<long long>(r.max_staleness), ev.empty() ? "-" : ev.c_str(), sim_it, sim_wait);
    }
  }
  std::fflush(stdout);
}

}  // namespace cadence::train
