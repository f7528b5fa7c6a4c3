// cadence-train's report and command line without a job: the JSON, CSV and curves shapes
// (exactly the documented keys), and the flags' rules that need no job.
#include "options.hpp"
#include "report.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

using namespace cadence;
using namespace cadence::train;

namespace {
// A 30 s report of `policy` with the measured figures both JSON tests give; each sets the rest.
policy_report measured(const char* policy, double iterations_per_second, double wait_fraction, double time_to_70,
                       std::vector<double> worker_transfer_seconds) {
  policy_report r;
  r.policy = policy;
  r.seconds = 30;
  r.iterations_per_second = iterations_per_second;
  r.wait_fraction = wait_fraction;
  r.time_to_70 = time_to_70;
  r.worker_transfer_seconds = std::move(worker_transfer_seconds);
  return r;
}
}  // namespace

TEST_CASE("JSON: exactly the documented keys in order, null for targets never reached") {
  policy_report a = measured("bsp", 20, 0.25, 7, {0.0101, 0.0905});
  a.workers = 4;
  a.iterations = 600;
  a.max_staleness = 0;
  a.final_accuracy = 0.81;
  a.best_accuracy = 0.82;
  a.simulated_iterations_per_second = 20.5;
  a.simulated_wait_fraction = 0.24;
  policy_report b = a;
  b.worker_transfer_seconds = {0.02, std::nan("")};
  b.policy = "asp";
  b.evicted = {1, 3};
  b.time_to_80 = 12.5;
  const std::string j = to_json({a, b});
  CHECK(j ==
        "[\n {\"policy\": \"bsp\", \"transport\": \"mpi-ps\", \"workers\": 4, \"seconds\": 30.0, \"iterations\": 600, "
        "\"iterations_per_second\": 20.0, \"wait_fraction\": 0.25, \"max_staleness\": 0, \"final_accuracy\": 0.81, "
        "\"best_accuracy\": 0.82, \"time_to_70\": 7.0, \"time_to_80\": null, \"evicted\": [], "
        "\"worker_transfer_seconds\": [0.0101, 0.0905], \"simulated\": "
        "{\"iterations_per_second\": 20.5, \"wait_fraction\": 0.24}},\n {\"policy\": \"asp\", \"transport\": "
        "\"mpi-ps\", \"workers\": 4, \"seconds\": 30.0, \"iterations\": 600, \"iterations_per_second\": 20.0, "
        "\"wait_fraction\": 0.25, \"max_staleness\": 0, \"final_accuracy\": 0.81, \"best_accuracy\": 0.82, "
        "\"time_to_70\": 7.0, \"time_to_80\": 12.5, \"evicted\": [1, 3], "
        "\"worker_transfer_seconds\": [0.02, null], \"simulated\": "
        "{\"iterations_per_second\": 20.5, \"wait_fraction\": 0.24}}\n]\n");
  CHECK(to_json({}) == "[]\n");
  const std::string c = to_csv({b});
  CHECK(c.find("policy,transport,workers,") == 0);
  CHECK(c.find("\nasp,mpi-ps,4,30,600,20,0.25,0,0,0.81,0.82,7.000,12.500,1;3,20.5,0.24\n") != std::string::npos);
  b.curve = {{0, 0.1}, {1, 0.5}};
  CHECK(curves_csv({b}) == "policy,seconds,accuracy\nasp,0.000,0.1000\nasp,1.000,0.5000\n");
}

TEST_CASE("JSON: measured figures keep 6 significant digits, times to accuracy the millisecond") {
  const std::string j = to_json({measured("ssp:3", 22.466666666, 0.2273561234, 6.0004, {0.002362734567})});
  CHECK(j.find("\"iterations_per_second\": 22.4667, \"wait_fraction\": 0.227356,") != std::string::npos);
  CHECK(j.find("\"time_to_70\": 6.0,") != std::string::npos);
  CHECK(j.find("\"worker_transfer_seconds\": [0.00236273]") != std::string::npos);
}

namespace {
train_options parse(std::vector<const char*> words) {
  words.insert(words.begin(), "cadence-train");
  return parse_options(static_cast<int>(words.size()), const_cast<char**>(words.data()));
}
}  // namespace

TEST_CASE("options: the documented defaults, and each policy flag in order") {
  const train_options d = parse({});
  CHECK(d.policies == std::vector<std::string>{"bsp", "asp", "ssp:3", "dssp:3:15", "elastic:15"});
  CHECK(d.seconds == 30);
  CHECK(d.transport == "mpi");
  CHECK_FALSE(d.rank.has_value());
  const train_options o = parse({"--policy", "asp", "--policy=periodic:4", "--rank", "2", "--transport", "zmq"});
  CHECK(o.policies == std::vector<std::string>{"asp", "periodic:4"});
  CHECK(o.rank == 2);
  CHECK(parse({"--help"}).help.rfind("usage: mpirun -np N cadence-train", 0) == 0);
  CHECK(parse({"--help"}).help.find("profiles:\n  homogeneous: ") != std::string::npos);
}

TEST_CASE("options: rules between flags name the flags") {
  CHECK_THROWS_WITH_AS(parse({"--join-after", "1"}),
                       "--join-after: needs --transport zmq (a process cannot join a running MPI job), got --transport mpi",
                       tools::usage_error);
  CHECK_THROWS_WITH_AS(parse({"--transport", "zmq", "--seconds", "3", "--join-after", "5"}),
                       "--join-after: 5 s must be less than --seconds 3 (the late worker joins the running policy)",
                       tools::usage_error);
  CHECK_THROWS_WITH_AS(parse({"--store", "/tmp", "--rendezvous", "h:1"}), "--rendezvous: cannot be combined with --store",
                       tools::usage_error);
  CHECK_THROWS_WITH_AS(parse({"--model", "cnn"}), "--model: expected mlp or softmax, got 'cnn'", tools::usage_error);
  CHECK_THROWS_WITH_AS(parse({"--seconds", "1", "--seconds", "2"}), "--seconds: given twice", tools::usage_error);
  CHECK_THROWS_AS(parse({"--seconds", "100", "--eval-every", "0.001"}), tools::usage_error);
}

TEST_CASE("launched: any transport but mpi takes the path without MPI") {
  auto launched_for = [](std::vector<const char*> words) {
    words.insert(words.begin(), "cadence-train");
    return launched(static_cast<int>(words.size()), const_cast<char**>(words.data()));
  };
  CHECK_FALSE(launched_for({}));
  CHECK_FALSE(launched_for({"--transport", "mpi"}));
  CHECK(launched_for({"--transport", "gloo"}));
  CHECK(launched_for({"--transport=zmq"}));
  CHECK(launched_for({"--transport", "tcp"}));
}
