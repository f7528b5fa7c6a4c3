#include <cadence/sim/membership.hpp>
#include <cadence/sim/scenario.hpp>

#include "sim/steady_scenarios.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>

using namespace cadence;
using namespace cadence::sim;

namespace {

// A job of `workers` with one fault per worker every `mtbf` seconds; the rest as the CLI's
// defaults (5 s detection, 1 s reconfiguration, 60 s restart, 1 s steps, 0.1 s syncs) and 4 GB
// of state over 12.5 GB/s.
membership_model job(std::size_t workers, double mtbf) {
  membership_model m;
  m.workers = workers;
  m.mtbf_seconds = mtbf;
  m.state_bytes = 4e9;
  m.link_bytes_per_second = 1.25e10;
  return m;
}

std::string describe(const membership_model& m, const membership_metrics& r) {
  return "workers " + std::to_string(m.workers) + ", mtbf " + std::to_string(m.mtbf_seconds) + ", k " +
         std::to_string(m.sync_every) + (m.loss == membership::on_loss::retry ? ", retry" : ", discard") +
         ": simulated " + std::to_string(r.efficiency) + " +- " + std::to_string(r.efficiency_stderr) +
         ", closed form " + std::to_string(r.expected_efficiency) + ", overlap " + std::to_string(r.overlap);
}

}  // namespace

TEST_CASE("the membership model's closed form agrees with its simulation within the statistical error") {
  // Regimes where faults seldom overlap (overlap <= 0.1), from 10^2 to 10^5 workers, both
  // on_loss rules, BSP and periodic syncs, with and without detection and transfer times.
  std::vector<membership_model> models;
  models.push_back(job(100, 2e4));
  models.push_back(job(100000, 1e7));
  membership_model periodic = job(1000, 2e5);
  periodic.sync_every = 8;
  periodic.step_seconds = 0.25;
  models.push_back(periodic);
  membership_model discard = job(10000, 2e6);
  discard.loss = membership::on_loss::discard;
  models.push_back(discard);
  membership_model crash = job(1000, 1e5);  // crashes: seen at once, a quick re-forming
  crash.detection_seconds = 0;
  crash.reconfiguration_seconds = 0.05;
  crash.restart_seconds = 10;
  models.push_back(crash);
  for (const membership_model& m : models) {
    const membership_metrics r = simulate_membership(m);
    CHECK_MESSAGE(r.overlap <= 0.1, describe(m, r));
    CHECK_MESSAGE(r.faults > 19000, describe(m, r));
    CHECK_MESSAGE(r.efficiency_stderr > 0, describe(m, r));
    // 4 standard errors, plus the quadrature's 1e-4 on the integrals of the closed form.
    CHECK_MESSAGE(std::abs(r.efficiency - r.expected_efficiency) <= 4 * r.efficiency_stderr + 1e-4, describe(m, r));
    CHECK_MESSAGE(r.efficiency < 1, describe(m, r));
  }
}

TEST_CASE("the membership closed form is the documented formula, checked by hand on a simple job") {
  // One step of 1 s per sync, syncs free, crashes seen at once, re-forming 0.5 s, replacements
  // ready at once, no state: a failed sync stalls 0.5 s, its window is 1.5 - u (mean 1 s), the
  // admission 0.5 s, and the slot misses exactly one sync.
  membership_model m;
  m.workers = 1000;
  m.mtbf_seconds = 1e5;
  m.detection_seconds = 0;
  m.reconfiguration_seconds = 0.5;
  m.restart_seconds = 0;
  m.step_seconds = 1;
  m.sync_seconds = 0;
  m.state_bytes = 0;
  const membership_expectation e = expected_membership(m);
  const double F = 0.01, Fs = F * (1 - F * 0.5) / (1 + F * 1.0);
  CHECK(e.faults_per_second == doctest::Approx(F));
  CHECK(e.failing_faults_per_second == doctest::Approx(Fs));
  CHECK(e.stall_seconds_per_failed_sync == doctest::Approx(0.5));
  CHECK(e.admission_seconds == doctest::Approx(0.5));
  CHECK(e.missed_syncs_per_fault == doctest::Approx(1));
  CHECK(e.efficiency == doctest::Approx(1 - Fs * 0.5 - F * 0.5 - 1.0 / 1e5));
  CHECK(e.lost_work_ideal == doctest::Approx(1 - 1.0 / 1e5));
  CHECK(e.reconfiguration_fraction == doctest::Approx((Fs + F) * 0.5));
  CHECK(e.detection_fraction == 0);
  // Under discard the failed round's time up to the failure is lost too: 1 s + 0.5 s.
  m.loss = membership::on_loss::discard;
  CHECK(expected_membership(m).stall_seconds_per_failed_sync == doctest::Approx(1.5));
  // A transfer of 2 GB over 1 GB/s to one joiner, or to four from two donors.
  m.state_bytes = 2e9;
  m.link_bytes_per_second = 1e9;
  CHECK(m.transfer_seconds(1) == doctest::Approx(2));
  m.donors = 2;
  CHECK(m.transfer_seconds(4) == doctest::Approx(4));
  CHECK(expected_membership(m).admission_seconds == doctest::Approx(2.5));
}

TEST_CASE("a membership job without failures commits every step") {
  membership_model m = job(100000, std::numeric_limits<double>::infinity());
  const membership_metrics r = simulate_membership(m);
  CHECK(r.faults == 0);
  CHECK(r.reconfigurations == 0);
  CHECK(r.efficiency == doctest::Approx(1).epsilon(1e-9));
  CHECK(r.expected_efficiency == 1);
  CHECK(r.lost_work_ideal == 1);
  CHECK(r.mean_quorum == doctest::Approx(100000));
}

TEST_CASE("with detection, reconfiguration and transfer free, a membership job loses only the lost ranks' own work") {
  for (const auto loss : {membership::on_loss::retry, membership::on_loss::discard}) {
    membership_model m = job(1000, 2e4);
    m.detection_seconds = 0;
    m.reconfiguration_seconds = 0;
    m.state_bytes = 0;
    m.sync_seconds = 0;  // a fault in the sync would waste the sync's partial time
    m.loss = loss;
    if (loss == membership::on_loss::discard) m.sync_every = 1;
    const membership_metrics r = simulate_membership(m);
    const membership_expectation e = expected_membership(m);
    if (loss == membership::on_loss::retry) {
      CHECK(e.efficiency == doctest::Approx(e.lost_work_ideal).epsilon(1e-12));
      CHECK(r.reconfiguration_fraction == 0);
      CHECK(r.detection_fraction == 0);
      CHECK(std::abs(r.efficiency - e.lost_work_ideal) <= 4 * r.efficiency_stderr + 1e-4);
    } else {
      // Discard still gives up the survivors' round: below the ideal by that much.
      CHECK(e.efficiency < e.lost_work_ideal - 0.01);
      CHECK(std::abs(r.efficiency - e.efficiency) <= 4 * r.efficiency_stderr + 1e-4);
    }
    CHECK(r.transfer_fraction == 0);
    CHECK(r.faults > 0);
  }
}

TEST_CASE("membership efficiency falls as the failure rate rises") {
  double last_closed = 1.1, last_sim = 1.1;
  for (const double mtbf : {1e9, 1e8, 1e7, 3e6, 1e6}) {
    const membership_model m = job(10000, mtbf);
    const membership_metrics r = simulate_membership(m);
    CHECK_MESSAGE(r.expected_efficiency < last_closed, mtbf);
    CHECK_MESSAGE(r.efficiency < last_sim, mtbf);
    last_closed = r.expected_efficiency;
    last_sim = r.efficiency;
  }
  // And with more workers at one MTBF per worker.
  CHECK(expected_membership(job(100000, 1e7)).efficiency < expected_membership(job(1000, 1e7)).efficiency);
}

TEST_CASE("a membership simulation is the same for a seed and differs for another") {
  const membership_model m = job(1000, 1e5);
  membership_run_options o;
  o.faults = 2000;
  o.seed = 7;
  const membership_metrics a = simulate_membership(m, o), b = simulate_membership(m, o);
  CHECK(a.faults == b.faults);
  CHECK(a.efficiency == b.efficiency);
  CHECK(a.efficiency_stderr == b.efficiency_stderr);
  CHECK(a.simulated_seconds == b.simulated_seconds);
  CHECK(a.reconfigurations == b.reconfigurations);
  o.seed = 8;
  const membership_metrics c = simulate_membership(m, o);
  CHECK((c.faults != a.faults || c.efficiency != a.efficiency));
}

TEST_CASE("a membership job that loses most of its quorum at once ends") {
  membership_model m = job(4, 10);  // a fault every 2.5 s, detection 5 s: several per reconfiguration
  m.restart_seconds = 1000;
  membership_run_options o;
  o.seconds = 1000;
  const membership_metrics r = simulate_membership(m, o);
  CHECK(r.quorum_lost);
  CHECK(r.efficiency < 0.5);
}

TEST_CASE("bad membership models and run options are refused, naming the field") {
  // Each case spoils the default model; both the closed form and the simulation must refuse it
  // with an error that contains `names`.
  struct bad_model {
    void (*spoil)(membership_model&);
    const char* names;
  };
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  const bad_model cases[] = {
      {[](membership_model& m) { m.workers = 0; }, "workers must be >= 1, got 0"},
      {[](membership_model& m) { m.mtbf_seconds = -1; }, "mtbf_seconds must be > 0"},
      {[](membership_model& m) { m.mtbf_seconds = nan; }, "mtbf_seconds must be > 0"},
      {[](membership_model& m) { m.detection_seconds = nan; },
       "detection_seconds must be finite and >= 0, got nan"},
      {[](membership_model& m) { m.reconfiguration_seconds = -0.5; },
       "reconfiguration_seconds must be finite and >= 0, got -0.5"},
      {[](membership_model& m) { m.restart_seconds = std::numeric_limits<double>::infinity(); },
       "restart_seconds must be finite"},
      {[](membership_model& m) { m.link_bytes_per_second = 0; },
       "link_bytes_per_second must be finite and > 0"},
      {[](membership_model& m) { m.sync_every = 0; }, "sync_every must be >= 1"},
      {[](membership_model& m) { m.step_seconds = m.sync_seconds = 0; }, "a round"},
      {[](membership_model& m) { m.donors = 0; }, "donors must be >= 1"},
      {[](membership_model& m) { m.max_attempts = 0; }, "max_attempts must be >= 1"},
  };
  for (const auto& c : cases) {
    membership_model m;
    c.spoil(m);
    CAPTURE(c.names);
    CHECK_THROWS_WITH_AS(expected_membership(m), doctest::Contains(c.names), invalid_parameter_error);
    CHECK_THROWS_WITH_AS(simulate_membership(m), doctest::Contains(c.names), invalid_parameter_error);
  }
  membership_run_options o;
  o.batches = 1;
  CHECK_THROWS_WITH_AS(simulate_membership({}, o), doctest::Contains("batches must be >= 2"), invalid_parameter_error);
  o = {};
  o.seconds = nan;
  CHECK_THROWS_WITH_AS(simulate_membership({}, o), doctest::Contains("seconds must be finite"), invalid_parameter_error);
}

TEST_CASE("a replica's step time for the membership model comes from a simulated all-reduce run") {
  // Two ranks at 0.1 s and 0.3 s per step, 10 ms merges, 50 BSP steps: each round is the slow
  // rank's 0.3 s plus the merge.
  const scenario s = test::iteration_limited(test::steady_pair(), 50);
  CHECK(round_step_seconds(simulate_collective("bsp", s), 0.01) == doctest::Approx(0.3));
  CHECK(round_step_seconds(simulate_collective("periodic:5", s), 0.01) == doctest::Approx(0.3));
  CHECK_THROWS_AS(round_step_seconds(collective_metrics{}, 0.01), invalid_parameter_error);
}

TEST_CASE("membership reports carry every field") {
  membership_run_options o;
  o.faults = 500;
  const std::vector<membership_metrics> runs{simulate_membership(job(1000, 1e5), o)};
  std::ostringstream json, csv, table;
  write_membership_json(json, runs);
  write_membership_csv(csv, runs);
  write_membership_table(table, runs);
  for (const char* key : {"\"workers\": 1000", "\"efficiency\": ", "\"expected_efficiency\": ", "\"lost_work_ideal\": ",
                          "\"reconfigurations\": ", "\"transfer_fraction\": ", "\"quorum_lost\": false"})
    CHECK_MESSAGE(json.str().find(key) != std::string::npos, key);
  CHECK(csv.str().rfind("workers,mtbf_seconds,seed", 0) == 0);
  CHECK(table.str().find("closed") != std::string::npos);
}
