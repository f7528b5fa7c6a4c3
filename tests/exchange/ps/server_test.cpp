// cadence/exchange/ps/server.hpp: what a server measures and keeps (ps_stats: parked time per
// worker, the staleness histogram, the log only with keep_log), over in-process ranks. The
// server's protocol under every policy and fault is tested with the workers', in
// tests/exchange/parameter_server*_test.cpp and ps_suite.hpp.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/inproc.hpp>

#include "exchange/ps_suite.hpp"
#include "support/events.hpp"
#include "transport/inproc_ranks.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;

namespace ps_server_test {

constexpr std::size_t test_model = 1000;

// The shipped SGD, and an event per push it applied: "applied.<worker>.<its n-th push>". It runs
// on server 0's thread before the controller sees the push, so a worker that waits for another's
// "applied" knows the server has parked (or released) that push before it reads this one.
struct announcing_sgd {
  const cadence_test::events* ev;
  std::vector<std::int64_t>* applied;  // per worker; server 0's thread only
  void operator()(float* w, const float* g, std::size_t n, worker_id from) const {
    sgd<float>{0.125f}(w, g, n, from);
    ev->post("applied." + std::to_string(from) + "." + std::to_string(++(*applied)[from]));
  }
};

}  // namespace ps_server_test

using ps_server_test::announcing_sgd;
using ps_server_test::test_model;

TEST_CASE("server 0 counts how long each worker's pushes stayed parked: the wait for a slow worker "
          "is the fast ones', and a push released at once adds nothing" *
          doctest::timeout(60)) {
  // Worker 2 is the straggler: it pushes iteration k only after the server has applied (and
  // under BSP parked) the others' k-th pushes, so its own push always completes the round. The
  // fast workers' pushes are all parked until then; worker 2's never are. No clock is compared
  // with a deadline: the order is forced by the events.
  constexpr int workers = 3;
  constexpr std::int64_t iterations = 6;
  for (const char* policy : {"bsp", "asp"}) {
    CAPTURE(policy);
    const bool bsp = std::string(policy) == "bsp";
    inproc_world world(1 + workers);
    const cadence_test::events ev;
    std::vector<std::int64_t> applied(workers, 0);
    ps_stats stats;
    std::vector<double> blocked(workers, 0.0);  // per worker: seconds inside push_pull
    cadence_test::run_inproc_ranks(world, [&](inproc_communicator& comm) {
      const std::vector<float> w0 = cadence_ps_suite::initial<float>(test_model);
      if (comm.rank() == 0) {
        parameter_server<inproc_communicator, any_controller, float, announcing_sgd> server(
            comm, test_model, w0.data(), make_controller(policy, workers), announcing_sgd{&ev, &applied});
        server.run();
        stats = server.stats();
        return;
      }
      ps_worker<inproc_communicator> worker(comm, test_model);
      const worker_id w = worker.id();
      std::vector<float> weights(test_model), g(test_model);
      worker.pull(weights.data());
      for (std::int64_t k = 1; k <= iterations; ++k) {
        if (w == 2)
          for (int v = 0; v < 2; ++v) CHECK(ev.wait("applied." + std::to_string(v) + "." + std::to_string(k)));
        cadence_ps_suite::gradient(w, k, g);
        const auto t0 = std::chrono::steady_clock::now();
        worker.push_pull(g.data(), weights.data());
        blocked[w] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      worker.finish();
    });
    REQUIRE(stats.parked_seconds.size() == workers);
    REQUIRE(stats.parked_pushes.size() == workers);
    CHECK(stats.parked_pushes[2] == 0);
    CHECK(stats.parked_seconds[2] == 0.0);
    for (int w = 0; w < 2; ++w) {
      CAPTURE(w);
      CHECK(stats.parked_pushes[w] == (bsp ? iterations : 0));
      if (bsp)
        CHECK(stats.parked_seconds[w] > 0.0);
      else
        CHECK(stats.parked_seconds[w] == 0.0);
      // The server's park lies inside the worker's push_pull (one clock, one process).
      CHECK(stats.parked_seconds[w] <= blocked[w]);
    }
    CHECK(stats.parked == stats.parked_pushes[0] + stats.parked_pushes[1] + stats.parked_pushes[2]);
  }
}

TEST_CASE("without keep_log a server keeps counts and a bounded staleness histogram, not the run's "
          "history" * doctest::timeout(60)) {
  inproc_world world(3);
  ps_stats stats;
  std::thread server([&] {
    auto c = world.join(0);
    const auto w0 = cadence_ps_suite::initial<float>(test_model);
    parameter_server<inproc_communicator, any_controller> s(c, test_model, w0.data(), make_controller("ssp:2", 2));
    s.run();
    stats = s.stats();
  });
  std::vector<std::thread> workers;
  for (int r : {1, 2}) {
    workers.emplace_back([&, r] {
      auto c = world.join(r);
      ps_worker<inproc_communicator> w(c, test_model);
      std::vector<float> weights(test_model), g(test_model, 0.25f);
      w.pull(weights.data());
      for (int k = 0; k < 50; ++k) w.push_pull(g.data(), weights.data());
      w.finish();
    });
  }
  for (auto& t : workers) t.join();
  server.join();
  CHECK(stats.log.empty());
  CHECK(stats.start_staleness.empty());
  REQUIRE(stats.staleness_histogram.size() == ps_histogram_top + 1);
  std::int64_t releases = 0;
  for (auto v : stats.staleness_histogram) releases += v;
  CHECK(releases == 100);
  CHECK(histogram_percentile(stats.staleness_histogram, 100.0) <= 2);
}
