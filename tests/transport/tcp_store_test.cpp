// The TCP rendezvous store (transport/tcp_store.hpp): set, get and wait across clients, a
// client that starts before its server, a server that restarts, bad addresses and options,
// deadlines; and what a stranger cannot do: be served without the job secret, pose as the store,
// forge or replay a request, hold a connection open, exhaust the server's descriptors or table.
#include <cadence/transport/tcp_store.hpp>

#include "transport/conformance.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using cadence_conformance::expect_throw;

namespace {

tcp_store_options store_with(const job_secret& s) {
  tcp_store_options o;
  o.secret = s;
  return o;
}

// A raw TCP connection to a store on loopback, as a stranger would open one.
struct raw_connection {
  int fd = -1;
  explicit raw_connection(const std::string& address) {
    const auto colon = address.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  }
  ~raw_connection() {
    if (fd >= 0) ::close(fd);
  }
  raw_connection(const raw_connection&) = delete;
  raw_connection& operator=(const raw_connection&) = delete;
  bool send_bytes(const std::string& b) const {
    return ::send(fd, b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size());
  }
  // Reads until `n` bytes came or the server closed the connection; what came.
  std::string read_up_to(std::size_t n) const {
    std::string got;
    char buf[256];
    while (got.size() < n) {
      const ssize_t r = ::recv(fd, buf, std::min(sizeof buf, n - got.size()), 0);
      if (r <= 0) break;
      got.append(buf, static_cast<std::size_t>(r));
    }
    return got;
  }
  // Whether the server closed it (a read returns end of file), within the test's timeout.
  bool closed_by_server() const {
    char b[64];
    for (;;) {
      const ssize_t r = ::recv(fd, b, sizeof b, 0);
      if (r == 0) return true;
      if (r < 0) return errno != EINTR;
    }
  }
};

std::string request(char op, const std::string& key, const std::string& value) {
  std::string r(1, op);
  cadence::transport::detail::put_u32(r, static_cast<std::uint32_t>(key.size()));
  cadence::transport::detail::put_u32(r, static_cast<std::uint32_t>(value.size()));
  return r + key + value;
}

}  // namespace

TEST_CASE("tcp_store: keys set by one client are read by another; missing and wait name the rest" *
          doctest::timeout(60)) {
  const auto o = store_with(job_secret::generate());
  tcp_store_server server("127.0.0.1:0", o);
  CHECK(server.address().rfind("127.0.0.1:", 0) == 0);
  CHECK(server.address() != "127.0.0.1:0");
  tcp_store a(server.address(), o, 10s), b("tcp://" + server.address(), o, 10s);
  CHECK_FALSE(b.try_get("x", 10s).has_value());
  a.set("x", std::string("one\0two", 7), 10s);
  CHECK(b.get("x", 10s) == std::string("one\0two", 7));
  a.set("x", "", 10s);  // replaced; an empty value is a value
  CHECK(b.try_get("x", 10s) == std::optional<std::string>(""));
  const std::string big(3 << 20, 'v');
  b.set("big", big, 10s);
  CHECK(a.get("big", 10s) == big);
  CHECK(a.missing({"x", "y", "big", "z"}, 10s) == std::vector<std::string>{"y", "z"});
  expect_throw<transport_error>(0, [&] { a.wait({"x", "y"}, 100ms); }, {"nobody set \"y\"", server.address()});
  expect_throw<transport_error>(0, [&] { a.get("never", 100ms); }, {"no rank set \"never\"", server.address()});
  CHECK(server.size() == 2);
  CHECK(server.rejected() == 0);
}

TEST_CASE("tcp_store: ranks that start in any order, the client before its server" * doctest::timeout(60)) {
  const auto o = store_with(job_secret::generate());
  std::string address;
  {
    tcp_store_server probe("127.0.0.1:0", o);  // a port nobody serves once it is gone
    address = probe.address();
  }
  constexpr int n = 6;
  std::vector<std::string> seen(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        tcp_store s(address, o, 20s, 5ms);  // retried until the server is up
        s.set("rank-" + std::to_string(r), std::to_string(r * r), 20s);
        std::vector<std::string> keys;
        for (int p = 0; p < n; ++p) keys.push_back("rank-" + std::to_string(p));
        s.wait(keys, 20s);
        for (int p = 0; p < n; ++p) seen[static_cast<std::size_t>(r)] += s.get(keys[static_cast<std::size_t>(p)], 20s) + ",";
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  std::optional<tcp_store_server> server;
  server.emplace(address, o);
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) {
    CHECK_MESSAGE(errors[static_cast<std::size_t>(r)].empty(), errors[static_cast<std::size_t>(r)]);
    CHECK(seen[static_cast<std::size_t>(r)] == "0,1,4,9,16,25,");
  }
}

TEST_CASE("tcp_store: a server that restarts gets each client's keys again on its next call" *
          doctest::timeout(60)) {
  const auto o = store_with(job_secret::generate());
  std::optional<tcp_store_server> server;
  server.emplace("127.0.0.1:0", o);
  const std::string address = server->address();
  tcp_store a(address, o, 10s), b(address, o, 10s);
  a.set("a", "1", 10s);
  b.set("b", "2", 10s);
  server.reset();  // the table is gone with it
  server.emplace(address, o);
  CHECK(server->size() == 0);
  CHECK(a.get("a", 10s) == "1");  // a reconnects and sets its own key first
  CHECK(a.missing({"a", "b"}, 10s) == std::vector<std::string>{"b"});
  CHECK(b.get("a", 10s) == "1");  // and so does b, with "b"
  CHECK(a.get("b", 10s) == "2");
}

TEST_CASE("tcp_store: bad addresses, keys and options are refused naming them; nothing listening is a "
          "transport_error at the deadline" * doctest::timeout(60)) {
  const auto o = store_with(job_secret::generate());
  for (const char* bad : {"localhost", "127.0.0.1:", ":5000", "127.0.0.1:65536", "127.0.0.1:http", "[::1:5000"})
    expect_throw<invalid_parameter_error>(0, [&] { tcp_store s(bad, o, 1s); }, {bad});
  expect_throw<invalid_parameter_error>(0, [&] { tcp_store_server s("no-such-host.invalid:0", o); },
                                        {"cannot resolve \"no-such-host.invalid\""});
  // Security is asked for by name: no secret is no store, an open one stays on loopback, a
  // wildcard address is refused unless allowed.
  expect_throw<invalid_parameter_error>(0, [&] { tcp_store_server s("127.0.0.1:0", tcp_store_options{}); },
                                        {"no job secret", "wire_security::open"});
  tcp_store_options open;
  open.security = wire_security::open;
  expect_throw<invalid_parameter_error>(0, [&] { tcp_store_server s("10.1.2.3:0", open); },
                                        {"an open store on 10.1.2.3", "force_open_on_network"});
  expect_throw<invalid_parameter_error>(0, [&] { tcp_store_server s("0.0.0.0:0", o); },
                                        {"binds every interface", "allow_wildcard"});
  std::string address;
  {
    tcp_store_server probe("127.0.0.1:0", o);
    address = probe.address();
  }
  const auto t0 = std::chrono::steady_clock::now();
  expect_throw<transport_error>(0, [&] { tcp_store s(address, o, 200ms); },
                                {"nothing answered at " + address, "Connection refused"});
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // an upper bound only: no hang

  tcp_store_server server("127.0.0.1:0", o);
  expect_throw<transport_error>(0, [&] { tcp_store_server again(server.address(), o); },
                                {"cannot listen on " + server.address(), "holds the port"});
  tcp_store s(server.address(), o, 10s);
  expect_throw<invalid_parameter_error>(0, [&] { s.set("", "x", 1s); }, {"a key must have 1 to"});
  expect_throw<invalid_parameter_error>(0, [&] { s.set(std::string(5000, 'k'), "x", 1s); }, {"not 5000"});
}

TEST_CASE("tcp_store: an open store on loopback, asked for by name, serves open clients only" *
          doctest::timeout(60)) {
  tcp_store_options open;
  open.security = wire_security::open;
  tcp_store_server server("127.0.0.1:0", open);
  tcp_store a(server.address(), open, 10s);
  a.set("k", "v", 10s);
  CHECK(a.get("k", 10s) == "v");
  // A client with a secret will not trust a store that authenticates nobody.
  expect_throw<transport_error>(0, [&] { tcp_store s(server.address(), store_with(job_secret::generate()), 2s); },
                                {"is open", "will not trust it"});
  // A request that claims a 2 GiB value is refused before anything of it is buffered.
  raw_connection c(server.address());
  CHECK(c.read_up_to(cadence::transport::detail::store_greeting).size() == cadence::transport::detail::store_greeting);
  std::string huge(1, 'S');
  cadence::transport::detail::put_u32(huge, 1);
  cadence::transport::detail::put_u32(huge, 0x80000000u);
  REQUIRE(c.send_bytes(huge + "k"));
  CHECK(c.closed_by_server());
  CHECK(server.stats().protocol_errors == 1);
  CHECK(a.get("k", 10s) == "v");
}

TEST_CASE("tcp_store: a client without the job secret, or with another, is never served; a "
          "store without it cannot pose as the job's" * doctest::timeout(60)) {
  const auto ours = store_with(job_secret::generate()), theirs = store_with(job_secret::generate());
  tcp_store_server server("127.0.0.1:0", ours);
  tcp_store good(server.address(), ours, 10s);
  good.set("rendezvous", "10.0.0.1:1234", 10s);
  tcp_store_options open;
  open.security = wire_security::open;
  expect_throw<transport_error>(0, [&] { tcp_store s(server.address(), open, 2s); },
                                {"demands a job secret", "has none"});
  expect_throw<transport_error>(0, [&] { tcp_store s(server.address(), theirs, 2s); },
                                {"hold different job secrets"});
  CHECK(server.stats().auth_failures == 1);
  // A stranger's store, where a joining rank of our job would look: it is refused.
  tcp_store_server fake("127.0.0.1:0", theirs);
  expect_throw<transport_error>(0, [&] { tcp_store s(fake.address(), ours, 2s); }, {"hold different job secrets"});
  CHECK(good.get("rendezvous", 10s) == "10.0.0.1:1234");
}

TEST_CASE("tcp_store: a stranger's raw bytes get no answer: garbage or a request in place of the proof; "
          "each closes only its own connection" * doctest::timeout(60)) {
  const auto o = store_with(job_secret::generate());
  tcp_store_server server("127.0.0.1:0", o);
  tcp_store good(server.address(), o, 10s);
  good.set("k", "v", 10s);
  {
    raw_connection c(server.address());
    CHECK(c.read_up_to(cadence::transport::detail::store_greeting).size() == cadence::transport::detail::store_greeting);
    // A request sent in place of the challenge's answer: 64 bytes of it are read as a wrong proof.
    const std::string forged = request('S', "k", std::string(60, 'x')).substr(0, 64);
    REQUIRE(c.send_bytes(forged));
    CHECK(c.read_up_to(cadence::transport::detail::store_code) == std::string(cadence::transport::detail::store_code, '\0'));
    CHECK(c.closed_by_server());
  }
  {
    raw_connection c(server.address());
    CHECK(c.read_up_to(cadence::transport::detail::store_greeting).size() == cadence::transport::detail::store_greeting);
    REQUIRE(c.send_bytes(std::string(64, '\x7f')));  // garbage
    CHECK(c.read_up_to(cadence::transport::detail::store_code) == std::string(cadence::transport::detail::store_code, '\0'));
    CHECK(c.closed_by_server());
  }
  CHECK(server.stats().auth_failures == 2);
  CHECK(good.get("k", 10s) == "v");
  CHECK(server.size() == 1);
}

TEST_CASE("tcp_store: a connection that never authenticates is closed after the handshake timeout, one "
          "beyond max_connections at once, and a set beyond the table's bounds is refused" *
          doctest::timeout(60)) {
  auto o = store_with(job_secret::generate());
  o.handshake_timeout = 200ms;
  o.max_connections = 3;
  o.max_keys = 2;
  std::vector<std::string> events;
  std::mutex m;
  o.on_event = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(m);
    events.push_back(line);
  };
  tcp_store_server server("127.0.0.1:0", o);
  {
    raw_connection silent(server.address());
    CHECK(silent.read_up_to(cadence::transport::detail::store_greeting).size() == cadence::transport::detail::store_greeting);
    CHECK(silent.closed_by_server());  // waits for the timeout: the read ends when it closes
  }
  CHECK(server.stats().handshake_timeouts == 1);
  tcp_store a(server.address(), o, 10s);
  a.set("one", "1", 10s);
  a.set("two", "2", 10s);
  expect_throw<transport_error>(0, [&] { a.set("three", "3", 10s); }, {"refused \"three\"", "table is full"});
  a.set("one", "uno", 10s);  // a key already held may still change
  CHECK(a.get("one", 10s) == "uno");
  CHECK(server.stats().refused_sets == 1);
  {
    raw_connection x(server.address()), y(server.address());  // with a: three open
    CHECK(x.read_up_to(cadence::transport::detail::store_greeting).size() == cadence::transport::detail::store_greeting);
    CHECK(y.read_up_to(cadence::transport::detail::store_greeting).size() == cadence::transport::detail::store_greeting);
    raw_connection z(server.address());  // the fourth is closed without a greeting
    CHECK(z.read_up_to(1).empty());
  }
  CHECK(server.stats().refused_connections >= 1);
  std::lock_guard<std::mutex> lock(m);
  bool named = false;
  for (const auto& e : events) named = named || e.find("did not authenticate within 200 ms") != std::string::npos;
  CHECK_MESSAGE(named, "no event named the silent connection");
}

TEST_CASE("job_secret: generated, written as hex and read back; a short, malformed or exposed key "
          "file is refused naming it" * doctest::timeout(60)) {
  const job_secret s = job_secret::generate();
  CHECK_FALSE(s.empty());
  CHECK(s.hex().size() == 64);
  CHECK(job_secret::from_hex(s.hex() + "\n") == s);
  CHECK(job_secret::from_hex(s.hex()) != job_secret::generate());
  CHECK(s.fingerprint().size() == 8);
  CHECK(s.hex().find(s.fingerprint()) == std::string::npos);
  expect_throw<invalid_parameter_error>(0, [&] { job_secret::from_hex("abcd"); }, {"at least 32 hexadecimal digits"});
  expect_throw<invalid_parameter_error>(0, [&] { job_secret::from_hex(std::string(32, 'g')); },
                                        {"is not hexadecimal", "character 1"});
  char path[] = "/tmp/cadence-secret-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string line = s.hex() + "\n";
  REQUIRE(::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  ::close(fd);
  CHECK(job_secret::from_file(path) == s);  // mkstemp makes it 0600
  ::chmod(path, 0644);
  expect_throw<invalid_parameter_error>(0, [&] { job_secret::from_file(path); }, {path, "chmod 600"});
  ::unlink(path);
  expect_throw<invalid_parameter_error>(0, [&] { job_secret::from_file(path); }, {path, "does not exist"});
}
