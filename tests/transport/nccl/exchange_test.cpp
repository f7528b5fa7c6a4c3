// The collective adapters' NCCL form on CPU: tensors in "device" memory of the fake NCCL (host
// memory standing in), merged over nccl_communicator with ncclAvg, PreMulSum, device copies and
// device allocations through the function table; the elastic averager's records and hash check
// on an in-process control communicator. The same merges run on a GPU in bench/gpu/run.sh.
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/protocol.hpp>

#include "transport/conformance.hpp"
#include "fake_nccl.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;
namespace fake = cadence_fake_nccl;
using cadence_conformance::expect_throw;

static_assert(exchange::detail::has_device_ops_v<nccl_communicator>,
              "nccl_communicator offers the adapters' device helpers");
static_assert(!exchange::detail::has_device_ops_v<inproc_communicator>);

namespace {

// Rank r's simulated step time, as in the exchange suite: (1 + r mod 4) ms, +-10% by step.
std::int64_t step_us(int rank, std::uint64_t step) {
  const std::int64_t base = 1000 * (1 + rank % 4);
  const auto wobble = static_cast<std::int64_t>((step * 37 + static_cast<std::uint64_t>(rank) * 11) % 21) - 10;
  return base + base * wobble / 100;
}

// Ranks as threads: control = the rank's in-process communicator, bulk = an NCCL communicator
// (the fake) bootstrapped over it. body(control, bulk, api); an escaping exception fails the
// test naming the rank. Every device block the adapters allocated must be freed by the end.
template <class Body>
void run_ranks(int n, Body body, fake::faults f = {}) {
  fake::world fw(f);
  const nccl_api api = fw.api();
  const long blocks_before = fake::live_device_blocks.load();
  const auto errors = fake::run_ranks(
      fw, n, [&](int, inproc_communicator& control, nccl_communicator& bulk) { body(control, bulk, api); });
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) FAIL_CHECK(("rank " + std::to_string(r) + " threw: " + errors[r]));
  CHECK_MESSAGE(fake::live_device_blocks.load() == blocks_before, "device memory leaked");
  CHECK(fw.live_premul_ops() == 0);
}

// NCCL's average and pre-multiplied sum as the fake (and NCCL on one GPU) compute them: each
// rank's value times its scalar in T, summed in rank order.
template <class T>
T premul_sum(const std::vector<double>& scales, const std::vector<T>& values) {
  T acc = 0;
  for (std::size_t r = 0; r < values.size(); ++r)
    acc = r == 0 ? static_cast<T>(scales[r]) * values[r] : acc + static_cast<T>(scales[r]) * values[r];
  return acc;
}

// Per rank: the "device" tensors a trainer would hold (the fake's device memory is host memory).
struct tensors_of_sizes {
  std::vector<std::vector<float>> f;
  std::vector<std::vector<double>> g;
};

}  // namespace

TEST_CASE("NCCL form: bucketed all-reduce equals the unbucketed ncclAvg of each tensor, fused "
          "by device copies on the communicator's stream after the caller's" * doctest::timeout(120)) {
  const std::size_t sizes[] = {0, 1, 3, 17, 0, 1000, 1, 2000, 5000, 2, 0, 255, 4096, 7};
  constexpr int n = 4;
  for (std::size_t bucket : {std::size_t{64}, std::size_t{4096}, std::size_t{25} << 20}) {
    CAPTURE(bucket);
    run_ranks(n, [&](inproc_communicator&, nccl_communicator& c, const nccl_api& api) {
      void* mine = nullptr;  // the trainer's stream
      REQUIRE(api.stream_create(&mine) == 0);
      auto& caller = *static_cast<fake::stream*>(mine);
      auto& own = *static_cast<fake::stream*>(c.stream());
      {
        bucketed_allreducer_options o;
        o.bucket_bytes = bucket;
        o.timeout = 30s;
        o.stream = mine;
        bucketed_allreducer<nccl_communicator> red(c, o);
        CHECK(red.on_device());
        tensors_of_sizes t, ref;
        std::size_t k = 0;
        for (std::size_t s : sizes) {
          t.f.emplace_back(s);
          t.g.emplace_back(s + 1);
          for (std::size_t i = 0; i < s; ++i) t.f.back()[i] = cadence_conformance::value<float>(c.rank(), i + k);
          for (std::size_t i = 0; i <= s; ++i) t.g.back()[i] = cadence_conformance::value<double>(c.rank(), 3 * i + k);
          ++k;
        }
        ref = t;
        for (std::size_t i = 0; i < t.f.size(); ++i) {  // interleaved dtypes split the buckets
          red.add(t.f[i].data(), t.f[i].size());
          if (i % 3 != 0) red.add(t.g[i].data(), t.g[i].size());
        }
        for (std::size_t i = 0; i < t.g.size(); i += 3) red.add(t.g[i].data(), t.g[i].size());
        if (bucket == (std::size_t{25} << 20)) CHECK(red.buckets() < red.tensors());
        for (int step = 0; step < 2; ++step) {
          const std::uint64_t caller_uses = caller.uses, caller_records = caller.records, own_uses = own.uses;
          red.average();
          // The copies and all-reduces ran on the communicator's stream, after an event on the
          // caller's (one per bucket), and nothing else went on the caller's.
          CHECK(caller.uses == caller_uses);
          CHECK(caller.records - caller_records == red.buckets());
          CHECK(own.uses > own_uses);
          for (auto& v : ref.f) c.allreduce_average(v.data(), v.size(), dtype::f32, mine, 30s);
          for (std::size_t i = 0; i < ref.g.size(); ++i)
            if (i % 3 != 0) c.allreduce_average(ref.g[i].data(), ref.g[i].size(), dtype::f64, mine, 30s);
          for (std::size_t i = 0; i < ref.g.size(); i += 3)
            c.allreduce_average(ref.g[i].data(), ref.g[i].size(), dtype::f64, mine, 30s);
          CHECK_MESSAGE(t.f == ref.f, "rank " << c.rank() << " step " << step << ": f32 differs");
          CHECK_MESSAGE(t.g == ref.g, "rank " << c.rank() << " step " << step << ": f64 differs");
        }
        // With 4 ranks ncclAvg (x 1/4, then summed) is the exact mean of the integer inputs,
        // and averaging equal values again leaves them.
        for (std::size_t i = 0; i < sizes[5]; ++i) {
          double sum = 0;
          for (int r = 0; r < n; ++r) sum += cadence_conformance::value<float>(r, i + 5);
          if (t.f[5][i] != static_cast<float>(sum / n)) {
            FAIL_CHECK("rank " << c.rank() << " element " << i << ": " << t.f[5][i] << " != " << sum / n);
            break;
          }
        }
      }
      api.stream_destroy(mine);
    });
  }
}

TEST_CASE("NCCL form: bucket views live in device memory and are averaged in place" *
          doctest::timeout(60)) {
  run_ranks(2, [](inproc_communicator&, nccl_communicator& c, const nccl_api&) {
    bucketed_allreducer_options o;
    o.bucket_bytes = 256;
    o.timeout = 30s;
    bucketed_allreducer<nccl_communicator> red(c, o);
    std::vector<float*> f;
    std::vector<double*> g;
    for (std::size_t s : {std::size_t{0}, std::size_t{1}, std::size_t{30}, std::size_t{100}, std::size_t{7}}) {
      f.push_back(red.add_view<float>(s));
      g.push_back(red.add_view<double>(s + 2));
      for (std::size_t i = 0; i < s; ++i) CHECK(f.back()[i] == 0.0f);  // zero-filled on the device
      for (std::size_t i = 0; i < s; ++i) f.back()[i] = static_cast<float>(c.rank() * 2 + static_cast<int>(i));
      for (std::size_t i = 0; i < s + 2; ++i) g.back()[i] = static_cast<double>(c.rank() * 4);
    }
    CHECK(red.buckets() > 2);
    red.average();
    CHECK(f[3][10] == 11.0f);  // mean of 10 and 12
    CHECK(g[3][50] == 2.0);
    CHECK(g[0][1] == 2.0);
  });
}

TEST_CASE("NCCL form: periodic averaging merges every k local steps with ncclAvg" *
          doctest::timeout(60)) {
  run_ranks(4, [](inproc_communicator&, nccl_communicator& c, const nccl_api&) {
    periodic_averager<nccl_communicator> avg(c, 3, 30s);
    std::vector<float> x(10);
    std::vector<double> y(3);
    std::uint64_t steps = 0, wrong = 0;
    while (avg.barriers() < 10) {
      ++steps;
      if (!avg.step_done()) continue;
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(c.rank() * 2 + static_cast<int>(i));
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<double>(c.rank() * 8);
      avg.sync(x, y);
      for (std::size_t i = 0; i < x.size(); ++i)
        if (x[i] != static_cast<float>(3 + static_cast<int>(i))) ++wrong;  // mean of 2r + i
      for (double v : y)
        if (v != 12.0) ++wrong;
    }
    CHECK(wrong == 0);
    CHECK(steps == 30);
  });
}

namespace {

// The elastic averager over NCCL with `rule` for `barriers` barriers on n ranks of speeds up to
// 4:1: every merged value against the formula NCCL computes, the bound, identical plans.
void run_elastic_nccl(int n, const char* config, merge_rule rule, std::uint64_t barriers) {
  run_ranks(n, [&](inproc_communicator& control, nccl_communicator& c, const nccl_api&) {
    const int me = c.rank();
    elastic_averager_options o;
    o.merge = rule;
    o.timeout = 30s;
    elastic_averager<inproc_communicator, nccl_communicator> avg(control, c, config, o);
    CHECK(avg.on_device());
    const auto r_max = static_cast<std::int64_t>(avg.lookahead());
    constexpr std::size_t count = 33;
    std::vector<double> x(count, 0.0), anchor(count, 0.0);
    std::vector<float> y(5, 0.0f);
    std::uint64_t step = 0, plans = 0, wrong = 0, over = 0, elastic_rounds = 0;
    while (avg.barriers() < barriers) {
      ++step;
      if (!avg.step_done(step_us(me, step))) continue;
      const elastic_round plan = avg.round();
      for (std::int64_t s : plan.steps)
        if (s < 1 || s > (plan.warmup ? 1 : r_max)) ++over;
      if (!plan.warmup) ++elastic_rounds;
      const std::uint64_t b = avg.barriers();
      auto contribution = [&](int r, std::size_t i) {
        return static_cast<double>((static_cast<std::uint64_t>(r) + 1) * (i + 1) + b % 7);
      };
      for (std::size_t i = 0; i < count; ++i)
        x[i] = rule == merge_rule::summed_deltas ? anchor[i] + contribution(me, i) : contribution(me, i);
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(contribution(me, i));
      avg.sync(x, y);
      plans = plans * 1099511628211ull + avg.round().hash;
      double total = 0;
      for (std::int64_t s : plan.steps) total += static_cast<double>(s);
      std::vector<double> average(static_cast<std::size_t>(n), 1.0 / n), weights;
      for (std::int64_t s : plan.steps) weights.push_back(static_cast<double>(s) / total);
      const bool first = b == 0;
      for (std::size_t i = 0; i < count; ++i) {
        std::vector<double> xs;
        double sum = 0, exact_weighted = 0;
        for (int r = 0; r < n; ++r) {
          const double v = rule == merge_rule::summed_deltas ? anchor[i] + contribution(r, i) : contribution(r, i);
          xs.push_back(v);
          sum += contribution(r, i);
          exact_weighted += static_cast<double>(plan.steps[static_cast<std::size_t>(r)]) * contribution(r, i) / total;
        }
        double expected = premul_sum(average, xs);
        if (rule == merge_rule::step_weighted) {
          expected = premul_sum(weights, xs);
          if (std::fabs(expected - exact_weighted) > 1e-12 * std::fabs(exact_weighted) + 1e-12) ++wrong;
        }
        if (rule == merge_rule::summed_deltas && !first) expected = anchor[i] + sum;
        if (x[i] != expected && wrong++ == 0)
          MESSAGE("rank " << me << " barrier " << b << " element " << i << ": " << x[i] << " != " << expected);
        if (rule == merge_rule::summed_deltas) anchor[i] = x[i];
      }
      if (rule == merge_rule::average)
        for (std::size_t i = 0; i < y.size(); ++i) {
          std::vector<float> ys;
          for (int r = 0; r < n; ++r) ys.push_back(static_cast<float>(contribution(r, i)));
          if (y[i] != premul_sum(average, ys)) ++wrong;
        }
    }
    CHECK_MESSAGE(wrong == 0, "rank " << me << ": " << wrong << " merged values wrong");
    CHECK(over == 0);
    CHECK(avg.max_local_steps() <= r_max);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
    allgather(control, &plans, all.data(), sizeof plans, 30s);
    for (int r = 1; r < n; ++r) CHECK_MESSAGE(all[static_cast<std::size_t>(r)] == all[0], "rank " << r << " followed other plans");
    if (r_max > 1) CHECK(elastic_rounds > barriers / 2);
  });
}

}  // namespace

TEST_CASE("NCCL form: elastic averaging with 4:1 step times, records and hash on the control "
          "communicator, merges exact on the device for every merge rule" * doctest::timeout(120)) {
  SUBCASE("average, 4 ranks, 120 barriers") { run_elastic_nccl(4, "elastic:8", merge_rule::average, 120); }
  SUBCASE("average, 3 ranks (x 1/3 per rank, as ncclAvg)") {
    run_elastic_nccl(3, "elastic:6:median:3", merge_rule::average, 30);
  }
  SUBCASE("step-weighted (PreMulSum s_r / sum s)") {
    run_elastic_nccl(4, "elastic:6:median:3:opt-bs", merge_rule::step_weighted, 40);
  }
  SUBCASE("summed deltas (a sum, then -(n-1) x the device anchor)") {
    run_elastic_nccl(4, "elastic:5:mean:4:zipline", merge_rule::summed_deltas, 40);
    run_elastic_nccl(2, "elastic:5", merge_rule::summed_deltas, 20);
  }
}

TEST_CASE("NCCL form: ranks with different configs fail the hash check on the control "
          "communicator" * doctest::timeout(60)) {
  run_ranks(3, [](inproc_communicator& control, nccl_communicator& c, const nccl_api&) {
    elastic_averager_options o;
    o.timeout = 30s;
    elastic_averager<inproc_communicator, nccl_communicator> avg(control, c,
                                                                 c.rank() == 0 ? "elastic:4" : "elastic:5", o);
    std::vector<float> x(8, 1.0f);
    CHECK(avg.step_done(100));
    expect_throw<transport_error>(c.rank(), [&] { avg.sync(x); }, {"different plans"});
    CHECK_FALSE(c.failed());  // the merge itself went through
  });
}

TEST_CASE("NCCL form: a stalled rank makes the others throw transport_error naming it within "
          "the deadline" * doctest::timeout(60)) {
  constexpr int n = 4, stalled = 2;
  // The stalled rank stays until every other rank's deadline has passed (a departed rank would
  // be reported as lost instead).
  const cadence_test::events ev;
  SUBCASE("elastic: the control all-gather names it") {
    run_ranks(n, [&ev](inproc_communicator& control, nccl_communicator& c, const nccl_api&) {
      elastic_averager_options o;
      o.timeout = 1s;
      o.merge = merge_rule::step_weighted;
      elastic_averager<inproc_communicator, nccl_communicator> avg(control, c, "elastic:4", o);
      std::vector<float> x(64, 1.0f);
      std::uint64_t step = 0;
      while (avg.barriers() < 5)
        if (avg.step_done(step_us(c.rank(), ++step))) avg.sync(x);
      if (c.rank() == stalled) {
        CHECK(ev.wait_ranks("elastic threw", n, stalled));
        return;
      }
      while (!avg.step_done(step_us(c.rank(), ++step))) {
      }
      const auto t0 = std::chrono::steady_clock::now();
      expect_throw<transport_error>(c.rank(), [&] { avg.sync(x); },
                                    {"rank " + std::to_string(stalled), "on rank " + std::to_string(c.rank())});
      const double waited = cadence_conformance::seconds_since(t0);
      ev.post_rank("elastic threw", c.rank());
      CHECK(waited >= 0.99);
      CHECK(waited < 10.0);
    });
  }
  SUBCASE("bucketed: the NCCL all-reduce times out, naming the ranks it waited for") {
    run_ranks(n, [&ev](inproc_communicator&, nccl_communicator& c, const nccl_api&) {
      bucketed_allreducer_options o;
      o.timeout = 1s;
      bucketed_allreducer<nccl_communicator> red(c, o);
      std::vector<float> a(10, 1.0f), b(20, 2.0f);
      red.add(a);
      red.add(b);
      red.average();
      if (c.rank() == stalled) {
        CHECK(ev.wait_ranks("bucketed threw", n, stalled));
        return;
      }
      const auto t0 = std::chrono::steady_clock::now();
      expect_throw<transport_error>(c.rank(), [&] { red.average(); },
                                    {"allreduce_average", "deadline passed", std::to_string(stalled)});
      const double waited = cadence_conformance::seconds_since(t0);
      ev.post_rank("bucketed threw", c.rank());
      CHECK(waited >= 0.99);
      CHECK(waited < 10.0);
      CHECK(c.failed());
    });
  }
}

TEST_CASE("NCCL form: misuse is refused with invalid_parameter_error naming the rank" *
          doctest::timeout(60)) {
  run_ranks(2, [](inproc_communicator& control, nccl_communicator& c, const nccl_api&) {
    const int me = c.rank();
    const std::string rank = "on rank " + std::to_string(me);
    // NCCL cannot carry the host records: it is the bulk communicator, never the control one.
    expect_throw<invalid_parameter_error>(
        me, [&] { elastic_averager<nccl_communicator> a(c, "elastic:4"); }, {"control communicator", rank});
    // A stream means device memory.
    int not_a_stream = 0;
    bucketed_allreducer_options b;
    b.stream = &not_a_stream;
    expect_throw<invalid_parameter_error>(
        me, [&] { bucketed_allreducer<inproc_communicator> r(control, b); }, {"stream", rank});
    expect_throw<invalid_parameter_error>(
        me, [&] { periodic_averager<inproc_communicator> p(control, 2, 10s, &not_a_stream); }, {"stream"});
    CHECK_FALSE(c.failed());
  });
  // A hand-made table without the device entries: the adapters say what is missing.
  fake::world fw;
  nccl_api api = fw.api();
  api.memcpy_async = nullptr;
  inproc_world world(1);
  auto control = world.join(0);
  nccl_communicator c(api, control, 0, {}, 10s);
  bucketed_allreducer<nccl_communicator> red(c);
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  red.add(a);
  red.add(b);
  expect_throw<invalid_parameter_error>(0, [&] { red.average(); }, {"memcpy_async"});
}

// ---- ordering after the caller's stream ----

namespace {
// Ranks as threads over `fw`, as run_ranks above, with the fake world at hand for its kernels.
template <class Body>
void run_ranks_in(fake::world& fw, int n, Body body) {
  const long blocks_before = fake::live_device_blocks.load();
  const auto errors = fake::run_ranks(fw, n, [&](int, inproc_communicator& control, nccl_communicator& bulk) {
    body(control, bulk);
  });
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) FAIL_CHECK(("rank " + std::to_string(r) + " threw: " + errors[r]));
  CHECK(fake::live_device_blocks.load() == blocks_before);
}

// Runs what is left on `s` (a caller synchronising its stream), so no "kernel" outlives the
// buffer it writes, whatever the adapter did.
void drain(const nccl_api& api, void* s) {
  void* e = nullptr;
  REQUIRE(api.event_create(&e) == 0);
  REQUIRE(api.event_record(e, s) == 0);
  while (api.event_query(e) != 0) std::this_thread::yield();
  api.event_destroy(e);
}
}  // namespace

TEST_CASE("NCCL form: the adapters wait for the caller's stream: a gradient a kernel still has to "
          "write there is averaged as written, not as it was" * doctest::timeout(60)) {
  // The fake runs a stream's work only when someone synchronises with it. The "kernel" below
  // sits on the caller's stream; nothing drives that stream but the event the adapter records
  // on it and makes its own stream wait for. Without that wait the adapter's copies and
  // all-reduce would read the zeros: this test fails.
  constexpr int n = 2;
  for (bool null_stream : {false, true}) {
    CAPTURE(null_stream);
    fake::world fw;
    const nccl_api api = fw.api();
    run_ranks_in(fw, n, [&](inproc_communicator& control, nccl_communicator& c) {
      const int r = c.rank();
      void* mine = nullptr;  // null: the legacy default stream of this rank's device
      if (!null_stream) REQUIRE(api.stream_create(&mine) == 0);
      const float v = static_cast<float>(4 * (r + 1));  // the mean over two ranks is 6
      auto kernel = [&](std::vector<float>* t) {
        fw.launch(mine, [t, v] { std::fill(t->begin(), t->end(), v); });
      };
      {  // bucketed: a fused bucket (a, b) and one in place (big)
        bucketed_allreducer_options o;
        o.bucket_bytes = 64;
        o.stream = mine;
        o.timeout = 30s;
        bucketed_allreducer<nccl_communicator> red(c, o);
        // a holds one float more than it registers, so b can never start where a's registered
        // part ends: adjacent members are reduced in place, without the fusion copy this block
        // wants (two plain 4-float vectors were adjacent under ThreadSanitizer's allocator).
        std::vector<float> a(5), b(4), big(100);
        red.add(a.data(), 4);
        red.add(b);
        red.add(big);
        REQUIRE(red.buckets() == 2);
        REQUIRE(red.in_place_buckets() == 1);
        for (int step = 0; step < 2; ++step) {
          std::fill(a.begin(), a.end(), 0.0f);
          std::fill(b.begin(), b.end(), 0.0f);
          std::fill(big.begin(), big.end(), 0.0f);
          kernel(&big);  // backward writes the last layer's gradient first...
          red.mark_ready(2);
          kernel(&a);
          kernel(&b);
          red.mark_ready(1);
          red.mark_ready(0);
          red.finish();
          CHECK(std::vector<float>(a.begin(), a.begin() + 4) == std::vector<float>(4, 6.0f));
          CHECK(b == std::vector<float>(4, 6.0f));
          CHECK(big == std::vector<float>(100, 6.0f));
          drain(api, mine);
        }
      }
      {  // periodic: two tensors fused into one all-reduce
        periodic_averager<nccl_communicator> avg(c, 1, 30s, mine);
        std::vector<float> x(5, 0.0f), y(7, 0.0f);
        kernel(&x);
        kernel(&y);
        CHECK(avg.step_done());
        avg.sync(x, y);
        CHECK(x == std::vector<float>(5, 6.0f));
        CHECK(y == std::vector<float>(7, 6.0f));
        drain(api, mine);
      }
      {  // elastic: the merge after the records
        elastic_averager_options o;
        o.stream = mine;
        o.timeout = 30s;
        elastic_averager<inproc_communicator, nccl_communicator> avg(control, c, "elastic:2", o);
        std::vector<float> x(9, 0.0f);
        kernel(&x);
        CHECK(avg.step_done(100));
        avg.sync(x);
        CHECK(x == std::vector<float>(9, 6.0f));
        drain(api, mine);
      }
      if (mine != nullptr) api.stream_destroy(mine);
    });
  }
}

TEST_CASE("NCCL: the calls without a stream wait for nccl_options::caller_stream; those with one "
          "run on it" * doctest::timeout(60)) {
  fake::world fw;
  const nccl_api api = fw.api();
  run_ranks_in(fw, 2, [&](inproc_communicator&, nccl_communicator& c) {
    const int r = c.rank();
    std::vector<double> x(3, 0.0);
    // The default caller stream is the legacy default stream (null).
    fw.launch(nullptr, [&x, r] { std::fill(x.begin(), x.end(), static_cast<double>(r + 1)); });
    c.allreduce(x.data(), x.size(), dtype::f64, reduce_op::sum, 30s);
    CHECK(x == std::vector<double>(3, 3.0));
    drain(api, nullptr);
    auto w = c.iallreduce_average(x.data(), x.size(), dtype::f64);
    w.wait(30s);
    CHECK(x == std::vector<double>(3, 3.0));
    // An explicit stream is the stream itself: the kernel before the call on it comes first.
    void* s = nullptr;
    REQUIRE(api.stream_create(&s) == 0);
    const std::uint64_t own = fw.stream_info(c.stream()).uses;
    fw.launch(s, [&x, r] { std::fill(x.begin(), x.end(), static_cast<double>(10 * (r + 1))); });
    c.allreduce(x.data(), x.size(), dtype::f64, reduce_op::max, s, 30s);
    CHECK(x == std::vector<double>(3, 20.0));
    CHECK(fw.stream_info(c.stream()).uses == own);
    CHECK(fw.stream_info(s).uses == 1);
    api.stream_destroy(s);
  });
}
