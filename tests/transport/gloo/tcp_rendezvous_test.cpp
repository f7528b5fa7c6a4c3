// The gloo backend's TCP rendezvous (gloo_options::rendezvous): ranks that share no folder meet
// at a store rank 0 serves during construction, or at one the job serves for longer; a rank
// that never arrives, and a rank 0 that never serves, are named at the deadline.
#include <cadence/transport/gloo/communicator.hpp>

#include "support/threads.hpp"
#include "transport/conformance.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using cadence_conformance::expect_throw;

namespace {

// One job's secret, shared by every rank of these tests (as a launcher hands it to its processes).
const job_secret& the_secret() {
  static const job_secret s = job_secret::generate();
  return s;
}
tcp_store_options store_options() {
  tcp_store_options o;
  o.secret = the_secret();
  return o;
}

gloo_options tcp_options(const std::string& address, const std::string& prefix, bool serve) {
  gloo_options o;
  o.rendezvous = address;
  o.serve_rendezvous = serve;
  o.prefix = prefix;
  o.store = store_options();
  return o;
}

// A port that nothing serves once the probe is gone (SO_REUSEADDR lets rank 0 bind it again).
std::string free_address() {
  tcp_store_server probe("127.0.0.1:0", store_options());
  return probe.address();
}

}  // namespace

TEST_CASE("gloo over a TCP rendezvous rank 0 serves: communicators one after another on one "
          "port, each of them working" * doctest::timeout(120)) {
  const std::string address = free_address();
  constexpr int n = 3;
  std::vector<std::int64_t> sums(n * 3, -1);
  cadence_test::run_threads(n, [&](int r) {
    // As cadence-train does: several communicators in turn, rank 0 serving the store for each
    // construction on the same port. A rank that is quicker than rank 0 may reach the previous
    // communicator's store, which closes under it; its client reconnects and sets its keys again.
    for (int k = 0; k < 3; ++k) {
      gloo_communicator c(r, n, tcp_options(address, "comm-" + std::to_string(k), true), 30s);
      std::int64_t v = r + 10 * k;
      c.allreduce(&v, 1, dtype::i64, reduce_op::sum, 30s);
      sums[static_cast<std::size_t>(k * n + r)] = v;
      if (r == 0) {
        float x = 1.5f;
        c.send(&x, sizeof x, 1, 5, 30s);
      } else if (r == 1) {
        float x = 0;
        c.recv(&x, sizeof x, 0, 5, 30s);
        CHECK(x == 1.5f);
      }
    }
  });
  CHECK(sums == std::vector<std::int64_t>{3, 3, 3, 33, 33, 33, 63, 63, 63});
}

TEST_CASE("gloo over a TCP store the job serves: two worlds under different prefixes at once" *
          doctest::timeout(120)) {
  tcp_store_server store("127.0.0.1:0", store_options());
  std::vector<std::int64_t> sums(4, -1);
  cadence_test::run_threads(4, [&](int r) {
    // {0, 1} under "a", {2, 3} under "b"; nobody serves but `store`.
    gloo_communicator c(r % 2, 2, tcp_options(store.address(), r < 2 ? "a" : "b", false), 30s);
    std::int64_t v = r;
    c.allreduce(&v, 1, dtype::i64, reduce_op::sum, 30s);
    sums[static_cast<std::size_t>(r)] = v;
  });
  CHECK(sums == std::vector<std::int64_t>{1, 1, 5, 5});
  CHECK(store.size() > 4);  // both worlds' keys stay there: the store is the job's
}

TEST_CASE("gloo TCP rendezvous failures name the rank and the store" * doctest::timeout(60)) {
  SUBCASE("ranks that never arrive") {
    tcp_store_server store("127.0.0.1:0", store_options());
    expect_throw<transport_error>(
        0, [&] { gloo_communicator c(0, 3, tcp_options(store.address(), "lonely", false), 500ms); },
        {"construction on rank 0 of 3", "deadline passed", "ranks 1, 2", "the store at " + store.address(),
         "prefix \"lonely\""});
  }
  SUBCASE("a rank 0 that never serves the store") {
    const std::string address = free_address();
    expect_throw<transport_error>(
        0, [&] { gloo_communicator c(1, 2, tcp_options(address, "p", true), 300ms); },
        {"construction on rank 1 of 2", "deadline passed", "rank 0", "the rendezvous store at " + address,
         "never answered"});
  }
  SUBCASE("an address that does not parse, before any wait") {
    const auto t0 = std::chrono::steady_clock::now();
    expect_throw<invalid_parameter_error>(
        0, [&] { gloo_communicator c(1, 2, tcp_options("127.0.0.1", "p", true), 30s); },
        {"construction on rank 1 of 2", "\"127.0.0.1\" has no port"});
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  }
  SUBCASE("a rank without the job secret is refused by the job's store, naming why") {
    tcp_store_server store("127.0.0.1:0", store_options());
    gloo_options o = tcp_options(store.address(), "p", false);
    o.store.secret = job_secret::generate();
    expect_throw<transport_error>(0, [&] { gloo_communicator c(1, 2, o, 5s); },
                                  {"construction on rank 1 of 2", "hold different job secrets"});
  }
  SUBCASE("rank 0 cannot serve on a port another holds") {
    tcp_store_server other("127.0.0.1:0", store_options());
    expect_throw<transport_error>(
        0, [&] { gloo_communicator c(0, 2, tcp_options(other.address(), "p", true), 2s); },
        {"construction on rank 0 of 2", "cannot listen on " + other.address()});
  }
}
