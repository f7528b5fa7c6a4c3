// Tests of an admission followed by the leader's loss (issue 36): a quorum that admitted a
// newcomer and lost its leader before its first commit. The confirming collective that ends an
// admission (detail/core.hpp, confirm) proves that every member took the new quorum up, so the
// survivors are counted against it and go on; a loss inside that collective is the window left
// (docs/collective.md, the split-brain rule). Ranks are threads of an in-process world.
#include <cadence/membership/member.hpp>
#include <cadence/transport/inproc.hpp>

#include "membership/membership_ranks.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace cadence_leader_loss_test {
namespace {

using namespace cadence_membership_test;

// Where the leader (rank 0) dies.
enum class loss {
  after_admission,   // right after the sync that admitted the newcomer returned: before the next commit
  in_confirmation,   // as it begins the admission's confirming collective: before it sends anything
};

// What a rank did (rank_result), and whether it stopped with quorum_error (by the split-brain
// rule).
struct result : rank_result {
  bool quorum_error = false;
};

// n ranks commit 3 syncs; rank n-1 is killed and the other n-1 commit a sync without it (the
// last committed quorum: {0..n-2}); a new process in slot n-1 joins and is admitted; rank 0,
// the leader, dies where `where` says. Returns each rank's result (the newcomer's in slot n-1).
std::vector<result> leader_loss(int n, loss where, ledger& book) {
  const int slot = n - 1;
  inproc_world world(n);
  restarted_rank newcomer(n, slot);
  std::atomic<bool> shrunk{false};
  auto body = [&](int rank, result& out) {
    try {
      auto o = test_options();
      o.transfer_bytes = 4096;
      if (rank == 0 && where == loss::in_confirmation)
        o.on_event = [&world](const std::string& line) {
          // Only the admission's confirming collective: the first quorum confirms none.
          if (line.find(": confirming quorum") != std::string::npos) {
            world.kill(0);
            throw killed{};
          }
        };
      replica r(3000);
      // The new process in the slot starts once the others committed a sync without it.
      if (rank == slot && newcomer.restarted()) await([&] { return shrunk.load(); }, "a commit without the killed slot");
      // 3 syncs before the kill; 4 more after the admission.
      newcomer.live(world, rank, o, r, book, 3, 4, out, [](mb::member<inproc_communicator>&) {},
                    [&](mb::member<inproc_communicator>& m) {
                      // A commit without the slot: the last committed quorum is {0..n-2}.
                      while (m.current().contains(slot)) sync_once(m, r, book, rank);
                      run_syncs(m, r, book, m.committed() + 1, rank);
                      shrunk = true;
                      // Syncs until the newcomer is admitted (it asks once restarted: waited for,
                      // so the test does not depend on how fast its thread starts).
                      newcomer.admit(m, [&] { sync_once(m, r, book, rank); });
                      if (rank == 0) {
                        // Admitted, confirmed, and not one sync of the new quorum committed yet.
                        world.kill(0);
                        throw killed{};
                      }
                    });
    } catch (const mb::quorum_error&) {
      out.quorum_error = true;  // the job stopped, by the split-brain rule
      throw;
    }
  };
  auto res = newcomer.run<result>(body);
  REQUIRE_MESSAGE(shrunk.load(), "the members never committed a sync without rank ", slot);
  return res;
}

// The survivors (ranks 1..n-1, the newcomer included) went on without rank 0 to the same
// count with the same state.
void check_went_on(const std::vector<result>& res, const ledger& book) {
  check_killed(res, 0, res[1].committed);
  CHECK(res[1].committed >= 8);  // 3, one without the slot, the admission's, then 4 more
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

TEST_CASE("membership: the leader lost right after an admission leaves the rest going on (issue 36)" *
          doctest::timeout(120)) {
  // {0, 1} committed; 2 admitted; 0 lost: {1, 2} are 2 of the 3 that took the new quorum up
  // (its confirming collective proves it), only 1 of the last committed quorum {0, 1}.
  ledger book;
  check_went_on(leader_loss(3, loss::after_admission, book), book);
}

TEST_CASE("membership: the leader of a larger quorum lost right after an admission" * doctest::timeout(120)) {
  // {0, 1, 2} committed; 3 admitted; 0 lost: {1, 2, 3} hold a majority of either quorum.
  ledger book;
  check_went_on(leader_loss(4, loss::after_admission, book), book);
}

TEST_CASE("membership: the leader lost in the admission's confirming collective stops the job without divergence" *
          doctest::timeout(120)) {
  // The window left: nobody completed the confirming collective, so nothing proves that every
  // member took {0, 1, 2} up, and {1, 2} hold only 1 of the last committed quorum {0, 1}. Both
  // survivors stop with quorum_error (neither hangs, neither goes on alone).
  ledger book;
  const auto res = leader_loss(3, loss::in_confirmation, book);
  CHECK(res[0].error == "killed");
  for (int r : {1, 2}) {
    const result& x = res[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(x.quorum_error, "rank ", r, ": ", x.error);
  }
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

TEST_CASE("membership: the leader of a larger quorum lost in the admission's confirming collective" *
          doctest::timeout(120)) {
  // {1, 2, 3} hold 2 of the last committed quorum {0, 1, 2}: they go on without the proof.
  ledger book;
  check_went_on(leader_loss(4, loss::in_confirmation, book), book);
}

TEST_CASE("membership: a process admitted in the closing sync gets the state, with no confirming collective" *
          doctest::timeout(120)) {
  // Three members sync; a fourth process asks to join before they call finish(), whose closing
  // sync admits it. The members leave once that sync is done, so its admission runs no
  // confirming collective: one completed by some, who then left, and failed on others would
  // leave those to re-form alone and stop (the commit that added flag_closing).
  constexpr int joiner = 3;
  inproc_world world(4);
  ledger book;
  std::atomic<int> synced{0};
  std::atomic<bool> asked{false};
  std::string joiner_finish;  // what the joiner's finish() threw
  std::uint64_t joiner_committed = 0;
  const auto res = run_ranks(world, 4, [&](int rank, inproc_communicator& c, rank_result& out) {
    auto o = short_options();
    o.on_event = [&out, &asked, rank](const std::string& line) {
      out.events.push_back(line);
      if (rank == joiner && line.find(": asked to join") != std::string::npos) asked = true;
    };
    replica r(3000);
    if (rank == joiner) {
      // A process started once the three have synced.
      await([&] { return synced == 3; }, "the three members' syncs");
      mb::member<inproc_communicator> m(c, o);
      register_state(m, r);
      r.params.assign(r.params.size(), -7.0);  // overwritten by the quorum's state
      m.join();
      joiner_committed = m.committed();
      out.hash = m.state_hash();
      out.last_quorum = m.current().ranks;
      // The others left after the closing sync: a sync of this member alone must end, naming why.
      try {
        m.finish();
      } catch (const mb::quorum_error& e) {
        joiner_finish = e.what();
      }
      return;
    }
    mb::member<inproc_communicator> m(c, o);
    register_state(m, r);
    m.start();
    run_syncs(m, r, book, 3, rank);
    ++synced;
    // The joiner's request has been sent to every member (inproc delivers it at once), so the
    // closing sync's first collective sees it: the closing sync admits it.
    await([&] { return asked.load(); }, "the joiner's request");
    finish(m, out);
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(res[static_cast<std::size_t>(r)].error == "", res[static_cast<std::size_t>(r)].error);
    CHECK(res[static_cast<std::size_t>(r)].committed == 3);
    CHECK(res[static_cast<std::size_t>(r)].hash == res[0].hash);
    CHECK(res[static_cast<std::size_t>(r)].last_quorum == std::vector<int>{0, 1, 2, 3});
  }
  for (int r = 0; r < 4; ++r)
    for (const std::string& line : res[static_cast<std::size_t>(r)].events) {
      CAPTURE(r);
      CHECK_MESSAGE(line.find("confirming quorum") == std::string::npos, line);
    }
  const rank_result& j = res[joiner];
  CHECK_MESSAGE(j.error == "", j.error);
  CHECK(joiner_committed == 4);  // the three syncs and the closing one
  CHECK(j.hash == res[0].hash);
  CHECK(j.last_quorum == std::vector<int>{0, 1, 2, 3});
  CHECK_MESSAGE(joiner_finish.find("only rank 3 of quorum") != std::string::npos,
                "the joiner's finish() with the others gone: ", joiner_finish);
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

}  // namespace
}  // namespace cadence_leader_loss_test
