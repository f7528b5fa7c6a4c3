// cadence-sim: runs synchronization policies on a simulated parameter-server cluster and
// prints how much each one waits, how stale it gets and how fast it trains.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* default_policies[] = {"bsp", "asp", "ssp:3", "dssp:3:15", "elastic:15", "elastic:60"};

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void print_help() {
  std::cout <<
R"(usage: cadence-sim [options]

Simulates a parameter-server cluster and compares synchronization policies on it.
With no options: every default policy on the default scenario (hetero16), as a table.

options:
  --scenario NAME    scenario to simulate (default hetero16; see --list-scenarios)
  --workers N        number of workers (default: the scenario's own)
  --seconds S        run for S simulated seconds (default: the scenario's own)
  --iterations N     instead run until the cluster has made N iterations per worker
                     (N * workers pushes in total)
  --policy CONFIG    a make_controller config: bsp, asp, ssp:<s>, dssp:<s_L>:<s_U>,
                     elastic:<R>[:...]; repeat to compare several (default: bsp, asp,
                     ssp:3, dssp:3:15, elastic:15, elastic:60)
  --seed N           random seed (default 1); a seed gives the same run every time
  --push-cost S      seconds for a push to reach the server (default: the scenario's)
  --pull-cost S      seconds for a worker to pull the weights (default: the scenario's)
  --json             print one JSON array, one object per policy
  --csv              print CSV: a header row and one row per policy
  --list-scenarios   list the named scenarios and exit
  --help             this text

columns: iter/s = cluster iterations per simulated second; wait% = share of the workers'
time spent idle waiting for a release; wait/iter = mean idle time per iteration;
stale.max / stale.p99 = c_p - c_min right after a push (max and 99th percentile);
barriers = the policy's completed barriers (ElasticBSP) or else release events (pushes or
removals that released waiting workers; one per global barrier under BSP); superstep =
ElasticBSP's fewest-most iterations a worker made between two barriers; ctrl ns = wall-clock
nanoseconds inside controller.push() per push.
)";
}

template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T v{};
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    throw usage_error(std::string(flag) + ": expected an integer >= 0, got '" + std::string(text) + "'");
  return v;
}

double parse_seconds(std::string_view flag, std::string_view text) {
  // std::from_chars for double is missing from some standard libraries; strtod is enough.
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v >= 0) || v > 1e12)
    throw usage_error(std::string(flag) + ": expected a number of seconds, got '" + s + "'");
  return v;
}

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

int run(int argc, char** argv) {
  std::string scenario_name(cadence::sim::default_scenario_name);
  std::size_t workers = 0;
  double seconds = -1, push_cost = -1, pull_cost = -1;
  std::uint64_t iterations = 0, seed = 1;
  std::vector<std::string> policies;
  enum { table, json, csv } format = table;

  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view value;
    bool has_inline = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    auto take = [&]() -> std::string_view {
      if (has_inline) return value;
      if (i + 1 >= argc) throw usage_error(std::string(arg) + ": missing value");
      return argv[++i];
    };
    auto no_value = [&] {
      if (has_inline) throw usage_error(std::string(arg) + ": takes no value");
    };
    if (arg == "--help" || arg == "-h") {
      no_value();
      print_help();
      return 0;
    } else if (arg == "--list-scenarios") {
      no_value();
      for (const auto& s : cadence::sim::scenario_catalog())
        std::printf("%-13s %5zu workers %4g s  %s\n", s.name.c_str(), s.default_workers,
                    cadence::sim::make_scenario(s.name).seconds, s.description.c_str());
      return 0;
    } else if (arg == "--scenario") {
      scenario_name = std::string(take());
    } else if (arg == "--workers") {
      const auto v = take();
      workers = parse_number<std::size_t>("--workers", v);
      if (workers == 0) throw usage_error("--workers: expected an integer >= 1, got '" + std::string(v) + "'");
    } else if (arg == "--seconds") {
      const auto v = take();
      seconds = parse_seconds("--seconds", v);
      if (seconds == 0) throw usage_error("--seconds: expected a number > 0, got '" + std::string(v) + "'");
      iterations = 0;
    } else if (arg == "--iterations") {
      const auto v = take();
      iterations = parse_number<std::uint64_t>("--iterations", v);
      if (iterations == 0) throw usage_error("--iterations: expected an integer >= 1, got '" + std::string(v) + "'");
      seconds = -1;
    } else if (arg == "--policy") {
      policies.emplace_back(take());
    } else if (arg == "--seed") {
      seed = parse_number<std::uint64_t>("--seed", take());
    } else if (arg == "--push-cost") {
      push_cost = parse_seconds("--push-cost", take());
    } else if (arg == "--pull-cost") {
      pull_cost = parse_seconds("--pull-cost", take());
    } else if (arg == "--json") {
      no_value();
      format = json;
    } else if (arg == "--csv") {
      no_value();
      format = csv;
    } else {
      throw usage_error("unknown option '" + std::string(argv[i]) + "' (see --help)");
    }
  }

  cadence::sim::scenario s;
  try {
    s = cadence::sim::make_scenario(scenario_name, workers, seed);
  } catch (const cadence::invalid_parameter_error& e) {
    bool known = false;
    for (const auto& info : cadence::sim::scenario_catalog()) known = known || info.name == scenario_name;
    throw usage_error(std::string(known ? "--workers: " : "--scenario: ") + e.what());
  }
  if (seconds > 0) s.seconds = seconds;
  if (iterations > 0) {
    s.seconds = 0;
    s.iterations = iterations;
  }
  if (push_cost >= 0) s.push_seconds = push_cost;
  if (pull_cost >= 0) s.pull_seconds = pull_cost;
  cadence::sim::validate(s);

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
    runs.push_back(cadence::sim::simulate(c, s, opt));
  }

  if (format == json) {
    cadence::sim::write_json(std::cout, runs);
  } else if (format == csv) {
    cadence::sim::write_csv(std::cout, runs);
  } else {
    std::printf("scenario %s (%zu workers, seed %llu): %s\n", s.name.c_str(), s.workers.size(),
                static_cast<unsigned long long>(s.seed), s.description.c_str());
    if (s.seconds > 0)
      std::printf("run: %g simulated s, push %g ms, pull %g ms\n\n", s.seconds, 1e3 * s.push_seconds,
                  1e3 * s.pull_seconds);
    else
      std::printf("run: %llu iterations per worker, push %g ms, pull %g ms\n\n",
                  static_cast<unsigned long long>(s.iterations), 1e3 * s.push_seconds, 1e3 * s.pull_seconds);
    std::fflush(stdout);
    cadence::sim::write_table(std::cout, runs);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "cadence-sim: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cadence-sim: error: %s\n", e.what());
    return 1;
  }
}
