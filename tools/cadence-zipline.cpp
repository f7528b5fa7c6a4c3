// cadence-zipline: plan an ElasticBSP barrier from a push history (or from predicted push
// times) with any ZipLine variant, time it, and print a summary or JSON.
#include "flags.hpp"
#include "prediction_eval.hpp"
#include "json.hpp"
#include "zipline_json.hpp"

#include <cadence/core/error.hpp>
#include <cadence/io/generator.hpp>
#include <cadence/io/push_history.hpp>
#include <cadence/io/trace.hpp>
#include <cadence/predict/any_predictor.hpp>
#include <cadence/zipline/variant.hpp>
#ifdef CADENCE_HAS_THRUST
#include <cadence/thrust/zipline.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace {

constexpr const char* usage =
    "usage: cadence-zipline (--input FILE | --predicted FILE | --generate N,T) [options]\n"
    "       cadence-zipline --evaluate FILE [--predictor LIST] [--lookahead LIST] [--history H] [--json]\n";

constexpr const char* description =
    "Plans an ElasticBSP barrier: picks one predicted push per worker so that the spread\n"
    "(latest - earliest pick) is minimal; among optimal sets the smallest barrier (latest pick)\n"
    "wins, and each worker's choice is its latest predicted push <= the barrier.\n";

constexpr const char* footer =
    "Input files: a file with any decimal timestamp (a '.' or an exponent) is read and searched\n"
    "in double precision; integer files stay exact. Files hold at most 10000000 workers,\n"
    "200000000 timestamps and 67108864 bytes per line.\n"
    "\n"
    "Exit status: 0 on success, 1 on bad input data, 2 on a bad command line.\n";

using cadence::tools::usage_error;
using ts = std::int64_t;

struct options {
  std::optional<std::string> input, predicted, evaluate;
  std::string lookahead_text, predictor_text;  // as given (lists with --evaluate)
  std::vector<std::size_t> lookaheads;         // --evaluate
  std::vector<std::string> predictors;         // --evaluate
  std::size_t history = 16;
  std::string generate_text, interval_text;  // as given
  std::size_t workers = 0, pushes = 0;  // --generate N,T (0: not given)
  std::size_t lookahead = 15;
  std::string predictor = "last";
  std::int64_t interval_lo = 1000, interval_hi = 1500;
  std::uint64_t seed = 1;
  std::string variant = "fast";
  std::vector<std::string> variants;  // what --variant runs
  std::size_t repeat = 1;
  bool json = false;
  std::string help;  // --help: the text to print
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
    throw usage_error("this build has no Thrust backend (configure with "
                      "CADENCE_ENABLE_THRUST=ON and the CCCL headers available)");
#endif
    return {"thrust"};
  }
  try {
    (void)cadence::parse_zipline_variant(variant);
  } catch (const cadence::parse_error&) {
    throw usage_error("unknown variant '" + variant +
                      "' (valid: zipline, opt, opt-bs, fast, thrust, all)");
  }
  return {variant};
}

// The command line: every flag with its help, its value's rule and where it goes.
options parse_args(int argc, char** argv) {
  using cadence::tools::parse_integer;
  using cadence::tools::with_flag;
  options o;
  std::string input, predicted, evaluate;
  cadence::tools::command_line cli(usage, description, 22);
  cli.footer(footer);
  cli.option_defaults()->group("Source (exactly one)");
  cli.add_option("--input", input,
                 "push history, one worker per line 'id:t1,t2,...,tk,' with integer\n"
                 "milliseconds, or decimal seconds ('0:1.25,2.5,3.75,'); timestamps\n"
                 "must not go backwards; each worker's next R pushes are predicted,\n"
                 "then searched")
      ->option_text("FILE");
  cli.add_option("--predicted", predicted,
                 "rows that already are predicted push times (same format, strictly\n"
                 "increasing per row); searched directly")
      ->option_text("FILE");
  cli.add_option("--generate", o.generate_text,
                 "synthetic history: N workers (at most 10000000), T >= 2 pushes each,\n"
                 "N*T at most 200000000, then predicted")
      ->option_text("N,T")
      ->check(cadence::tools::checked([](std::string& text) {
        const auto [n, t] = cadence::tools::split_pair(text, "N", "T");
        const auto workers = parse_integer<std::size_t>(n, 1, cadence::push_history_max_workers, "N");
        // Every predictor needs two pushes to see an interval.
        const auto pushes = parse_integer<std::size_t>(t, 2, cadence::push_history_max_timestamps, "T");
        if (workers > cadence::push_history_max_timestamps / pushes)
          throw usage_error("N x T must be at most " + std::to_string(cadence::push_history_max_timestamps) +
                            " timestamps, got " + std::string(n) + " x " + std::string(t));
      }));
  cli.add_option("--evaluate", evaluate,
                 "instead of planning once, replay a recorded history and report, per\n"
                 "predictor and lookahead R, the error of the predicted push times against\n"
                 "the pushes that came (mean absolute error, p90 and max, in the file's\n"
                 "unit) and the wait that ZipLine's barrier, planned on those predictions,\n"
                 "really cost (latest minus earliest actual time of the pushes it chose)\n"
                 "against the best barrier in hindsight (ZipLine on the actual times).\n"
                 "FILE is a push history (as --input) or an iteration trace (cadence-train\n"
                 "--trace; its push times start + compute + push, in seconds). Plans are\n"
                 "made as ElasticBSP's cycle: first when every worker has pushed twice,\n"
                 "then each time every worker has pushed twice after the last plan's best\n"
                 "barrier; a plan needs R more pushes of every worker. The same plan times\n"
                 "serve every predictor (see docs/zipline.md)")
      ->option_text("FILE");
  cli.option_defaults()->group("Options");
  cli.add_option("--lookahead", o.lookahead_text,
                 "predicted pushes per worker, R >= 1 (default 15; N*R at most\n"
                 "200000000; not with --predicted); with --evaluate a comma-separated\n"
                 "list of R values (default 1,5,15)")
      ->option_text("R");
  cli.add_option("--predictor", o.predictor_text,
                 "last | mean:K | median:K | ewma:ALPHA (default last; not with\n"
                 "--predicted); with --evaluate a comma-separated list (default\n"
                 "last,mean:4,median:5,ewma:0.3)")
      ->option_text("NAME");
  // A count from `min` to 1000000; `what` names it in --help and in its errors.
  const auto count = [&cli](const char* name, std::size_t& value, const char* what, std::size_t min,
                            const char* help) {
    cli.add_option(name, value, help)
        ->option_text(what)
        ->check(cadence::tools::integer<std::size_t>(min, 1000000, what));
  };
  count("--history", o.history, "H", 2,
        "with --evaluate: each prediction sees the worker's latest H pushes\n"
        "(default 16, ElasticBSP's default; at least 2)");
  cli.add_option("--interval", o.interval_text,
                 "per-worker push interval range in ms for --generate (default 1000,1500)")
      ->option_text("LO,HI")
      ->check(cadence::tools::checked([](std::string& text) {
        const auto [lo, hi] = cadence::tools::parse_pair<std::int64_t>(text, 1, std::int64_t{1} << 40, "LO", "HI");
        if (lo > hi) throw usage_error("LO must be at most HI, got " + text);
      }));
  cli.add_seed(o.seed, "S", "generator seed for --generate (default 1)");
  cli.add_option("--variant", o.variant,
                 "zipline | opt | opt-bs | fast | thrust | all (default fast); all runs every\n"
                 "variant available in this build and fails if any two disagree")
      ->option_text("V")
      ->check(cadence::tools::checked([](std::string& text) { (void)variants_to_run(text); }));
  count("--repeat", o.repeat, "K", 1,
        "run each variant K times (default 1); 'seconds' is the BEST (minimum)\n"
        "wall time of the K runs, prediction and input reading excluded");
  cli.add_flag("--json", o.json,
               "print exactly one JSON document: an object for one variant, an array\n"
               "for --variant all; each {\"variant\", \"n\", \"spread\", \"barrier\",\n"
               "\"choice\" (0-based index into each worker's predicted row, workers by\n"
               "ascending id), \"seconds\"}. With --evaluate one JSON array, an object\n"
               "per predictor and R: {\"predictor\", \"lookahead\", \"unit\", \"plans\",\n"
               "\"points\", \"mean_abs_error\", \"p90_abs_error\", \"max_abs_error\",\n"
               "\"wait_mean\", \"best_wait_mean\", \"excess_wait_mean\",\n"
               "\"predicted_wait_mean\", \"wait_total\", \"best_wait_total\"}");
  cli.add_help("print this help");
  cli.at_most_one_of({"--input", "--predicted", "--generate", "--evaluate"});
  if (!cli.read(argc, argv)) {
    o.help = cli.help();
    return o;
  }
  if (cli.given("--input")) o.input = input;
  if (cli.given("--predicted")) o.predicted = predicted;
  if (cli.given("--evaluate")) o.evaluate = evaluate;
  if (cli.given("--generate")) {
    const auto [n, t] = cadence::tools::split_pair(o.generate_text);
    o.workers = parse_integer<std::size_t>(n, 1, SIZE_MAX);
    o.pushes = parse_integer<std::size_t>(t, 1, SIZE_MAX);
  }
  if (cli.given("--interval")) {
    const auto [lo, hi] = cadence::tools::parse_pair<std::int64_t>(o.interval_text, 1, INT64_MAX);
    o.interval_lo = lo;
    o.interval_hi = hi;
  }
  // --lookahead and --predictor take one value, or with --evaluate a comma-separated list.
  auto split = [](const std::string& text) {
    std::vector<std::string> parts;
    std::size_t from = 0;
    for (;;) {
      const auto comma = text.find(',', from);
      parts.push_back(text.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
      if (comma == std::string::npos) return parts;
      from = comma + 1;
    }
  };
  const bool evaluating = o.evaluate.has_value();
  const std::string lookaheads = cli.given("--lookahead") ? o.lookahead_text : evaluating ? "1,5,15" : "15";
  const std::string predictors =
      cli.given("--predictor") ? o.predictor_text : evaluating ? "last,mean:4,median:5,ewma:0.3" : "last";
  for (const auto& part : split(lookaheads))
    o.lookaheads.push_back(with_flag("--lookahead", [&] {
      return parse_integer<std::size_t>(part, 1, cadence::push_history_max_timestamps, "R");
    }));
  for (const auto& part : split(predictors)) {
    try {
      (void)cadence::make_predictor<ts>(part);
    } catch (const cadence::error& e) {
      throw usage_error(std::string("--predictor: ") + e.what());
    }
    o.predictors.push_back(part);
  }
  if (!evaluating && o.lookaheads.size() > 1)
    throw usage_error("--lookahead: a list of R values only with --evaluate, got '" + lookaheads + "'");
  if (!evaluating && o.predictors.size() > 1)
    throw usage_error("--predictor: a list of predictors only with --evaluate, got '" + predictors + "'");
  o.lookahead = o.lookaheads.front();
  o.predictor = o.predictors.front();
  if (evaluating) {
    for (const char* other : {"--variant", "--repeat", "--interval", "--seed"})
      if (cli.given(other)) throw usage_error(std::string(other) + ": not with --evaluate");
    return o;
  }
  if (cli.given("--history")) throw usage_error("--history: only with --evaluate");
  o.variants = variants_to_run(o.variant);  // --variant's validator has checked it
  const bool generate = o.workers > 0;
  if (!o.input && !o.predicted && !generate)
    throw usage_error("give exactly one of --input, --predicted, --generate, --evaluate (see --help)");
  if (o.predicted && (cli.given("--lookahead") || cli.given("--predictor")))
    throw usage_error("--lookahead and --predictor apply to --input and --generate, not --predicted");
  if (!generate && (cli.given("--interval") || cli.given("--seed")))
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
    auto doc = cadence::tools::json::array();
    for (const auto& run : runs) doc.push_back(cadence::tools::zipline_result_json(run.name, run.result, run.seconds));
    std::cout << cadence::tools::json_document(o.variant == "all" ? doc : doc.front());
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

/// --evaluate: every predictor at every lookahead on the same plans; a table or JSON.
template <class T>
int evaluate(const options& o, const cadence::push_history<T>& history, const std::string& source) {
  constexpr const char* unit = std::is_integral_v<T> ? "ms" : "s";
  using cadence::tools::number_text;
  std::vector<cadence::tools::prediction_quality<T>> results;
  for (const std::size_t r : o.lookaheads) {
    const auto plans = cadence::tools::evaluation_plans(history, r);
    if (plans.empty()) throw cadence::parse_error(cadence::tools::too_short_message(history, r, source));
    for (const auto& name : o.predictors) {
      try {
        results.push_back(cadence::tools::evaluate_predictor(history, plans, r, cadence::make_predictor<T>(name),
                                                             o.history));
      } catch (const cadence::time_error& e) {
        throw cadence::time_error(source + ": predictor " + name + ", R = " + std::to_string(r) + ": " + e.what());
      }
    }
  }
  if (o.json) {
    auto doc = cadence::tools::json::array();
    for (const auto& q : results)
      doc.push_back({{"predictor", q.predictor},
                     {"lookahead", q.lookahead},
                     {"unit", unit},
                     {"plans", q.plans},
                     {"points", q.points},
                     {"mean_abs_error", q.mean_abs_error},
                     {"p90_abs_error", q.p90_abs_error},
                     {"max_abs_error", q.max_abs_error},
                     {"wait_mean", q.wait_mean()},
                     {"best_wait_mean", q.best_wait_mean()},
                     {"excess_wait_mean", q.wait_mean() - q.best_wait_mean()},
                     {"predicted_wait_mean", q.predicted_wait_mean()},
                     {"wait_total", q.wait_total},
                     {"best_wait_total", q.best_wait_total}});
    std::cout << cadence::tools::json_document(doc);
    return 0;
  }
  std::size_t pushes = 0;
  for (std::size_t p = 0; p < history.size(); ++p) pushes += history.row(p).size();
  std::cout << "cadence-zipline --evaluate: " << source << "\n  " << history.size() << " workers, " << pushes
            << " pushes; times in " << unit << "; each prediction sees the latest " << o.history
            << " pushes\n  error: |predicted - actual| push time; wait: the real spread of ZipLine's barrier on "
               "the actual times, per plan; best: the smallest in hindsight\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-14s %5s %6s %8s %11s %11s %11s %11s %11s %11s %11s\n", "predictor", "R", "plans",
                "points", "MAE", "p90", "max", "wait", "best wait", "excess", "predicted");
  std::cout << line;
  // Integer milliseconds print exactly; seconds to 6 significant digits (the JSON has all).
  auto cell = [](T v) {
    if constexpr (std::is_integral_v<T>) {
      return number_text(v);
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", static_cast<double>(v));
      return std::string(buf);
    }
  };
  for (const auto& q : results) {
    std::snprintf(line, sizeof line, "%-14s %5zu %6zu %8zu %11.6g %11s %11s %11.6g %11.6g %11.6g %11.6g\n",
                  q.predictor.c_str(), q.lookahead, q.plans, q.points, q.mean_abs_error,
                  cell(q.p90_abs_error).c_str(), cell(q.max_abs_error).c_str(), q.wait_mean(),
                  q.best_wait_mean(), q.wait_mean() - q.best_wait_mean(), q.predicted_wait_mean());
    std::cout << line;
  }
  return 0;
}

/// Whether the file is an iteration trace (its first line that is not blank or a comment is
/// the trace header) rather than a push history.
bool is_trace_file(const std::string& path) {
  // Only the first 64 KiB: an endless file (/dev/zero) is left to the reader's bounds.
  std::ifstream in(path, std::ios::binary);
  std::string head(std::size_t{1} << 16, '\0');
  in.read(&head[0], static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  std::string_view rest(head);
  while (!rest.empty()) {
    const auto newline = rest.find('\n');
    const std::string_view text = cadence::detail::trim_blanks(rest.substr(0, newline));
    if (!text.empty() && text.front() != '#')
      return text.rfind("worker", 0) == 0 && text.find(':') == std::string_view::npos;
    if (newline == std::string_view::npos) break;
    rest.remove_prefix(newline + 1);
  }
  return false;
}

int run(int argc, char** argv) {
  const options o = parse_args(argc, argv);
  if (!o.help.empty()) {
    std::cout << o.help;
    return 0;
  }
  if (o.evaluate) {
    const std::string& path = *o.evaluate;
    if (is_trace_file(path)) {
      const auto trace = cadence::read_iteration_trace_file(path);
      return evaluate(o, cadence::trace_push_times(trace), "trace " + path);
    }
    cadence::push_history_read_options read;
    read.min_timestamps = 2;  // every predictor needs an interval
    return std::visit([&](const auto& history) { return evaluate(o, history, "history " + path); },
                      cadence::read_any_push_history_file(path, read));
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
