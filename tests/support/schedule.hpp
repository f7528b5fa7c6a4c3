// Seeded random push schedules for property tests of controllers: who pushes next (among
// running workers, weighted by speed), strictly increasing times, and occasional joins and
// departures. Checks the invariants every controller must keep after each event, and the
// strong exception guarantee (a call that throws changes nothing), with a predictor that fails
// on demand.
#pragma once

#include <cadence/controllers/controller.hpp>
#include <cadence/controllers/detail/controller_base.hpp>
#include <cadence/predict/interval.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence::test {

struct schedule_options {
  std::size_t workers = 4;
  std::size_t events = 400;
  double remove_probability = 0.0;  // per event
  double add_probability = 0.0;     // per event
  bool equal_times = false;         // allow several events at the same timestamp
};

/// Drives controller c with a random schedule. After every event calls check(c, event_index).
/// Returns false if at some point no active worker could push (a deadlock).
template <class C, class Rng, class Check>
bool run_random_schedule(C& c, Rng& rng, const schedule_options& opt, Check&& check) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> speed;  // per worker id: relative push rate
  auto grow = [&](std::size_t ids) {
    while (speed.size() < ids) speed.push_back(0.2 + 2.8 * unit(rng));
  };
  grow(opt.workers);
  double t = 0.0;
  std::vector<worker_id> active, running;
  for (std::size_t e = 0; e < opt.events; ++e) {
    if (opt.add_probability > 0 && unit(rng) < opt.add_probability) grow(std::size_t{c.add_worker()} + 1);
    active.clear();
    running.clear();
    for (worker_id p = 0; p < speed.size(); ++p) {
      if (!c.is_active(p)) continue;
      active.push_back(p);
      if (!c.is_waiting(p)) running.push_back(p);
    }
    if (active.empty()) {
      grow(std::size_t{c.add_worker()} + 1);
      continue;
    }
    if (running.empty()) return false;
    if (opt.remove_probability > 0 && active.size() > 1 && unit(rng) < opt.remove_probability) {
      std::uniform_int_distribution<std::size_t> pick(0, active.size() - 1);
      c.remove_worker(active[pick(rng)]);
      check(c, e);
      continue;
    }
    double total = 0;
    for (worker_id p : running) total += speed[p];
    double x = unit(rng) * total;
    worker_id who = running.back();
    for (worker_id p : running) {
      if ((x -= speed[p]) <= 0) {
        who = p;
        break;
      }
    }
    if (!(opt.equal_times && unit(rng) < 0.3)) t += 0.01 + unit(rng);
    c.push(who, t);
    check(c, e);
  }
  return true;
}

/// Pushes only the slowest running workers until nobody waits; fails if that takes more than
/// `limit` pushes. This is liveness: stragglers that keep going release everyone.
template <class C>
void drain_by_pushing_slowest(C& c, std::size_t capacity, double t, std::size_t limit) {
  for (std::size_t step = 0;; ++step) {
    worker_id slowest = static_cast<worker_id>(-1);
    bool any_waiting = false;
    for (worker_id p = 0; p < capacity; ++p) {
      if (!c.is_active(p)) continue;
      if (c.is_waiting(p)) {
        any_waiting = true;
      } else if (slowest == static_cast<worker_id>(-1) || c.clock(p) < c.clock(slowest)) {
        slowest = p;
      }
    }
    if (!any_waiting) return;
    REQUIRE_MESSAGE(slowest != static_cast<worker_id>(-1), "every active worker waits");
    REQUIRE_MESSAGE(step < limit, "waiting workers not released after ", limit, " pushes");
    t += 1.0;
    c.push(slowest, t);
  }
}

/// Every running (not waiting) active worker is within `bound` of the slowest, and not every
/// active worker waits.
template <class C>
void check_staleness_and_progress(const C& c, clock_value bound, std::size_t capacity) {
  std::size_t active = 0, waiting = 0;
  for (worker_id p = 0; p < capacity; ++p) {
    if (!c.is_active(p)) continue;
    ++active;
    if (c.is_waiting(p)) {
      ++waiting;
    } else if (c.staleness(p) > bound) {
      FAIL("worker ", p, " runs at staleness ", c.staleness(p), " > bound ", bound, " (",
           c.config(), ")");
    }
  }
  if (active > 0) REQUIRE(waiting < active);
}

inline std::vector<worker_id> sorted(span<const worker_id> v) {
  std::vector<worker_id> out(v.begin(), v.end());
  std::sort(out.begin(), out.end());
  return out;
}

/// Replays one seeded random schedule on two controllers and requires identical decisions
/// (released sets compared as sets) and identical state after every event. Times start after
/// `t0` (pass the controllers' last_time() to continue a run).
template <class A, class B>
void require_same_decisions(A& a, B& b, std::uint64_t seed, const test::schedule_options& opt,
                            double t0 = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> speed;
  double t = t0;
  for (std::size_t e = 0; e < opt.events; ++e) {
    if (opt.add_probability > 0 && unit(rng) < opt.add_probability) REQUIRE(a.add_worker() == b.add_worker());
    while (speed.size() < a.worker_capacity()) speed.push_back(0.2 + 2.8 * unit(rng));
    std::vector<worker_id> running, active;
    for (worker_id p = 0; p < a.worker_capacity(); ++p) {
      REQUIRE(a.is_active(p) == b.is_active(p));
      if (!a.is_active(p)) continue;
      REQUIRE(a.is_waiting(p) == b.is_waiting(p));
      REQUIRE(a.clock(p) == b.clock(p));
      active.push_back(p);
      if (!a.is_waiting(p)) running.push_back(p);
    }
    if (active.size() > 1 && opt.remove_probability > 0 && unit(rng) < opt.remove_probability) {
      std::uniform_int_distribution<std::size_t> pick(0, active.size() - 1);
      const worker_id victim = active[pick(rng)];
      REQUIRE(sorted(a.remove_worker(victim)) == sorted(b.remove_worker(victim)));
      continue;
    }
    REQUIRE_FALSE(running.empty());
    double total = 0;
    for (worker_id p : running) total += speed[p];
    double x = unit(rng) * total;
    worker_id who = running.back();
    for (worker_id p : running)
      if ((x -= speed[p]) <= 0) {
        who = p;
        break;
      }
    // Per-worker jittered intervals so the controller sees real interval differences.
    t += 0.001 + unit(rng) / speed[who];
    const decision da = a.push(who, t);
    const decision db = b.push(who, t);
    REQUIRE(da.proceed == db.proceed);
    REQUIRE(sorted(da.released) == sorted(db.released));
  }
}

/// Requires a and b to show the same state through everything the controller concept offers,
/// plus last_time() and waiting_count() for the shipped controllers. Policy-specific state
/// (DSSP's allowances, ElasticBSP's plan) is for the caller to compare.
template <class C>
void require_same_state(const C& a, const C& b) {
  REQUIRE(a.worker_capacity() == b.worker_capacity());
  REQUIRE(a.active_workers() == b.active_workers());
  REQUIRE(a.min_clock() == b.min_clock());
  REQUIRE(a.max_staleness() == b.max_staleness());
  REQUIRE(a.config() == b.config());
  if constexpr (std::is_base_of_v<detail::controller_base, C>) {
    REQUIRE(a.last_time() == b.last_time());
    REQUIRE(a.waiting_count() == b.waiting_count());
  }
  for (worker_id p = 0; p < a.worker_capacity(); ++p) {
    REQUIRE(a.is_active(p) == b.is_active(p));
    if (!a.is_active(p)) continue;
    REQUIRE(a.clock(p) == b.clock(p));
    REQUIRE(a.staleness(p) == b.staleness(p));
    REQUIRE(a.is_waiting(p) == b.is_waiting(p));
    if (a.is_waiting(p)) REQUIRE(a.waiting_for(p) == b.waiting_for(p));
  }
}

/// The strong exception guarantee for one call: runs `call` on a copy of c and, if it throws
/// E, requires the copy to be unchanged: `same(copy, c)` (which REQUIREs equal observables),
/// then identical decisions and state on 30 events of a random schedule continuing both.
/// Returns whether the call threw E; any other exception fails the test.
template <class E, class C, class Call, class Same>
bool throw_changes_nothing(const C& c, Call&& call, Same&& same, std::uint64_t seed) {
  C probe = c;
  try {
    call(probe);
  } catch (const E&) {
    same(probe, c);
    C reference = c;
    schedule_options opt;
    opt.events = 30;
    opt.remove_probability = 0.03;
    opt.add_probability = 0.03;
    require_same_decisions(probe, reference, seed, opt,
                           std::isfinite(c.last_time()) ? c.last_time() : 0.0);
    same(probe, reference);
    return true;
  }
  return false;
}

/// throw_changes_nothing for a call that must throw E.
template <class E, class C, class Call, class Same>
void require_throw_changes_nothing(const C& c, Call&& call, Same&& same, std::uint64_t seed) {
  CHECK(throw_changes_nothing<E>(c, call, same, seed));
}

/// Makes the calls a controller must reject (a push or removal of an unknown, removed or
/// waiting worker; a push at a NaN, infinite or backward time) and requires each to throw and
/// change nothing.
template <class C, class Same>
void require_bad_calls_change_nothing(const C& c, Same&& same, std::uint64_t seed) {
  const auto unknown = static_cast<worker_id>(c.worker_capacity());
  const double t = std::isfinite(c.last_time()) ? c.last_time() + 1.0 : 1.0;
  require_throw_changes_nothing<worker_error>(c, [&](C& x) { x.push(unknown, t); }, same, seed);
  require_throw_changes_nothing<worker_error>(c, [&](C& x) { x.remove_worker(unknown); }, same, seed);
  bool timed = false;
  for (worker_id p = 0; p < c.worker_capacity(); ++p) {
    if (!c.is_active(p)) {
      require_throw_changes_nothing<worker_error>(c, [&](C& x) { x.push(p, t); }, same, seed);
      require_throw_changes_nothing<worker_error>(c, [&](C& x) { x.remove_worker(p); }, same, seed);
    } else if (c.is_waiting(p)) {
      require_throw_changes_nothing<worker_error>(c, [&](C& x) { x.push(p, t); }, same, seed);
    } else if (!timed) {  // the time checks do not depend on the worker: one running one will do
      timed = true;
      require_throw_changes_nothing<time_error>(c, [&](C& x) { x.push(p, std::nan("")); }, same, seed);
      require_throw_changes_nothing<time_error>(c, [&](C& x) { x.push(p, HUGE_VAL); }, same, seed);
      if (std::isfinite(c.last_time()))
        require_throw_changes_nothing<time_error>(c, [&](C& x) { x.push(p, c.last_time() - 0.5); },
                                                  same, seed);
    }
  }
}

/// What failing_predictor throws for failure::error: not a cadence::error, as a user's own
/// exception would not be.
struct predictor_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Predicts like last_interval until its switch says fail: then predict throws, as a buggy
/// user predictor or an allocation failing during planning would. Copies share the switch,
/// so a test can trip it inside a controller that holds a copy.
struct failing_predictor {
  enum class failure { none, error, bad_alloc };
  const failure* fail = nullptr;

  template <class T>
  void predict(span<const T> history, std::size_t r, T* out) const {
    if (*fail == failure::error) throw predictor_failure("failing_predictor: asked to fail");
    if (*fail == failure::bad_alloc) throw std::bad_alloc();
    last_interval{}.predict(history, r, out);
  }
  static constexpr std::size_t min_history() noexcept { return 2; }
  std::string name() const { return "failing"; }
};

/// Sets a failing_predictor's switch for the lifetime of this object.
class scoped_failure {
public:
  scoped_failure(failing_predictor::failure& s, failing_predictor::failure f) : s_(s) { s_ = f; }
  ~scoped_failure() { s_ = failing_predictor::failure::none; }
  scoped_failure(const scoped_failure&) = delete;
  scoped_failure& operator=(const scoped_failure&) = delete;

private:
  failing_predictor::failure& s_;
};

/// The strong exception guarantee under a failing predictor, over 12 seeded schedules of 150
/// events with churn: make(workers, seed, predictor) builds the controller around `predictor`
/// (a failing_predictor); after every event the calls the controller must reject change nothing
/// (every fourth event: require_bad_calls_change_nothing), and calls(c, fail, t, replay_seed)
/// makes the calls that may reach the predictor at time t while `fail` trips it.
template <class Make, class Same, class Calls>
void failing_predictor_schedules(Make&& make, Same&& same, Calls&& calls) {
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    std::mt19937_64 rng(seed);
    schedule_options opt;
    opt.workers = 2 + seed % 5;
    opt.events = 150;
    opt.remove_probability = 0.02;
    opt.add_probability = 0.02;
    failing_predictor::failure fail = failing_predictor::failure::none;
    auto c = make(opt.workers, seed, failing_predictor{&fail});
    using C = decltype(c);
    const bool live = run_random_schedule(c, rng, opt, [&](const C& cc, std::size_t e) {
      const std::uint64_t replay_seed = seed * 1000 + e;
      if (e % 4 == 0) require_bad_calls_change_nothing(cc, same, replay_seed);
      calls(cc, fail, cc.last_time() + 0.25, replay_seed);
    });
    REQUIRE(live);
  }
}

/// Worker q pushes at t with the predictor behind `fail` failing, once as an error and once as
/// an allocation failure: a push that reaches the predictor must throw and change nothing
/// (throw_changes_nothing). Returns how many of the two threw.
template <class C, class Same>
std::size_t failing_pushes_change_nothing(const C& c, failing_predictor::failure& fail, worker_id q, double t,
                                          Same&& same, std::uint64_t seed) {
  using failure = failing_predictor::failure;
  std::size_t threw = 0;
  threw += throw_changes_nothing<predictor_failure>(
      c, [&](C& x) { scoped_failure f(fail, failure::error); x.push(q, t); }, same, seed);
  threw += throw_changes_nothing<std::bad_alloc>(
      c, [&](C& x) { scoped_failure f(fail, failure::bad_alloc); x.push(q, t); }, same, seed);
  return threw;
}

}  // namespace cadence::test
