// Seeded random push schedules for property tests of controllers: who pushes next (among
// running workers, weighted by speed), strictly increasing times, and occasional joins and
// departures. Checks the invariants every controller must keep after each event.
#pragma once

#include <cadence/controllers/controller.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
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
/// (released sets compared as sets) and identical state after every event.
template <class A, class B>
void require_same_decisions(A& a, B& b, std::uint64_t seed, const test::schedule_options& opt) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> speed;
  double t = 0;
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

}  // namespace cadence::test
