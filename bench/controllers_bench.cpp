// Nanoseconds per push for each policy at n = 8 ... 2^20 workers, with complexity fits, and the
// memory each controller holds per worker. Each benchmark iteration is one push by a worker
// picked at random among the running ones (a released worker rejoins the running set), so
// waits and releases happen at the rate the policy produces them. The driver's own cost (a
// random pick and a swap) is included. Before timing, every worker pushes about 8 times
// (untimed), so large n are measured in the same steady state as small n, not in the
// warm-up where most workers are still at clock 0.
//
// Counters: bytes_per_worker = bytes_reserved() / n (everything the controller holds);
// state_B_per_worker = the part that is not push history or planning (ElasticBSP reports
// history_B_per_worker = 8 x history and plan_B_per_worker = rows, choices and ZipLine
// workspace separately; DSSP's 16 B of history, two pushes, is in its state).
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

struct xorshift {
  std::uint64_t s = 0x9E3779B97F4A7C15ull;
  std::uint64_t operator()() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

template <class C>
std::size_t bytes_of(const C& c) {
  if constexpr (std::is_same_v<C, cadence::any_controller>) {
    return c.template target<cadence::ssp>()->bytes_reserved();
  } else {
    return c.bytes_reserved();
  }
}

template <class C>
void drive(benchmark::State& state, C controller) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<cadence::worker_id> running(n);
  for (std::size_t p = 0; p < n; ++p) running[p] = static_cast<cadence::worker_id>(p);
  xorshift rng;
  double t = 0;
  std::size_t waits = 0;
  const auto one_push = [&] {
    const std::size_t i = rng() % running.size();
    const cadence::worker_id p = running[i];
    t += 1e-3;
    const cadence::decision d = controller.push(p, t);
    if (!d.proceed) {
      running[i] = running.back();
      running.pop_back();
      ++waits;
    }
    for (const cadence::worker_id q : d.released) running.push_back(q);
    return d;
  };
  for (std::size_t k = 0; k < 8 * n; ++k) one_push();  // steady state first (untimed)
  if constexpr (std::is_same_v<C, cadence::elastic_bsp>) {
    // ...and for ElasticBSP, past its first plans (every worker must push twice first: a
    // coupon collector, about n ln n random pushes).
    for (std::size_t k = 0; k < 40 * n && controller.barriers() < 2; ++k) one_push();
  }
  waits = 0;
  for (auto _ : state) {
    const cadence::decision d = one_push();
    benchmark::DoNotOptimize(d);
  }
  state.SetComplexityN(state.range(0));
  state.SetItemsProcessed(state.iterations());
  state.counters["wait_fraction"] =
      benchmark::Counter(static_cast<double>(waits) / static_cast<double>(state.iterations()));
  state.counters["max_staleness"] = static_cast<double>(controller.max_staleness());
  const double bytes = static_cast<double>(bytes_of(controller)) / static_cast<double>(n);
  state.counters["bytes_per_worker"] = bytes;
  if constexpr (std::is_same_v<C, cadence::elastic_bsp>) {
    const double history = 16.0 * sizeof(double);  // elastic_bsp's default history of 16 pushes
    const double plan =
        static_cast<double>(controller.planning_bytes_reserved()) / static_cast<double>(n);
    state.counters["history_B_per_worker"] = history;
    state.counters["plan_B_per_worker"] = plan;
    state.counters["state_B_per_worker"] = bytes - history - plan;
  } else {
    state.counters["state_B_per_worker"] = bytes;
  }
}

void bsp_push(benchmark::State& s) { drive(s, cadence::bsp(static_cast<std::size_t>(s.range(0)))); }
void asp_push(benchmark::State& s) { drive(s, cadence::asp(static_cast<std::size_t>(s.range(0)))); }
void ssp3_push(benchmark::State& s) { drive(s, cadence::ssp(static_cast<std::size_t>(s.range(0)), 3)); }
void dssp_3_15_push(benchmark::State& s) {
  drive(s, cadence::dssp(static_cast<std::size_t>(s.range(0)), 3, 15));
}
void any_controller_ssp3_push(benchmark::State& s) {
  drive(s, cadence::make_controller("ssp:3", static_cast<std::size_t>(s.range(0))));
}
void elastic15_push(benchmark::State& s) {
  drive(s, cadence::elastic_bsp(static_cast<std::size_t>(s.range(0)), 15));
}

void sizes(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(8)->Range(8, 1 << 15);
  b->Arg(1 << 16)->Arg(1 << 20)->Complexity();
}

}  // namespace

BENCHMARK(bsp_push)->Apply(sizes);
BENCHMARK(asp_push)->Apply(sizes);
BENCHMARK(ssp3_push)->Apply(sizes);
BENCHMARK(dssp_3_15_push)->Apply(sizes);
BENCHMARK(any_controller_ssp3_push)->Apply(sizes);
BENCHMARK(elastic15_push)->Apply(sizes);

BENCHMARK_MAIN();
