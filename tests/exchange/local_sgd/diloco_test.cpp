// cadence/exchange/local_sgd/diloco.hpp over in-process ranks: the outer step against its
// formula on integer-valued updates (exact), streaming fragments and their overlap (a rank
// finishes an inner step while its fragment's exchange waits for another rank), the coded ring
// (the same floats on every rank, the bytes the codec says, error feedback that keeps the sum),
// the timed schedules (a quorum's late rank and its staleness, DSSP's lag, ElasticBSP's
// bound), bad input, a stalled rank, and the membership seam (survivors rebind, a joiner takes
// the global weights and outer state). Step durations are passed, never slept.
#include <cadence/exchange/local_sgd/diloco.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/transport/inproc.hpp>

#include "support/events.hpp"
#include "transport/conformance.hpp"
#include "transport/inproc_ranks.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace cadence::exchange;
using namespace std::chrono_literals;

namespace diloco_test {

// The same 64-bit value from every rank (to compare what the ranks hold).
std::vector<std::uint64_t> gather_all(inproc_communicator& c, std::uint64_t v) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(c.size()));
  allgather(c, &v, all.data(), sizeof v, 30s);
  return all;
}
std::uint64_t digest(span<const float> x) {
  std::uint64_t h = 1469598103934665603ull;
  for (float v : x) {
    std::uint32_t b;
    std::memcpy(&b, &v, 4);
    h = (h ^ b) * 1099511628211ull;
  }
  return h;
}
bool same_on_every_rank(inproc_communicator& c, std::uint64_t v) {
  for (auto x : gather_all(c, v))
    if (x != v) return false;
  return true;
}

diloco_options with(std::string schedule) {
  diloco_options o;
  o.schedule = std::move(schedule);
  o.timeout = 20s;
  return o;
}

}  // namespace diloco_test
using namespace diloco_test;

TEST_CASE("fixed:H with outer sgd lr 1 is periodic model averaging, exactly" * doctest::timeout(60)) {
  inproc_world world(3);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    std::vector<float> w(5, 100.0f * static_cast<float>(c.rank()));  // rank 0's are broadcast: all 0
    std::vector<float> ref(5, 0.0f);
    diloco<inproc_communicator> dl(c, {w}, outer_sgd{1.0f}, with("fixed:4"));
    periodic_averager<inproc_communicator> per(c, 4);
    CHECK(w == std::vector<float>(5, 0.0f));
    for (int step = 1; step <= 20; ++step) {
      for (std::size_t i = 0; i < w.size(); ++i) {  // an "inner step": + (rank + 1) (i + 1)
        w[i] += static_cast<float>((c.rank() + 1) * static_cast<int>(i + 1));
        ref[i] += static_cast<float>((c.rank() + 1) * static_cast<int>(i + 1));
      }
      const bool due = dl.step_done(1000);
      CHECK(due == per.step_done());
      if (due) {
        dl.sync(w);
        per.sync(ref);
        CHECK(w == ref);
        CHECK(std::vector<float>(dl.global_weights().begin(), dl.global_weights().end()) == ref);
      }
    }
    CHECK(dl.outer_steps() == 5);
    CHECK(w[0] == 40.0f);  // 20 steps of the mean update 2
  });
}

TEST_CASE("the outer step is DiLoCo's Nesterov on the mean pseudo-gradient, the same on every rank" *
          doctest::timeout(60)) {
  inproc_world world(4);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    std::vector<float> a(3, 1.0f), b(2, -1.0f);
    diloco<inproc_communicator> dl(c, {a, b}, outer_nesterov{0.7f, 0.9f}, with("fixed:2"));
    // The oracle: one element of a, the mean pseudo-gradient g = -(2 steps x mean(r + 1) x 0.01).
    float x = 1.0f, m = 0.0f;
    for (int step = 1; step <= 12; ++step) {
      for (auto& v : a) v += 0.01f * static_cast<float>(c.rank() + 1);
      for (auto& v : b) v -= 0.01f;
      if (dl.step_done(500)) {
        dl.sync({a, b});
        const float g = -(0.01f * 1 + 0.01f * 2 + 0.01f * 3 + 0.01f * 4) * 2.0f / 4.0f;
        m = 0.9f * m + g;
        x -= 0.7f * (g + 0.9f * m);
        CHECK(a[0] == doctest::Approx(x).epsilon(1e-4));
      }
    }
    CHECK(same_on_every_rank(c, digest(dl.global_weights())));
    CHECK(same_on_every_rank(c, digest(dl.outer_state())));
    CHECK(dl.outer_state().size() == 5);  // the momentum of 5 elements
    CHECK(dl.config() == "fixed:2");
  });
}

TEST_CASE("streaming: fragment f syncs (f + 1) H / F steps in, and its outer step lands `delay` steps later, "
          "mixed with alpha" * doctest::timeout(60)) {
  for (const float alpha : {0.0f, 0.5f}) {
    inproc_world world(3);
    cadence_test::run_inproc_ranks(world, [alpha](inproc_communicator& c) {
      diloco_options o = with("fixed:4");
      o.fragments = 2;
      o.delay = 1;
      o.alpha = alpha;
      std::vector<float> w(4, 0.0f);  // fragment 0: elements 0-1, fragment 1: elements 2-3
      diloco<inproc_communicator> dl(c, {w}, outer_sgd{1.0f}, o);
      std::vector<int> due_at;
      const float mine = static_cast<float>(c.rank() + 1);
      for (int step = 1; step <= 9; ++step) {
        for (auto& v : w) v += mine;
        if (!dl.step_done(100)) continue;
        due_at.push_back(step);
        dl.sync(w);
        if (step == 2) CHECK(dl.global_weights()[0] == 0.0f);  // sent, not applied yet
        if (step == 3) {
          // Fragment 0 sent at step 2 (mean local 2 x 2 = 4), applied at 3 over a local of 3 x mine.
          CHECK(dl.global_weights()[0] == 4.0f);
          CHECK(w[0] == alpha * 3 * mine + (1 - alpha) * 4.0f);
          CHECK(w[2] == 3 * mine);  // fragment 1 untouched
        }
      }
      CHECK(due_at == std::vector<int>{2, 3, 4, 5, 6, 7, 8, 9});
      CHECK(dl.fragment_steps() == 4);  // f0 at 3 and 7, f1 at 5 and 9
    });
  }
}

TEST_CASE("a fragment's exchange overlaps the next inner step: a rank finishes it while the exchange "
          "waits for another rank" * doctest::timeout(60)) {
  inproc_world world(3);
  const cadence_test::events ev;
  cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
    diloco_options o = with("fixed:2");
    o.delay = 1;
    std::vector<float> w(64, 1.0f);
    diloco<inproc_communicator> dl(c, {w}, outer_sgd{1.0f}, o);
    (void)dl.step_done(100);
    CHECK(dl.step_done(100));  // step 2: the exchange starts
    if (c.rank() == 2) CHECK(ev.wait("rank0.step3"));  // rank 2 joins only after rank 0's next step
    dl.sync(w);
    for (auto& v : w) v += 1.0f;  // step 3's inner work, done while rank 2 has not sent
    if (c.rank() == 0) ev.post("rank0.step3");
    CHECK(dl.step_done(100));
    dl.sync(w);  // step 3: waits for the exchange, applies it
    CHECK(dl.fragment_steps() == 1);
  });
}

TEST_CASE("the coded ring gives every rank the same floats near the exact sum, sending what the codec "
          "says" * doctest::timeout(60)) {
  for (const outer_codec codec : {outer_codec::bf16, outer_codec::fp16, outer_codec::int8, outer_codec::int4}) {
    for (const int n : {2, 3, 4}) {
      inproc_world world(n);
      cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
        const std::size_t count = 1000;
        std::vector<float> in(count), out(count), exact(count, 0.0f);
        for (std::size_t i = 0; i < count; ++i) {
          in[i] = std::sin(static_cast<float>(i * 7 + static_cast<std::size_t>(c.rank()) * 13));
          for (int r = 0; r < n; ++r) exact[i] += std::sin(static_cast<float>(i * 7 + static_cast<std::size_t>(r) * 13));
        }
        cadence::exchange::detail::coded_allreduce<inproc_communicator> x;
        x.start(c, codec, in.data(), out.data(), count, 100, 20s);
        x.wait(20s);
        CHECK(same_on_every_rank(c, digest(span<const float>(out.data(), count))));
        const float tol = codec == outer_codec::int4 ? 0.5f * static_cast<float>(n) : 0.02f * static_cast<float>(n);
        for (std::size_t i = 0; i < count; ++i) CHECK_MESSAGE(std::fabs(out[i] - exact[i]) <= tol, i);
        // 2 (n - 1) hops, each one encoded segment
        std::uint64_t expect = 0;
        const int r = c.rank();
        for (int s = 0; s < 2 * (n - 1); ++s) {
          const int seg = s < n - 1 ? (r - s + n) % n : (r + 1 - (s - (n - 1)) + 2 * n) % n;
          const std::size_t lo = count * static_cast<std::size_t>(seg) / static_cast<std::size_t>(n);
          const std::size_t hi = count * static_cast<std::size_t>(seg + 1) / static_cast<std::size_t>(n);
          expect += encoded_bytes(codec, hi - lo);
        }
        CHECK(x.bytes_sent() == expect);
      });
    }
  }
}

TEST_CASE("error feedback keeps the sum of int4 outer steps within a few quantisation steps of the exact "
          "sum; without it the error grows" * doctest::timeout(60)) {
  double err[2] = {0, 0};
  for (const bool feedback : {true, false}) {
    inproc_world world(3);
    std::mutex m;
    cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
      diloco_options o = with("fixed:1");
      o.codec = outer_codec::int4;
      o.error_feedback = feedback;
      std::vector<float> w(300, 0.0f);
      diloco<inproc_communicator> dl(c, {w}, outer_sgd{1.0f}, o);
      for (int step = 1; step <= 60; ++step) {
        for (std::size_t i = 0; i < w.size(); ++i) w[i] += 0.001f * static_cast<float>((c.rank() + 1) * (1 + i % 11));
        CHECK(dl.step_done(100));
        dl.sync(w);
      }
      double worst = 0;
      for (std::size_t i = 0; i < w.size(); ++i)  // exact: 60 x mean over ranks = 60 x 0.002 (1 + i % 11)
        worst = std::max(worst, std::fabs(static_cast<double>(w[i]) - 60 * 0.002 * static_cast<double>(1 + i % 11)));
      CHECK(same_on_every_rank(c, digest(dl.global_weights())));
      std::lock_guard<std::mutex> lock(m);
      err[feedback ? 0 : 1] = std::max(err[feedback ? 0 : 1], worst);
    });
  }
  // one int4 step of the largest update (0.066 over 7 levels) is about 0.0094
  CHECK(err[0] < 0.02);
  CHECK(err[1] > 4 * err[0]);
}

TEST_CASE("quorum: a slow rank joins late syncs without a pseudo-gradient and its carried work counts with "
          "weight steps / (1 + staleness)" * doctest::timeout(60)) {
  inproc_world world(3);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    // Rank 2 is 3x slower; K = 2 of 3, H = 6, no grace, max lag 2.
    std::vector<float> w(1, 0.0f);
    diloco<inproc_communicator> q(c, {w}, outer_sgd{1.0f}, with("quorum:2:6:0:2"));
    const std::int64_t us = c.rank() == 2 ? 3000 : 1000;
    std::int64_t most = 0;
    bool was_late = false;
    while (q.outer_steps() < 12) {
      w[0] += 1.0f;  // every step adds 1: a pseudo-gradient of -steps
      if (!q.step_done(us)) continue;
      const bool late = q.plan().contributes[static_cast<std::size_t>(c.rank())] == 0;
      was_late = was_late || late;
      const float before = w[0];
      const std::int64_t steps = q.progress();
      q.sync(w);
      if (late) CHECK(w[0] == before);  // kept its local work
      most = std::max(most, steps);
      CHECK(q.progress() <= 6);
      for (std::size_t p = 0; p < 3; ++p) CHECK(q.plan().steps[p] >= 1);
    }
    CHECK(most <= 6);
    CHECK(was_late == (c.rank() == 2));
    CHECK(q.stale_contributions() > 0);
    CHECK(q.max_staleness() <= 2);
    CHECK(same_on_every_rank(c, digest(q.global_weights())));
  });
}

TEST_CASE("lag:H:s: every rank runs H to H + s inner steps, the fast ones more" * doctest::timeout(60)) {
  inproc_world world(3);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    std::vector<float> w(2, 0.0f);
    diloco<inproc_communicator> dl(c, {w}, outer_sgd{1.0f}, with("lag:4:6"));
    const std::int64_t us = 1000 * (c.rank() + 1);
    std::int64_t since = 0, most = 0, least = 1 << 20;
    while (dl.outer_steps() < 6) {
      ++since;
      if (!dl.step_done(us)) continue;
      if (dl.outer_steps() > 0) {  // after the warm-up sync
        most = std::max(most, since);
        least = std::min(least, since);
      }
      dl.sync(w);
      since = 0;
    }
    CHECK(least >= 4);
    CHECK(most <= 10);
    if (c.rank() == 0) CHECK(most >= 9);   // 1 ms steps: 12 ms is the slowest's 4 x 3 ms
    if (c.rank() == 2) CHECK(most == 4);
  });
}

TEST_CASE("elastic:R: no rank runs more than R inner steps between syncs" * doctest::timeout(60)) {
  inproc_world world(4);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    std::vector<float> w(8, 0.0f);
    diloco<inproc_communicator> dl(c, {w}, any_outer_optimizer{}, with("elastic:5:median:3"));
    std::int64_t since = 0;
    std::uint64_t step = 0;
    while (dl.outer_steps() < 25) {
      ++since;
      if (!dl.step_done(1000 * (1 + c.rank()) + static_cast<std::int64_t>(++step % 7) * 10)) continue;
      CHECK(since <= 5);
      dl.sync(w);
      since = 0;
    }
    CHECK(dl.schedule().config() == "elastic:5:median:3:fast");
    CHECK(same_on_every_rank(c, digest(dl.global_weights())));
  });
}

TEST_CASE("bad input is refused before communicating, naming the rank and what is wrong" * doctest::timeout(60)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    std::vector<float> w(4, 0.0f), other(3, 0.0f);
    std::vector<double> d(4, 0.0);
    auto expect = [&](auto fn, std::initializer_list<std::string> parts) {
      cadence_conformance::expect_throw<invalid_parameter_error>(c.rank(), fn, parts);
    };
    expect([&] { diloco<inproc_communicator> x(c, {d}); }, {"on rank", "tensor 0 is f64"});
    expect([&] {
      diloco_options o = with("quorum:1:4");
      o.fragments = 2;
      diloco<inproc_communicator> x(c, {w}, any_outer_optimizer{}, o);
    }, {"fragments and delay need the fixed schedule"});
    expect([&] {
      diloco_options o = with("fixed:4");
      o.delay = 4;
      diloco<inproc_communicator> x(c, {w}, any_outer_optimizer{}, o);
    }, {"delay 4 must be less than H = 4"});
    cadence_conformance::expect_throw<parse_error>(c.rank(), [&] { diloco<inproc_communicator> x(c, {w}, any_outer_optimizer{}, with("fixed:x")); },
                                                   {"fixed:x"});
    diloco<inproc_communicator> dl(c, {w}, outer_sgd{1.0f}, with("fixed:2"));
    expect([&] { dl.sync(w); }, {"sync() before it is due: 0 of 2"});
    CHECK_FALSE(dl.step_done(10));
    expect([&] { (void)dl.step_done(0); }, {"step duration 0 us"});
    CHECK(dl.step_done(10));
    expect([&] { (void)dl.step_done(10); }, {"call sync() first"});
    expect([&] { dl.sync(other); }, {"tensor 0 has 3 f32 elements, the constructor's 4 f32"});
    expect([&] { dl.sync(w, other); }, {"got 2 tensors, the constructor 1"});
    dl.sync(w);  // still in step: nothing was communicated above
    CHECK(dl.outer_steps() == 1);
  });
}

TEST_CASE("a stalled rank makes the others' sync throw transport_error naming it within the deadline" *
          doctest::timeout(60)) {
  inproc_world world(3);
  std::mutex m;
  std::vector<std::string> errors(3);
  cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
    diloco_options o = with("quorum:2:3");
    o.timeout = 1s;
    o.codec = outer_codec::int8;
    std::vector<float> w(50, 0.0f);
    diloco<inproc_communicator> dl(c, {w}, any_outer_optimizer{}, o);
    try {
      for (;;) {
        if (!dl.step_done(1000)) continue;
        if (c.rank() == 1 && dl.outer_steps() == 4) world.stall(1);
        dl.sync(w);
        if (dl.outer_steps() > 40) break;
      }
    } catch (const transport_error& e) {
      std::lock_guard<std::mutex> lock(m);
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  for (int r : {0, 2}) CHECK_MESSAGE(errors[static_cast<std::size_t>(r)].find("rank 1") != std::string::npos, errors[static_cast<std::size_t>(r)]);
}

TEST_CASE("membership seam: survivors rebind and keep their work, a joiner starts from the global weights and "
          "outer state" * doctest::timeout(60)) {
  // Phase 1: three ranks run 2 outer steps; phase 2 (rank 2 lost): ranks 0 and 1 rebind on a
  // world of their own and go on; phase 3: a new rank joins them.
  std::vector<std::vector<float>> local(3, std::vector<float>(6, 0.0f));
  std::vector<std::unique_ptr<diloco<inproc_communicator>>> dl(3);
  std::vector<std::unique_ptr<inproc_world>> worlds;
  worlds.push_back(std::make_unique<inproc_world>(3));
  std::vector<std::unique_ptr<inproc_communicator>> comms(3);
  for (int r = 0; r < 3; ++r) comms[static_cast<std::size_t>(r)] = std::make_unique<inproc_communicator>(worlds[0]->join(r));
  auto on_ranks = [&](std::vector<int> ranks, auto body) {
    std::vector<std::thread> t;
    std::mutex m;
    std::vector<std::string> errs;
    for (int r : ranks) t.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        errs.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
    for (auto& th : t) th.join();
    for (auto& e : errs) FAIL_CHECK(e);
  };
  diloco_options o = with("fixed:2");
  on_ranks({0, 1, 2}, [&](int r) {
    auto& w = local[static_cast<std::size_t>(r)];
    dl[static_cast<std::size_t>(r)] = std::make_unique<diloco<inproc_communicator>>(*comms[static_cast<std::size_t>(r)], span<const tensor_ref>(std::vector<tensor_ref>{w}), outer_nesterov{}, o);
    for (int s = 0; s < 4; ++s) {
      for (auto& v : w) v += static_cast<float>(r + 1);
      if (dl[static_cast<std::size_t>(r)]->step_done(100)) dl[static_cast<std::size_t>(r)]->sync(w);
    }
    for (auto& v : w) v += 1.0f;  // one step of work past the last sync
    (void)dl[static_cast<std::size_t>(r)]->step_done(100);
  });
  const std::vector<float> before_global(dl[0]->global_weights().begin(), dl[0]->global_weights().end());
  const std::vector<float> kept = local[0];
  // Rank 2 is lost; the survivors meet on a world of 2.
  worlds.push_back(std::make_unique<inproc_world>(2));
  for (int r = 0; r < 2; ++r) comms[static_cast<std::size_t>(r)] = std::make_unique<inproc_communicator>(worlds[1]->join(r));
  on_ranks({0, 1}, [&](int r) {
    dl[static_cast<std::size_t>(r)]->rebind(*comms[static_cast<std::size_t>(r)], std::vector<tensor_ref>{local[static_cast<std::size_t>(r)]});
  });
  CHECK(local[0] == kept);  // a survivor keeps its local work
  CHECK(std::vector<float>(dl[1]->global_weights().begin(), dl[1]->global_weights().end()) == before_global);
  // A joiner: ranks 0 and 1 rebind on a world of 3, rank 2 constructs with diloco_start::join.
  worlds.push_back(std::make_unique<inproc_world>(3));
  for (int r = 0; r < 3; ++r) comms[static_cast<std::size_t>(r)] = std::make_unique<inproc_communicator>(worlds[2]->join(r));
  std::vector<float> joiner(6, -42.0f);
  on_ranks({0, 1, 2}, [&](int r) {
    if (r == 2) {
      dl[2] = std::make_unique<diloco<inproc_communicator>>(*comms[2], span<const tensor_ref>(std::vector<tensor_ref>{joiner}), outer_nesterov{}, o,
                                                            diloco_start::join);
    } else {
      dl[static_cast<std::size_t>(r)]->rebind(*comms[static_cast<std::size_t>(r)], std::vector<tensor_ref>{local[static_cast<std::size_t>(r)]});
    }
  });
  CHECK(joiner == before_global);
  CHECK(std::vector<float>(dl[2]->outer_state().begin(), dl[2]->outer_state().end()) ==
        std::vector<float>(dl[0]->outer_state().begin(), dl[0]->outer_state().end()));
  CHECK(dl[2]->outer_steps() == dl[0]->outer_steps());
  // And the three go on together.
  local[2] = joiner;
  on_ranks({0, 1, 2}, [&](int r) {
    auto& w = local[static_cast<std::size_t>(r)];
    for (int s = 0; s < 2; ++s) {
      for (auto& v : w) v += 1.0f;
      if (dl[static_cast<std::size_t>(r)]->step_done(100)) dl[static_cast<std::size_t>(r)]->sync(w);
    }
  });
  CHECK(local[0] == local[2]);
}
