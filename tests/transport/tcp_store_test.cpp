// The TCP rendezvous store (transport/tcp_store.hpp): set, get and wait across clients, a
// client that starts before its server, a server that restarts, bad addresses, deadlines, and
// a connection that breaks the protocol.
#include <cadence/transport/tcp_store.hpp>

#include "transport/conformance.hpp"

#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using cadence_conformance::expect_throw;

TEST_CASE("tcp_store: keys set by one client are read by another; missing and wait name the rest" *
          doctest::timeout(60)) {
  tcp_store_server server("127.0.0.1:0");
  CHECK(server.address().rfind("127.0.0.1:", 0) == 0);
  CHECK(server.address() != "127.0.0.1:0");
  tcp_store a(server.address(), 10s), b("tcp://" + server.address(), 10s);
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
  std::string address;
  {
    tcp_store_server probe("127.0.0.1:0");  // a port nobody serves once it is gone
    address = probe.address();
  }
  constexpr int n = 6;
  std::vector<std::string> seen(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        tcp_store s(address, 20s, 5ms);  // retried until the server is up
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
  server.emplace(address);
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) {
    CHECK_MESSAGE(errors[static_cast<std::size_t>(r)].empty(), errors[static_cast<std::size_t>(r)]);
    CHECK(seen[static_cast<std::size_t>(r)] == "0,1,4,9,16,25,");
  }
}

TEST_CASE("tcp_store: a server that restarts gets each client's keys again on its next call" *
          doctest::timeout(60)) {
  std::optional<tcp_store_server> server;
  server.emplace("127.0.0.1:0");
  const std::string address = server->address();
  tcp_store a(address, 10s), b(address, 10s);
  a.set("a", "1", 10s);
  b.set("b", "2", 10s);
  server.reset();  // the table is gone with it
  server.emplace(address);
  CHECK(server->size() == 0);
  CHECK(a.get("a", 10s) == "1");  // a reconnects and sets its own key first
  CHECK(a.missing({"a", "b"}, 10s) == std::vector<std::string>{"b"});
  CHECK(b.get("a", 10s) == "1");  // and so does b, with "b"
  CHECK(a.get("b", 10s) == "2");
}

TEST_CASE("tcp_store: bad addresses and keys are refused naming them; nothing listening is a "
          "transport_error at the deadline" * doctest::timeout(60)) {
  for (const char* bad : {"localhost", "127.0.0.1:", ":5000", "127.0.0.1:65536", "127.0.0.1:http", "[::1:5000"})
    expect_throw<invalid_parameter_error>(0, [&] { tcp_store s(bad, 1s); }, {bad});
  expect_throw<invalid_parameter_error>(0, [&] { tcp_store_server s("no-such-host.invalid:0"); },
                                        {"cannot resolve \"no-such-host.invalid\""});
  std::string address;
  {
    tcp_store_server probe("127.0.0.1:0");
    address = probe.address();
  }
  const auto t0 = std::chrono::steady_clock::now();
  expect_throw<transport_error>(0, [&] { tcp_store s(address, 200ms); },
                                {"nothing answered at " + address, "Connection refused"});
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // an upper bound only: no hang

  tcp_store_server server("127.0.0.1:0");
  expect_throw<transport_error>(0, [&] { tcp_store_server again(server.address()); },
                                {"cannot listen on " + server.address(), "holds the port"});
  tcp_store s(server.address(), 10s);
  expect_throw<invalid_parameter_error>(0, [&] { s.set("", "x", 1s); }, {"a key must have 1 to"});
  expect_throw<invalid_parameter_error>(0, [&] { s.set(std::string(5000, 'k'), "x", 1s); }, {"not 5000"});
}

TEST_CASE("tcp_store: a connection that breaks the protocol is closed; the others are served" *
          doctest::timeout(60)) {
  tcp_store_server server("127.0.0.1:0");
  tcp_store good(server.address(), 10s);
  good.set("k", "v", 10s);
  // A raw connection that sends a request of an unknown kind.
  const auto colon = server.address().rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(server.address().substr(colon + 1))));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  const char junk[9] = {'X', 0, 0, 0, 1, 0, 0, 0, 0};
  REQUIRE(::send(fd, junk, sizeof junk, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof junk));
  char b = 0;
  CHECK(::recv(fd, &b, 1, 0) == 0);  // the server closed it without answering
  ::close(fd);
  CHECK(server.rejected() == 1);
  CHECK(good.get("k", 10s) == "v");
}
