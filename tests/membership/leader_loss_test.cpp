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
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cadence_leader_loss_test {
namespace {

namespace mb = cadence::membership;
using cadence::transport::dtype;
using cadence::transport::inproc_communicator;
using cadence::transport::inproc_world;
using cadence_membership_test::killed;
using cadence_membership_test::ledger;

// A replica: parameters stepped per rank and per count (a sync that did not happen, or happened
// twice, shows in the hash), and a step counter sent as a blob.
struct replica {
  std::vector<double> params;
  std::uint64_t steps = 0;
  replica() : params(3000, 1.0) {}
  void step(int rank, std::uint64_t salt) {
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i] += 0.001 * static_cast<double>((rank + 1) * static_cast<int>(i % 7 + 1)) + 1e-6 * static_cast<double>(salt);
    ++steps;
  }
  void add_to(mb::member<inproc_communicator>& m) {
    m.add_state(params);
    m.add_state(
        "steps",
        [this] {
          std::vector<unsigned char> out(sizeof steps);
          std::memcpy(out.data(), &steps, sizeof steps);
          return out;
        },
        [this](const std::vector<unsigned char>& in) {
          REQUIRE(in.size() == sizeof steps);
          std::memcpy(&steps, in.data(), sizeof steps);
        });
  }
};

// One averaging sync; a commit goes to the ledger.
void sync_once(mb::member<inproc_communicator>& m, replica& r, ledger& book, int rank) {
  r.step(rank, m.committed());
  const mb::sync_report rep =
      m.transact([&] { m.view().allreduce_average(r.params.data(), r.params.size(), dtype::f64); }, {r.params});
  if (rep.outcome == mb::outcome::committed) book.record(rank, m.committed(), m.state_hash());
}

void syncs_to(mb::member<inproc_communicator>& m, replica& r, ledger& book, std::uint64_t target, int rank) {
  while (m.committed() < target) sync_once(m, r, book, rank);
}

// Waits until `done()`; throws after a minute (a hang's bound, not a timing assumption).
template <class F>
void await(F&& done, const char* what) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) throw std::runtime_error(std::string("timed out waiting for ") + what);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Where the leader (rank 0) dies.
enum class loss {
  after_admission,   // right after the sync that admitted the newcomer returned: before the next commit
  in_confirmation,   // as it begins the admission's confirming collective: before it sends anything
};

struct result {
  std::string error;         // what escaped the rank's body ("killed" for the victim)
  bool quorum_error = false;  // it was a quorum_error (the job stopped, by the split-brain rule)
  std::uint64_t committed = 0;
  std::uint64_t hash = 0;
  std::vector<int> last_quorum;
};

// n ranks commit 3 syncs; rank n-1 is killed and the other n-1 commit a sync without it (the
// last committed quorum: {0..n-2}); a new process in slot n-1 joins and is admitted; rank 0,
// the leader, dies where `where` says. Returns each rank's result (the newcomer's in slot n-1).
std::vector<result> leader_loss(int n, loss where, ledger& book) {
  const int slot = n - 1;
  inproc_world world(n);
  std::atomic<bool> restarted{false}, asked{false}, shrunk{false};
  std::atomic<std::uint64_t> old_nonce{0}, final_target{0};
  std::vector<result> res(static_cast<std::size_t>(n));
  auto admitted = [&](const mb::member<inproc_communicator>& m) {
    const int i = m.current().index_of(slot);
    return i >= 0 && m.current().nonces[static_cast<std::size_t>(i)] != old_nonce;
  };
  auto body = [&](int rank) {
    result& out = res[static_cast<std::size_t>(rank)];
    try {
      auto o = cadence_membership_test::test_options();
      o.transfer_bytes = 4096;
      if (rank == 0 && where == loss::in_confirmation)
        o.on_event = [&world](const std::string& line) {
          // Only the admission's confirming collective: the first quorum confirms none.
          if (line.find(": confirming quorum") != std::string::npos) {
            world.kill(0);
            throw killed{};
          }
        };
      replica r;
      if (rank == slot && restarted) {
        inproc_communicator c = world.restart(slot);
        mb::member<inproc_communicator> m(c, o);
        r.add_to(m);
        r.params.assign(r.params.size(), -7.0);  // overwritten by the quorum's state
        asked = true;
        m.join();
        final_target = m.committed() + 4;
        syncs_to(m, r, book, final_target, rank);
        m.finish();
        out.committed = m.committed() - 1;
        out.hash = m.state_hash();
        out.last_quorum = m.current().ranks;
        return;
      }
      inproc_communicator c = world.join(rank);
      mb::member<inproc_communicator> m(c, o);
      r.add_to(m);
      m.start();
      syncs_to(m, r, book, 3, rank);
      if (rank == slot) {
        old_nonce = m.nonce();
        world.kill(slot);
        throw killed{};
      }
      // A commit without the slot: the last committed quorum is {0..n-2}.
      while (m.current().contains(slot)) sync_once(m, r, book, rank);
      syncs_to(m, r, book, m.committed() + 1, rank);
      shrunk = true;
      // Syncs until the newcomer is admitted (it asks once restarted: waited for, so the test does
      // not depend on how fast its thread starts).
      while (!admitted(m)) {
        await([&] { return asked.load(); }, "the newcomer's request");
        REQUIRE(m.committed() < 100000);
        sync_once(m, r, book, rank);
      }
      if (rank == 0) {
        // Admitted, confirmed, and not one sync of the new quorum committed yet.
        world.kill(0);
        throw killed{};
      }
      await([&] { return final_target != 0; }, "the newcomer's admission");
      syncs_to(m, r, book, final_target, rank);
      m.finish();
      out.committed = m.committed() - 1;
      out.hash = m.state_hash();
      out.last_quorum = m.current().ranks;
    } catch (const killed&) {
      out.error = "killed";
    } catch (const mb::quorum_error& e) {
      out.error = e.what();
      out.quorum_error = true;
    } catch (const std::exception& e) {
      out.error = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  threads[static_cast<std::size_t>(slot)].join();
  CHECK(res[static_cast<std::size_t>(slot)].error == "killed");
  res[static_cast<std::size_t>(slot)] = {};
  bool went_on = true;
  try {
    await([&] { return shrunk.load(); }, "a commit without the killed slot");
  } catch (const std::exception&) {
    went_on = false;  // the members' own waits end them
  }
  restarted = true;
  if (went_on) threads[static_cast<std::size_t>(slot)] = std::thread(body, slot);
  for (auto& t : threads)
    if (t.joinable()) t.join();
  REQUIRE_MESSAGE(went_on, "the members never committed a sync without rank ", slot);
  return res;
}

// The survivors (ranks 1..n-1, the newcomer included) went on without rank 0 to the same
// count with the same state.
void check_went_on(const std::vector<result>& res, const ledger& book) {
  const int n = static_cast<int>(res.size());
  std::vector<int> survivors;
  for (int r = 1; r < n; ++r) survivors.push_back(r);
  CHECK(res[0].error == "killed");
  for (int r : survivors) {
    const result& x = res[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(x.error == "", "rank ", r, ": ", x.error);
    CHECK(x.committed == res[1].committed);
    CHECK(x.hash == res[1].hash);
    CHECK(x.last_quorum == survivors);
  }
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
  namespace t = cadence_membership_test;
  constexpr int joiner = 3;
  inproc_world world(4);
  ledger book;
  std::atomic<int> synced{0};
  std::atomic<bool> asked{false};
  std::string joiner_finish;  // what the joiner's finish() threw
  std::uint64_t joiner_committed = 0;
  const auto res = t::run_ranks(world, 4, [&](int rank, inproc_communicator& c, t::rank_result& out) {
    auto o = t::short_options();
    o.on_event = [&out, &asked, rank](const std::string& line) {
      out.events.push_back(line);
      if (rank == joiner && line.find(": asked to join") != std::string::npos) asked = true;
    };
    t::replica r(3000);
    if (rank == joiner) {
      // A process started once the three have synced.
      REQUIRE(t::wait_for([&] { return synced == 3; }, std::chrono::seconds(60)));
      mb::member<inproc_communicator> m(c, o);
      t::register_state(m, r);
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
    t::register_state(m, r);
    m.start();
    t::run_syncs(m, r, book, 3, rank);
    ++synced;
    // The joiner's request has been sent to every member (inproc delivers it at once), so the
    // closing sync's first collective sees it: the closing sync admits it.
    REQUIRE(t::wait_for([&] { return asked.load(); }, std::chrono::seconds(60)));
    t::finish(m, out);
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
  const t::rank_result& j = res[joiner];
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
