// cadence-race: races synchronization policies on a simulated cluster that trains a real model
// on Fashion-MNIST, and prints what each policy buys in test accuracy per simulated second.
#include "common.hpp"
#include "json.hpp"
#include "race.hpp"

#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenarios.hpp>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* default_policies[] = {"bsp", "asp", "ssp:3", "dssp:3:15", "elastic:15"};
constexpr const char* default_data = "/usr/share/datasets/fashion-mnist";
constexpr double default_seconds = 120;

using cadence::tools::usage_error;

constexpr const char* usage = "usage: cadence-race [options]\n";

constexpr const char* description =
    "Races synchronization policies on a simulated parameter-server cluster that trains a real\n"
    "model (softmax regression) on Fashion-MNIST: every push carries the gradient of a real\n"
    "minibatch computed on the weights the worker pulled, and the server applies it when the push\n"
    "arrives. Prints test accuracy against simulated time per policy.\n"
    "With no options: bsp, asp, ssp:3, dssp:3:15 and elastic:15 on hetero16 for 120 simulated s.\n";

constexpr const char* footer = R"(columns (JSON keys in brackets):
  final           test accuracy of the final weights on the whole test set [final_accuracy]
  best            best accuracy on the curve [best_accuracy]
  t@70% t@80%     first simulated second at which the curve reached that accuracy ("-":
                  never) [time_to_accuracy]
  iters           gradients applied (pushes) [iterations]
  wait%           share of the workers' time spent waiting for a release [wait_fraction]
  stale p99/max   the clock gap c_p - c_min when a worker starts an iteration, as in
                  cadence-sim: 0 under bsp, <= s under ssp:s, <= s_U under dssp
                  [start_staleness_p99, start_staleness_max]
  behind mean/p99/max
                  how many other gradients the server applied between a worker's pull of
                  the weights and the arrival of its own gradient: the staleness the model
                  sees, for every policy [updates_behind_mean, updates_behind_p99,
                  updates_behind_max]
)";

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * v);
  return buf;
}

std::string seconds_or_dash(const cadence::train::time_to_accuracy& t) {
  if (!t.reached()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%gs", t.seconds);
  return buf;
}

// Keys of the simulator's JSON (cadence-sim --json) that the race reports too, with the same
// names and meanings, so the two tools' outputs can be joined.
constexpr const char* cluster_keys[] = {
    "policy", "scenario", "workers", "simulated_seconds", "iterations", "wait_fraction",
    "start_staleness_max", "start_staleness_p99", "updates_behind_mean", "updates_behind_p99",
    "updates_behind_max", "barriers", "superstep_iterations_min", "superstep_iterations_max"};

void write_json(const std::vector<cadence::train::race_result>& runs) {
  using cadence::tools::json;
  using cadence::tools::significant;
  auto doc = json::array();
  for (const auto& r : runs) {
    json run;
    // The simulator's fields as it writes them (cadence/sim/report.hpp), read back as JSON.
    const auto fields = cadence::sim::detail::fields(r.metrics);
    for (const char* key : cluster_keys)
      for (const auto& f : fields)
        if (f.first == key) run[key] = json::parse(f.second);
    run["final_accuracy"] = significant(r.final_test.accuracy, 9);
    run["final_loss"] = significant(r.final_test.loss, 9);
    run["final_test_examples"] = r.final_test_examples;
    run["best_accuracy"] = significant(r.best_accuracy, 9);
    json reached = json::object();
    for (const auto& t : r.reached) {
      char target[32];
      std::snprintf(target, sizeof target, "%g", t.target);
      reached[target] = significant(t.seconds, 9);
    }
    run["time_to_accuracy"] = reached;
    json curve = json::array();
    for (const auto& p : r.curve)
      curve.push_back({significant(p.seconds, 9), significant(p.accuracy, 9), significant(p.loss, 9), p.updates});
    run["curve"] = curve;
    doc.push_back(run);
  }
  std::fputs(cadence::tools::json_document(doc).c_str(), stdout);
}

int run(int argc, char** argv) {
  std::string data_dir = default_data;
  std::string scenario_name(cadence::sim::default_scenario_name);
  std::size_t workers = 0;
  double seconds = default_seconds;
  std::uint64_t seed = 1;
  std::vector<std::string> policies;
  cadence::train::race_options o;
  bool json = false, csv = false;

  cadence::tools::command_line cli(usage, description);
  cli.footer(footer);
  cli.add_option("--data", data_dir,
                 "Fashion-MNIST directory (default /usr/share/datasets/fashion-mnist,\n"
                 "from the Debian package dataset-fashion-mnist)")
      ->option_text("DIR")
      ->check(cadence::tools::not_empty("a directory"));
  cadence::tools::add_cluster_flags(cli, scenario_name, workers,
                                    "cluster scenario (default hetero16; see cadence-sim --list-scenarios)");
  cli.add_option("--seconds", seconds, "simulated seconds to train (default 120)")
      ->option_text("S")
      ->check(cadence::tools::positive(1e9));
  cli.add_list("--policy", policies,
               "a make_controller config (bsp, asp, ssp:<s>, dssp:<s_L>:<s_U>,\n"
               "elastic:<R>...); repeat to compare several")
      ->option_text("CONFIG");
  cli.add_seed(seed, "N", "seed of the cluster and of the data order (default 1)");
  cli.add_option("--lr", o.learning_rate, "SGD step size the server applies per push (default 0.005)")
      ->option_text("X")
      ->check(cadence::tools::positive(1e9));
  cli.add_option("--batch", o.batch_size, "examples per worker iteration (default 32)")
      ->option_text("N")
      ->check(cadence::tools::integer<std::size_t>(1, 1u << 20));
  cli.add_option("--eval-every", o.eval_every_seconds,
                 "simulated seconds between test evaluations (default 2); at most\n"
                 "1000 evaluations per run, so S >= seconds / 1000")
      ->option_text("S")
      ->check(cadence::tools::positive(1e9));
  cli.add_option("--train-limit", o.train_limit, "train on the first N training images only (default: all 60000)")
      ->option_text("N")
      ->check(cadence::tools::integer<std::size_t>(1, SIZE_MAX));
  cli.add_option("--test-limit", o.test_limit,
                 "evaluate the curve on the first N test images (default 2000); the\n"
                 "final accuracy always uses the whole test set")
      ->option_text("N")
      ->check(cadence::tools::integer<std::size_t>(1, SIZE_MAX));
  cli.add_flag("--json", json, "one JSON array, one object per policy, with its curve");
  cli.add_flag("--csv", csv,
               "the curves as CSV: policy,seconds,accuracy,loss,updates\n"
               "(at most one of --json and --csv)");
  cli.at_most_one_of({"--json", "--csv"});
  if (!cli.read(argc, argv)) {
    std::cout << cli.help();
    return 0;
  }
  o.seed = seed;
  // Checked here, before the data load, so the mistake costs no time.
  if (seconds / o.eval_every_seconds > static_cast<double>(cadence::train::max_curve_points)) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "--eval-every: %g s over the %g s run means more than %zu test evaluations; use "
                  "--eval-every >= %g",
                  o.eval_every_seconds, seconds, cadence::train::max_curve_points,
                  seconds / static_cast<double>(cadence::train::max_curve_points));
    throw usage_error(buf);
  }

  cadence::sim::scenario s = cadence::tools::scenario_from_flags(scenario_name, workers, seed);
  s.seconds = seconds;
  s.iterations = 0;
  cadence::tools::check_simulated_work(s, "--seconds");

  if (policies.empty()) policies.assign(std::begin(default_policies), std::end(default_policies));
  // Parse every policy before the (slow) data load, so a typo fails at once.
  for (const auto& policy : policies) {
    try {
      (void)cadence::make_controller(policy, s.workers.size());
    } catch (const cadence::error& e) {
      throw usage_error(std::string("--policy: ") + e.what());
    }
  }

  const auto wall_start = std::chrono::steady_clock::now();
  cadence::train::train_test_data data;
  try {
    data = cadence::train::load_fashion_mnist(data_dir);
  } catch (const cadence::error& e) {
    throw usage_error(std::string("--data: ") + e.what());
  }
  if (o.train_limit > data.train.size()) o.train_limit = 0;
  if (o.train_limit != 0 && o.train_limit < s.workers.size())
    throw usage_error("--train-limit: " + std::to_string(o.train_limit) + " images for " +
                      std::to_string(s.workers.size()) + " workers; every worker needs at least one");

  std::vector<cadence::train::race_result> runs;
  for (const auto& policy : policies) runs.push_back(cadence::train::run_race(policy, s, data, o));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  if (json) {
    write_json(runs);
  } else if (csv) {
    std::printf("policy,seconds,accuracy,loss,updates\n");
    for (const auto& r : runs)
      for (const auto& p : r.curve)
        std::printf("%s,%g,%.6f,%.6f,%llu\n", r.metrics.policy.c_str(), p.seconds, p.accuracy, p.loss,
                    static_cast<unsigned long long>(p.updates));
  } else {
    const std::size_t n_train = o.train_limit == 0 ? data.train.size() : o.train_limit;
    const std::size_t n_eval = o.test_limit == 0 || o.test_limit > data.test.size() ? data.test.size() : o.test_limit;
    std::printf("race: softmax regression on Fashion-MNIST (%zu training images in %zu shards, batch %zu, lr %g)\n",
                n_train, s.workers.size(), o.batch_size, o.learning_rate);
    std::printf("cluster: scenario %s (%zu workers, seed %llu), %g simulated s; curve on %zu test images every "
                "%g s, final on all %zu\n\n",
                s.name.c_str(), s.workers.size(), static_cast<unsigned long long>(seed), s.seconds, n_eval,
                o.eval_every_seconds, data.test.size());
    std::printf("%-20s %6s %6s %6s %6s %7s %6s %13s %19s\n", "policy", "final", "best", "t@70%", "t@80%", "iters",
                "wait%", "stale p99/max", "behind mean/p99/max");
    for (const auto& r : runs) {
      const auto& m = r.metrics;
      std::printf("%-20s %6s %6s %6s %6s %7llu %6s %13s %19s\n", m.policy.c_str(),
                  percent(r.final_test.accuracy).c_str(), percent(r.best_accuracy).c_str(),
                  seconds_or_dash(r.reached[0]).c_str(), seconds_or_dash(r.reached[1]).c_str(),
                  static_cast<unsigned long long>(m.iterations), percent(m.wait_fraction).c_str(),
                  cadence::sim::detail::start_staleness_cell(m).c_str(),
                  cadence::sim::detail::updates_behind_cell(m).c_str());
    }
    std::printf("\n(%.1f s of wall-clock time, data loading included)\n", wall);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return cadence::tools::guarded_main("cadence-race", run, argc, argv); }
