// cadence/transport/engine/latch.hpp: the failure latch every backend keeps (communicator
// contract b): the first failure sticks, abort() from any thread makes the owner's calls throw.
#include <cadence/core/error.hpp>
#include <cadence/transport/engine/latch.hpp>

#include "support/message_of.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <utility>

namespace cadence_latch_test {

namespace cd = cadence::transport::detail;

cd::call_info a_call(const char* op, std::uint64_t seq) {
  return {"latched", op, seq, 1, 3, cadence::transport::deadline::clock::now()};
}

// The message of the transport_error a call throws (cadence::test::no_exception if none).
template <class F>
std::string error_of(F&& f) {
  return cadence::test::message_of<cadence::transport_error>(std::forward<F>(f));
}

TEST_CASE("a fresh latch lets every call through") {
  cd::failure_latch l;
  CHECK_FALSE(l.failed());
  CHECK_FALSE(l.aborted());
  CHECK_FALSE(l.has_failure());
  CHECK(error_of([&] { l.enter(a_call("send", 1)); }) == cadence::test::no_exception);
}

TEST_CASE("the first failure recorded sticks: enter() rethrows it for every later call, even after abort()") {
  cd::failure_latch l;
  l.record(cadence::transport_error("first"));
  l.record(cadence::transport_error("second"));
  CHECK(l.failed());
  CHECK(l.has_failure());
  CHECK(error_of([&] { l.enter(a_call("recv", 4)); }) == "first");
  CHECK(error_of([&] { l.rethrow(); }) == "first");
  l.abort();
  CHECK(error_of([&] { l.enter(a_call("allreduce", 5)); }) == "first");
}

TEST_CASE("after abort() with no failure, enter() throws naming the call") {
  cd::failure_latch l;
  l.abort();
  l.abort();
  CHECK(l.failed());
  CHECK(l.aborted());
  CHECK_FALSE(l.has_failure());
  CHECK(error_of([&] { l.enter(a_call("broadcast", 9)); }) ==
        "cadence::transport[latched]: broadcast #9 on rank 1 of 3: the communicator was aborted (abort())");
}

TEST_CASE("abort() from another thread is seen by the owner's next enter()" * doctest::timeout(30)) {
  cd::failure_latch l;
  std::atomic<bool> go{false};
  std::thread other([&] {
    while (!go.load()) std::this_thread::yield();
    l.abort();
  });
  CHECK_FALSE(l.failed());
  go = true;
  other.join();
  CHECK(l.failed());
  CHECK_FALSE(error_of([&] { l.enter(a_call("send", 2)); }).empty());
}

TEST_CASE("a failure recorded on the owning thread is seen by failed() on another") {
  cd::failure_latch l;
  l.record(cadence::transport_error("lost"));
  bool seen = false;
  std::thread other([&] { seen = l.failed(); });
  other.join();
  CHECK(seen);
}

TEST_CASE("a wait that abort() interrupted names the peers it waited for, or nobody") {
  const auto c = a_call("allreduce", 3);
  CHECK(std::string(cd::failure_latch::aborted_while(c, {0, 2}).what()) ==
        "cadence::transport[latched]: allreduce #3 on rank 1 of 3: the communicator was aborted (abort()) while "
        "waiting for ranks 0, 2");
  CHECK(std::string(cd::failure_latch::aborted_while(c, {}).what()) ==
        "cadence::transport[latched]: allreduce #3 on rank 1 of 3: the communicator was aborted (abort())");
}

}  // namespace cadence_latch_test
