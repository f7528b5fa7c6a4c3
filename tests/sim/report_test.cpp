#include <cadence/sim/report.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::sim;

namespace {
std::vector<run_metrics> two_runs() {
  scenario s = make_scenario("hetero2");
  s.seconds = 5;
  return {simulate("bsp", s), simulate("ssp:3", s)};
}
std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("the JSON report is one array with one object per run and the documented fields") {
  std::ostringstream os;
  write_json(os, two_runs());
  const std::string j = os.str();
  CHECK(j.front() == '[');
  CHECK(j.substr(j.size() - 2) == "]\n");
  CHECK(count(j, "{") == 2);
  CHECK(j.find("\"policy\": \"bsp\"") != std::string::npos);
  CHECK(j.find("\"policy\": \"ssp:3\"") != std::string::npos);
  for (const char* key : {"\"workers\": 2", "\"iterations_per_second\": ", "\"wait_fraction\": ",
                          "\"start_staleness_max\": ", "\"start_staleness_p99\": ",
                          "\"updates_behind_mean\": ", "\"updates_behind_p99\": ", "\"updates_behind_max\": ",
                          "\"release_events\": ", "\"controller_ns_per_push\": ", "\"scenario\": \"hetero2\"",
                          "\"seed\": 1", "\"superstep_iterations_mean\": null"})
    CHECK_MESSAGE(count(j, key) == 2, key);
  // Neither bsp nor ssp counts barriers of its own: null, not their release events.
  CHECK(count(j, "\"barriers\": null") == 2);
  // bsp starts every iteration in step; ssp:3 never more than 3 clocks ahead.
  CHECK(j.find("\"start_staleness_max\": 0,") < j.find("\"policy\": \"ssp:3\""));
  CHECK(count(j, "\"max_staleness\"") == 0);
  std::ostringstream empty;
  write_json(empty, {});
  CHECK(empty.str() == "[]\n");
}

TEST_CASE("the CSV report has a header row and one row per run with the same columns") {
  std::ostringstream os;
  write_csv(os, two_runs());
  std::istringstream in(os.str());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].rfind("policy,scenario,seed,workers,", 0) == 0);
  CHECK(lines[1].rfind("bsp,hetero2,1,2,", 0) == 0);
  CHECK(count(lines[1], ",") == count(lines[0], ","));
  CHECK(count(lines[2], ",") == count(lines[0], ","));
}

TEST_CASE("the table report has a header and a row per run") {
  std::ostringstream os;
  write_table(os, two_runs());
  const std::string t = os.str();
  CHECK(count(t, "\n") == 3);
  CHECK(t.find("ssp:3") != std::string::npos);
  CHECK(t.find("stale p99/max") != std::string::npos);
}

TEST_CASE("the table and the JSON show an elasticbsp run's barriers and superstep sizes") {
  scenario s = make_scenario("hetero2");
  s.seconds = 30;
  const run_metrics m = simulate("elastic:4", s);
  REQUIRE(m.barriers.has_value());
  REQUIRE(*m.barriers > 0);
  std::ostringstream table, json;
  write_table(table, {m});
  write_json(json, {m});
  // The superstep column: "MIN-MAX (MONITORING+PLANNED)".
  const std::string superstep = std::to_string(m.superstep_iterations_min) + "-" +
                                std::to_string(m.superstep_iterations_max) + " (" +
                                std::to_string(m.superstep_monitoring_max) + "+" +
                                std::to_string(m.superstep_planned_max) + ")";
  CHECK(table.str().find(superstep) != std::string::npos);
  CHECK(json.str().find("\"barriers\": " + std::to_string(*m.barriers) + ",") != std::string::npos);
  CHECK(json.str().find("\"superstep_planned_max\": " + std::to_string(m.superstep_planned_max) + ",") !=
        std::string::npos);
}
