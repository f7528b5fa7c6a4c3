#include <cadence/transport/inproc.hpp>

#include "transport/conformance.hpp"
#include "transport/inproc_ranks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace cadence_conformance::test_names;

CADENCE_TRANSPORT_CONFORMANCE(cadence_test::inproc_4);

TEST_CASE("a world needs at least one rank, and each rank joins once" * doctest::timeout(10)) {
  CHECK_THROWS_AS(inproc_world(0), invalid_parameter_error);
  inproc_world world(2);
  auto c0 = world.join(0);
  CHECK(c0.rank() == 0);
  CHECK(c0.size() == 2);
  CHECK_THROWS_WITH_AS(world.join(0), doctest::Contains("rank 0 has already joined"),
                       invalid_parameter_error);
  CHECK_THROWS_WITH_AS(world.join(2), doctest::Contains("rank 2 is out of range"),
                       invalid_parameter_error);
  CHECK_THROWS_AS(world.kill(-1), invalid_parameter_error);
  CHECK_THROWS_AS(world.delay_link(0, 1, -1ms), invalid_parameter_error);
  static_assert(is_communicator_v<inproc_communicator>);
}

TEST_CASE("the in-process capabilities: any_source, lost peers seen and survived, host buffers" *
          doctest::timeout(10)) {
  inproc_world world(1);
  const auto caps = world.join(0).capabilities();
  CHECK(caps.any_source);
  CHECK(caps.detects_lost_peer);
  CHECK(caps.survives_lost_peer);
  CHECK_FALSE(caps.device_buffers);
}

TEST_CASE("a world of one rank reduces and broadcasts its own data and can message itself" *
          doctest::timeout(10)) {
  inproc_world world(1);
  auto c = world.join(0);
  double x[2] = {1.5, -2};
  c.allreduce(x, 2, dtype::f64, reduce_op::sum, 5s);
  CHECK((x[0] == 1.5 && x[1] == -2));
  c.broadcast(x, sizeof x, 0, 5s);
  const int v = 7;
  int w = 0;
  c.send(&v, sizeof v, 0, 1, 5s);
  CHECK(c.recv(&w, sizeof w, any_source, 1, 5s) == 0);
  CHECK(w == 7);
}

TEST_CASE("f16 and bf16 are refused: the host cannot reduce them" * doctest::timeout(10)) {
  inproc_world world(1);
  auto c = world.join(0);
  std::uint16_t h = 0;
  CHECK_THROWS_WITH_AS(c.allreduce(&h, 1, dtype::bf16, reduce_op::sum, 5s),
                       doctest::Contains("dtype bf16 has no host arithmetic"), invalid_parameter_error);
  CHECK_FALSE(c.failed());
}

TEST_CASE("a killed rank is reported as lost before the deadline, and its own calls fail" *
          doctest::timeout(60)) {
  inproc_world world(3);
  std::atomic<int> waiting{0};
  std::thread killer([&] {
    while (waiting.load() < 2) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(50ms);  // let both survivors block in their calls
    world.kill(2);
  });
  cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
    float x = 1;
    if (c.rank() == 2) {
      // The crashed process: its call never completes normally.
      expect_throw<transport_error>(2, [&] { c.recv(&x, sizeof x, 0, 9, 30s); },
                                    {"recv #1 on rank 2", "this rank is gone", "killed"});
      return;
    }
    ++waiting;
    const auto t0 = steady::now();
    expect_throw<transport_error>(c.rank(), [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 30s); },
                                  {"allreduce #1 on rank " + std::to_string(c.rank()),
                                   "lost rank 2 (killed by fault injection)"});
    // Seen as lost, not timed out: long before the 30 s deadline.
    CHECK(seconds_since(t0) < 20.0);
  });
  killer.join();
}

TEST_CASE("messages a rank sent before it was killed are still delivered" * doctest::timeout(30)) {
  inproc_world world(2);
  {
    auto c1 = world.join(1);
    const int v = 42;
    c1.send(&v, sizeof v, 0, 0, 5s);
    world.kill(1);
  }
  auto c0 = world.join(0);
  int got = 0;
  CHECK(c0.recv(&got, sizeof got, 1, 0, 5s) == 1);
  CHECK(got == 42);
  CHECK_THROWS_WITH_AS(c0.recv(&got, sizeof got, 1, 0, 5s), doctest::Contains("lost rank 1"),
                       transport_error);
}

TEST_CASE("a lost peer fails only the point-to-point calls that need it (isolates_lost_peer)" *
          doctest::timeout(30)) {
  inproc_world world(3);
  world.kill(2);
  auto c0 = world.join(0);
  auto c1 = world.join(1);
  CHECK(c0.capabilities().isolates_lost_peer);
  int v = 7;
  CHECK_THROWS_WITH_AS(c0.send(&v, sizeof v, 2, 0, 5s), doctest::Contains("lost rank 2"), transport_error);
  CHECK_THROWS_WITH_AS(c0.recv(&v, sizeof v, 2, 0, 5s), doctest::Contains("lost rank 2"), transport_error);
  CHECK_FALSE(c0.failed());
  c1.send(&v, sizeof v, 0, 1, 5s);  // the others stay reachable
  int got = 0;
  CHECK(c0.recv(&got, sizeof got, any_source, 1, 5s) == 1);
  CHECK(got == 7);
  CHECK_FALSE(c0.failed());
}

TEST_CASE("a rank stalled by fault injection takes no part until resumed" * doctest::timeout(60)) {
  SUBCASE("the others time out naming it") {
    inproc_world world(3);
    world.stall(1);
    cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
      std::int32_t x = c.rank();
      if (c.rank() == 1) {
        expect_throw<transport_error>(1, [&] { c.allreduce(&x, 1, dtype::i32, reduce_op::sum, 1500ms); },
                                      {"allreduce #1 on rank 1", "stalled by fault injection"});
        return;
      }
      expect_throw<transport_error>(c.rank(), [&] { c.allreduce(&x, 1, dtype::i32, reduce_op::sum, 500ms); },
                                    {"deadline passed", "waiting for rank 1"});
    });
  }
  SUBCASE("after resume() it catches up and the collective completes") {
    inproc_world world(3);
    world.stall(2);
    std::atomic<int> arrived{0};
    std::thread resumer([&] {
      while (arrived.load() < 3) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(100ms);
      world.resume(2);
    });
    cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
      std::int32_t x = c.rank() + 1;
      ++arrived;
      c.allreduce(&x, 1, dtype::i32, reduce_op::sum, 30s);
      CHECK(x == 6);
    });
    resumer.join();
  }
}

TEST_CASE("a delayed link delivers later but in order, and a shorter deadline names the sender" *
          doctest::timeout(60)) {
  SUBCASE("FIFO per source survives the delay; any_source takes an undelayed sender first") {
    inproc_world world(3);
    world.delay_link(0, 2, 1s);
    const auto start = steady::now();  // before any send, so every delayed message is >= 1 s later
    const cadence_test::events ev;
    cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
      if (c.rank() == 0) {
        for (int k = 0; k < 3; ++k) c.send(&k, sizeof k, 2, 0, 5s);
        ev.post("rank 0 sent");
      } else if (c.rank() == 1) {
        CHECK(ev.wait("rank 0 sent"));  // sends after rank 0, arrives before it
        const int k = 100;
        c.send(&k, sizeof k, 2, 0, 5s);
      } else {
        int k = -1;
        CHECK(c.recv(&k, sizeof k, any_source, 0, 5s) == 1);
        CHECK(k == 100);
        for (int expected = 0; expected < 3; ++expected) {
          CHECK(c.recv(&k, sizeof k, 0, 0, 5s) == 0);
          CHECK(k == expected);
        }
        CHECK(seconds_since(start) >= 0.999);
      }
    });
  }
  SUBCASE("an all-reduce whose deadline is shorter than the delay names the delayed sender") {
    inproc_world world(2);
    world.delay_link(1, 0, 2s);
    cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
      float x = 1;
      if (c.rank() == 1) {
        c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 5s);  // rank 0's data is not delayed
        CHECK(x == 2);
        return;
      }
      expect_throw<transport_error>(0, [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 300ms); },
                                    {"waiting for rank 1", "delayed by fault injection"});
    });
  }
}

TEST_CASE("sends above the eager limit wait for their recv, so a send-send exchange fails on its "
          "deadline instead of hanging" * doctest::timeout(60)) {
  inproc_options options;
  options.eager_limit = 16;
  inproc_world world(2, options);
  std::atomic<int> done{0};
  cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
    const int peer = 1 - c.rank();
    std::vector<char> out(64, 'x'), in(64);
    // Under the limit: buffered, so both may send first.
    c.send(out.data(), 16, peer, 0, 5s);
    c.recv(in.data(), 16, peer, 0, 5s);
    // Over it: both block in send, each waiting for the other's recv.
    expect_throw<transport_error>(c.rank(), [&] { c.send(out.data(), out.size(), peer, 1, 300ms); },
                                  {"send #3 on rank " + std::to_string(c.rank()),
                                   "waiting for rank " + std::to_string(peer), "eager limit"});
    // Stay until both have failed: a departed peer would be reported as lost instead.
    ++done;
    while (done.load() < 2) std::this_thread::sleep_for(1ms);
  });
}

TEST_CASE("on_step injects a fault at a chosen call: after skip matches, on the rank's own "
          "thread, before the call takes part" * doctest::timeout(30)) {
  inproc_world world(3);
  std::thread::id fired_on;
  int fired = 0;
  inproc_step at;
  at.op = "recv";
  at.tag = 5;
  at.skip = 1;  // the first recv with tag 5 goes by; the second one kills its own rank
  world.on_step(1, at, [&](inproc_world& w) {
    fired_on = std::this_thread::get_id();
    ++fired;
    w.kill(1);
  });
  inproc_step stall_at;
  stall_at.op = "send";
  stall_at.peer = 1;  // rank 2's first send to rank 1 stalls rank 2 until resumed
  world.on_step(2, stall_at, [](inproc_world& w) { w.stall(2); });
  CHECK_THROWS_AS(world.on_step(3, at, [](inproc_world&) {}), invalid_parameter_error);
  CHECK_THROWS_AS(world.on_step(0, at, {}), invalid_parameter_error);
  std::thread::id rank1_thread;
  std::string rank1_error, rank2_error;
  std::thread t1([&] {
    auto c = world.join(1);
    rank1_thread = std::this_thread::get_id();
    int v = 0;
    c.recv(&v, sizeof v, 0, 6, 10s);  // another tag: no match
    c.recv(&v, sizeof v, 0, 5, 10s);  // skipped
    CHECK(v == 1);
    try {
      c.recv(&v, sizeof v, 0, 5, 10s);  // killed here, before it takes the message
    } catch (const transport_error& e) {
      rank1_error = e.what();
    }
  });
  std::thread t2([&] {
    auto c = world.join(2);
    int v = 9;
    try {
      c.send(&v, sizeof v, 1, 5, 300ms);  // stalled past its deadline
    } catch (const transport_error& e) {
      rank2_error = e.what();
    }
  });
  auto c0 = world.join(0);
  const int a = 0, b = 1, z = 2;
  c0.send(&a, sizeof a, 1, 6, 10s);
  c0.send(&b, sizeof b, 1, 5, 10s);
  std::string rank0_error;
  try {
    c0.send(&z, sizeof z, 1, 5, 10s);  // rank 1 is killed before it takes this one ...
  } catch (const transport_error& e) {
    rank0_error = e.what();  // ... and may be gone before the send ends (seen under TSan)
  }
  t1.join();
  t2.join();
  CHECK(fired == 1);
  CHECK(fired_on == rank1_thread);
  CHECK(rank1_error.find("recv #3 on rank 1") != std::string::npos);
  CHECK(rank1_error.find("this rank is gone (killed by fault injection)") != std::string::npos);
  CHECK(rank2_error.find("send #1 on rank 2") != std::string::npos);
  CHECK(rank2_error.find("stalled by fault injection") != std::string::npos);
  if (!rank0_error.empty()) CHECK(rank0_error.find("lost rank 1") != std::string::npos);
}

static_assert(has_async_v<inproc_communicator>);
static_assert(is_work_v<inproc_work>);
static_assert(!is_work_v<int>);

TEST_CASE("async operations of a stalled rank enter in issue order once it is resumed; a cancelled "
          "receive takes nothing" * doctest::timeout(30)) {
  inproc_world world(2);
  auto c0 = world.join(0);
  auto c1 = world.join(1);
  world.stall(1);
  std::int32_t a = -1, b = -1, x = 5;
  auto first = c1.irecv(&a, sizeof a, 0, 3);
  auto second = c1.irecv(&b, sizeof b, 0, 3);
  auto sum = c1.iallreduce(&x, 1, dtype::i32, reduce_op::sum);
  const std::int32_t one = 1, two = 2;
  c0.send(&one, sizeof one, 1, 3, 5s);
  c0.send(&two, sizeof two, 1, 3, 5s);
  CHECK_FALSE(second.test());  // stalled: takes no part yet
  std::int32_t y = 7;
  auto other = c0.iallreduce(&y, 1, dtype::i32, reduce_op::sum);
  CHECK_FALSE(other.test());
  world.resume(1);
  second.wait(5s);  // waited first, but posted second: it gets the second message
  first.wait(5s);
  CHECK(a == 1);
  CHECK(b == 2);
  sum.wait(5s);
  other.wait(5s);
  CHECK(x == 12);
  CHECK(y == 12);
  // A cancelled receive takes nothing: the message goes to the next receive.
  std::int32_t lost = -1, kept = -1;
  {
    auto w = c1.irecv(&lost, sizeof lost, 0, 4);
    CHECK(w.cancel());
    CHECK(w.test());  // complete, cancelled
  }
  const std::int32_t three = 3;
  c0.send(&three, sizeof three, 1, 4, 5s);
  c1.recv(&kept, sizeof kept, 0, 4, 5s);
  CHECK(lost == -1);
  CHECK(kept == 3);
  // A lost peer fails the receive alone; the handle keeps saying so.
  world.kill(0);
  auto gone = c1.irecv(&kept, sizeof kept, 0, 5);
  CHECK_THROWS_WITH_AS(gone.test(), doctest::Contains("lost rank 0"), transport_error);
  CHECK_THROWS_AS(gone.wait(5s), transport_error);
  CHECK_FALSE(c1.failed());
}

TEST_CASE("restart gives a gone rank's slot to a new process: peers see it alive again, the old "
          "process's calls fail, what was queued for it is discarded" * doctest::timeout(30)) {
  inproc_world world(2);
  auto c0 = world.join(0);
  auto old = world.join(1);
  CHECK_THROWS_WITH_AS(world.restart(1), doctest::Contains("is not gone"), invalid_parameter_error);
  const std::int32_t early = 1;
  c0.send(&early, sizeof early, 1, 0, 5s);  // never taken by the old process
  world.kill(1);
  std::int32_t v = 0;
  CHECK_THROWS_WITH_AS(c0.recv(&v, sizeof v, 1, 0, 5s), doctest::Contains("lost rank 1"), transport_error);
  auto fresh = world.restart(1);
  CHECK_THROWS_WITH_AS(old.send(&v, sizeof v, 0, 0, 5s), doctest::Contains("a new process took its slot"),
                       transport_error);
  CHECK(old.failed());
  CHECK_FALSE(fresh.failed());
  const std::int32_t hello = 7;
  fresh.send(&hello, sizeof hello, 0, 0, 5s);
  CHECK(c0.recv(&v, sizeof v, 1, 0, 5s) == 1);
  CHECK(v == 7);
  const std::int32_t later = 2;
  c0.send(&later, sizeof later, 1, 0, 5s);
  CHECK(fresh.recv(&v, sizeof v, 0, 0, 5s) == 0);
  CHECK(v == 2);  // the message for the old process was discarded
  { auto gone = std::move(old); }  // destroying the old communicator does not touch the new one
  CHECK_FALSE(fresh.failed());
  fresh.send(&hello, sizeof hello, 0, 0, 5s);
  CHECK(c0.recv(&v, sizeof v, 1, 0, 5s) == 1);
}

TEST_CASE("abort() from another thread wakes a blocked call, which throws" * doctest::timeout(60)) {
  inproc_world world(2);
  auto c0 = world.join(0);
  auto c1 = world.join(1);  // joined but silent: rank 0 waits for it
  const abort_after watchdog(c0, 100ms);
  float x = 0;
  const auto t0 = steady::now();
  CHECK_THROWS_WITH_AS(c0.recv(&x, sizeof x, 1, 0, 30s),
                       doctest::Contains("recv #1 on rank 0 of 2: the communicator was aborted"),
                       transport_error);
  CHECK(seconds_since(t0) < 20.0);
  CHECK(c0.failed());
  CHECK_FALSE(c1.failed());
}

TEST_CASE("a destroyed communicator is a lost peer, not a silent one" * doctest::timeout(30)) {
  inproc_world world(2);
  auto c0 = world.join(0);
  world.join(1);  // the temporary is destroyed at once
  float x = 0;
  CHECK_THROWS_WITH_AS(c0.allreduce(&x, 1, dtype::f32, reduce_op::sum, 30s),
                       doctest::Contains("lost rank 1 (its communicator was destroyed)"),
                       transport_error);
}

TEST_CASE("a moved communicator keeps its rank and sequence numbers" * doctest::timeout(30)) {
  inproc_world world(1);
  auto a = world.join(0);
  float x = 0;
  a.allreduce(&x, 1, dtype::f32, reduce_op::sum, 5s);
  inproc_communicator b = std::move(a);
  CHECK(b.rank() == 0);
  CHECK_THROWS_WITH_AS(b.send(&x, sizeof x, 3, 0, 5s), doctest::Contains("send #2 on rank 0"),
                       invalid_parameter_error);
}

TEST_CASE("many rounds of mixed traffic from every rank stay consistent" * doctest::timeout(120)) {
  // A seeded mix of collectives and ring messages of varying sizes: the ordering and
  // matching must hold over many rounds, not just one call (and TSan sees the interleavings).
  inproc_world world(4);
  cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
    const int n = c.size(), r = c.rank();
    std::uint32_t seed = 12345;  // identical on every rank: every rank picks the same sizes
    for (int round = 0; round < 200; ++round) {
      seed = seed * 1664525u + 1013904223u;
      const std::size_t count = (seed >> 8) % 5000;
      std::vector<std::int64_t> v(count, r + round);
      c.allreduce(v.data(), count, dtype::i64, reduce_op::sum, 30s);
      const std::int64_t expected = std::int64_t{n} * round + std::int64_t{n} * (n - 1) / 2;
      CHECK(std::all_of(v.begin(), v.end(), [&](std::int64_t e) { return e == expected; }));
      const std::int64_t token[2] = {r, round};
      std::int64_t got[2] = {};
      c.send(token, sizeof token, (r + 1) % n, round % 7, 30s);
      c.recv(got, sizeof got, (r + n - 1) % n, round % 7, 30s);
      CHECK((got[0] == (r + n - 1) % n && got[1] == round));
    }
  });
}
