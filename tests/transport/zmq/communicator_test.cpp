// The ZeroMQ backend: the conformance suite with ranks as threads (each its own communicator and
// ZeroMQ context over 127.0.0.1), plus what is this backend's own with ranks as threads:
// capabilities, the rendezvous (a rank that never comes, sizes that differ, bad options), lost
// peers that fail only the calls that need them, incarnations, credits, abort. The tests with
// real processes (SIGKILL, SIGSTOP, restart, late join) are in fault_test.cpp.
#include <cadence/transport/zmq/communicator.hpp>

#include "transport/conformance.hpp"
#include "zmq_ranks.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using cadence_conformance::expect_throw;
using steady = std::chrono::steady_clock;

CADENCE_REQUIRE_COMMUNICATOR(zmq_communicator);
static_assert(has_try_recv_v<zmq_communicator>, "the zmq backend offers try_recv");
static_assert(has_async_v<zmq_communicator>, "the zmq backend offers the asynchronous operations");
static_assert(is_work_v<zmq_work>, "zmq_work models the work handle");

using cadence_zmq_test::zmq_harness;
using cadence_zmq_test::zmq_pair_harness;

TYPE_TO_STRING(zmq_harness);
CADENCE_TRANSPORT_CONFORMANCE(zmq_harness);

TEST_CASE("zmq capabilities: any_source, and a lost peer is detected, survived and isolated" *
          doctest::timeout(60)) {
  zmq_pair_harness::run([](zmq_communicator& c) {
    const capability_flags f = c.capabilities();
    CHECK(f.any_source);
    CHECK(f.detects_lost_peer);
    CHECK(f.survives_lost_peer);
    CHECK(f.isolates_lost_peer);
    CHECK_FALSE(f.device_buffers);
    CHECK(c.size() == 2);
    CHECK(c.peer_state(1 - c.rank()) == zmq_peer_state::alive);
    CHECK(c.incarnation(0) == 1);
    CHECK(c.incarnation(1) == 1);
    // Both stay until both have looked: a peer that left is lost ("it left").
    const cadence_test::events& ev = cadence_test::current_events();
    ev.post_rank("checked", c.rank());
    CHECK(ev.wait_ranks("checked", 2, c.rank()));
  });
}
