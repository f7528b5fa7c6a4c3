// apps/train/trace.hpp: cadence-train's timings become a trace that reads back and replays.
#include "trace.hpp"

#include <cadence/sim/trace_replay.hpp>

#include <doctest/doctest.h>

#include <sstream>

TEST_CASE("push_pull timings become compute times, start times and the measured transfer") {
  // Worker 0: push_pulls at 1.0 (blocked 0.5) and 2.0 (0.25): iterations start at 0 and 1.5
  // and compute 1.0 and 0.5. Worker 1: one push_pull at 2.0.
  const std::vector<std::vector<cadence::train::exchange_timing>> timings = {{{1.0, 0.5}, {2.0, 0.25}}, {{2.0, 0.1}}};
  const auto tr = cadence::train::trace_from_timings(timings, {0.002, 0.002});
  REQUIRE(tr.size() == 2);
  CHECK(tr.has_costs);
  REQUIRE(tr.workers[0].size() == 2);
  CHECK(tr.workers[0][1].start == 1.5);
  CHECK(tr.workers[0][1].compute == 0.5);
  CHECK(tr.workers[0][1].push == 0.001);
  CHECK(tr.workers[1][0].compute == 2.0);
  std::stringstream file;
  cadence::write_iteration_trace(file, tr);
  const auto back = cadence::read_iteration_trace(file);
  CHECK(back.iterations() == 3);
  // Replayed under ASP, worker 0 pushes at 1.001 and 1.503 s and runs out when it would start
  // a third iteration (1.504 s), before worker 1's push at 2.001 s.
  const auto m = cadence::sim::simulate_trace("asp", cadence::sim::trace_scenario(back), back);
  CHECK(m.iterations == 2);
  CHECK(m.per_worker[1].iterations == 0);
  CHECK(m.simulated_seconds == doctest::Approx(1.504));
}

TEST_CASE("each worker's rows carry its own transfer, so a replay keeps a slow link slow") {
  // Two workers compute 0.1 s per iteration; worker 1's link costs 0.09 s per push_pull against
  // worker 0's 0.01 s (the timings block exactly that long: no policy wait). Under ASP a
  // replay runs worker 0 at 0.11 s and worker 1 at 0.19 s per iteration, each on its own.
  std::vector<std::vector<cadence::train::exchange_timing>> timings(2);
  for (int k = 0; k < 40; ++k) timings[0].push_back({0.1 + 0.11 * k, 0.01});
  for (int k = 0; k < 20; ++k) timings[1].push_back({0.1 + 0.19 * k, 0.09});
  const std::vector<double> parked = {0.0, 0.0};
  const std::vector<double> costs = cadence::train::worker_transfer_seconds(timings, parked);
  REQUIRE(costs.size() == 2);
  CHECK(costs[0] == doctest::Approx(0.01));
  CHECK(costs[1] == doctest::Approx(0.09));
  const auto tr = cadence::train::trace_from_timings(timings, costs);
  CHECK(tr.workers[0][3].push == doctest::Approx(0.005));
  CHECK(tr.workers[1][3].push == doctest::Approx(0.045));
  CHECK(tr.workers[1][3].pull == doctest::Approx(0.045));
  CHECK(tr.workers[1][3].compute == doctest::Approx(0.1));
  // Worker 1 runs out first: its 20 rows end when it would start a 21st, at 20 x 0.19 s.
  const auto m = cadence::sim::simulate_trace("asp", cadence::sim::trace_scenario(tr), tr);
  CHECK(m.simulated_seconds == doctest::Approx(20 * 0.19));
  CHECK(m.per_worker[1].iterations == 20);
  CHECK(m.per_worker[0].iterations == 34);  // pushes at 0.105 + 0.11 k <= 3.8 s
  // The scenario the trace gives keeps each worker's mean link for a model run too.
  const auto s = cadence::sim::trace_scenario(tr);
  CHECK(*s.workers[1].push_seconds == doctest::Approx(0.045));
  CHECK(*s.workers[0].pull_seconds == doctest::Approx(0.005));
}

TEST_CASE("several policies write one trace file each, named after the policy") {
  using cadence::train::trace_file_for;
  CHECK(trace_file_for("run.csv", "dssp:3:15", 1) == "run.csv");
  CHECK(trace_file_for("run.csv", "dssp:3:15", 2) == "run-dssp_3_15.csv");
  CHECK(trace_file_for("out/run", "elastic:15", 2) == "out/run-elastic_15");
  CHECK(trace_file_for("a.b/run", "bsp", 3) == "a.b/run-bsp");
}
