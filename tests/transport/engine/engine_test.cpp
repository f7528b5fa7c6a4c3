// cadence/transport/engine/engine.hpp: the progress engine under the host backends, over a
// scripted backend (scripted_engine.hpp) whose operations complete or fail when the test says:
// collectives one at a time in issue order beside point to point, the failure latch (contract
// b), abort from another thread, deadlines that name whom an operation waits for, try_recv's
// poll outcomes, wait_until's timed return, orphaned handles, the argument checks at every call.
#include <cadence/core/error.hpp>

#include "support/message_of.hpp"
#include "scripted_engine.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence_scripted_engine {
namespace engine_tests {

using ct::dtype;
using ct::reduce_op;
using clock_type = ct::deadline::clock;

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// The message of the transport_error a call throws (cadence::test::no_exception if none).
template <class F>
std::string error_of(F&& f) {
  return cadence::test::message_of<cadence::transport_error>(std::forward<F>(f));
}

TEST_CASE("collectives activate one at a time in issue order while point-to-point operations complete beside them") {
  scripted b(0, 3);
  float buf[4] = {};
  auto a1 = b.iallreduce(buf, 4, dtype::f32, reduce_op::sum);
  auto a2 = b.ibroadcast(buf, 16, 0);
  b.complete_on = 2;
  auto s = b.isend(buf, 16, 1, 7);
  auto r = b.irecv(buf, 16, 2, 7);
  CHECK(b.log == std::vector<std::string>{"activate #1"});
  // Every start made a progress pass: the send and receive ran beside the first collective.
  CHECK(s.test());
  CHECK(r.test());
  CHECK(r.source() == 2);
  CHECK_FALSE(a1.test());
  CHECK_FALSE(a2.test());
  CHECK(b.started[1]->passes == 0);  // queued behind the first: never advanced
  CHECK_FALSE(b.started[1]->active);
  scripted::release(*b.started[0]);
  CHECK_FALSE(a2.test());  // this pass completes the first and activates the second
  CHECK(b.log == std::vector<std::string>{"activate #1", "activate #2"});
  CHECK(a1.test());
  scripted::release(*b.started[1]);
  CHECK(a2.test());
  // The k-th collective carries index k; every call its own sequence number.
  CHECK(b.started[0]->sig.index == 1);
  CHECK(b.started[1]->sig.index == 2);
  for (std::size_t i = 0; i < b.started.size(); ++i) CHECK(b.started[i]->c.seq == i + 1);
  CHECK(b.in_flight() == 0);
}

TEST_CASE("a later collective waits for the earlier one whichever handle is waited first") {
  scripted b(1, 2);
  double x = 1;
  auto first = b.iallreduce(&x, 1, dtype::f64, reduce_op::max);
  auto second = b.iallreduce(&x, 1, dtype::f64, reduce_op::min);
  b.on_idle = [&] {
    if (b.started[0]->passes >= 3 && !b.started[0]->done) scripted::release(*b.started[0]);
    if (b.started[1]->active && b.started[1]->complete_on < 0) scripted::release(*b.started[1]);
  };
  second.wait(std::chrono::minutes(1));
  CHECK(b.started[0]->done);
  CHECK(b.log == std::vector<std::string>{"activate #1", "activate #2"});
  CHECK(first.test());
}

TEST_CASE(
    "a failure sticks: the call throws it, and every handle in flight and every later call rethrows it (contract b)") {
  scripted b(1, 4);
  float buf[4] = {};
  auto r = b.irecv(buf, 16, 0, 1);
  auto a = b.iallreduce(buf, 4, dtype::f32, reduce_op::sum);
  scripted::fail_next(*b.started[1]);
  const std::string first = error_of([&] { a.wait(std::chrono::minutes(1)); });
  CHECK(first == "cadence::transport[scripted]: allreduce #2 on rank 1 of 4: scripted failure");
  CHECK(b.failed());
  CHECK(b.log.back() == "on_fail 2");  // both operations in flight were handed to the backend
  CHECK(b.started[0]->failed);
  CHECK(b.in_flight() == 0);
  CHECK(error_of([&] { r.test(); }) == first);
  CHECK(error_of([&] { r.wait(std::chrono::minutes(1)); }) == first);
  CHECK(error_of([&] { a.test(); }) == first);
  CHECK(error_of([&] { b.allreduce(buf, 4, dtype::f32, reduce_op::sum); }) == first);
  CHECK(error_of([&] { b.send(nullptr, 4, 0, 0); }) == first);  // the failure before the argument checks
  CHECK(error_of([&] { (void)b.try_recv(buf, 4, 0, 0, std::chrono::seconds(1)); }) == first);
  b.abort();
  CHECK(error_of([&] { b.broadcast(buf, 4, 0); }) == first);  // and before "aborted"
  CHECK(b.started.size() == 2);                               // nothing started after the failure
}

TEST_CASE("after abort() with no failure before it, every call and every handle in flight throws naming itself") {
  scripted b(0, 2);
  int x = 0;
  auto w = b.iallreduce(&x, 1, dtype::i32, reduce_op::sum);
  CHECK_FALSE(b.failed());
  b.abort();
  b.abort();  // idempotent
  CHECK(b.failed());
  CHECK(b.aborts_seen.load() == 2);
  CHECK(error_of([&] { w.test(); }) ==
        "cadence::transport[scripted]: allreduce #1 on rank 0 of 2: the communicator was aborted (abort())");
  CHECK(error_of([&] { b.allreduce(&x, 1, dtype::i32, reduce_op::sum); }) ==
        "cadence::transport[scripted]: allreduce #2 on rank 0 of 2: the communicator was aborted (abort())");
  CHECK(error_of([&] { (void)b.isend(&x, 4, 1, 3); }) ==
        "cadence::transport[scripted]: send #3 on rank 0 of 2: the communicator was aborted (abort())");
}

TEST_CASE(
    "abort() from another thread wakes a call waiting on the owning thread, which throws naming whom it waited for" *
    doctest::timeout(60)) {
  scripted b(0, 3);
  b.waits_for = {{2}, "scripted wait"};
  float buf[2] = {};
  std::thread watchdog([&] {
    while (b.idles.load() == 0) std::this_thread::yield();  // the call is waiting
    b.abort();
  });
  const std::string e = error_of([&] { b.recv(buf, 8, 2, 0, std::chrono::hours(1)); });
  watchdog.join();
  CHECK(e ==
        "cadence::transport[scripted]: recv #1 on rank 0 of 3: the communicator was aborted (abort()) while waiting "
        "for rank 2");
  CHECK(b.failed());
  CHECK(b.aborts_seen.load() == 1);
  CHECK(error_of([&] { b.send(buf, 8, 1, 0); }) == e);  // the interrupted wait failed the communicator
}

TEST_CASE("a deadline that passes names whom the operation waits for and why, and fails the communicator") {
  float buf[2] = {};
  SUBCASE("the peers the backend names") {
    scripted b(1, 4);
    b.waits_for = {{3, 0}, "scripted note"};
    const std::string e = error_of([&] { b.recv(buf, 8, 3, 5, std::chrono::milliseconds(2)); });
    CHECK(starts_with(e, "cadence::transport[scripted]: recv #1 on rank 1 of 4: deadline passed "));
    CHECK(ends_with(e, " s after the call while waiting for ranks 3, 0 (scripted note)"));
    CHECK(b.failed());
    CHECK(error_of([&] { b.send(buf, 8, 0, 0); }) == e);
  }
  // The error of an all-reduce whose deadline passes on rank r of n, the backend naming nobody.
  auto nobody_named = [&](int r, int n) {
    scripted b(r, n);
    b.waits_for = {{}, ""};
    return error_of([&] { b.allreduce(buf, 2, dtype::f32, reduce_op::sum, std::chrono::milliseconds(2)); });
  };
  SUBCASE("nobody named: every other rank") {
    CHECK(ends_with(nobody_named(1, 4), " s after the call while waiting for ranks 0, 2, 3"));
  }
  SUBCASE("nobody named on one rank: the rank itself (a timeout that names nobody is a bug)") {
    CHECK(ends_with(nobody_named(0, 1), " s after the call while waiting for rank 0"));
  }
  SUBCASE("a handle's wait") {
    scripted b(2, 3);
    auto w = b.ibroadcast(buf, 8, 0);
    b.waits_for = {{0}, "the root"};
    const std::string e = error_of([&] { w.wait(std::chrono::milliseconds(2)); });
    CHECK(starts_with(e, "cadence::transport[scripted]: broadcast #1 on rank 2 of 3: deadline passed "));
    CHECK(ends_with(e, "while waiting for rank 0 (the root)"));
    CHECK(b.failed());
  }
}

TEST_CASE_FIXTURE(
    rank0_of_two,
    "try_recv whose receive is withdrawn at its deadline returns nothing and leaves the communicator usable; a "
    "deadline already passed polls once") {
  b.poll_outcomes.push_back({true, false, std::nullopt});
  const std::optional<int> got =
      b.try_recv(buf, 8, 1, 4, ct::deadline::at(clock_type::now() - std::chrono::seconds(1)));
  CHECK_FALSE(got.has_value());
  CHECK(b.log == std::vector<std::string>{"poll deadline"});
  CHECK(b.started[0]->cancelled);
  CHECK(b.started[0]->passes <= 2);  // the start's pass and the one poll
  CHECK_FALSE(b.failed());
  CHECK(b.in_flight() == 0);
  b.complete_on = 1;
  CHECK(b.recv(buf, 8, 1, 4) == 1);
}

TEST_CASE("try_recv completes a message that won the race with its deadline (retry)") {
  scripted b(0, 3);
  float buf[2] = {};
  b.poll_outcomes.push_back({false, true, std::nullopt});
  b.arrives_at_deadline = true;
  CHECK(b.try_recv(buf, 8, 2, 0, std::chrono::milliseconds(1)) == std::optional<int>(2));
  CHECK(b.log == std::vector<std::string>{"poll deadline"});
  CHECK_FALSE(b.failed());
}

TEST_CASE(
    "try_recv waits longer for data already arriving (extend), and fails at the extended deadline if it still does not "
    "come") {
  float buf[2] = {};
  SUBCASE("it comes") {
    scripted b(0, 3);
    b.poll_outcomes.push_back({false, false, std::chrono::milliseconds(std::chrono::hours(1))});
    b.arrives_at_deadline = true;
    CHECK(b.try_recv(buf, 8, ct::any_source, 0, std::chrono::milliseconds(1)) == std::optional<int>(2));
    CHECK(b.log == std::vector<std::string>{"poll deadline"});
    CHECK_FALSE(b.failed());
  }
  SUBCASE("it does not") {
    scripted b(0, 3);
    b.waits_for = {{1}, "its data did not come"};
    b.poll_outcomes.push_back({false, false, std::chrono::milliseconds(1)});
    const std::string e = error_of([&] { (void)b.try_recv(buf, 8, 1, 0, std::chrono::milliseconds(1)); });
    CHECK(b.log == std::vector<std::string>{"poll deadline", "poll deadline (extended)", "on_fail 1"});
    CHECK(starts_with(e, "cadence::transport[scripted]: try_recv #1 on rank 0 of 3: deadline passed "));
    CHECK(ends_with(e, "while waiting for rank 1 (its data did not come)"));
    CHECK(b.failed());
  }
}

TEST_CASE_FIXTURE(
    rank0_of_two,
    "wait_until returns false at its time, which is no failure, and a later wait completes the operation") {
  auto w = b.irecv(buf, 8, 1, 0);
  CHECK_FALSE(w.wait_until(clock_type::now() + std::chrono::milliseconds(2)));
  CHECK_FALSE(w.wait_until(clock_type::now() - std::chrono::seconds(1)));  // already past: no failure either
  CHECK_FALSE(b.failed());
  CHECK(b.log.empty());
  scripted::release(*b.started[0]);
  CHECK(w.wait_until(clock_type::now() + std::chrono::hours(1)));
  CHECK(w.source() == 1);
}

TEST_CASE(
    "handles of a destroyed communicator throw from test, wait and wait_until; cancel() returns true; completed ones "
    "stay complete") {
  std::optional<scripted> b;  // destroyed in place: the handles must not reach it again
  b.emplace(2, 3);
  float buf[2] = {};
  auto r = b->irecv(buf, 8, 0, 1);
  auto a = b->iallreduce(buf, 2, dtype::f32, reduce_op::sum);
  b->complete_on = 1;
  auto s = b->isend(buf, 8, 1, 1);
  REQUIRE(s.test());
  b.reset();
  CHECK(error_of([&] { r.test(); }) ==
        "cadence::transport[scripted]: recv #1 on rank 2 of 3: its communicator was destroyed");
  CHECK(error_of([&] { a.wait(std::chrono::minutes(1)); }) ==
        "cadence::transport[scripted]: allreduce #2 on rank 2 of 3: its communicator was destroyed");
  CHECK(error_of([&] { (void)a.wait_until(clock_type::now() + std::chrono::hours(1)); }) ==
        "cadence::transport[scripted]: allreduce #2 on rank 2 of 3: its communicator was destroyed");
  CHECK(r.cancel());
  CHECK(a.cancel());
  CHECK(r.source() == 0);
  CHECK(s.test());
  s.wait(std::chrono::minutes(1));
}

TEST_CASE_FIXTURE(
    rank0_of_two,
    "bad arguments throw invalid_parameter_error naming the call before anything starts, and leave the communicator "
    "usable (contract d)") {
  const std::string head = "cadence::transport[scripted]: ";
  CHECK_THROWS_WITH_AS(b.allreduce(nullptr, 2, dtype::f32, reduce_op::sum),
                       (head + "allreduce #1 on rank 0 of 2: null buffer with 8 bytes").c_str(),
                       cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(
      b.iallreduce_average(buf, 2, dtype::i32),
      (head +
       "allreduce_average #2 on rank 0 of 2: dtype i32 is not f32 or f64 (an integer average would have to round)")
          .c_str(),
      cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(b.broadcast(buf, 8, 2),
                       (head + "broadcast #3 on rank 0 of 2: root rank 2 is out of range [0, 2)").c_str(),
                       cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(
      b.send(buf, 8, 0, 1),
      (head + "send #4 on rank 0 of 2: a send to itself (rank 0) is not supported by the scripted backend").c_str(),
      cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(b.recv(buf, 8, 1, -1), (head + "recv #5 on rank 0 of 2: tag -1 is outside [0, 32767]").c_str(),
                       cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(b.ibroadcast(buf, 8, -1),
                       (head + "broadcast #6 on rank 0 of 2: root rank -1 is out of range [0, 2) (any_source is only "
                               "for recv on a backend with capabilities().any_source)")
                           .c_str(),
                       cadence::invalid_parameter_error);
  std::string late;
  try {
    b.allreduce(buf, 2, dtype::f32, reduce_op::sum, ct::deadline::at(clock_type::now() - std::chrono::seconds(2)));
  } catch (const cadence::invalid_parameter_error& e) {
    late = e.what();
  }
  CHECK(
      starts_with(late, head + "allreduce #7 on rank 0 of 2: its deadline had already passed when it was called (2."));
  CHECK_FALSE(b.failed());
  CHECK(b.started.empty());
  CHECK(b.collectives() == 0);  // no collective index taken: the ranks still meet on #1
  b.complete_on = 1;
  b.allreduce(buf, 2, dtype::f32, reduce_op::sum);
  REQUIRE(b.started.size() == 1);
  CHECK(b.started[0]->sig.index == 1);
  CHECK(b.started[0]->c.seq == 8);
}

TEST_CASE("the backend's rules reach the checks: host arithmetic, its own dtype check, messages to itself") {
  float buf[2] = {};
  scripted b(1, 2);
  CHECK_THROWS_WITH_AS(b.allreduce(buf, 1, dtype::f16, reduce_op::sum),
                       "cadence::transport[scripted]: allreduce #1 on rank 1 of 2: dtype f16 has no host arithmetic "
                       "(it is for device backends such as NCCL)",
                       cadence::invalid_parameter_error);
  b.rules.host_arithmetic = false;
  b.rules.native_type = [](const cd::call_info& c, dtype t) {
    if (t == dtype::u8) cd::bad_argument(c, "no native u8");
  };
  b.complete_on = 1;
  b.allreduce(buf, 1, dtype::f16, reduce_op::sum);  // a device backend's dtype passes
  CHECK_THROWS_WITH_AS(b.allreduce(buf, 1, dtype::u8, reduce_op::sum),
                       "cadence::transport[scripted]: allreduce #3 on rank 1 of 2: no native u8",
                       cadence::invalid_parameter_error);
  b.p2p.self = true;
  b.send(buf, 8, 1, 0);
  CHECK(b.recv(buf, 8, 1, 0) == 1);
  CHECK_FALSE(b.failed());
}

TEST_CASE("the blocking calls are their asynchronous forms waited at once") {
  scripted b(1, 3);
  b.complete_on = 3;
  float buf[4] = {};
  b.allreduce(buf, 4, dtype::f32, reduce_op::sum);
  b.allreduce_average(buf, 4, dtype::f32);
  b.broadcast(buf, 16, 0);
  b.send(buf, 16, 2, 9);
  CHECK(b.recv(buf, 16, ct::any_source, 9) == 2);
  CHECK(b.try_recv(buf, 16, 0, 9, std::chrono::minutes(1)) == std::optional<int>(0));
  REQUIRE(b.started.size() == 6);
  for (const auto& o : b.started) {
    CHECK(o->done);
    CHECK(o->passes == 3);
  }
  CHECK(b.started[1]->average);
  CHECK(b.started[1]->c.op == std::string("allreduce_average"));
  CHECK(b.started[5]->c.op == std::string("try_recv"));
  CHECK(b.log == std::vector<std::string>{"activate #1", "activate #2", "activate #3"});
  CHECK(b.in_flight() == 0);
}

}  // namespace engine_tests
}  // namespace cadence_scripted_engine
