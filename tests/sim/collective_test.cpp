#include <cadence/sim/collective.hpp>
#include <cadence/sim/scenarios.hpp>

#include <doctest/doctest.h>

#include <sstream>
#include <string>

using namespace cadence;
using namespace cadence::sim;

namespace {

// Two ranks without jitter: 0.1 s and 0.3 s per step, merges of 10 ms, 30 s.
scenario steady_pair() {
  scenario s;
  s.name = "steady_pair";
  worker_model fast, slow;
  fast.iteration_seconds = 0.1;
  slow.iteration_seconds = 0.3;
  s.workers = {fast, slow};
  s.push_seconds = s.pull_seconds = 0.005;
  s.seconds = 30;
  return s;
}

}  // namespace

TEST_CASE("collective bsp waits for the slowest rank every step, as computed by hand") {
  const collective_metrics m = simulate_collective("bsp", steady_pair());
  // Each round: 0.3 s of the slow rank plus a 10 ms merge; the fast rank waits 0.2 s.
  const auto rounds = static_cast<std::uint64_t>(30 / 0.31);
  CHECK(m.barriers == rounds);
  CHECK(m.steps == 2 * rounds);
  CHECK(m.wait_seconds == doctest::Approx(0.2 * static_cast<double>(rounds)));
  CHECK(m.max_local_steps == 1);
  CHECK(m.steps_per_barrier == 1.0);
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
  const collective_metrics m = simulate_collective("periodic:5", steady_pair());
  const auto rounds = static_cast<std::uint64_t>(30 / 1.51);
  CHECK(m.barriers == rounds);
  CHECK(m.steps == 10 * rounds);
  CHECK(m.wait_seconds == doctest::Approx(1.0 * static_cast<double>(rounds)));
  CHECK(m.max_local_steps == 5);
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
  scenario s = steady_pair();
  s.seconds = 0;
  s.iterations = 50;
  const collective_metrics m = simulate_collective("periodic:5", s);
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
