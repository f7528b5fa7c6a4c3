#include <cadence/controllers/ssp.hpp>

#include "support/trials.hpp"
#include "support/schedule.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

using namespace cadence;
using test::sorted;
using test::require_same_decisions;

namespace {

// The definition, computed the slow way: scan every worker on every event.
class naive_ssp {
public:
  naive_ssp(std::size_t n, clock_value s) : s_(s), clock_(n, 0), state_(n, 0) {}
  decision push(worker_id p, timestamp) {
    released_.clear();
    ++clock_[p];
    release_eligible();
    const bool proceed = clock_[p] - min_clock() <= s_;
    if (!proceed) state_[p] = 1;
    return {proceed, released_};
  }
  span<const worker_id> remove_worker(worker_id p) {
    released_.clear();
    state_[p] = 2;
    release_eligible();
    return released_;
  }
  worker_id add_worker() {
    const clock_value m = min_clock();
    clock_.push_back(m);
    state_.push_back(0);
    return static_cast<worker_id>(clock_.size() - 1);
  }
  std::size_t worker_capacity() const { return clock_.size(); }
  bool is_active(worker_id p) const { return p < state_.size() && state_[p] != 2; }
  bool is_waiting(worker_id p) const { return state_[p] == 1; }
  clock_value clock(worker_id p) const { return clock_[p]; }
  clock_value min_clock() const {
    clock_value m = -1;
    for (std::size_t p = 0; p < clock_.size(); ++p)
      if (state_[p] != 2 && (m < 0 || clock_[p] < m)) m = clock_[p];
    return m < 0 ? 0 : m;
  }

private:
  void release_eligible() {
    const clock_value m = min_clock();
    for (worker_id q = 0; q < clock_.size(); ++q)
      if (state_[q] == 1 && clock_[q] - m <= s_) {
        state_[q] = 0;
        released_.push_back(q);
      }
  }
  clock_value s_;
  std::vector<clock_value> clock_;
  std::vector<int> state_;
  std::vector<worker_id> released_;
};

}  // namespace

TEST_CASE("ssp never lets a worker run more than s clocks ahead of the slowest") {
  for (clock_value s : {0, 1, 3, 7}) {
    for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(300); ++seed) {
      std::mt19937_64 rng(seed);
      const test::schedule_options opt{/*workers=*/2 + seed % 9, /*events=*/300,
                                       /*remove_probability=*/seed % 3 == 0 ? 0.02 : 0.0,
                                       /*add_probability=*/seed % 5 == 0 ? 0.02 : 0.0,
                                       /*equal_times=*/seed % 2 == 0};
      ssp c(opt.workers, s);
      const bool live = test::run_random_schedule(c, rng, opt, [&](const ssp& cc, std::size_t) {
        test::check_staleness_and_progress(cc, s, cc.worker_capacity());
        CHECK(cc.max_staleness() <= s + 1);  // a waiter is at most one push past the bound
      });
      REQUIRE(live);
      test::drain_by_pushing_slowest(c, c.worker_capacity(), 1e9, 100000);
    }
  }
}

TEST_CASE("ssp decides exactly like the scan-everything definition") {
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(400); ++seed) {
    const clock_value s = static_cast<clock_value>(seed % 5);
    const test::schedule_options opt{/*workers=*/1 + seed % 12, /*events=*/250,
                                     /*remove_probability=*/0.03, /*add_probability=*/0.03};
    ssp fast(opt.workers, s);
    naive_ssp slow(opt.workers, s);
    require_same_decisions(fast, slow, seed, opt);
  }
}

TEST_CASE("bsp decides exactly like ssp(0) and asp like ssp with a huge bound") {
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(200); ++seed) {
    const test::schedule_options opt{/*workers=*/1 + seed % 10, /*events=*/300,
                                     /*remove_probability=*/seed % 2 ? 0.02 : 0.0,
                                     /*add_probability=*/seed % 3 ? 0.02 : 0.0};
    SUBCASE("bsp") {
      bsp a(opt.workers);
      ssp b(opt.workers, 0);
      require_same_decisions(a, b, seed, opt);
    }
    SUBCASE("asp") {
      asp a(opt.workers);
      ssp b(opt.workers, 1'000'000'000);
      require_same_decisions(a, b, seed, opt);
    }
  }
}

TEST_CASE("bsp is a barrier: the last arrival releases everyone at once") {
  bsp c(3);
  CHECK_FALSE(c.push(0, 1.0).proceed);
  CHECK_FALSE(c.push(2, 1.5).proceed);
  CHECK(c.waiting_for(0) == std::vector<worker_id>{1});
  const decision d = c.push(1, 2.0);
  CHECK(d.proceed);
  CHECK(sorted(d.released) == std::vector<worker_id>{0, 2});
  CHECK(c.waiting_count() == 0);
  CHECK(c.config() == "bsp");
}

TEST_CASE("asp never waits and still reports staleness") {
  asp c(2);
  for (int i = 0; i < 1000; ++i) CHECK(c.push(0, i).proceed);
  CHECK(c.staleness(0) == 1000);
  CHECK(c.max_staleness() == 1000);
  CHECK(c.min_clock() == 0);
  CHECK(c.config() == "asp");
  CHECK(c.staleness_bound() == unbounded_staleness);
}

TEST_CASE("removing the straggler releases the workers that waited only for it") {
  ssp c(3, 1);
  CHECK(c.push(0, 1).proceed);
  CHECK(c.push(1, 1).proceed);
  CHECK(c.push(0, 2).proceed == false);  // clock 2, slowest (2) at 0
  CHECK(c.push(1, 2).proceed == false);
  CHECK(c.waiting_for(0) == std::vector<worker_id>{2});
  const auto released = c.remove_worker(2);
  CHECK(sorted(released) == std::vector<worker_id>{0, 1});
  CHECK_FALSE(c.is_active(2));
  CHECK(c.active_workers() == 2);
  CHECK(c.min_clock() == 2);
}

TEST_CASE("a worker that joins starts at the slowest clock and holds others back from there") {
  ssp c(2, 0);
  c.push(0, 1);
  c.push(1, 1);  // barrier 1 complete
  const worker_id p = c.add_worker();
  CHECK(p == 2);
  CHECK(c.clock(p) == 1);
  CHECK_FALSE(c.push(0, 2).proceed);
  CHECK_FALSE(c.push(1, 2).proceed);
  CHECK(c.push(p, 2).proceed);
}

TEST_CASE("ssp rejects bad input with messages that name the worker, clock and bound") {
  CHECK_THROWS_AS(ssp(2, -1), invalid_parameter_error);
  CHECK_THROWS_WITH(ssp(2, -1), doctest::Contains("s must be >= 0, got -1"));
  ssp c(2, 0);
  CHECK_THROWS_AS(c.push(5, 0.0), worker_error);
  CHECK_THROWS_WITH(c.push(5, 0.0), doctest::Contains("unknown worker 5 (ids issued: 0..1)"));
  CHECK_THROWS_WITH(c.push(0, std::nan("")), doctest::Contains("worker 0 pushed at a non-finite time (nan)"));
  CHECK_THROWS_AS(c.push(0, HUGE_VAL), time_error);
  c.push(0, 2.0);  // waits for worker 1
  CHECK_THROWS_WITH(c.push(0, 3.0), doctest::Contains("worker 0 pushed at clock 1"));
  CHECK_THROWS_AS(c.push(1, 1.0), time_error);
  CHECK_THROWS_WITH(c.push(1, 1.0),
                    "cadence::ssp: worker 1 pushed at t=1 (clock 0), earlier than the previous push, "
                    "by worker 0 at t=2; time must not go backwards across all workers (one "
                    "timeline per controller)");
  c.remove_worker(1);
  CHECK_THROWS_WITH(c.push(1, 3.0), doctest::Contains("worker 1 was removed"));
  CHECK_THROWS_AS(c.remove_worker(1), worker_error);
}

TEST_CASE("ssp tracks clock gaps far larger than its initial ring") {
  ssp c(3, 100000);
  for (int i = 0; i < 5000; ++i) c.push(0, i);
  for (int i = 0; i < 3000; ++i) c.push(1, 5000 + i);
  CHECK(c.max_staleness() == 5000);
  CHECK(c.min_clock() == 0);
  c.remove_worker(2);
  CHECK(c.min_clock() == 3000);
  CHECK(c.staleness(0) == 2000);
  c.remove_worker(1);
  CHECK(c.min_clock() == 5000);
  CHECK(c.max_staleness() == 0);
}

TEST_CASE("a push or removal that throws leaves bsp, ssp and asp exactly as they were") {
  const auto same = [](const auto& a, const auto& b) { test::require_same_state(a, b); };
  const auto run = [&](auto c, std::uint64_t seed, const test::schedule_options& opt) {
    std::mt19937_64 rng(seed);
    const bool live = test::run_random_schedule(c, rng, opt, [&](const auto& cc, std::size_t e) {
      if (e % 4 == 0) test::require_bad_calls_change_nothing(cc, same, seed * 1000 + e);
    });
    REQUIRE(live);
  };
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    const test::schedule_options opt{/*workers=*/2 + seed % 5, /*events=*/120,
                                     /*remove_probability=*/0.03, /*add_probability=*/0.03};
    run(bsp(opt.workers), seed, opt);
    run(ssp(opt.workers, 2), seed, opt);
    run(asp(opt.workers), seed, opt);
  }
}

TEST_CASE("ssp issues at most max_workers worker ids, and refusing one more changes nothing") {
  CHECK_THROWS_WITH_AS(bsp(max_workers + 1),
                       "cadence::bsp: workers = 1048577 exceeds cadence::max_workers = 1048576",
                       invalid_parameter_error);
  ssp c(max_workers, 1);
  CHECK(c.push(0, 1.0).proceed);
  c.remove_worker(1);  // ids are never reused, so removing a worker frees none
  CHECK_THROWS_WITH_AS(c.add_worker(),
                       "cadence::ssp: add_worker: workers = 1048577 ids would exceed "
                       "cadence::max_workers = 1048576 (ids of removed workers are not reused)",
                       invalid_parameter_error);
  CHECK(c.worker_capacity() == max_workers);
  CHECK(c.active_workers() == max_workers - 1);
  CHECK(c.clock(0) == 1);
  CHECK(c.min_clock() == 0);
  CHECK_FALSE(c.push(0, 2.0).proceed);  // and it still decides: two clocks ahead of the rest
}
