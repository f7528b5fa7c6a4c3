// The ZeroMQ backend's rendezvous when a registering process's connection to rank 0 breaks
// (issue 36: a restarted rank of the chaos soak waited its whole 30 s deadline for a welcome
// lost with a connection that broke on the loaded machine). One side is a real communicator,
// the other raw ZeroMQ sockets speaking the rendezvous's messages (detail/wire.hpp), so the test
// breaks the connection exactly where the bug lost the welcome. Open wire security: the raw
// sockets would otherwise need the CURVE keys. Every wait is for a message, with an upper bound
// that only catches a hang.
#include <cadence/transport/zmq/communicator.hpp>
#include <cadence/transport/zmq/detail/rendezvous.hpp>
#include <cadence/transport/zmq/detail/wire.hpp>

#include <doctest/doctest.h>

#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace cadence::transport;
using namespace cadence::transport::detail;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

zmq_options open_options(const std::string& rendezvous) {
  zmq_options o;
  o.security = wire_security::open;
  o.rendezvous = rendezvous;
  o.wait_for = zmq_wait_for::self;
  o.heartbeat_interval = 100ms;
  o.heartbeat_timeout = 1000ms;
  return o;
}

// A raw ZeroMQ context and its sockets, closed at the end of the test.
struct raw_zmq {
  void* ctx = zmq_ctx_new();
  std::vector<void*> open;
  ~raw_zmq() {
    for (void* s : open) zmq_close(s);
    zmq_ctx_term(ctx);
  }
  void* socket(int type) {
    void* s = zmq_socket(ctx, type);
    REQUIRE(s != nullptr);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    open.push_back(s);
    return s;
  }
  void close(void* s) {
    open.erase(std::remove(open.begin(), open.end(), s), open.end());
    zmq_close(s);
  }
  // A DEALER under routing id `id`, dialling `to`: a registering process's rendezvous socket.
  void* dealer(const std::string& id, const std::string& to) {
    void* s = socket(ZMQ_DEALER);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, id.data(), id.size());
    REQUIRE(zmq_connect(s, to.c_str()) == 0);
    return s;
  }
  // A ROUTER bound at `at`; the port of a just-closed one may take a moment to come free.
  void* router(const std::string& at) {
    void* s = socket(ZMQ_ROUTER);
    const auto until = steady::now() + 20s;
    while (zmq_bind(s, at.c_str()) != 0) {
      INFO("binding " << at << ": " << zmq_strerror(zmq_errno()));
      REQUIRE(steady::now() < until);
      std::this_thread::sleep_for(10ms);
    }
    return s;
  }
};

std::string last_endpoint(void* s) {
  char buf[256];
  std::size_t n = sizeof buf;
  REQUIRE(zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, buf, &n) == 0);
  return std::string(buf);
}

void send_frames(void* s, const std::vector<std::string>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i)
    REQUIRE(zmq_send(s, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0) >= 0);
}

zmq_reader reader_of(const std::string& body) {
  return zmq_reader(reinterpret_cast<const unsigned char*>(body.data()), body.size());
}

std::string bytes_of(const zmq_writer& w) { return std::string(w.bytes().begin(), w.bytes().end()); }

// The frames of one message on `s` without waiting (none: nothing there).
std::optional<std::vector<std::string>> try_frames(void* s) {
  std::vector<std::string> frames;
  for (;;) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, frames.empty() ? ZMQ_DONTWAIT : 0) < 0) {
      zmq_msg_close(&m);
      if (frames.empty()) return std::nullopt;
      FAIL("a message's later frame could not be read");
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    const bool more = zmq_msg_more(&m) != 0;
    zmq_msg_close(&m);
    if (!more) return frames;
  }
}

// Waits for a message on `s`, running `tick` (rank 0's progress) between looks; empty after 20 s.
std::optional<std::vector<std::string>> await_frames(void* s, const std::function<void()>& tick) {
  const auto until = steady::now() + 20s;
  while (steady::now() < until) {
    if (auto f = try_frames(s)) return f;
    tick();
    zmq_pollitem_t item{s, 0, ZMQ_POLLIN, 0};
    zmq_poll(&item, 1, 5);
  }
  return std::nullopt;
}

std::string hello(std::int32_t rank, std::int32_t size, const std::string& endpoint, std::uint64_t token) {
  zmq_writer w(zmq_rdv_kind::hello);
  w.put(rank).put(size).put_string(endpoint).put(token);
  return bytes_of(w);
}

// Reads rank 0's answer `body` on a registering process's DEALER: its kind and first u64.
struct answer {
  zmq_rdv_kind kind{};
  std::uint64_t inc = 0;
};
answer read_answer(const std::string& body) {
  zmq_reader rd = reader_of(body);
  const auto kind = rd.kind();
  REQUIRE(kind.has_value());
  answer a;
  a.kind = *kind;
  if (a.kind == zmq_rdv_kind::welcome || a.kind == zmq_rdv_kind::replaced) REQUIRE(rd.get(a.inc));
  return a;
}

}  // namespace

TEST_CASE("rank 0 answers a hello repeated by the process that holds the slot with the same welcome: "
          "no new incarnation, nobody cut off; a new process in the slot still replaces it" *
          doctest::timeout(120)) {
  zmq_options o = open_options("tcp://127.0.0.1:0");
  zmq_communicator rank0(0, 2, o, 10s);
  const std::string rdv = rank0.rendezvous();
  const auto tick = [&] { rank0.poll(); };
  raw_zmq raw;
  const std::uint64_t token = 0x1234567890abcdefULL;
  const std::string id = zmq_rendezvous::zmq_rdv_routing_id(token);
  // Nobody listens at rank 1's data endpoint: rank 0 only dials it.
  const std::string data = "tcp://127.0.0.1:1";

  // The first connection: a hello, and rank 0's welcome on it.
  void* first = raw.dealer(id, rdv);
  send_frames(first, {hello(1, 2, data, token)});
  auto got = await_frames(first, tick);
  REQUIRE_MESSAGE(got.has_value(), "rank 0 never answered the first hello");
  const answer welcome = read_answer(got->at(0));
  REQUIRE(welcome.kind == zmq_rdv_kind::welcome);
  CHECK(rank0.peer_state(1) == zmq_peer_state::alive);

  // The connection breaks (as if the welcome were lost with it); the process dials again under
  // its routing id and repeats its hello: the same welcome, on the new connection.
  raw.close(first);
  void* second = raw.dealer(id, rdv);
  send_frames(second, {hello(1, 2, data, token)});
  got = await_frames(second, tick);
  REQUIRE_MESSAGE(got.has_value(), "rank 0 never answered the repeated hello on the new connection");
  const answer again = read_answer(got->at(0));
  CHECK(again.kind == zmq_rdv_kind::welcome);
  CHECK_MESSAGE(again.inc == welcome.inc, "a repeated hello was taken as a new process in slot 1 (incarnation "
                                              << again.inc << " after " << welcome.inc << ")");

  // A different process (another token) in slot 1: a new incarnation, and the one before is
  // told it was replaced, on its live connection.
  const std::uint64_t other = token + 1;
  void* third = raw.dealer(zmq_rendezvous::zmq_rdv_routing_id(other), rdv);
  send_frames(third, {hello(1, 2, data, other)});
  got = await_frames(third, tick);
  REQUIRE_MESSAGE(got.has_value(), "rank 0 never answered a new process in slot 1");
  const answer newer = read_answer(got->at(0));
  CHECK(newer.kind == zmq_rdv_kind::welcome);
  CHECK(newer.inc == welcome.inc + 1);
  got = await_frames(second, tick);
  REQUIRE_MESSAGE(got.has_value(), "the replaced process was never told");
  const answer replaced = read_answer(got->at(0));
  CHECK(replaced.kind == zmq_rdv_kind::replaced);
  CHECK(replaced.inc == newer.inc);
}

TEST_CASE("a registering rank whose connection to rank 0 breaks before the welcome sends its hello "
          "again on the next connection and is admitted" * doctest::timeout(120)) {
  raw_zmq raw;
  void* rdv = raw.router("tcp://127.0.0.1:0");
  const std::string at = last_endpoint(rdv);
  void* data0 = raw.router("tcp://127.0.0.1:0");  // rank 0's data endpoint, for the welcome's table
  const std::string data0_at = last_endpoint(data0);

  std::exception_ptr failed;
  bool constructed = false;
  std::thread rank1([&] {
    try {
      zmq_communicator c(1, 2, open_options(at), 30s);
      constructed = true;
    } catch (...) {
      failed = std::current_exception();
    }
  });
  // A failed REQUIRE below leaves through here: rank 1 ends at its deadline and is joined.
  struct joiner {
    std::thread& t;
    ~joiner() {
      if (t.joinable()) t.join();
    }
  } join_rank1{rank1};
  const auto nothing = [] {};

  auto got = await_frames(rdv, nothing);
  REQUIRE_MESSAGE(got.has_value(), "rank 1 never sent its hello");
  REQUIRE(got->size() == 2);
  std::string id = got->at(0);
  zmq_reader rd = reader_of(got->at(1));
  std::int32_t r = -1, n = -1;
  std::string endpoint;
  std::uint64_t token = 0;
  REQUIRE(rd.kind() == zmq_rdv_kind::hello);
  REQUIRE((rd.get(r) && rd.get(n) && rd.get_string(endpoint) && rd.get(token)));
  CHECK(r == 1);
  CHECK(n == 2);
  CHECK(id == zmq_rendezvous::zmq_rdv_routing_id(token));

  // Rank 0 goes away without answering (its side of the connection closes) and comes back at the
  // same address: the hello must come again, from the same process.
  raw.close(rdv);
  rdv = raw.router(at);
  got = await_frames(rdv, nothing);
  REQUIRE_MESSAGE(got.has_value(), "rank 1 never sent its hello again after its connection broke");
  REQUIRE(got->size() == 2);
  id = got->at(0);
  zmq_reader again = reader_of(got->at(1));
  std::uint64_t token_again = 0;
  REQUIRE(again.kind() == zmq_rdv_kind::hello);
  REQUIRE((again.get(r) && again.get(n) && again.get_string(endpoint) && again.get(token_again)));
  CHECK(token_again == token);
  CHECK(id == zmq_rendezvous::zmq_rdv_routing_id(token));

  zmq_writer w(zmq_rdv_kind::welcome);
  w.put(std::uint64_t{2}).put(std::int32_t{2});
  w.put(std::uint64_t{1}).put(static_cast<std::uint8_t>(zmq_peer_state::alive)).put_string(data0_at);
  w.put(std::uint64_t{2}).put(static_cast<std::uint8_t>(zmq_peer_state::alive)).put_string(endpoint);
  send_frames(rdv, {id, bytes_of(w)});
  rank1.join();
  if (failed) {
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      FAIL("rank 1's construction failed: " << e.what());
    }
  }
  CHECK(constructed);
}
