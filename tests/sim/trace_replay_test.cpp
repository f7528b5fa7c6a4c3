// sim/trace_replay.hpp: simulated workers replay recorded compute, push and pull times; a run
// ends at the first exhausted worker (or wraps); hand-computed runs pin the arithmetic.
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>
#include <cadence/sim/trace_replay.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace cadence;
using namespace cadence::sim;

namespace {

iteration_trace computes(std::vector<std::vector<double>> per_worker) {
  iteration_trace tr;
  for (const auto& row : per_worker) {
    tr.workers.emplace_back();
    double start = 0;
    for (const double c : row) {
      tr.workers.back().push_back({start, c, 0, 0});
      start += c;
    }
  }
  return tr;
}

}  // namespace

TEST_CASE("a BSP replay of a recorded trace makes exactly the known pushes, time and wait") {
  // Worker 0 computes 1, 1, 1 s; worker 1 2, 3, 1 s. BSP rounds end at 2, 5 and 6 s; worker
  // 0 waits 1 + 2 + 0 = 3 s of the 2 x 6 worker-seconds.
  const auto tr = read_iteration_trace_file(CADENCE_TEST_DATA_DIR "/trace_bsp.csv");
  const scenario s = trace_scenario(tr);
  CHECK(s.workers.size() == 2);
  CHECK(s.iterations == 3);
  const run_metrics m = simulate_trace("bsp", s, tr);
  CHECK(m.iterations == 6);
  CHECK(m.simulated_seconds == 6.0);
  CHECK(m.per_worker[0].wait_seconds == 3.0);
  CHECK(m.per_worker[1].wait_seconds == 0.0);
  CHECK(m.wait_fraction == 0.25);
  CHECK(m.per_worker[1].compute_seconds == 6.0);
}

TEST_CASE("recorded push and pull costs are paid per iteration, and flags can replace them") {
  // Iteration 1 arrives at 1.5 and 2.5 s, BSP releases at 2.5, both start at 2.75; iteration
  // 2 arrives at 4.25 and 6.25, starts at 6.5; iteration 3 arrives at 8 and 8 s.
  const auto tr = read_iteration_trace_file(CADENCE_TEST_DATA_DIR "/trace_costs.csv");
  const scenario s = trace_scenario(tr);
  CHECK(s.push_seconds == 0.5);
  // Each worker's own mean costs too, which a model run of the scenario would pay.
  CHECK(s.workers[1].push_seconds == 0.5);
  CHECK(s.workers[1].pull_seconds == 0.25);
  const run_metrics m = simulate_trace("bsp", s, tr);
  CHECK(m.iterations == 6);
  CHECK(m.simulated_seconds == 8.0);
  CHECK(m.per_worker[0].wait_seconds == 3.0);
  replay_options free;
  free.push_seconds = 0;
  free.pull_seconds = 0;
  CHECK(simulate_trace("bsp", s, tr, free).simulated_seconds == 6.0);
}

TEST_CASE("without wrap the run ends when the first worker runs out of recorded iterations") {
  // ASP: worker 1 pushes once at 2 s and has nothing left; worker 0 pushes at 1 and 2 s.
  const auto tr = computes({{1, 1, 1, 1}, {2}});
  const run_metrics m = simulate_trace("asp", trace_scenario(tr), tr);
  CHECK(m.iterations == 3);
  CHECK(m.simulated_seconds == 2.0);
  CHECK(m.per_worker[0].iterations == 2);
  CHECK(m.per_worker[1].iterations == 1);
}

TEST_CASE("with wrap a worker starts its recorded iterations again until the run's length") {
  // ASP, 3 iterations per worker = 6 pushes: worker 0 at 1, 3, 4 (1, 2, 1 s again), worker 1
  // at 3, 6, 9: the sixth push is worker 1's second, at 6 s.
  const auto tr = computes({{1, 2}, {3}});
  scenario s = trace_scenario(tr);
  s.iterations = 3;
  replay_options wrap;
  wrap.wrap = true;
  trace_source source(tr, wrap);
  any_controller c = make_controller("asp", 2);
  const run_metrics m = simulate_with(c, s, source);
  CHECK(m.iterations == 6);
  CHECK(m.simulated_seconds == 6.0);
  CHECK(m.per_worker[0].iterations == 4);
  CHECK(m.per_worker[1].iterations == 2);
  CHECK(source.wraps() >= 3);  // worker 0 at 3 s, worker 1 at 3 s, then both at 6 s
  // A timed run with wrap: 10 s of ASP is 7 pushes of worker 0 (1,3,4,6,7,9,10) and 3 of worker 1.
  s.iterations = 0;
  s.seconds = 10;
  const run_metrics timed = simulate_trace("asp", s, tr, wrap);
  CHECK(timed.iterations == 10);
  CHECK(timed.simulated_seconds == 10.0);
}

TEST_CASE("a timed replay without wrap ends at the shorter of its length and the trace") {
  const auto tr = computes({{1, 1, 1, 1}, {1, 1, 1, 1}});
  scenario s = trace_scenario(tr);
  s.iterations = 0;
  s.seconds = 2.5;
  CHECK(simulate_trace("bsp", s, tr).iterations == 4);
  s.seconds = 100;
  const run_metrics m = simulate_trace("bsp", s, tr);
  CHECK(m.iterations == 8);
  CHECK(m.simulated_seconds == 4.0);
}

TEST_CASE("every policy runs on a replayed trace and the model simulator is unchanged by the refactor") {
  const auto tr = computes({{0.1, 0.12, 0.1, 0.11, 0.1, 0.1}, {0.17, 0.2, 0.16, 0.17, 0.18, 0.17}, {0.1, 0.1, 0.1, 0.3, 0.1, 0.1}});
  for (const char* policy : {"bsp", "asp", "ssp:1", "dssp:1:3", "elastic:2"}) {
    CAPTURE(policy);
    const run_metrics m = simulate_trace(policy, trace_scenario(tr), tr);
    CHECK(m.iterations >= 6);
    CHECK(m.iterations <= 18);
  }
  // The model source is what simulate() always used: a zero-jitter worker takes its base time.
  scenario s = make_scenario("homogeneous", 2);
  for (auto& w : s.workers) w.jitter = jitter_kind::none;
  s.push_seconds = s.pull_seconds = 0;
  s.seconds = 0;
  s.iterations = 10;
  const run_metrics m = simulate("bsp", s);
  CHECK(m.simulated_seconds == doctest::Approx(1.0));
}

TEST_CASE("a trace and a scenario of different sizes are rejected") {
  const auto tr = computes({{1}, {1}});
  CHECK_THROWS_WITH_AS(simulate_trace("bsp", make_scenario("homogeneous", 3), tr),
                       "cadence::sim::simulate_trace: the trace has 2 workers but scenario 'homogeneous' has 3",
                       invalid_parameter_error);
  CHECK_THROWS_AS(trace_scenario(iteration_trace{}), invalid_parameter_error);
}
