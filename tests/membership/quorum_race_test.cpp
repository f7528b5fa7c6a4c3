// The quorum rule under the races the chaos soak found (docs/collective.md, "Chaos soak"), driven
// step by step over in-process ranks: a leader stopped while a member's request is on its way
// to it, then resumed (it forms a quorum with the same id as the one the others formed without
// it, and must stop with quorum_error instead of going on alone), and a sync committed by a
// follower in a new quorum but not by its leader (that commit confirms the new quorum, so the
// next reconfiguration measures against it: seed 3, trial 19). Every commit goes to a ledger; a
// count with two hashes fails the test.
//
// The in-process transport sees a rank lost only when it is killed; a stopped process is seen
// lost by its peers' heartbeats, one peer at a time. `sight` gives each rank its own list of the
// peers it counts as lost (the communicator's peer_lost() extension), so a test decides who sees
// the stopped leader gone, and when.
#include <cadence/membership/detail/collective.hpp>
#include <cadence/membership/detail/frames.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/transport/inproc.hpp>

#include "membership/membership_ranks.hpp"
#include "membership/sight.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cadence_membership_test {
namespace race_test {
namespace {

// Seed 1, trial 18 of the chaos soak, step by step. Four members commit 3 syncs; then rank 0,
// the leader, stops between syncs (as under SIGSTOP): ranks 1 and 2 see it lost at once, rank 3
// only after its request for the next quorum has gone to rank 0. The three re-form as
// quorum 2 {1, 2, 3} and commit sync 4 and 5. Then rank 0 resumes, seeing them gone (their
// heartbeats stopped while it was stopped): it finds rank 3's request, forms {0, 3} (half of
// {0, 1, 2, 3} with its leader) under the same id 2, its sync there fails (rank 3 is elsewhere),
// and it measures {0} against the quorum of the last commit, {0, 1, 2, 3}: quorum_error.
// Measured against its last quorum alone ({0, 3}, of which {0} is half with the leader) it
// would go on by itself and commit syncs 4-8 beside the majority: the divergence this test
// fails on.
// Two quorums with id 2 and rank 3 in both: rank 0 sees rank 3 again once it formed {0, 3}, so
// when that quorum's sync fails it tells rank 3 it left "quorum 2". The majority waits for that
// abort before its sync 6; it names rank 0's quorum 2 (its stamp), not theirs, so their syncs go
// on without another failure. (Before quorums had stamps, rank 3 took it for its own quorum's,
// failed sync 6 and the three re-formed for nothing.)
TEST_CASE("membership: a leader stopped with a member's request on its way, then resumed, stops with quorum_error") {
  inproc_world world(4);
  sight s;
  ledger book;
  std::mutex mu;
  std::atomic<int> reformed{0};
  std::atomic<bool> armed{false}, request_caught{false}, stale_abort{false};
  const int control = test_options().tag_base;  // tags::control()
  s.after_send = [&](int from, const void* buf, std::size_t bytes, int to, int tag) {
    if (tag != control || bytes != sizeof(mb::detail::frame)) return;
    mb::detail::frame f;
    std::memcpy(&f, buf, sizeof f);
    if (from == 0 && to == 3 && f.kind == mb::detail::frame_kind::abort && f.qid == 2) stale_abort = true;
    if (!armed || from != 3 || to != 0 || f.kind != mb::detail::frame_kind::request) return;
    // Rank 3's request is in rank 0's queue; now rank 3's heartbeat tier sees rank 0 gone, and
    // rank 0 (stopped) will not hear from rank 3 again either.
    armed = false;
    s.cut(3, 0);
    request_caught = true;
  };
  const auto res = run_ranks(world, 4, s, [&](int rank, seeing_communicator& c, rank_result& out) {
    auto o = race_options(out, mu, [&, rank](const std::string& line) {
      if (rank != 0 && line.find("quorum 2 {1, 2, 3} after quorum 1 {0, 1, 2, 3}") != std::string::npos) ++reformed;
      if (rank == 0 && line.find("quorum 2 {0, 3} after") != std::string::npos) s.show(0, 3);
    });
    member_t m(c, o);
    replica r(40);
    start_syncing(m, r, book, 3, rank);
    if (rank == 0) {
      // Stopped: the others' sync 4 waits for it past the op timeout.
      s.hide(1, 0);
      s.hide(2, 0);
      armed = true;
      REQUIRE_MESSAGE(wait_for([&] { return reformed == 3; }, std::chrono::seconds(60)),
                      "ranks 1-3 never re-formed as quorum 2 {1, 2, 3}");
      // Resumed: ranks 1 and 2 went silent meanwhile.
      s.hide(0, 1);
      s.hide(0, 2);
      run_syncs(m, r, book, 8, rank);  // quorum_error expected
      out.committed = m.committed();
      return;
    }
    run_syncs(m, r, book, 5, rank);
    REQUIRE_MESSAGE(wait_for([&] { return bool(stale_abort); }, std::chrono::seconds(60)),
                    "rank 0 never told rank 3 it left its quorum 2 {0, 3}");
    run_syncs(m, r, book, 8, rank);
    finish(m, out);
  });
  CHECK(request_caught);
  // The race happened: two quorums with id 2, rank 3 in both.
  CHECK_MESSAGE(any_event(res[0], mu, "quorum 2 {0, 3} after quorum 1 {0, 1, 2, 3}"), events_of(res[0], mu));
  // The resumed leader stopped, naming the rule, after no commit past the 3 it shared.
  const std::string& e0 = res[0].error;
  CHECK_MESSAGE(e0.find("must not go on alone") != std::string::npos, e0);
  CHECK_MESSAGE(e0.find("the quorum of the last commit") != std::string::npos, e0);
  CHECK(book.last(0) == 3);
  for (int r : {1, 2, 3}) {
    const auto& x = res[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(x.error == "", "rank ", r, ": ", x.error);
    CHECK(x.committed == 8);
    CHECK(x.hash == res[1].hash);
    CHECK(x.last_quorum == std::vector<int>{1, 2, 3});
    // One failed sync (rank 0's stop) and one reconfiguration after the first: rank 0's abort of
    // its own quorum 2 failed none of theirs.
    CHECK_MESSAGE(x.stats.failed_syncs == 1, "rank ", r, "\n", events_of(x, mu));
    CHECK(x.stats.reconfigurations == 2);
  }
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

// Seed 3, trial 19 of the chaos soak: a sync committed in a new quorum by a follower but not by
// the leader. Rank 1 dies after sync 3; the others re-form as quorum 2 {0, 2, 3} and run sync 4
// again (a ring all-reduce, so each member receives from one neighbour only). Rank 0's last ring
// message to rank 2 is held back (a slow link), so ranks 0 and 3 complete sync 4 and rank 2
// does not; then rank 0 dies. Rank 2 leads the next reconfiguration knowing no commit of its own
// in quorum 2, but rank 3 reports one: quorum 2 is confirmed, and {2, 3} (two of its three)
// may succeed it. Measured against quorum 1 {0, 1, 2, 3}, the last one rank 2 itself committed
// in, {2, 3} would be half without the leader, and the job would stop with quorum_error.
TEST_CASE("membership: a sync committed by a follower but not by the leader confirms the new quorum") {
  inproc_world world(4);
  ledger book;
  std::mutex mu;
  std::vector<int> victim_quorum;
  sight nobody_hidden;  // faults here are kills, which the transport reports itself
  const int ring_tag = mb::detail::tags{test_options().tag_base}.op(2, 0);
  const auto res = run_ranks(world, 4, nobody_hidden, [&](int rank, seeing_communicator& c, rank_result& out) {
    member_t m(c, race_options(out, mu));
    replica r(20000);  // 160 KB: the ring, one piece per segment among three members
    start_syncing(m, r, book, 3, rank);
    if (rank == 1) {
      world.kill(1);
      throw killed{};
    }
    if (rank == 0) {
      // Quorum 2's first operation (sync 4 again) on rank 0, which sends to rank 2 (its right
      // neighbour) a notice and four ring steps: the last one arrives a minute late.
      cadence::transport::inproc_step at;
      at.op = "send";
      at.peer = 2;
      at.tag = ring_tag;
      at.skip = 4;
      world.on_step(0, at, [](inproc_world& w) { w.delay_link(0, 2, std::chrono::seconds(60)); });
      run_syncs(m, r, book, 4, rank);
      victim_quorum = m.current().ranks;
      world.kill(0);
      throw killed{};
    }
    run_syncs(m, r, book, 8, rank);
    finish(m, out);
  });
  CHECK(res[0].error == "killed");
  CHECK(res[1].error == "killed");
  // Ranks 0 and 3 committed sync 4 in quorum 2, rank 2 did not (it was behind, and received
  // the state).
  CHECK(victim_quorum == std::vector<int>{0, 2, 3});
  CHECK(book.committed_in(0, 4, {0, 2, 3}));
  CHECK(book.committed_in(3, 4, {0, 2, 3}));
  CHECK_MESSAGE(!book.committed_at(2, 4), "rank 2 committed sync 4");
  CHECK(res[2].stats.healed >= 1);
  for (int r : {2, 3}) {
    const auto& x = res[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(x.error == "", "rank ", r, ": ", x.error, "\n", events_of(x, mu));
    CHECK(x.committed == 8);
    CHECK(x.hash == res[2].hash);
    CHECK(x.last_quorum == std::vector<int>{2, 3});
  }
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

// Two members that took up different quorums with the same id (a newcomer admitted by two
// leaders in a race, and a member of both that took up the other) post the same tags to each
// other: the notice at the head of every collective names the quorum's stamp, so each fails
// its sync (a transport_error: the member re-forms) instead of reducing the other quorum's
// data, or leaving as if the application had called another collective (op_mismatch).
TEST_CASE("membership: a collective's message from another quorum with the same id fails the sync, not the member") {
  inproc_world world(2);
  std::vector<std::string> errors(2);
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      inproc_communicator c = world.join(rank);
      std::vector<double> data(40, 1.0 + rank);
      mb::detail::notice n;
      n.qid = 2;
      n.stamp = rank == 0 ? 0x1111 : 0x2222;  // each took up another leader's quorum 2
      n.txn = 4;
      n.from = rank;
      n.count = data.size();
      n.type = static_cast<std::uint8_t>(dtype::f64);
      n.rop = static_cast<std::uint8_t>(cadence::transport::reduce_op::sum);
      mb::detail::p2p_collective<inproc_communicator>::params p;
      p.buf = data.data();
      p.count = data.size();
      p.type = dtype::f64;
      mb::detail::p2p_collective<inproc_communicator> op(c, {0, 1}, rank, 1000, 0, n, p);
      try {
        op.start();
        if (!wait_for([&] { return op.advance(); }, std::chrono::seconds(60)))
          errors[static_cast<std::size_t>(rank)] = "hung";
        else
          errors[static_cast<std::size_t>(rank)] = "completed";
      } catch (const mb::detail::op_mismatch& e) {
        ++mismatches[static_cast<std::size_t>(rank)];
        errors[static_cast<std::size_t>(rank)] = e.what();
      } catch (const cadence::transport_error& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(mismatches[static_cast<std::size_t>(r)] == 0);
    CHECK_MESSAGE(errors[static_cast<std::size_t>(r)].find("a message of another quorum 2") != std::string::npos,
                  errors[static_cast<std::size_t>(r)]);
  }
}

}  // namespace
}  // namespace race_test
}  // namespace cadence_membership_test
