// The ZeroMQ backend's guarded wire: a communicator needs the job secret (or open security asked
// for by name, on loopback only unless forced); a process without the secret cannot register,
// and rank 0 counts and reports it while the job goes on; bytes that are not ZeroMQ, a client of
// another security mode, and (in open mode) a frame that breaks the protocol are refused without
// harm to the ranks that hold the secret.
#include <cadence/transport/zmq/communicator.hpp>

#include "transport/conformance.hpp"
#include "zmq_ranks.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using cadence_conformance::expect_throw;
using cadence_zmq_test::alone_options;
using cadence_zmq_test::options_for;
using cadence_zmq_test::rendezvous_box;
using cadence_zmq_test::run_world;
using cadence_zmq_test::thread_options;

namespace {

// The port of a "tcp://127.0.0.1:port" address.
int port_of(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// Writes `bytes` to 127.0.0.1:port over a plain TCP connection and closes it.
void write_raw(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  CHECK(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

// Rank 0 of a world of two that waits for nobody, recording what it reports.
struct reporting_rank0 {
  std::vector<std::string> events;
  zmq_options options(rendezvous_box& box) {
    auto o = alone_options(box);
    o.on_event = [this](const std::string& line) { events.push_back(line); };
    return o;
  }
  bool reported(const std::string& needle) const {
    for (const auto& e : events)
      if (e.find(needle) != std::string::npos) return true;
    return false;
  }
};

// Rank 0 polls (it answers in its calls) until `done` or an upper bound that only catches a hang.
template <class Done>
void poll_until(zmq_communicator& c, Done done) {
  const auto limit = std::chrono::steady_clock::now() + 60s;
  while (!done() && std::chrono::steady_clock::now() < limit) {
    c.poll();
    std::this_thread::sleep_for(2ms);
  }
  CHECK(done());
}

}  // namespace

TEST_CASE("zmq security: no secret, or open security on a network address, is refused before any "
          "waiting" * doctest::timeout(60)) {
  auto refused = [](const zmq_options& o, std::initializer_list<std::string> needles) {
    expect_throw<invalid_parameter_error>(0, [&] { zmq_communicator c(0, 2, o, 20s); }, needles);
  };
  auto none = options_for("tcp://127.0.0.1:0");
  none.secret = job_secret();
  refused(none, {"construction on rank 0 of 2", "no job secret", "wire_security::open"});

  auto open_network = options_for("tcp://10.11.12.13:29500");
  open_network.security = wire_security::open;
  refused(open_network, {"open (unauthenticated)", "tcp://10.11.12.13:29500", "force_open_on_network"});
  auto open_endpoint = options_for("tcp://127.0.0.1:0");
  open_endpoint.security = wire_security::open;
  open_endpoint.endpoint = "tcp://192.0.2.7:0";
  refused(open_endpoint, {"tcp://192.0.2.7:0", "force_open_on_network"});
}

TEST_CASE("zmq security: open security on loopback works when asked for by name" * doctest::timeout(60)) {
  run_world(2, [&](int r, rendezvous_box& box) {
    auto o = thread_options(r, box);
    o.secret = job_secret();
    o.security = wire_security::open;
    zmq_communicator c(r, 2, o, 30s);
    float x = static_cast<float>(r + 1);
    c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 30s);
    CHECK(x == 3.0f);
  });
}

TEST_CASE("zmq security: a process with another secret cannot register; rank 0 counts and reports "
          "the refusal, and the job goes on" * doctest::timeout(120)) {
  const cadence_test::events ev;
  reporting_rank0 rank0;
  run_world(2, [&](int r, rendezvous_box& box) {
    if (r == 0) {
      zmq_communicator c(0, 2, rank0.options(box), 30s);
      poll_until(c, [&] { return c.stats().refused_connections >= 1; });
      ev.wait("stranger gone");
      ev.post("join");
      float x = 1;
      c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 60s);  // with the rank that holds the secret
      CHECK(x == 3.0f);
      c.poll();
      CHECK(c.stats().malformed == 0);
      CHECK(c.stats().dropped_peers == 0);
      CHECK_MESSAGE(rank0.reported("did not prove the job secret"), "events: " << rank0.events.size());
      return;
    }
    const std::string address = box.get();
    auto stranger = options_for(address);
    stranger.secret = job_secret::generate();
    // It retries for its whole deadline (rank 0 never answers it): the message says why.
    expect_throw<transport_error>(1, [&] { zmq_communicator c(1, 2, stranger, 5s); },
                                  {"construction on rank 1 of 2", "never answered at the rendezvous",
                                   "rank 0", "another security mode or job secret"});
    ev.post("stranger gone");
    ev.wait("join");
    zmq_communicator c(1, 2, options_for(address), 30s);
    float x = 2;
    c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 60s);
    CHECK(x == 3.0f);
  });
}

TEST_CASE("zmq security: a client without authentication is turned away by an authenticated rank 0, "
          "naming the handshake" * doctest::timeout(60)) {
  run_world(2, [&](int r, rendezvous_box& box) {
    if (r == 0) {
      zmq_communicator c(0, 2, alone_options(box), 30s);
      poll_until(c, [&] { return c.stats().refused_connections >= 1; });
      CHECK(c.peer_state(1) == zmq_peer_state::absent);
      return;
    }
    auto plain = options_for(box.get());
    plain.secret = job_secret();
    plain.security = wire_security::open;
    expect_throw<transport_error>(1, [&] { zmq_communicator c(1, 2, plain, 3s); },
                                  {"never answered at the rendezvous", "another security mode or job secret"});
  });
}

TEST_CASE("zmq security: bytes that are not ZeroMQ, at the rendezvous and at a data endpoint, harm "
          "nobody" * doctest::timeout(60)) {
  const cadence_test::events ev;
  run_world(2, [&](int r, rendezvous_box& box) {
    if (r == 0) {
      zmq_communicator c(0, 2, alone_options(box), 30s);
      const std::string junk = std::string("GET / HTTP/1.1\r\n\r\n") + std::string(4096, '\xff');
      write_raw(port_of(c.rendezvous()), junk);
      write_raw(port_of(c.endpoint()), junk);
      write_raw(port_of(c.endpoint()), std::string("\xff\0\0\0\0\0\0\0\x01\x7f", 10) + std::string(1 << 16, 'A'));
      c.poll();
      ev.post("junk sent");
      int v = 0;
      c.recv(&v, sizeof v, 1, 5, 60s);
      CHECK(v == 17);
      CHECK(c.stats().malformed == 0);  // none of it got past ZeroMQ's handshake
      return;
    }
    const std::string address = box.get();
    ev.wait("junk sent");
    zmq_communicator c(1, 2, options_for(address), 30s);
    const int v = 17;
    c.send(&v, sizeof v, 0, 5, 60s);
  });
}

TEST_CASE("zmq security: in open mode a frame that breaks the protocol is counted and reported, and "
          "the rank goes on" * doctest::timeout(60)) {
  reporting_rank0 rank0;
  const cadence_test::events ev;
  run_world(2, [&](int r, rendezvous_box& box) {
    if (r == 0) {
      auto o = rank0.options(box);
      o.secret = job_secret();
      o.security = wire_security::open;
      zmq_communicator c(0, 2, o, 30s);
      // A stranger's DEALER, in open mode, sends what no Cadence rank sends.
      void* ctx = zmq_ctx_new();
      void* s = zmq_socket(ctx, ZMQ_DEALER);
      const int zero = 0;
      zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
      const std::string forged_id = "not a rank";
      zmq_setsockopt(s, ZMQ_ROUTING_ID, forged_id.data(), forged_id.size());
      REQUIRE(zmq_connect(s, c.endpoint().c_str()) == 0);
      const std::string garbage(300, '\x5a');
      zmq_send(s, garbage.data(), garbage.size(), 0);
      poll_until(c, [&] { return c.stats().malformed >= 1; });
      zmq_close(s);
      zmq_ctx_term(ctx);
      CHECK(rank0.reported("dropped a malformed message"));
      ev.post("forged");
      float x = 1;
      c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 60s);
      CHECK(x == 3.0f);
      return;
    }
    auto o = options_for(box.get());
    o.secret = job_secret();
    o.security = wire_security::open;
    ev.wait("forged");
    zmq_communicator c(1, 2, o, 30s);
    float x = 2;
    c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 60s);
    CHECK(x == 3.0f);
  });
}
