#include <cadence/sim/collective.hpp>
#include <cadence/sim/scenarios.hpp>

#include "sim/steady_scenarios.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>

using namespace cadence;
using namespace cadence::sim;
using test::steady_pair;

namespace {

// Runs steady_pair() under `mode` and checks the hand count: 30 s of rounds of `round_seconds`,
// each `local_steps` steps per rank and `wait_seconds` of waiting (the fast rank's).
collective_metrics check_steady_rounds(const std::string& mode, double round_seconds,
                                       std::int64_t local_steps, double wait_seconds) {
  const collective_metrics m = simulate_collective(mode, steady_pair());
  const auto rounds = static_cast<std::uint64_t>(30 / round_seconds);
  CHECK(m.barriers == rounds);
  CHECK(m.steps == 2 * static_cast<std::uint64_t>(local_steps) * rounds);
  CHECK(m.wait_seconds == doctest::Approx(wait_seconds * static_cast<double>(rounds)));
  CHECK(m.max_local_steps == local_steps);
  return m;
}

}  // namespace

TEST_CASE("collective bsp waits for the slowest rank every step, as computed by hand") {
  // Each round: 0.3 s of the slow rank plus a 10 ms merge; the fast rank waits 0.2 s.
  CHECK(check_steady_rounds("bsp", 0.31, 1, 0.2).steps_per_barrier == 1.0);
}

TEST_CASE("a synchronous all-reduce is paced by the slowest link unless its cost is given") {
  // Two ranks computing alike (0.1 s), 5 ms links, but rank 1's own link takes 45 ms each
  // way: every merge takes 90 ms, so a BSP round is 0.19 s for both ranks.
  scenario s = steady_pair();
  s.workers[0].iteration_seconds = 0.1;
  s.workers[1].iteration_seconds = 0.1;
  s.workers[1].push_seconds = s.workers[1].pull_seconds = 0.045;
  CHECK(link_allreduce_seconds(s) == doctest::Approx(0.09));
  const collective_metrics m = simulate_collective("bsp", s);
  const auto rounds = static_cast<std::uint64_t>(30 / 0.19);
  CHECK(m.barriers == rounds);
  CHECK(m.steps_per_second == doctest::Approx(2 / 0.19).epsilon(0.01));
  CHECK(m.allreduce_fraction == doctest::Approx(0.09 / 0.19).epsilon(0.01));
  // The slowest push and the slowest pull need not be one rank's.
  s.workers[1].pull_seconds.reset();
  s.workers[0].pull_seconds = 0.03;
  CHECK(link_allreduce_seconds(s) == doctest::Approx(0.045 + 0.03));
  // No link of its own anywhere: the scenario's push + pull, as before.
  CHECK(link_allreduce_seconds(steady_pair()) == doctest::Approx(0.01));
  // A given cost wins over the links.
  collective_options opt;
  opt.allreduce_seconds = 0.01;
  CHECK(simulate_collective("bsp", s, opt).barriers == static_cast<std::uint64_t>(30 / 0.11));
}

TEST_CASE("collective periodic averaging runs k local steps per rank between merges") {
  // Each round: five steps of the slow rank (1.5 s) plus a 10 ms merge; the fast rank waits 1 s.
  check_steady_rounds("periodic:5", 1.51, 5, 1.0);
}

TEST_CASE("collective elastic plans 3:1 steps for a 3x speed gap and stops waiting") {
  const collective_metrics m = simulate_collective("elastic:6", steady_pair());
  CHECK(m.mode == "elastic:6:last:fast");
  CHECK(m.bsp_barriers == 1);  // warm-up: one step of history is enough for "last"
  CHECK(m.max_local_steps == 3);
  // Only the warm-up round waits (0.2 s); every planned round ends together (rounding of the
  // step times to microseconds aside).
  CHECK(m.wait_seconds == doctest::Approx(0.2).epsilon(0.01));
  const collective_metrics bsp = simulate_collective("bsp", steady_pair());
  CHECK(m.steps_per_second > 1.5 * bsp.steps_per_second);
}

TEST_CASE("collective modes never run more than R or k local steps on the shipped heterogeneous "
          "scenarios, and ElasticBSP waits less than BSP") {
  for (const char* name : {"hetero2", "hetero16", "drift8"}) {
    scenario s = make_scenario(name);
    s.seconds = 60;
    const collective_metrics bsp = simulate_collective("bsp", s);
    const collective_metrics per = simulate_collective("periodic:8", s);
    const collective_metrics el = simulate_collective("elastic:8:median:3", s);
    CHECK(per.max_local_steps == 8);
    CHECK(el.max_local_steps <= 8);
    CHECK(el.max_local_steps >= 1);
    // drift8's ranks are still nearly equal in the first minute: there ElasticBSP may plan
    // BSP-like rounds and wait exactly as much.
    if (std::string(name) == "drift8")
      CHECK_MESSAGE(el.wait_fraction <= bsp.wait_fraction, std::string(name));
    else
      CHECK_MESSAGE(el.wait_fraction < 0.7 * bsp.wait_fraction, std::string(name));
    CHECK(bsp.barriers > 0);
    // The same seed gives the same run.
    const collective_metrics again = simulate_collective("elastic:8:median:3", s);
    CHECK(again.steps == el.steps);
    CHECK(again.wait_seconds == el.wait_seconds);
  }
}

TEST_CASE("collective runs with a step target stop once every rank made that many on average") {
  const collective_metrics m =
      simulate_collective("periodic:5", test::iteration_limited(steady_pair(), 50));
  CHECK(m.steps == 100);
  CHECK(m.barriers == 10);
  CHECK(m.simulated_seconds == doctest::Approx(10 * 1.51));
}

TEST_CASE("collective modes are checked and reports carry every field") {
  CHECK_THROWS_WITH_AS(simulate_collective("ssp:3", steady_pair()),
                       doctest::Contains("unknown collective mode 'ssp:3'"), parse_error);
  CHECK_THROWS_WITH_AS(simulate_collective("periodic:0", steady_pair()),
                       doctest::Contains("periodic:<k>"), parse_error);
  CHECK_THROWS_AS(simulate_collective("elastic:0", steady_pair()), invalid_parameter_error);
  std::vector<collective_metrics> runs{simulate_collective("bsp", steady_pair())};
  std::ostringstream json, csv, table;
  write_collective_json(json, runs);
  write_collective_csv(csv, runs);
  write_collective_table(table, runs);
  CHECK(json.str().find("\"mode\": \"bsp\"") != std::string::npos);
  CHECK(json.str().find("\"max_local_steps\": 1") != std::string::npos);
  CHECK(csv.str().rfind("mode,scenario", 0) == 0);
  CHECK(table.str().find("steps/bar") != std::string::npos);
}
