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
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace {

constexpr const char* usage = R"(usage: cadence-zipline (--input FILE | --predicted FILE | --generate N,T) [options]

Plans an ElasticBSP barrier: picks one predicted push per worker so that the spread
(latest - earliest pick) is minimal; among optimal sets the smallest barrier (latest pick)
wins, and each worker's choice is its latest predicted push <= the barrier.

Source (exactly one):
  --input FILE        push history, one worker per line 'id:t1,t2,...,tk,' with integer
                      milliseconds, or decimal seconds ('0:1.25,2.5,3.75,'); timestamps
                      must not go backwards; each worker's next R pushes are predicted,
                      then searched
  --predicted FILE    rows that already are predicted push times (same format, strictly
                      increasing per row); searched directly
  --generate N,T      synthetic history: N workers (at most 10000000), T >= 2 pushes each,
                      N*T at most 200000000, then predicted
  A file with any decimal timestamp (a '.' or an exponent) is read and searched in double
  precision; integer files stay exact. Files hold at most 10000000 workers, 200000000
  timestamps and 67108864 bytes per line.

Options:
  --lookahead R       predicted pushes per worker, R >= 1 (default 15; N*R at most
                      200000000; not with --predicted)
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
using ts = std::int64_t;

struct options {
  std::optional<std::string> input, predicted;
  std::size_t workers = 0, pushes = 0;  // --generate N,T (0: not given)
  std::size_t lookahead = 15;
  std::string predictor = "last";
  std::int64_t interval_lo = 1000, interval_hi = 1500;
  std::uint64_t seed = 1;
  std::string variant = "fast";
  std::vector<std::string> variants;  // what --variant runs
  std::size_t repeat = 1;
  bool json = false;
  bool help = false;
};

/// The prediction matrix has N x R entries; the bound is the readers' bound on timestamps,
/// so no source yields more points to search than a history file may hold.
void check_prediction_size(std::size_t n, std::size_t r) {
  if (n > cadence::push_history_max_timestamps / r)
    throw usage_error("--lookahead: N x R must be at most " +
                      std::to_string(cadence::push_history_max_timestamps) +
                      " predicted push times, got " + std::to_string(n) + " workers x " +
                      std::to_string(r));
}

std::vector<std::string> variants_to_run(const std::string& variant) {
  if (variant == "all") {
#ifdef CADENCE_HAS_THRUST
    return {"zipline", "opt", "opt-bs", "fast", "thrust"};
#else
    return {"zipline", "opt", "opt-bs", "fast"};
#endif
  }
  if (variant == "thrust") {
#ifndef CADENCE_HAS_THRUST
    throw usage_error("--variant thrust: this build has no Thrust backend (configure with "
                      "CADENCE_ENABLE_THRUST=ON and the CCCL headers available)");
#endif
    return {"thrust"};
  }
  try {
    (void)cadence::parse_zipline_variant(variant);
  } catch (const cadence::parse_error&) {
    throw usage_error("--variant: unknown variant '" + variant +
                      "' (valid: zipline, opt, opt-bs, fast, thrust, all)");
  }
  return {variant};
}

options parse_args(int argc, char** argv) {
  using cadence::tools::parse_flag_integer;
  options o;
  cadence::tools::flag_reader args(argc, argv);
  args.at_most_one_of({"--input", "--predicted", "--generate"})
      .at_most_once({"--lookahead", "--predictor", "--interval", "--seed", "--variant", "--repeat"});
  while (args.next()) {
    const std::string_view flag = args.flag();
    if (flag == "--help" || flag == "-h") {
      args.no_value();
      o.help = true;
    } else if (flag == "--json") {
      args.no_value();
      o.json = true;
    } else if (flag == "--input") {
      o.input = std::string(args.value());
    } else if (flag == "--predicted") {
      o.predicted = std::string(args.value());
    } else if (flag == "--generate") {
      const auto [n, t] = cadence::tools::split_flag_pair(flag, args.value(), "N", "T");
      o.workers = parse_flag_integer<std::size_t>(flag, n, 1, cadence::push_history_max_workers, "N");
      // Every predictor needs two pushes to see an interval.
      o.pushes = parse_flag_integer<std::size_t>(flag, t, 2, cadence::push_history_max_timestamps, "T");
      if (o.workers > cadence::push_history_max_timestamps / o.pushes)
        throw usage_error("--generate: N x T must be at most " +
                          std::to_string(cadence::push_history_max_timestamps) +
                          " timestamps, got " + std::string(n) + " x " + std::string(t));
    } else if (flag == "--lookahead") {
      o.lookahead = parse_flag_integer<std::size_t>(flag, args.value(), 1,
                                                    cadence::push_history_max_timestamps, "R");
    } else if (flag == "--predictor") {
      o.predictor = std::string(args.value());
      try {
        (void)cadence::make_predictor<ts>(o.predictor);
      } catch (const cadence::error& e) {
        throw usage_error(std::string("--predictor: ") + e.what());
      }
    } else if (flag == "--interval") {
      const auto [lo, hi] = cadence::tools::parse_flag_pair<std::int64_t>(
          flag, args.value(), 1, std::int64_t{1} << 40, "LO", "HI");
      if (lo > hi)
        throw usage_error("--interval: LO must be at most HI, got " + std::string(args.value()));
      o.interval_lo = lo;
      o.interval_hi = hi;
    } else if (flag == "--seed") {
      o.seed = parse_flag_integer<std::uint64_t>(flag, args.value(), 0, UINT64_MAX);
    } else if (flag == "--variant") {
      o.variant = std::string(args.value());
      o.variants = variants_to_run(o.variant);
    } else if (flag == "--repeat") {
      o.repeat = parse_flag_integer<std::size_t>(flag, args.value(), 1, 1000000, "K");
    } else {
      args.unknown();
    }
  }
  if (o.help) return o;
  if (o.variants.empty()) o.variants = variants_to_run(o.variant);
  const bool generate = o.workers > 0;
  if (!o.input && !o.predicted && !generate)
    throw usage_error("give exactly one of --input, --predicted, --generate (see --help)");
  if (o.predicted && (args.given("--lookahead") || args.given("--predictor")))
    throw usage_error("--lookahead and --predictor apply to --input and --generate, not --predicted");
  if (!generate && (args.given("--interval") || args.given("--seed")))
    throw usage_error("--interval and --seed apply only to --generate");
  if (generate) check_prediction_size(o.workers, o.lookahead);
  return o;
}

template <class T>
struct variant_run {
  std::string name;
  cadence::zipline_result<T> result;
  double seconds = 0;
};

template <class T, class F>
variant_run<T> time_variant(std::string name, std::size_t repeat, F&& solve) {
  variant_run<T> run;
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

/// Predicts (unless the rows already are predictions), runs the variants and prints. T is
/// std::int64_t for integer milliseconds and double for decimal timestamps (seconds).
template <class T>
int plan(const options& o, const cadence::push_history<T>& history, const std::string& source) {
  constexpr const char* unit = std::is_integral_v<T> ? "ms" : "s";
  if (history.empty()) throw cadence::parse_error("no workers in " + source);

  // 1. Rows to search: predicted push times, one row per worker, ascending id.
  std::vector<T> predicted;
  cadence::rows_view<T> rows;
  if (o.predicted) {
    rows = history.rows();
  } else {
    const std::size_t n = history.size(), r = o.lookahead;
    check_prediction_size(n, r);
    const auto predictor = cadence::make_predictor<T>(o.predictor);
    predicted.resize(n * r);
    for (std::size_t p = 0; p < n; ++p) {
      try {
        predictor.predict(history.row(p), r, predicted.data() + p * r);
      } catch (const cadence::error& e) {
        // The readers have checked length and order, so this is a prediction that overflows.
        throw cadence::time_error(source + ": worker " + std::to_string(history.ids()[p]) +
                                  ": " + e.what());
      }
    }
    rows = cadence::rows_view<T>::matrix(predicted.data(), n, r);
  }

  // 2. The variants, each timed.
  std::vector<variant_run<T>> runs;
  cadence::zipline_workspace<T> ws;
  for (const auto& name : o.variants) {
    if (name == "thrust") {
#ifdef CADENCE_HAS_THRUST
      runs.push_back(time_variant<T>(name, o.repeat, [&](cadence::zipline_result<T>& out) {
        out = cadence::zipline_thrust(rows);
      }));
#endif
      continue;
    }
    const auto v = cadence::parse_zipline_variant(name);
    runs.push_back(time_variant<T>(name, o.repeat, [&](cadence::zipline_result<T>& out) {
      cadence::zipline_solve(v, rows, ws, out);
    }));
  }
  for (const auto& run : runs)
    if (run.result != runs.front().result)
      throw cadence::error("variants disagree: " + run.name + " and " + runs.front().name +
                           " returned different results");

  // 3. Output; numbers in their shortest round-trip form, as in the JSON.
  using cadence::tools::number_text;
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
  std::cout << "\n  spread " << number_text(res.spread) << ' ' << unit << ", barrier at "
            << number_text(res.barrier) << ' ' << unit << "\n";
  const std::size_t shown = std::min<std::size_t>(rows.size(), 10);
  std::cout << "  worker: pushes to run before the barrier (index+1) at time\n";
  for (std::size_t p = 0; p < shown; ++p)
    std::cout << "    " << history.ids()[p] << ": " << res.choice[p] + 1 << " at "
              << number_text(rows[p][res.choice[p]]) << ' ' << unit << "\n";
  if (shown < rows.size()) std::cout << "    ... (" << rows.size() - shown << " more; use --json)\n";
  for (const auto& run : runs) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6f", run.seconds * 1e3);
    std::cout << "  " << run.name << ": " << buf << " ms (best of " << o.repeat << ")\n";
  }
  return 0;
}

int run(int argc, char** argv) {
  const options o = parse_args(argc, argv);
  if (o.help) {
    std::cout << usage;
    return 0;
  }
  if (o.workers > 0) {
    cadence::generator_options g;
    g.workers = o.workers;
    g.pushes = o.pushes;
    g.interval_lo = o.interval_lo;
    g.interval_hi = o.interval_hi;
    g.seed = o.seed;
    cadence::push_history<ts> history;
    try {
      history = cadence::generate_push_history(g);
    } catch (const cadence::invalid_parameter_error& e) {  // T x HI beyond 64-bit milliseconds
      throw usage_error(std::string("--generate, --interval: ") + e.what());
    }
    return plan(o, history,
                "generated history (" + std::to_string(o.workers) + " workers x " +
                    std::to_string(o.pushes) + " pushes, interval " +
                    std::to_string(o.interval_lo) + ".." + std::to_string(o.interval_hi) +
                    " ms, seed " + std::to_string(o.seed) + ")");
  }
  cadence::push_history_read_options read;
  std::string path, source;
  if (o.input) {
    path = *o.input;
    source = "history " + path;
    read.min_timestamps = cadence::make_predictor<ts>(o.predictor).min_history();
  } else {
    path = *o.predicted;
    source = "predicted rows " + path;
    read.strictly_increasing = true;  // ZipLine's contract, checked here to name the line
  }
  return std::visit([&](const auto& history) { return plan(o, history, source); },
                    cadence::read_any_push_history_file(path, read));
}

}  // namespace

int main(int argc, char** argv) {
  return cadence::tools::guarded_main("cadence-zipline", run, argc, argv);
}
