// Collective ElasticBSP's planning step (exchange::elastic_planner) at 10^2 ... 10^5 ranks:
// what each rank does at every barrier besides the merge. Every rank receives all ranks'
// timing records (an all-gather of 8 x (history + 2) bytes per rank) and runs the same plan.
//
//   planner/gather/ranks:N  the local side of the all-gather: n records copied into the
//                           buffer plan() reads (what a transport's receive does, at memory
//                           speed; the network time is the fabric's: see docs/collective.md)
//   planner/plan/ranks:N    plan() on those records: predict R step ends per rank, ZipLine
//
// Counters: record_bytes_per_rank (8 x (history + 2)), gather_bytes (received per rank per
// barrier, n x record bytes) and ns_per_rank (time / n). Records: ranks of three speeds
// (100, 130, 170 ms a step, as cadence-sim's large1000) with 5% jitter, 16 durations each.
#include <cadence/exchange/elastic_averager.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::size_t history = 16;

std::vector<std::int64_t> make_records(std::size_t n) {
  const std::size_t w = history + 2;
  std::vector<std::int64_t> rec(n * w);
  std::mt19937_64 rng(1);
  std::normal_distribution<double> jitter(1.0, 0.05);
  static constexpr double step_us[3] = {100000, 130000, 170000};
  for (std::size_t p = 0; p < n; ++p) {
    rec[p * w] = 15;
    rec[p * w + 1] = static_cast<std::int64_t>(history);
    for (std::size_t i = 0; i < history; ++i)
      rec[p * w + 2 + i] = static_cast<std::int64_t>(step_us[p % 3] * jitter(rng));
  }
  return rec;
}

void counters(benchmark::State& state, std::size_t n) {
  const double record = 8.0 * (history + 2);
  state.counters["record_bytes_per_rank"] = record;
  state.counters["gather_bytes"] = record * static_cast<double>(n);
  state.counters["ns_per_rank"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate |
                                                     benchmark::Counter::kInvert);
  state.SetComplexityN(static_cast<std::int64_t>(n));
}

void bm_gather(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<std::int64_t> sent = make_records(n);
  std::vector<std::int64_t> received(sent.size());
  for (auto _ : state) {
    std::memcpy(received.data(), sent.data(), sent.size() * sizeof(std::int64_t));
    benchmark::ClobberMemory();
  }
  counters(state, n);
}

void bm_plan(benchmark::State& state, const char* config) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<std::int64_t> records = make_records(n);
  cadence::exchange::elastic_planner planner(config, n, history);
  std::uint64_t barrier = 0;
  for (auto _ : state) {
    const cadence::exchange::elastic_round round =
        planner.plan(cadence::span<const std::int64_t>(records.data(), records.size()), barrier++);
    benchmark::DoNotOptimize(round.hash);
  }
  if (planner.fallbacks() != 0) state.SkipWithError("the planner fell back to BSP");
  counters(state, n);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t n : {100, 1000, 10000, 100000}) b->Arg(n);
  b->ArgName("ranks")->Unit(benchmark::kMicrosecond)->Complexity(benchmark::oN);
}

}  // namespace

BENCHMARK(bm_gather)->Name("planner/gather")->Apply(sizes);
BENCHMARK_CAPTURE(bm_plan, elastic4, "elastic:4")->Name("planner/plan/elastic:4")->Apply(sizes);
BENCHMARK_CAPTURE(bm_plan, elastic15, "elastic:15")->Name("planner/plan/elastic:15")->Apply(sizes);
BENCHMARK_CAPTURE(bm_plan, elastic15_median, "elastic:15:median:5")
    ->Name("planner/plan/elastic:15:median:5")
    ->Apply(sizes);

BENCHMARK_MAIN();
