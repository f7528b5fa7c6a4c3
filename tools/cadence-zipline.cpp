// cadence-zipline: plan an ElasticBSP barrier from a push history (or from predicted push
// times) with any ZipLine variant, time it, and print a summary or JSON.
#include "cli.hpp"
#include "zipline_json.hpp"

#include <cadence/core/error.hpp>
#include <cadence/io/generator.hpp>
#include <cadence/io/push_history.hpp>
#include <cadence/predict/any_predictor.hpp>
#include <cadence/zipline/variant.hpp>
#ifdef CADENCE_HAS_THRUST
#include <cadence/thrust/zipline.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using ts = std::int64_t;

constexpr const char* usage = R"(usage: cadence-zipline (--input FILE | --predicted FILE | --generate N,T) [options]

Plans an ElasticBSP barrier: picks one predicted push per worker so that the spread
(latest - earliest pick) is minimal; among optimal sets the smallest barrier (latest pick)
wins, and each worker's choice is its latest predicted push <= the barrier.

Source (exactly one):
  --input FILE        push history, one worker per line 'id:t1,t2,...,tk,' (integer ms);
                      each worker's next R pushes are predicted, then searched
  --predicted FILE    rows that already are predicted push times (same format, strictly
                      increasing per row); searched directly
  --generate N,T      synthetic history: N workers, T >= 2 pushes each, then predicted

Options:
  --lookahead R       predicted pushes per worker (default 15; not with --predicted)
  --predictor NAME    last | mean:K | median:K | ewma:ALPHA (default last; not with --predicted)
  --interval LO,HI    per-worker push interval range in ms for --generate (default 1000,1500)
  --seed S            generator seed for --generate (default 1)
  --variant V         zipline | opt | opt-bs | fast | thrust | all (default fast); all runs every
                      variant available in this build and fails if any two disagree
  --repeat K          run each variant K times (default 1); 'seconds' is the BEST (minimum)
                      wall time of the K runs, prediction and input reading excluded
  --json              print exactly one JSON document: an object for one variant, an array
                      for --variant all; each {"variant", "n", "spread", "barrier",
                      "choice" (0-based index into each worker's predicted row, workers by
                      ascending id), "seconds"}
  --help              print this help

Exit status: 0 on success, 1 on bad input data, 2 on a bad command line.
)";

using cadence::tools::usage_error;

struct options {
  std::optional<std::string> input, predicted, generate;
  std::size_t lookahead = 15;
  std::string predictor = "last";
  std::int64_t interval_lo = 1000, interval_hi = 1500;
  std::uint64_t seed = 1;
  std::string variant = "fast";
  std::size_t repeat = 1;
  bool json = false;
  bool help = false;
  std::map<std::string, bool> given;
};

options parse_args(int argc, char** argv) {
  options o;
  const std::vector<std::string_view> valued = {"--input",    "--predicted", "--generate",
                                                "--lookahead", "--predictor", "--interval",
                                                "--seed",      "--variant",   "--repeat"};
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view value;
    bool has_value = false;
    if (const auto eq = arg.find('='); eq != std::string_view::npos && arg.substr(0, 2) == "--") {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    const std::string flag(arg);
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (flag == "--json") {
      if (has_value) throw usage_error("--json takes no value");
      o.json = true;
      continue;
    }
    if (std::find(valued.begin(), valued.end(), arg) == valued.end())
      throw usage_error("unknown option '" + std::string(argv[i]) + "' (see --help)");
    if (o.given[flag]) throw usage_error(flag + " given twice");
    o.given[flag] = true;
    if (!has_value) {
      if (i + 1 >= argc) throw usage_error(flag + " needs a value");
      value = argv[++i];
    }
    if (flag == "--input") o.input = std::string(value);
    else if (flag == "--predicted") o.predicted = std::string(value);
    else if (flag == "--generate") o.generate = std::string(value);
    else if (flag == "--lookahead")
      o.lookahead = cadence::tools::parse_flag_integer<std::size_t>(flag, value, 1, 1000000);
    else if (flag == "--predictor") {
      o.predictor = std::string(value);
      try {
        (void)cadence::make_predictor<ts>(o.predictor);
      } catch (const cadence::error& e) {
        throw usage_error(std::string("--predictor: ") + e.what());
      }
    }
    else if (flag == "--interval") {
      const auto [lo, hi] =
          cadence::tools::parse_flag_pair<std::int64_t>(flag, value, 1, std::int64_t{1} << 40);
      if (lo > hi) throw cadence::parse_error("--interval: LO must be <= HI, got " + std::string(value));
      o.interval_lo = lo;
      o.interval_hi = hi;
    } else if (flag == "--seed")
      o.seed = cadence::tools::parse_flag_integer<std::uint64_t>(flag, value, 0, UINT64_MAX);
    else if (flag == "--variant") o.variant = std::string(value);
    else if (flag == "--repeat")
      o.repeat = cadence::tools::parse_flag_integer<std::size_t>(flag, value, 1, 1000000);
  }
  if (o.help) return o;
  const int sources = (o.input ? 1 : 0) + (o.predicted ? 1 : 0) + (o.generate ? 1 : 0);
  if (sources != 1)
    throw usage_error("give exactly one of --input, --predicted, --generate (see --help)");
  if (o.predicted && (o.given["--lookahead"] || o.given["--predictor"]))
    throw usage_error("--lookahead and --predictor apply to --input and --generate, not --predicted");
  if (!o.generate && (o.given["--interval"] || o.given["--seed"]))
    throw usage_error("--interval and --seed apply only to --generate");
  return o;
}

struct variant_run {
  std::string name;
  cadence::zipline_result<ts> result;
  double seconds = 0;
};

template <class F>
variant_run time_variant(std::string name, std::size_t repeat, F&& solve) {
  variant_run run;
  run.name = std::move(name);
  for (std::size_t k = 0; k < repeat; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    solve(run.result);
    const auto t1 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count();
    run.seconds = k == 0 ? s : std::min(run.seconds, s);
  }
  return run;
}

int run_tool(const options& o) {
  // 1. Rows to search: predicted push times, one row per worker, ascending id.
  cadence::push_history<ts> history;
  std::string source;
  if (o.input) {
    history = cadence::read_push_history_file<ts>(*o.input);
    source = "history " + *o.input;
  } else if (o.predicted) {
    history = cadence::read_push_history_file<ts>(*o.predicted);
    source = "predicted rows " + *o.predicted;
  } else {
    const auto [n, t] = cadence::tools::parse_flag_pair<std::size_t>("--generate", *o.generate, 1, 10000000);
    if (t < 2) throw cadence::parse_error("--generate: T must be >= 2 (a predictor needs two pushes)");
    if (n * t > 200000000) throw cadence::parse_error("--generate: N*T must be <= 200000000");
    cadence::generator_options g;
    g.workers = n;
    g.pushes = t;
    g.interval_lo = o.interval_lo;
    g.interval_hi = o.interval_hi;
    g.seed = o.seed;
    history = cadence::generate_push_history(g);
    source = "generated history (" + std::to_string(n) + " workers x " + std::to_string(t) +
             " pushes, interval " + std::to_string(o.interval_lo) + ".." +
             std::to_string(o.interval_hi) + " ms, seed " + std::to_string(o.seed) + ")";
  }
  if (history.empty()) throw cadence::parse_error("no workers in " + source);

  std::vector<ts> predicted;
  cadence::rows_view<ts> rows;
  if (o.predicted) {
    rows = history.rows();
  } else {
    const auto predictor = cadence::make_predictor<ts>(o.predictor);
    const std::size_t n = history.size(), r = o.lookahead;
    predicted.resize(n * r);
    for (std::size_t p = 0; p < n; ++p) {
      try {
        predictor.predict(history.row(p), r, predicted.data() + p * r);
      } catch (const cadence::error& e) {
        throw cadence::time_error("worker " + std::to_string(history.ids()[p]) + ": " + e.what());
      }
    }
    rows = cadence::rows_view<ts>::matrix(predicted.data(), n, r);
  }

  // 2. Variants to run.
  std::vector<std::string> names;
  if (o.variant == "all") {
    names = {"zipline", "opt", "opt-bs", "fast"};
#ifdef CADENCE_HAS_THRUST
    names.push_back("thrust");
#endif
  } else if (o.variant == "thrust") {
#ifndef CADENCE_HAS_THRUST
    throw usage_error("--variant thrust: this build has no Thrust backend (configure with "
                      "CADENCE_ENABLE_THRUST=ON and the CCCL headers available)");
#endif
    names = {"thrust"};
  } else {
    try {
      (void)cadence::parse_zipline_variant(o.variant);
    } catch (const cadence::parse_error&) {
      throw usage_error("--variant: unknown variant '" + o.variant +
                        "' (valid: zipline, opt, opt-bs, fast, thrust, all)");
    }
    names = {o.variant};
  }

  std::vector<variant_run> runs;
  cadence::zipline_workspace<ts> ws;
  for (const auto& name : names) {
    if (name == "thrust") {
#ifdef CADENCE_HAS_THRUST
      runs.push_back(time_variant(name, o.repeat, [&](cadence::zipline_result<ts>& out) {
        out = cadence::zipline_thrust(rows);
      }));
#endif
      continue;
    }
    const auto v = cadence::parse_zipline_variant(name);
    runs.push_back(time_variant(name, o.repeat, [&](cadence::zipline_result<ts>& out) {
      cadence::zipline_solve(v, rows, ws, out);
    }));
  }
  for (const auto& run : runs)
    if (run.result != runs.front().result)
      throw cadence::error("variants disagree: " + run.name + " and " + runs.front().name +
                           " returned different results");

  // 3. Output.
  if (o.json) {
    std::string doc;
    if (o.variant == "all") doc += "[";
    for (std::size_t k = 0; k < runs.size(); ++k) {
      if (k) doc += ",\n ";
      doc += cadence::tools::zipline_result_json(runs[k].name, runs[k].result, runs[k].seconds);
    }
    if (o.variant == "all") doc += "]";
    std::cout << doc << '\n';
    return 0;
  }
  const auto& res = runs.front().result;
  std::cout << "cadence-zipline: " << source << "\n";
  std::cout << "  " << rows.size() << " workers";
  if (!o.predicted) std::cout << ", " << o.lookahead << " predicted pushes each (predictor " << o.predictor << ")";
  std::cout << "\n  spread " << res.spread << " ms, barrier at " << res.barrier << " ms\n";
  const std::size_t shown = std::min<std::size_t>(rows.size(), 10);
  std::cout << "  worker: pushes to run before the barrier (index+1) at time\n";
  for (std::size_t p = 0; p < shown; ++p)
    std::cout << "    " << history.ids()[p] << ": " << res.choice[p] + 1 << " at "
              << rows[p][res.choice[p]] << " ms\n";
  if (shown < rows.size()) std::cout << "    ... (" << rows.size() - shown << " more; use --json)\n";
  for (const auto& run : runs) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6f", run.seconds * 1e3);
    std::cout << "  " << run.name << ": " << buf << " ms (best of " << o.repeat << ")\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse_args(argc, argv);
  } catch (const cadence::error& e) {
    std::cerr << "cadence-zipline: error: " << e.what() << '\n';
    return 2;
  }
  if (o.help) {
    std::cout << usage;
    return 0;
  }
  try {
    return run_tool(o);
  } catch (const usage_error& e) {
    std::cerr << "cadence-zipline: error: " << e.what() << '\n';
    return 2;
  } catch (const cadence::parse_error& e) {
    // Bad flag values (messages start with the flag) are usage errors; bad files are data.
    std::cerr << "cadence-zipline: error: " << e.what() << '\n';
    return std::string_view(e.what()).substr(0, 2) == "--" ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "cadence-zipline: error: " << e.what() << '\n';
    return 1;
  }
}
