// exchange::diloco_member: DiLoCo on the membership layer over in-process ranks. A rank killed
// between outer syncs, a rank killed inside an outer sync's all-reduce, and a killed rank
// restarted that rejoins: the survivors' global weights and outer state stay identical (every
// commit's hash goes into a ledger; a count with two hashes fails), and training goes on.
#include <cadence/exchange/local_sgd/membership.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/transport/inproc.hpp>

#include "membership/membership_ranks.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace cadence_diloco_membership_test {
namespace {

namespace mb = cadence::membership;
namespace ex = cadence::exchange;
using cadence::transport::inproc_communicator;
using cadence::transport::inproc_world;
using cadence_membership_test::killed;
using cadence_membership_test::kill_at_send;
using cadence_membership_test::ledger;
using cadence_membership_test::test_options;
using glue = ex::diloco_member<inproc_communicator>;

struct rank_result {
  std::string error;
  std::uint64_t committed = 0, outer_steps = 0, hash = 0;
  int faulted_syncs = 0;  // outer syncs that were run again or healed here
  std::vector<int> last_quorum;
  mb::member_stats stats;
};

// An inner step that depends on the rank and the step, so a pseudo-gradient counted twice or
// not at all shows in the hash.
void inner_step(std::vector<float>& w, int rank, std::uint64_t step) {
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] += 0.001f * static_cast<float>((rank + 1) * static_cast<int>(i % 5 + 1)) -
            1e-5f * static_cast<float>(step % 7);
}

ex::diloco_options options_for(const std::string& config) {
  const ex::diloco_config c = ex::parse_diloco_config(config);
  return c.options;
}

// Inner steps and outer syncs until the member committed `target` syncs; every commit's hash
// (the member's registered state, and the global weights with the outer state) in `book`.
int train(glue& dm, std::vector<float>& w, int rank, ledger& book, std::uint64_t target) {
  int faulted = 0;
  mb::member<inproc_communicator>& m = dm.member();
  std::uint64_t step = 0;
  while (m.committed() < target) {
    inner_step(w, rank, step++);
    if (!dm.step_done(1000 + 100 * rank)) continue;
    const mb::sync_report rep = dm.sync();
    if (rep.attempts > 1 || rep.outcome != mb::outcome::committed) ++faulted;
    if (rep.outcome == mb::outcome::committed) {
      book.record(rank, m.committed(), m.state_hash() ^ dm.global_hash());
      // The local weights are the global ones after a committed outer step (alpha 0, delay 0).
      REQUIRE(std::equal(w.begin(), w.end(), dm.adapter().global_weights().begin()));
    }
  }
  return faulted;
}

// After the last outer sync: the closing sync (diloco_member::finish()), then what the rank
// ended with; the count leaves the closing sync out.
void finish(glue& dm, rank_result& out) {
  dm.finish();
  out.committed = dm.member().committed() - 1;
  out.outer_steps = dm.adapter().outer_steps();
  out.hash = dm.global_hash();
  out.last_quorum = dm.member().current().ranks;
  out.stats = dm.member().stats();
}

template <class Body>
std::vector<rank_result> run_ranks(inproc_world& world, int n, Body body) {
  return cadence_membership_test::run_ranks<rank_result>(world, n, std::move(body));
}

void check_survivors(const std::vector<rank_result>& res, int victim, std::uint64_t target, const ledger& book) {
  CHECK(res[static_cast<std::size_t>(victim)].error != "");
  std::vector<int> survivors;
  for (int r = 0; r < static_cast<int>(res.size()); ++r)
    if (r != victim) survivors.push_back(r);
  const rank_result& first = res[static_cast<std::size_t>(survivors[0])];
  for (int r : survivors) {
    const rank_result& x = res[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(x.error == "", "rank ", r, ": ", x.error);
    CHECK(x.committed == target);
    CHECK(x.hash == first.hash);
    CHECK(x.outer_steps == first.outer_steps);
    CHECK(x.outer_steps >= (target - 1) / 2);  // training went on (two fragments: a model step per two syncs)
    CHECK(x.last_quorum == survivors);
    CHECK(x.stats.reconfigurations >= 2);
  }
  CHECK(book.counts() >= target - 1);
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

TEST_CASE("diloco_member: a rank killed between outer syncs drops out, the survivors' global state stays identical") {
  for (const std::string config :
       {"fixed:3,outer=nesterov:0.7:0.9", "fixed:4,fragments=2", "lag:3:1,outer=adam:0.01", "quorum:3:3:0"}) {
    for (int victim : {0, 2}) {
      CAPTURE(config);
      CAPTURE(victim);
      inproc_world world(4);
      ledger book;
      const auto res = run_ranks(world, 4, [&](int rank, inproc_communicator& c, rank_result& out) {
        mb::member<inproc_communicator> m(c, test_options());
        std::vector<float> w(3000, 0.5f);
        const ex::diloco_config cfg = ex::parse_diloco_config(config);
        glue dm(m, {ex::tensor_ref(w.data(), w.size())}, ex::make_outer_optimizer(cfg.outer), cfg.options);
        dm.start();
        std::uint64_t step = 0;
        while (m.committed() < 10) {
          if (rank == victim && m.committed() >= 4 && dm.adapter().local_steps() >= 1) {
            world.kill(rank);  // between syncs: one inner step into the next period
            throw killed{};
          }
          inner_step(w, rank, step++);
          if (!dm.step_done(1000 + 100 * rank)) continue;
          const mb::sync_report rep = dm.sync();
          if (rep.outcome == mb::outcome::committed) book.record(rank, m.committed(), m.state_hash() ^ dm.global_hash());
        }
        finish(dm, out);
      });
      check_survivors(res, victim, 10, book);
    }
  }
}

// The victim dies at its k-th send of the ring all-reduce (the pseudo-gradients: 20,000
// floats in 4 KiB pieces): part of its messages went out, the survivors' sync fails, and they
// run it again without its pseudo-gradient.
TEST_CASE("diloco_member: a rank killed inside an outer sync's all-reduce drops out of that sync") {
  for (const std::string config : {"fixed:2", "elastic:3"}) {
    for (int victim : {0, 1}) {
      for (int skip : {7, 75}) {
        CAPTURE(config);
        CAPTURE(victim);
        CAPTURE(skip);
        inproc_world world(4);
        ledger book;
        kill_at_send(world, victim, skip);
        const auto res = run_ranks(world, 4, [&](int rank, inproc_communicator& c, rank_result& out) {
          auto o = test_options();
          o.piece_bytes = 4096;
          mb::member<inproc_communicator> m(c, o);
          std::vector<float> w(20000, 0.25f);
          glue dm(m, {ex::tensor_ref(w.data(), w.size())}, ex::make_outer_optimizer("nesterov"), options_for(config));
          dm.start();
          out.faulted_syncs = train(dm, w, rank, book, 8);
          finish(dm, out);
        });
        check_survivors(res, victim, 8, book);
        int faulted = 0;
        for (int r = 0; r < 4; ++r)
          if (r != victim) {
            CHECK(res[static_cast<std::size_t>(r)].stats.failed_syncs >= 1);
            faulted += res[static_cast<std::size_t>(r)].faulted_syncs;
          }
        // The 7th send is in the first transaction (the weights' broadcast), the 75th in an
        // outer sync's all-reduce: that sync was run again (or healed) on the survivors.
        if (skip == 75) CHECK(faulted >= 1);
      }
    }
  }
}

TEST_CASE("diloco_member: a restarted rank rejoins with the current global weights and outer state") {
  inproc_world world(4);
  ledger book;
  std::atomic<bool> restarted{false}, asked{false}, lost{false};
  std::atomic<std::uint64_t> first_nonce{0};
  std::vector<rank_result> res(4);
  std::vector<std::thread> threads;
  auto body = [&](int rank) {
    rank_result& out = res[static_cast<std::size_t>(rank)];
    cadence_membership_test::keep_error(out, [&] {
      auto o = test_options();
      o.transfer_bytes = 4096;
      if (rank == 0)
        o.on_event = [&](const std::string& line) {
          if (line.find("lost rank 3") != std::string::npos) lost = true;
        };
      std::vector<float> w(5000, 1.0f);
      if (rank == 3 && restarted) {
        inproc_communicator c = world.restart(3);
        mb::member<inproc_communicator> m(c, o);
        glue dm(m, {ex::tensor_ref(w.data(), w.size())}, ex::make_outer_optimizer("nesterov"), options_for("fixed:3"));
        w.assign(w.size(), -7.0f);  // overwritten by the quorum's global weights
        asked = true;
        dm.join();
        CHECK(m.current().contains(3));
        CHECK(m.stats().healed == 1);
        CHECK(dm.adapter().outer_steps() >= 3);  // the counters came with the state
        CHECK(std::equal(w.begin(), w.end(), dm.adapter().global_weights().begin()));
        bool moving = false;  // the outer (Nesterov) state came too: not all zero after 3 steps
        for (float x : dm.adapter().outer_state()) moving = moving || x != 0.0f;
        CHECK(moving);
        train(dm, w, rank, book, 12);
        finish(dm, out);
        return;
      }
      inproc_communicator c = world.join(rank);
      mb::member<inproc_communicator> m(c, o);
      glue dm(m, {ex::tensor_ref(w.data(), w.size())}, ex::make_outer_optimizer("nesterov"), options_for("fixed:3"));
      dm.start();
      train(dm, w, rank, book, 4);
      if (rank == 3) {
        first_nonce = m.nonce();
        world.kill(3);
        throw killed{};
      }
      // Until the replacement is in (admitted at a sync point), then more syncs with it.
      while (!(restarted && m.current().contains(3) && m.current().nonces[3] != first_nonce)) {
        while (!m.current().contains(3) && !asked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        REQUIRE(m.committed() < 10);  // admitted within a few syncs
        train(dm, w, rank, book, m.committed() + 1);
      }
      train(dm, w, rank, book, 12);
      finish(dm, out);
    });
  };
  for (int r = 0; r < 4; ++r) threads.emplace_back(body, r);
  threads[3].join();
  CHECK(res[3].error == "killed");
  // The replacement starts once the others saw rank 3 lost (a restart before that would hide
  // the loss from the transport, leaving it to the op timeout).
  while (!lost) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  res[3] = {};
  restarted = true;
  threads[3] = std::thread(body, 3);
  for (auto& t : threads) t.join();
  for (const auto& x : res) {
    CHECK_MESSAGE(x.error == "", x.error);
    CHECK(x.committed == 12);
    CHECK(x.hash == res[0].hash);
    CHECK(x.outer_steps == res[0].outer_steps);
    CHECK(x.last_quorum == std::vector<int>{0, 1, 2, 3});
  }
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

TEST_CASE("diloco_member: what the membership cannot carry is refused before it starts") {
  inproc_world world(1);
  inproc_communicator c = world.join(0);
  mb::member<inproc_communicator> m(c, test_options());
  std::vector<float> w(8, 1.0f);
  CHECK_THROWS_WITH_AS(glue(m, {ex::tensor_ref(w.data(), w.size())}, ex::make_outer_optimizer("nesterov"),
                            options_for("fixed:4,fragments=2,delay=1")),
                       doctest::Contains("delay=1"), cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(glue(m, {ex::tensor_ref(w.data(), w.size())}, ex::make_outer_optimizer("nesterov"),
                            options_for("fixed:4,codec=int8")),
                       doctest::Contains("set diloco_options::tag lower"), cadence::invalid_parameter_error);
}

}  // namespace
}  // namespace cadence_diloco_membership_test
