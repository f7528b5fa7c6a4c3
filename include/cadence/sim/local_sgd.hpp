/// \file
/// \ingroup sim
/// A simulated local-SGD job (exchange::diloco) on a scenario's step times: inner and outer
/// phases, a fragment's exchange overlapped with the next inner steps, the timed schedules'
/// plans (the same outer_schedule the adapter runs) and the bytes each scheme moves, so the
/// variants can be compared before a real run.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/exchange/local_sgd/codec.hpp>
#include <cadence/exchange/local_sgd/detail/coded_allreduce.hpp>
#include <cadence/exchange/local_sgd/options.hpp>
#include <cadence/exchange/local_sgd/schedule.hpp>
#include <cadence/sim/detail/run.hpp>
#include <cadence/sim/random.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenario.hpp>
#include <cadence/sim/worker_model.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// Totals of one local-SGD config on one scenario. Times are simulated seconds.
struct local_sgd_metrics {
  std::string config;            ///< the canonical config string (diloco_config_string)
  std::string scenario;          ///< scenario name
  std::uint64_t seed = 0;        ///< the scenario's seed
  std::size_t workers = 0;       ///< ranks
  double simulated_seconds = 0;  ///< the scenario's seconds (or until its iterations)
  std::uint64_t steps = 0;       ///< inner steps of all ranks
  double steps_per_second = 0;   ///< steps / simulated_seconds
  ///@{
  /// Rank seconds spent not computing (waiting for others or for an exchange), and their
  /// share of rank time.
  double idle_seconds = 0;
  double idle_fraction = 0;
  ///@}
  std::uint64_t syncs = 0;            ///< outer syncs (fixed: fragment exchanges)
  std::uint64_t bytes_per_worker = 0; ///< payload bytes rank 0 sent (records included)
  double bytes_per_second = 0;        ///< bytes_per_worker / simulated_seconds
  std::uint64_t stale_contributions = 0;  ///< contributions that came late (quorum)
  std::int64_t max_local_steps = 0;       ///< the most inner steps a rank ran between syncs
};

namespace detail {

// The columns of write_local_sgd_json and write_local_sgd_csv, in order, with one run's values.
inline row local_sgd_row(const local_sgd_metrics& r) {
  row v = run_row("config", r.config, r);
  v.add("idle_seconds", r.idle_seconds).add("idle_fraction", r.idle_fraction).add("syncs", r.syncs);
  v.add("bytes_per_worker", r.bytes_per_worker).add("bytes_per_second", r.bytes_per_second);
  return v.add("stale_contributions", r.stale_contributions).add("max_local_steps", r.max_local_steps);
}

}  // namespace detail

/// The network and model of simulate_local_sgd.
struct local_sgd_sim_options {
  /// f32 elements of the model.
  std::size_t parameters = 1000000;
  /// Bytes per second of a link (10 Gbit/s by default).
  double bytes_per_second = 1.25e9;
  /// Seconds each message waits before its bytes flow.
  double latency_seconds = 50e-6;
  /// Per rank: its link's share of bytes_per_second (empty: 1 each; 0.1 is a link capped at
  /// a tenth). A ring is paced by its slowest link.
  std::vector<double> link_scale;
};

namespace detail {

// Bytes rank `r` sends in one ring all-reduce of `elems` f32 elements in codec `c` over `n`
// ranks (the coded ring of exchange::diloco: every segment but r + 1 in the reduce-scatter,
// every one but r + 2 in the all-gather; f32 counted as the same ring).
inline std::uint64_t ring_sent(exchange::outer_codec c, std::size_t elems, std::size_t n, std::size_t r) {
  if (n <= 1 || elems == 0) return 0;
  auto seg = [&](std::size_t s) { return elems * (s + 1) / n - elems * s / n; };
  std::uint64_t all = 0;
  for (std::size_t s = 0; s < n; ++s) all += exchange::encoded_bytes(c, seg(s));
  return 2 * all - exchange::encoded_bytes(c, seg((r + 1) % n)) - exchange::encoded_bytes(c, seg((r + 2) % n));
}
// Seconds of that ring: 2 (n - 1) steps, each the largest segment over the slowest link.
inline double ring_seconds(exchange::outer_codec c, std::size_t elems, std::size_t n, double bw, double latency) {
  if (n <= 1 || elems == 0) return 0;
  const std::size_t most = (elems + n - 1) / n;
  return static_cast<double>(2 * (n - 1)) * (latency + static_cast<double>(exchange::encoded_bytes(c, most)) / bw);
}

}  // namespace detail

/// Simulates the local-SGD `config` (parse_diloco_config's string: "fixed:50",
/// "fixed:20,fragments=4,delay=2,codec=int4", "quorum:3:20", ...) on scenario `s` with network
/// and model `opt`. Every rank runs inner steps as long as the scenario's model draws.
/// **fixed**: at each step where a fragment starts, its exchange starts when the last rank
/// gets there and lasts the ring's time; with delay 0 every rank waits for it, else a rank
/// waits only if it reaches the fragment's delay step before the exchange ends. **Timed
/// schedules**: each round every rank runs the plan's steps from a common start, then all
/// exchange their records and the pseudo-gradients; the next plan comes from the same
/// outer_schedule exchange::diloco runs, on the rounded-up microseconds of each step. Bytes are
/// rank 0's, as the adapter counts them. Runs until the scenario's seconds or iterations per
/// worker. Throws parse_error or invalid_parameter_error for a bad config, scenario or option.
inline local_sgd_metrics simulate_local_sgd(std::string_view config, const scenario& s,
                                            const local_sgd_sim_options& opt = {}) {
  validate(s);
  const std::size_t n = s.workers.size();
  const exchange::diloco_config c = exchange::parse_diloco_config(config);
  exchange::outer_schedule sched(c.options.schedule, n, c.options.history);
  exchange::check_diloco_options(c.options, sched, "cadence::sim: local SGD '" + std::string(config) + "': ");
  if (!(opt.bytes_per_second > 0) || !(opt.latency_seconds >= 0) ||
      (!opt.link_scale.empty() && opt.link_scale.size() != n))
    throw invalid_parameter_error("cadence::sim: local SGD: bytes_per_second must be > 0, latency >= 0 and "
                                  "link_scale empty or one per worker (" + std::to_string(n) + ")");
  double bw = opt.bytes_per_second;
  for (const double k : opt.link_scale) {
    if (!(k > 0)) throw invalid_parameter_error("cadence::sim: local SGD: every link_scale must be > 0");
    bw = std::min(bw, opt.bytes_per_second * k);
  }

  local_sgd_metrics m;
  {
    exchange::diloco_options o = c.options;
    o.schedule = sched.config();
    m.config = exchange::diloco_config_string(o, c.outer);
  }
  std::vector<iteration_sampler> sampler = detail::start_run(s, m);
  const bool timed = s.seconds > 0;
  const std::uint64_t target = timed ? 0 : s.iterations;
  std::vector<double> clock(n, 0.0);
  std::vector<std::uint64_t> done(n, 0);
  double idle = 0;
  // Within the run: a timed run counts what ends by s.seconds.
  auto clip = [&](double x) { return timed ? std::min(x, s.seconds) : x; };
  auto wait_until = [&](std::size_t p, double until) {
    if (clock[p] < until) {
      idle += clip(until) - clip(clock[p]);
      clock[p] = until;
    }
  };
  const auto codec = c.options.codec;
  const std::size_t elems = opt.parameters;
  auto over = [&]() {
    if (timed) {
      for (const double t : clock)
        if (t < s.seconds) return false;
      return true;
    }
    for (const std::uint64_t d : done)
      if (d < target) return false;
    return true;
  };

  if (!sched.timed()) {
    // ---- fixed: fragments start by step count; an exchange overlaps `delay` steps ----
    const std::size_t f = c.options.fragments, h = sched.period(), delay = c.options.delay;
    std::vector<double> ends(f, 0.0);
    std::vector<bool> flying(f, false);
    std::vector<std::uint64_t> started(f, 0);
    for (std::uint64_t t = 1; !over(); ++t) {
      for (std::size_t p = 0; p < n; ++p) {
        clock[p] += sampler[p].next(clock[p]);
        if (!timed || clock[p] <= s.seconds) ++done[p];
      }
      for (std::size_t k = 0; k < f; ++k)  // an exchange whose delay ends now: wait for it
        if (flying[k] && started[k] + delay == t) {
          for (std::size_t p = 0; p < n; ++p) wait_until(p, ends[k]);
          flying[k] = false;
        }
      for (std::size_t k = 0; k < f; ++k) {
        if (t % h != (k + 1) * h / f % h) continue;
        const std::size_t a = elems * k / f, b = elems * (k + 1) / f;
        const double go = *std::max_element(clock.begin(), clock.end());
        ends[k] = go + detail::ring_seconds(codec, b - a, n, bw, opt.latency_seconds);
        if (!timed || go <= s.seconds) {
          m.bytes_per_worker += detail::ring_sent(codec, b - a, n, 0);
          ++m.syncs;
        }
        // Blocking, every rank waits for the end; started nonblocking, the exchange still
        // needs every rank's part, so it ends `cost` after the last rank starts it.
        if (delay == 0) {
          for (std::size_t p = 0; p < n; ++p) wait_until(p, ends[k]);
        } else {
          flying[k] = true;
          started[k] = t;
        }
      }
    }
    m.max_local_steps = static_cast<std::int64_t>(h);
  } else {
    // ---- timed: the plan's steps from a common start, then records and the whole model ----
    const std::size_t w = sched.record_words();
    const double records_seconds =
        static_cast<double>(n - 1) * (opt.latency_seconds + static_cast<double>(w * 8) / bw);
    const double model_seconds = detail::ring_seconds(codec, elems, n, bw, opt.latency_seconds);
    exchange::outer_plan plan = sched.first_plan();
    detail::step_history durations(n, sched.history());
    std::vector<std::int64_t> progress(n, 0), carried(n, 0), records(n * w, 0);
    double t0 = 0;
    while (!over()) {
      double last = t0;
      std::vector<std::uint64_t> within(n, 0);  // steps that end by the run's end
      for (std::size_t p = 0; p < n; ++p) {
        clock[p] = t0;
        for (std::int64_t i = 0; i < plan.steps[p]; ++i) {
          const double d = sampler[p].next(clock[p]);
          clock[p] += d;
          if (!timed || clock[p] <= s.seconds) ++within[p];
          durations.record(p, d);
        }
        last = std::max(last, clock[p]);
      }
      const double cost = records_seconds + model_seconds;
      if (timed && last + cost > s.seconds) {  // the run ends inside this round: its steps so far
        for (std::size_t p = 0; p < n; ++p) {
          done[p] += within[p];
          idle += clip(last) - clip(clock[p]);
        }
        break;
      }
      for (std::size_t p = 0; p < n; ++p) {
        done[p] += static_cast<std::uint64_t>(plan.steps[p]);
        progress[p] += plan.steps[p];
        m.max_local_steps = std::max(m.max_local_steps, progress[p]);
        idle += last - clock[p];
        std::int64_t* rec = records.data() + p * w;
        rec[exchange::outer_record::steps] = progress[p];
        rec[exchange::outer_record::carried] = carried[p];
        rec[exchange::outer_record::contributes] = plan.contributes[p];
        rec[exchange::outer_record::hash] = static_cast<std::int64_t>(plan.hash);
        durations.write(p, rec + exchange::outer_record::have, rec + exchange::outer_record::head);
        if (plan.contributes[p] != 0 && carried[p] > 0) ++m.stale_contributions;
      }
      idle += static_cast<double>(n) * cost;
      m.bytes_per_worker += exchange::detail::ring_bytes(n * w * 8, n) + detail::ring_sent(codec, elems, n, 0);
      ++m.syncs;
      for (std::size_t p = 0; p < n; ++p) {
        if (plan.contributes[p] != 0) {
          progress[p] = 0;
          carried[p] = 0;
        } else {
          ++carried[p];
        }
      }
      plan = sched.plan(records, m.syncs);
      t0 = last + cost;
      for (std::size_t p = 0; p < n; ++p) clock[p] = t0;
    }
  }
  m.simulated_seconds = timed ? s.seconds : *std::max_element(clock.begin(), clock.end());
  for (const std::uint64_t d : done) m.steps += d;
  const double rank_seconds = static_cast<double>(n) * m.simulated_seconds;
  m.steps_per_second = detail::per_second(static_cast<double>(m.steps), m.simulated_seconds);
  m.idle_seconds = idle;
  m.idle_fraction = detail::per_second(idle, rank_seconds);
  m.bytes_per_second = detail::per_second(static_cast<double>(m.bytes_per_worker), m.simulated_seconds);
  return m;
}

/// Writes runs to os as an aligned table, one row per run: config, steps/s, idle %, syncs,
/// MB rank 0 sent, MB/s, stale contributions, most local steps.
inline void write_local_sgd_table(std::ostream& os, const std::vector<local_sgd_metrics>& runs) {
  os << detail::table_line<320>("%-44s %9s %6s %6s %11s %9s %6s %9s\n", "config", "steps/s", "idle%", "syncs",
                                "MB sent", "MB/s", "stale", "max local");
  for (const auto& r : runs)
    os << detail::table_line<320>("%-44s %9.1f %5.1f%% %6llu %11.2f %9.3f %6llu %9lld\n", r.config.c_str(),
                                  r.steps_per_second, 100 * r.idle_fraction, static_cast<unsigned long long>(r.syncs),
                                  static_cast<double>(r.bytes_per_worker) / 1e6, r.bytes_per_second / 1e6,
                                  static_cast<unsigned long long>(r.stale_contributions),
                                  static_cast<long long>(r.max_local_steps));
}

/// Writes runs to os as one JSON array, one object per run with every field of
/// local_sgd_metrics under its own name; ends with a newline.
inline void write_local_sgd_json(std::ostream& os, const std::vector<local_sgd_metrics>& runs) {
  detail::write_json_rows(os, runs, detail::local_sgd_row);
}

/// Writes runs to os as CSV: a header row and one row per run, the same fields as
/// write_local_sgd_json (the config quoted: it holds commas).
inline void write_local_sgd_csv(std::ostream& os, const std::vector<local_sgd_metrics>& runs) {
  detail::write_csv_rows(os, runs, detail::local_sgd_row, "config");
}

/// @}
}  // namespace cadence::sim
