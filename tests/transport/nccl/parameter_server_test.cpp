// The parameter server's NCCL form on CPU: headers on the in-process control communicator,
// gradients and weights over nccl_communicator backed by the fake NCCL (host memory standing in
// for device memory), the caller's buffers on the servers.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/protocol.hpp>

#include "fake_nccl.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;
namespace fake = cadence_fake_nccl;

namespace {

void gradient(worker_id w, std::int64_t k, std::vector<float>& g) {
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(static_cast<int>((w * 31 + static_cast<std::size_t>(k) * 7 + i) % 13) - 6) * 0.25f;
}

}  // namespace

TEST_CASE("NCCL form: headers on the control communicator, bulk over NCCL send/recv" *
          doctest::timeout(120)) {
  constexpr std::size_t model = 777;
  constexpr int servers = 2, workers = 3;
  constexpr std::int64_t iterations = 8;
  for (const char* policy : {"bsp", "ssp:1", "elastic:3"}) {
    CAPTURE(policy);
    std::vector<float> w0(model);
    for (std::size_t i = 0; i < model; ++i) w0[i] = static_cast<float>(i % 5);
    std::mutex m;
    std::vector<ps_stats> stats(servers);
    std::vector<std::vector<float>> slices(servers);
    std::vector<std::int64_t> done(workers, 0);
    std::atomic<int> pulled{0};  // the first pulls all see the initial weights
    ps_options o;
    o.servers = servers;
    o.keep_log = true;
    const auto errors = fake::run_ranks(servers + workers, [&](int r, inproc_communicator& control,
                                                               nccl_communicator& bulk) {
      if (r < servers) {
        const ps_slice sl = ps_slice_of(model, servers, r);
        // The caller's "device" buffers: the slice's initial weights and a landing buffer.
        std::vector<float> weights(w0.begin() + static_cast<std::ptrdiff_t>(sl.offset),
                                   w0.begin() + static_cast<std::ptrdiff_t>(sl.offset + sl.count));
        std::vector<float> scratch(sl.count);
        parameter_server<inproc_communicator, any_controller, float, sgd<float>, nccl_communicator>
            server(control, bulk, model, weights.data(), scratch.data(),
                   make_controller(policy, workers), sgd<float>{0.125f}, o);
        server.run();
        CHECK(server.weights().data() == weights.data());  // the caller's buffer, updated in place
        std::lock_guard<std::mutex> lock(m);
        stats[static_cast<std::size_t>(r)] = server.stats();
        slices[static_cast<std::size_t>(r)] = weights;
        return;
      }
      ps_worker<inproc_communicator, float, nccl_communicator> worker(control, bulk, model, o);
      std::vector<float> weights(model), g(model);
      CHECK_THROWS_WITH_AS(worker.push_pull(g.data(), weights.data()), doctest::Contains("before pull()"),
                           invalid_parameter_error);
      worker.pull(weights.data());
      CHECK(weights == w0);  // nobody pushes before every worker has pulled (below)
      pulled.fetch_add(1);
      while (pulled.load() < workers) std::this_thread::yield();
      for (std::int64_t k = 1; k <= iterations; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1 + r % 3));
        gradient(worker.id(), k, g);
        worker.push_pull(g.data(), weights.data());
      }
      worker.finish();
      std::lock_guard<std::mutex> lock(m);
      done[worker.id()] = worker.iteration();
    });
    for (std::size_t r = 0; r < errors.size(); ++r) CHECK_MESSAGE(errors[r].empty(), "rank " << r << ": " << errors[r]);
    for (int w = 0; w < workers; ++w) {
      CHECK(done[static_cast<std::size_t>(w)] == iterations);
      for (int s = 0; s < servers; ++s) CHECK(stats[static_cast<std::size_t>(s)].pushes[static_cast<std::size_t>(w)] == iterations);
    }
    if (std::string(policy) == "bsp")
      for (auto st : stats[0].max_start_staleness) CHECK(st == 0);
    // Replay each server's log from the initial slice.
    for (int s = 0; s < servers; ++s) {
      const ps_slice sl = ps_slice_of(model, servers, s);
      std::vector<float> w(w0.begin() + static_cast<std::ptrdiff_t>(sl.offset),
                           w0.begin() + static_cast<std::ptrdiff_t>(sl.offset + sl.count));
      std::vector<float> g(model);
      for (const ps_log_entry& e : stats[static_cast<std::size_t>(s)].log) {
        gradient(e.worker, e.iteration, g);
        sgd<float>{0.125f}(w.data(), g.data() + sl.offset, sl.count, e.worker);
      }
      CHECK(w == slices[static_cast<std::size_t>(s)]);
    }
  }
}

TEST_CASE("NCCL form: a worker whose model size differs is refused at pull(), before any bulk "
          "transfer" * doctest::timeout(60)) {
  ps_options o;
  std::string refused;
  const auto errors = fake::run_ranks(2, [&](int r, inproc_communicator& control, nccl_communicator& bulk) {
    if (r == 0) {
      std::vector<float> weights(10, 1.0f), scratch(10);
      parameter_server<inproc_communicator, any_controller, float, sgd<float>, nccl_communicator>
          server(control, bulk, 10, weights.data(), scratch.data(), make_controller("asp", 1), {}, o);
      server.run();
      return;
    }
    ps_worker<inproc_communicator, float, nccl_communicator> worker(control, bulk, 12, o);
    std::vector<float> weights(12);
    try {
      worker.pull(weights.data());
    } catch (const worker_error& e) {
      refused = e.what();
    }
    worker.finish();
  });
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  CHECK(refused.find("a model of 12 elements, but server rank 0 serves one of 10") != std::string::npos);
}

TEST_CASE("NCCL cannot be the control communicator") {
  fake::world fw;
  const nccl_api api = fw.api();
  inproc_world world(1);
  auto control = world.join(0);
  nccl_communicator bulk(api, control, 0, {}, 10s);
  // A world of one leaves no worker (checked first), so the check is called directly.
  CHECK_THROWS_WITH_AS(cadence::exchange::detail::check_same_ranks("ps_worker", bulk, bulk),
                       doctest::Contains("cannot receive from any_source"), invalid_parameter_error);
}
