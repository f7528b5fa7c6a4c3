/// \file
/// \ingroup sim
/// A model of a fault-tolerant collective job on the membership layer (membership::member):
/// workers fail as Poisson processes, the survivors detect it, re-form and retry or discard the
/// sync, a replacement rejoins and receives the state. It predicts committed-step efficiency at
/// 10^2-10^5 workers two ways: a simulation of the fault arrivals and a closed-form expectation.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/membership/report.hpp>
#include <cadence/sim/collective.hpp>
#include <cadence/sim/random.hpp>
#include <cadence/sim/report.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

// ---- the model ----

/// A collective job of `workers` replicas that sync every `sync_every` local steps on the
/// membership layer, and what its faults cost. Times in seconds. It follows what the layer does
/// (docs/collective.md, "The membership model in the simulator"):
///
/// 1. A round is `sync_every` local steps of `step_seconds` each, then one sync (the merge
///    all-reduce) of `sync_seconds`: R = k step_seconds + sync_seconds. A fault-free job commits
///    one sync per round, with every worker's k steps in it.
/// 2. Faults arrive as one merged Poisson process of rate workers / mtbf_seconds (each worker
///    fails at 1 / mtbf_seconds; the rate is kept at the full size while lost workers are
///    replaced, so it slightly overstates faults while some are down). A lost worker's work
///    since its last committed sync is lost.
/// 3. A sync that loses a member fails on every survivor (transactional sync points). Members
///    talk only at sync points, so the survivors see the loss when they reach the sync, or
///    `detection_seconds` after the fault if that is later (a crash closes its connections: 0; a
///    hung or stopped process: the heartbeat timeout of membership::timeouts). Then they re-form
///    in `reconfiguration_seconds`; faults before the new quorum is announced are dropped in the
///    same reconfiguration.
/// 4. on_loss::retry (model averaging): the survivors keep their local steps and run the sync
///    again (up to max_attempts runs in all, then it is discarded). on_loss::discard (BSP
///    gradients): the round's steps are given up on every survivor.
/// 5. A replacement is ready `restart_seconds` after the fault; it is admitted after the first
///    sync that commits once it is ready (members note it in that sync, then re-form with it):
///    a planned reconfiguration of `reconfiguration_seconds` plus the state transfer, while the
///    quorum waits. Replacements admitted together receive the state from up to `donors`
///    members: state_bytes / link_bytes_per_second x max(1, joiners / donors).
/// 6. A reconfiguration that loses more than half the quorum at once, or all of it, ends the job
///    (membership::quorum's successor rule): the simulation stops there.
struct membership_model {
  std::size_t workers = 1000;         ///< replicas the job runs with when none is down
  double mtbf_seconds = 1e7;          ///< mean time between failures of one worker (inf: never)
  double detection_seconds = 5;       ///< fault to the survivors' failed sync, at the latest
  double reconfiguration_seconds = 1; ///< one re-forming of the quorum (failure or admission)
  double restart_seconds = 60;        ///< fault to the replacement's join request
  double state_bytes = 1e9;           ///< registered state a joiner receives (1 GB)
  double link_bytes_per_second = 1.25e9;  ///< one donor's link (10 Gbit/s)
  std::size_t donors = 1;             ///< member_options::max_donors
  double step_seconds = 1;            ///< one local step of a replica (the slowest's, under BSP)
  std::size_t sync_every = 1;         ///< k: local steps per sync (1: BSP)
  double sync_seconds = 0.1;          ///< one sync's collectives, fault-free
  membership::on_loss loss = membership::on_loss::retry;  ///< what a failed sync does
  int max_attempts = 8;               ///< member_options::max_attempts (retry only)

  /// Seconds of one fault-free round: sync_every * step_seconds + sync_seconds.
  double round_seconds() const noexcept { return static_cast<double>(sync_every) * step_seconds + sync_seconds; }
  /// Faults per second of the whole job: workers / mtbf_seconds.
  double fault_rate() const noexcept { return static_cast<double>(workers) / mtbf_seconds; }
  /// Seconds to stream the state to `joiners` replacements admitted together.
  double transfer_seconds(std::size_t joiners = 1) const noexcept {
    if (state_bytes <= 0 || joiners == 0) return 0;
    return state_bytes / link_bytes_per_second *
           std::max(1.0, static_cast<double>(joiners) / static_cast<double>(donors));
  }
};

/// Throws invalid_parameter_error naming the first field of `m` that is out of range (zero
/// workers, a negative or NaN time or rate, a zero step and sync, an infinite restart...).
inline void validate(const membership_model& m) {
  auto fail = [](const std::string& what) { throw invalid_parameter_error("cadence::sim::membership_model: " + what); };
  auto num = [](double v) {
    char b[48];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  auto time = [&](const char* name, double v) {
    if (!(v >= 0) || !std::isfinite(v)) fail(std::string(name) + " must be finite and >= 0, got " + num(v));
  };
  if (m.workers == 0) fail("workers must be >= 1, got 0");
  if (m.workers > 100000000) fail("workers must be <= 1e8, got " + std::to_string(m.workers));
  if (!(m.mtbf_seconds > 0)) fail("mtbf_seconds must be > 0 (inf: no faults), got " + num(m.mtbf_seconds));
  time("detection_seconds", m.detection_seconds);
  time("reconfiguration_seconds", m.reconfiguration_seconds);
  if (!(m.restart_seconds >= 0) || !std::isfinite(m.restart_seconds))
    fail("restart_seconds must be finite and >= 0 (a job that never replaces a lost worker shrinks for ever "
         "and has no steady efficiency), got " + num(m.restart_seconds));
  time("state_bytes", m.state_bytes);
  if (!(m.link_bytes_per_second > 0) || !std::isfinite(m.link_bytes_per_second))
    fail("link_bytes_per_second must be finite and > 0, got " + num(m.link_bytes_per_second));
  if (m.donors == 0) fail("donors must be >= 1, got 0");
  time("step_seconds", m.step_seconds);
  if (m.sync_every == 0) fail("sync_every must be >= 1, got 0");
  time("sync_seconds", m.sync_seconds);
  if (!(m.round_seconds() > 0) || !std::isfinite(m.round_seconds()))
    fail("a round (sync_every * step_seconds + sync_seconds) must take a finite time > 0, got " + num(m.round_seconds()));
  if (m.loss != membership::on_loss::retry && m.loss != membership::on_loss::discard) fail("loss must be retry or discard");
  if (m.max_attempts < 1) fail("max_attempts must be >= 1, got " + std::to_string(m.max_attempts));
}

/// The per-step time of a replica from a simulated all-reduce run (simulate_collective on a
/// scenario with a step target, so its time ends at a merge): the mean round minus the merge,
/// per local step. Under BSP it is the slowest rank's step plus its wait, which is what paces a
/// collective job. `sync_seconds` is the merge's cost, taken off each round. Throws
/// invalid_parameter_error for a run without merges.
inline double round_step_seconds(const collective_metrics& run, double sync_seconds) {
  if (run.barriers == 0 || run.steps_per_barrier <= 0)
    throw invalid_parameter_error("cadence::sim::round_step_seconds: the run '" + run.mode + "' made no merge");
  const double round = run.simulated_seconds / static_cast<double>(run.barriers);
  return std::max(0.0, round - sync_seconds) / run.steps_per_barrier;
}

// ---- the closed form ----

/// The closed-form expectation of membership_model. Per fault, averaged over where in its round
/// it lands (uniform over the round): the seconds every member stalls for the failed sync `s`,
/// the seconds from the fault to the end of its reconfiguration `a` (faults in that window are
/// dropped in the same reconfiguration and fail no sync of their own), the admission `C + X`
/// and the syncs the lost slot misses `M`. With fault rate F = workers / mtbf, the rate of faults
/// that fail a sync is F_s = F (1 - F (C + X)) / (1 + F a) (the share of time outside such
/// windows), and
///
///     efficiency = 1 - F_s s - F (C + X) - M R / mtbf.
///
/// Exact for isolated faults; beyond that it counts every admission on its own and no retry
/// that fails again, so it drifts from the simulation as `overlap` (faults per fault's cycle)
/// nears 1 (tests/sim/membership_test.cpp checks the agreement, docs/collective.md shows both).
struct membership_expectation {
  double faults_per_second = 0;          ///< F = workers / mtbf_seconds
  double failing_faults_per_second = 0;  ///< F_s: faults that fail a sync of their own
  /// s: seconds every member waits per failed sync: the detection wait and the reconfiguration
  /// (under discard also the round's time up to the failure).
  double stall_seconds_per_failed_sync = 0;
  double admission_seconds = 0;  ///< C + X: re-forming with a replacement and its state transfer
  /// M: syncs a lost worker's slot misses: the one it failed in and every one until its
  /// replacement is admitted.
  double missed_syncs_per_fault = 0;
  /// Committed steps / the steps a fault-free job commits in the same time, clamped to [0, 1].
  double efficiency = 1;
  /// The ideal that excludes only the lost ranks' own work (no detection, reconfiguration or
  /// transfer time, nothing lost by survivors): 1 - M (with those at 0) R / mtbf.
  double lost_work_ideal = 1;
  ///@{
  /// Share of the job's time in reconfigurations (failures and admissions), in detection waits
  /// and in state transfers.
  double reconfiguration_fraction = 0;
  double detection_fraction = 0;
  double transfer_fraction = 0;
  ///@}
  /// F (a + C + X + R): expected faults within one fault's cycle. Below about 0.1 the closed
  /// form is within a few hundredths of a point of the simulation; near 1 it is off by points.
  double overlap = 0;
};

namespace detail {

// Seconds from a fault at u into its round to the first commit after it, and the seconds every
// member stalls for it, under model m with detection D and reconfiguration C.
struct fault_phase {
  double first_commit;
  double stall;
};
inline fault_phase phase_of(const membership_model& m, double u, double D, double C) {
  const double local = static_cast<double>(m.sync_every) * m.step_seconds;
  const double R = m.round_seconds();
  const double failed = std::max(local, u + D);  // the sync fails here
  if (m.loss == membership::on_loss::retry) {
    const double stall = failed - local + C;
    return {failed + C + m.sync_seconds - u, stall};
  }
  return {failed + C + R - u, failed + C};
}

// Syncs a slot misses: the first commit after the fault, and every one until the first commit at
// or after the replacement is ready (commits R apart, the first `first` after the fault).
inline double missed_syncs(double first, double restart, double R) {
  if (restart <= first) return 1;
  return 1 + std::ceil((restart - first) / R);
}

}  // namespace detail

/// The closed-form expectation of model `m` (validated first).
inline membership_expectation expected_membership(const membership_model& m) {
  validate(m);
  membership_expectation e;
  const double R = m.round_seconds();
  const double C = m.reconfiguration_seconds;
  const double X = m.transfer_seconds(1);
  const double local = static_cast<double>(m.sync_every) * m.step_seconds;
  const double F = std::isinf(m.mtbf_seconds) ? 0 : m.fault_rate();
  const double per_worker = std::isinf(m.mtbf_seconds) ? 0 : 1 / m.mtbf_seconds;
  // The fault's phase in its round, by the midpoint rule (the stall is piecewise linear in u,
  // the missed count a step function: 8192 points put both within 1e-4 of the integral).
  constexpr int points = 8192;
  double stall = 0, window = 0, missed = 0, missed0 = 0, detect = 0;
  for (int i = 0; i < points; ++i) {
    const double u = (i + 0.5) / points * R;
    const detail::fault_phase p = detail::phase_of(m, u, m.detection_seconds, C);
    const double failed = std::max(local, u + m.detection_seconds);
    stall += p.stall;
    window += failed + C - u;
    missed += detail::missed_syncs(p.first_commit, m.restart_seconds, R);
    missed0 += detail::missed_syncs(R - u, m.restart_seconds, R);
    detect += failed - std::max(local, u);
  }
  stall /= points;
  window /= points;
  missed /= points;
  missed0 /= points;
  detect /= points;
  e.faults_per_second = F;
  e.failing_faults_per_second = std::max(0.0, F * (1 - F * (C + X)) / (1 + F * window));
  e.stall_seconds_per_failed_sync = stall;
  e.admission_seconds = C + X;
  e.missed_syncs_per_fault = missed;
  const double Fs = e.failing_faults_per_second;
  e.efficiency = std::clamp(1 - Fs * stall - F * (C + X) - missed * R * per_worker, 0.0, 1.0);
  e.lost_work_ideal = std::clamp(1 - missed0 * R * per_worker, 0.0, 1.0);
  e.reconfiguration_fraction = (Fs + F) * C;
  e.detection_fraction = Fs * detect;
  e.transfer_fraction = F * X;
  e.overlap = F * (window + C + X + R);
  return e;
}

// ---- the simulation ----

/// How simulate_membership runs.
struct membership_run_options {
  /// Simulated seconds after the warm-up; 0: long enough for about `faults` faults (or 10^4
  /// rounds without faults).
  double seconds = 0;
  /// Faults to simulate when seconds is 0 (the statistical error falls as 1 / sqrt(faults)).
  std::uint64_t faults = 20000;
  /// The run is cut into this many equal batches after one batch of warm-up; the standard error
  /// is their spread (batch means).
  std::size_t batches = 20;
  std::uint64_t seed = 1;  ///< the fault arrivals' seed: a seed gives the same run every time
};

/// What simulate_membership measured, with the closed form's prediction beside it.
struct membership_metrics {
  std::size_t workers = 0;        ///< the model's workers
  double mtbf_seconds = 0;        ///< the model's per-worker MTBF
  std::uint64_t seed = 0;         ///< the run's seed
  double simulated_seconds = 0;   ///< warm-up included
  std::uint64_t faults = 0;       ///< workers lost
  ///@{
  /// Committed steps / the steps a fault-free job commits in the same time (the mean of the
  /// batches), and its standard error.
  double efficiency = 0;
  double efficiency_stderr = 0;
  ///@}
  double expected_efficiency = 0;  ///< the closed form (expected_membership)
  double lost_work_ideal = 0;      ///< the closed form's ideal that excludes only the lost work
  double overlap = 0;              ///< the closed form's faults per cycle (valid while << 1)
  std::uint64_t failed_syncs = 0;      ///< sync attempts a fault failed
  std::uint64_t discarded_syncs = 0;   ///< syncs given up (discard, or retries exhausted)
  std::uint64_t reconfigurations = 0;  ///< failures and admissions
  std::uint64_t admitted = 0;          ///< replacements admitted
  ///@{
  /// Share of simulated time in reconfigurations, in detection waits (survivors at a sync that
  /// has not failed yet) and in state transfers.
  double reconfiguration_fraction = 0;
  double detection_fraction = 0;
  double transfer_fraction = 0;
  ///@}
  double mean_quorum = 0;    ///< members per committed sync
  bool quorum_lost = false;  ///< a reconfiguration lost half the quorum or more: the job ended
};

/// Simulates model `m` (validated first): the merged Poisson fault arrivals, each failed sync,
/// reconfiguration, retry and admission; rounds without a fault or an admission are committed
/// in one stride, so the cost grows with the faults, not with workers or rounds (10^5 workers
/// and 20000 faults take milliseconds). `opt` sets the length, the batches and the seed;
/// deterministic for a seed.
inline membership_metrics simulate_membership(const membership_model& m, const membership_run_options& opt = {}) {
  validate(m);
  if (opt.batches < 2) throw invalid_parameter_error("cadence::sim::simulate_membership: batches must be >= 2");
  if (!(opt.seconds >= 0) || !std::isfinite(opt.seconds))
    throw invalid_parameter_error("cadence::sim::simulate_membership: seconds must be finite and >= 0");
  if (opt.seconds == 0 && (opt.faults == 0 || opt.faults > 100000000))
    throw invalid_parameter_error("cadence::sim::simulate_membership: faults must be in [1, 1e8] when seconds is 0");
  const membership_expectation e = expected_membership(m);
  membership_metrics out;
  out.workers = m.workers;
  out.mtbf_seconds = m.mtbf_seconds;
  out.seed = opt.seed;
  out.expected_efficiency = e.efficiency;
  out.lost_work_ideal = e.lost_work_ideal;
  out.overlap = e.overlap;

  const double R = m.round_seconds(), C = m.reconfiguration_seconds, D = m.detection_seconds;
  const double local = static_cast<double>(m.sync_every) * m.step_seconds;
  const double rate = e.faults_per_second;
  const auto B = opt.batches;
  double span = opt.seconds > 0 ? opt.seconds : rate > 0 ? static_cast<double>(opt.faults) / rate : 1e4 * R;
  if (rate > 0 && span * rate > 1e9)
    throw invalid_parameter_error("cadence::sim::simulate_membership: about " + std::to_string(span * rate) +
                                  " faults in the run; at most 1e9");
  const double L = std::ceil(span / static_cast<double>(B) / R) * R;  // a batch, whole rounds
  const double warm = L, end = warm + static_cast<double>(B) * L;
  const double k = static_cast<double>(m.sync_every);

  random_stream rng(mix_seed(opt.seed, 0x6d656d62ULL));
  double next_fault = rate > 0 ? rng.exponential(1 / rate) : HUGE_VAL;
  std::deque<double> pending;  // replacements' ready times, in order
  std::size_t members = m.workers;
  std::vector<double> credited(B, 0.0);
  double t = 0, committed_members = 0, commits = 0;
  double reconf = 0, detect = 0, transfer = 0;

  // The batch a commit at `at` counts in: a commit on a batch's edge ends that batch (up to
  // rounding), -1 in the warm-up, B past the end (not counted).
  auto batch_of = [&](double at) -> long long {
    const double x = (at - warm) / L;
    if (x <= 1e-9) return -1;
    return std::min(static_cast<long long>(B), static_cast<long long>(std::ceil(x - 1e-9)) - 1);
  };
  auto commit = [&](double at, double rounds) {
    const long long b = batch_of(at);
    if (b >= 0 && b < static_cast<long long>(B)) credited[static_cast<std::size_t>(b)] += rounds * static_cast<double>(members) * k;
    committed_members += rounds * static_cast<double>(members);
    commits += rounds;
  };
  // Every fault before `until` loses one member (dropped in the reconfiguration under way); a
  // reconfiguration that loses more than half of `before` ends the job.
  auto absorb = [&](double until, std::size_t before) {
    std::size_t lost = 0;
    while (next_fault < until) {
      if (members > 0) --members;
      ++lost;
      ++out.faults;
      pending.push_back(next_fault + m.restart_seconds);
      next_fault += rng.exponential(1 / rate);
    }
    if (members == 0 || 2 * lost > before) out.quorum_lost = true;
  };
  // After a commit at t: the replacements ready by then are admitted.
  auto admit = [&] {
    std::size_t j = 0;
    while (!pending.empty() && pending.front() <= t) {
      pending.pop_front();
      ++j;
    }
    if (j == 0) return;
    const double x = m.transfer_seconds(j);
    ++out.reconfigurations;
    out.admitted += j;
    reconf += C;
    transfer += x;
    const std::size_t before = members;
    members += j;
    absorb(t + C + x, before + j);
    t += C + x;
  };
  // A sync attempt failed by the fault at next_fault: survivors see it at `failed`, re-form.
  auto fail = [&](double failed, double from) {
    ++out.failed_syncs;
    ++out.reconfigurations;
    reconf += C;
    detect += failed - from;
    const std::size_t before = members;
    absorb(failed + C, before);
    t = failed + C;
  };

  while (t < end - 1e-9 * L && !out.quorum_lost) {
    // Plain rounds: no fault before their end, no replacement ready by it, one batch.
    double n = std::floor((std::min(next_fault, end) - t) / R);
    if (!pending.empty()) n = std::min(n, pending.front() <= t ? 0.0 : std::ceil((pending.front() - t) / R) - 1);
    const long long b = std::min(batch_of(t + R), static_cast<long long>(B) - 1);
    n = std::min(n, std::floor(((b < 0 ? warm : warm + static_cast<double>(b + 1) * L) - t) / R + 1e-9));
    if (n >= 1) {
      commit(t + n * R, n);
      t += n * R;
      continue;
    }
    // One round with a fault in it, or a replacement waiting, or at a batch's edge.
    const double t0 = t, sync_at = t0 + local;
    if (next_fault >= t0 + R) {
      t = t0 + R;
      commit(t, 1);
      admit();
      continue;
    }
    fail(std::max(sync_at, next_fault + D), std::max(sync_at, next_fault));
    if (m.loss == membership::on_loss::discard) {
      ++out.discarded_syncs;
      continue;
    }
    for (int attempt = 2; !out.quorum_lost; ++attempt) {
      if (attempt > m.max_attempts) {
        ++out.discarded_syncs;
        break;
      }
      if (next_fault >= t + m.sync_seconds) {
        t += m.sync_seconds;
        commit(t, 1);
        admit();
        break;
      }
      fail(next_fault + D, next_fault);
    }
  }

  out.simulated_seconds = t;
  const double ideal = static_cast<double>(m.workers) * k * L / R;
  double sum = 0, sq = 0;
  for (const double c : credited) {
    sum += c / ideal;
    sq += (c / ideal) * (c / ideal);
  }
  const double nb = static_cast<double>(B);
  out.efficiency = sum / nb;
  out.efficiency_stderr = std::sqrt(std::max(0.0, sq / nb - out.efficiency * out.efficiency) / (nb - 1));
  if (t > 0) {
    out.reconfiguration_fraction = reconf / t;
    out.detection_fraction = detect / t;
    out.transfer_fraction = transfer / t;
  }
  out.mean_quorum = commits > 0 ? committed_members / commits : 0;
  return out;
}

// ---- reports ----

/// Writes `runs` to `os` as an aligned table: workers, faults per hour, simulated efficiency +- its
/// standard error, the closed form, the lost-work ideal, reconfigurations per hour and the
/// shares of time in reconfiguration, detection and transfer.
inline void write_membership_table(std::ostream& os, const std::vector<membership_metrics>& runs) {
  os << detail::table_line<256>("%8s %10s %19s %9s %9s %9s %7s %7s %7s %7s\n", "workers", "faults/h",
                                "simulated +- s.e.", "closed", "ideal", "reconf/h", "reconf%", "detect%", "xfer%",
                                "overlap");
  for (const auto& r : runs) {
    const double hours = r.simulated_seconds / 3600;
    os << detail::table_line<256>("%8zu %10.3g %8.3f%% +-%-8.2g %8.3f%% %8.3f%% %9.3g %6.2f%% %6.2f%% %6.2f%% %7.3f%s\n",
                                  r.workers, hours > 0 ? static_cast<double>(r.faults) / hours : 0.0,
                                  100 * r.efficiency, 100 * r.efficiency_stderr, 100 * r.expected_efficiency,
                                  100 * r.lost_work_ideal, hours > 0 ? static_cast<double>(r.reconfigurations) / hours : 0.0,
                                  100 * r.reconfiguration_fraction, 100 * r.detection_fraction, 100 * r.transfer_fraction,
                                  r.overlap, r.quorum_lost ? "  quorum lost" : "");
  }
}

namespace detail {

// The columns of write_membership_json and write_membership_csv, in order, with one run's values.
inline row membership_row(const membership_metrics& r) {
  row v;
  v.add("workers", r.workers).add("mtbf_seconds", r.mtbf_seconds).add("seed", r.seed);
  v.add("simulated_seconds", r.simulated_seconds).add("faults", r.faults).add("efficiency", r.efficiency);
  v.add("efficiency_stderr", r.efficiency_stderr).add("expected_efficiency", r.expected_efficiency);
  v.add("lost_work_ideal", r.lost_work_ideal).add("overlap", r.overlap).add("failed_syncs", r.failed_syncs);
  v.add("discarded_syncs", r.discarded_syncs).add("reconfigurations", r.reconfigurations).add("admitted", r.admitted);
  v.add("reconfiguration_fraction", r.reconfiguration_fraction).add("detection_fraction", r.detection_fraction);
  v.add("transfer_fraction", r.transfer_fraction).add("mean_quorum", r.mean_quorum);
  return v.add("quorum_lost", r.quorum_lost);
}

}  // namespace detail

/// Writes `runs` to `os` as one JSON array, one object per run with every field of membership_metrics
/// under its own name; ends with a newline.
inline void write_membership_json(std::ostream& os, const std::vector<membership_metrics>& runs) {
  detail::write_json_rows(os, runs, detail::membership_row);
}

/// Writes `runs` to `os` as CSV: a header row and one row per run, the fields of write_membership_json.
inline void write_membership_csv(std::ostream& os, const std::vector<membership_metrics>& runs) {
  detail::write_csv_rows(os, runs, detail::membership_row);
}

/// @}
}  // namespace cadence::sim
