// cadence/transport/algorithms/ring.hpp: the ring's schedule (segments, pieces, which segment
// each step sends and receives) checked for many rank counts and sizes, and the ring all-reduce
// driven directly over the scripted fake wire (fake_wire.hpp) under hundreds of seeded delivery
// schedules: every rank ends with the same bits, those of the ring's own order of reduction
// (and within rounding of a plain sum), the caller's buffer untouched until every rank agreed,
// no receive posted over a send that may still read its memory.
#include "fake_wire.hpp"
#include "support/trials.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace cadence_fake_wire {
namespace ring_tests {

cd::ring_schedule schedule(int n, int r, std::size_t count, std::size_t esize, std::size_t piece) {
  return {n, r, count, esize, piece};
}

// A case: rings in a row on a seeded schedule (fake_wire.hpp), in pieces of `piece` bytes.
struct ring_case : reduction_case {
  std::size_t piece = 24;

  ring_case() = default;
  explicit ring_case(const reduction_case& r) : reduction_case(r) {}
  std::string describe() const {
    return describe_reduction() + ", piece " + std::to_string(piece) + describe_schedule();
  }
};

// The ring's result in its own order for every element (its segment decides where the sum
// starts).
std::vector<unsigned char> ring_expected(const rank_data& in, reduce_op op, bool average) {
  const int n = static_cast<int>(in.words.size());
  const cd::ring_schedule g = schedule(n, 0, in.count, cadence::transport::dtype_size(in.type), 8);
  return expected_bytes(in, [&](const auto& x, std::size_t i) {
    int seg = 0;
    while (g.first(seg + 1) <= i) ++seg;
    return ring_oracle(x, seg, op, average);
  });
}

// Whether every element is within rounding of the plain sum over ranks (floats; the ring adds
// in another order).
bool near_plain_sum(const rank_data& in, const rank_data& got, bool average) {
  bool ok = true;
  with_type(in.type, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T eps = std::numeric_limits<T>::epsilon();
      const std::size_t n = in.words.size();
      for (std::size_t i = 0; i < in.count; ++i) {
        T sum = 0, mag = 0, v = 0;
        for (std::size_t r = 0; r < n; ++r) {
          T x;
          std::memcpy(&x, in.bytes_of(static_cast<int>(r)) + i * sizeof(T), sizeof x);
          sum += x;
          mag += std::abs(x);
        }
        if (average) sum /= static_cast<T>(n), mag /= static_cast<T>(n);
        std::memcpy(&v, got.bytes_of(0) + i * sizeof(T), sizeof v);
        if (std::abs(v - sum) > 4 * static_cast<T>(n) * eps * mag) ok = false;
      }
    }
  });
  return ok;
}

template <bool Over>
void check_ring(const ring_case& c) {
  INFO(c.describe() << std::string(Over ? ", posts over delivered sends" : ""));
  seeded_run<Over> run(c, c.piece);
  auto& [rng, sim] = run;
  std::vector<rank_data> data, small;
  data.reserve(static_cast<std::size_t>(c.calls));
  small.reserve(static_cast<std::size_t>(c.calls));
  for (int k = 0; k < c.calls; ++k) {
    data.emplace_back(c.n, c.count, c.type, rng);
    small.emplace_back(c.n, 3, dtype::i64, rng);
  }
  const std::vector<rank_data> inputs = data, small_inputs = small;
  for (int k = 0; k < c.calls; ++k)
    for (int r = 0; r < c.n; ++r) {
      sim.add(r, {algorithm::ring, data[static_cast<std::size_t>(k)].buf(r), c.count, c.type, c.op, c.average});
      if (c.mix)
        sim.add(r,
                {algorithm::doubling, small[static_cast<std::size_t>(k)].buf(r), 3, dtype::i64, reduce_op::sum, false});
    }
  const outcome out = run_to_completion(sim, c.calls * (c.mix ? 2 : 1), rng());
  INFO(out.describe());
  for (int k = 0; k < c.calls; ++k) {
    const auto& got = data[static_cast<std::size_t>(k)];
    const auto& in = inputs[static_cast<std::size_t>(k)];
    check_bits(got, ring_expected(in, c.op, c.average), k);
    if (c.op == reduce_op::sum) CHECK(near_plain_sum(in, got, c.average));
    if (c.mix)
      CHECK(first_differing(small[static_cast<std::size_t>(k)], doubling_expected(small_inputs[static_cast<std::size_t>(k)])) ==
            -1);
  }
}

TEST_CASE(
    "the ring's segments cover the buffer exactly once, balanced to one element, in whole pieces that fit the "
    "scratch") {
  for (int n = 1; n <= 12; ++n)
    for (std::size_t esize : {std::size_t{1}, std::size_t{4}, std::size_t{8}})
      for (std::size_t per : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{64}})
        for (std::size_t count = 0; count <= 4 * static_cast<std::size_t>(n) + 40; count += 1 + count / 8) {
          const std::size_t piece = per * esize;
          const cd::ring_schedule g = schedule(n, 0, count, esize, piece);
          INFO("n " << n << ", count " << count << ", esize " << esize << ", piece " << piece);
          CHECK(g.first(0) == 0);
          CHECK(g.first(n) == count);
          CHECK(g.scratch_bytes() % piece == 0);
          std::size_t covered = 0;
          for (int seg = 0; seg < n; ++seg) {
            const std::size_t elems = g.first(seg + 1) - g.first(seg);
            CHECK(g.first(seg) <= g.first(seg + 1));
            CHECK(elems >= count / static_cast<std::size_t>(n));
            CHECK(elems <= (count + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n));
            CHECK(g.seg_bytes(seg) == elems * esize);
            // The pieces tile the segment: contiguous, none empty, none above a piece.
            std::size_t at = g.first(seg) * esize;
            for (std::size_t k = 0; k < g.pieces(seg); ++k) {
              CHECK(g.offset(seg, k) == at);
              CHECK(g.piece_len(seg, k) > 0);
              CHECK(g.piece_len(seg, k) <= piece);
              CHECK(g.piece_len(seg, k) % esize == 0);
              at += g.piece_len(seg, k);
            }
            CHECK(at == g.first(seg + 1) * esize);
            // Every receive into scratch (whole pieces at k * piece) fits.
            CHECK(g.pieces(seg) * piece <= g.scratch_bytes());
            covered += g.seg_bytes(seg);
          }
          CHECK(covered == count * esize);
        }
}

TEST_CASE("each step a rank receives the segment its left neighbour sends, and passes it on the next step") {
  for (int n = 1; n <= 12; ++n)
    for (int r = 0; r < n; ++r) {
      const cd::ring_schedule g = schedule(n, r, 100, 4, 8);
      const cd::ring_schedule left = schedule(n, g.left(), 100, 4, 8);
      INFO("n " << n << ", rank " << r);
      CHECK(g.steps() == 2 * (n - 1));
      CHECK(schedule(n, g.right(), 100, 4, 8).left() == r);
      CHECK(schedule(n, g.left(), 100, 4, 8).right() == r);
      for (int s = 0; s < g.steps(); ++s) {
        CHECK(g.reduces(s) == (s < n - 1));
        CHECK(g.seg_in(s) == left.seg_out(s));
        CHECK(g.seg_in(s) >= 0);
        CHECK(g.seg_in(s) < n);
        if (s + 1 < g.steps()) CHECK(g.seg_out(s + 1) == g.seg_in(s));
      }
      if (n > 1) CHECK(g.seg_out(n - 1) == (r + 1) % n);  // the segment it owns, reduced
    }
}

TEST_CASE("after the ring's steps every rank holds every segment with every rank's contribution counted exactly once") {
  for (int n = 1; n <= 16; ++n) {
    INFO("n " << n);
    const std::uint32_t all = n == 32 ? ~0u : (1u << n) - 1u;
    // have[r][seg]: the ranks whose values rank r's copy of segment seg contains.
    std::vector<std::vector<std::uint32_t>> have(static_cast<std::size_t>(n),
                                                 std::vector<std::uint32_t>(static_cast<std::size_t>(n)));
    for (int r = 0; r < n; ++r)
      for (int seg = 0; seg < n; ++seg) have[static_cast<std::size_t>(r)][static_cast<std::size_t>(seg)] = 1u << r;
    for (int s = 0; s < 2 * (n - 1); ++s) {
      const auto before = have;
      for (int r = 0; r < n; ++r) {
        const cd::ring_schedule g = schedule(n, r, 64, 4, 8);
        const cd::ring_schedule left = schedule(n, g.left(), 64, 4, 8);
        const std::uint32_t in = before[static_cast<std::size_t>(g.left())][static_cast<std::size_t>(left.seg_out(s))];
        auto& mine = have[static_cast<std::size_t>(r)][static_cast<std::size_t>(g.seg_in(s))];
        if (g.reduces(s)) {
          CHECK((mine & in) == 0);  // nothing counted twice
          mine |= in;
        } else {
          mine = in;
        }
      }
      if (s == n - 2)  // reduce-scatter done: rank r owns segment r + 1 fully reduced
        for (int r = 0; r < n; ++r)
          CHECK(have[static_cast<std::size_t>(r)][static_cast<std::size_t>((r + 1) % n)] == all);
    }
    for (int r = 0; r < n; ++r)
      for (int seg = 0; seg < n; ++seg) CHECK(have[static_cast<std::size_t>(r)][static_cast<std::size_t>(seg)] == all);
  }
}

TEST_CASE(
    "the ring all-reduce gives every rank the bits of the ring's own order of reduction, for 2 to 9 ranks, every "
    "dtype, op and averaging") {
  std::uint64_t seed = 1000;
  for_each_reduction(2, 9, [&](const reduction_case& r) {
    const std::size_t e = cadence::transport::dtype_size(r.type);
    // As many elements as ranks, a few more (segments of unequal sizes), and many (pieces that
    // do not divide a segment).
    const auto n = static_cast<std::size_t>(r.n);
    for (std::size_t count : {n, n + 3, 11 * n + 5}) {
      ring_case c(r);
      c.count = count;
      c.piece = (seed % 2 == 0 ? 3 : 5) * e;
      c.take_seed(seed);
      over_or_not(seed % 2 == 0, [&](auto over) { check_ring<decltype(over)::value>(c); });
    }
  });
}

TEST_CASE(
    "over hundreds of seeded delivery schedules, rings and small all-reduces in a sequence end with the same bits on "
    "every rank") {
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(200); ++seed) {
    std::mt19937_64 rng(seed * 104729 + 7);
    ring_case c;
    c.pick_reduction(rng);
    const std::size_t e = cadence::transport::dtype_size(c.type);
    c.count = std::uniform_int_distribution<std::size_t>(static_cast<std::size_t>(c.n),
                                                         16 * static_cast<std::size_t>(c.n))(rng);
    c.piece = e * std::uniform_int_distribution<std::size_t>(1, 9)(rng);
    c.pick_schedule(rng, seed, 2, true);
    over_or_not(seed % 2 != 0, [&](auto over) { check_ring<decltype(over)::value>(c); });
  }
}

TEST_CASE(
    "arguments that differ on one rank fail every rank before any piece touches a caller's buffer, naming both sides") {
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(100); ++seed) {
    std::mt19937_64 rng(seed + 77);
    const int n = std::uniform_int_distribution<int>(2, 9)(rng);
    const int odd = std::uniform_int_distribution<int>(0, n - 1)(rng);
    const int wire = static_cast<int>(seed % 3);
    call base{algorithm::ring, nullptr, 4 * static_cast<std::size_t>(n) + 1, dtype::f32, reduce_op::sum, false};
    call other = base;
    switch (seed % 4) {
      case 0: other.count = base.count + 2; break;
      case 1: other.type = dtype::f64; break;
      case 2: other.op = reduce_op::min; break;
      case 3: other.average = true; break;
    }
    INFO("n " << n << ", rank " << odd << " differs (case " << seed % 4 << "), " << flavour_name(wire) << ", seed "
              << seed);
    wire_options o = flavour(wire);
    o.piece = 20;  // f32 pieces of 20 bytes, f64 pieces of 16: the first pieces differ too
    simulation<false> sim(n, o);
    sim.watch_buffers = true;
    rank_data data(n, 8 * static_cast<std::size_t>(n) + 8, dtype::f64, rng);
    check_arguments_differ(sim, data, base, odd, other, rng(), [&](int r, const std::string&) {
      CHECK(sim.wire(r).exposed_ever() == sim.wire(r).reads_caller_early());  // for reading only, if at all
    });
  }
}

// The ring's runs in which one rank never starts (fake_wire.hpp's for_each_absent_run): six
// f32 elements a rank.
template <class Check>
void for_each_absent_ring(bool watch, Check&& check) {
  for_each_absent_run(
      algorithm::ring, 5, dtype::f32, [](int n) { return 6 * static_cast<std::size_t>(n); }, watch, check);
}

TEST_CASE("a rank that never starts keeps every other rank in the ring's agreement, naming it, its buffer untouched") {
  for_each_absent_ring(true, [](simulation<true>& sim, const outcome& out, int absent) {
    for (int r = 0; r < sim.size(); ++r) {
      if (r == absent) continue;
      const auto& x = out.ranks[static_cast<std::size_t>(r)];
      REQUIRE(x.unfinished);
      CHECK(sim.op(r).phase == 0);
      CHECK(sim.wire(r).exposed_ever() == sim.wire(r).reads_caller_early());  // for reading only, if at all
      REQUIRE_FALSE(x.awaited.peers.empty());
      CHECK(std::find(x.awaited.peers.begin(), x.awaited.peers.end(), absent) != x.awaited.peers.end());
      CHECK(x.awaited.note == "they never started this collective; in the ring all-reduce");
      CHECK(x.awaited.native == sim.wire(r).native(cd::wire_point::notice_in, x.awaited.peers.front()));
    }
  });
}

// A regression test: phase 0 once returned at the first missing notice, so the deadline named
// ranks that had started too.
TEST_CASE("a rank that never starts is the only rank the others name in the ring's agreement") {
  for_each_absent_ring(false, [](simulation<true>& sim, const outcome& out, int absent) {
    for (int r = 0; r < sim.size(); ++r)
      if (r != absent) CHECK(out.ranks[static_cast<std::size_t>(r)].awaited.peers == std::vector<int>{absent});
  });
}

TEST_CASE(
    "while one notice is held back its receiver stays off its buffer; once it moves, the ring completes with the right "
    "bits") {
  for (int n = 2; n <= 9; ++n) {
    const int wire = n % 3;
    std::mt19937_64 rng(static_cast<std::uint64_t>(n) + 900);
    const int from = std::uniform_int_distribution<int>(0, n - 1)(rng);
    const int to = (from + 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(n - 1))) % n;
    INFO("n " << n << ", the notice from rank " << from << " to rank " << to << " held, " << flavour_name(wire));
    simulation<false> sim(n, flavour(wire));
    sim.watch_buffers = true;
    const std::size_t count = 9 * static_cast<std::size_t>(n) + 2;
    rank_data data(n, count, dtype::f64, rng);
    const rank_data in = data;
    const outcome out = run_held(
        sim, algorithm::ring, data,
        [&](const message& m, step_kind) { return m.notice && m.from == from && m.to == to; }, rng());
    INFO(out.describe());
    CHECK(sim.wire(to).exposed_ever() == sim.wire(to).reads_caller_early());
    const auto& named = out.ranks[static_cast<std::size_t>(to)].awaited.peers;
    CHECK(named == std::vector<int>{from});
    CHECK(std::memcmp(data.bytes_of(to), in.bytes_of(to), data.bytes()) == 0);
    release_and_check(sim, data, ring_expected(in, reduce_op::sum, false), rng());
  }
}

TEST_CASE(
    "where the wire does not read the caller's buffer early, step 0's first early_bytes leave from copies while a "
    "notice is missing and the rest of it from the buffer once the ranks agree") {
  // Pieces of 512 KiB and segments of 2.5 pieces: two pieces leave before agreement, one after.
  constexpr std::size_t piece = std::size_t{512} << 10;
  static_assert(cd::ring_allreduce<fake_wire<true>>::early_bytes == std::size_t{1} << 20, "two pieces of 512 KiB");
  for (int n = 2; n <= 3; ++n) {
    INFO("n " << n);
    std::mt19937_64 rng(static_cast<std::uint64_t>(n) + 4000);
    wire_options o = gloo_like();
    o.piece = piece;
    simulation<true> sim(n, o);
    sim.watch_buffers = true;
    const std::size_t count = static_cast<std::size_t>(n) * (5 * piece / 2 / sizeof(float));
    rank_data data(n, count, dtype::f32, rng);
    const rank_data in = data;
    const outcome out = run_held(
        sim, algorithm::ring, data, [](const message& m, step_kind) { return m.notice && m.from == 1 && m.to == 0; },
        rng());
    INFO(out.describe());
    CHECK(out.misuse.empty());
    const cd::ring_schedule g = schedule(n, 0, count, sizeof(float), piece);
    REQUIRE(g.pieces(g.seg_out(0)) == 3);
    CHECK(sim.op(0).phase == 0);
    CHECK_FALSE(sim.wire(0).exposed_ever());  // so no piece left from its buffer
    CHECK(sim.op(0).sent_by[0] == 2);
    CHECK(std::memcmp(data.bytes_of(0), in.bytes_of(0), data.bytes()) == 0);
    release_and_check(sim, data, ring_expected(in, reduce_op::sum, false), rng());
    CHECK(sim.op(0).sent_by[0] == 3);
  }
}

TEST_CASE(
    "a wire that may not post over pending sends holds the allgather's receives until those sends complete; one that "
    "may goes on") {
  for (int n = 2; n <= 6; ++n) {
    INFO("n " << n);
    const std::size_t count = 5 * static_cast<std::size_t>(n);
    auto hold_completions = [](const message& m, step_kind k) {
      return m.on == lane::bulk && k == step_kind::complete;
    };
    // Held, no misuse: no receive went over a pending send (mpi_like), nothing landed where a
    // send had not read yet (gloo_like).
    {
      std::mt19937_64 rng(static_cast<std::uint64_t>(n));
      wire_options o = mpi_like();
      o.eager_bytes = 0;
      simulation<false> sim(n, o);
      rank_data data(n, count, dtype::i32, rng);
      const rank_data in = data;
      const outcome out = run_held(sim, algorithm::ring, data, hold_completions, rng());
      INFO(out.describe());
      for (int r = 0; r < n; ++r) {
        CHECK(sim.op(r).phase == 1);
        CHECK(sim.op(r).posted_step <= n - 2);  // not one allgather step posted
      }
      release_and_check(sim, data, ring_expected(in, reduce_op::sum, false), rng());
    }
    {
      std::mt19937_64 rng(static_cast<std::uint64_t>(n));
      simulation<true> sim(n, gloo_like());
      rank_data data(n, count, dtype::i32, rng);
      const rank_data in = data;
      const outcome out = run_held(sim, algorithm::ring, data, hold_completions, rng());
      INFO(out.describe());
      for (int r = 0; r < n; ++r) {
        CHECK(sim.op(r).phase == 2);  // every piece received; only the sends' completions wait
        CHECK(out.ranks[static_cast<std::size_t>(r)].awaited.peers == std::vector<int>{(r + 1) % n});
      }
      const auto want = ring_expected(in, reduce_op::sum, false);
      CHECK(first_differing(data, want) == -1);
      release_and_check(sim, data, want, rng());
    }
  }
}

TEST_CASE("a piece of another length than due fails the rank that receives it, naming its left neighbour") {
  SUBCASE("shorter, on a wire that reports sizes: both lengths named") {
    std::mt19937_64 rng(8);
    wire_options o = mpi_like();
    o.piece = 16;
    simulation<false> sim(3, o);
    rank_data data(3, 30, dtype::f32, rng);
    add_allreduce(sim, algorithm::ring, data);
    sim.net().tamper = [](message& m) {
      if (m.from == 1 && m.on == lane::bulk) m.payload.resize(m.payload.size() - 4);
    };
    const outcome out = sim.run(3);
    INFO(out.describe());
    CHECK(out.misuse.empty());
    REQUIRE(out.ranks[2].failed);
    CHECK(contains(out.ranks[2].error,
                   "cadence::transport[fake]: allreduce #1 on rank 2 of 3: in the ring all-reduce, rank 1 sent a piece "
                   "of 12 bytes where 16 were due (the ranks' piece sizes differ)"));
  }
  SUBCASE("longer than the receive") {
    std::mt19937_64 rng(9);
    simulation<true> sim(4, gloo_like());
    rank_data data(4, 40, dtype::u8, rng);
    add_allreduce(sim, algorithm::ring, data, reduce_op::max);
    sim.net().tamper = [](message& m) {
      if (m.from == 3 && m.on == lane::bulk) m.payload.resize(m.payload.size() + 64);
    };
    const outcome out = sim.run(3);
    INFO(out.describe());
    CHECK(out.misuse.empty());
    REQUIRE(out.ranks[0].failed);
    CHECK(contains(out.ranks[0].error, "rank 3 sent a piece of"));
  }
}

// A regression test: an empty segment once sent a zero-byte piece nobody posted for (a false
// "piece sizes differ", or wrong sums over a wire that cannot tell sizes).
TEST_CASE("the ring sums correctly with fewer elements than ranks, some segments empty") {
  for (int n = 2; n <= 6; ++n)
    for (std::size_t count = 1; count < static_cast<std::size_t>(n); ++count)
      for (int wire = 0; wire < 3; ++wire) {
        INFO("n " << n << ", count " << count << ", " << flavour_name(wire));
        std::mt19937_64 rng(static_cast<std::uint64_t>(n * 100 + wire));
        simulation<false> sim(n, flavour(wire));
        rank_data data(n, count, dtype::i32, rng);
        const rank_data in = data;
        add_allreduce(sim, algorithm::ring, data);
        const outcome out = sim.run(5);
        INFO(out.describe());
        REQUIRE(out.all_completed(1));
        CHECK(first_differing(data, ring_expected(in, reduce_op::sum, false)) == -1);
      }
}

// A regression test: on one rank the ring once sent to itself and wrote past sent_by.
TEST_CASE("the ring on one rank completes and leaves the buffer as it was") {
  std::mt19937_64 rng(1);
  simulation<false> sim(1, mpi_like());
  rank_data data(1, 10, dtype::f32, rng);
  const rank_data in = data;
  sim.add(0, {algorithm::ring, data.buf(0), 10, dtype::f32, reduce_op::sum, false});
  const outcome out = sim.run(1);
  INFO(out.describe());
  REQUIRE(out.all_completed(1));
  CHECK(std::memcmp(data.bytes_of(0), in.bytes_of(0), data.bytes()) == 0);
}

TEST_CASE("a rank that stops mid-ring is named by its right neighbour, and no rank waiting names nobody") {
  for (std::uint64_t seed = 0; seed < cadence_test::sanitized_trials(120); ++seed) {
    std::mt19937_64 rng(seed + 31337);
    const stop_case s(rng, seed, 8, 8);
    INFO(s.describe());
    simulation<false> sim(s.n, flavour(s.wire));
    rank_data data(s.n, 7 * static_cast<std::size_t>(s.n), dtype::i64, rng);
    const outcome out = s.run(sim, algorithm::ring, data, rng());
    INFO(out.describe());
    const int stopped = s.stopped;
    const int right = (stopped + 1) % s.n;
    const auto& next = out.ranks[static_cast<std::size_t>(right)];
    if (right != stopped && next.unfinished && sim.op(right).phase <= 1) {
      CHECK(std::find(next.awaited.peers.begin(), next.awaited.peers.end(), stopped) != next.awaited.peers.end());
    }
  }
}

}  // namespace ring_tests
}  // namespace cadence_fake_wire
