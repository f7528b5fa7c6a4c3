// The ZeroMQ backend with ranks as real processes (this executable started again with
// --zmq-rank): a peer killed with SIGKILL or stopped with SIGSTOP past the heartbeat timeout
// while the others keep talking (their point-to-point traffic goes on, failed() stays false, a
// collective then fails naming the lost rank); a rank restarted in its slot (a new process, a
// new incarnation, its messages flow, the old one's are dropped); a late rank joining a running
// world (wait_for = self). The test process sends the signals and starts the processes; every
// step waits for a state (an event file, a peer state), never for a time; the limits only
// catch a hang.
#include <cadence/transport/zmq/communicator.hpp>

#include "support/events.hpp"
#include "support/processes.hpp"
#include "transport/conformance.hpp"
#include "zmq_ranks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using cadence_test::check_exited;
using cadence_test::check_killed;

namespace {

// ---- one rank, in a child process ----

constexpr auto heartbeat_timeout = 1000ms;  // a stopped peer is lost within about this

// Rank 0 binds its rendezvous on port 0 and publishes the address in the events folder; the
// others wait for it there.
zmq_options rank_options(int rank, const cadence_test::events& ev, zmq_wait_for wait_for) {
  if (rank == 0) {
    auto o = cadence_zmq_test::options_for("tcp://127.0.0.1:0", heartbeat_timeout);
    o.wait_for = wait_for;
    o.on_rendezvous_bound = [&ev](const std::string& address) {
      std::ofstream(ev.dir() + "/rendezvous.tmp") << address;
      std::rename((ev.dir() + "/rendezvous.tmp").c_str(), (ev.dir() + "/rendezvous").c_str());
    };
    return o;
  }
  if (!ev.wait("rendezvous")) throw std::runtime_error("rank 0 never published its rendezvous");
  std::string address;
  std::ifstream(ev.dir() + "/rendezvous") >> address;
  auto o = cadence_zmq_test::options_for(address, heartbeat_timeout);
  o.wait_for = wait_for;
  return o;
}

using cadence_test::rank_check;

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// Runs f, which must throw transport_error mentioning `needle`; returns its message.
template <class F>
std::string expect_lost(F&& f, const std::string& needle) {
  return cadence_test::rank_expect_throw<transport_error>(std::forward<F>(f), needle);
}

// Waits (polling the communicator) until `peer` is in state s; false after 30 s (a hang).
bool await_state(zmq_communicator& c, int peer, zmq_peer_state s) {
  const auto until = steady::now() + 30s;
  while (c.peer_state(peer) != s) {
    if (steady::now() >= until) return false;
    c.poll();
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

constexpr int ping_tag = 1, pong_tag = 2, victim_tag = 7, any_tag = 9;

// "kill" and "stop": rank 0 and rank 1 ping-pong while rank 0 also waits for a message from rank
// 2, the victim; the test process kills or stops rank 2 once they are talking. Rank 0's receive
// from rank 2 must fail alone; the ping-pong goes on; a collective then fails naming rank 2.
int run_lost(const std::string& scenario, int rank, const cadence_test::events& ev) {
  const int victim = 2;
  zmq_communicator c(rank, 3, rank_options(rank, ev, zmq_wait_for::all), 20s);
  if (rank == victim) {
    ev.post("victim ready");
    // Killed here (kill), or stopped here and resumed later (stop): then cut off, it finds its
    // peers lost.
    rank_check(ev.wait("victim resumed"), "the test never resumed the victim");
    rank_check(await_state(c, 0, zmq_peer_state::lost), "the resumed victim never saw rank 0 lost");
    std::int32_t v = 5;
    expect_lost([&] { c.send(&v, sizeof v, 0, 3, 5s); }, "lost rank 0");
    rank_check(!c.failed(), "the resumed victim's communicator failed");
    return 0;
  }
  if (rank == 1) {
    for (;;) {
      std::int64_t ping = 0;
      c.recv(&ping, sizeof ping, 0, ping_tag, 30s);
      if (ping < 0) break;
      c.send(&ping, sizeof ping, 0, pong_tag, 30s);
    }
    const std::int32_t me = 1;
    c.send(&me, sizeof me, 0, any_tag, 30s);
  } else {
    std::int32_t from_victim = 0;
    zmq_work w = c.irecv(&from_victim, sizeof from_victim, victim, victim_tag);
    std::string lost;
    std::int64_t round = 0;
    const auto limit = steady::now() + 30s;
    for (; lost.empty(); ++round) {
      rank_check(steady::now() < limit, "rank 0 never saw rank 2 lost");
      c.send(&round, sizeof round, 1, ping_tag, 30s);
      std::int64_t pong = -1;
      c.recv(&pong, sizeof pong, 1, pong_tag, 30s);
      rank_check(pong == round, "a pong out of order");
      if (round == 5) ev.post("talking");
      try {
        rank_check(!w.test(), "the receive from the victim completed");
      } catch (const transport_error& e) {
        lost = e.what();
      }
    }
    std::fprintf(stderr, "rank 0 (expected): %s\n", lost.c_str());
    rank_check(contains(lost, "recv #") && contains(lost, "lost rank 2"), "the lost receive should name rank 2: " + lost);
    if (scenario == "stop") rank_check(contains(lost, "heartbeat"), "a stopped peer is lost by its silence: " + lost);
    rank_check(!c.failed(), "losing rank 2 failed the communicator");
    rank_check(c.peer_state(victim) == zmq_peer_state::lost, "rank 2 is not lost");
    // Point to point with the lost rank fails at once, alone; with the others it goes on.
    std::int32_t v = 1;
    const auto t0 = steady::now();
    expect_lost([&] { c.send(&v, sizeof v, victim, 3, 20s); }, "lost rank 2");
    expect_lost([&] { c.recv(&v, sizeof v, victim, 3, 20s); }, "lost rank 2");
    rank_check(steady::now() - t0 < 5s, "calls to a lost peer waited");
    for (int k = 0; k < 20; ++k, ++round) {
      c.send(&round, sizeof round, 1, ping_tag, 30s);
      std::int64_t pong = -1;
      c.recv(&pong, sizeof pong, 1, pong_tag, 30s);
      rank_check(pong == round, "a pong after the loss out of order");
    }
    const std::int64_t stop = -1;
    c.send(&stop, sizeof stop, 1, ping_tag, 30s);
    std::int32_t who = -1;
    rank_check(c.recv(&who, sizeof who, any_source, any_tag, 30s) == 1 && who == 1, "any_source after the loss");
    rank_check(!c.failed(), "point to point after the loss failed the communicator");
    ev.post("survivors done");
  }
  // Collectives need every rank: this one fails the communicator, naming rank 2.
  rank_check(ev.wait("survivors done"), "rank 0 never finished");
  expect_lost([&] { barrier(c, 20s); }, "lost rank 2");
  rank_check(c.failed(), "a collective that lost a peer must fail the communicator");
  return 0;
}

// "restart-old", "restart-new", "restart-survivor": rank 2's first process sends to ranks 0
// and 1 and is killed; its slot's next process registers, is seen alive with incarnation 2, and
// its messages (not the old one's) are received.
int run_restart(const std::string& role, int rank, const cadence_test::events& ev) {
  zmq_communicator c(rank, 3, rank_options(rank, ev, zmq_wait_for::all), 20s);
  constexpr int tag = 5, reply_tag = 6;
  if (role == "restart-old") {
    rank_check(c.incarnation(2) == 1, "the first process in slot 2 is incarnation 1");
    const std::int32_t old = 1;
    c.send(&old, sizeof old, 0, tag, 20s);
    c.send(&old, sizeof old, 1, tag, 20s);
    ev.post("old sent");
    ev.wait("never", 60s);  // killed here
    return 1;
  }
  if (role == "restart-new") {
    rank_check(c.incarnation(2) == 2, "the second process in slot 2 is incarnation 2");
    const std::int32_t fresh = 2;
    for (int p : {0, 1}) c.send(&fresh, sizeof fresh, p, tag, 20s);
    for (int p : {0, 1}) {
      std::int32_t r = -1;
      c.recv(&r, sizeof r, p, reply_tag, 20s);
      rank_check(r == 100 + p, "a reply from rank " + std::to_string(p));
    }
    ev.post("new done");
    return 0;
  }
  // A survivor (rank 0 or 1).
  ev.post_rank("survivor ready", rank);
  rank_check(await_state(c, 2, zmq_peer_state::lost), "the killed rank 2 was never seen lost");
  ev.post_rank("lost seen", rank);
  rank_check(await_state(c, 2, zmq_peer_state::alive), "the restarted rank 2 was never seen alive");
  rank_check(c.incarnation(2) == 2, "the restarted rank 2 has incarnation " + std::to_string(c.incarnation(2)));
  std::int32_t got = -1;
  c.recv(&got, sizeof got, 2, tag, 20s);
  rank_check(got == 2, "received " + std::to_string(got) + " from rank 2: the old process's message was not dropped");
  const std::int32_t reply = 100 + rank;
  c.send(&reply, sizeof reply, 2, reply_tag, 20s);
  rank_check(!c.failed(), "a restart failed a survivor's communicator");
  rank_check(ev.wait("new done"), "the restarted rank 2 never finished");
  return 0;
}

// "late": ranks 0 and 1 run (wait_for = self) before rank 2 exists; rank 0's message to it
// waits; once the test starts rank 2 it joins, takes it, answers, and all three meet in a
// collective.
int run_late(int rank, const cadence_test::events& ev) {
  zmq_communicator c(rank, 3, rank_options(rank, ev, zmq_wait_for::self), 20s);
  constexpr int tag = 4;
  if (rank == 2) {
    std::int32_t got = -1;
    rank_check(c.recv(&got, sizeof got, 0, tag, 20s) == 0 && got == 42, "the message that waited for rank 2");
    const std::int32_t back = 43;
    c.send(&back, sizeof back, 0, tag, 20s);
  } else if (rank == 1) {
    std::int32_t ping = 0;
    c.recv(&ping, sizeof ping, 0, tag, 20s);
    c.send(&ping, sizeof ping, 0, tag, 20s);
  } else {
    rank_check(c.peer_state(2) == zmq_peer_state::absent, "rank 2 is absent at first");
    const std::int32_t msg = 42;
    zmq_work s = c.isend(&msg, sizeof msg, 2, tag);
    std::int32_t answer = -1;
    zmq_work r = c.irecv(&answer, sizeof answer, 2, tag);
    rank_check(!s.test() && !r.test(), "an operation with an absent peer completed");
    std::int32_t ping = 7;  // the world runs without rank 2 (rank 1 registers meanwhile)
    c.send(&ping, sizeof ping, 1, tag, 20s);
    c.recv(&ping, sizeof ping, 1, tag, 20s);
    rank_check(!s.test() && c.peer_state(2) == zmq_peer_state::absent, "rank 2 came before it was started");
    ev.post("running");
    s.wait(20s);
    r.wait(20s);
    rank_check(answer == 43 && c.incarnation(2) == 1, "rank 2's answer");
  }
  barrier(c, 20s);
  return 0;
}

int run_rank(const std::string& scenario, int rank, const std::string& events_dir) {
  const cadence_test::events ev(events_dir);
  return cadence_test::rank_main("rank " + std::to_string(rank) + " (" + scenario + ")", [&] {
    if (scenario == "kill" || scenario == "stop") return run_lost(scenario, rank, ev);
    if (scenario.rfind("restart-", 0) == 0) return run_restart(scenario, rank, ev);
    if (scenario == "late") return run_late(rank, ev);
    // The harness's own tests (below): a rank that fails a check, and one that never ends.
    if (scenario == "fails") rank_check(false, "a check that fails on purpose");
    if (scenario == "hangs") ev.wait("never", 60s);
    if (scenario == "fails" || scenario == "hangs") return 0;
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 2;
  });
}

// ---- the test process ----

using cadence_test::rank_process;

// Starts rank `rank` of `scenario` as a process of this executable, named by `who`.
rank_process start(const std::string& scenario, int rank, const cadence_test::events& ev,
                   const std::string& who) {
  return cadence_test::start_rank(who, {"cadence-zmq-rank", "--zmq-rank", scenario, std::to_string(rank), ev.dir()});
}
rank_process start(const std::string& scenario, int rank, const cadence_test::events& ev) {
  return start(scenario, rank, ev, "rank " + std::to_string(rank));
}

// Starts rank r of scenarios[r] for every r.
std::vector<rank_process> start_ranks(const cadence_test::events& ev, const std::vector<std::string>& scenarios) {
  std::vector<rank_process> kids;
  for (std::size_t r = 0; r < scenarios.size(); ++r) kids.push_back(start(scenarios[r], static_cast<int>(r), ev));
  return kids;
}

// "kill" and "stop": starts the three ranks and waits until ranks 0 and 1 are talking and the
// victim, rank 2, is ready for the fault.
std::vector<rank_process> start_lost(const std::string& scenario, const cadence_test::events& ev) {
  std::vector<rank_process> kids = start_ranks(ev, {scenario, scenario, scenario});
  CHECK(ev.wait("victim ready"));
  CHECK(ev.wait("talking"));
  return kids;
}

// Waits for every rank (a minute at most) and checks how each ended: killed by the SIGKILL the
// test sent for the ranks in `killed`, exited cleanly (its own checks passed) for the others.
void check_ends(std::vector<rank_process>& kids, std::initializer_list<std::size_t> killed = {}) {
  cadence_test::wait_ranks(kids, 60s);
  for (std::size_t i = 0; i < kids.size(); ++i) {
    if (std::find(killed.begin(), killed.end(), i) != killed.end())
      check_killed(kids[i]);
    else
      check_exited(kids[i]);
  }
}

}  // namespace

int cadence_zmq_rank_main(int argc, char** argv) {
  if (argc != 5) return 2;
  return run_rank(argv[2], std::atoi(argv[3]), argv[4]);
}

TEST_CASE("a peer killed with SIGKILL while the others talk fails only the receive that needs it; "
          "their point-to-point traffic goes on and failed() stays false" * doctest::timeout(120)) {
  const cadence_test::events ev;
  std::vector<rank_process> kids = start_lost("kill", ev);
  kids[2].kill();
  check_ends(kids, {2});
}

TEST_CASE("a peer stopped with SIGSTOP past the heartbeat timeout is lost for the others, who go "
          "on; resumed, it finds itself cut off" * doctest::timeout(120)) {
  const cadence_test::events ev;
  std::vector<rank_process> kids = start_lost("stop", ev);
  kids[2].stop();
  CHECK(ev.wait("survivors done"));
  ev.post("victim resumed");
  kids[2].resume();
  check_ends(kids);
}

TEST_CASE("a rank restarted in its slot (a new process) is seen alive again with a new "
          "incarnation, its messages flow and the old process's are dropped" * doctest::timeout(120)) {
  const cadence_test::events ev;
  std::vector<rank_process> kids = start_ranks(ev, {"restart-survivor", "restart-survivor", "restart-old"});
  CHECK(ev.wait("old sent"));
  CHECK(ev.wait_ranks("survivor ready", 2, -1));
  kids[2].kill();
  CHECK(ev.wait_ranks("lost seen", 2, -1));
  kids.push_back(start("restart-new", 2, ev, "the restarted rank 2"));
  check_ends(kids, {2});
}

TEST_CASE("a late rank joins a running world (wait_for = self): what waited for it is delivered "
          "and collectives then include it" * doctest::timeout(120)) {
  const cadence_test::events ev;
  std::vector<rank_process> kids = start_ranks(ev, {"late", "late"});
  CHECK(ev.wait("running"));
  kids.push_back(start("late", 2, ev));
  check_ends(kids);
}

// The harness must be able to fail: a rank that fails a check and a rank that hangs past the
// limit each fail the test (doctest::should_fail: these pass only if they fail).
TEST_CASE("the process harness fails a test whose rank fails its checks" * doctest::should_fail() *
          doctest::timeout(60)) {
  const cadence_test::events ev;
  std::vector<rank_process> kids = start_ranks(ev, {"fails"});
  check_ends(kids);
}

TEST_CASE("the process harness kills a rank still running at its limit and fails the test" *
          doctest::should_fail() * doctest::timeout(60)) {
  const cadence_test::events ev;
  std::vector<rank_process> kids = start_ranks(ev, {"hangs"});
  cadence_test::wait_ranks(kids, 1s);  // the rank never ends: the limit always passes
  CHECK(kids[0].killed());             // passes: killed at the limit; wait_ranks failed the test
}
