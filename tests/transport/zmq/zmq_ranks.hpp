// Test support for the ZeroMQ backend: options with test-sized intervals, the rendezvous address
// handed from rank 0 to the others, and a harness that runs ranks as threads of the test
// process, each with its own communicator (and ZeroMQ context) over TCP on 127.0.0.1, shared by
// the conformance suite, the collective adapters' suite and the parameter-server suite.
#pragma once

#include <cadence/transport/zmq/communicator.hpp>

#include "support/thread_harnesses.hpp"
#include "support/threads.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cadence_zmq_test {

using namespace std::chrono_literals;

/// The job secret of these tests: every rank of every world holds the same one, as a launcher
/// hands one to every process of a job. Fixed, so that ranks forked as processes agree on it.
inline const cadence::transport::job_secret& test_secret() {
  static const cadence::transport::job_secret s =
      cadence::transport::job_secret::from_hex("00112233445566778899aabbccddeeff0f1e2d3c4b5a69788796a5b4c3d2e1f0");
  return s;
}

/// Heartbeats fast enough that a stopped peer is lost within a second (the fault tests wait for
/// that), loose enough that a busy CI machine does not lose a live one; authenticated with the
/// process's secret.
inline cadence::transport::zmq_options options_for(const std::string& rendezvous,
                                                   std::chrono::milliseconds heartbeat_timeout = 3000ms) {
  cadence::transport::zmq_options o;
  o.secret = test_secret();
  o.rendezvous = rendezvous;
  o.heartbeat_interval = heartbeat_timeout / 10;
  o.heartbeat_timeout = heartbeat_timeout;
  return o;
}

/// The address rank 0's rendezvous got (it binds port 0), for the ranks that dial it.
class rendezvous_box {
public:
  void set(const std::string& address) {
    {
      std::lock_guard<std::mutex> lock(m_);
      address_ = address;
    }
    cv_.notify_all();
  }
  /// Empty when rank 0 never bound it within `limit` (it failed: the test reports why).
  std::string get(std::chrono::milliseconds limit = 60s) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait_for(lock, limit, [&] { return !address_.empty(); });
    return address_;
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  std::string address_;
};

/// The options of rank r of a world whose rank 0 publishes its rendezvous in `box`: rank 0
/// binds port 0 on 127.0.0.1, the others wait for the address it got.
inline cadence::transport::zmq_options thread_options(int r, rendezvous_box& box,
                                                      std::chrono::milliseconds heartbeat_timeout = 3000ms) {
  if (r == 0) {
    auto o = options_for("tcp://127.0.0.1:0", heartbeat_timeout);
    o.on_rendezvous_bound = [&box](const std::string& a) { box.set(a); };
    return o;
  }
  const std::string address = box.get();
  if (address.empty()) throw std::runtime_error("rank 0 never bound its rendezvous");
  return options_for(address, heartbeat_timeout);
}

/// Rank 0's options in a world that runs without waiting for the others (wait_for = self):
/// tests of what rank 0 does with a peer that registers late, badly or not at all.
inline cadence::transport::zmq_options alone_options(rendezvous_box& box) {
  auto o = thread_options(0, box);
  o.wait_for = cadence::transport::zmq_wait_for::self;
  return o;
}

using cadence_test::run_threads;

/// Runs body(r, box) on n threads (run_threads), `box` rank 0's rendezvous address for them all.
template <class Body>
void run_world(int n, Body body) {
  rendezvous_box box;
  run_threads(n, [&](int r) { body(r, box); });
}

// What the ranks of one run share: rank 0's rendezvous address. Each rank has its own
// communicator (and ZeroMQ context) over 127.0.0.1.
struct zmq_world {
  rendezvous_box box;
  cadence::transport::zmq_communicator join(int r, int n) {
    return cadence::transport::zmq_communicator(r, n, thread_options(r, box), 30s);
  }
};

}  // namespace cadence_zmq_test

// Ranks as threads of this process: zmq_threads_harness<N>, zmq_harness, zmq_pair_harness.
CADENCE_THREAD_HARNESSES(cadence_zmq_test, zmq, zmq_world);
