// cadence-sim: runs synchronization policies on a simulated parameter-server cluster and
// prints how much each one waits, how stale it gets and how fast it trains.
#include "common.hpp"

#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/sim/collective.hpp>
#include <cadence/sim/local_sgd.hpp>
#include <cadence/sim/membership.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>
#include <cadence/sim/trace_replay.hpp>

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* default_policies[] = {"bsp", "asp", "ssp:3", "dssp:3:15", "elastic:15", "elastic:60"};
constexpr const char* default_collective_modes[] = {"bsp", "periodic:4", "elastic:4", "periodic:15", "elastic:15"};
constexpr const char* default_local_sgd[] = {"fixed:1,outer=sgd:1", "fixed:20", "fixed:20,fragments=4,delay=2,codec=int4",
                                             "elastic:20", "quorum:3:20"};

namespace sim = cadence::sim;
namespace tools = cadence::tools;
using cadence::tools::usage_error;

constexpr const char* usage = "usage: cadence-sim [options]\n";

constexpr const char* description =
    "Simulates a parameter-server cluster and compares synchronization policies on it.\n"
    "With no options: every default policy on the default scenario (hetero16), as a table.\n";

constexpr const char* footer =
    R"(columns (JSON and CSV keys in brackets; "-" or null where one does not apply):
  iter/s          cluster iterations (pushes) per simulated second [iterations_per_second]
  wait%           share of the workers' alive time spent idle, waiting for a release
                  [wait_fraction]
  wait/iter       mean idle time per iteration [mean_wait]
  stale p99/max   staleness as the policies bound it: the clock gap c_p - c_min when the
                  server lets a worker start an iteration, 99th percentile and max over
                  all starts [start_staleness_p99, start_staleness_max]. 0 under bsp,
                  <= s under ssp:s, <= s_U under dssp; unbounded under asp and elastic
  behind mean/p99/max
                  staleness of the weights a gradient was computed on, for every policy:
                  how many other pushes the server applied between the worker's pull and
                  the arrival of its push [updates_behind_mean, updates_behind_p99,
                  updates_behind_max]
  barriers        barriers the policy completed (ElasticBSP); "-" for policies without
                  barriers of their own (under bsp every iteration ends in one release
                  event: see release_events in JSON and CSV) [barriers]
  superstep       ElasticBSP: fewest-most iterations a worker made between two barriers,
                  and in parentheses the two parts of their bound as observed: the most
                  monitoring pushes and the most planned pushes (at most R) of a worker in
                  one superstep [superstep_iterations_min, superstep_iterations_max,
                  superstep_monitoring_max, superstep_planned_max]
  ctrl ns         wall-clock nanoseconds inside controller.push() per push, the only
                  column that varies between runs [controller_ns_per_push]
  (after the table) the simulator's speed: push events handled per wall-clock second
                  and the run's wall time [events_per_second]

columns with --membership (one row per worker count):
  faults/h        workers lost per simulated hour [faults, simulated_seconds]
  simulated       committed steps / the steps a fault-free job commits in the same
                  time, from the simulation, +- its standard error [efficiency,
                  efficiency_stderr]
  closed          the same from the closed-form expectation [expected_efficiency]
  ideal           the ideal that excludes only the lost ranks' own work
                  [lost_work_ideal]
  reconf/h        reconfigurations (failures and admissions) per hour
                  [reconfigurations]
  reconf%, detect%, xfer%
                  share of time re-forming, waiting for a fault to be detected and
                  streaming state to replacements [reconfiguration_fraction,
                  detection_fraction, transfer_fraction]
  overlap         expected faults within one fault's cycle: the closed form holds
                  while it is well below 1 [overlap]

columns with --collective:
  steps/s         local steps of all ranks per simulated second [steps_per_second]
  wait%           share of rank time spent at a barrier waiting for the slowest rank
                  [wait_fraction]
  comm%           share of time inside merge all-reduces [allreduce_fraction]
  barriers        merges [barriers]
  steps/bar       mean local steps per rank between two merges [steps_per_barrier]
  max local       most local steps any rank ran between two merges (<= R, <= k)
                  [max_local_steps]
)";

class progress_bar {
public:
  explicit progress_bar(std::string label) : label_(std::move(label)), start_(clock::now()) {}
  void operator()(double fraction) {
    // Only long runs get a bar, so quick ones do not flicker.
    if (!shown_ && clock::now() - start_ < std::chrono::milliseconds(300)) return;
    shown_ = true;
    const int width = 30;
    const int filled = static_cast<int>(fraction * width + 0.5);
    std::fprintf(stderr, "\r%-14s [%.*s%*s] %3d%%", label_.c_str(), filled,
                 "##############################", width - filled, "",
                 static_cast<int>(fraction * 100 + 0.5));
    std::fflush(stderr);
  }
  ~progress_bar() {
    if (shown_) std::fprintf(stderr, "\r%60s\r", "");
  }

private:
  using clock = std::chrono::steady_clock;
  std::string label_;
  clock::time_point start_;
  bool shown_ = false;
};

enum class output { table, json, csv };

// The flags of one mode (--local-sgd, --membership): each one's help says "with MODE: " first,
// and reject_given() turns them down when the mode is off.
class mode_flags {
public:
  mode_flags(tools::command_line& cli, std::string mode) : cli_(cli), mode_(std::move(mode)) {}

  template <class T>
  void add(const std::string& name, T& value, const std::string& value_name, const CLI::Validator& rule,
           const std::string& help) {
    cli_.add_option(name, value, declared(name, help))->option_text(value_name)->check(rule);
  }
  // A repeatable one (command_line::add_list), checked where it is used.
  template <class T>
  void add_list(const std::string& name, std::vector<T>& values, const std::string& value_name,
                const std::string& help) {
    cli_.add_list(name, values, declared(name, help))->option_text(value_name);
  }

  // Throws usage_error "FLAG: only with MODE" for the first of them (in declaration order) given.
  void reject_given() const {
    for (const auto& name : names_)
      if (cli_.given(name)) throw usage_error(name + ": only with " + mode_);
  }

private:
  // Records `name` for reject_given(); returns its help as --help shows it.
  std::string declared(const std::string& name, const std::string& help) {
    names_.push_back(name);
    return "with " + mode_ + ": " + help;
  }

  tools::command_line& cli_;
  std::string mode_;
  std::vector<std::string> names_;
};

// simulate(): a config the library rejects (parse_error, invalid_parameter_error) is a bad
// --policy (usage_error, exit status 2).
template <class Simulate>
auto with_policy_errors(Simulate simulate) {
  try {
    return simulate();
  } catch (const cadence::parse_error& e) {
    throw usage_error(std::string("--policy: ") + e.what());
  } catch (const cadence::invalid_parameter_error& e) {
    throw usage_error(std::string("--policy: ") + e.what());
  }
}

bool has_links(const cadence::sim::scenario& s) {
  for (const auto& w : s.workers)
    if (w.push_seconds || w.pull_seconds) return true;
  return false;
}

// "; own links: worker 3 push 45 ms, pull 45 ms" for the table's header, or "".
std::string links_text(const cadence::sim::scenario& s) {
  std::string out;
  for (std::size_t p = 0; p < s.workers.size(); ++p) {
    if (!s.workers[p].push_seconds && !s.workers[p].pull_seconds) continue;
    char cell[96];
    std::snprintf(cell, sizeof cell, "%sworker %zu push %g ms, pull %g ms", out.empty() ? "; own links: " : "; ", p,
                  1e3 * cadence::sim::push_seconds_of(s, p), 1e3 * cadence::sim::pull_seconds_of(s, p));
    out += cell;
  }
  return out;
}

// The three forms a tool's results take, one cadence::sim writer each.
template <class Metrics>
struct report_writers {
  using writer = void (*)(std::ostream&, const std::vector<Metrics>&);
  writer json, csv, table;
};

// Prints runs as JSON, as CSV, or as the table between header() and after() (printf lines;
// stdout is flushed before the table goes through std::cout). Returns main's exit status.
template <class Metrics, class Header, class After = void (*)()>
int print_runs(output format, const std::vector<Metrics>& runs, report_writers<Metrics> w, Header header,
               After after = [] {}) {
  if (format == output::json) {
    w.json(std::cout, runs);
  } else if (format == output::csv) {
    w.csv(std::cout, runs);
  } else {
    header();
    std::fflush(stdout);
    w.table(std::cout, runs);
    after();
  }
  return 0;
}

// The table's first line: "scenario NAME (N ranks, seed K): DESCRIPTION" (ranks or workers).
void print_scenario(const cadence::sim::scenario& s, const char* members) {
  std::printf("scenario %s (%zu %s, seed %llu): %s\n", s.name.c_str(), s.workers.size(), members,
              static_cast<unsigned long long>(s.seed), s.description.c_str());
}

// The end of an all-reduce table's header: "S simulated s" or "N steps per rank", after `before`.
void print_run_length(const cadence::sim::scenario& s, const char* before) {
  if (s.seconds > 0)
    std::printf("%s%g simulated s\n\n", before, s.seconds);
  else
    std::printf("%s%llu steps per rank\n\n", before, static_cast<unsigned long long>(s.iterations));
}

int run_collective(const cadence::sim::scenario& s, std::vector<std::string> modes,
                   double allreduce_cost, output format) {
  if (modes.empty()) modes.assign(std::begin(default_collective_modes), std::end(default_collective_modes));
  cadence::sim::collective_options opt;
  opt.allreduce_seconds = allreduce_cost;
  std::vector<cadence::sim::collective_metrics> runs;
  const bool tty = isatty(STDERR_FILENO) != 0;
  for (const auto& mode : modes) {
    progress_bar bar(mode);
    if (tty) opt.progress = [&bar](double f) { bar(f); };
    runs.push_back(with_policy_errors([&] { return cadence::sim::simulate_collective(mode, s, opt); }));
  }
  const report_writers<sim::collective_metrics> writers{sim::write_collective_json, sim::write_collective_csv,
                                                    sim::write_collective_table};
  return print_runs(format, runs, writers, [&] {
    print_scenario(s, "ranks");
    std::printf("all-reduce cluster: merge %g ms%s; ",
                1e3 * (allreduce_cost >= 0 ? allreduce_cost : cadence::sim::link_allreduce_seconds(s)),
                allreduce_cost < 0 && has_links(s) ? " (the slowest link's)" : "");
    print_run_length(s, "");
  });
}

// --membership: the membership model at each worker count, simulated and in closed form.
int run_membership(cadence::sim::membership_model model, std::vector<std::size_t> counts,
                   const cadence::sim::membership_run_options& opt, output format) {
  std::vector<cadence::sim::membership_metrics> runs;
  for (const std::size_t n : counts) {
    model.workers = n;
    try {
      runs.push_back(cadence::sim::simulate_membership(model, opt));
    } catch (const cadence::invalid_parameter_error& e) {
      throw usage_error(std::string("--membership: ") + e.what());
    }
  }
  const report_writers<sim::membership_metrics> writers{sim::write_membership_json, sim::write_membership_csv,
                                                    sim::write_membership_table};
  return print_runs(format, runs, writers, [&] {
    const bool retry = model.loss == cadence::membership::on_loss::retry;
    std::printf("membership model: MTBF %g s per worker; detection %g s, reconfiguration %g s, restart %g s;\n"
                "state %g MB over %g MB/s from %zu donor(s); %zu step(s) of %g s, then a %g s sync; %s a failed sync\n",
                model.mtbf_seconds, model.detection_seconds, model.reconfiguration_seconds, model.restart_seconds,
                model.state_bytes / 1e6, model.link_bytes_per_second / 1e6, model.donors, model.sync_every,
                model.step_seconds, model.sync_seconds, retry ? "retry" : "discard");
    if (opt.seconds > 0)
      std::printf("%g simulated s per row after a warm-up, seed %llu\n\n", opt.seconds,
                  static_cast<unsigned long long>(opt.seed));
    else
      std::printf("about %llu faults per row, seed %llu\n\n", static_cast<unsigned long long>(opt.faults),
                  static_cast<unsigned long long>(opt.seed));
  });
}

// --local-sgd: the local-SGD configs (exchange::diloco's) on an all-reduce cluster.
int run_local_sgd(const cadence::sim::scenario& s, std::vector<std::string> configs,
                  const cadence::sim::local_sgd_sim_options& opt, output format) {
  if (configs.empty()) configs.assign(std::begin(default_local_sgd), std::end(default_local_sgd));
  std::vector<cadence::sim::local_sgd_metrics> runs;
  for (const auto& config : configs)
    runs.push_back(with_policy_errors([&] { return cadence::sim::simulate_local_sgd(config, s, opt); }));
  const report_writers<sim::local_sgd_metrics> writers{sim::write_local_sgd_json, sim::write_local_sgd_csv,
                                                   sim::write_local_sgd_table};
  return print_runs(format, runs, writers, [&] {
    print_scenario(s, "ranks");
    std::printf("local SGD: %zu f32 parameters, links of %g MB/s", opt.parameters, opt.bytes_per_second / 1e6);
    for (std::size_t p = 0; p < opt.link_scale.size(); ++p)
      if (opt.link_scale[p] != 1.0) std::printf(" (worker %zu: x%g)", p, opt.link_scale[p]);
    print_run_length(s, "; ");
  });
}

int run(int argc, char** argv) {
  std::string scenario_name(cadence::sim::default_scenario_name);
  std::size_t workers = 0;
  double seconds = -1, push_cost = -1, pull_cost = -1, allreduce_cost = -1;
  bool collective = false, local_sgd = false;
  cadence::sim::local_sgd_sim_options local_opt;
  std::vector<std::string> share_texts;
  std::uint64_t iterations = 0, seed = 1;
  std::vector<std::string> policies;
  std::string trace_path;
  cadence::sim::replay_options replay;

  bool list_scenarios = false, json = false, csv = false;
  cadence::tools::command_line cli(usage, description);
  cli.footer(footer);
  cadence::tools::add_cluster_flags(cli, scenario_name, workers,
                                    "scenario to simulate (default hetero16; see --list-scenarios)");
  // No bound of its own: check_simulated_work below bounds seconds x workers.
  cli.add_option("--seconds", seconds, "run for S simulated seconds (default: the scenario's own)")
      ->option_text("S")
      ->check(cadence::tools::positive(std::numeric_limits<double>::max()));
  cli.add_option("--iterations", iterations,
                 "instead run until the cluster has made N iterations per worker\n"
                 "(N * workers pushes in total); not with --seconds. Either way a\n"
                 "run is at most 100000000 pushes per policy: N * workers, or\n"
                 "S * workers / the fastest worker's iteration time")
      ->option_text("N")
      ->check(cadence::tools::integer<std::uint64_t>(1, UINT64_MAX));
  cli.add_list("--policy", policies,
               "a make_controller config: bsp, asp, ssp:<s>, dssp:<s_L>:<s_U>,\n"
               "elastic:<R>[:...]; repeat to compare several (default: bsp, asp,\n"
               "ssp:3, dssp:3:15, elastic:15, elastic:60)")
      ->option_text("CONFIG");
  cli.add_seed(seed, "N",
               "random seed (default 1); a seed gives the same run every time (not with\n"
               "--trace: a replay draws no random numbers)");
  cli.add_option("--push-cost", push_cost, "seconds for a push to reach the server (default: the scenario's)")
      ->option_text("S")
      ->check(cadence::tools::non_negative());
  cli.add_option("--pull-cost", pull_cost, "seconds for a worker to pull the weights (default: the scenario's)")
      ->option_text("S")
      ->check(cadence::tools::non_negative());
  std::vector<std::string> link_texts;
  cli.add_list("--link", link_texts,
               "worker W's own link: its push and pull take PUSH and PULL seconds\n"
               "(PULL defaults to PUSH) instead of --push-cost/--pull-cost or the\n"
               "scenario's; a network straggler, slow by its link alone. Repeat for\n"
               "other workers. With --collective a merge is paced by the slowest link\n"
               "(unless --allreduce-cost is given). Not with --trace (a trace records\n"
               "each worker's costs)")
      ->option_text("W=PUSH[,PULL]")
      ->check(cadence::tools::checked([](std::string& text) { (void)cadence::tools::parse_link(text); }));
  cli.add_option("--trace", trace_path,
                 "replay recorded per-worker iteration times instead of a scenario: a\n"
                 "CSV iteration trace (header worker,start,compute[,push,pull]; one\n"
                 "row per iteration; see docs/trace.md), as cadence-train --trace\n"
                 "writes it. Each worker computes for its recorded times and pays its\n"
                 "recorded push/pull costs (or --push-cost/--pull-cost); the policy\n"
                 "decides the waits. The run ends when the first worker has used all\n"
                 "its rows, or earlier at --seconds/--iterations. Not with --scenario,\n"
                 "--workers or --collective")
      ->option_text("FILE");
  cli.add_flag("--trace-wrap", replay.wrap,
               "with --trace: a worker that has used all its rows starts them again;\n"
               "needs --seconds or --iterations");
  cli.add_flag("--collective", collective,
               "simulate an all-reduce cluster instead (no parameter server): the\n"
               "collective adapters' modes bsp, periodic:<k> (average every k local\n"
               "steps) and elastic:<R>[:...] (ElasticBSP over collectives, planned by\n"
               "the elastic_averager's own planner), given with --policy (default:\n"
               "bsp, periodic:4, elastic:4, periodic:15, elastic:15). A merge costs\n"
               "--allreduce-cost seconds; worker failures are not modelled");
  cli.add_option("--allreduce-cost", allreduce_cost,
                 "seconds of one merge all-reduce with --collective (default: push +\n"
                 "pull cost; with --link, the slowest push plus the slowest pull)")
      ->option_text("S")
      ->check(cadence::tools::non_negative());
  cli.add_flag("--local-sgd", local_sgd,
               "simulate local SGD (DiLoCo, exchange::diloco) on an all-reduce\n"
               "cluster instead: --policy takes its config strings (default:\n"
               "fixed:1,outer=sgd:1 fixed:20 fixed:20,fragments=4,delay=2,codec=int4\n"
               "elastic:20 quorum:3:20); see docs/local-sgd.md");
  mode_flags local_sgd_flags(cli, "--local-sgd");
  local_sgd_flags.add("--parameters", local_opt.parameters, "N", tools::integer<std::size_t>(1, std::size_t{1} << 40),
                      "f32 elements of the model (default 1000000)");
  local_sgd_flags.add("--bandwidth", local_opt.bytes_per_second, "B", tools::positive(1e15),
                      "bytes per second of a link (default 1.25e9)");
  local_sgd_flags.add_list("--link-share", share_texts, "W=F",
                           "worker W's link runs at F (in (0, 1]) of\n"
                           "--bandwidth; a ring is paced by its slowest link. Repeat for others");
  bool membership = false;
  cadence::sim::membership_model model;
  cadence::sim::membership_run_options membership_opt;
  std::string loss_text = "retry";
  cli.add_flag("--membership", membership,
               "model a fault-tolerant collective job on the membership layer\n"
               "instead: workers fail, the survivors detect it, re-form and retry or\n"
               "discard the sync, a replacement rejoins with the state; prints the\n"
               "committed-step efficiency for 100, 1000, 10000 and 100000 workers\n"
               "(or --workers), simulated and in closed form (docs/collective.md)");
  mode_flags membership_flags(cli, "--membership");
  membership_flags.add("--mtbf", model.mtbf_seconds, "S", tools::positive(1e15),
                       "mean seconds between failures of one worker\n"
                       "(default 1e7)");
  membership_flags.add("--detection", model.detection_seconds, "S", tools::non_negative(),
                       "seconds from a fault to the survivors' failed\n"
                       "sync at the latest: 0 for crashes, the heartbeat timeout for hangs\n"
                       "(default 5)");
  membership_flags.add("--reconfiguration", model.reconfiguration_seconds, "S", tools::non_negative(),
                       "seconds of one re-forming of the quorum (default 1)");
  membership_flags.add("--restart", model.restart_seconds, "S", tools::non_negative(),
                       "seconds from a fault to its replacement's join\n"
                       "request (default 60)");
  membership_flags.add("--state-bytes", model.state_bytes, "B", tools::non_negative(1e15),
                       "bytes of state a replacement receives (default 1e9)");
  membership_flags.add("--link-rate", model.link_bytes_per_second, "B", tools::positive(1e15),
                       "bytes per second of a donor's link (default 1.25e9)");
  membership_flags.add("--donors", model.donors, "N", tools::integer<std::size_t>(1, 1000000),
                       "members streaming the state to replacements\n"
                       "admitted together (member_options::max_donors; default 1)");
  membership_flags.add("--step-time", model.step_seconds, "S", tools::non_negative(),
                       "seconds of one local step (default 1)");
  membership_flags.add("--sync-every", model.sync_every, "K", tools::integer<std::size_t>(1, 1000000),
                       "local steps per sync (default 1: BSP)");
  membership_flags.add("--sync-cost", model.sync_seconds, "S", tools::non_negative(),
                       "seconds of one fault-free sync (default 0.1)");
  membership_flags.add("--on-loss", loss_text, "RULE", tools::one_of({"retry", "discard"}),
                       "what a sync that lost a member does: retry\n"
                       "(model averaging keeps the local steps) or discard (BSP gradients;\n"
                       "default retry)");
  membership_flags.add("--faults", membership_opt.faults, "N", tools::integer<std::uint64_t>(1, 100000000),
                       "faults to simulate per row, unless --seconds\n"
                       "gives the length (default 20000)");
  cli.add_flag("--json", json, "print one JSON array, one object per policy");
  cli.add_flag("--csv", csv, "print CSV: a header row and one row per policy; not with --json");
  cli.add_flag("--list-scenarios", list_scenarios, "list the named scenarios and exit");
  // Each pair sets one thing (the run length, the output format): both would drop one.
  cli.at_most_one_of({"--seconds", "--iterations"}).at_most_one_of({"--json", "--csv"});
  if (!cli.read(argc, argv)) {
    std::cout << cli.help();
    return 0;
  }
  if (list_scenarios) {
    for (const auto& info : cadence::sim::scenario_catalog())
      std::printf("%-13s %5zu workers %4g s  %s\n", info.name.c_str(), info.default_workers,
                  cadence::sim::make_scenario(info.name).seconds, info.description.c_str());
    return 0;
  }
  const output format = json ? output::json : csv ? output::csv : output::table;
  if (membership) {
    for (const char* other : {"--scenario", "--iterations", "--policy", "--push-cost", "--pull-cost", "--link", "--trace",
                              "--trace-wrap", "--collective", "--allreduce-cost", "--local-sgd", "--parameters",
                              "--bandwidth", "--link-share"})
      if (cli.given(other)) throw usage_error(std::string(other) + ": not with --membership");
    model.loss = loss_text == "discard" ? cadence::membership::on_loss::discard : cadence::membership::on_loss::retry;
    membership_opt.seed = seed;
    if (seconds > 0) membership_opt.seconds = seconds;
    std::vector<std::size_t> counts{100, 1000, 10000, 100000};
    if (workers > 0) counts = {workers};
    return run_membership(model, counts, membership_opt, format);
  }
  membership_flags.reject_given();
  std::vector<cadence::tools::link_flag> links;
  for (const auto& text : link_texts) links.push_back(cadence::tools::parse_link(text));

  std::optional<cadence::iteration_trace> trace;
  cadence::sim::scenario s;
  if (cli.given("--trace")) {
    if (cli.given("--link")) throw usage_error("--link: not with --trace (the trace records each worker's costs)");
    for (const char* other : {"--scenario", "--workers", "--collective", "--allreduce-cost"})
      if (cli.given(other)) throw usage_error(std::string(other) + ": not with --trace (the trace gives the workers)");
    if (cli.given("--seed")) throw usage_error("--seed: not with --trace (a replay draws no random numbers)");
    if (replay.wrap && seconds <= 0 && iterations == 0)
      throw usage_error("--trace-wrap: needs --seconds or --iterations (a wrapped trace never runs out)");
    trace = cadence::read_iteration_trace_file(trace_path);
    s = cadence::sim::trace_scenario(*trace, "trace " + trace_path);
    replay.push_seconds = push_cost;
    replay.pull_seconds = pull_cost;
    push_cost = pull_cost = -1;
    if (!trace->has_costs) {  // the flags' costs, or none
      if (replay.push_seconds < 0) replay.push_seconds = 0;
      if (replay.pull_seconds < 0) replay.pull_seconds = 0;
    }
    // The scenario describes the run: flags that replace the recorded costs replace every
    // worker's (trace_scenario gave each its recorded mean).
    for (auto& w : s.workers) {
      if (replay.push_seconds >= 0) w.push_seconds.reset();
      if (replay.pull_seconds >= 0) w.pull_seconds.reset();
    }
    if (replay.push_seconds >= 0) s.push_seconds = replay.push_seconds;
    if (replay.pull_seconds >= 0) s.pull_seconds = replay.pull_seconds;
  } else {
    if (replay.wrap) throw usage_error("--trace-wrap: only with --trace");
    s = cadence::tools::scenario_from_flags(scenario_name, workers, seed);
  }
  if (seconds > 0) s.seconds = seconds;
  if (iterations > 0) {
    s.seconds = 0;
    s.iterations = iterations;
  }
  if (push_cost >= 0) s.push_seconds = push_cost;
  if (pull_cost >= 0) s.pull_seconds = pull_cost;
  cadence::tools::apply_links(s, links, "--link");
  cadence::tools::check_simulated_work(s, cli.given("--iterations") ? "--iterations"
                                          : cli.given("--seconds")  ? "--seconds"
                                                                     : "--workers");
  cadence::sim::validate(s);

  if (local_sgd) {
    for (const char* other : {"--collective", "--allreduce-cost", "--link"})
      if (cli.given(other)) throw usage_error(std::string(other) + ": not with --local-sgd");
    for (const auto& text : share_texts) {
      const auto eq = text.find('=');
      if (eq == std::string::npos)
        throw usage_error("--link-share: expected 'W=F' (a worker and its share of --bandwidth), got '" + text + "'");
      const auto w = cadence::tools::with_flag("--link-share", [&] {
        return cadence::tools::parse_integer<std::size_t>(std::string_view(text).substr(0, eq), 0,
                                                          s.workers.size() - 1, "W");
      });
      const double f = cadence::tools::with_flag(
          "--link-share", [&] { return cadence::tools::parse_real(std::string_view(text).substr(eq + 1), false); });
      if (!(f <= 1.0)) throw usage_error("--link-share: a share must be in (0, 1], got '" + text + "'");
      local_opt.link_scale.resize(s.workers.size(), 1.0);
      local_opt.link_scale[w] = f;
    }
    return run_local_sgd(s, policies, local_opt, format);
  }
  local_sgd_flags.reject_given();
  if (collective) return run_collective(s, policies, allreduce_cost, format);
  if (cli.given("--allreduce-cost"))
    throw usage_error("--allreduce-cost: only with --collective");

  // The default list names policies a build may not have yet: skip those, with a note.
  const bool defaults = policies.empty();
  if (defaults) policies.assign(std::begin(default_policies), std::end(default_policies));
  std::vector<cadence::sim::run_metrics> runs;
  const bool tty = isatty(STDERR_FILENO) != 0;
  for (const auto& policy : policies) {
    cadence::any_controller c;
    try {
      c = cadence::make_controller(policy, s.workers.size());
    } catch (const cadence::parse_error& e) {
      if (!defaults) throw usage_error(std::string("--policy: ") + e.what());
      std::fprintf(stderr, "cadence-sim: note: skipping default policy %s: %s\n", policy.c_str(), e.what());
      continue;
    } catch (const cadence::invalid_parameter_error& e) {
      throw usage_error(std::string("--policy: ") + e.what());
    }
    cadence::sim::run_options opt;
    progress_bar bar(policy);
    if (tty) opt.progress = [&bar](double f) { bar(f); };
    runs.push_back(trace ? cadence::sim::simulate_trace(c, s, *trace, replay, opt) : cadence::sim::simulate(c, s, opt));
  }

  return print_runs(
      format, runs, {sim::write_json, sim::write_csv, sim::write_table},
      [&] {
        if (trace)
          std::printf("%s: %s%s\n", s.name.c_str(), s.description.c_str(),
                      replay.wrap ? ", each worker's rows repeated" : ", until the first worker runs out");
        else
          print_scenario(s, "workers");
        if (trace) {
          char length[64];
          if (s.seconds > 0)
            std::snprintf(length, sizeof length, "%g simulated s", s.seconds);
          else
            std::snprintf(length, sizeof length, "%llu iterations per worker",
                          static_cast<unsigned long long>(s.iterations));
          const bool recorded = trace->has_costs && replay.push_seconds < 0 && replay.pull_seconds < 0;
          std::printf("run: at most %s, push %g ms, pull %g ms%s\n\n", length, 1e3 * s.push_seconds,
                      1e3 * s.pull_seconds, recorded ? " (the recorded ones' means; each iteration pays its own)" : "");
        } else if (s.seconds > 0)
          std::printf("run: %g simulated s, push %g ms, pull %g ms%s\n\n", s.seconds, 1e3 * s.push_seconds,
                      1e3 * s.pull_seconds, links_text(s).c_str());
        else
          std::printf("run: %llu iterations per worker, push %g ms, pull %g ms%s\n\n",
                      static_cast<unsigned long long>(s.iterations), 1e3 * s.push_seconds, 1e3 * s.pull_seconds,
                      links_text(s).c_str());
      },
      [&] {
        // The simulator's own speed (wall clock, so it varies from run to run).
        std::cout << "\nsimulator speed (wall clock):";
        for (const auto& m : runs) {
          char cell[128];
          std::snprintf(cell, sizeof cell, " %s %.2f M events/s (%.1f s);", m.policy.c_str(),
                        m.events_per_second / 1e6, m.wall_seconds);
          std::cout << cell;
        }
        std::cout << "\n";
      });
}

}  // namespace

int main(int argc, char** argv) { return cadence::tools::guarded_main("cadence-sim", run, argc, argv); }
