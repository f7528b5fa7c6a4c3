// cadence::membership::quorum_group over NCCL (membership/nccl/group.hpp), against the fake NCCL
// (fake_nccl.hpp: ranks are threads, "device" buffers host memory): the membership runs over
// in-process ranks, the syncs' averaging all-reduce over an NCCL communicator built per quorum
// from a unique id the quorum's leader makes and broadcasts over the view. A member lost before
// its NCCL all-reduce (the survivors' NCCL wait fails at the op timeout, as a real NCCL's would:
// it cannot see a lost peer), a member lost after it and before the vote (the survivors' healthy
// communicator is aborted when they re-form, not finalized), and a member lost before its first
// build (the survivors' build fails over the view). Each time: the survivors abort, rebuild with
// a new unique id, retry, and every member's state hash is the same after every commit (the
// ledger). The fake models a lost peer the way NCCL shows one: its operations never complete.
#include <cadence/membership/member.hpp>
#include <cadence/membership/nccl/group.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/protocol.hpp>

#include "fake_nccl.hpp"
#include "membership/group_ranks.hpp"
#include "membership/membership_ranks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace cadence_membership_test {
namespace nccl_group_test {
namespace {

namespace fk = cadence_fake_nccl;
using group = mb::nccl_quorum_group<inproc_communicator>;

enum class when { before_first_build, before_data, after_data };

// Four members sync 8 times over the fake NCCL; `victim` is lost inside sync `at` (`how`): it
// kills its in-process rank, aborts its group and leaves (its NCCL communicator is aborted as
// the group goes). The survivors must re-form on three, rebuild with a new unique id and commit
// every sync with equal hashes.
void lost_in_sync(int victim, std::uint64_t at, when how) {
  CAPTURE(victim);
  CAPTURE(at);
  CAPTURE(static_cast<int>(how));
  fk::world fw;
  const cadence::transport::nccl_api api = fw.api();
  inproc_world world(4);
  ledger book;
  std::atomic<int> in_factory{0};
  const auto res = run_ranks<group_result>(
      world, 4, [&](int rank, inproc_communicator& c, group_result& out) {
        mb::member<inproc_communicator> m(c, test_options());
        replica r(300);
        m.add_state(r.params);
        // "Device" = rank: the fake has 8. Lost before the first build: the victim leaves from
        // inside its first factory call, once the three others are inside theirs (waiting for it
        // over the view), so that their build is what fails.
        auto make = mb::nccl_group_factory(m, api, rank);
        auto g = std::make_unique<group>(m, [&, rank](const mb::group_spec& s) {
          if (how == when::before_first_build && s.size == 4) {
            if (rank != victim) {
              ++in_factory;
            } else {
              const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
              while (in_factory < 3 && std::chrono::steady_clock::now() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
              world.kill(rank);
              throw killed{};
            }
          }
          return make(s);
        }, "cadence-data", mb::buffer_memory::device);
        m.start();
        while (m.committed() < 8) {
          const bool dies = rank == victim && m.committed() + 1 == at;
          sync_once(m, *g, r, book, rank, [&](bool after) {
            if (dies && (after || how == when::before_data)) lose(world, rank, *g);
          });
        }
        finish(m, *g, out);
      });
  const std::vector<int> survivors = check_killed(res, victim, 8);
  int named = 0;  // survivors whose failed build named the victim
  for (int r : survivors) {
    CAPTURE(r);
    const auto& x = res[static_cast<std::size_t>(r)];
    CHECK(x.data_size == 3);
    CHECK(x.device_buffers);
    // Successful builds: on four and on three (before the first build, on three only).
    CHECK_MESSAGE(x.group.builds >= (how == when::before_first_build ? 1u : 2u), "rank ", r, ": the NCCL group was not rebuilt");
    if (how == when::before_first_build) {
      // The first build waited for the victim over the view and failed, naming it.
      CHECK(x.group.build_failures >= 1);
      CHECK_MESSAGE(x.group.last_error.find("building the data communicator") != std::string::npos, x.group.last_error);
      if (x.group.last_error.find("lost rank " + std::to_string(victim)) != std::string::npos) ++named;
    } else {
      CHECK(x.group.build_failures == 0);
    }
    // Before the victim's data call the survivors wait for it in NCCL: only the op timeout can
    // end that wait (NCCL does not see a lost peer), and it must fail their sync.
    if (how == when::before_data) {
      CHECK_MESSAGE(x.group.data_failures >= 1, "rank ", r, ": no NCCL failure seen");
      CHECK_MESSAGE(x.group.last_error.find("ncclCommAbort") != std::string::npos, x.group.last_error);
    }
  }
  // A survivor waiting for the victim's part of the build over the view names it (the others
  // may learn first from a survivor's notice that a member left).
  if (how == when::before_first_build)
    CHECK_MESSAGE(named >= 1, "no survivor's build error names rank ", victim, ": ",
                  res[static_cast<std::size_t>(survivors[0])].group.last_error);
  // Fresh unique ids: one NCCL communicator per quorum built (the fake makes a group per id).
  // Before the first build nothing was built on four; otherwise four, then three.
  CHECK(fw.group_count() == (how == when::before_first_build ? 1u : 2u));
  // Every survivor aborted its communicator on four (the failed or the replaced one), and the
  // three on three were aborted when their groups went: no communicator was finalized.
  std::multiset<int> aborted;
  for (const auto& a : fw.abort_log()) aborted.insert(a.rank);
  if (how != when::before_first_build) {
    for (int r : survivors) CHECK_MESSAGE(aborted.count(r) >= 1, "rank ", r, " never aborted its NCCL communicator");
    CHECK(fw.abort_log().size() >= 4 + 3);
  } else {
    CHECK(fw.abort_log().size() >= 3);
  }
  CHECK(fw.destroyed_count() == 0);
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

TEST_CASE("nccl quorum_group: a member lost before its NCCL all-reduce: the survivors abort, rebuild and retry" *
          doctest::timeout(120)) {
  SUBCASE("rank 2") { lost_in_sync(2, 4, when::before_data); }
  SUBCASE("rank 0 (the leader, who made the unique id)") { lost_in_sync(0, 3, when::before_data); }
}

TEST_CASE("nccl quorum_group: a member lost after its NCCL all-reduce, before the vote: nobody commits without it" *
          doctest::timeout(120)) {
  lost_in_sync(3, 5, when::after_data);
}

TEST_CASE("nccl quorum_group: a member lost before the first build: the build fails naming it, the retry builds on three" *
          doctest::timeout(120)) {
  lost_in_sync(1, 1, when::before_first_build);
}

/// A job of one member over the fake NCCL, with one double as its state.
struct one_member {
  fk::world fw;
  inproc_world world{1};
  inproc_communicator c{world.join(0)};
  mb::member<inproc_communicator> m{c, test_options()};
  double x = 2;
  one_member() { m.add_state(mb::buffer(&x, sizeof x)); }
};

// The factory refuses a spec that is not its member's view; a quorum of one builds, commits,
// and its communicator is aborted when the group goes.
TEST_CASE_FIXTURE(one_member, "nccl quorum_group: the factory's spec and the member's view must agree" *
                                  doctest::timeout(60)) {
  auto make = mb::nccl_group_factory(m, fw.api(), 0);
  auto g = mb::make_nccl_group(m, fw.api(), 0);
  m.start();
  mb::group_spec wrong;
  wrong.quorum_id = 9;
  wrong.rank = 1;
  wrong.size = 2;
  CHECK_THROWS_WITH_AS(make(wrong), doctest::Contains("rank 1 of 2 but the member's view is rank 0 of 1"),
                       cadence::transport_error);
  // A quorum of one: a communicator of one, device buffers, the sum is the value.
  CHECK(g->capabilities().device_buffers);  // declared before anything is built
  const mb::sync_report rep =
      g->transact([&] { g->allreduce(&x, 1, dtype::f64, cadence::transport::reduce_op::sum); }, {mb::buffer(&x, sizeof x)});
  CHECK(rep.outcome == mb::outcome::committed);
  CHECK(x == 2);
  CHECK(g->stats().builds == 1);
  CHECK(g->capabilities().device_buffers);
  g.reset();  // the group goes: its communicator is aborted, not finalized
  CHECK(fw.abort_log().size() == 1);
  CHECK(fw.destroyed_count() == 0);
  m.finish();
}

// A group constructed for host buffers over a factory that builds NCCL communicators (device
// buffers): the first build refuses, naming both, and the member leaves (a configuration error,
// not a fault to retry).
TEST_CASE_FIXTURE(one_member, "nccl quorum_group: a group declared for host buffers refuses the NCCL factory's "
                              "communicator" * doctest::timeout(60)) {
  group g(m, mb::nccl_group_factory(m, fw.api(), 0));  // buffer_memory::host, the default
  CHECK_FALSE(g.capabilities().device_buffers);
  m.start();
  CHECK_THROWS_WITH_AS(
      g.transact([&] { g.allreduce(&x, 1, dtype::f64, cadence::transport::reduce_op::sum); }),
      doctest::Contains("for device buffers, but the group was constructed for host buffers"),
      cadence::invalid_parameter_error);
  // The member left with that reason: its closing sync says so.
  CHECK_THROWS_WITH(m.finish(), doctest::Contains("for device buffers"));
}

}  // namespace
}  // namespace nccl_group_test
}  // namespace cadence_membership_test
