// The rendezvous held outside the quorum (include/cadence/membership/zmq/rendezvous.hpp): ranks
// as threads of this process, each with its own ZeroMQ communicator over 127.0.0.1; rank 0 only
// holds the rendezvous, ranks 1..3 are the members. The first member (the quorum's leader) is
// lost and a new process takes its slot and joins, which a job whose rank 0 is a member cannot
// do once rank 0 is gone.
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/membership/zmq/rendezvous.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include "transport/zmq/zmq_ranks.hpp"  // rank 0's rendezvous address handed to the others
#include "membership/zmq/guarded.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace mb = cadence::membership;
namespace tr = cadence::transport;
using namespace std::chrono_literals;

// What the threads share: rank 0's rendezvous address (tests/transport/zmq/zmq_ranks.hpp), the
// members' results, the holder's lines.
struct job {
  std::mutex m;
  cadence_zmq_test::rendezvous_box box;
  std::vector<std::string> events, errors;
  std::vector<std::uint64_t> hash = std::vector<std::uint64_t>(4, 0), committed = std::vector<std::uint64_t>(4, 0);
  std::vector<std::vector<int>> first_quorum = std::vector<std::vector<int>>(4);

  // Rank r's options: the membership's heartbeat timeout, construction waiting for r alone.
  tr::zmq_options options(int rank, const mb::timeouts& t) {
    tr::zmq_options o = cadence_zmq_test::thread_options(rank, box, t.heartbeat_timeout);
    o.wait_for = tr::zmq_wait_for::self;
    return o;
  }
  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    errors.push_back(what);
  }
};

constexpr int size = 4;  // rank 0 the rendezvous, ranks 1..3 the members
constexpr int victim = 1;  // the first member: the quorum's leader
constexpr std::uint64_t merges = 12;

mb::member_options member_options() {
  mb::member_options o;
  o.timeouts = mb::timeouts::scaled(1000ms);
  o.eligible = mb::members_besides_rendezvous(size);
  o.join_timeout = 60s;
  return o;
}

// Member `rank`: start() (or, a late or replacement process, join()), then periodic averaging
// every `period` steps until `merges` syncs committed with every member slot in; after every
// sync `go_on(m)` says whether to stay (false: it returns at once and its communicator closes,
// so the others see it lost). Its first quorum, last hash and commits go into `j`.
template <class GoOn>
void member(job& j, int rank, bool join, std::size_t period, GoOn go_on) {
  const mb::member_options opts = member_options();
  tr::zmq_communicator comm(rank, size, j.options(rank, opts.timeouts), tr::deadline(30s));
  mb::member<tr::zmq_communicator> m(comm, opts);
  std::vector<double> params(64 * 1024, 1.0);
  m.add_state(params);
  if (join)
    m.join();
  else
    m.start();
  if (!join) {
    std::lock_guard<std::mutex> lock(j.m);
    j.first_quorum[static_cast<std::size_t>(rank)] = m.current().ranks;
  }
  cadence::exchange::periodic_averager<mb::quorum_view<tr::zmq_communicator>> avg(m.view(), period);
  while (m.committed() < merges || m.current().size() < static_cast<std::size_t>(size - 1)) {
    for (std::size_t i = 0; i < params.size(); i += 97) params[i] += 0.01 * rank;
    if (!avg.step_done()) continue;
    const mb::sync_report r = m.transact(
        [&] { avg.sync({cadence::exchange::tensor_ref(params.data(), params.size())}); }, {params});
    if (r.outcome != mb::outcome::committed) avg.restart_period();
    if (!go_on(m)) return;
  }
  m.finish();
  std::lock_guard<std::mutex> lock(j.m);
  j.hash[static_cast<std::size_t>(rank)] = m.state_hash();
  j.committed[static_cast<std::size_t>(rank)] = m.committed();
}

// The first test's members: the victim (the first member) leaves after 5 commits.
void member(job& j, int rank, bool replacement) {
  member(j, rank, replacement, 2, [&](const mb::member<tr::zmq_communicator>& m) {
    return !(rank == victim && !replacement && m.committed() == 5);
  });
}

using cadence_membership_zmq_test::guarded;  // a rank's thread, its exception into the job

// Rank 0 holding the rendezvous on a thread of its own until the job is over (or, only once a
// member thread failed, at once: the hold must not outlive the test), its lines into j.events.
class holder_thread {
public:
  explicit holder_thread(job& j) : j_(j) {
    thread_ = guarded(j, "rendezvous", [this] {
      tr::zmq_communicator comm(0, size, j_.options(0, member_options().timeouts), tr::deadline(30s));
      mb::rendezvous_options ro;
      ro.exit_when_empty = 300ms;
      ro.tick = 50ms;
      ro.on_event = [this](const std::string& line) {
        std::lock_guard<std::mutex> lock(j_.m);
        j_.events.push_back(line);
      };
      report = mb::hold_rendezvous(comm, [this] { return give_up_.load(); }, ro);
    });
  }
  // Joins `members`, then the hold; REQUIREs that no thread failed.
  void end(std::vector<std::thread>& members) {
    for (auto& t : members) t.join();
    {
      std::lock_guard<std::mutex> lock(j_.m);
      if (!j_.errors.empty()) give_up_ = true;
    }
    thread_.join();
    for (const std::string& e : j_.errors) FAIL_CHECK(e);
    REQUIRE(j_.errors.empty());
  }
  mb::rendezvous_report report;

private:
  job& j_;
  std::atomic<bool> give_up_{false};
  std::thread thread_;
};

// Every member finished with at least `merges` syncs, as many as member `ref`, and its state.
void check_members_agree(const job& j, std::size_t ref) {
  for (std::size_t r = 1; r < static_cast<std::size_t>(size); ++r) {
    CAPTURE(r);
    CHECK(j.committed[r] >= merges);
    CHECK(j.committed[r] == j.committed[ref]);
    CHECK(j.hash[r] == j.hash[ref]);
  }
}

}  // namespace

TEST_CASE("membership: with the rendezvous held outside the quorum, the lost leader's slot is taken by a new process" *
          doctest::timeout(180)) {
  job j;
  holder_thread holder(j);
  std::vector<std::thread> members;
  for (int r = 1; r < size; ++r)
    members.push_back(guarded(j, "rank " + std::to_string(r), [&j, r] { member(j, r, false); }));
  members[0].join();  // the victim returned: its slot is lost
  members[0] = guarded(j, "replacement", [&j] { member(j, victim, true); });
  holder.end(members);
  // The victim was the first quorum's leader (its lowest rank), and rank 0 was in no quorum.
  CHECK(j.first_quorum[1] == std::vector<int>{1, 2, 3});
  // Every member, the replacement included, finished with the same merges and state.
  check_members_agree(j, 1);
  // The holder saw three first registrations and the replacement's, the victim lost and every
  // member gone at the end, and returned on its own once the job was over.
  const mb::rendezvous_report& rep = holder.report;
  CHECK(rep.registrations == 4);
  CHECK(rep.losses == 4);
  CHECK(rep.alive == 0);
  CHECK(rep.emptied);
  bool replaced = false;
  for (const std::string& e : j.events) replaced = replaced || e == "rendezvous: slot 1 registered (incarnation 2)";
  CHECK(replaced);
}

TEST_CASE("membership: a first member that never starts (the leader's slot) costs the others an op timeout, not the job" *
          doctest::timeout(180)) {
  // Ranks 2 and 3 start; rank 1, the lowest member (the first quorum's leader), has not come
  // when they do. Once it has been absent for an op timeout they count it lost: rank 2 leads
  // and the first quorum is {2, 3} (two of three: a majority). Rank 1 arrives later, as a late
  // process does, with join(), and is admitted with the state.
  job j;
  holder_thread holder(j);
  std::atomic<std::uint64_t> progressed{0};  // the commits of rank 2, so rank 1 comes after some
  const auto run = [&j, &progressed](int rank) {
    member(j, rank, rank == 1, 1, [&](const mb::member<tr::zmq_communicator>& m) {
      if (rank == 2) progressed = m.committed();
      return true;
    });
  };
  std::vector<std::thread> members;
  for (int r = 2; r < size; ++r) members.push_back(guarded(j, "rank " + std::to_string(r), [&run, r] { run(r); }));
  // Rank 1 comes once the others have committed a sync without it (a state, not a clock).
  while (progressed.load() < 3) {
    {
      std::lock_guard<std::mutex> lock(j.m);
      if (!j.errors.empty()) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  members.push_back(guarded(j, "rank 1 (late)", [&run] { run(1); }));
  holder.end(members);
  CHECK(j.first_quorum[2] == std::vector<int>{2, 3});
  CHECK(j.first_quorum[3] == std::vector<int>{2, 3});
  check_members_agree(j, 2);
  CHECK(holder.report.registrations == 3);
}

TEST_CASE("membership: a member left alone whose syncs exchange nothing still admits a joiner" * doctest::timeout(120)) {
  // A quorum of one whose syncs run no collective (an adapter that has nothing to exchange
  // alone, as diloco's outer step of one member) must still take in a newcomer's request at its
  // sync points: rank 1 leaves, rank 0 goes on alone with empty syncs, a new process in slot 1
  // joins. Both then average a value in every sync and finish with the same state.
  constexpr int n = 2;
  job j;
  std::atomic<bool> alone{false};
  std::vector<double> finals(n, 0.0);
  const auto run = [&](int rank, bool replacement) {
    mb::member_options opts = member_options();
    opts.eligible = {};
    tr::zmq_communicator comm(rank, n, j.options(rank, opts.timeouts), tr::deadline(30s));
    mb::member<tr::zmq_communicator> m(comm, opts);
    std::vector<double> x(16, 1.0 + rank);
    m.add_state(x);
    replacement ? m.join() : m.start();
    for (std::uint64_t extra = 0;;) {
      const bool pair = m.current().size() == 2;
      const mb::sync_report r = m.transact(
          [&] {
            if (pair) m.view().allreduce_average(x.data(), x.size(), tr::dtype::f64);
          },
          {x});
      if (r.outcome != mb::outcome::committed) continue;
      if (rank == 1 && !replacement && m.committed() == 3) return;  // leaves: rank 0 is alone
      if (rank == 0 && !pair && m.current().size() == 1) alone = true;
      if (pair && m.current().size() == 2 && (replacement || alone) && ++extra == 4) break;
    }
    m.finish();
    std::lock_guard<std::mutex> lock(j.m);
    finals[static_cast<std::size_t>(rank)] = x[0];
    j.hash[static_cast<std::size_t>(rank)] = m.state_hash();
  };
  std::thread zero = guarded(j, "rank 0", [&] { run(0, false); });
  std::thread one = guarded(j, "rank 1", [&] { run(1, false); });
  one.join();
  while (!alone.load()) {
    {
      std::lock_guard<std::mutex> lock(j.m);
      if (!j.errors.empty()) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  one = guarded(j, "rank 1 (replacement)", [&] { run(1, true); });
  one.join();
  zero.join();
  for (const std::string& e : j.errors) FAIL_CHECK(e);
  REQUIRE(j.errors.empty());
  CHECK(j.hash[0] == j.hash[1]);
  CHECK(finals[0] == finals[1]);
}

TEST_CASE("membership: hold_rendezvous returns when stop() says so, and refuses what cannot hold" * doctest::timeout(60)) {
  job j;
  const mb::timeouts t = mb::timeouts::scaled(1000ms);
  tr::zmq_communicator holder(0, 2, j.options(0, t), tr::deadline(30s));
  SUBCASE("stop() ends it before anyone registers") {
    int asked = 0;
    const mb::rendezvous_report rep = mb::hold_rendezvous(holder, [&] { return ++asked == 3; });
    CHECK(asked == 3);
    CHECK(rep.registrations == 0);
    CHECK_FALSE(rep.emptied);
  }
  SUBCASE("a tick that is not positive") {
    mb::rendezvous_options o;
    o.tick = 0ms;
    CHECK_THROWS_WITH_AS(mb::hold_rendezvous(holder, [] { return true; }, o), doctest::Contains("tick must be positive"),
                         cadence::invalid_parameter_error);
  }
  SUBCASE("a rank other than 0") {
    // Rank 1's construction needs rank 0 inside a call: the holder holds on this thread while
    // rank 1 registers and tries to hold on its own.
    std::atomic<bool> done{false};
    std::string refusal;
    std::thread one([&] {
      try {
        tr::zmq_communicator c(1, 2, j.options(1, t), tr::deadline(30s));
        mb::hold_rendezvous(c, [] { return true; });
      } catch (const cadence::invalid_parameter_error& e) {
        refusal = e.what();
      } catch (const std::exception& e) {
        refusal = std::string("another error: ") + e.what();
      }
      done = true;
    });
    const mb::rendezvous_report rep = mb::hold_rendezvous(holder, [&] { return done.load(); });
    one.join();
    CHECK(refusal.find("rank 1 does not hold the rendezvous; only rank 0 binds it") != std::string::npos);
    CHECK(rep.registrations == 1);
  }
  SUBCASE("a stray message to rank 0 is reported and dropped, whatever its size") {
    // No member sends to rank 0; one that does (a bug, another program's code) must neither
    // fail the hold nor stay at the head of the queue (every later wait would fail at once: a
    // spin). Rank 1 sends 2 bytes, then 1 byte, on the tag the hold waits on: the hold ends once
    // it has reported the second, which it reaches only past the first. (On another tag a
    // message waits in rank 0's queue, bounded by zmq_options::credit_bytes per peer.)
    std::atomic<bool> reported_last{false};
    std::vector<std::string> lines;
    std::string failure;
    std::thread one([&] {
      try {
        tr::zmq_communicator c(1, 2, j.options(1, t), tr::deadline(30s));
        const unsigned char two[2] = {1, 2}, byte = 3;
        c.send(two, sizeof two, 0, tr::max_tag, tr::deadline(30s));
        c.send(&byte, 1, 0, tr::max_tag, tr::deadline(30s));
        while (!reported_last) c.poll();  // rank 1 stays alive (its sends delivered) until then
      } catch (const std::exception& e) {
        failure = e.what();
        reported_last = true;
      }
    });
    mb::rendezvous_options o;
    o.tick = 20ms;
    o.on_event = [&](const std::string& line) {
      if (line.find("ignored") == std::string::npos) return;
      lines.push_back(line);
      if (line.find("1 byte from rank 1") != std::string::npos) reported_last = true;
    };
    const mb::rendezvous_report rep = mb::hold_rendezvous(holder, [&] { return reported_last.load(); }, o);
    one.join();
    CHECK(failure.empty());
    REQUIRE(lines.size() == 2);
    CHECK(lines[0].find("rendezvous: ignored a message to rank 0 (no member sends to it): ") == 0);
    CHECK(lines[0].find("rank 1") != std::string::npos);
    CHECK(lines[1] == "rendezvous: ignored a message of 1 byte from rank 1 (no member sends to rank 0)");
    CHECK(rep.registrations == 1);
  }
  SUBCASE("a communicator of one rank (no member besides the rendezvous)") {
    tr::zmq_communicator alone(0, 1, j.options(0, t), tr::deadline(30s));
    CHECK_THROWS_WITH_AS(mb::hold_rendezvous(alone, [] { return true; }),
                         doctest::Contains("1 rank leaves no member besides the rendezvous"),
                         cadence::invalid_parameter_error);
  }
  CHECK(mb::members_besides_rendezvous(4) == std::vector<int>{1, 2, 3});
  CHECK_THROWS_WITH_AS(mb::members_besides_rendezvous(1), doctest::Contains("size 1 leaves no member"),
                       cadence::invalid_parameter_error);
}

TEST_CASE("membership: a member whose ZeroMQ communicator is aborted mid-sync is lost to the others at once; they "
          "re-form well within the op timeout, and a new process takes its slot" *
          doctest::timeout(120)) {
  // Rank 2 aborts inside its fourth sync (its view and its communicator, as
  // quorum_group::abort() does) and keeps the process (the aborted communicator) alive until the
  // others have committed a sync without it: its abort must tell them, since its connections
  // would otherwise go on answering heartbeats and the others would wait for it an op timeout
  // (4 s here) and then a quorum timeout (8 s): 12.0 s before the ZeroMQ abort told its peers.
  // Then it leaves and a new process joins in its slot.
  // With its communicator alone aborted (not its view), the member itself must see its own
  // communicator failed and leave at once (before, it waited for an announcement that could not
  // come: two quorum timeouts, 16 s here, busy).
  bool view_too = true;
  SUBCASE("the view and the communicator aborted") { view_too = true; }
  SUBCASE("the communicator alone aborted") { view_too = false; }
  constexpr int aborter = 2;
  using clock = std::chrono::steady_clock;
  job j;
  holder_thread holder(j);
  std::atomic<clock::rep> aborted_at{0}, reformed_at{0}, left_at{0};
  std::string abort_error;
  const auto survivor = [&](int rank) {
    member(j, rank, false, 1, [&](const mb::member<tr::zmq_communicator>& m) {
      if (aborted_at.load() != 0 && reformed_at.load() == 0 && !m.current().contains(aborter)) {
        clock::rep none = 0;
        reformed_at.compare_exchange_strong(none, clock::now().time_since_epoch().count());
      }
      return true;
    });
  };
  const auto aborting = [&] {
    const mb::member_options opts = member_options();
    tr::zmq_communicator comm(aborter, size, j.options(aborter, opts.timeouts), tr::deadline(30s));
    mb::member<tr::zmq_communicator> m(comm, opts);
    std::vector<double> params(64 * 1024, 1.0);
    m.add_state(params);
    m.start();
    cadence::exchange::periodic_averager<mb::quorum_view<tr::zmq_communicator>> avg(m.view(), 1);
    for (bool aborted = false; !aborted;) {
      for (std::size_t i = 0; i < params.size(); i += 97) params[i] += 0.01 * aborter;
      if (!avg.step_done()) continue;
      aborted = m.committed() == 3;
      try {
        m.transact(
            [&] {
              if (aborted) {
                aborted_at = clock::now().time_since_epoch().count();
                if (view_too) m.view().abort();
                comm.abort();
              }
              avg.sync({cadence::exchange::tensor_ref(params.data(), params.size())});
            },
            {params});
        if (aborted) j.fail("rank 2: transact returned after its communicator was aborted");
      } catch (const std::exception& e) {
        if (!aborted) throw;
        left_at = clock::now().time_since_epoch().count();
        abort_error = e.what();
      }
    }
    // The process stays, its communicator aborted, until the others re-formed without it (or
    // far past the quorum timeout, which fails the test below).
    const auto until = clock::now() + 30s;
    while (reformed_at.load() == 0 && clock::now() < until) std::this_thread::sleep_for(5ms);
  };
  std::vector<std::thread> members;
  members.push_back(guarded(j, "rank 1", [&] { survivor(1); }));
  members.push_back(guarded(j, "rank 2 (aborts)", aborting));
  members.push_back(guarded(j, "rank 3", [&] { survivor(3); }));
  members[1].join();
  members[1] = guarded(j, "rank 2 (replacement)", [&j] {
    member(j, aborter, true, 1, [](const mb::member<tr::zmq_communicator>&) { return true; });
  });
  holder.end(members);
  INFO("rank 2 saw: " << abort_error);
  CHECK(abort_error.find("aborted") != std::string::npos);
  REQUIRE(reformed_at.load() != 0);
  const auto took = clock::duration(reformed_at.load() - aborted_at.load());
  MESSAGE("abort to the survivors' first commit without rank 2: "
          << std::chrono::duration<double>(took).count() << " s");
  // Well under the op timeout (4 s), which the others waited at least before the abort told them.
  CHECK(took < member_options().timeouts.op / 2);
  // The aborted member left as soon: its own communicator failed, no quorum can hold it.
  CHECK(clock::duration(left_at.load() - aborted_at.load()) < member_options().timeouts.op / 2);
  check_members_agree(j, 1);
  CHECK(holder.report.registrations == 4);
}
