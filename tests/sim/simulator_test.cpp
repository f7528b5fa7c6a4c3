#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include "sim/steady_scenarios.hpp"
#include "support/scenarios.hpp"
#include "support/schedule.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::sim;
using test::short_scenario;
using test::steady_scenario;

namespace {

// Wraps a controller and checks, after every push and removal, that every running worker is
// within `bound` of the slowest and that not every active worker waits.
template <class C>
class checked {
public:
  checked(C inner, clock_value bound) : inner_(std::move(inner)), bound_(bound) {}
  decision push(worker_id p, timestamp t) {
    const decision d = inner_.push(p, t);
    test::check_staleness_and_progress(inner_, bound_, inner_.worker_capacity());
    return d;
  }
  span<const worker_id> remove_worker(worker_id p) {
    const auto r = inner_.remove_worker(p);
    test::check_staleness_and_progress(inner_, bound_, inner_.worker_capacity());
    return r;
  }
  worker_id add_worker() { return inner_.add_worker(); }
  std::size_t worker_capacity() const { return inner_.worker_capacity(); }
  clock_value clock(worker_id p) const { return inner_.clock(p); }
  bool is_active(worker_id p) const { return inner_.is_active(p); }
  bool is_waiting(worker_id p) const { return inner_.is_waiting(p); }
  std::size_t active_workers() const { return inner_.active_workers(); }
  clock_value min_clock() const { return inner_.min_clock(); }
  clock_value staleness(worker_id p) const { return inner_.staleness(p); }
  clock_value max_staleness() const { return inner_.max_staleness(); }
  std::vector<worker_id> waiting_for(worker_id p) const { return inner_.waiting_for(p); }
  std::string config() const { return inner_.config(); }

private:
  C inner_;
  clock_value bound_;
};

// A policy that never lets anyone go on and never notices: the simulator must not hang.
class never_release {
public:
  explicit never_release(std::size_t n) : clock_(n, 0), waiting_(n, false) {}
  decision push(worker_id p, timestamp) {
    ++clock_[p];
    waiting_[p] = true;
    return {false, {}};
  }
  span<const worker_id> remove_worker(worker_id) { return {}; }
  worker_id add_worker() { return 0; }
  std::size_t worker_capacity() const { return clock_.size(); }
  clock_value clock(worker_id p) const { return clock_[p]; }
  bool is_active(worker_id) const { return true; }
  bool is_waiting(worker_id p) const { return waiting_[p]; }
  std::size_t active_workers() const { return clock_.size(); }
  clock_value min_clock() const { return 0; }
  clock_value staleness(worker_id) const { return 0; }
  clock_value max_staleness() const { return 0; }
  std::vector<worker_id> waiting_for(worker_id) const { return {}; }
  std::string config() const { return "never"; }

private:
  std::vector<clock_value> clock_;
  std::vector<bool> waiting_;
};

struct bounded_policy {
  const char* config;
  clock_value bound;  // staleness at which a worker may start an iteration
};
constexpr bounded_policy bounded_policies[] = {{"bsp", 0}, {"ssp:0", 0}, {"ssp:3", 3}, {"dssp:0:4", 4},
                                               {"dssp:3:15", 15}, {"dssp:2:2", 2}};

// A constant-time scenario whose times are exact binary fractions, so event times carry no
// rounding and the expected counts below are exact.
scenario constant_scenario() {
  return steady_scenario("constant", {0.25, 0.125, 0.1875, 0.25, 0.09375}, 0.0625, 0.03125, 50);
}

bool same_outcome(const run_metrics& a, const run_metrics& b) {
  if (a.per_worker.size() != b.per_worker.size()) return false;
  for (std::size_t p = 0; p < a.per_worker.size(); ++p) {
    const auto &x = a.per_worker[p], &y = b.per_worker[p];
    if (x.iterations != y.iterations || x.wait_seconds != y.wait_seconds ||
        x.compute_seconds != y.compute_seconds || x.max_start_staleness != y.max_start_staleness ||
        x.max_updates_behind != y.max_updates_behind || x.waits != y.waits)
      return false;
  }
  return a.iterations == b.iterations && a.simulated_seconds == b.simulated_seconds &&
         a.wait_seconds == b.wait_seconds && a.max_start_staleness == b.max_start_staleness &&
         a.start_staleness_histogram == b.start_staleness_histogram &&
         a.updates_behind_histogram == b.updates_behind_histogram && a.barriers == b.barriers &&
         a.release_events == b.release_events;
}

// Two workers with constant times that are exact binary fractions, so every event time below
// is exact and no two pushes arrive together.
scenario two_worker_scenario(double slow_seconds) {
  return steady_scenario("two", {0.25, slow_seconds}, 0.0625, 0.09375, 1.5);
}

}  // namespace

TEST_CASE("on every scenario and seed no worker starts an iteration beyond its policy's staleness bound" *
          doctest::timeout(120)) {
  for (const auto& info : scenario_catalog()) {
    for (const std::uint64_t seed : {1u, 2u, 3u}) {
      const scenario s = short_scenario(info.name, seed);
      for (const auto& policy : bounded_policies) {
        CAPTURE(info.name);
        CAPTURE(seed);
        CAPTURE(policy.config);
        run_metrics m;
        if (s.workers.size() <= 64) {  // check every event; large1000 relies on the metrics
          checked<any_controller> c(make_controller(policy.config, s.workers.size()), policy.bound);
          m = simulate(c, s);
        } else {
          m = simulate(policy.config, s);
        }
        CHECK(m.iterations > 0);
        CHECK(m.max_start_staleness <= policy.bound);
        CHECK(histogram_quantile(m.start_staleness_histogram, 0.99) <= static_cast<std::size_t>(policy.bound));
        CHECK(m.start_staleness_histogram.size() <= static_cast<std::size_t>(policy.bound) + 1);
        for (const auto& w : m.per_worker) CHECK(w.max_start_staleness <= policy.bound);
        CHECK(m.wait_fraction >= 0.0);
        CHECK(m.wait_fraction < 1.0);
      }
    }
  }
}

TEST_CASE("asp never waits on any scenario and its staleness is unbounded by design" *
          doctest::timeout(60)) {
  for (const auto& info : scenario_catalog()) {
    CAPTURE(info.name);
    const run_metrics m = simulate("asp", short_scenario(info.name));
    CHECK(m.wait_seconds == 0.0);
    CHECK(m.wait_fraction == 0.0);
    CHECK(m.release_events == 0);
    CHECK_FALSE(m.barriers.has_value());
    for (const auto& w : m.per_worker) CHECK(w.waits == 0);
  }
  CHECK(simulate("asp", short_scenario("hetero2")).max_start_staleness > 50);
}

TEST_CASE("bsp's throughput is exactly one barrier per slowest iteration on constant times") {
  const scenario s = constant_scenario();
  const double period = 0.25 + s.push_seconds + s.pull_seconds;  // the slowest worker's cycle
  // Worker p's k-th push (k >= 1) arrives at (k - 1) * period + d_p + push.
  std::uint64_t expected = 0;
  for (const auto& w : s.workers)
    expected += static_cast<std::uint64_t>(std::floor((s.seconds - w.iteration_seconds - s.push_seconds) / period)) + 1;
  const run_metrics m = simulate("bsp", s);
  CHECK(m.iterations == expected);
  CHECK(m.iterations_per_second == doctest::Approx(static_cast<double>(expected) / s.seconds));
  CHECK(m.iterations_per_second == doctest::Approx(5 / period).epsilon(0.01));
  // One global barrier per round: the last arrival releases the other four. BSP does not count
  // barriers itself; the simulator reports them as release events, not as `barriers`.
  CHECK_FALSE(m.barriers.has_value());
  CHECK(m.release_events == static_cast<std::uint64_t>(std::floor((s.seconds - 0.25 - s.push_seconds) / period)) + 1);
  CHECK(m.max_start_staleness == 0);
  CHECK(m.start_staleness_histogram.size() == 1);
  // Everyone computes on the same weights and the server applies the round's five gradients one
  // by one, so the last to arrive is four updates behind.
  CHECK(m.max_updates_behind == 4);
  // The slowest workers never wait; the others idle for their difference every round.
  CHECK(m.per_worker[0].wait_seconds == 0.0);
  CHECK(m.per_worker[4].wait_seconds == doctest::Approx(static_cast<double>(m.per_worker[4].iterations) * (0.25 - 0.09375)).epsilon(0.01));
}

TEST_CASE("asp's throughput is the sum of the workers' own rates on constant times") {
  const scenario s = constant_scenario();
  std::uint64_t expected = 0;
  for (const auto& w : s.workers) {
    const double cycle = w.iteration_seconds + s.push_seconds + s.pull_seconds;
    expected += static_cast<std::uint64_t>(std::floor((s.seconds - w.iteration_seconds - s.push_seconds) / cycle)) + 1;
  }
  CHECK(simulate("asp", s).iterations == expected);
}

namespace {

// Four workers that compute alike (0.125 s, no jitter) on 1/128 s links, but worker 3's own
// link is 10 times slower (10/128 s each way): a network straggler, at 0.28125 s per
// iteration against the others' 0.140625 s. Binary fractions, so the hand counts are exact.
scenario slow_link_scenario() {
  scenario s = steady_scenario("slow_link", {0.125, 0.125, 0.125, 0.125}, 1.0 / 128, 1.0 / 128, 64);
  s.workers[3].push_seconds = s.workers[3].pull_seconds = 10.0 / 128;
  return s;
}

}  // namespace

TEST_CASE("a worker on a slow link costs asp only its own iterations") {
  const scenario s = slow_link_scenario();
  // Each worker on its own: pushes arrive at d + push + k * (d + push + pull).
  std::uint64_t expected = 0;
  for (std::size_t p = 0; p < s.workers.size(); ++p) {
    const double d = s.workers[p].iteration_seconds;
    const double cycle = d + push_seconds_of(s, p) + pull_seconds_of(s, p);
    expected += static_cast<std::uint64_t>(std::floor((s.seconds - d - push_seconds_of(s, p)) / cycle)) + 1;
  }
  const run_metrics m = simulate("asp", s);
  CHECK(m.iterations == expected);
  // 3 x 1 / 0.140625 + 1 / 0.28125 = 24.9 it/s, against 4 / 0.140625 = 28.4 without it.
  CHECK(m.iterations_per_second == doctest::Approx(3 / 0.140625 + 1 / 0.28125).epsilon(0.005));
  CHECK(m.per_worker[3].iterations * 2 == doctest::Approx(static_cast<double>(m.per_worker[0].iterations)).epsilon(0.01));
  CHECK(m.wait_seconds == 0.0);
}

TEST_CASE("a worker on a slow link holds bsp and ssp to its pace, and its own wait is about 0") {
  const scenario s = slow_link_scenario();
  const double slow = 0.125 + 20.0 / 128, fast = 0.125 + 2.0 / 128;
  for (const std::string policy : {"bsp", "ssp:3"}) {
    CAPTURE(policy);
    const run_metrics m = simulate(policy, s);
    // Every worker at the straggler's pace: 4 / 0.28125 = 14.2 it/s (the fast workers could
    // make 28.4 together with it at 24.9 under asp).
    CHECK(m.iterations_per_second == doctest::Approx(4 / slow).epsilon(0.01));
    CHECK(m.per_worker[0].iterations <= m.per_worker[3].iterations + 4);
    // The fast workers idle for the difference at each wait (under ssp:3 all but a few of
    // their iterations; the first and last waits are a little shorter); the straggler never.
    CHECK(m.per_worker[0].wait_seconds ==
          doctest::Approx(static_cast<double>(m.per_worker[0].waits) * (slow - fast)).epsilon(0.01));
    CHECK(m.per_worker[3].wait_seconds < 0.01 * s.seconds);
  }
  // Without its own link worker 3 is no straggler: the scenario's cost for everyone.
  scenario even = s;
  even.workers[3].push_seconds.reset();
  even.workers[3].pull_seconds.reset();
  CHECK(simulate("ssp:3", even).iterations_per_second == doctest::Approx(4 / fast).epsilon(0.01));
}

TEST_CASE("a worker's own link replaces the scenario's cost, one direction at a time") {
  scenario s = slow_link_scenario();
  s.workers[3].pull_seconds.reset();  // its push is slow, its pull the scenario's
  s.push_seconds = 2.0 / 128;         // changes the others' push, not worker 3's own
  CHECK(push_seconds_of(s, 3) == 10.0 / 128);
  CHECK(pull_seconds_of(s, 3) == 1.0 / 128);
  CHECK(push_seconds_of(s, 0) == 2.0 / 128);
  model_source source(s);
  iteration_costs k;
  REQUIRE(source.next(3, 0.0, k));
  CHECK(k.compute == 0.125);
  CHECK(k.push == 10.0 / 128);
  CHECK(k.pull == 1.0 / 128);
  REQUIRE(source.next(1, 0.0, k));
  CHECK(k.push == 2.0 / 128);
}

TEST_CASE("an iteration-limited run stops at iterations * workers pushes") {
  const run_metrics m = simulate("bsp", test::iteration_limited(constant_scenario(), 40));
  CHECK(m.iterations == 200);
  // 40 rounds of the slowest cycle; the run ends at the 200th push, before the last pull.
  CHECK(m.simulated_seconds == doctest::Approx(40 * (0.25 + 0.0625 + 0.03125) - 0.03125));
}

TEST_CASE("the same seed gives the same run and another seed a different one") {
  for (const char* name : {"hetero16", "stragglers64", "failure8"}) {
    CAPTURE(name);
    for (const char* policy : {"bsp", "ssp:3", "dssp:3:15"}) {
      CAPTURE(policy);
      const run_metrics a = simulate(policy, short_scenario(name, 7));
      const run_metrics b = simulate(policy, short_scenario(name, 7));
      const run_metrics c = simulate(policy, short_scenario(name, 8));
      CHECK(same_outcome(a, b));
      CHECK_FALSE(same_outcome(a, c));
    }
  }
}

TEST_CASE("a concrete controller and any_controller give the same run") {
  const scenario s = short_scenario("hetero16");
  ssp direct(s.workers.size(), 3);
  const run_metrics a = simulate(direct, s);
  const run_metrics b = simulate("ssp:3", s);
  CHECK(same_outcome(a, b));
  CHECK(a.policy == "ssp:3");
}

TEST_CASE("a dead worker is removed and does not hang the run" * doctest::timeout(30)) {
  const scenario s = short_scenario("failure8");  // worker 4 dies at 60 s, removed at 62 s
  for (const char* policy : {"bsp", "asp", "ssp:3", "dssp:3:15"}) {
    CAPTURE(policy);
    const run_metrics m = simulate(policy, s);
    CHECK(m.removed_workers == 1);
    CHECK(m.per_worker[4].failed);
    CHECK(m.per_worker[4].alive_seconds == 60.0);
    CHECK(m.per_worker[4].iterations < m.per_worker[0].iterations);
    // The survivors keep going after the removal: about 8 iterations/s each for 18 more seconds.
    for (std::size_t p = 0; p < 8; ++p)
      if (p != 4) CHECK(m.per_worker[p].iterations > 600);
  }
}

TEST_CASE("a worker that dies while the others wait at a bsp barrier releases them on removal") {
  scenario s = constant_scenario();
  s.failure_detection_seconds = 1.0;
  s.workers[0].fails_at = 10.0;  // a slowest worker: the others wait for it
  const run_metrics m = simulate("bsp", s);
  CHECK(m.removed_workers == 1);
  CHECK(m.per_worker[1].iterations > 100);
  // With zero detection delay the removal happens at the death itself.
  s.failure_detection_seconds = 0;
  CHECK(simulate("bsp", s).removed_workers == 1);
}

TEST_CASE("a policy that leaves everyone waiting is reported as a deadlock, not a hang" *
          doctest::timeout(10)) {
  scenario s = constant_scenario();
  never_release c(s.workers.size());
  CHECK_THROWS_AS(simulate(c, s), deadlock_error);
}

TEST_CASE("a controller of the wrong size or a bad scenario is an invalid_parameter_error") {
  scenario s = constant_scenario();
  ssp c(3, 1);
  CHECK_THROWS_AS(simulate(c, s), invalid_parameter_error);
  s.push_seconds = -1;
  CHECK_THROWS_AS(simulate("bsp", s), invalid_parameter_error);
  CHECK_THROWS_AS(simulate("bogus", constant_scenario()), parse_error);
}

TEST_CASE("policies without barriers of their own report release events and no barriers") {
  for (const char* policy : {"bsp", "ssp:3", "dssp:3:15"}) {
    CAPTURE(policy);
    const run_metrics m = simulate(policy, short_scenario("hetero16"));
    CHECK_FALSE(m.barriers.has_value());
    CHECK(m.release_events > 0);
    CHECK(m.superstep_iterations_max == 0);
    CHECK(m.superstep_planned_max == 0);
  }
}

TEST_CASE("updates behind counts the pushes applied between a worker's go-ahead and its push") {
  SUBCASE("asp: a push that lands while a worker pulls is not in the weights it computes on") {
    // Worker 0 (0.25 s) pushes at 0.3125, 0.71875, 1.125; worker 1 (0.28125 s) at 0.34375,
    // 0.78125, 1.21875 (each cycle: compute, 0.0625 push, 0.09375 pull). Worker 0's go-ahead
    // at 0.3125 comes before worker 1's push at 0.34375, inside its pull: so its push at 0.71875
    // is 1 behind. In order, pushes applied before each arrival minus those at the pull:
    // 0-0, 1-0, 2-1, 3-2, 4-3, 5-4.
    const run_metrics m = simulate("asp", two_worker_scenario(0.28125));
    REQUIRE(m.iterations == 6);
    CHECK(m.updates_behind_histogram == std::vector<std::uint64_t>{1, 5});
    CHECK(m.max_updates_behind == 1);
    CHECK(m.mean_updates_behind == doctest::Approx(5.0 / 6.0));
    CHECK(m.per_worker[0].max_updates_behind == 1);
    CHECK(m.per_worker[1].max_updates_behind == 1);
  }
  SUBCASE("asp: a slow worker is behind every push made while it computed") {
    // Worker 1 (0.875 s) pushes once, at 0.9375, after worker 0's pushes at 0.3125 and 0.71875:
    // 2 behind. Worker 0 is 0 behind at 0.3125 and 0.71875 and 1 behind at 1.125.
    const run_metrics m = simulate("asp", two_worker_scenario(0.875));
    REQUIRE(m.iterations == 4);
    CHECK(m.updates_behind_histogram == std::vector<std::uint64_t>{2, 1, 1});
    CHECK(m.per_worker[0].max_updates_behind == 1);
    CHECK(m.per_worker[1].max_updates_behind == 2);
    CHECK(m.mean_updates_behind == doctest::Approx(3.0 / 4.0));
  }
  SUBCASE("bsp: released workers pull weights that include the push that released them") {
    // Three workers (0.25, 0.125, 0.1875 s; 0.0625 s push and pull) start every round together
    // and arrive fastest first: 0, 1 and 2 behind. Rounds end at 0.3125, 0.6875 and 1.0625; by
    // the 1.03125 s horizon the third round has two pushes (0.9375 and 1.0).
    scenario s = constant_scenario();
    s.workers.resize(3);
    s.pull_seconds = 0.0625;
    s.seconds = 1.03125;
    const run_metrics m = simulate("bsp", s);
    REQUIRE(m.iterations == 8);
    CHECK(m.updates_behind_histogram == std::vector<std::uint64_t>{3, 3, 2});
    CHECK(m.per_worker[1].max_updates_behind == 0);
    CHECK(m.per_worker[0].max_updates_behind == 2);
    // Every start is at gap 0: three at t = 0 and three after each of the two full rounds.
    CHECK(m.start_staleness_histogram == std::vector<std::uint64_t>{9});
  }
}

TEST_CASE("wait time, alive time and throughput add up") {
  const run_metrics m = simulate("ssp:1", short_scenario("hetero16"));
  double wait = 0, alive = 0;
  std::uint64_t iterations = 0;
  for (const auto& w : m.per_worker) {
    wait += w.wait_seconds;
    alive += w.alive_seconds;
    iterations += w.iterations;
    CHECK(w.wait_seconds + w.compute_seconds <= w.alive_seconds + 1e-9);
  }
  CHECK(wait == doctest::Approx(m.wait_seconds));
  CHECK(m.wait_fraction == doctest::Approx(wait / alive));
  CHECK(iterations == m.iterations);
  CHECK(m.iterations_per_second == doctest::Approx(static_cast<double>(m.iterations) / 30.0));
  CHECK(m.controller_ns_per_push > 0);
}
