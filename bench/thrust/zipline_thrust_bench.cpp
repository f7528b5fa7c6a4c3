// Thrust ZipLine on the OpenMP system against the library's best single-core variant
// (zipline_fast), same inputs, same run; prints the speed ratio per (n, R) at the end.
#include <cadence/thrust/zipline.hpp>
#include <cadence/zipline/fast.hpp>

#include "zipline_data.hpp"

#include <benchmark/benchmark.h>

#if defined(_OPENMP)
#  include <omp.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

namespace {

const cadence_bench::zipline_input& input(std::size_t n, std::size_t r) {
  static std::map<std::pair<std::size_t, std::size_t>, cadence_bench::zipline_input> cache;
  auto it = cache.find({n, r});
  if (it == cache.end()) it = cache.emplace(std::make_pair(n, r), cadence_bench::make_zipline_input(n, r)).first;
  return it->second;
}

cadence::rows_view<double> view(const cadence_bench::zipline_input& in) {
  return cadence::rows_view<double>::matrix(in.rows.data(), in.n, in.r);
}

void BM_zipline_fast(benchmark::State& state) {
  const auto& in = input(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  cadence::zipline_workspace<double> ws;
  cadence::zipline_result<double> out;
  cadence::zipline_fast(view(in), ws, out);  // warm, as the Thrust form is: no first-touch faults timed
  for (auto _ : state) {
    cadence::zipline_fast(view(in), ws, out);
    benchmark::DoNotOptimize(out.barrier);
  }
  state.SetComplexityN(state.range(0) * state.range(1));
}

void BM_zipline_thrust_omp(benchmark::State& state) {
  const auto& in = input(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  cadence::thrust_zipline_workspace ws;
  cadence::zipline_result<double> out;
  cadence::zipline_thrust(view(in), ws, out);
  if (out != cadence::zipline_fast(view(in))) {
    state.SkipWithError("zipline_thrust and zipline_fast disagree");
    return;
  }
  for (auto _ : state) {
    cadence::zipline_thrust(view(in), ws, out);
    benchmark::DoNotOptimize(out.barrier);
  }
  state.SetComplexityN(state.range(0) * state.range(1));
}

// N = n * R points; both are O(N log N) at worst, O(N) on these rows (one pass over every
// point, then a sort of a trimmed row subset).
BENCHMARK(BM_zipline_fast)->ArgsProduct({{1000, 10000, 100000, 1000000}, {15, 150}})
    ->ArgNames({"n", "R"})->Unit(benchmark::kMillisecond)->Complexity(benchmark::oN);
BENCHMARK(BM_zipline_thrust_omp)->ArgsProduct({{1000, 10000, 100000, 1000000}, {15, 150}})
    ->ArgNames({"n", "R"})->Unit(benchmark::kMillisecond)->Complexity(benchmark::oN);

// Console output plus a table of fast / thrust-omp time ratios from the same run.
class ratio_reporter : public benchmark::ConsoleReporter {
public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      const std::string name = run.benchmark_name();
      const auto slash = name.find('/');
      if (slash == std::string::npos) continue;
      times_[name.substr(slash)][name.substr(0, slash)] = run.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-22s %14s %18s %10s\n", "args", "fast [ms]", "thrust-omp [ms]", "ratio");
    for (const auto& [args, t] : times_) {
      const auto f = t.find("BM_zipline_fast"), o = t.find("BM_zipline_thrust_omp");
      if (f == t.end() || o == t.end()) continue;
      std::printf("%-22s %14.3f %18.3f %9.2fx\n", args.c_str(), f->second, o->second,
                  f->second / o->second);
    }
    std::printf("ratio = fast / thrust-omp: above 1 the OpenMP Thrust form is faster.\n");
  }

private:
  std::map<std::string, std::map<std::string, double>> times_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("thrust_device_system", cadence::thrust_device_system_name());
#if defined(_OPENMP)
  benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  benchmark::AddCustomContext("omp_wait_policy", wait ? wait : "(unset: spin, then sleep)");
#endif
  ratio_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
