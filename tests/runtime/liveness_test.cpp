#include <cadence/runtime/liveness.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace cadence;

namespace {

// A tracker with the given deadline that has heard each (worker, time), in order.
liveness_tracker<> tracker_that_heard(double deadline,
                                      std::initializer_list<std::pair<worker_id, double>> calls) {
  liveness_tracker<> t(deadline);
  for (const auto& [p, at] : calls) t.heard(p, at);
  return t;
}

}  // namespace

TEST_CASE("a worker is silent once the deadline has passed since it was last heard, not before") {
  liveness_tracker<> t = tracker_that_heard(2.0, {{0, 1.0}});
  CHECK(t.silent(2.75).empty());
  CHECK(t.silent(3.0) == std::vector<worker_id>{0});  // exactly the deadline counts as silent
  CHECK(t.silent(10.0) == std::vector<worker_id>{0});
  CHECK(t.last_heard(0) == 1.0);
}

TEST_CASE("hearing from a worker restarts its silence") {
  liveness_tracker<> t = tracker_that_heard(2.0, {{0, 0.0}, {1, 0.5}, {0, 1.5}});
  CHECK(t.silent(2.5) == std::vector<worker_id>{1});
  CHECK(t.next_deadline() == 2.5);
  CHECK(t.silent(3.5) == std::vector<worker_id>{1, 0});
}

TEST_CASE("an excused worker is not silent however long it waits, until it is heard again") {
  liveness_tracker<> t = tracker_that_heard(1.0, {{0, 0.0}, {1, 0.0}});
  t.excuse(1);
  CHECK(t.state(1) == liveness_state::excused);
  CHECK(t.last_heard(1) == 0.0);  // kept, for reports
  CHECK(t.silent(100.0) == std::vector<worker_id>{0});
  CHECK(t.watched() == 1);
  t.heard(1, 100.0);  // released: its silence counts from its release
  CHECK(t.state(1) == liveness_state::watched);
  CHECK(t.silent(100.5) == std::vector<worker_id>{0});
  CHECK(t.silent(101.0) == std::vector<worker_id>{0, 1});
}

TEST_CASE("a forgotten worker is never reported again unless it is heard again") {
  liveness_tracker<> t = tracker_that_heard(1.0, {{0, 0.0}, {1, 0.0}});
  t.forget(0);
  t.forget(7);  // never heard: nothing to forget, and no error
  CHECK(t.state(0) == liveness_state::untracked);
  CHECK(t.last_heard(0) == std::nullopt);
  CHECK(t.silent(5.0) == std::vector<worker_id>{1});
  t.heard(0, 5.0);
  CHECK(t.silent(6.0) == std::vector<worker_id>{1, 0});
}

TEST_CASE("next_deadline is when the longest-silent worker becomes silent, and empty when none is watched") {
  liveness_tracker<> t(3.0);
  CHECK(t.next_deadline() == std::nullopt);
  t.heard(2, 1.0);
  t.heard(0, 2.0);
  CHECK(t.next_deadline() == 4.0);
  t.excuse(2);
  CHECK(t.next_deadline() == 5.0);
  t.forget(0);
  CHECK(t.next_deadline() == std::nullopt);
  CHECK(t.silent(1e9).empty());
}

TEST_CASE("hearing at a time earlier than one already heard, or at NaN, is a time_error naming the worker") {
  liveness_tracker<> t(1.0);
  t.heard(0, 5.0);
  t.heard(1, 5.0);  // equal times are fine
  std::string message;
  try {
    t.heard(1, 4.5);
  } catch (const time_error& e) {
    message = e.what();
  }
  CHECK(message.find("worker 1 heard at a time 0.500000 s earlier") != std::string::npos);
  CHECK(t.last_heard(1) == 5.0);  // unchanged
  // NaN compares false with everything, so it would slip past the order check and corrupt it.
  CHECK_THROWS_WITH_AS(t.heard(2, std::nan("")), doctest::Contains("worker 2 heard at a non-finite time"),
                       time_error);
  CHECK(t.state(2) == liveness_state::untracked);
}

TEST_CASE("a deadline that is not positive is rejected") {
  CHECK_THROWS_AS(liveness_tracker<>(0.0), invalid_parameter_error);
  CHECK_THROWS_AS(liveness_tracker<>(-1.0), invalid_parameter_error);
  CHECK_THROWS_AS(liveness_tracker<>(std::nan("")), invalid_parameter_error);
  using tp = std::chrono::steady_clock::time_point;
  CHECK_THROWS_AS(liveness_tracker<tp>(std::chrono::nanoseconds(0)), invalid_parameter_error);
}

TEST_CASE("the tracker works on std::chrono time points, and a far deadline means never") {
  using namespace std::chrono_literals;
  using tp = std::chrono::steady_clock::time_point;
  const tp t0 = tp(1h);
  liveness_tracker<tp> t(250ms);
  t.heard(3, t0);
  CHECK(t.silent(t0 + 249ms).empty());
  CHECK(t.silent(t0 + 250ms) == std::vector<worker_id>{3});
  CHECK(t.next_deadline() == t0 + 250ms);

  // A deadline of centuries on a clock counted in nanoseconds would overflow t + deadline.
  liveness_tracker<tp> forever(std::chrono::nanoseconds::max());
  forever.heard(0, t0);
  CHECK(forever.next_deadline() == tp::max());
  CHECK(forever.silent(t0 + 24h).empty());
}

TEST_CASE("silent and next_deadline agree with a brute-force scan on random schedules") {
  // The oracle keeps, per worker, its state, last-heard time and the order it was heard in,
  // and answers by scanning all workers: the list the tracker keeps must give the same answers.
  struct entry {
    liveness_state state = liveness_state::untracked;
    std::int64_t last = 0;
    std::uint64_t order = 0;
  };
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng(seed);
    const std::int64_t deadline = 1 + static_cast<std::int64_t>(rng() % 20);
    const worker_id n = 1 + static_cast<worker_id>(rng() % 12);
    liveness_tracker<std::int64_t> t(deadline);
    std::vector<entry> oracle(n);
    std::int64_t now = 0;
    std::uint64_t order = 0;
    for (int step = 0; step < 400; ++step) {
      now += static_cast<std::int64_t>(rng() % 4);  // often 0: equal times must keep heard order
      const worker_id p = static_cast<worker_id>(rng() % n);
      switch (rng() % 5) {
        case 0:
        case 1:
          t.heard(p, now);
          oracle[p] = entry{liveness_state::watched, now, order++};
          break;
        case 2:
          t.excuse(p);
          oracle[p].state = liveness_state::excused;
          break;
        case 3:
          t.forget(p);
          oracle[p].state = liveness_state::untracked;
          break;
        default:
          break;  // only query
      }
      std::vector<worker_id> expected;
      for (worker_id q = 0; q < n; ++q)
        if (oracle[q].state == liveness_state::watched && now - oracle[q].last >= deadline)
          expected.push_back(q);
      std::sort(expected.begin(), expected.end(),
                [&](worker_id a, worker_id b) { return oracle[a].order < oracle[b].order; });
      std::optional<std::int64_t> first;
      std::size_t watched = 0;
      std::vector<liveness_state> states(n), expected_states(n);
      for (worker_id q = 0; q < n; ++q) {
        states[q] = t.state(q);
        expected_states[q] = oracle[q].state;
        if (oracle[q].state != liveness_state::watched) continue;
        ++watched;
        if (!first || oracle[q].last + deadline < *first) first = oracle[q].last + deadline;
      }
      REQUIRE(states == expected_states);
      REQUIRE(t.silent(now) == expected);
      REQUIRE(t.next_deadline() == first);
      REQUIRE(t.watched() == watched);
    }
  }
}
