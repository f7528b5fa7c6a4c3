// Nanoseconds per push for each policy at n = 8 ... 2^20 workers, with complexity fits, and the
// memory each controller holds per worker. Pushes come from a random schedule: a worker picked
// at random among the running ones pushes (a released worker rejoins the running set), so
// waits and releases happen at the rate the policy produces them. Before timing, every worker
// pushes about 8 times (untimed), so large n are measured in the same steady state as small n,
// not in the warm-up where most workers are still at clock 0.
//
// Three series:
// - <policy>_push: the controller alone. The driver runs ahead on one controller and records
//   its pushes; a copy taken in the same state replays them under the timer, deciding exactly
//   as the first did. (At 2^20 the driver's random pick from a 4 MB running set costs as much
//   as a push, so timing it with the push would measure the driver.)
// - <policy>_push_prefetch (n = 4096, 2^16, 2^20): the same replay, hinting each push to the
//   controller 16 pushes ahead (cadence::prefetch), as a server holding a batch of messages
//   or a simulator holding its event queue can.
// - <policy>_push_driven (same sizes): the driver's pick and bookkeeping timed with the push,
//   the measure before the replay existed; its wait_fraction counter is the share of pushes
//   that waited.
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

#include <algorithm>
#include <cstddef>
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

// Picks the next push: a worker at random among the running ones (a released worker rejoins
// the running set), so waits and releases happen at the rate the policy produces them.
template <class C>
class random_driver {
public:
  explicit random_driver(std::size_t n) : running_(n) {
    for (std::size_t p = 0; p < n; ++p) running_[p] = static_cast<cadence::worker_id>(p);
  }
  cadence::decision push(C& controller) {
    const std::size_t i = rng_() % running_.size();
    const cadence::worker_id p = running_[i];
    last_ = p;
    t_ += 1e-3;
    const cadence::decision d = controller.push(p, t_);
    if (!d.proceed) {
      running_[i] = running_.back();
      running_.pop_back();
      ++waits_;
    }
    for (const cadence::worker_id q : d.released) running_.push_back(q);
    return d;
  }
  cadence::worker_id last() const { return last_; }
  double time() const { return t_; }
  std::size_t waits() const { return waits_; }
  void reset_waits() { waits_ = 0; }

private:
  std::vector<cadence::worker_id> running_;
  xorshift rng_;
  double t_ = 0;
  std::size_t waits_ = 0;
  cadence::worker_id last_ = 0;
};

// How a series is timed.
enum class timing {
  replay,    // the controller alone, replaying pushes the driver recorded (the default)
  prefetch,  // the same, with each push hinted 16 pushes ahead (cadence::prefetch)
  driven,    // the driver's random pick and its bookkeeping included
};

template <class C>
void drive(benchmark::State& state, C controller, timing how = timing::replay) {
  const auto n = static_cast<std::size_t>(state.range(0));
  random_driver<C> driver(n);
  for (std::size_t k = 0; k < 8 * n; ++k) driver.push(controller);  // steady state (untimed)
  if constexpr (std::is_same_v<C, cadence::elastic_bsp>) {
    // ...and for ElasticBSP, past its first plans (every worker must push twice first: a
    // coupon collector, about n ln n random pushes).
    for (std::size_t k = 0; k < 40 * n && controller.barriers() < 2; ++k) driver.push(controller);
  }
  driver.reset_waits();
  if (how == timing::driven) {
    for (auto _ : state) {
      const cadence::decision d = driver.push(controller);
      benchmark::DoNotOptimize(d);
    }
  } else {
    // The driver runs ahead on `controller` and records its pushes; `timed`, a copy from the
    // same state, replays them, so it decides exactly as `controller` did and the time is the
    // controller's alone. At 2^20 the driver's random pick from a 4 MB running set costs more
    // than a push.
    C timed = controller;
    constexpr std::size_t ahead = 16;
    std::vector<cadence::worker_id> trace(std::size_t{1} << 16);
    std::size_t next = trace.size();
    double t = driver.time();  // the replay adds the same steps to the same start
    const auto record = [&] {
      // The last `ahead` pushes of the previous segment stay in front as the hints' lead.
      const std::size_t keep = next < trace.size() ? trace.size() - next : 0;
      std::copy(trace.end() - static_cast<std::ptrdiff_t>(keep), trace.end(), trace.begin());
      for (std::size_t k = keep; k < trace.size(); ++k) {
        driver.push(controller);
        trace[k] = driver.last();
      }
      next = 0;
    };
    record();
    for (auto _ : state) {
      if (next + ahead >= trace.size()) {
        state.PauseTiming();
        record();
        state.ResumeTiming();
      }
      if (how == timing::prefetch) cadence::prefetch(timed, trace[next + ahead]);
      t += 1e-3;
      const cadence::decision d = timed.push(trace[next++], t);
      benchmark::DoNotOptimize(d);
    }
  }
  state.SetComplexityN(state.range(0));
  state.SetItemsProcessed(state.iterations());
  if (how == timing::driven)
    state.counters["wait_fraction"] = benchmark::Counter(
        static_cast<double>(driver.waits()) / static_cast<double>(state.iterations()));
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

void sizes(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(8)->Range(8, 1 << 15);
  b->Arg(1 << 16)->Arg(1 << 20)->Complexity();
}
void large_sizes(benchmark::internal::Benchmark* b) { b->Arg(4096)->Arg(1 << 16)->Arg(1 << 20); }

// One policy's three series (see drive): NAME_push, NAME_push_prefetch and NAME_push_driven,
// each building its controller for n workers with MAKE.
#define CADENCE_BENCH_POLICY(name, make)                                                       \
  void name##_push(benchmark::State& s) { drive(s, make(static_cast<std::size_t>(s.range(0)))); } \
  void name##_push_prefetch(benchmark::State& s) {                                             \
    drive(s, make(static_cast<std::size_t>(s.range(0))), timing::prefetch);                    \
  }                                                                                            \
  void name##_push_driven(benchmark::State& s) {                                               \
    drive(s, make(static_cast<std::size_t>(s.range(0))), timing::driven);                      \
  }                                                                                            \
  BENCHMARK(name##_push)->Apply(sizes);                                                        \
  BENCHMARK(name##_push_prefetch)->Apply(large_sizes);                                         \
  BENCHMARK(name##_push_driven)->Apply(large_sizes)

CADENCE_BENCH_POLICY(bsp, [](std::size_t n) { return cadence::bsp(n); });
CADENCE_BENCH_POLICY(asp, [](std::size_t n) { return cadence::asp(n); });
CADENCE_BENCH_POLICY(ssp3, [](std::size_t n) { return cadence::ssp(n, 3); });
CADENCE_BENCH_POLICY(dssp_3_15, [](std::size_t n) { return cadence::dssp(n, 3, 15); });
CADENCE_BENCH_POLICY(any_controller_ssp3,
                     [](std::size_t n) { return cadence::make_controller("ssp:3", n); });
CADENCE_BENCH_POLICY(elastic15, [](std::size_t n) { return cadence::elastic_bsp(n, 15); });
#undef CADENCE_BENCH_POLICY

}  // namespace

BENCHMARK_MAIN();
