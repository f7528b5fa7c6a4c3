// cadence/transport/algorithms/broadcast.hpp: the root broadcast driven directly over the
// scripted fake wire (fake_wire.hpp) for 1 to 9 ranks, inline and in pieces, under hundreds of
// seeded delivery schedules: every rank ends with the root's bytes, the root's buffer is only
// read, a receiver checks the root's signature before anything lands in its buffer, and whom a
// stalled broadcast waits for is named.
#include "fake_wire.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace cadence_fake_wire {
namespace broadcast_tests {

// Per-rank buffers of `bytes` bytes, each rank's different.
struct byte_buffers {
  std::vector<std::vector<unsigned char>> b;
  byte_buffers(int n, std::size_t bytes, std::mt19937_64& rng)
      : b(static_cast<std::size_t>(n), std::vector<unsigned char>(bytes + 1)) {
    for (auto& v : b)
      for (auto& x : v) x = static_cast<unsigned char>(rng());
  }
  void* buf(int r) { return b[static_cast<std::size_t>(r)].data(); }
  bool same(int r, const std::vector<unsigned char>& want, std::size_t bytes) const {
    return bytes == 0 || std::memcmp(b[static_cast<std::size_t>(r)].data(), want.data(), bytes) == 0;
  }
};

// A case: broadcasts in a row on a seeded schedule (fake_wire.hpp), the first from `root`.
struct broadcast_case : seeded_case {
  int root = 0;
  std::size_t bytes = 8;
  std::size_t piece = 24;
  std::string describe() const {
    return "n " + std::to_string(n) + ", root " + std::to_string(root) + ", " + std::to_string(bytes) +
           " bytes, piece " + std::to_string(piece) + describe_schedule();
  }
};

// Every rank calls a broadcast of `bytes` bytes from `root` over its own buffer of `data`; rank
// `odd`, if one, takes `odd_bytes` instead.
template <bool Over>
void add_broadcast(simulation<Over>& sim, byte_buffers& data, int root, std::size_t bytes, int odd = -1,
                   std::size_t odd_bytes = 0) {
  for (int r = 0; r < sim.size(); ++r) {
    call b{algorithm::broadcast, data.buf(r), r == odd ? odd_bytes : bytes};
    b.root = root;
    sim.add(r, b);
  }
}

template <bool Over>
void check_broadcast(const broadcast_case& c) {
  INFO(c.describe() << std::string(Over ? ", posts over delivered sends" : ""));
  seeded_run<Over> run(c, c.piece);
  auto& [rng, sim] = run;
  std::vector<byte_buffers> data;
  std::vector<rank_data> small;
  data.reserve(static_cast<std::size_t>(c.calls));
  small.reserve(static_cast<std::size_t>(c.calls));
  std::vector<int> roots;
  for (int k = 0; k < c.calls; ++k) {
    data.emplace_back(c.n, c.bytes, rng);
    small.emplace_back(c.n, 2, dtype::u8, rng);
    roots.push_back(k == 0 ? c.root : static_cast<int>(rng() % static_cast<std::uint64_t>(c.n)));
  }
  const std::vector<byte_buffers> inputs = data;
  const std::vector<rank_data> small_inputs = small;
  for (int k = 0; k < c.calls; ++k) {
    add_broadcast(sim, data[static_cast<std::size_t>(k)], roots[static_cast<std::size_t>(k)], c.bytes);
    if (c.mix) add_allreduce(sim, algorithm::doubling, small[static_cast<std::size_t>(k)], reduce_op::max);
  }
  const outcome out = run_to_completion(sim, c.calls * (c.mix ? 2 : 1), rng());
  INFO(out.describe());
  for (int k = 0; k < c.calls; ++k) {
    const int root = roots[static_cast<std::size_t>(k)];
    const auto& want = inputs[static_cast<std::size_t>(k)].b[static_cast<std::size_t>(root)];
    for (int r = 0; r < c.n; ++r) {
      INFO("call " << k << " (root " << root << "), rank " << r);
      CHECK(data[static_cast<std::size_t>(k)].same(r, want, c.bytes));
    }
    if (c.mix)
      CHECK(first_differing(small[static_cast<std::size_t>(k)],
                            doubling_expected(small_inputs[static_cast<std::size_t>(k)], reduce_op::max)) == -1);
  }
}

TEST_CASE("every rank ends with the root's bytes, inline or in pieces, for 1 to 9 ranks and every root") {
  std::uint64_t seed = 300;
  for (int n = 1; n <= 9; ++n)
    for (int root = 0; root < n; ++root) {
      const std::size_t inline_cap = std::max<std::size_t>(64, 8 * static_cast<std::size_t>(n));
      // Nothing, one byte, the most that travels inline, one byte more, pieces that do not
      // divide the buffer.
      for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, inline_cap, inline_cap + 1, 5 * inline_cap + 7}) {
        broadcast_case c;
        c.n = n;
        c.root = root;
        c.bytes = bytes;
        c.piece = 8 + 8 * (seed % 4);
        c.wire = static_cast<int>(seed % 3);
        c.calls = 1;
        c.seed = ++seed;
        over_or_not(seed % 2 == 0, [&](auto over) { check_broadcast<decltype(over)::value>(c); });
      }
    }
}

TEST_CASE(
    "over hundreds of seeded delivery schedules, broadcasts from changing roots and small all-reduces in a sequence "
    "deliver the root's bytes") {
  for (std::uint64_t seed = 0; seed < 240; ++seed) {
    std::mt19937_64 rng(seed * 15485863 + 3);
    broadcast_case c;
    c.n = std::uniform_int_distribution<int>(1, 9)(rng);
    c.root = std::uniform_int_distribution<int>(0, c.n - 1)(rng);
    c.bytes = std::uniform_int_distribution<std::size_t>(0, 400)(rng);
    c.piece = 8 * std::uniform_int_distribution<std::size_t>(1, 12)(rng);
    c.pick_schedule(rng, seed, 3, true);
    over_or_not(seed % 2 != 0, [&](auto over) { check_broadcast<decltype(over)::value>(c); });
  }
}

TEST_CASE(
    "a receiver whose arguments differ from the root's fails naming both sides, its buffer untouched; the others get "
    "the root's bytes") {
  for (std::uint64_t seed = 0; seed < 90; ++seed) {
    std::mt19937_64 rng(seed + 4242);
    const int n = std::uniform_int_distribution<int>(2, 9)(rng);
    const int root = std::uniform_int_distribution<int>(0, n - 1)(rng);
    const int odd = (root + 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(n - 1))) % n;
    const int wire = static_cast<int>(seed % 3);
    const std::size_t bytes = seed % 2 == 0 ? 20 : 300;  // inline, or in pieces
    const std::size_t other = bytes + 8;
    INFO("n " << n << ", root " << root << ", rank " << odd << " takes " << other << " bytes, " << flavour_name(wire)
              << ", seed " << seed);
    simulation<false> sim(n, flavour(wire));
    sim.watch_buffers = true;
    byte_buffers data(n, other, rng);
    const byte_buffers before = data;
    add_broadcast(sim, data, root, bytes, odd, other);
    const outcome out = sim.run(rng());
    INFO(out.describe());
    CHECK(out.misuse.empty());
    const auto& x = out.ranks[static_cast<std::size_t>(odd)];
    REQUIRE(x.failed);
    CHECK(x.error == "cadence::transport[fake]: broadcast #1 on rank " + std::to_string(odd) + " of " +
                         std::to_string(n) + ": arguments differ across ranks in collective #1: rank " +
                         std::to_string(root) + " called broadcast(" + std::to_string(bytes) + " bytes, root " +
                         std::to_string(root) + "), rank " + std::to_string(odd) + " called broadcast(" +
                         std::to_string(other) + " bytes, root " + std::to_string(root) + ")");
    CHECK(data.same(odd, before.b[static_cast<std::size_t>(odd)], other));
    for (int r = 0; r < n; ++r) {
      if (r == odd || r == root) continue;
      CHECK(out.ranks[static_cast<std::size_t>(r)].completed == 1);
      CHECK(data.same(r, before.b[static_cast<std::size_t>(root)], bytes));
    }
    // The root is done once its data has left; pieces the receiver never took keep it waiting,
    // naming that receiver.
    const auto& top = out.ranks[static_cast<std::size_t>(root)];
    if (top.unfinished)
      CHECK(top.awaited.peers == std::vector<int>{odd});
    else
      CHECK(top.completed == 1);
  }
}

TEST_CASE(
    "a root that never starts is named by every receiver; a receiver that never starts holds the root only for "
    "pieces") {
  for (int n = 2; n <= 9; ++n)
    for (int wire = 0; wire < 3; ++wire) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(n * 7 + wire));
      const int root = std::uniform_int_distribution<int>(0, n - 1)(rng);
      INFO("n " << n << ", root " << root << ", " << flavour_name(wire));
      for (std::size_t bytes : {std::size_t{16}, std::size_t{500}}) {
        INFO(bytes << " bytes");
        {
          simulation<false> sim(n, flavour(wire));
          sim.watch_buffers = true;
          byte_buffers data(n, bytes, rng);
          add_broadcast(sim, data, root, bytes);
          sim.never_starts(root);
          const outcome out = sim.run(rng());
          INFO(out.describe());
          CHECK(out.misuse.empty());
          for (int r = 0; r < n; ++r) {
            if (r == root) continue;
            const auto& x = out.ranks[static_cast<std::size_t>(r)];
            REQUIRE(x.unfinished);
            CHECK(x.awaited.peers == std::vector<int>{root});
            CHECK(x.awaited.note == "they never started this collective");
            CHECK(x.awaited.native == sim.wire(r).native(cd::wire_point::data_in, root));
          }
        }
        {
          const int absent = (root + 1) % n;
          wire_options o = flavour(wire);
          o.eager_bytes = 0;  // nothing completes before it is received
          simulation<true> sim(n, o);
          byte_buffers data(n, bytes, rng);
          const byte_buffers before = data;
          add_broadcast(sim, data, root, bytes);
          sim.never_starts(absent);
          const outcome out = sim.run(rng());
          INFO(out.describe());
          CHECK(out.misuse.empty());
          for (int r = 0; r < n; ++r)
            if (r != root && r != absent) {
              CHECK(out.ranks[static_cast<std::size_t>(r)].completed == 1);
              CHECK(data.same(r, before.b[static_cast<std::size_t>(root)], bytes));
            }
          const auto& top = out.ranks[static_cast<std::size_t>(root)];
          const bool in_pieces = bytes > sim.wire(root).inline_capacity();
          const bool receive_posted_ahead = !flavour(wire).posts_on_demand;
          if (in_pieces || !receive_posted_ahead) {
            REQUIRE(top.unfinished);
            CHECK(top.awaited.peers == std::vector<int>{absent});
            CHECK(top.awaited.native ==
                  sim.wire(root).native(in_pieces ? cd::wire_point::bulk_out : cd::wire_point::out,
                                        in_pieces ? absent : -1));
          } else {
            // The one message went into the receive the absent rank's wire keeps posted: as
            // MPI_Bcast, the root is done once its data has left.
            CHECK(top.completed == 1);
          }
        }
      }
    }
}

// A regression test: a message longer than the receive, on a wire that hides its head, once
// read "rank 0 called an unknown collective (kind 0) as collective #0".
TEST_CASE(
    "a receiver that takes fewer bytes than the root sends fails naming the root and the sizes, not a blank call") {
  wire_options strict = mpi_like();
  strict.posts_inline = false;
  std::mt19937_64 rng(2);
  simulation<false> sim(2, strict);
  byte_buffers data(2, 20, rng);
  sim.add(0, {algorithm::broadcast, data.buf(0), 20});
  sim.add(1, {algorithm::broadcast, data.buf(1), 12});
  const outcome out = sim.run(2);
  INFO(out.describe());
  REQUIRE(out.ranks[1].failed);
  CHECK_FALSE(contains(out.ranks[1].error, "unknown collective"));
  CHECK(contains(out.ranks[1].error, "rank 0"));
  CHECK(contains(out.ranks[1].error, "broadcast(12 bytes, root 0)"));
}

TEST_CASE("with the root's head handed over, a receiver that takes fewer bytes than the root sends names both calls") {
  wire_options strict = mpi_like();
  strict.posts_inline = false;
  strict.head_of_too_long = true;
  std::mt19937_64 rng(2);
  simulation<false> sim(2, strict);
  sim.watch_buffers = true;
  byte_buffers data(2, 20, rng);
  sim.add(0, {algorithm::broadcast, data.buf(0), 20});
  sim.add(1, {algorithm::broadcast, data.buf(1), 12});
  const outcome out = sim.run(2);
  INFO(out.describe());
  check_fails_with(
      out, 1,
      "cadence::transport[fake]: broadcast #1 on rank 1 of 2: arguments differ across ranks in collective #1: rank 0 "
      "called broadcast(20 bytes, root 0), rank 1 called broadcast(12 bytes, root 0)");
}

// A regression test: a receiver whose wire cuts pieces of another size than the root's once
// placed the root's pieces at its own offsets; the root's head now gives its piece size.
TEST_CASE("ranks whose piece sizes differ fail the broadcast instead of placing the root's pieces at other offsets") {
  std::mt19937_64 rng(1);
  std::vector<wire_options> o(2, mpi_like());
  o[0].piece = 16;  // the root cuts 16-byte pieces
  o[1].piece = 32;  // the receiver posts 32-byte ones
  simulation<false> sim(2, o);
  byte_buffers data(2, 256, rng);
  const byte_buffers before = data;
  for (int r = 0; r < 2; ++r) sim.add(r, {algorithm::broadcast, data.buf(r), 256});
  const outcome out = sim.run(1);
  INFO(out.describe());
  const bool right_bytes = data.same(1, before.b[0], 256);
  CHECK((out.ranks[1].failed || right_bytes));
  if (out.ranks[1].failed) CHECK(contains(out.ranks[1].error, "piece"));
}

}  // namespace broadcast_tests
}  // namespace cadence_fake_wire
