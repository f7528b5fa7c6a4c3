// The collective adapters' tests (cadence/exchange/: bucketed_allreducer, elastic_averager,
// periodic_averager), written once over the communicator concept and instantiated per backend,
// H a harness as in transport/conformance.hpp: H::run(body) calls body(comm) once per rank,
// ranks in parallel, a world of at least 2 ranks. One macro per adapter, so the in-process
// instances live in tests/exchange/<adapter>_test.cpp beside the adapter's own cases; a backend
// takes all three with CADENCE_COLLECTIVE_SUITE(its_harness).
//
// Bodies use CHECK, never REQUIRE, so every rank issues the same collectives whatever its
// checks find; step durations are passed, not slept, so the runs are quick and deterministic.
#pragma once

#include "transport/conformance.hpp"

#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/exchange/periodic_averager.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence_exchange_suite {

using namespace cadence;
using namespace cadence::transport;
using namespace cadence::exchange;
using namespace std::chrono_literals;
using cadence_conformance::expect_throw;

// Rank r's simulated step time: (1 + r mod 4) ms, so the slowest rank of 4 is 4x the
// fastest, with a deterministic +-10% wobble that changes with the step.
inline std::int64_t step_us(int rank, std::uint64_t step) {
  const std::int64_t base = 1000 * (1 + rank % 4);
  const auto wobble = static_cast<std::int64_t>((step * 37 + static_cast<std::uint64_t>(rank) * 11) % 21) - 10;
  return base + base * wobble / 100;
}

// A backward pass over the first `count` tensors of `red`: marked ready in reverse order, with the
// tensors at positions `a` and `b` (mod count) of that order swapped (so it differs by rank),
// poll() between them as a trainer's hook would; then finish().
template <class R>
void backward_pass(R& red, std::size_t count, std::size_t a, std::size_t b) {
  std::vector<std::size_t> order(count);
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
  std::swap(order[a % order.size()], order[b % order.size()]);
  for (std::size_t i : order) {
    red.mark_ready(i);
    (void)red.poll();
  }
  red.finish();
}

// Gathers one 64-bit value from every rank (to compare what the ranks saw).
template <class C>
std::vector<std::uint64_t> gather(C& c, std::uint64_t v) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(c.size()));
  allgather(c, &v, all.data(), sizeof v, 30s);
  return all;
}

inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  return (h ^ v) * 1099511628211ull + 0x9e3779b97f4a7c15ull;
}

// Runs the elastic averager for `barriers` barriers with the merge rule `rule`; checks every
// merged value, the bound, and that every rank followed the same plans.
template <class C>
void run_elastic(C& c, const std::string& config, merge_rule rule, std::uint64_t barriers) {
  const int n = c.size();
  const int me = c.rank();
  elastic_averager_options o;
  o.merge = rule;
  o.timeout = 30s;
  elastic_averager<C> avg(c, config, o);
  const auto r_max = static_cast<std::int64_t>(avg.lookahead());
  constexpr std::size_t count = 33;
  std::vector<double> x(count, 0.0);
  std::vector<float> y(5, 0.0f);
  std::vector<double> anchor(count, 0.0);  // summed_deltas: the last merged values
  std::uint64_t step = 0, plans = 0, wrong = 0, over = 0, elastic_rounds = 0;
  std::vector<std::int64_t> steps_per_rank(static_cast<std::size_t>(n), 0);
  while (avg.barriers() < barriers) {
    ++step;
    if (!avg.step_done(step_us(me, step))) continue;
    const elastic_round plan = avg.round();
    if (avg.local_steps() != plan.steps[static_cast<std::size_t>(me)]) ++wrong;
    for (std::int64_t s : plan.steps)
      if (s < 1 || s > (plan.warmup ? 1 : r_max)) ++over;
    if (!plan.warmup) ++elastic_rounds;
    const std::uint64_t b = avg.barriers();
    // Rank r's values before the merge: integers, so every merge is exact.
    auto contribution = [&](int r, std::size_t i) -> double {
      return static_cast<double>((static_cast<std::uint64_t>(r) + 1) * (i + 1) + b % 7);
    };
    for (std::size_t i = 0; i < count; ++i)
      x[i] = rule == merge_rule::summed_deltas ? anchor[i] + contribution(me, i) : contribution(me, i);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(contribution(me, i));
    avg.sync(x, y);
    for (std::size_t r = 0; r < plan.steps.size(); ++r) steps_per_rank[r] += plan.steps[r];
    plans = mix(plans, avg.round().hash);
    const bool first = b == 0;
    for (std::size_t i = 0; i < count; ++i) {
      double sum = 0, weighted = 0, weights = 0;
      for (int r = 0; r < n; ++r) {
        sum += contribution(r, i);
        const auto s = static_cast<double>(plan.steps[static_cast<std::size_t>(r)]);
        weighted += s * contribution(r, i);
        weights += s;
      }
      double expected = sum / n;
      if (rule == merge_rule::step_weighted) expected = weighted / weights;
      if (rule == merge_rule::summed_deltas) expected = first ? anchor[i] + sum / n : anchor[i] + sum;
      if (x[i] != expected && wrong++ == 0)
        MESSAGE("rank " << me << " barrier " << b << " element " << i << ": " << x[i] << " != " << expected);
      if (rule == merge_rule::summed_deltas) anchor[i] = x[i];
    }
    if (rule == merge_rule::average)
      for (std::size_t i = 0; i < y.size(); ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r) sum += static_cast<float>(contribution(r, i));
        if (y[i] != sum / static_cast<float>(n)) ++wrong;
      }
  }
  CHECK_MESSAGE(wrong == 0, "rank " << me << ": " << wrong << " merged values or step counts wrong");
  CHECK_MESSAGE(over == 0, "rank " << me << ": " << over << " planned step counts outside [1, R]");
  CHECK(avg.max_local_steps() <= r_max);
  CHECK(avg.max_local_steps() >= 1);
  // Every rank followed the same sequence of plans (the averager checks each; this checks the
  // whole history independently).
  const auto all = gather(c, plans);
  for (int r = 1; r < n; ++r)
    CHECK_MESSAGE(all[static_cast<std::size_t>(r)] == all[0], "rank " << r << " followed other plans than rank 0");
  if (r_max > 1) {
    // After warm-up the plans are elastic, and the fastest rank runs more steps than the slowest.
    CHECK(elastic_rounds > barriers / 2);
    if (n >= 4) CHECK(steps_per_rank[0] > steps_per_rank[3]);
  }
}

}  // namespace cadence_exchange_suite

#define CADENCE_EXCHANGE_TEST(name, id) TEST_CASE_TEMPLATE_DEFINE(name * doctest::timeout(120), H, id)
// An exchange test whose body, written after the macro, runs on every rank as a function of `c`,
// the rank's communicator (C its type).
#define CADENCE_EXCHANGE_RANK_TEST(name, id) \
  CADENCE_RANK_TEST(CADENCE_EXCHANGE_TEST, name, id, cadence_exchange_suite, H::run)

CADENCE_EXCHANGE_RANK_TEST("bucketed all-reduce equals the unbucketed all-reduce for tensors of many "
                           "sizes, fused and alone", exchange_bucketed_equals_unbucketed) {
  const std::size_t sizes[] = {0, 1, 3, 17, 0, 1000, 1, 2000, 5000, 2, 0, 255, 4096, 7};
  for (std::size_t bucket : {std::size_t{64}, std::size_t{4096}, std::size_t{25} << 20}) {
    bucketed_allreducer_options o;
    o.bucket_bytes = bucket;
    o.timeout = 30s;
    bucketed_allreducer<C> red(c, o);
    std::vector<std::vector<float>> f;
    std::vector<std::vector<double>> g;
    std::size_t k = 0;
    for (std::size_t n : sizes) {
      f.emplace_back(n);
      g.emplace_back(n + 1);
      for (std::size_t i = 0; i < n; ++i)
        f.back()[i] = cadence_conformance::value<float>(c.rank(), i + k);
      for (std::size_t i = 0; i <= n; ++i)
        g.back()[i] = cadence_conformance::value<double>(c.rank(), 3 * i + k);
      ++k;
    }
    auto f_ref = f;
    auto g_ref = g;
    for (std::size_t t = 0; t < f.size(); ++t) {  // interleave dtypes: buckets split on them
      red.add(f[t].data(), f[t].size());
      if (t % 3 != 0) red.add(g[t].data(), g[t].size());
    }
    for (std::size_t t = 0; t < g.size(); t += 3) red.add(g[t].data(), g[t].size());
    const std::size_t buckets = red.buckets();
    CHECK(buckets >= 1);
    CHECK(buckets <= red.tensors());
    if (bucket == (std::size_t{25} << 20)) CHECK(buckets < red.tensors());
    red.average();
    for (auto& v : f_ref) allreduce_avg(c, v.data(), v.size(), dtype::f32, 30s);
    for (std::size_t t = 0; t < g.size(); ++t)
      if (t % 3 != 0) allreduce_avg(c, g_ref[t].data(), g_ref[t].size(), dtype::f64, 30s);
    for (std::size_t t = 0; t < g.size(); t += 3)
      allreduce_avg(c, g_ref[t].data(), g_ref[t].size(), dtype::f64, 30s);
    CHECK_MESSAGE(f == f_ref, "rank " << c.rank() << " bucket " << bucket << ": f32 differs");
    CHECK_MESSAGE(g == g_ref, "rank " << c.rank() << " bucket " << bucket << ": f64 differs");
    // A second step reuses the buckets.
    red.average();
    for (auto& v : f_ref) allreduce_avg(c, v.data(), v.size(), dtype::f32, 30s);
    CHECK(f == f_ref);
    for (std::size_t t = 0; t < g.size(); ++t)
      if (t % 3 != 0) allreduce_avg(c, g_ref[t].data(), g_ref[t].size(), dtype::f64, 30s);
    for (std::size_t t = 0; t < g.size(); t += 3)
      allreduce_avg(c, g_ref[t].data(), g_ref[t].size(), dtype::f64, 30s);
    CHECK(g == g_ref);
  }
}

CADENCE_EXCHANGE_RANK_TEST("gradients marked ready in a different order on every rank are averaged "
                           "exactly, step after step", exchange_bucketed_mark_ready) {
  bucketed_allreducer_options o;
  o.bucket_bytes = 96;
  o.timeout = 30s;
  bucketed_allreducer<C> red(c, o);
  const std::size_t sizes[] = {5, 30, 0, 7, 24, 1, 12, 40};
  std::vector<std::vector<float>> t;
  for (std::size_t n : sizes) t.emplace_back(n);
  for (auto& v : t) red.add(v);
  const int n = c.size(), r = c.rank();
  for (int step = 0; step < 4; ++step) {
    for (std::size_t k = 0; k < t.size(); ++k)
      for (std::size_t i = 0; i < t[k].size(); ++i)
        t[k][i] = static_cast<float>(n * (r + static_cast<int>(i + k) + step));
    // A backward pass in reverse order, shuffled a little differently on each rank.
    backward_pass(red, t.size(), static_cast<std::size_t>(r + step), static_cast<std::size_t>(r + step + 3));
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < t.size(); ++k)
      for (std::size_t i = 0; i < t[k].size(); ++i)
        wrong += t[k][i] != static_cast<float>(n * (static_cast<int>(i + k) + step) + n * (n - 1) / 2);
    CHECK_MESSAGE(wrong == 0, "rank " << r << " step " << step << ": " << wrong << " wrong");
  }
}

CADENCE_EXCHANGE_RANK_TEST("a copying bucket all-reduced in parts, each launched as its tensors are "
                           "marked, equals one all-reduce of the whole bucket", exchange_bucketed_parts) {
  const int n = c.size(), r = c.rank();
  // Odd sizes in separate allocations (so both buckets, f32 and f64, are copied).
  const std::size_t sizes[] = {1, 3, 17, 1000, 0, 255, 7, 2049, 2, 300};
  // Integer-valued (exact sums: equal bit for bit) and fractional (two ranks: equal bit for
  // bit, a + b being b + a; more: within rounding, the ring's order depending on the parts).
  for (const bool integers : {true, false}) {
    // No parts, a few floats across tensor boundaries, and two parts of the f32 bucket
    // (few enough collectives that a loaded machine stays inside the step's deadline).
    for (const std::size_t part : {std::size_t{0}, std::size_t{60}, std::size_t{1000}, std::size_t{8192}}) {
      bucketed_allreducer_options o, whole;
      o.bucket_bytes = whole.bucket_bytes = 20000;
      o.timeout = whole.timeout = 30s;
      o.part_bytes = part;
      whole.part_bytes = 0;
      bucketed_allreducer<C> red(c, o), ref(c, whole);
      std::vector<std::vector<float>> f, f_ref;
      std::vector<std::vector<double>> g, g_ref;
      for (std::size_t k = 0; k < std::size(sizes); ++k) {
        f.emplace_back(sizes[k]);
        g.emplace_back(sizes[k] + 1);
      }
      f_ref = f;
      g_ref = g;
      for (std::size_t k = 0; k < f.size(); ++k) {
        red.add(f[k].data(), f[k].size());
        ref.add(f_ref[k].data(), f_ref[k].size());
      }
      for (std::size_t k = 0; k < g.size(); ++k) {
        red.add(g[k].data(), g[k].size());
        ref.add(g_ref[k].data(), g_ref[k].size());
      }
      CHECK(red.in_place_buckets() == 0);
      if (part == 0 || !has_async_v<C>) CHECK(red.allreduces() == red.buckets());
      else CHECK(red.allreduces() > red.buckets());
      for (int step = 0; step < 2; ++step) {
        for (std::size_t k = 0; k < f.size(); ++k) {
          for (std::size_t i = 0; i < f[k].size(); ++i)
            f[k][i] = integers ? cadence_conformance::value<float>(r, i + k + step)
                               : static_cast<float>(0.1 * (r + 1) + 1e-3 * static_cast<double>(i + k + step));
          for (std::size_t i = 0; i < g[k].size(); ++i)
            g[k][i] = integers ? cadence_conformance::value<double>(r, 3 * i + k + step)
                               : 0.1 / (r + 1) + 1e-7 * static_cast<double>(i * k + step);
        }
        f_ref = f;
        g_ref = g;
        // Marked in reverse order with one swap that differs by rank.
        backward_pass(red, red.tensors(), static_cast<std::size_t>(r + step), static_cast<std::size_t>(r + step + 5));
        ref.average();
        std::size_t differ = 0, wrong = 0;
        for (std::size_t k = 0; k < f.size(); ++k) {
          for (std::size_t i = 0; i < f[k].size(); ++i) {
            differ += f[k][i] != f_ref[k][i];
            wrong += std::abs(f[k][i] - f_ref[k][i]) > 1e-6f * std::abs(f_ref[k][i]);
          }
          for (std::size_t i = 0; i < g[k].size(); ++i) {
            differ += g[k][i] != g_ref[k][i];
            wrong += std::abs(g[k][i] - g_ref[k][i]) > 1e-14 * std::abs(g_ref[k][i]);
          }
        }
        CHECK_MESSAGE(wrong == 0, "rank " << r << " of " << n << ", part_bytes " << part << ", step " << step
                                          << (integers ? ", integers" : ", fractions") << ": " << wrong
                                          << " elements off the whole-bucket result by more than rounding");
        if (integers || n == 2)
          CHECK_MESSAGE(differ == 0, "rank " << r << " of " << n << ", part_bytes " << part << ", step "
                                             << step << ": " << differ << " elements not bit-identical");
      }
    }
  }
}

CADENCE_EXCHANGE_RANK_TEST("bucket views are averaged in place like registered tensors",
                           exchange_bucket_views) {
  bucketed_allreducer_options o;
  o.bucket_bytes = 256;
  o.timeout = 30s;
  bucketed_allreducer<C> red(c, o);
  std::vector<float> plain(10);
  red.add(plain);
  const std::size_t sizes[] = {0, 1, 30, 100, 7, 0, 64};
  std::vector<float*> f;
  std::vector<double*> g;
  for (std::size_t n : sizes) {
    f.push_back(red.template add_view<float>(n));
    g.push_back(red.template add_view<double>(n + 2));
  }
  CHECK(red.buckets() > 2);
  std::vector<std::vector<float>> f_ref;
  std::vector<std::vector<double>> g_ref;
  for (std::size_t k = 0; k < f.size(); ++k) {
    for (std::size_t i = 0; i < sizes[k]; ++i) f[k][i] = cadence_conformance::value<float>(c.rank(), i + k);
    for (std::size_t i = 0; i < sizes[k] + 2; ++i) g[k][i] = cadence_conformance::value<double>(c.rank(), i * 5 + k);
    f_ref.emplace_back(f[k], f[k] + sizes[k]);
    g_ref.emplace_back(g[k], g[k] + sizes[k] + 2);
  }
  for (std::size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<float>(c.rank() * 4);
  red.average();
  allreduce_avg(c, plain.data(), 0, dtype::f32, 30s);  // keeps the ranks in step below
  for (std::size_t k = 0; k < f.size(); ++k) {
    allreduce_avg(c, f_ref[k].data(), f_ref[k].size(), dtype::f32, 30s);
    allreduce_avg(c, g_ref[k].data(), g_ref[k].size(), dtype::f64, 30s);
    CHECK(std::equal(f_ref[k].begin(), f_ref[k].end(), f[k]));
    CHECK(std::equal(g_ref[k].begin(), g_ref[k].end(), g[k]));
  }
  for (float v : plain) CHECK(v == static_cast<float>(2 * (c.size() - 1)));
}

CADENCE_EXCHANGE_TEST("elastic averaging with 4:1 step times runs 200 barriers without a hang, "
                      "every rank on the same plans, merges exact, no rank past R local steps",
                      exchange_elastic_200_barriers) {
  using namespace cadence_exchange_suite;
  SUBCASE("average, last") { H::run([](auto& c) { run_elastic(c, "elastic:8", merge_rule::average, 200); }); }
  SUBCASE("step-weighted, median:3, opt-bs") {
    H::run([](auto& c) { run_elastic(c, "elastic:6:median:3:opt-bs", merge_rule::step_weighted, 60); });
  }
  SUBCASE("summed deltas, mean:4, zipline") {
    H::run([](auto& c) { run_elastic(c, "elastic:5:mean:4:zipline", merge_rule::summed_deltas, 60); });
  }
  SUBCASE("R = 1 is BSP") { H::run([](auto& c) { run_elastic(c, "elastic:1", merge_rule::average, 20); }); }
}

CADENCE_EXCHANGE_RANK_TEST("periodic averaging merges every k local steps", exchange_periodic) {
  periodic_averager<C> avg(c, 3, 30s);
  std::vector<float> x(10), z(3);
  std::vector<double> y(7);
  std::uint64_t steps = 0, wrong = 0;
  while (avg.barriers() < 20) {
    ++steps;
    const bool due = avg.step_done();
    CHECK(due == (steps % 3 == 0));
    if (!due) continue;
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(c.rank() * 2 + i);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<double>(c.rank() * 4 + i);
    for (std::size_t i = 0; i < z.size(); ++i) z[i] = static_cast<float>(c.rank() * 6 + i);
    if (avg.barriers() % 2 == 0)
      avg.sync(x);  // one tensor: in place
    else
      avg.sync(x, y, z);  // two f32 tensors fused, the f64 one alone: two all-reduces
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i] != static_cast<float>(c.size() - 1 + i)) ++wrong;  // mean of 2r + i
    if (avg.barriers() % 2 == 0) {  // the barrier just done merged all three
      for (std::size_t i = 0; i < y.size(); ++i)
        if (y[i] != static_cast<double>(2 * (c.size() - 1) + i)) ++wrong;
      for (std::size_t i = 0; i < z.size(); ++i)
        if (z[i] != static_cast<float>(3 * (c.size() - 1) + i)) ++wrong;
    }
  }
  CHECK(wrong == 0);
  CHECK(steps == 60);
}

CADENCE_EXCHANGE_RANK_TEST("elastic averager: bad input is refused before any communication, naming the rank",
                           exchange_elastic_bad_input) {
  const int me = c.rank();
  const std::string rank = "on rank " + std::to_string(me);
  expect_throw<parse_error>(me, [&] { elastic_averager<C> a(c, "bsp"); }, {"elastic:<R>"});
  expect_throw<parse_error>(me, [&] { elastic_averager<C> a(c, "elastic:x"); }, {"lookahead R"});
  expect_throw<parse_error>(me, [&] { elastic_averager<C> a(c, "elastic:4:median"); }, {"needs a value"});
  expect_throw<parse_error>(me, [&] { elastic_averager<C> a(c, "elastic:4:last:nope"); }, {"nope"});
  expect_throw<invalid_parameter_error>(me, [&] { elastic_averager<C> a(c, "elastic:0"); },
                                        {"elastic:0", "lookahead R"});
  expect_throw<invalid_parameter_error>(me, [&] { elastic_averager<C> a(c, "elastic:4:mean:0"); }, {"mean"});
  elastic_averager_options o;
  o.history = 1;
  expect_throw<invalid_parameter_error>(me, [&] { elastic_averager<C> a(c, "elastic:4", o); }, {"history", rank});
  o.history = 2000;
  expect_throw<invalid_parameter_error>(me, [&] { elastic_averager<C> a(c, "elastic:4", o); }, {"history"});
  o = {};
  o.timeout = 0ms;
  expect_throw<invalid_parameter_error>(me, [&] { elastic_averager<C> a(c, "elastic:4", o); }, {"timeout"});

  elastic_averager<C> avg(c, "elastic:4");
  CHECK(avg.config() == "elastic:4:last:fast");
  std::vector<double> x(3, 1.0);
  expect_throw<invalid_parameter_error>(me, [&] { avg.sync(x); }, {"before the plan calls for it", rank});
  expect_throw<invalid_parameter_error>(me, [&] { avg.step_done(-5); }, {"-5 us", rank});
  expect_throw<invalid_parameter_error>(me, [&] { avg.step_done(0); }, {"0 us"});
  expect_throw<invalid_parameter_error>(me, [&] { avg.step_done(std::int64_t{1} << 41); }, {"not in [1"});
  CHECK(avg.step_done(std::chrono::microseconds(10)));  // warm-up: BSP
  expect_throw<invalid_parameter_error>(me, [&] { avg.step_done(10); }, {"call sync() first"});
  expect_throw<invalid_parameter_error>(me, [&] { avg.sync(tensor_ref(static_cast<float*>(nullptr), 4)); },
                                        {"null pointer", rank});
  CHECK(avg.barriers() == 0);  // nothing happened

  CHECK_FALSE(c.failed());
}

CADENCE_EXCHANGE_RANK_TEST("periodic averager: bad input is refused before any communication",
                           exchange_periodic_bad_input) {
  const int me = c.rank();
  std::vector<double> x(3, 1.0);
  expect_throw<invalid_parameter_error>(me, [&] { periodic_averager<C> p(c, 0); }, {"period"});
  periodic_averager<C> p(c, 2);
  expect_throw<invalid_parameter_error>(me, [&] { p.sync(x); }, {"before it is due"});
  CHECK_FALSE(c.failed());
}

CADENCE_EXCHANGE_RANK_TEST("bucketed all-reducer: bad input is refused before any communication",
                           exchange_bucketed_bad_input) {
  const int me = c.rank();
  bucketed_allreducer_options b;
  b.bucket_bytes = 0;
  expect_throw<invalid_parameter_error>(me, [&] { bucketed_allreducer<C> r(c, b); }, {"bucket_bytes"});
  bucketed_allreducer<C> r(c);
  expect_throw<invalid_parameter_error>(me, [&] { r.add(static_cast<double*>(nullptr), 3); }, {"null pointer"});
  CHECK_FALSE(c.failed());
}

CADENCE_EXCHANGE_RANK_TEST("ranks with different configs fail the plan check with a clear error "
                           "instead of hanging", exchange_divergent_plans) {
  elastic_averager_options o;
  o.timeout = 30s;
  elastic_averager<C> avg(c, c.rank() == 0 ? "elastic:4" : "elastic:5", o);
  std::vector<double> x(4, 1.0);
  CHECK(avg.step_done(100));
  expect_throw<transport_error>(c.rank(), [&] { avg.sync(x); },
                                {"different plans", "elastic:" + std::string(c.rank() == 0 ? "4" : "5")});
}

CADENCE_EXCHANGE_RANK_TEST("a rank that stops syncing makes the others throw transport_error naming "
                           "it within the deadline", exchange_stalled_rank) {
  const int stalled = c.size() - 1;
  elastic_averager_options o;
  o.timeout = 1s;
  elastic_averager<C> avg(c, "elastic:4", o);
  std::vector<float> x(64, 1.0f);
  std::uint64_t step = 0;
  // A few healthy barriers first, past the warm-up.
  while (avg.barriers() < 5)
    if (avg.step_done(step_us(c.rank(), ++step))) avg.sync(x);
  // The last rank stops syncing; the others step on to their next barrier and give up there.
  cadence_conformance::expect_deadline_without_last(
      c,
      [&] {
        while (!avg.step_done(step_us(c.rank(), ++step))) {
        }
        avg.sync(x);
      },
      {"rank " + std::to_string(stalled)});
}

#define CADENCE_BUCKETED_ALLREDUCER_SUITE(H)                         \
  TEST_CASE_TEMPLATE_INVOKE(exchange_bucketed_equals_unbucketed, H);   \
  TEST_CASE_TEMPLATE_INVOKE(exchange_bucketed_mark_ready, H);          \
  TEST_CASE_TEMPLATE_INVOKE(exchange_bucketed_parts, H);               \
  TEST_CASE_TEMPLATE_INVOKE(exchange_bucket_views, H);                 \
  TEST_CASE_TEMPLATE_INVOKE(exchange_bucketed_bad_input, H)

#define CADENCE_PERIODIC_AVERAGER_SUITE(H)                  \
  TEST_CASE_TEMPLATE_INVOKE(exchange_periodic, H);          \
  TEST_CASE_TEMPLATE_INVOKE(exchange_periodic_bad_input, H)

#define CADENCE_ELASTIC_AVERAGER_SUITE(H)                               \
  TEST_CASE_TEMPLATE_INVOKE(exchange_elastic_200_barriers, H);          \
  TEST_CASE_TEMPLATE_INVOKE(exchange_elastic_bad_input, H);             \
  TEST_CASE_TEMPLATE_INVOKE(exchange_divergent_plans, H);               \
  TEST_CASE_TEMPLATE_INVOKE(exchange_stalled_rank, H)

#define CADENCE_COLLECTIVE_SUITE(H)      \
  CADENCE_BUCKETED_ALLREDUCER_SUITE(H); \
  CADENCE_PERIODIC_AVERAGER_SUITE(H);   \
  CADENCE_ELASTIC_AVERAGER_SUITE(H)
