// cadence::membership::quorum_group over gloo (membership/gloo/group.hpp): the membership runs over
// in-process ranks (threads), the syncs' all-reduces over a gloo communicator re-made per quorum
// through one TCP store the test serves for the whole job. A member lost inside a sync (before
// or after its data call, small and ring all-reduces), a restarted rank admitted with the group
// rebuilt around it, a member stalled inside a sync, and a build that fails because a member
// never arrives. Every member records (committed count, state hash) in a ledger; a count with
// two hashes is a divergent commit.
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/membership/gloo/group.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/transport/gloo/communicator.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/tcp_store.hpp>

#include "membership/group_ranks.hpp"
#include "membership/membership_ranks.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace cadence_membership_test {
namespace {

using cadence::transport::gloo_communicator;
using cadence::transport::gloo_options;
using cadence::transport::job_secret;
using cadence::transport::tcp_store_options;
using cadence::transport::tcp_store_server;
using cadence::transport_error;

using group = mb::gloo_quorum_group<inproc_communicator>;

tcp_store_options store_options() {
  static const job_secret secret = job_secret::generate();
  tcp_store_options o;
  o.secret = secret;
  return o;
}

/// The job's rendezvous: a store that outlives every rank (as a launcher's would).
gloo_options data_options(const tcp_store_server& store) {
  gloo_options o;
  o.rendezvous = store.address();
  o.store = store_options();
  return o;
}

/// A job of n ranks syncing over gloo groups: its rendezvous (the store every quorum's group
/// meets at), the ranks' in-process world and the ledger of their commits.
struct gloo_job {
  tcp_store_server store{"127.0.0.1:0", store_options()};
  inproc_world world;
  ledger book;
  explicit gloo_job(int n) : world(n) {}
  /// body(rank, comm, result) on a thread per rank (run_ranks()).
  template <class Body>
  std::vector<group_result> run(Body body) {
    return run_ranks<group_result>(world, world.size(), std::move(body));
  }
  /// A gloo group for member `m`, built at this job's rendezvous.
  std::unique_ptr<group> group_of(mb::member<inproc_communicator>& m) const {
    return mb::make_gloo_group(m, data_options(store));
  }
};

// A member lost inside sync `at`: it closes its communicators (the in-process one killed, the
// gloo one aborted and destroyed) before or after its own all-reduce. The survivors' gloo call
// (or their vote) fails, they re-form, rebuild the gloo group on three and retry the sync.
void lost_in_sync(int victim, std::uint64_t at, bool after_data, std::size_t elements) {
  CAPTURE(victim);
  CAPTURE(after_data);
  CAPTURE(elements);
  gloo_job job(4);
  const auto res = job.run([&](int rank, inproc_communicator& c, group_result& out) {
    mb::member<inproc_communicator> m(c, test_options());
    replica r(elements);
    m.add_state(r.params);
    auto g = job.group_of(m);
    m.start();
    while (m.committed() < 10) {
      const bool dies = rank == victim && m.committed() + 1 == at;
      sync_once(m, *g, r, job.book, rank, [&](bool after) {
        if (dies && (after || !after_data)) lose(job.world, rank, *g);
      });
    }
    finish(m, *g, out);
  });
  const std::vector<int> survivors = check_killed(res, victim, 10);
  for (int r : survivors) {
    CAPTURE(r);
    const auto& x = res[static_cast<std::size_t>(r)];
    CHECK(x.data_size == 3);
    CHECK_MESSAGE(x.group.builds >= 2, "rank ", r, ": the gloo group was not rebuilt");
    CHECK(x.group.build_failures == 0);
    // Before the victim's data call, the survivors wait for it in gloo: only gloo's failure
    // (its connections closed) can wake them, and it must fail their sync.
    if (!after_data) CHECK_MESSAGE(x.group.data_failures >= 1, "rank ", r, ": no gloo failure seen");
  }
  CHECK_MESSAGE(job.book.divergent().empty(), job.book.describe_divergent());
}

TEST_CASE("quorum_group: a member lost before its gloo all-reduce: the survivors rebuild the group and retry" *
          doctest::timeout(120)) {
  SUBCASE("small all-reduce, rank 2") { lost_in_sync(2, 4, false, 500); }
  SUBCASE("ring all-reduce, rank 0 (the leader)") { lost_in_sync(0, 4, false, 20000); }
}

TEST_CASE("quorum_group: a member lost after its gloo all-reduce, before the vote: nobody commits without it" *
          doctest::timeout(120)) {
  SUBCASE("small all-reduce, rank 3") { lost_in_sync(3, 5, true, 500); }
  SUBCASE("ring all-reduce, rank 1") { lost_in_sync(1, 5, true, 20000); }
}

// A member that stops inside a sync without closing anything (alive to both transports, not
// calling): the others' gloo all-reduce fails at the op timeout (the group bounds gloo's wait by
// it), they re-form without it and go on over a rebuilt gloo group; resumed, it finds its gloo
// group gone and either stops or is admitted back with the state.
TEST_CASE("quorum_group: a member stalled before its gloo all-reduce is left out at the op timeout" *
          doctest::timeout(120)) {
  constexpr int stalled = 2;
  gloo_job job(4);
  std::atomic<bool> reformed{false}, released{false};
  std::thread resumer([&] {
    while (!reformed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    job.world.resume(stalled);
    released = true;
  });
  const auto res = job.run([&](int rank, inproc_communicator& c, group_result& out) {
    auto o = short_options();  // op 1 s, quorum 2 s
    if (rank == 0) o.on_event = flag_on(reformed, "lost rank 2");
    mb::member<inproc_communicator> m(c, o);
    replica r(500);
    m.add_state(r.params);
    auto g = job.group_of(m);
    m.start();
    while (m.committed() < 8) {
      const bool stops = rank == stalled && m.committed() + 1 == 3;
      sync_once(m, *g, r, job.book, rank, [&](bool after) {
        if (!stops || after) return;
        job.world.stall(rank);  // its control frames wait too, as a stopped process's
        while (!released) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
    }
    finish(m, *g, out);
  });
  resumer.join();
  // Resumed, it either stops (the quorum went on without it: whichever refusal it meets first)
  // or, its failed sync taking it into the reconfiguration as a member left behind, is admitted
  // again and healed: then it ends as the others do.
  check_stalled(res, stalled, 8);
  for (int r : {0, 1, 3})
    CHECK_MESSAGE(res[static_cast<std::size_t>(r)].group.data_failures >= 1, "rank ", r,
                  ": gloo's wait did not fail at the op timeout");
  CHECK_MESSAGE(job.book.divergent().empty(), job.book.describe_divergent());
}

// The exchange adapters on the group unchanged: periodic averaging (blocking all-reduces) and
// the bucketed all-reducer (iallreduce and its work handles), a member lost at a sync point.
TEST_CASE("quorum_group: periodic averaging and the bucketed all-reducer over the gloo group survive a lost member" *
          doctest::timeout(120)) {
  for (int adapter = 0; adapter < 2; ++adapter) {
    CAPTURE(adapter);
    constexpr int victim = 1;
    gloo_job job(3);
    const auto res = job.run([&](int rank, inproc_communicator& c, group_result& out) {
      mb::member<inproc_communicator> m(c, test_options());
      replica r(40000);
      std::vector<double> grad(r.params.size());
      m.add_state(r.params);
      auto g = job.group_of(m);
      m.start();
      cadence::exchange::periodic_averager<group> avg(*g, 2);
      cadence::exchange::bucketed_allreducer_options bo;
      bo.bucket_bytes = 64 * 1024;
      cadence::exchange::bucketed_allreducer<group> bsp(*g, bo);
      bsp.add(grad.data(), grad.size());
      while (m.committed() < 8) {
        const bool dies = rank == victim && m.committed() + 1 == 4;
        auto die = [&] {
          if (dies) lose(job.world, rank, *g);
        };
        mb::sync_report rep;
        if (adapter == 0) {
          r.local_step(rank, m.committed());
          if (!avg.step_done()) continue;
          rep = g->transact(
              [&] {
                die();
                avg.sync({cadence::exchange::tensor_ref(r.params.data(), r.params.size())});
              },
              {r.params});
          if (rep.outcome != mb::outcome::committed) avg.restart_period();
        } else {
          for (std::size_t i = 0; i < grad.size(); ++i)
            grad[i] = r.params[i] * 1e-3 + 1e-4 * static_cast<double>(rank + 1);
          rep = g->transact(
              [&] {
                die();
                bsp.finish();
              },
              {}, mb::on_loss::discard);
          if (rep.outcome == mb::outcome::committed)
            for (std::size_t i = 0; i < grad.size(); ++i) r.params[i] -= grad[i];
        }
        if (rep.outcome == mb::outcome::committed) job.book.record(rank, m);
      }
      finish(m, *g, out);
    });
    check_killed(res, victim, 8);  // survivors {0, 2}
    for (int r : {0, 2}) CHECK_MESSAGE(res[static_cast<std::size_t>(r)].data_size == 2, "rank ", r);
    CHECK_MESSAGE(job.book.divergent().empty(), job.book.describe_divergent());
  }
}

// A rank killed between syncs comes back as a new process: it joins, is admitted at a sync point
// with the state, and the next sync builds the gloo group on all three again.
TEST_CASE("quorum_group: a restarted rank is admitted and the gloo group is rebuilt with it" * doctest::timeout(120)) {
  constexpr int n = 3, victim = 2;
  tcp_store_server store("127.0.0.1:0", store_options());
  inproc_world world(n);
  ledger book;
  restarted_rank job(n, victim);
  const auto res = job.run<group_result>([&](int rank, group_result& out) {
    replica r(3000);
    if (rank == victim && job.restarted()) {
      inproc_communicator c = world.restart(victim);
      mb::member<inproc_communicator> m(c, test_options());
      m.add_state(r.params);
      auto g = mb::make_gloo_group(m, data_options(store));
      r.params.assign(r.params.size(), -7.0);  // overwritten by the quorum's state
      job.asking();
      m.join();
      CHECK(m.current().size() == 3);
      job.admitted(m.committed() + 3);
      run_syncs(m, *g, r, book, job.target(), rank);
      finish(m, *g, out);
      return;
    }
    inproc_communicator c = world.join(rank);
    mb::member<inproc_communicator> m(c, test_options());
    m.add_state(r.params);
    auto g = mb::make_gloo_group(m, data_options(store));
    m.start();
    run_syncs(m, *g, r, book, 3, rank);
    if (rank == victim) {
      job.dying(m.nonce());
      lose(world, victim, *g);
    }
    job.admit(m, [&] { sync_once(m, *g, r, book, rank); });
    run_syncs(m, *g, r, book, job.target(), rank);
    finish(m, *g, out);
  });
  for (const auto& x : res) {
    CHECK_MESSAGE(x.error == "", x.error);
    CHECK(x.hash == res[0].hash);
    CHECK(x.committed == res[0].committed);
    CHECK(x.data_size == 3);
    CHECK(x.last_quorum == std::vector<int>{0, 1, 2});
  }
  // The survivors built on {0,1,2}, then (unless the loss and the admission were one
  // reconfiguration) on {0,1}, then on {0,1,2} with the newcomer.
  CHECK(res[0].group.builds >= 2);
  CHECK(res[static_cast<std::size_t>(victim)].group.builds == 1);
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

// The factory alone: a rank that never arrives is named when the construction's deadline passes.
TEST_CASE("quorum_group: building a gloo group that a rank never joins fails naming the rank" * doctest::timeout(60)) {
  tcp_store_server store("127.0.0.1:0", store_options());
  mb::group_spec s;
  s.quorum_id = 7;
  s.ranks = {0, 3};
  s.rank = 0;
  s.size = 2;
  s.prefix = "never-q7";
  s.until = std::chrono::milliseconds(300);
  std::string what;
  try {
    mb::gloo_group_factory(data_options(store))(s);
  } catch (const transport_error& e) {
    what = e.what();
  }
  CHECK_MESSAGE(what.find("rank 1") != std::string::npos, what);
  CHECK_MESSAGE(what.find("never arrived") != std::string::npos, what);
}

// Inside a job: rank 1's first build fails at once (as if it never came); rank 0's build then
// fails at the op timeout naming it, both re-form, and the retried sync builds and commits.
TEST_CASE("quorum_group: a build that a member misses fails the sync naming it, and the retry rebuilds" *
          doctest::timeout(120)) {
  gloo_job job(2);
  const auto res = job.run([&](int rank, inproc_communicator& c, group_result& out) {
    mb::member<inproc_communicator> m(c, test_options());
    replica r(100);
    m.add_state(r.params);
    auto make = mb::gloo_group_factory(data_options(job.store));
    int calls = 0;
    group g(m, [&](const mb::group_spec& s) -> std::unique_ptr<gloo_communicator> {
      if (rank == 1 && ++calls == 1) throw transport_error("rank 1 stays away from its first rendezvous (test)");
      return make(s);
    });
    m.start();
    const mb::sync_report rep = sync_once(m, g, r, job.book, rank);
    CHECK(rep.outcome == mb::outcome::committed);
    CHECK(rep.attempts == 2);
    run_syncs(m, g, r, job.book, 3, rank);
    finish(m, g, out);
  });
  for (const auto& x : res) {
    CHECK_MESSAGE(x.error == "", x.error);
    CHECK(x.hash == res[0].hash);
    CHECK(x.group.build_failures == 1);
    CHECK(x.data_size == 2);
  }
  const std::string& why = res[0].group.last_error;
  CHECK_MESSAGE(why.find("building the data communicator") != std::string::npos, why);
  CHECK_MESSAGE(why.find("rank 1") != std::string::npos, why);
  CHECK_MESSAGE(why.find("never arrived") != std::string::npos, why);
  CHECK_MESSAGE(why.find("1 = member 1") != std::string::npos, why);
  CHECK_MESSAGE(job.book.divergent().empty(), job.book.describe_divergent());
}

TEST_CASE("quorum_group: data calls outside transact() are refused, naming the call") {
  tcp_store_server store("127.0.0.1:0", store_options());
  inproc_world world(1);
  inproc_communicator c = world.join(0);
  mb::member<inproc_communicator> m(c, test_options());
  auto g = mb::make_gloo_group(m, data_options(store));
  m.start();
  double x = 1;
  CHECK_THROWS_WITH_AS(g->allreduce(&x, 1, dtype::f64, cadence::transport::reduce_op::sum),
                       doctest::Contains("allreduce outside quorum_group::transact()"),
                       cadence::invalid_parameter_error);
  // A quorum of one: its own group of one, then the sum is the value.
  const mb::sync_report rep = g->transact([&] { g->allreduce(&x, 1, dtype::f64, cadence::transport::reduce_op::sum); });
  CHECK(rep.outcome == mb::outcome::committed);
  CHECK(x == 1);
  CHECK(g->stats().builds == 1);
  CHECK_THROWS_AS(group(m, nullptr), cadence::invalid_parameter_error);
}

}  // namespace
}  // namespace cadence_membership_test
