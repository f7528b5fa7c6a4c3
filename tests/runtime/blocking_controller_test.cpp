#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/runtime/blocking_controller.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace std::chrono_literals;

namespace {

// Runs `workers` threads of different speeds for `iterations` pushes each through a blocking
// SSP-family controller, recording the largest staleness any running worker ever had.
template <class C>
clock_value run_threads(blocking_controller<C>& bc, std::size_t workers, int iterations) {
  std::atomic<clock_value> worst{0};
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < workers; ++p) {
    threads.emplace_back([&, p] {
      const auto id = static_cast<worker_id>(p);
      for (int i = 0; i < iterations; ++i) {
        // Worker p's "iteration": busier for higher ids, so speeds differ.
        std::this_thread::sleep_for(std::chrono::microseconds(20 * (p + 1)));
        bc.push(id, 10s);
        const clock_value s = bc.inspect([&](const C& c) {
          // Running now, so within the bound; record the worst gap seen by a running worker.
          return c.is_waiting(id) ? 0 : c.staleness(id);
        });
        clock_value prev = worst.load();
        while (s > prev && !worst.compare_exchange_weak(prev, s)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return worst.load();
}

// A clock the test moves by hand, so that who is silent is decided by the test, not by how
// the scheduler happens to run the threads. Only forward; every test using it resets it.
struct manual_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<manual_clock>;
  [[maybe_unused]] static constexpr bool is_steady = true;  // the Clock requirements ask for it
  static time_point now() noexcept { return time_point(duration(ticks.load())); }
  static void advance(duration d) noexcept { ticks.fetch_add(d.count()); }
  static void reset() noexcept { ticks.store(0); }
  inline static std::atomic<rep> ticks{0};
};

// Runs f on a worker thread's behalf: an exception becomes a message for the test thread to
// check, instead of std::terminate.
template <class F>
void guarded(std::string& error, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
  }
}

// Spins until pred() holds; false after 30 s, so a broken wrapper fails a check instead of
// hanging the suite (a guard against hangs, not a timing assertion).
template <class P>
bool eventually(P&& pred) {
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

template <class B>
bool waiting(B& bc, std::initializer_list<worker_id> workers) {
  return bc.inspect([&](const auto& c) {
    for (worker_id q : workers)
      if (!c.is_active(q) || !c.is_waiting(q)) return false;
    return true;
  });
}

// Resets the manual clock to 0 and returns options that evict a worker silent for
// `evict_after` on it: where every eviction test on the manual clock starts.
blocking_options start_manual_clock(std::chrono::nanoseconds evict_after) {
  manual_clock::reset();
  blocking_options options;
  options.evict_after = evict_after;
  return options;
}

// Pushes worker 0 of bc on a thread of its own (what the push throws goes to `error`) and
// returns that thread once worker 0 waits in its push.
template <class C>
std::thread block_worker_0(blocking_controller<C, manual_clock>& bc, std::string& error) {
  std::thread pusher([&bc, &error] { guarded(error, [&] { bc.push(0, 30s); }); });
  CHECK(eventually([&] { return waiting(bc, {0}); }));
  return pusher;
}

// When the victim's thread dies (returns without finish).
enum class death {
  at_start,           // before its first push
  mid_run,            // after three pushes, while the others still run
  while_others_wait,  // after three pushes, once both others wait for it
  monitoring,         // ElasticBSP: right after a barrier, before its monitoring pushes
  running,            // ElasticBSP: right after a barrier was planned, before reaching it
  at_barrier,         // ElasticBSP: once both others wait at the barrier it never reaches
};

const char* to_string(death d) {
  switch (d) {
    case death::at_start: return "at start";
    case death::mid_run: return "mid run";
    case death::while_others_wait: return "while others wait for it";
    case death::monitoring: return "during monitoring";
    case death::running: return "while running toward a barrier";
    case death::at_barrier: return "while others wait at the barrier";
  }
  return "?";
}

// Checked by the victim before each of its pushes: whether it dies now. It cannot be waiting
// then, so a plan in force is one it has not reached; and neither a barrier nor (after one)
// the monitoring phase can end without its pushes, so it sees each state before it passes.
bool dies_now(const any_controller& c, death when, clock_value pushes) {
  const elastic_bsp* e = c.target<elastic_bsp>();
  switch (when) {
    case death::at_start: return true;
    case death::mid_run:
    case death::while_others_wait: return pushes == 3;
    case death::monitoring: return e->barriers() >= 1 && e->is_monitoring();
    case death::running:
    case death::at_barrier: return !e->is_monitoring();
  }
  return true;
}

// Three workers under `policy`; worker 1 dies at `when`. Workers 0 and 2 push until it is
// dead, then five times more, then finish. Each push takes 1 us of manual time, so nobody is
// silent for anything like evict_after (1 h) until the test moves the clock by hours, once
// both survivors are quiescent (finished, or blocked in push and so excused).
void dies_and_is_evicted(const std::string& policy, death when) {
  const std::string phase = to_string(when);
  CAPTURE(policy);
  CAPTURE(phase);
  constexpr worker_id victim = 1;
  blocking_controller<any_controller, manual_clock> bc(make_controller(policy, 3),
                                                       start_manual_clock(1h));
  std::atomic<bool> dead{false};
  std::string errors[3];
  clock_value victim_pushes = 0;

  std::thread victim_thread([&] {
    guarded(errors[victim], [&] {
      while (!bc.inspect([&](const any_controller& c) { return dies_now(c, when, victim_pushes); })) {
        manual_clock::advance(1us);
        bc.push(victim, 60s);
        ++victim_pushes;
      }
      if ((when == death::while_others_wait || when == death::at_barrier) &&
          !eventually([&] { return waiting(bc, {0, 2}); }))
        errors[victim] = "the others never waited for the victim";
    });
    dead = true;
  });
  std::vector<std::thread> survivors;
  for (worker_id s : {worker_id{0}, worker_id{2}}) {
    survivors.emplace_back([&, s] {
      guarded(errors[s], [&] {
        for (int after = 0; after < 5;) {
          manual_clock::advance(1us);
          bc.push(s, 60s);
          if (dead) ++after;
        }
        bc.finish(s);
      });
    });
  }
  victim_thread.join();
  CHECK(errors[victim] == "");
  // No REQUIRE until the threads are joined: every step below also ends a failing run.
  CHECK(eventually([&] {
    return bc.inspect([](const any_controller& c) {
      for (worker_id s : {worker_id{0}, worker_id{2}})
        if (c.is_active(s) && !c.is_waiting(s)) return false;
      return true;
    });
  }));
  // Read evictions() rather than what check_liveness() returns: a survivor's timed wait may
  // notice first, and either is right.
  manual_clock::advance(30min);
  bc.check_liveness();
  CHECK(bc.evictions().empty());  // half the deadline: not yet
  manual_clock::advance(1h);
  bc.check_liveness();
  for (auto& t : survivors) t.join();
  const std::vector<eviction> evicted = bc.evictions();

  REQUIRE(evicted.size() == 1);
  CHECK(evicted[0].worker == victim);
  CHECK(evicted[0].clock == victim_pushes);
  CHECK(evicted[0].silent_for >= 90min);  // silent since before the clock moved
  CHECK(evicted[0].silent_for < 2h);
  CHECK(errors[0] == "");
  CHECK(errors[2] == "");
  bc.inspect([](const any_controller& c) { CHECK(c.active_workers() == 0); });
  CHECK_THROWS_WITH_AS(bc.push(victim), doctest::Contains("worker 1 cannot push: it was evicted at clock"),
                       worker_error);
}

}  // namespace

TEST_CASE("blocking ssp keeps real threads of different speeds within s clocks" * doctest::timeout(60)) {
  blocking_controller<ssp> bc(ssp(4, 2));
  const clock_value worst = run_threads(bc, 4, 200);
  CHECK(worst <= 2);
  bc.inspect([](const ssp& c) {
    for (worker_id p = 0; p < 4; ++p) CHECK(c.clock(p) == 200);
    CHECK(c.waiting_count() == 0);
  });
}

TEST_CASE("blocking bsp is a barrier per iteration for real threads" * doctest::timeout(60)) {
  blocking_controller<bsp> bc(bsp(3));
  CHECK(run_threads(bc, 3, 150) == 0);
}

TEST_CASE("blocking dssp keeps real threads within s_U clocks" * doctest::timeout(60)) {
  blocking_controller<dssp> bc(dssp(4, 1, 4));
  CHECK(run_threads(bc, 4, 200) <= 4);
}

TEST_CASE("every policy make_controller builds finishes with workers of unequal iteration counts" *
          doctest::timeout(120)) {
  // Without finish(), a worker that stops early leaves the others waiting at a barrier (BSP,
  // SSP and DSSP at the bound, ElasticBSP at its planned barrier) until their timeout.
  const int iterations[] = {5, 20, 45, 80};
  for (const char* policy : {"bsp", "asp", "ssp:2", "dssp:2:6", "dssp:1:4:median:3", "elastic:4",
                             "elastic:10", "elastic:3:ewma:0.5:opt-bs", "elastic:2:mean:3:zipline"}) {
    CAPTURE(policy);
    blocking_controller<any_controller> bc(make_controller(policy, 4));
    std::string errors[4];
    clock_value clocks[4] = {};
    std::vector<std::thread> threads;
    for (worker_id p = 0; p < 4; ++p) {
      threads.emplace_back([&, p] {
        guarded(errors[p], [&] {
          for (int i = 0; i < iterations[p]; ++i) {
            std::this_thread::sleep_for(std::chrono::microseconds(20 * (p + 1)));  // "compute"
            bc.push(p, 30s);
          }
          clocks[p] = bc.inspect([&](const any_controller& c) { return c.clock(p); });
          bc.finish(p);
        });
      });
    }
    for (auto& t : threads) t.join();
    for (worker_id p = 0; p < 4; ++p) {
      CHECK(errors[p] == "");
      CHECK(clocks[p] == iterations[p]);
    }
    bc.inspect([](const any_controller& c) { CHECK(c.active_workers() == 0); });
  }
}

TEST_CASE("blocking elastic_bsp runs real threads through its barriers; finished workers leave" *
          doctest::timeout(60)) {
  blocking_controller<elastic_bsp> bc(elastic_bsp(3, 5));
  std::vector<std::thread> threads;
  for (worker_id p = 0; p < 3; ++p) {
    threads.emplace_back([&bc, p] {
      for (int i = 0; i < 120; ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(30 * (p + 1)));
        bc.push(p, 10s);
      }
      bc.finish(p);
    });
  }
  for (auto& t : threads) t.join();
  bc.inspect([](const elastic_bsp& c) {
    CHECK(c.active_workers() == 0);
    CHECK(c.barriers() > 0);
    CHECK(c.waiting_count() == 0);
  });
}

TEST_CASE("finish releases the workers waiting at a bsp barrier" * doctest::timeout(30)) {
  blocking_controller<bsp> bc(bsp(3));
  std::string errors[2];
  std::thread a([&] { guarded(errors[0], [&] { bc.push(0, 30s); }); });
  std::thread b([&] { guarded(errors[1], [&] { bc.push(1, 30s); }); });
  CHECK(eventually([&] { return waiting(bc, {0, 1}); }));
  bc.finish(2);  // worker 2 ran out of data before this iteration
  a.join();
  b.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  bc.inspect([](const bsp& c) {
    CHECK(c.active_workers() == 2);
    CHECK(c.waiting_count() == 0);
    CHECK(c.clock(0) == 1);
  });
}

TEST_CASE("finish completes an elastic_bsp barrier the others already wait at" * doctest::timeout(30)) {
  manual_clock::reset();
  blocking_controller<elastic_bsp, manual_clock> bc(elastic_bsp(2, 1));
  // Two monitoring pushes each, 1 ms apart: the plan with R = 1 puts the barrier at each
  // worker's next push.
  for (int i = 0; i < 2; ++i)
    for (worker_id p = 0; p < 2; ++p) {
      manual_clock::advance(1ms);
      bc.push(p);
    }
  REQUIRE(bc.inspect([](const elastic_bsp& c) { return c.plan().planned; }));
  std::string error;
  std::thread a([&] {
    guarded(error, [&] {
      manual_clock::advance(1ms);
      bc.push(0, 30s);
    });
  });
  CHECK(eventually([&] { return waiting(bc, {0}); }));
  bc.finish(1);
  a.join();
  CHECK(error == "");
  bc.inspect([](const elastic_bsp& c) {
    CHECK(c.barriers() == 1);
    CHECK(c.waiting_count() == 0);
    CHECK(c.active_workers() == 1);
  });
}

TEST_CASE("a push or finish after finish is a worker_error saying the worker finished") {
  blocking_controller<asp> bc(asp(2));
  bc.push(0);
  bc.push(0);
  bc.finish(0);
  CHECK_THROWS_WITH_AS(bc.push(0),
                       "cadence::blocking_controller: worker 0 cannot push: it finished at clock 2 "
                       "(finish() was called)",
                       worker_error);
  CHECK_THROWS_WITH_AS(bc.finish(0), doctest::Contains("worker 0 cannot finish: it finished at clock 2"),
                       worker_error);
  CHECK_FALSE(bc.remove_worker(0));  // a failure detector racing with finish is not an error
  CHECK_THROWS_WITH_AS(bc.finish(9),
                       "cadence::blocking_controller: finish: unknown worker 9 (ids issued: 0..1)",
                       worker_error);
  bc.push(1);  // the other worker is unaffected
}

TEST_CASE("evict_after must be positive") {
  blocking_options options;
  options.evict_after = 0s;
  CHECK_THROWS_WITH_AS(blocking_controller<asp>(asp(2), options),
                       "cadence::blocking_controller: evict_after must be > 0, got 0.000000 s",
                       invalid_parameter_error);
}

TEST_CASE("a silent worker is evicted at the deadline and not before; a worker calling in is alive however late") {
  blocking_controller<asp, manual_clock> bc(asp(3), start_manual_clock(1s));
  for (worker_id p = 0; p < 3; ++p) bc.push(p);
  manual_clock::advance(1s - 1ns);
  CHECK(bc.check_liveness().empty());
  manual_clock::advance(4s + 1ns);
  bc.push(0);  // 5 s late, but calling in proves it alive; its push notices the other two
  const std::vector<eviction> evicted = bc.evictions();
  REQUIRE(evicted.size() == 2);
  CHECK(evicted[0].worker == 1);  // longest silent first: 1 was heard before 2
  CHECK(evicted[1].worker == 2);
  for (const eviction& e : evicted) {
    CHECK(e.clock == 1);
    CHECK(e.silent_for == 5s);
    CHECK(e.at == 5s);
  }
  CHECK(bc.check_liveness().empty());  // already evicted: reported once
  bc.inspect([](const asp& c) { CHECK(c.active_workers() == 1); });
}

TEST_CASE("a push or finish after eviction is a worker_error saying why it was evicted") {
  blocking_controller<ssp, manual_clock> bc(ssp(2, 3), start_manual_clock(1s));
  bc.push(1);
  manual_clock::advance(2500ms);
  bc.push(0);
  const std::string why =
      "it was evicted at clock 1 after 2.500000 s of silence (no push or finish for "
      "evict_after = 1.000000 s)";
  CHECK_THROWS_WITH_AS(bc.push(1), ("cadence::blocking_controller: worker 1 cannot push: " + why).c_str(),
                       worker_error);
  CHECK_THROWS_WITH_AS(bc.finish(1), ("cadence::blocking_controller: worker 1 cannot finish: " + why).c_str(),
                       worker_error);
  CHECK_FALSE(bc.remove_worker(1));
}

TEST_CASE("time blocked in push is not silence, and a released worker's silence starts at its release" *
          doctest::timeout(30)) {
  blocking_controller<bsp, manual_clock> bc(bsp(2), start_manual_clock(1s));
  std::string error;
  std::thread a = block_worker_0(bc, error);
  manual_clock::advance(10s);
  bc.check_liveness();  // or worker 0's timed wait notices first: either evicts at 10 s
  a.join();
  const std::vector<eviction> first = bc.evictions();
  CHECK(error == "");
  REQUIRE(first.size() == 1);
  CHECK(first[0].worker == 1);  // worker 0 waited 10 s for it and is not evicted for that
  CHECK(first[0].clock == 0);

  manual_clock::advance(1s - 1ns);
  CHECK(bc.check_liveness().empty());
  manual_clock::advance(1ns);
  const std::vector<eviction> second = bc.check_liveness();
  REQUIRE(second.size() == 1);
  CHECK(second[0].worker == 0);
  CHECK(second[0].clock == 1);
  CHECK(second[0].silent_for == 1s);  // since its release at 10 s, not its push at 0 s
}

TEST_CASE("a blocked thread notices a dead peer by itself when nobody calls in" * doctest::timeout(30)) {
  blocking_controller<bsp, manual_clock> bc(bsp(2), start_manual_clock(50ms));
  std::string error;
  std::thread a = block_worker_0(bc, error);
  manual_clock::advance(1s);
  // Nothing else calls in: only worker 0's own timed wait (at most 50 ms of real time, the
  // deadline it computed) can see that worker 1 never pushed. Without it, push times out.
  a.join();
  CHECK(error == "");
  const std::vector<eviction> evicted = bc.evictions();
  REQUIRE(evicted.size() == 1);
  CHECK(evicted[0].worker == 1);
  CHECK(evicted[0].clock == 0);
}

TEST_CASE("a worker that dies in any phase of any policy is evicted and the others finish" *
          doctest::timeout(120)) {
  for (const char* policy : {"bsp", "ssp:2", "dssp:2:6"})
    for (death when : {death::at_start, death::mid_run, death::while_others_wait})
      dies_and_is_evicted(policy, when);
  // Under ASP nobody ever waits for the dead worker: only the liveness rule notices it.
  for (death when : {death::at_start, death::mid_run}) dies_and_is_evicted("asp", when);
  for (death when : {death::monitoring, death::running, death::at_barrier})
    dies_and_is_evicted("elastic:4", when);
}

TEST_CASE("with the steady clock a dead worker is evicted and the survivors finish" *
          doctest::timeout(60)) {
  // Real time end to end. The deadline is a liveness bound with a wide margin (a survivor is
  // never silent for more than a few microseconds between its pushes), not a timing check.
  blocking_options options;
  options.evict_after = 3s;
  blocking_controller<bsp> bc(bsp(3), options);
  std::string errors[3];
  std::vector<std::thread> threads;
  for (worker_id p = 0; p < 3; ++p) {
    threads.emplace_back([&, p] {
      guarded(errors[p], [&] {
        const int iterations = p == 1 ? 3 : 10;  // worker 1 dies after 3 pushes
        for (int i = 0; i < iterations; ++i) bc.push(p, 30s);
        if (p != 1) bc.finish(p);
      });
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) CHECK(e == "");
  const std::vector<eviction> evicted = bc.evictions();
  REQUIRE(evicted.size() == 1);
  CHECK(evicted[0].worker == 1);
  CHECK(evicted[0].clock == 3);
  CHECK(evicted[0].silent_for >= 3s);
}

TEST_CASE("a timed wait names the workers it waited for" * doctest::timeout(30)) {
  blocking_controller<bsp> bc(bsp(3));
  std::string message;
  try {
    bc.push(0, 50ms);
  } catch (const timeout_error& e) {
    message = e.what();
  }
  CHECK(message.find("worker 0 at clock 1 (bsp) waited") != std::string::npos);
  CHECK(message.find("for workers 1 (clock 0), 2 (clock 0)") != std::string::npos);
  // Still waiting in the controller: another push is refused, a resumed wait works.
  CHECK_THROWS_AS(bc.push(0, 10ms), worker_error);
  std::thread one([&] { bc.push(1, 10s); });
  std::thread two([&] { bc.push(2, 10s); });
  bc.wait_for_release(0, 10s);
  one.join();
  two.join();
  bc.inspect([](const bsp& c) { CHECK(c.waiting_count() == 0); });
}

TEST_CASE("removing a dead worker wakes the threads that waited for it" * doctest::timeout(30)) {
  blocking_controller<bsp> bc(bsp(3));
  std::thread a([&] { bc.push(0, 10s); });
  std::thread b([&] { bc.push(1, 10s); });
  CHECK(eventually([&] { return waiting(bc, {0, 1}); }));
  CHECK(bc.remove_worker(2));  // declared dead by a failure detector
  a.join();
  b.join();
  bc.inspect([](const bsp& c) {
    CHECK(c.active_workers() == 2);
    CHECK(c.waiting_count() == 0);
  });
}

TEST_CASE("a worker removed while it waits gets an error instead of hanging" * doctest::timeout(30)) {
  blocking_controller<bsp> bc(bsp(2));
  std::string message;
  std::thread a([&] { guarded(message, [&] { bc.push(0, 10s); }); });
  CHECK(eventually([&] { return waiting(bc, {0}); }));
  bc.remove_worker(0);
  a.join();
  CHECK(message ==
        "cadence::blocking_controller: worker 0 stopped waiting: it was removed at clock 1 "
        "(remove_worker() was called)");
  const worker_id p = bc.add_worker();
  CHECK(p == 2);
}
