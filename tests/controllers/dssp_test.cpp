#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/predict/any_predictor.hpp>

#include "support/trials.hpp"
#include "support/schedule.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using namespace cadence;
using test::sorted;
using test::require_same_decisions;

namespace {

// DSSP written straight from the contract, scanning every worker on every event, with the
// controller as the double loop docs/contract.md#3-dssp describes.
class naive_dssp {
public:
  naive_dssp(std::size_t n, clock_value lo, clock_value hi)
      : lo_(lo), hi_(hi), w_(n) {}
  decision push(worker_id p, timestamp t) {
    released_.clear();
    worker& w = w_[p];
    ++w.clock;
    ++w.pushes;
    w.previous = w.latest;
    w.latest = t;
    release_eligible();
    const clock_value m = min_clock();
    bool proceed = false;
    if (w.extra > 0) {
      --w.extra;
      proceed = true;
    } else if (w.clock - m <= lo_) {
      proceed = true;
    } else if (w.clock == max_clock()) {
      const clock_value r = controller(p, w.clock - m);
      if (r > 0) {
        w.extra = r - 1;
        proceed = true;
      }
    }
    if (!proceed) w.state = 1;
    return {proceed, released_};
  }
  span<const worker_id> remove_worker(worker_id p) {
    released_.clear();
    w_[p].state = 2;
    release_eligible();
    return released_;
  }
  worker_id add_worker() {
    worker w;
    w.clock = min_clock();
    w_.push_back(w);
    return static_cast<worker_id>(w_.size() - 1);
  }
  std::size_t worker_capacity() const { return w_.size(); }
  bool is_active(worker_id p) const { return p < w_.size() && w_[p].state != 2; }
  bool is_waiting(worker_id p) const { return w_[p].state == 1; }
  clock_value clock(worker_id p) const { return w_[p].clock; }

private:
  struct worker {
    clock_value clock = 0, extra = 0;
    std::size_t pushes = 0;
    double latest = 0, previous = 0;
    int state = 0;
  };
  clock_value min_clock() const {
    clock_value m = -1;
    for (const auto& w : w_)
      if (w.state != 2 && (m < 0 || w.clock < m)) m = w.clock;
    return m < 0 ? 0 : m;
  }
  clock_value max_clock() const {
    clock_value m = 0;
    for (const auto& w : w_)
      if (w.state != 2) m = std::max(m, w.clock);
    return m;
  }
  void release_eligible() {
    const clock_value m = min_clock();
    for (worker_id q = 0; q < w_.size(); ++q)
      if (w_[q].state == 1 && w_[q].clock - m <= lo_) {
        w_[q].state = 0;
        released_.push_back(q);
      }
  }
  clock_value controller(worker_id p, clock_value gap) const {
    const clock_value max_i = std::min(hi_ - lo_, hi_ + 1 - gap);
    if (max_i <= 0 || w_[p].pushes < 2) return 0;
    // slowest: smallest clock; ties: oldest latest push, a worker that has not pushed at its
    // clock (a joiner) counting as oldest.
    const clock_value m = min_clock();
    const worker* slow = nullptr;
    for (const auto& w : w_) {
      if (w.state == 2 || w.clock != m) continue;
      auto key = [](const worker& x) { return x.pushes ? x.latest : -HUGE_VAL; };
      if (!slow || key(w) < key(*slow)) slow = &w;
    }
    if (slow->pushes < 2) return 0;
    const double ip = w_[p].latest - w_[p].previous, is = slow->latest - slow->previous;
    clock_value best_i = 0;
    double best = HUGE_VAL;
    for (clock_value i = 0; i <= max_i; ++i) {
      const double pi = w_[p].latest + static_cast<double>(i) * ip;
      double d = HUGE_VAL;
      for (clock_value k = 0; k <= hi_ - lo_; ++k)
        d = std::min(d, std::fabs(slow->latest + static_cast<double>(k + 1) * is - pi));
      if (d < best) {
        best = d;
        best_i = i;
      }
    }
    return best_i;
  }
  clock_value lo_, hi_;
  std::vector<worker> w_;
  std::vector<worker_id> released_;
};

}  // namespace

TEST_CASE("the dssp controller's two-pointer search picks what the double loop picks") {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0.0, 10.0);
  std::uniform_int_distribution<int> small(0, 12);
  for (std::uint64_t trial = 0; trial < cadence_test::sanitized_trials(20000); ++trial) {
    // Sorted sequences; integer-valued steps make exact ties common.
    const bool ints = trial % 2 == 0;
    auto value = [&](double scale) { return ints ? std::floor(u(rng) * scale) : u(rng) * scale; };
    std::vector<double> p(static_cast<std::size_t>(small(rng)) + 1), s(static_cast<std::size_t>(small(rng)) + 1);
    double t = value(1.0);
    for (auto& x : p) x = (t += trial % 7 == 0 ? 0.0 : value(0.3));
    t = value(1.0);
    for (auto& x : s) x = (t += trial % 11 == 0 ? 0.0 : value(1.0));
    std::size_t best_i = 0;
    double best = HUGE_VAL;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double dist = HUGE_VAL;
      for (const double sk : s) dist = std::min(dist, std::fabs(sk - p[i]));
      if (dist < best) {
        best = dist;
        best_i = i;
      }
    }
    REQUIRE(detail::dssp_best_extension(p.data(), p.size(), s.data(), s.size()) == best_i);
  }
}

TEST_CASE("dssp grants the fast worker r* = 3 in the paper's Fig. 2 setting (s_L = 1, r in [0, 4])") {
  // Worker 0 is fast (interval 1), worker 1 slow (interval 3.5). With s_L = 1 and s_U = 5 the
  // fast worker first exceeds s_L at t = 10; it could stop after its pushes at 10, 11, 12, 13 or
  // 14, and the slow worker's pushes are predicted at 9.2, 12.7, 16.2, ...: 13 is closest, so
  // r* = 3 and it runs exactly three more iterations before waiting.
  dssp c(2, 1, 5);
  CHECK(c.push(0, 1.0).proceed);
  CHECK(c.push(1, 2.2).proceed);
  CHECK(c.push(1, 5.7).proceed);
  CHECK(c.push(0, 8.0).proceed);
  CHECK(c.push(0, 9.0).proceed);
  CHECK(c.push(0, 10.0).proceed);  // gap 2 > s_L: controller grants r* = 3
  CHECK(c.grants() == 1);
  CHECK(c.extra_iterations(0) == 2);
  CHECK(c.push(0, 11.0).proceed);
  CHECK(c.push(0, 12.0).proceed);
  CHECK(c.staleness(0) == 4);
  CHECK_FALSE(c.push(0, 13.0).proceed);  // allowance spent
  CHECK(c.waiting_for(0) == std::vector<worker_id>{1});
  CHECK(c.push(1, 12.7 + 1).proceed);
  CHECK(c.push(1, 15.0).proceed);
  CHECK(c.push(1, 16.0).proceed);
  const decision d = c.push(1, 17.0);  // slow reaches clock 6: gap 1
  CHECK(sorted(d.released) == std::vector<worker_id>{0});
}

TEST_CASE("dssp never lets a worker start an iteration more than s_U clocks ahead") {
  for (auto [lo, hi] : {std::pair<clock_value, clock_value>{0, 0}, {0, 4}, {1, 5}, {3, 15}, {2, 3}}) {
    for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(250); ++seed) {
      std::mt19937_64 rng(seed * 7 + static_cast<std::uint64_t>(hi));
      const test::schedule_options opt{/*workers=*/2 + seed % 8, /*events=*/400,
                                       /*remove_probability=*/seed % 3 == 0 ? 0.02 : 0.0,
                                       /*add_probability=*/seed % 4 == 0 ? 0.02 : 0.0,
                                       /*equal_times=*/seed % 5 == 0};
      dssp c(opt.workers, lo, hi);
      const clock_value bound = hi;  // structured bindings cannot be captured before C++20 (clang 14: at all)
      const bool live = test::run_random_schedule(c, rng, opt, [&](const dssp& cc, std::size_t) {
        test::check_staleness_and_progress(cc, bound, cc.worker_capacity());
      });
      REQUIRE(live);
      test::drain_by_pushing_slowest(c, c.worker_capacity(), 1e9, 100000);
    }
  }
}

TEST_CASE("dssp decides exactly like the contract's rules run by scanning every worker") {
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(400); ++seed) {
    const clock_value lo = static_cast<clock_value>(seed % 4);
    const clock_value hi = lo + static_cast<clock_value>(seed % 7);
    const test::schedule_options opt{/*workers=*/2 + seed % 10, /*events=*/300,
                                     /*remove_probability=*/seed % 2 ? 0.02 : 0.0,
                                     /*add_probability=*/seed % 3 ? 0.02 : 0.0};
    dssp fast(opt.workers, lo, hi);
    naive_dssp slow(opt.workers, lo, hi);
    require_same_decisions(fast, slow, seed, opt);
  }
}

TEST_CASE("dssp with s_L = s_U decides exactly like ssp(s_L)") {
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(200); ++seed) {
    const clock_value s = static_cast<clock_value>(seed % 6);
    const test::schedule_options opt{/*workers=*/1 + seed % 9, /*events=*/300,
                                     /*remove_probability=*/0.02, /*add_probability=*/0.02};
    dssp a(opt.workers, s, s);
    ssp b(opt.workers, s);
    require_same_decisions(a, b, seed, opt);
  }
}

TEST_CASE("dssp rejects bad parameters and reports its config") {
  CHECK_THROWS_AS(dssp(2, -1, 3), invalid_parameter_error);
  CHECK_THROWS_WITH(dssp(2, 5, 3), doctest::Contains("s_U (3) must be >= lower bound s_L (5)"));
  dssp c(2, 3, 15);
  CHECK(c.config() == "dssp:3:15");
  CHECK(c.lower_bound() == 3);
  CHECK(c.upper_bound() == 15);
  CHECK_THROWS_WITH(c.extra_iterations(9), doctest::Contains("unknown worker 9"));
}

TEST_CASE("a dssp worker with fewer than two pushes gets no extension") {
  dssp c(2, 0, 10);
  // Worker 0 is ahead with one push (no interval of its own yet).
  CHECK_FALSE(c.push(0, 1.0).proceed);
  CHECK(sorted(c.push(1, 2.0).released) == std::vector<worker_id>{0});
  // Now worker 0 has an interval but the slowest (worker 1) has pushed only once.
  CHECK_FALSE(c.push(0, 3.0).proceed);
  CHECK(c.grants() == 0);
}

TEST_CASE("a dssp fast worker whose last two pushes share a timestamp gets no extension") {
  // Worker 1 pushes every 2 s (at 1 and 3), worker 0 at 2 and then at a, b and c: it goes on at
  // a and b, and at c only when `third_proceeds`. Returns the grants worker 0 earned, having
  // required that none of them is left over.
  const auto grants_after = [](double a, double b, double c, bool third_proceeds) {
    dssp d(2, 1, 5);
    d.push(1, 1.0);
    d.push(0, 2.0);
    d.push(1, 3.0);
    CHECK(d.push(0, a).proceed);
    CHECK(d.push(0, b).proceed);
    CHECK(d.push(0, c).proceed == third_proceeds);
    CHECK(d.extra_iterations(0) == 0);
    return d.grants();
  };
  // Worker 0 reaches s_L + 1 = 2 ahead with pushes at 10, 10 (under last_interval only the
  // last two pushes count). Equal times predict a zero interval: every candidate ties, so
  // r* = 0 and worker 0 waits, where searching the strictly-increasing predictions as they are
  // would grant s_U - s_L.
  CHECK(grants_after(9.0, 10.0, 10.0, false) == 0);

  // The same schedule with a real interval (0.5 s) is granted r* = 1: P_1 = 4.5 + 0.5 lands
  // exactly on worker 1's predicted push at 3 + 2.
  CHECK(grants_after(3.5, 4.0, 4.5, true) == 1);
}

TEST_CASE("dssp takes any predictor, and the default decides exactly like the paper's formula") {
  // The naive reference above computes P_i = A_p + i I_p and S_k = A_s + (k+1) I_s directly.
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(100); ++seed) {
    const test::schedule_options opt{/*workers=*/2 + seed % 6, /*events=*/300};
    basic_dssp<any_predictor<>> erased(opt.workers, 1, 6, make_predictor("last"));
    naive_dssp reference(opt.workers, 1, 6);
    require_same_decisions(erased, reference, seed, opt);
  }
  // A robust predictor still keeps the bound.
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(100); ++seed) {
    std::mt19937_64 rng(seed);
    const test::schedule_options opt{/*workers=*/2 + seed % 7, /*events=*/400,
                                     /*remove_probability=*/0.01, /*add_probability=*/0.01};
    basic_dssp<median_interval> c(opt.workers, 2, 8, median_interval(3));
    const bool live = test::run_random_schedule(c, rng, opt, [&](const auto& cc, std::size_t) {
      test::check_staleness_and_progress(cc, 8, cc.worker_capacity());
    });
    REQUIRE(live);
  }
  CHECK(basic_dssp<median_interval>(2, 1, 4, median_interval(3)).config() == "dssp:1:4:median:3");
}

TEST_CASE("dssp bounds r_max, history and workers x history where it accepts them") {
  CHECK(dssp(2, 3, 3 + dssp::max_extension).upper_bound() == 3 + dssp::max_extension);
  CHECK_THROWS_WITH_AS(dssp(2, 3, 3 + dssp::max_extension + 1),
                       "cadence::dssp: r_max = s_U - s_L = 65537 exceeds dssp::max_extension = 65536",
                       invalid_parameter_error);
  using median_dssp = basic_dssp<median_interval>;
  CHECK_NOTHROW(median_dssp(2, 1, 4, median_interval(3), max_history));
  CHECK_THROWS_WITH_AS(median_dssp(2, 1, 4, median_interval(3), max_history + 1),
                       "cadence::dssp: history = 1025 exceeds cadence::max_history = 1024",
                       invalid_parameter_error);
  const std::size_t most = max_history_entries / max_history;  // workers with the longest history
  CHECK_THROWS_WITH_AS(median_dssp(most + 1, 1, 4, median_interval(3), max_history),
                       "cadence::dssp: workers x history (16385 x 1024) = 16778240 exceeds "
                       "cadence::max_history_entries = 16777216",
                       invalid_parameter_error);
  CHECK_THROWS_WITH_AS(dssp(max_workers + 1, 1, 4),
                       "cadence::dssp: workers = 1048577 exceeds cadence::max_workers = 1048576",
                       invalid_parameter_error);
}

namespace {

void require_same_dssp(const basic_dssp<test::failing_predictor>& a,
                       const basic_dssp<test::failing_predictor>& b) {
  test::require_same_state(a, b);
  REQUIRE(a.grants() == b.grants());
  for (worker_id p = 0; p < a.worker_capacity(); ++p)
    if (a.is_active(p)) REQUIRE(a.extra_iterations(p) == b.extra_iterations(p));
}

}  // namespace

TEST_CASE("a push that throws, from bad input or from the predictor, leaves a dssp as it was") {
  std::size_t predictor_throws = 0;
  test::failing_predictor_schedules(
      [](std::size_t workers, std::uint64_t, test::failing_predictor p) {
        return basic_dssp<test::failing_predictor>(workers, 1, 6, p);
      },
      require_same_dssp,
      [&](const auto& cc, test::failing_predictor::failure& fail, double t, std::uint64_t replay_seed) {
        // A push from each running worker, with the predictor failing: those that reach the
        // synchronization controller must throw and change nothing.
        for (worker_id q = 0; q < cc.worker_capacity(); ++q) {
          if (!cc.is_active(q) || cc.is_waiting(q)) continue;
          predictor_throws += test::failing_pushes_change_nothing(cc, fail, q, t, require_same_dssp, replay_seed);
        }
      });
  CHECK(predictor_throws > 50);
}
