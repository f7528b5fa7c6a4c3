// The parameter server over gloo (ranks as threads, each with its own gloo context over one
// temporary file store; server rank 0, workers 1-3): every policy's guarantee at the server,
// exactly-once application, replay of the log; a stalled worker evicted at the liveness
// deadline while the others finish, then refused when it comes back. The server waits with
// try_recv(any_source), which sees a crashed worker only through its deadline on gloo, so
// eviction by silence is how gloo drops a worker.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/gloo/communicator.hpp>

#include "gloo_ranks.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t model = 4099;  // odd: slices of unequal length
constexpr int ranks = 4;

void gradient(worker_id w, std::int64_t k, std::vector<double>& g) {
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<double>(static_cast<int>((w * 31 + static_cast<std::size_t>(k) * 7 + i) % 13) - 6) * 0.25;
}

std::vector<double> initial() {
  std::vector<double> w(model);
  for (std::size_t i = 0; i < model; ++i) w[i] = static_cast<double>(i % 17) * 0.5;
  return w;
}

// body(comm) on one thread per rank, each with a fresh gloo communicator over a fresh store.
template <class Body>
void run_gloo_ranks(Body body) {
  cadence_gloo_test::gloo_threads_harness<ranks>::run(body);
}

}  // namespace

TEST_CASE("parameter server over gloo: every policy, guarantee, exactly once, replay" *
          doctest::timeout(120)) {
  const int workers = ranks - 1;
  struct policy_case {
    const char* config;
    clock_value bound;
  };
  for (const policy_case pc : {policy_case{"bsp", 0}, policy_case{"ssp:1", 1},
                               policy_case{"dssp:1:3", 3}, policy_case{"asp", -1},
                               policy_case{"elastic:3", -1}}) {
    CAPTURE(pc.config);
    const std::int64_t iterations = 10;
    const std::vector<double> w0 = initial();
    std::mutex m;
    ps_stats stats;
    std::vector<double> final_weights, replay = w0;
    run_gloo_ranks([&](gloo_communicator& comm) {
      ps_options o;
      o.keep_log = true;
      o.reply_timeout = 60s;
      o.evict_after = 20s;  // a worker that failed is evicted instead of awaited forever
      if (comm.rank() == 0) {
        parameter_server<gloo_communicator, any_controller, double> server(
            comm, model, w0.data(), make_controller(pc.config, static_cast<std::size_t>(workers)),
            sgd<double>{0.125}, o);
        server.run();
        std::lock_guard<std::mutex> lock(m);
        stats = server.stats();
        final_weights.assign(server.weights().begin(), server.weights().end());
      } else {
        ps_worker<gloo_communicator, double> worker(comm, model, o);
        std::vector<double> weights(model), g(model);
        worker.pull(weights.data());  // the current weights (another worker may have pushed)
        for (std::int64_t k = 1; k <= iterations; ++k) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1 + 2 * (comm.rank() % 3)));
          gradient(worker.id(), k, g);
          worker.push_pull(g.data(), weights.data());
        }
        CHECK(worker.iteration() == iterations);
        worker.finish();
      }
    });
    REQUIRE(stats.pushes.size() == static_cast<std::size_t>(workers));
    for (int w = 0; w < workers; ++w) {
      CHECK(stats.pushes[static_cast<std::size_t>(w)] == iterations);
      if (pc.bound >= 0) CHECK(stats.max_start_staleness[static_cast<std::size_t>(w)] <= pc.bound);
    }
    CHECK(stats.evictions.empty());
    std::vector<double> g(model);
    for (const ps_log_entry& e : stats.log) {
      gradient(e.worker, e.iteration, g);
      sgd<double>{0.125}(replay.data(), g.data(), model, e.worker);
    }
    CHECK(replay == final_weights);
  }
}

TEST_CASE("parameter server over gloo: a stalled worker is evicted at the liveness deadline, the "
          "others finish, and it is refused when it comes back" * doctest::timeout(120)) {
  const int workers = ranks - 1;
  const int stalled_rank = ranks - 1;
  const std::int64_t iterations = 20;
  const std::vector<double> w0 = initial();
  std::mutex m;
  ps_stats stats;
  double run_seconds = 0;
  bool refused = false;
  run_gloo_ranks([&](gloo_communicator& comm) {
    ps_options o;
    o.evict_after = 500ms;
    o.reply_timeout = 30s;
    if (comm.rank() == 0) {
      parameter_server<gloo_communicator, any_controller, double> server(
          comm, model, w0.data(), make_controller("bsp", static_cast<std::size_t>(workers)),
          sgd<double>{0.125}, o);
      const auto t0 = std::chrono::steady_clock::now();
      server.run();
      std::lock_guard<std::mutex> lock(m);
      stats = server.stats();
      run_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return;
    }
    ps_worker<gloo_communicator, double> worker(comm, model, o);
    std::vector<double> weights(model), g(model);
    worker.pull(weights.data());
    for (std::int64_t k = 1; k <= iterations; ++k) {
      if (comm.rank() == stalled_rank && k == 3) {
        // Silent past evict_after while the others run on; back before they finish.
        std::this_thread::sleep_for(1200ms);
        gradient(worker.id(), k, g);
        try {
          worker.push_pull(g.data(), weights.data());
        } catch (const worker_error& e) {
          std::lock_guard<std::mutex> lock(m);
          refused = std::string(e.what()).find("was evicted") != std::string::npos;
        }
        return;
      }
      std::this_thread::sleep_for(100ms);
      gradient(worker.id(), k, g);
      worker.push_pull(g.data(), weights.data());
    }
    worker.finish();
  });
  REQUIRE(stats.evictions.size() == 1);
  CHECK(stats.evictions[0].worker == static_cast<worker_id>(stalled_rank - 1));
  CHECK(stats.evictions[0].pushes == 2);
  CHECK(stats.evictions[0].silent_seconds >= 0.5);
  for (int w = 0; w < workers - 1; ++w) CHECK(stats.pushes[static_cast<std::size_t>(w)] == iterations);
  CHECK(refused);
  CHECK(run_seconds < 30.0);
}
