// cadence/transport/algorithms/doubling.hpp: the small all-reduce (recursive doubling) driven
// directly over the scripted fake wire (fake_wire.hpp) for 1 to 9 ranks, in every flavour of
// wire, under hundreds of seeded delivery schedules: the result against a brute-force oracle
// in the algorithm's own order, bit for bit; arguments that differ; ranks that never start or
// stop; messages held back, longer than posted, or from a partner that left.
#include "fake_wire.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace cadence_fake_wire {
namespace doubling_tests {

// A case: reductions in a row on a seeded schedule (fake_wire.hpp).
using doubling_case = reduction_case;

// Runs c.calls all-reduces in a row on every rank and checks that each completes everywhere
// with the oracle's bits, the wire's requirements kept and no buffer written early.
template <bool Over>
void check_doubling(const doubling_case& c) {
  INFO(c.describe_reduction() << c.describe_schedule() << std::string(Over ? ", posts over delivered sends" : ""));
  seeded_run<Over> run(c);
  auto& [rng, sim] = run;
  std::vector<rank_data> data, inputs;
  data.reserve(static_cast<std::size_t>(c.calls));
  for (int k = 0; k < c.calls; ++k) data.emplace_back(c.n, c.count, c.type, rng);
  inputs = data;
  for (int k = 0; k < c.calls; ++k)
    for (int r = 0; r < c.n; ++r)
      sim.add(r, {algorithm::doubling, data[static_cast<std::size_t>(k)].buf(r), c.count, c.type, c.op, c.average});
  const outcome out = run_to_completion(sim, c.calls, rng());
  INFO(out.describe());
  for (int k = 0; k < c.calls; ++k)
    check_bits(data[static_cast<std::size_t>(k)], doubling_expected(inputs[static_cast<std::size_t>(k)], c.op, c.average),
               k);
}

TEST_CASE(
    "the doubling pairs ranks as MPICH does: p the largest power of two, the extra even ranks hand over to the odd "
    "rank above, partners mutual") {
  for (int n = 1; n <= 64; ++n) {
    const cd::doubling g(n);
    INFO("n " << n);
    CHECK(g.p <= n);
    CHECK(n < 2 * g.p);
    CHECK((g.p & (g.p - 1)) == 0);
    CHECK(g.extra == n - g.p);
    CHECK((1 << g.rounds()) == g.p);
    std::vector<int> seen(static_cast<std::size_t>(g.p), 0);
    for (int r = 0; r < n; ++r) {
      const int in = g.inner(r);
      if (r < 2 * g.extra && r % 2 == 0) {
        CHECK(in == -1);  // hands over to r + 1
        continue;
      }
      REQUIRE(in >= 0);
      REQUIRE(in < g.p);
      CHECK(g.outer(in) == r);
      ++seen[static_cast<std::size_t>(in)];
    }
    for (int x : seen) CHECK(x == 1);  // every inner index taken by exactly one rank
    for (int round = 0; round < g.rounds(); ++round)
      for (int in = 0; in < g.p; ++in) CHECK(((in ^ (1 << round)) ^ (1 << round)) == in);
  }
}

TEST_CASE(
    "recursive doubling gives every rank the bits of a brute-force reduction in its own order, for 1 to 9 ranks, every "
    "dtype, op and averaging") {
  std::uint64_t seed = 100;
  for_each_reduction(1, 9, [&](doubling_case c) {
    // Fewer elements than ranks, as many, more, and the most the wire takes inline.
    const auto n = static_cast<std::size_t>(c.n);
    const std::size_t most = std::max<std::size_t>(64, 8 * n) / cadence::transport::dtype_size(c.type);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, n, n + 3, most}) {
      if (count > most) continue;
      c.count = count;
      c.take_seed(seed);
      over_or_not(seed % 2 == 0, [&](auto over) { check_doubling<decltype(over)::value>(c); });
    }
  });
}

TEST_CASE(
    "over hundreds of seeded delivery schedules, every rank ends every all-reduce of a sequence with the oracle's "
    "bits") {
  for (std::uint64_t seed = 0; seed < 300; ++seed) {
    std::mt19937_64 rng(seed * 7919 + 13);
    doubling_case c;
    c.pick_reduction(rng);
    const std::size_t most =
        std::max<std::size_t>(64, 8 * static_cast<std::size_t>(c.n)) / cadence::transport::dtype_size(c.type);
    c.count = std::uniform_int_distribution<std::size_t>(0, most)(rng);
    c.pick_schedule(rng, seed, 3, false);
    over_or_not(seed % 2 != 0, [&](auto over) { check_doubling<decltype(over)::value>(c); });
  }
}

TEST_CASE(
    "arguments that differ on one rank fail every rank with a message naming both sides, and no buffer is written") {
  int cases = 0;
  for (std::uint64_t seed = 0; seed < 120; ++seed) {
    std::mt19937_64 rng(seed);
    const int n = std::uniform_int_distribution<int>(2, 9)(rng);
    const int odd = std::uniform_int_distribution<int>(0, n - 1)(rng);
    const int wire = static_cast<int>(seed % 3);
    call base{algorithm::doubling, nullptr, 3, dtype::f32, reduce_op::sum, false};
    call other = base;
    switch (seed % 5) {
      case 0: other.count = 5; break;
      case 1: other.count = 2; break;
      case 2: other.type = dtype::f64; break;
      case 3: other.op = reduce_op::max; break;
      case 4: other.average = true; break;
    }
    INFO("n " << n << ", rank " << odd << " differs (case " << seed % 5 << "), " << flavour_name(wire) << ", seed "
              << seed);
    simulation<false> sim(n, flavour(wire));
    sim.watch_buffers = true;
    rank_data data(n, 8, dtype::f64, rng);  // room for any of the calls
    check_arguments_differ(sim, data, base, odd, other, rng(), [](int, const std::string& e) {
      CHECK(contains(e, "cadence::transport[fake]: allreduce"));
    });
    ++cases;
  }
  CHECK(cases == 120);
}

TEST_CASE(
    "a rank on another collective index fails its peers where they compare its message, and looks absent where notices "
    "are kept by index") {
  for_each_world(2, 6, 10, [](int n, int wire, std::mt19937_64& rng) {
    simulation<false> sim(n, flavour(wire));
    rank_data data(n, 4, dtype::i32, rng);
    const int odd = n - 1;
    for (int r = 0; r < n; ++r) {
      call c{algorithm::doubling, data.buf(r), 4, dtype::i32, reduce_op::sum, false};
      if (r == odd) c.index = 2;  // it skipped one
      sim.add(r, c);
    }
    const outcome out = sim.run(rng());
    INFO(out.describe());
    CHECK(out.misuse.empty());
    const bool by_index = flavour(wire).notices_by_index;
    if (n == 2 || !by_index) {
      // The message itself is compared: another collective altogether, named by its index.
      for (int r = 0; r < n; ++r) {
        const auto& x = out.ranks[static_cast<std::size_t>(r)];
        if (!x.failed) continue;
        CHECK(contains(x.error, "arguments differ across ranks in collective #"));
        CHECK(contains(x.error, " as collective #"));
      }
      CHECK(out.ranks[static_cast<std::size_t>(odd)].failed);
      CHECK(out.ranks[0].failed);
    } else {
      // Its notice of #1 never comes: to its peers it never started #1, and it waits for
      // theirs of #2.
      CHECK(out.stuck);
      for (int r = 0; r < n; ++r) {
        const auto& x = out.ranks[static_cast<std::size_t>(r)];
        CHECK_FALSE(x.failed);
        REQUIRE(x.unfinished);
        CHECK(x.awaited.note == "they never started this collective");
        if (r != odd)
          CHECK(x.awaited.peers == std::vector<int>{odd});
        else
          CHECK(x.awaited.peers.size() == static_cast<std::size_t>(n - 1));
      }
    }
  });
}

TEST_CASE(
    "a rank that never starts is named by every rank that waits for it, with the point a blocked wait would block on") {
  const auto check = [](simulation<true>& sim, const outcome& out, int absent) {
    for (int r = 0; r < sim.size(); ++r) {
      const auto& x = out.ranks[static_cast<std::size_t>(r)];
      CHECK_FALSE(x.failed);
      CHECK(x.completed == 0);
      if (r == absent) continue;
      REQUIRE(x.unfinished);
      CHECK(x.awaited.peers == std::vector<int>{absent});
      if (sim.size() > 2) {
        CHECK(x.awaited.note == "they never started this collective");
        CHECK(x.awaited.native == sim.wire(r).native(cd::wire_point::notice_in, absent));
        CHECK(x.awaited.native_recv);
      }
    }
  };
  // Five f64 elements a rank.
  for_each_absent_run(algorithm::doubling, 3, dtype::f64, [](int) { return std::size_t{5}; }, true, check);
}

TEST_CASE(
    "a rank that stops mid-collective leaves every rank still waiting naming a peer, and those that finished hold the "
    "right sum") {
  for (std::uint64_t seed = 0; seed < 150; ++seed) {
    std::mt19937_64 rng(seed + 5000);
    const stop_case s(rng, seed, 9, 6);
    INFO(s.describe());
    simulation<false> sim(s.n, flavour(s.wire));
    rank_data data(s.n, 6, dtype::i64, rng);
    const rank_data in = data;
    const outcome out = s.run(sim, algorithm::doubling, data, rng());
    INFO(out.describe());
    const auto want = doubling_expected(in);
    bool someone_names_it = false;
    int waiting = 0;
    for (int r = 0; r < s.n; ++r) {
      const auto& x = out.ranks[static_cast<std::size_t>(r)];
      if (x.completed == 1) {
        CHECK(std::memcmp(data.bytes_of(r), want.data(), want.size()) == 0);
        continue;
      }
      if (r == s.stopped) continue;
      ++waiting;
      REQUIRE(x.unfinished);
      for (int p : x.awaited.peers) someone_names_it = someone_names_it || p == s.stopped;
    }
    if (waiting > 0) CHECK(someone_names_it);
  }
}

TEST_CASE(
    "while one rank's notices are held back no rank writes its buffer; once they move, the all-reduce completes with "
    "the oracle's bits") {
  for_each_world(3, 9, 31, [](int n, int wire, std::mt19937_64& rng) {
    const int late = std::uniform_int_distribution<int>(0, n - 1)(rng);
    simulation<false> sim(n, flavour(wire));
    sim.watch_buffers = true;
    rank_data data(n, 7, dtype::f32, rng);
    const rank_data in = data;
    const outcome out = run_held(
        sim, algorithm::doubling, data, [&](const message& m, step_kind) { return m.from == late && m.notice; }, rng());
    INFO(out.describe());
    for (int r = 0; r < n; ++r) {
      CHECK(out.ranks[static_cast<std::size_t>(r)].completed == 0);
      if (r != late) CHECK(out.ranks[static_cast<std::size_t>(r)].awaited.peers == std::vector<int>{late});
    }
    release_and_check(sim, data, doubling_expected(in), rng());
  });
}

TEST_CASE(
    "a rank completes only once every peer's notice is in, partner or not, so none is left over for the next "
    "collective") {
  // Over four ranks rank 3 is never rank 0's partner (rank 0 exchanges with 1, then 2).
  for (int wire = 0; wire < 3; ++wire) {
    INFO(flavour_name(wire));
    std::mt19937_64 rng(static_cast<std::uint64_t>(wire) + 70);
    simulation<false> sim(4, flavour(wire));
    sim.watch_buffers = true;
    rank_data data(4, 5, dtype::f64, rng);
    const rank_data in = data;
    const outcome out = run_held(
        sim, algorithm::doubling, data,
        [](const message& m, step_kind) { return m.notice && m.from == 3 && m.to == 0; }, rng());
    INFO(out.describe());
    REQUIRE(out.ranks[0].unfinished);
    CHECK(out.ranks[0].awaited.peers == std::vector<int>{3});
    CHECK(out.ranks[0].awaited.note == "they never started this collective");
    CHECK(out.ranks[1].completed == 1);
    CHECK(out.ranks[2].completed == 1);
    // Rank 3's notice has not left either: it waits for rank 0 to take it.
    REQUIRE(out.ranks[3].unfinished);
    CHECK(out.ranks[3].awaited.peers == std::vector<int>{0});
    CHECK(out.ranks[3].awaited.note == "it did not take this collective's notice");
    release_and_check(sim, data, doubling_expected(in), rng());
  }
}

TEST_CASE("a message longer than the receive a wire posted for it fails the rank that takes it, naming the sender") {
  wire_options strict = mpi_like();
  strict.posts_inline = false;  // the receive takes exactly the capacity asked
  SUBCASE("a partner called with more elements") {
    std::mt19937_64 rng(3);
    simulation<false> sim(2, strict);
    rank_data data(2, 8, dtype::f32, rng);
    sim.add(0, {algorithm::doubling, data.buf(0), 4, dtype::f32, reduce_op::sum, false});
    sim.add(1, {algorithm::doubling, data.buf(1), 8, dtype::f32, reduce_op::sum, false});
    const outcome out = sim.run(9);
    INFO(out.describe());
    check_fails_with(
        out, 0,
        "cadence::transport[fake]: allreduce #1 on rank 0 of 2: rank 1 sent a longer message in collective #1 than "
        "allreduce(count 4, f32, sum) on rank 0 takes: the ranks' arguments differ");
    // Rank 1 took the shorter message whole: its summary names both sides.
    REQUIRE(out.ranks[1].failed);
    CHECK(contains(out.ranks[1].error, "rank 0 called allreduce(count 4, f32, sum)"));
    CHECK(contains(out.ranks[1].error, "rank 1 called allreduce(count 8, f32, sum)"));
  }
  SUBCASE("the same arguments, and bytes added on the way") {
    for (int n = 2; n <= 5; ++n) {
      INFO("n " << n);
      std::mt19937_64 rng(static_cast<std::uint64_t>(n));
      simulation<false> sim(n, strict);
      rank_data data(n, 4, dtype::i32, rng);
      add_allreduce(sim, algorithm::doubling, data);
      sim.net().tamper = [](message& m) {
        if (m.from == 1 && m.on == lane::data && !m.notice) m.payload.resize(m.payload.size() + 8);
      };
      const outcome out = sim.run(11);
      INFO(out.describe());
      CHECK(out.misuse.empty());
      int named = 0;
      for (int r = 0; r < n; ++r)
        if (out.ranks[static_cast<std::size_t>(r)].failed) {
          CHECK(contains(out.ranks[static_cast<std::size_t>(r)].error,
                         "rank 1 sent a longer message in collective #1 than allreduce(count 4, i32, sum)"));
          ++named;
        }
      CHECK(named >= 1);
    }
  }
}

TEST_CASE("a data message of another size than agreed fails the rank that takes it, naming the sender and both sizes") {
  std::mt19937_64 rng(17);
  simulation<false> sim(4, mpi_like());
  rank_data data(4, 3, dtype::f32, rng);
  add_allreduce(sim, algorithm::doubling, data);
  sim.net().tamper = [](message& m) {
    if (m.from == 0 && m.on == lane::data && !m.notice) m.payload.resize(m.payload.size() + 4);
  };
  const outcome out = sim.run(5);
  INFO(out.describe());
  // Rank 0's only partner over four ranks is rank 1.
  check_fails_with(out, 1,
                   "cadence::transport[fake]: allreduce #1 on rank 1 of 4: rank 0 sent 16 bytes in collective #1 where "
                   "allreduce(count 3, f32, sum) takes 12");
}

// A regression test: a partner that left was once also named among the ranks that "never
// started this collective" (gloo_like, n 3, seed 4).
TEST_CASE("a partner's goodbye where its notice was due says that it left, and names the rank that never started") {
  auto goodbye = [](message& m) {
    if (m.from == 2 && m.notice) {
      cd::collective_signature s;
      std::memcpy(&s, m.payload.data(), sizeof s);
      s.kind = static_cast<std::int64_t>(cd::collective_kind::shutdown);
      std::memcpy(m.payload.data(), &s, sizeof s);
    }
  };
  SUBCASE("every other rank started") {
    std::mt19937_64 rng(21);
    simulation<false> sim(3, gloo_like());
    rank_data data(3, 2, dtype::f64, rng);
    add_allreduce(sim, algorithm::doubling, data, reduce_op::max);
    sim.net().tamper = goodbye;
    const outcome out = sim.run(4);
    INFO(out.describe());
    for (int r : {0, 1}) {
      REQUIRE(out.ranks[static_cast<std::size_t>(r)].failed);
      CHECK(out.ranks[static_cast<std::size_t>(r)].error ==
            "cadence::transport[fake]: allreduce #1 on rank " + std::to_string(r) +
                " of 3: rank 2 destroyed its communicator (it called shutdown) while this rank waited for it");
    }
  }
  SUBCASE("one rank never started") {
    std::mt19937_64 rng(22);
    simulation<false> sim(3, gloo_like());
    rank_data data(3, 2, dtype::f64, rng);
    add_allreduce(sim, algorithm::doubling, data, reduce_op::max);
    sim.never_starts(1);
    sim.net().tamper = goodbye;
    const outcome out = sim.run(4);
    INFO(out.describe());
    REQUIRE(out.ranks[0].failed);
    CHECK(out.ranks[0].error ==
          "cadence::transport[fake]: allreduce #1 on rank 0 of 3: rank 2 destroyed its communicator (it called "
          "shutdown) while this rank waited for it; rank 1 never started this collective");
  }
}

}  // namespace doubling_tests
}  // namespace cadence_fake_wire
