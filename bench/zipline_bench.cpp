// ZipLine benchmarks: every CPU variant over n workers x R predicted pushes on the generator's
// data, with complexity fits over n, and (first, in the same process) the speed ratio of
// each variant against the paper's Algorithm 2 (zipline_paper, run-time name "zipline") at
// n = 1000, R = 150.
//
//   build/bin/cadence-bench-zipline                       ratio table, then all benchmarks
//   build/bin/cadence-bench-zipline --cadence_ratio_only  ratio table only (docs/zipline.md)
//   build/bin/cadence-bench-zipline --benchmark_filter=fast
//   build/bin/cadence-bench-zipline --cadence_scale       scale table only (docs/results.md)
//
// The `floor` rows read every point once and keep a running min and max: the least any
// exact search must do (validation alone reads every point). The scale table times it and
// `fast` alternately on the same data, best of K each, and prints fast / floor at n = 10^3,
// 10^5 and 10^6, R = 150 (the 10^6 input is 1.2 GB of doubles).
//
// zipline and opt (the paper's O(R n^2) ones) are not run at n = 10000: one call takes
// seconds there.
#include <cadence/io/generator.hpp>
#include <cadence/predict/interval.hpp>
#include <cadence/zipline/variant.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

using cadence::zipline_variant;

/// Predicted push times like ElasticBSP's: the generator's histories (10 pushes per worker,
/// interval uniform in [1000, 1500] ms, seed 1), each extended by last_interval to R pushes.
/// Doubles, as the ElasticBSP controller uses.
const std::vector<double>& predicted_rows(std::size_t n, std::size_t r) {
  static std::map<std::pair<std::size_t, std::size_t>, std::vector<double>> cache;
  auto& rows = cache[{n, r}];
  if (rows.empty()) {
    cadence::generator_options g;
    g.workers = n;
    g.pushes = 10;
    const auto h = cadence::generate_push_history(g);
    rows.resize(n * r);
    std::vector<double> hist;
    for (std::size_t p = 0; p < n; ++p) {
      const auto row = h.row(p);
      hist.assign(row.begin(), row.end());
      cadence::last_interval{}.predict(cadence::span<const double>(hist.data(), hist.size()), r,
                                       rows.data() + p * r);
    }
  }
  return rows;
}

void bm_variant(benchmark::State& state, zipline_variant v) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto r = static_cast<std::size_t>(state.range(1));
  const auto& data = predicted_rows(n, r);
  const auto rows = cadence::rows_view<double>::matrix(data.data(), n, r);
  cadence::zipline_workspace<double> ws;
  cadence::zipline_result<double> out;
  cadence::zipline_solve(v, rows, ws, out);  // warm-up: no first-touch faults timed
  for (auto _ : state) {
    cadence::zipline_solve(v, rows, ws, out);
    benchmark::DoNotOptimize(out.barrier);
  }
  state.SetComplexityN(static_cast<std::int64_t>(n));
  // Points searched per second (n * R per call): comparable across sizes.
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n * r));
}

/// One sequential pass: every point read once, a running min and max kept. Four independent
/// two-lane accumulators (SSE2 on x86-64, as fast's own validation pass), so the pass runs at
/// the memory's pace, not at a scalar min's latency: a one-accumulator loop measured 32 ms at
/// 10^5 x 150, slower than fast itself. Each line is asked for 2 KiB ahead, as validation
/// does (the hardware prefetchers stop at page ends): at 10^6 x 150 that took this pass from
/// 127 to 103 ms, so the floor is the memory's pace, not the prefetchers'.
std::pair<double, double> floor_pass(const double* v, std::size_t count) {
  std::size_t i = 0;
#if CADENCE_ZIPLINE_SSE2
  __m128d lo0 = _mm_set1_pd(v[0]), lo1 = lo0, lo2 = lo0, lo3 = lo0;
  __m128d hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;
  for (; i + 8 <= count; i += 8) {
    cadence::detail::prefetch_for_read_ahead(v + i, cadence::detail::zipline_validate_ahead);
    const __m128d a = _mm_loadu_pd(v + i), b = _mm_loadu_pd(v + i + 2);
    const __m128d c = _mm_loadu_pd(v + i + 4), d = _mm_loadu_pd(v + i + 6);
    lo0 = _mm_min_pd(lo0, a);
    lo1 = _mm_min_pd(lo1, b);
    lo2 = _mm_min_pd(lo2, c);
    lo3 = _mm_min_pd(lo3, d);
    hi0 = _mm_max_pd(hi0, a);
    hi1 = _mm_max_pd(hi1, b);
    hi2 = _mm_max_pd(hi2, c);
    hi3 = _mm_max_pd(hi3, d);
  }
  const __m128d lo = _mm_min_pd(_mm_min_pd(lo0, lo1), _mm_min_pd(lo2, lo3));
  const __m128d hi = _mm_max_pd(_mm_max_pd(hi0, hi1), _mm_max_pd(hi2, hi3));
  double l = std::min(_mm_cvtsd_f64(lo), _mm_cvtsd_f64(_mm_unpackhi_pd(lo, lo)));
  double h = std::max(_mm_cvtsd_f64(hi), _mm_cvtsd_f64(_mm_unpackhi_pd(hi, hi)));
#else
  double l = v[0], h = v[0];
#endif
  for (; i < count; ++i) {
    l = v[i] < l ? v[i] : l;
    h = v[i] > h ? v[i] : h;
  }
  return {l, h};
}

void bm_floor(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto r = static_cast<std::size_t>(state.range(1));
  const auto& data = predicted_rows(n, r);
  for (auto _ : state) benchmark::DoNotOptimize(floor_pass(data.data(), data.size()));
  state.SetComplexityN(static_cast<std::int64_t>(n));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n * r));
}

void register_all() {
  {
    auto* b = benchmark::RegisterBenchmark("zipline/floor/R15", bm_floor);
    for (const std::int64_t n : {10, 100, 1000, 10000}) b->Args({n, 15});
    b->ArgNames({"n", "R"})->Unit(benchmark::kMicrosecond)->Complexity(benchmark::oN);
    b = benchmark::RegisterBenchmark("zipline/floor/R150", bm_floor);
    for (const std::int64_t n : {10, 100, 1000, 10000, 100000, 1000000}) b->Args({n, 150});
    b->ArgNames({"n", "R"})->Unit(benchmark::kMicrosecond)->Complexity(benchmark::oN);
  }
  struct spec {
    const char* name;
    zipline_variant v;
    benchmark::BigO fit;
    std::int64_t max_n;
  };
  const spec specs[] = {{"zipline", zipline_variant::paper, benchmark::oNSquared, 1000},
                        {"opt", zipline_variant::paper_opt, benchmark::oNSquared, 1000},
                        {"opt_bs", zipline_variant::paper_opt_bs, benchmark::oNLogN, 10000},
                        {"fast", zipline_variant::fast, benchmark::oNLogN, 1000000}};
  for (const auto& s : specs)
    for (const std::int64_t r : {15, 150}) {
      auto* b = benchmark::RegisterBenchmark(
          ("zipline/" + std::string(s.name) + "/R" + std::to_string(r)).c_str(),
          [v = s.v](benchmark::State& st) { bm_variant(st, v); });
      for (const std::int64_t n : {10, 100, 1000, 10000, 100000, 1000000})
        if (n <= s.max_n && (n <= 10000 || r == 150)) b->Args({n, r});
      b->ArgNames({"n", "R"})->Unit(benchmark::kMicrosecond)->Complexity(s.fit);
    }
}

/// Best wall time of `reps` calls, in seconds.
double best_seconds(zipline_variant v, cadence::rows_view<double> rows, int reps) {
  cadence::zipline_workspace<double> ws;
  cadence::zipline_result<double> out;
  cadence::zipline_solve(v, rows, ws, out);  // warm-up: workspace grows once
  double best = 1e300;
  for (int k = 0; k < reps; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    cadence::zipline_solve(v, rows, ws, out);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

/// The ratio table of docs/zipline.md, measured in this process.
void ratio_table() {
  const std::size_t n = 1000, r = 150;
  const auto& data = predicted_rows(n, r);
  const auto rows = cadence::rows_view<double>::matrix(data.data(), n, r);
  const double ref = best_seconds(zipline_variant::paper, rows, 10);
  std::printf("ZipLine, n = %zu workers, R = %zu predicted pushes (double), best of K runs\n", n, r);
  std::printf("%-10s %12s %14s\n", "variant", "ms", "vs zipline");
  for (const auto v : {zipline_variant::paper, zipline_variant::paper_opt,
                       zipline_variant::paper_opt_bs, zipline_variant::fast}) {
    const int reps = v == zipline_variant::fast ? 300 : v == zipline_variant::paper_opt_bs ? 30 : 10;
    const double s = v == zipline_variant::paper ? ref : best_seconds(v, rows, reps);
    std::printf("%-10s %12.3f %13.1fx\n", std::string(cadence::to_string(v)).c_str(), s * 1e3,
                ref / s);
    benchmark::AddCustomContext("ratio_" + std::string(cadence::to_string(v)) + "_vs_zipline_n1000_R150",
                                std::to_string(ref / s));
  }
  std::fflush(stdout);
}

/// fast against the floor pass on the same rows, alternating, best of `reps` each.
void scale_table() {
  std::printf("ZipLine at scale, R = 150 (double), fast vs one sequential pass, alternating, best of K\n");
  std::printf("%9s %11s %6s %12s %12s %10s %12s\n", "n", "points", "K", "floor ms", "fast ms",
              "fast/floor", "fast ns/pt");
  for (const std::size_t n : {std::size_t{1000}, std::size_t{100000}, std::size_t{1000000}}) {
    const std::size_t r = 150;
    const auto& data = predicted_rows(n, r);
    const auto rows = cadence::rows_view<double>::matrix(data.data(), n, r);
    cadence::zipline_workspace<double> ws;
    cadence::zipline_result<double> out;
    cadence::zipline_fast(rows, ws, out);  // warm-up: the workspace grows once
    const int reps = n <= 1000 ? 300 : n <= 100000 ? 15 : 5;
    double floor_s = 1e300, fast_s = 1e300;
    for (int k = 0; k < reps; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(floor_pass(data.data(), data.size()));
      auto t1 = std::chrono::steady_clock::now();
      floor_s = std::min(floor_s, std::chrono::duration<double>(t1 - t0).count());
      t0 = std::chrono::steady_clock::now();
      cadence::zipline_fast(rows, ws, out);
      t1 = std::chrono::steady_clock::now();
      fast_s = std::min(fast_s, std::chrono::duration<double>(t1 - t0).count());
    }
    std::printf("%9zu %11zu %6d %12.3f %12.3f %9.2fx %12.2f\n", n, n * r, reps, floor_s * 1e3,
                fast_s * 1e3, fast_s / floor_s, fast_s * 1e9 / static_cast<double>(n * r));
    std::fflush(stdout);
    benchmark::AddCustomContext("scale_fast_over_floor_n" + std::to_string(n) + "_R150",
                                std::to_string(fast_s / floor_s));
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool ratio_only = false, scale_only = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cadence_ratio_only") == 0)
      ratio_only = true;
    else if (std::strcmp(argv[i], "--cadence_scale") == 0)
      scale_only = true;
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  if (scale_only) {
    scale_table();
    return 0;
  }
  ratio_table();
  if (ratio_only) return 0;
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
