#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/predict/interval.hpp>
#include <cadence/zipline/brute_force.hpp>

#include "support/schedule.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <vector>

using namespace cadence;

namespace {

// Workers with constant iteration times, pushed in time order (an event queue), waiting when
// told to and resuming at the time they are released.
struct regular_cluster {
  std::vector<double> interval, next;
  explicit regular_cluster(std::vector<double> intervals, std::vector<double> offsets)
      : interval(std::move(intervals)), next(std::move(offsets)) {}

  // Next worker to push among those not waiting (earliest next push; ties to the lower id).
  template <class C>
  worker_id earliest(const C& c) const {
    worker_id best = static_cast<worker_id>(-1);
    for (worker_id p = 0; p < next.size(); ++p) {
      if (!c.is_active(p) || c.is_waiting(p)) continue;
      if (best == static_cast<worker_id>(-1) || next[p] < next[best]) best = p;
    }
    return best;
  }

  template <class C>
  decision step(C& c) {
    const worker_id p = earliest(c);
    REQUIRE(p != static_cast<worker_id>(-1));
    const double t = next[p];
    const decision d = c.push(p, t);
    next[p] = t + interval[p];
    for (worker_id q : d.released) next[q] = t + interval[q];
    return d;
  }
};

}  // namespace

TEST_CASE("with perfectly regular workers the barrier falls where the brute-force optimum says") {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> iv(1.0, 1.5), off(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 2 + static_cast<std::size_t>(trial) % 7;
    const std::size_t r = 1 + static_cast<std::size_t>(trial) % 20;
    std::vector<double> intervals(n), offsets(n);
    for (std::size_t p = 0; p < n; ++p) {
      intervals[p] = std::round(iv(rng) * 64) / 64;  // exact binary fractions: exact predictions
      offsets[p] = std::round(off(rng) * 64) / 64;
    }
    elastic_bsp c(n, r);
    regular_cluster cluster(intervals, offsets);
    std::vector<double> last(n, 0.0);
    while (c.is_monitoring()) {
      const worker_id p = cluster.earliest(c);
      last[p] = cluster.next[p];
      cluster.step(c);
    }
    // The oracle: each worker's next r pushes continue its regular rhythm.
    std::vector<double> rows(n * r);
    for (std::size_t p = 0; p < n; ++p)
      for (std::size_t i = 0; i < r; ++i) rows[p * r + i] = last[p] + static_cast<double>(i + 1) * intervals[p];
    const auto best = zipline_brute_force(rows_view<double>::matrix(rows.data(), n, r));
    const elastic_plan plan = c.plan();
    REQUIRE(plan.planned);
    CHECK(plan.barrier == best.barrier);
    CHECK(plan.spread == best.spread);
    for (std::size_t p = 0; p < n; ++p) CHECK(plan.remaining[p] == static_cast<clock_value>(best.choice[p] + 1));
    // Run the superstep: every worker waits exactly at its planned push, the last releases all.
    const std::size_t before = c.barriers();
    while (c.barriers() == before) cluster.step(c);
    for (std::size_t p = 0; p < n; ++p)
      CHECK(c.last_superstep_iterations()[p] >= best.choice[p] + 1 + 2);
  }
}

TEST_CASE("elastic_bsp bounds the work between barriers by the monitoring pushes plus R") {
  for (std::uint64_t seed = 0; seed < 300; ++seed) {
    const std::size_t r = 1 + seed % 30;
    const test::schedule_options opt{/*workers=*/2 + seed % 9, /*events=*/600,
                                     /*remove_probability=*/seed % 3 == 0 ? 0.01 : 0.0,
                                     /*add_probability=*/seed % 4 == 0 ? 0.01 : 0.0,
                                     /*equal_times=*/seed % 5 == 0};
    elastic_bsp c(opt.workers, r);
    std::vector<std::size_t> monitoring, running;
    std::size_t barriers = 0;
    std::mt19937_64 rng(seed);
    // Count each worker's pushes per phase; the counts restart when a superstep ends.
    std::vector<clock_value> clocks;
    auto snapshot = [&](const elastic_bsp& cc) {
      clocks.assign(cc.worker_capacity(), -1);
      for (worker_id p = 0; p < cc.worker_capacity(); ++p)
        if (cc.is_active(p)) clocks[p] = cc.clock(p);
    };
    bool was_monitoring = true;
    std::vector<clock_value> planned;  // per worker: its j_p in the plan in force, -1 if none
    snapshot(c);
    const bool live = test::run_random_schedule(c, rng, opt, [&](const elastic_bsp& cc, std::size_t) {
      monitoring.resize(cc.worker_capacity(), 0);
      running.resize(cc.worker_capacity(), 0);
      for (worker_id p = 0; p < cc.worker_capacity(); ++p) {
        if (!cc.is_active(p) || p >= clocks.size() || clocks[p] < 0 || cc.clock(p) == clocks[p]) continue;
        (was_monitoring ? monitoring : running)[p] += static_cast<std::size_t>(cc.clock(p) - clocks[p]);
        // A worker that joined mid-superstep runs freely until the next monitoring phase.
        if (!was_monitoring && p < planned.size() && planned[p] >= 0) {
          REQUIRE_MESSAGE(running[p] <= r, "worker ", p, " ran ", running[p], " > R = ", r);
          REQUIRE(running[p] <= static_cast<std::size_t>(planned[p]));
        }
      }
      if (cc.barriers() + cc.fallbacks() != barriers) {
        barriers = cc.barriers() + cc.fallbacks();
        std::fill(monitoring.begin(), monitoring.end(), 0);
        std::fill(running.begin(), running.end(), 0);
      }
      if (!cc.is_monitoring() && was_monitoring) {
        planned = cc.plan().remaining;  // a fresh plan: j_p in [1, R] for each participant
        for (const clock_value j : planned) CHECK(j <= static_cast<clock_value>(r));
      }
      was_monitoring = cc.is_monitoring();
      snapshot(cc);
      test::check_staleness_and_progress(cc, unbounded_staleness, cc.worker_capacity());
    });
    REQUIRE(live);
    // Every barrier is eventually completed when the slow workers keep pushing.
    test::drain_by_pushing_slowest(c, c.worker_capacity(), 1e9, 100000);
    CHECK(c.waiting_count() == 0);
  }
}

TEST_CASE("removing a worker while others wait completes the barrier") {
  elastic_bsp c(3, 4);
  regular_cluster cluster({1.0, 1.0, 3.0}, {0.0, 0.1, 0.2});
  while (c.is_monitoring()) cluster.step(c);
  // Run until at least one worker waits at the barrier.
  while (c.waiting_count() == 0) cluster.step(c);
  const std::size_t waiting = c.waiting_count();
  std::vector<worker_id> not_arrived;
  for (worker_id p = 0; p < 3; ++p)
    if (!c.is_waiting(p)) not_arrived.push_back(p);
  REQUIRE(not_arrived.size() == 3 - waiting);
  // Remove every worker that has not arrived: the barrier completes without them.
  std::size_t released = 0;
  for (worker_id p : not_arrived) released += c.remove_worker(p).size();
  CHECK(released == waiting);
  CHECK(c.waiting_count() == 0);
  CHECK(c.barriers() == 1);
  CHECK(c.is_monitoring());
}

TEST_CASE("a worker that joins mid-superstep runs freely and takes part from the next monitoring phase") {
  elastic_bsp c(2, 3);
  regular_cluster cluster({1.0, 2.0, 1.0}, {0.0, 0.5, 1e9});
  while (c.is_monitoring()) cluster.step(c);
  const worker_id joiner = c.add_worker();
  CHECK(joiner == 2);
  CHECK(c.plan().remaining[joiner] == -1);
  cluster.next[joiner] = cluster.next[0];
  // The joiner never waits in this superstep.
  const std::size_t before = c.barriers();
  while (c.barriers() == before) {
    cluster.step(c);
    CHECK_FALSE(c.is_waiting(joiner));
  }
  // The next plan includes it.
  while (c.is_monitoring()) cluster.step(c);
  CHECK(c.plan().remaining[joiner] >= 1);
}

TEST_CASE("workers that join an emptied cluster take part in its next barrier") {
  elastic_bsp c(2, 3);
  c.remove_worker(0);
  c.remove_worker(1);
  const worker_id a = c.add_worker(), b = c.add_worker();
  CHECK(c.is_monitoring());
  regular_cluster cluster({1.0, 1.0, 1.0, 1.5}, {0.0, 0.0, 0.1, 0.2});
  for (int step = 0; step < 1000 && c.barriers() == 0; ++step) cluster.step(c);
  REQUIRE(c.barriers() == 1);
  CHECK(c.last_superstep_iterations()[a] >= 3);
  CHECK(c.last_superstep_iterations()[b] >= 3);
}

TEST_CASE("elastic_bsp with one worker never plans a barrier and never waits") {
  elastic_bsp c(1, 5);
  for (int i = 1; i <= 20; ++i) CHECK(c.push(0, i).proceed);
  CHECK(c.barriers() == 0);
  CHECK(c.fallbacks() == 10);
}

TEST_CASE("elastic_bsp accepts any predictor type and reports its config") {
  basic_elastic_bsp<median_interval> c(4, 15, median_interval(5), zipline_variant::paper_opt_bs);
  CHECK(c.config() == "elastic:15:median:5:opt-bs");
  static_assert(is_synchronization_controller_v<basic_elastic_bsp<median_interval>>);
  static_assert(is_synchronization_controller_v<elastic_bsp>);
  for (const char* config : {"elastic:15:last:fast", "elastic:60:mean:4:zipline", "elastic:1:ewma:0.5:opt"}) {
    CAPTURE(config);
    CHECK(make_controller(config, 3).config() == config);
  }
  CHECK(make_controller("elastic:15", 3).config() == "elastic:15:last:fast");
  CHECK(make_controller("elastic:15:opt-bs", 3).config() == "elastic:15:last:opt-bs");
  CHECK(make_controller("elastic:15:median:3", 3).config() == "elastic:15:median:3:fast");
}

TEST_CASE("elastic_bsp rejects bad parameters") {
  CHECK_THROWS_WITH(elastic_bsp(2, 0), doctest::Contains("lookahead R must be >= 1"));
  CHECK_THROWS_AS(make_controller("elastic:0", 2), invalid_parameter_error);
  CHECK_THROWS_WITH(make_controller("elastic", 2), doctest::Contains("elastic:<R>"));
  CHECK_THROWS_WITH(make_controller("elastic:15:mean", 2), doctest::Contains("needs a value"));
  CHECK_THROWS_WITH(make_controller("elastic:15:fastest", 2), doctest::Contains("unknown ZipLine variant 'fastest'"));
  CHECK_THROWS_WITH(make_controller("elastic:15:fast:x", 2), doctest::Contains("unexpected field 'x'"));
  CHECK_THROWS_AS(make_controller("elastic:15:mean:0", 2), invalid_parameter_error);
  elastic_bsp c(2, 3);
  CHECK_THROWS_WITH(c.push(2, 1.0), doctest::Contains("cadence::elastic_bsp: push: unknown worker 2"));
}

TEST_CASE("elastic_bsp bounds R, history and their products with the workers where it accepts them") {
  CHECK(elastic_bsp(2, elastic_bsp::max_lookahead).lookahead() == elastic_bsp::max_lookahead);
  CHECK_THROWS_WITH_AS(elastic_bsp(2, elastic_bsp::max_lookahead + 1),
                       "cadence::elastic_bsp: lookahead R = 65537 exceeds "
                       "elastic_bsp::max_lookahead = 65536",
                       invalid_parameter_error);
  CHECK_THROWS_WITH_AS(elastic_bsp(257, elastic_bsp::max_lookahead),
                       "cadence::elastic_bsp: workers x lookahead R (257 x 65536) = 16842752 "
                       "exceeds elastic_bsp::max_plan_points = 16777216",
                       invalid_parameter_error);
  CHECK_NOTHROW(elastic_bsp(2, 15, {}, zipline_variant::fast, max_history));
  CHECK_THROWS_WITH_AS(elastic_bsp(2, 15, {}, zipline_variant::fast, max_history + 1),
                       "cadence::elastic_bsp: history = 1025 exceeds cadence::max_history = 1024",
                       invalid_parameter_error);
  CHECK_THROWS_WITH_AS(elastic_bsp(16385, 1, {}, zipline_variant::fast, max_history),
                       "cadence::elastic_bsp: workers x history (16385 x 1024) = 16778240 exceeds "
                       "cadence::max_history_entries = 16777216",
                       invalid_parameter_error);
}

namespace {

using failing_elastic = basic_elastic_bsp<test::failing_predictor>;

void require_same_elastic(const failing_elastic& a, const failing_elastic& b) {
  test::require_same_state(a, b);
  REQUIRE(a.barriers() == b.barriers());
  REQUIRE(a.fallbacks() == b.fallbacks());
  REQUIRE(a.is_monitoring() == b.is_monitoring());
  REQUIRE(a.last_superstep_iterations() == b.last_superstep_iterations());
  REQUIRE(a.max_superstep_iterations() == b.max_superstep_iterations());
  const elastic_plan pa = a.plan(), pb = b.plan();
  REQUIRE(pa.planned == pb.planned);
  REQUIRE(pa.remaining == pb.remaining);
  if (pa.planned) {
    REQUIRE(pa.barrier == pb.barrier);
    REQUIRE(pa.spread == pb.spread);
    REQUIRE(pa.planned_at == pb.planned_at);
  }
}

}  // namespace

TEST_CASE("a push or removal that throws, from bad input or from planning, leaves an elastic_bsp as it was") {
  using failure = test::failing_predictor::failure;
  std::size_t push_throws = 0, remove_throws = 0;
  test::failing_predictor_schedules(
      [](std::size_t workers, std::uint64_t seed, test::failing_predictor p) {
        return failing_elastic(workers, 1 + seed % 6, p);
      },
      require_same_elastic,
      [&](const failing_elastic& cc, failure& fail, double t, std::uint64_t replay_seed) {
        // Every push and removal with planning failing: those that would plan (the last
        // monitoring push; a removal that leaves everyone ready) must throw and change nothing.
        for (worker_id q = 0; q < cc.worker_capacity(); ++q) {
          if (!cc.is_active(q)) continue;
          remove_throws += test::throw_changes_nothing<test::predictor_failure>(
              cc, [&](failing_elastic& x) { test::scoped_failure f(fail, failure::error); x.remove_worker(q); },
              require_same_elastic, replay_seed);
          if (cc.is_waiting(q)) continue;
          push_throws += test::failing_pushes_change_nothing(cc, fail, q, t, require_same_elastic, replay_seed);
        }
      });
  CHECK(push_throws > 20);
  CHECK(remove_throws > 5);
}

namespace {

// last_interval that also logs every history it is handed, so a test can compare what the
// flat push ring returns with each worker's real pushes.
struct logging_predictor {
  std::shared_ptr<std::vector<std::vector<double>>> log =
      std::make_shared<std::vector<std::vector<double>>>();
  void predict(span<const double> h, std::size_t r, double* out) const {
    log->emplace_back(h.begin(), h.end());
    last_interval{}.predict(h, r, out);
  }
  static constexpr std::size_t min_history() noexcept { return 2; }
  std::string name() const { return "logging"; }
};

}  // namespace

TEST_CASE("the flat push ring hands the predictor each worker's latest pushes across joins, departures and growth") {
  for (const std::size_t history : {2u, 3u, 5u}) {
    CAPTURE(history);
    logging_predictor pred;
    basic_elastic_bsp<logging_predictor> c(3, 4, pred, zipline_variant::fast, history);
    std::mt19937_64 rng(history);
    std::vector<std::vector<double>> pushes(3);  // every push of every worker, in order
    std::vector<double> speed{1.0, 1.3, 0.7};
    double t = 0;
    std::size_t wrapped = 0, plans = 0;
    for (int e = 0; e < 3000; ++e) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      if (u < 0.01 && c.active_workers() > 2) {  // a departure
        std::vector<worker_id> active;
        for (worker_id q = 0; q < c.worker_capacity(); ++q)
          if (c.is_active(q)) active.push_back(q);
        c.remove_worker(active[rng() % active.size()]);
        continue;
      }
      if (u < 0.02 && c.worker_capacity() < 40) {  // a join: the flat buffers grow
        CHECK(c.add_worker() == pushes.size());
        pushes.emplace_back();
        speed.push_back(0.5 + static_cast<double>(rng() % 100) / 100.0);
        continue;
      }
      std::vector<worker_id> running;
      for (worker_id q = 0; q < c.worker_capacity(); ++q)
        if (c.is_active(q) && !c.is_waiting(q)) running.push_back(q);
      REQUIRE_FALSE(running.empty());
      const worker_id p = running[rng() % running.size()];
      t += 0.01 + speed[p] * std::uniform_real_distribution<double>(0, 1)(rng);
      pred.log->clear();
      const bool was_monitoring = c.is_monitoring();
      c.push(p, t);
      pushes[p].push_back(t);
      if (!was_monitoring || c.is_monitoring() || pred.log->empty()) continue;
      // A plan was made: one history per participant, in ascending id order, each a suffix of
      // that worker's pushes ending with its latest.
      ++plans;
      const elastic_plan plan = c.plan();
      std::size_t k = 0;
      for (worker_id q = 0; q < plan.remaining.size(); ++q) {
        if (plan.remaining[q] < 0) continue;
        REQUIRE(k < pred.log->size());
        const std::vector<double>& h = (*pred.log)[k++];
        REQUIRE(h.size() >= 2);
        REQUIRE(h.size() <= history);
        REQUIRE(h.size() <= pushes[q].size());
        CHECK(std::equal(h.begin(), h.end(), pushes[q].end() - static_cast<std::ptrdiff_t>(h.size())));
        if (h.size() == history) ++wrapped;
      }
      CHECK(k == pred.log->size());
    }
    CHECK(plans > 20);
    CHECK(wrapped > 0);
    CHECK(c.worker_capacity() > 10);
  }
}

TEST_CASE("elastic_bsp keeps at most 64 bytes of state per worker besides its push history and planning") {
  for (const std::size_t n : {1u, 100u, 5000u}) {
    elastic_bsp c(n, 15);
    const std::size_t history_bytes = 16 * sizeof(double) * n;
    const std::size_t state = c.bytes_reserved() - c.planning_bytes_reserved() - history_bytes;
    CHECK(state <= 64 * n + 1024);  // plus the clock ring's buckets
    CHECK(c.planning_bytes_reserved() >= 15 * sizeof(double) * n);
  }
}
