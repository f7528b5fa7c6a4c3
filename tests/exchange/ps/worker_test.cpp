// cadence/exchange/ps/worker.hpp: what a worker checks itself and what it reports when a server
// refuses it, over in-process ranks. The worker's part in every policy and fault scenario is
// tested with the server's, in tests/exchange/parameter_server*_test.cpp and ps_suite.hpp.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;

namespace ps_worker_test {

// Server rank 0 of `world` under ASP for `workers` workers, on its own thread; what it threw
// lands in `error`.
std::thread serve(inproc_world& world, const std::vector<float>& w0, std::size_t workers, std::string& error) {
  return std::thread([&world, &w0, workers, &error] {
    auto comm = world.join(0);
    try {
      parameter_server<inproc_communicator, any_controller> s(comm, w0.size(), w0.data(),
                                                              make_controller("asp", workers));
      s.run();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
}

}  // namespace ps_worker_test

TEST_CASE("bad input: a rank in the wrong role, push after finish, a wrong-size gradient" *
          doctest::timeout(60)) {
  inproc_world world(3);
  std::vector<float> w0(10, 1.0f);
  std::string server_error, worker_error_text, role_error_text;
  std::thread server = ps_worker_test::serve(world, w0, 2, server_error);
  std::thread wrong_size([&] {
    auto comm = world.join(2);
    ps_worker<inproc_communicator> w(comm, 12);  // the servers' model has 10 elements
    std::vector<float> g(12, 0.5f), weights(12);
    try {
      w.push_pull(g.data(), weights.data());
    } catch (const worker_error& e) {
      worker_error_text = e.what();
    }
    w.finish();
  });
  auto comm = world.join(1);
  try {
    parameter_server<inproc_communicator, any_controller> s(comm, 10, w0.data(), make_controller("asp", 2));
  } catch (const invalid_parameter_error& e) {
    role_error_text = e.what();
  }
  {
    ps_worker<inproc_communicator> w(comm, 10);
    std::vector<float> g(10, 0.5f), weights(10);
    CHECK_THROWS_AS(w.push_pull(nullptr, weights.data()), invalid_parameter_error);
    w.push_pull(g.data(), weights.data());
    CHECK(weights[0] == doctest::Approx(1.0f - 0.01f * 0.5f));
    w.finish();
    CHECK_THROWS_WITH_AS(w.push_pull(g.data(), weights.data()),
                         doctest::Contains("after finish()"), worker_error);
  }
  server.join();
  wrong_size.join();
  CHECK(server_error.empty());
  CHECK(role_error_text.find("rank 1 is a worker") != std::string::npos);
  // Its first push pulls first (it becomes a member there), and the pull is refused.
  CHECK(worker_error_text.find("a model of 12 elements") != std::string::npos);
  CHECK(worker_error_text.find("serves one of 10") != std::string::npos);
  CHECK_THROWS_AS(ps_slice_of(1, 0, 0), invalid_parameter_error);
}

TEST_CASE("a worker refuses its own misuse before it sends anything: a server rank, null buffers, "
          "calls after finish()" * doctest::timeout(60)) {
  inproc_world world(2);
  std::vector<float> w0(6, 2.0f);
  std::string server_error;
  std::thread server = ps_worker_test::serve(world, w0, 1, server_error);
  {
    auto c1 = world.join(1);
    ps_options two_servers;
    two_servers.servers = 2;
    inproc_world bigger(3);
    auto b1 = bigger.join(1);
    CHECK_THROWS_WITH_AS((ps_worker<inproc_communicator>(b1, 6, two_servers)),
                         doctest::Contains("rank 1 is a server (ranks [0, 2) serve)"), invalid_parameter_error);
    ps_worker<inproc_communicator> w(c1, 6);
    CHECK(w.id() == 0);  // an initial member's id before its first pull: rank - servers
    CHECK(w.iteration() == 0);
    std::vector<float> weights(6, 0.0f), g(6, 1.0f);
    CHECK_THROWS_WITH_AS(w.pull(nullptr), doctest::Contains("pull: null weights for a model of 6 elements"),
                         invalid_parameter_error);
    CHECK_THROWS_WITH_AS(w.push_pull(g.data(), nullptr), doctest::Contains("push_pull: null weights"),
                         invalid_parameter_error);
    w.pull(weights.data());
    CHECK(weights == w0);
    w.push_pull(g.data(), weights.data());
    CHECK(w.iteration() == 1);
    CHECK(weights[0] == doctest::Approx(2.0f - 0.01f));
    w.finish();
    CHECK_THROWS_WITH_AS(w.finish(), doctest::Contains("finish() called twice"), worker_error);
    CHECK_THROWS_WITH_AS(w.pull(weights.data()), doctest::Contains("pull after finish()"), worker_error);
    CHECK_THROWS_WITH_AS(w.rejoin(weights.data()), doctest::Contains("rejoin after finish()"), worker_error);
    CHECK_THROWS_WITH_AS(w.push_pull(g.data(), weights.data()), doctest::Contains("(worker 0, rank 1)"),
                         worker_error);
  }
  server.join();
  CHECK(server_error.empty());
}

TEST_CASE("a reply that claims a refusal text longer than any reason is refused before the worker "
          "allocates for it (found by tests/fuzz/ps_protocol_fuzz.cpp)" *
          doctest::timeout(60)) {
  // A server rank 0 that answers the worker's first pull with a refusal whose header claims
  // 2^62 bytes of text (the worker used to size its buffer by that count: std::length_error,
  // or an allocation as large as the count), then one that claims a negative length.
  namespace pd = cadence::exchange::detail;
  for (const std::int64_t claimed : {std::int64_t{1} << 62, std::int64_t{-5}}) {
    CAPTURE(claimed);
    inproc_world world(2);
    const pd::ps_tags tags(ps_options{}.tag_base);
    std::promise<void> checked;  // the rogue stays until the worker has read its reply
    std::thread rogue([&] {
      auto c0 = world.join(0);
      pd::ps_header request;
      c0.recv(&request, sizeof request, 1, tags.control, std::chrono::seconds(10));  // the pull
      const auto h = pd::make_header(pd::ps_kind::reply, -1, 0, claimed, request.request,
                                         pd::ps_status::error);
      c0.send(&h, sizeof h, 1, tags.reply, std::chrono::seconds(10));
      checked.get_future().wait();
    });
    {
      auto c1 = world.join(1);
      ps_worker<inproc_communicator> w(c1, 6);
      std::vector<float> weights(6);
      const std::string want = "server rank 0 sent a refusal with a text of " + std::to_string(claimed) +
                               " bytes (at most 65536): a malformed reply";
      CHECK_THROWS_WITH_AS(w.pull(weights.data()), doctest::Contains(want.c_str()), transport_error);
      checked.set_value();
    }
    rogue.join();
  }
}

TEST_CASE("gradient_buffer(): a gradient written into the worker's own buffer is pushed as it is, and the "
          "buffer stays the worker's across pushes" *
          doctest::timeout(60)) {
  inproc_world world(2);
  const std::vector<float> w0(10, 1.0f);
  std::string server_error;
  std::thread server = ps_worker_test::serve(world, w0, 1, server_error);
  auto comm = world.join(1);
  ps_worker<inproc_communicator> w(comm, w0.size());
  std::vector<float> weights(w0.size(), 0.0f);
  w.pull(weights.data());
  float* g = w.gradient_buffer();
  REQUIRE(g != nullptr);
  for (int k = 1; k <= 2; ++k) {
    std::fill(g, g + w0.size(), 1.0f);
    w.push_pull(g, weights.data());  // sgd with the default rate: w -= 0.01 * g
    CHECK(w.gradient_buffer() == g);
    for (float x : weights) CHECK(x == doctest::Approx(1.0f - 0.01f * static_cast<float>(k)));
  }
  w.finish();
  server.join();
  CHECK(server_error.empty());
}
