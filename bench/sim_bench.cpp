// Simulated push events per second (items_per_second) of cadence::sim::simulate for each
// policy on the heterogeneous scenario at n = 16 ... 10^5 workers. Each benchmark iteration
// simulates a fixed 200k pushes (10 per worker at 10^5 workers, 10^6 in all, so that building
// 10^5 workers' random streams does not dominate), so time per push is the per-event cost, O(log n) from
// the event heap plus the policy's own push; the controller's wall-clock timing is included
// as cadence-sim runs it (the *_untimed variant shows its cost).
#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace {

constexpr std::int64_t events_per_run = 200000;

cadence::sim::scenario bench_scenario(std::size_t n) {
  cadence::sim::scenario s = cadence::sim::make_scenario("hetero16", n);
  s.seconds = 0;
  s.iterations = std::max<std::uint64_t>(static_cast<std::uint64_t>(events_per_run) / n, 10);
  return s;
}

void run_policy(benchmark::State& state, const char* policy, bool timed) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const cadence::sim::scenario s = bench_scenario(n);
  cadence::sim::run_options opt;
  opt.time_controller = timed;
  std::uint64_t pushes = 0;
  try {
    (void)cadence::make_controller(policy, n);
  } catch (const cadence::error& e) {
    state.SkipWithError(e.what());  // a build without this policy
    return;
  }
  double ctrl_ns = 0;
  for (auto _ : state) {
    cadence::any_controller c = cadence::make_controller(policy, n);
    const cadence::sim::run_metrics m = cadence::sim::simulate(c, s, opt);
    pushes += m.iterations;
    ctrl_ns = m.controller_ns_per_push;
    benchmark::DoNotOptimize(m.wait_seconds);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(pushes));
  state.SetComplexityN(static_cast<std::int64_t>(n));
  state.counters["controller_ns_per_push"] = ctrl_ns;
}

void sim_bsp(benchmark::State& st) { run_policy(st, "bsp", true); }
void sim_asp(benchmark::State& st) { run_policy(st, "asp", true); }
void sim_ssp3(benchmark::State& st) { run_policy(st, "ssp:3", true); }
void sim_ssp3_untimed(benchmark::State& st) { run_policy(st, "ssp:3", false); }
void sim_dssp_3_15(benchmark::State& st) { run_policy(st, "dssp:3:15", true); }
void sim_elastic15(benchmark::State& st) { run_policy(st, "elastic:15", true); }
void sim_elastic60(benchmark::State& st) { run_policy(st, "elastic:60", true); }

// The same simulation on the concrete class: what any_controller's virtual calls cost.
void sim_ssp3_concrete(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const cadence::sim::scenario s = bench_scenario(n);
  std::uint64_t pushes = 0;
  for (auto _ : state) {
    cadence::ssp c(n, 3);
    const cadence::sim::run_metrics m = cadence::sim::simulate(c, s);
    pushes += m.iterations;
    benchmark::DoNotOptimize(m.wait_seconds);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(pushes));
  state.SetComplexityN(static_cast<std::int64_t>(n));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t n : {16, 128, 1000, 100000}) b->Arg(n);
  b->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(sim_bsp)->Apply(sizes);
BENCHMARK(sim_asp)->Apply(sizes);
BENCHMARK(sim_ssp3)->Apply(sizes)->Complexity(benchmark::oLogN);
BENCHMARK(sim_ssp3_untimed)->Apply(sizes);
BENCHMARK(sim_ssp3_concrete)->Apply(sizes);
BENCHMARK(sim_dssp_3_15)->Apply(sizes);
BENCHMARK(sim_elastic15)->Apply(sizes);
BENCHMARK(sim_elastic60)->Apply(sizes);

BENCHMARK_MAIN();
