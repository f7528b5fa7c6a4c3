// A bad worker fails only itself at the parameter server, on every backend that isolates a
// peer's fault (a message of another size than its receive fails that receive alone, with a
// peer_error naming the sender: in-process and ZeroMQ). Written once over the communicator
// concept, instantiated per backend with CADENCE_PS_BAD_PEER_SUITE(H), H a harness as in
// tests/exchange/ps_suite.hpp (H::run(body) calls body(comm) on every rank of a world of 4:
// server rank 0, workers 1-3). Rank 3 speaks the protocol by hand and breaks it; ranks 1 and 2
// are ordinary workers under BSP, so they can only finish if the server drops rank 3's worker
// (their barrier waits for it) and goes on. Bodies use CHECK, never REQUIRE (a REQUIRE would
// throw out of a rank and leave the others waiting).
#pragma once

#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>

#include "exchange/ps_suite.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence_ps_bad_peer {

using namespace cadence;
using namespace cadence::exchange;
using namespace std::chrono_literals;

constexpr std::size_t model = 1000;
constexpr std::int64_t iterations = 6;

enum class breakage {
  short_header,    // a control message of 10 bytes where a header (48) is received
  short_gradient,  // a push whose header is right but whose gradient is 10 elements long
};

template <class H>
void bad_worker(breakage how) {
  H::run([how](auto& c) {
    using C = std::decay_t<decltype(c)>;
    if (c.size() != 4) return;
    ps_options o;
    o.keep_log = true;
    o.reply_timeout = 60s;
    o.transfer_timeout = 10s;
    o.evict_after = 30s;  // only a server that did not drop it would evict it (too late: the test's bound)
    const auto w0 = cadence_ps_suite::initial<float>(model);
    const worker_id bad = 2;  // rank 3's
    if (c.rank() == 0) {
      parameter_server<C, any_controller> server(c, model, w0.data(), make_controller("bsp", 3), sgd<float>{0.125f}, o);
      server.run();  // returns: it did not end on the bad message
      // Dropped for the message, not at evict_after: the reason says which (no clock needed).
      const ps_stats& st = server.stats();
      CHECK(st.evictions.size() == 1);
      if (st.evictions.size() == 1) {
        CHECK(st.evictions[0].worker == bad);
        CHECK(st.evictions[0].rank == 3);
        CHECK(st.evictions[0].reason.find("broke the protocol") != std::string::npos);
        CHECK(st.evictions[0].reason.find("rank 3") != std::string::npos);
      }
      CHECK(st.refused >= 1);
      for (worker_id w : {worker_id{0}, worker_id{1}}) CHECK(st.pushes.at(w) == iterations);
      return;
    }
    if (c.rank() < 3) {  // the good workers: they pass every barrier once rank 3 is dropped
      CHECK(cadence_ps_suite::train(c, model, o, iterations) == iterations);
      return;
    }
    // Rank 3, by hand.
    const cadence::exchange::detail::ps_tags tags(o.tag_base);
    const auto d = transport::deadline(20s);
    auto answer = [&](std::int64_t request) {  // a reply's header and its payload or text
      cadence::exchange::detail::ps_header a;
      c.recv(&a, sizeof a, 0, tags.reply, d);
      CHECK(a.request == request);
      if (a.status != 0) {
        std::string text(static_cast<std::size_t>(a.count), '\0');
        c.recv(text.data(), text.size(), 0, tags.reply_data, d);
        return std::pair<cadence::exchange::detail::ps_header, std::string>(a, text);
      }
      std::vector<float> weights(static_cast<std::size_t>(a.count));
      c.recv(weights.data(), weights.size() * sizeof(float), 0, tags.reply_data, d);
      return std::pair<cadence::exchange::detail::ps_header, std::string>(a, std::string());
    };
    // Rank 3 stays until the server has ended (its communicator gone), so what drops its
    // worker is the bad message, not a lost rank.
    auto until_server_ends = [&] {
      char nothing = 0;
      bool got = false;
      try {
        got = c.try_recv(&nothing, 1, 0, tags.control, d).has_value();  // nothing is sent on it
      } catch (const transport_error&) {
        // rank 0 left: the server is done
      }
      CHECK_FALSE(got);
    };
    if (how == breakage::short_header) {
      const char junk[10] = {};
      c.send(junk, sizeof junk, 0, tags.control, d);
      until_server_ends();  // nothing comes back: the server cannot tell which request it was
      return;
    }
    auto pull = cadence::exchange::detail::make_header(cadence::exchange::detail::ps_kind::pull, bad, 0, static_cast<std::int64_t>(model), 1);
    c.send(&pull, sizeof pull, 0, tags.control, d);
    CHECK(answer(1).first.status == 0);
    auto push = cadence::exchange::detail::make_header(cadence::exchange::detail::ps_kind::push, bad, 1, static_cast<std::int64_t>(model), 2);
    const std::vector<float> short_gradient(10, 0.5f);
    c.send(&push, sizeof push, 0, tags.control, d);
    c.send(short_gradient.data(), short_gradient.size() * sizeof(float), 0, tags.data, d);
    const auto refusal = answer(2);  // the server says why it dropped this worker
    CHECK(refusal.first.status == static_cast<std::int64_t>(cadence::exchange::detail::ps_status::evicted));
    CHECK(refusal.second.find("broke the protocol") != std::string::npos);
    until_server_ends();
  });
}

}  // namespace cadence_ps_bad_peer

#define CADENCE_PS_BAD_PEER_TEST(name, id) TEST_CASE_TEMPLATE_DEFINE(name * doctest::timeout(120), H, id)

CADENCE_PS_BAD_PEER_TEST("parameter server: a worker that sends a control message of the wrong size is dropped "
                         "alone; the others pass their barriers and finish",
                         ps_bad_peer_short_header) {
  cadence_ps_bad_peer::bad_worker<H>(cadence_ps_bad_peer::breakage::short_header);
}

CADENCE_PS_BAD_PEER_TEST("parameter server: a worker whose gradient is shorter than its push said is dropped "
                         "alone and told why; the others finish",
                         ps_bad_peer_short_gradient) {
  cadence_ps_bad_peer::bad_worker<H>(cadence_ps_bad_peer::breakage::short_gradient);
}

#define CADENCE_PS_BAD_PEER_SUITE(H)                          \
  TEST_CASE_TEMPLATE_INVOKE(ps_bad_peer_short_header, H);     \
  TEST_CASE_TEMPLATE_INVOKE(ps_bad_peer_short_gradient, H)
