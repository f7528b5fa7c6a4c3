// membership::rejoining_member (include/cadence/membership/rejoin.hpp): ranks as threads of this
// process, each with its own ZeroMQ communicator over 127.0.0.1; rank 0 hosts the rendezvous and
// is a member. A member is dropped while its process lives and comes back through the helper as
// a new incarnation in its slot; the limits and the rendezvous host's refusal propagate the drop.
//
// How a member is dropped here: a thread cannot be stopped as SIGSTOP stops a process (ZeroMQ's
// I/O thread would go on answering heartbeats), and a member merely late to a sync is healed
// back, not dropped. So the victim aborts its communicator between two syncs (its incarnation's
// transport fails while the process lives: the peers see it lost at once), then waits, without a
// clock, until the others have reported it lost (on_change) and committed a sync without it; the
// sync it then enters throws evicted_error from member::transact(), which the helper answers.
// The same with exchange::diloco_member, whose sync() transacts inside: the drop surfaces from
// it, and rejoining_member::guard() answers it with a new diloco_member on the new member.
#include <cadence/exchange/local_sgd/membership.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/membership/rejoin.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include "transport/zmq/zmq_ranks.hpp"  // rank 0's rendezvous address handed to the others
#include "membership/zmq/guarded.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// A namespace of its own: the suite's files are compiled together (unity build).
namespace cadence_rejoin_test {
namespace {

namespace mb = cadence::membership;
namespace tr = cadence::transport;
namespace ex = cadence::exchange;
using namespace std::chrono_literals;
using helper_t = mb::rejoining_member<tr::zmq_communicator>;
using member_t = mb::member<tr::zmq_communicator>;
using diloco_t = ex::diloco_member<tr::zmq_communicator>;

constexpr auto bound = 30s;  // upper bound on any wait: catches a hang, never reached when healthy

mb::member_options member_options() {
  mb::member_options o;
  o.timeouts = mb::timeouts::scaled(1000ms);  // nothing waits for them without a fault
  o.join_timeout = 30s;
  return o;
}

// What the threads share: rank 0's rendezvous address, the failures, the flags they wait on.
struct job {
  std::mutex m;
  cadence_zmq_test::rendezvous_box box;
  std::vector<std::string> errors;
  std::atomic<bool> failed{false};
  std::atomic<bool> went_on{false};  // a survivor committed a sync without the victim, which it saw lost
  std::atomic<bool> back{false};     // the victim committed a sync after its rejoin

  // A communicator in slot `rank` of `size` (construction waits for this rank alone: a rejoin
  // registers while the others sync).
  std::unique_ptr<tr::zmq_communicator> connect(int rank, int size) {
    tr::zmq_options o = cadence_zmq_test::thread_options(rank, box, member_options().timeouts.heartbeat_timeout);
    o.wait_for = tr::zmq_wait_for::self;
    return std::make_unique<tr::zmq_communicator>(rank, size, o, tr::deadline(bound));
  }
  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    errors.push_back(what);
    failed = true;
  }
  // Waits for `flag` (or a failure elsewhere); false past the bound.
  bool wait_for(const std::atomic<bool>& flag) {
    const auto until = std::chrono::steady_clock::now() + bound;
    while (!flag && !failed) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(2ms);
    }
    return flag;
  }
};

using cadence_membership_zmq_test::guarded;  // a rank's thread, its exception into the job

void join_all(job& j, std::vector<std::thread>& threads) {
  for (auto& t : threads) t.join();
  for (const std::string& e : j.errors) FAIL_CHECK(e);
  REQUIRE(j.errors.empty());
}

// Runs rank_body(r) for ranks 0..size-1, each on a guarded thread of its own, joins them (every rank's error
// reported), and says how long they took, after `what`.
template <class F>
void run_ranks(job& j, int size, F& rank_body, const char* what) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(guarded(j, "rank " + std::to_string(r), [&rank_body, r] { rank_body(r); }));
  join_all(j, ranks);
  MESSAGE(what << ": " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");
}

// The victim's drop: its communicator aborted, then the wait until the others went on without it.
void drop(job& j, helper_t& h) {
  h.communicator().abort();
  if (!j.wait_for(j.went_on)) throw cadence::error("the others never committed a sync without the victim");
}

// One sync of `x` (averaged) and of `more` (the maximum of every member's wish to go on: all
// stop after the same sync).
template <class H>
auto sync(H& h, std::vector<double>& x, std::vector<double>& more, bool wants_more) {
  return h.transact(
      [&] {
        double f = wants_more ? 1.0 : 0.0;
        h.view().allreduce(&f, 1, tr::dtype::f64, tr::reduce_op::max);
        more[0] = f;
        h.view().allreduce_average(x.data(), x.size(), tr::dtype::f64);
      },
      {x});
}

// Sets `saw_lost` once `m` reports a rank lost (the victim: no other rank is lost here); registered
// on every incarnation, from the register function.
void watch_losses(member_t& m, std::atomic<bool>& saw_lost) {
  m.on_change([&saw_lost](const mb::change& c) {
    if (!c.lost.empty()) saw_lost = true;
  });
}

// What a survivor (not the victim) does between syncs: notes a commit without the victim.
void note_survivor(job& j, const member_t& m, const std::atomic<bool>& saw_lost, int victim) {
  if (saw_lost && !m.current().contains(victim)) j.went_on = true;
}

}  // namespace

TEST_CASE("membership: a member dropped while alive rejoins through rejoining_member, and the job ends with three "
          "members and one state" *
          doctest::timeout(120)) {
  constexpr int size = 3;
  constexpr int victim = 2;
  constexpr std::uint64_t held_back_at = 2;  // the victim is dropped after this many commits
  job j;
  std::vector<std::uint64_t> hash(size, 0), committed(size, 0);
  std::vector<std::vector<int>> final_quorum(size);
  std::vector<int> connects(size, 0), rejoins(size, -1), attempts(size, -1);
  std::vector<mb::rejoin_attempt> seen;        // the victim's on_rejoin calls
  std::vector<int> connect_attempt_args;      // the victim's connect function's arguments
  std::optional<mb::rejoin_report> rejoined;  // the victim's report of the sync that rejoined
  const auto rank_body = [&](int rank) {
    std::vector<double> x(1024, 10.0 * rank), more(1, 1.0);
    std::atomic<bool> saw_lost{false};
    mb::rejoin_options ro;
    ro.max_attempts = 2;
    ro.may_rejoin = rank != 0;  // rank 0 hosts the rendezvous
    ro.on_rejoin = [&](const mb::rejoin_attempt& a) {
      std::lock_guard<std::mutex> lock(j.m);
      seen.push_back(a);
    };
    helper_t h(
        [&](int attempt) {
          ++connects[static_cast<std::size_t>(rank)];
          if (rank == victim) connect_attempt_args.push_back(attempt);
          return j.connect(rank, size);
        },
        member_options(),
        [&](member_t& m) {
          m.add_state(x);
          m.add_state(more);
          watch_losses(m, saw_lost);
        },
        ro);
    h.start();
    bool dropped = false;
    std::optional<std::uint64_t> after_rejoin;
    const auto until = std::chrono::steady_clock::now() + bound;
    for (;;) {
      if (rank == victim && !dropped && h.incarnation().committed() == held_back_at) {
        dropped = true;
        drop(j, h);
      }
      for (double& v : x) v += rank + 1;  // a local step
      const bool give_up = j.failed || std::chrono::steady_clock::now() > until;
      // The victim wants one sync after its rejoin; the others go on until it has committed it.
      const bool wants = !give_up && (rank == victim ? !after_rejoin || h.incarnation().committed() <= *after_rejoin
                                                     : !j.back.load());
      const mb::rejoin_report r = sync(h, x, more, wants);
      if (r.rejoined) {
        std::lock_guard<std::mutex> lock(j.m);
        rejoined = r;
        after_rejoin = r.committed;
        continue;  // the admission's state: no sync ran here
      }
      if (rank != victim) note_survivor(j, h.incarnation(), saw_lost, victim);
      if (after_rejoin && h.incarnation().committed() > *after_rejoin) j.back = true;
      if (more[0] == 0.0) break;
    }
    h.finish();
    std::lock_guard<std::mutex> lock(j.m);
    const auto i = static_cast<std::size_t>(rank);
    hash[i] = h.incarnation().state_hash();
    committed[i] = h.incarnation().committed();
    final_quorum[i] = h.incarnation().current().ranks;
    rejoins[i] = h.rejoins();
    attempts[i] = h.attempts();
  };
  run_ranks(j, size, rank_body, "the job, the drop and the rejoin included");
  // Every member ends in the quorum of three with the same state and count.
  for (int r = 0; r < size; ++r) {
    CAPTURE(r);
    const auto i = static_cast<std::size_t>(r);
    CHECK(final_quorum[i] == std::vector<int>{0, 1, 2});
    CHECK(hash[i] == hash[0]);
    CHECK(committed[i] == committed[0]);
    CHECK(rejoins[i] == (r == victim ? 1 : 0));
    CHECK(attempts[i] == (r == victim ? 1 : 0));
    CHECK(connects[i] == (r == victim ? 2 : 1));
  }
  CHECK(connect_attempt_args == std::vector<int>{0, 1});
  // The sync that dropped the victim reported the rejoin, healed, after the others' commits
  // without it.
  REQUIRE(rejoined);
  CHECK(rejoined->outcome == mb::outcome::healed);
  CHECK(rejoined->rejoin_attempts == 1);
  CHECK(rejoined->committed > held_back_at);
  CHECK(rejoined->rejoin_seconds > 0);
  MESSAGE("the drop to the admission: " << rejoined->rejoin_seconds << " s");
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].attempt == 1);
  CHECK(seen[0].reason == mb::drop_reason::evicted);
  INFO("the drop: " << seen[0].message);
  CHECK(seen[0].message.find("communicator failed") != std::string::npos);
}

TEST_CASE("membership: a DiLoCo member dropped while alive rejoins through rejoining_member::guard with the "
          "quorum's global weights, outer state and outer steps" *
          doctest::timeout(120)) {
  // Three ranks, each with a diloco_member built by the register function on every
  // incarnation. The victim's communicator is aborted after the weights' broadcast and one outer
  // sync; its next dm->sync() throws evicted_error (from the member::transact() inside it, or,
  // streaming, from the fragment's thread at the completion point), which guard() answers:
  // teardown ends the old diloco_member, the register function builds one on the new member,
  // join joins it. All stop through DiLoCo's agreed stop once the victim committed an outer sync
  // after its rejoin. The member is read only with nothing in flight (streaming: it belongs to
  // the fragment's thread meanwhile).
  std::string config;
  SUBCASE("an outer sync every 2 inner steps: the drop surfaces from the sync's transaction") { config = "fixed:2"; }
  SUBCASE("streaming (2 fragments, delay 1): the drop surfaces at the completion point") {
    config = "fixed:4,fragments=2,delay=1";
  }
  CAPTURE(config);
  constexpr int size = 3;
  constexpr int victim = 2;
  constexpr std::uint64_t held_back_at = 2;  // the victim is dropped after this many commits
  struct end {
    std::uint64_t global = 0, state = 0, committed = 0, outer_steps = 0;
    std::vector<int> quorum;
    int rejoins = -1, joins = 0, teardowns = 0;
    int teardowns_by_destructor = 0;  // the helper's destructor's teardown calls
    bool dm_left = true;  // a diloco_member outlived the helper
  };
  job j;
  std::vector<end> ends(size);
  std::optional<mb::rejoin_report> rejoined;  // the victim's report of the sync that rejoined
  bool took_global = false;                   // the victim's weights were the quorum's after it
  std::uint64_t outer_steps_at_rejoin = 0, outer_steps_before_drop = 0;
  bool dropped_in_flight = false;  // the sync that rejoined completed a fragment (streaming)
  const auto rank_body = [&](int rank) {
    end& out = ends[static_cast<std::size_t>(rank)];
    std::vector<float> w(64, 1.0f);
    const std::vector<ex::tensor_ref> tensors{ex::tensor_ref(w.data(), w.size())};
    std::optional<diloco_t> dm;  // before the helper: its teardown ends it first
    {
      std::atomic<bool> saw_lost{false};
      mb::rejoin_options ro;
      ro.max_attempts = 2;
      ro.may_rejoin = rank != 0;  // rank 0 hosts the rendezvous
      ro.start = [&] { dm->start(); };
      ro.join = [&] {
        ++out.joins;
        dm->join();
      };
      ro.teardown = [&] {
        ++out.teardowns;
        dm.reset();  // joins its thread, before the member it uses is destroyed
      };
      helper_t h([&](int) { return j.connect(rank, size); }, member_options(),
                 [&](member_t& m) {
                   dm.emplace(m, tensors, ex::make_outer_optimizer("nesterov"),
                              ex::parse_diloco_config(config).options);
                   watch_losses(m, saw_lost);
                 },
                 ro);
      h.start();
      bool dropped = false;
      std::optional<std::uint64_t> after_rejoin;
      const auto until = std::chrono::steady_clock::now() + bound;
      for (std::uint64_t step = 0; !dm->stop_agreed(); ++step) {
        if (rank == victim && !dropped && !dm->in_flight() && h.incarnation().committed() >= held_back_at) {
          dropped = true;
          outer_steps_before_drop = dm->outer_steps();
          drop(j, h);
        }
        for (std::size_t i = 0; i < w.size(); ++i)  // an inner step, its own on every rank
          w[i] += 0.001f * static_cast<float>((rank + 1) * static_cast<int>(i % 5 + 1)) -
                  1e-5f * static_cast<float>(step % 7);
        if (!dm->step_done(1000)) continue;
        // The others stop once the victim committed an outer sync after its rejoin (or on a failure).
        if (j.failed || std::chrono::steady_clock::now() > until || (rank != victim && j.back)) dm->request_stop();
        const bool completes = dm->in_flight();
        const mb::rejoin_report r = h.guard([&] { return dm->sync(); });
        if (r.rejoined) {
          std::lock_guard<std::mutex> lock(j.m);
          rejoined = r;
          dropped_in_flight = completes;
          after_rejoin = r.committed;
          took_global = std::equal(w.begin(), w.end(), dm->adapter().global_weights().begin());
          outer_steps_at_rejoin = dm->outer_steps();
          continue;  // the admission's state: no sync ran here
        }
        if (dm->in_flight()) continue;  // a fragment sent: the member is its thread's until it completes
        if (rank != victim) note_survivor(j, h.incarnation(), saw_lost, victim);
        if (after_rejoin && h.incarnation().committed() > *after_rejoin) j.back = true;
      }
      dm->finish();
      std::lock_guard<std::mutex> lock(j.m);
      out.global = dm->global_hash();
      out.state = h.incarnation().state_hash();
      out.committed = h.incarnation().committed();
      out.outer_steps = dm->outer_steps();
      out.quorum = h.incarnation().current().ranks;
      out.rejoins = h.rejoins();
      out.teardowns_by_destructor = -out.teardowns;  // the count before the helper is destroyed
    }
    out.teardowns_by_destructor += out.teardowns;
    out.dm_left = dm.has_value();
  };
  run_ranks(j, size, rank_body, "the DiLoCo job, the drop and the rejoin included");
  for (int r = 0; r < size; ++r) {
    CAPTURE(r);
    const end& e = ends[static_cast<std::size_t>(r)];
    CHECK(e.quorum == std::vector<int>{0, 1, 2});
    CHECK(e.global == ends[0].global);
    CHECK(e.state == ends[0].state);
    CHECK(e.committed == ends[0].committed);
    CHECK(e.outer_steps == ends[0].outer_steps);
    CHECK(e.rejoins == (r == victim ? 1 : 0));
    CHECK(e.joins == (r == victim ? 1 : 0));      // rejoin_options::join, not member::join()
    CHECK(e.teardowns_by_destructor == 1);        // the helper's destructor ended its diloco_member
    CHECK(e.teardowns == (r == victim ? 2 : 1));  // and the drop the victim's first
    CHECK_FALSE(e.dm_left);
  }
  CHECK(ends[0].outer_steps > outer_steps_before_drop);
  REQUIRE(rejoined);
  CHECK(rejoined->outcome == mb::outcome::healed);
  CHECK(rejoined->rejoin_attempts == 1);
  CHECK(rejoined->committed > held_back_at);
  MESSAGE("the DiLoCo member's drop to the admission: " << rejoined->rejoin_seconds << " s");
  CHECK(dropped_in_flight == (config.find("delay") != std::string::npos));
  CHECK(took_global);                                      // the joiner's adopt(): w is the global weights
  CHECK(outer_steps_at_rejoin > outer_steps_before_drop);  // the others' outer steps came with the state
}

TEST_CASE("membership: rejoining_member propagates a drop it cannot answer, naming why" * doctest::timeout(120)) {
  // Two members: rank 0 (the rendezvous host) and rank 1, which is dropped after 2 commits as
  // above. Rank 0 goes on alone (half of the quorum, with its leader), then finishes.
  constexpr int size = 2;
  constexpr int victim = 1;
  mb::rejoin_options ro;
  bool always_throws = false;
  std::string expect, refuse;
  int expect_attempts = 0;
  SUBCASE("max_attempts 0: the drop as member::transact() threw it") {
    ro.max_attempts = 0;
    expect = "communicator failed";
    refuse = "rejoin attempt";
  }
  SUBCASE("a connect function that always throws: the drop, the last failure and the attempts") {
    ro.max_attempts = 2;
    ro.pause = 1ms;
    always_throws = true;
    expect = "no route to the rendezvous (test) (gave up after 2 rejoin attempts)";
    expect_attempts = 2;
  }
  SUBCASE("may_rejoin false (the rank hosts the rendezvous): refused, naming the option") {
    ro.max_attempts = 3;
    ro.may_rejoin = false;
    expect = "not rejoined: rejoin_options::may_rejoin is false";
    refuse = "rejoin attempt";
  }
  job j;
  std::vector<mb::rejoin_attempt> seen;
  std::string dropped_with;
  bool was_evicted = false, has_incarnation = true;
  int attempts = -1, rejoins = -1;
  std::string after_give_up, guard_after_give_up;
  bool guard_ran = false;
  const auto rank_body = [&](int rank) {
    std::vector<double> x(256, 1.0 + rank), more(1, 1.0);
    std::atomic<bool> saw_lost{false};
    mb::rejoin_options mine = rank == victim ? ro : mb::rejoin_options{};
    if (rank == 0) mine.may_rejoin = false;
    if (rank == victim)
      mine.on_rejoin = [&](const mb::rejoin_attempt& a) { seen.push_back(a); };
    helper_t h(
        [&](int attempt) {
          if (attempt > 0 && always_throws) throw cadence::transport_error("no route to the rendezvous (test)");
          return j.connect(rank, size);
        },
        member_options(),
        [&](member_t& m) {
          m.add_state(x);
          watch_losses(m, saw_lost);
        },
        mine);
    h.start();
    if (rank == 0) {  // syncs until it committed one alone, then the closing sync
      while (!j.went_on) {
        if (j.failed) return;
        sync(h, x, more, true);
        note_survivor(j, h.incarnation(), saw_lost, victim);
      }
      h.finish();
      return;
    }
    while (h.incarnation().committed() < 2) sync(h, x, more, true);
    drop(j, h);
    try {
      sync(h, x, more, true);
      j.fail("rank 1: the sync after the drop returned");
    } catch (const mb::evicted_error& e) {
      was_evicted = true;
      dropped_with = e.what();
    } catch (const mb::quorum_error& e) {
      dropped_with = e.what();
    }
    attempts = h.attempts();
    rejoins = h.rejoins();
    has_incarnation = h.has_incarnation();
    if (!has_incarnation) {
      try {
        sync(h, x, more, true);
      } catch (const cadence::invalid_parameter_error& e) {
        after_give_up = e.what();
      }
      try {
        h.guard([&] {
          guard_ran = true;
          return mb::sync_report{};
        });
      } catch (const cadence::invalid_parameter_error& e) {
        guard_after_give_up = e.what();
      }
    }
  };
  run_ranks(j, size, rank_body, "took");
  INFO("the drop propagated as: " << dropped_with);
  CHECK(was_evicted);  // of the drop's kind, whatever failed the last attempt
  CHECK(dropped_with.find(expect) != std::string::npos);
  if (!refuse.empty()) CHECK(dropped_with.find(refuse) == std::string::npos);
  CHECK(attempts == expect_attempts);
  CHECK(rejoins == 0);
  CHECK(static_cast<int>(seen.size()) == expect_attempts);
  if (expect_attempts == 2) {
    // The first attempt is told the drop, the second the first attempt's failure.
    CHECK(seen[0].attempt == 1);
    CHECK(seen[1].attempt == 2);
    CHECK(seen[0].message.find("communicator failed") != std::string::npos);
    CHECK(seen[1].message == "no route to the rendezvous (test)");
    CHECK_FALSE(has_incarnation);
    CHECK(after_give_up.find("rejoining_member::transact: no incarnation") != std::string::npos);
    CHECK(guard_after_give_up.find("rejoining_member::guard: no incarnation") != std::string::npos);
    CHECK_FALSE(guard_ran);  // refused before it would run on no member
  } else {
    CHECK(has_incarnation);  // no attempt: the dropped incarnation stays (its member refuses)
  }
}

TEST_CASE("membership: rejoining_member refuses bad options and functions by name") {
  const auto connect = [](int) -> std::unique_ptr<tr::zmq_communicator> { return nullptr; };
  const auto reg = [](member_t&) {};
  mb::rejoin_options ro;
  ro.max_attempts = -1;
  CHECK_THROWS_WITH_AS(helper_t(connect, member_options(), reg, ro), doctest::Contains("max_attempts must be >= 0"),
                       cadence::invalid_parameter_error);
  ro = {};
  ro.pause = -1ms;
  CHECK_THROWS_WITH_AS(helper_t(connect, member_options(), reg, ro), doctest::Contains("pause must be >= 0 ms"),
                       cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(helper_t(nullptr, member_options(), reg), doctest::Contains("no connect function"),
                       cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(helper_t(connect, member_options(), nullptr), doctest::Contains("no register function"),
                       cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(helper_t(connect, member_options(), reg),
                       doctest::Contains("the connect function returned no communicator (attempt 0)"),
                       cadence::invalid_parameter_error);
}

}  // namespace cadence_rejoin_test
