// The parameter server across MPI processes (mpirun -np 4: server rank 0, workers 1-3): every
// policy's guarantee at the server, exactly-once application, replay of the log; a stalled
// worker evicted while the others finish, then refused when it comes back.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/mpi/communicator.hpp>

#include <doctest/doctest.h>

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t model = 4099;  // odd: slices of unequal length

void gradient(worker_id w, std::int64_t k, std::vector<double>& g) {
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<double>(static_cast<int>((w * 31 + static_cast<std::size_t>(k) * 7 + i) % 13) - 6) * 0.25;
}

std::vector<double> initial() {
  std::vector<double> w(model);
  for (std::size_t i = 0; i < model; ++i) w[i] = static_cast<double>(i % 17) * 0.5;
  return w;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace

TEST_CASE("parameter server over MPI: every policy, guarantee, exactly once, replay" *
          doctest::timeout(120)) {
  const int n = world_size();
  if (n < 2) return;
  const int workers = n - 1;
  struct policy_case {
    const char* config;
    clock_value bound;
  };
  for (const policy_case pc : {policy_case{"bsp", 0}, policy_case{"ssp:1", 1},
                               policy_case{"dssp:1:3", 3}, policy_case{"asp", -1},
                               policy_case{"elastic:3", -1}}) {
    CAPTURE(pc.config);
    mpi_communicator comm(MPI_COMM_WORLD, {}, 30s);
    ps_options o;
    o.keep_log = true;
    o.reply_timeout = 60s;
    const std::int64_t iterations = 10;
    const std::vector<double> w0 = initial();
    if (comm.rank() == 0) {
      parameter_server<mpi_communicator, any_controller, double> server(
          comm, model, w0.data(), make_controller(pc.config, static_cast<std::size_t>(workers)),
          sgd<double>{0.125}, o);
      server.run();
      const ps_stats& st = server.stats();
      for (int w = 0; w < workers; ++w) {
        CHECK(st.pushes[static_cast<std::size_t>(w)] == iterations);
        if (pc.bound >= 0) CHECK(st.max_start_staleness[static_cast<std::size_t>(w)] <= pc.bound);
      }
      CHECK(st.evictions.empty());
      std::vector<double> replay = w0, g(model);
      for (const ps_log_entry& e : st.log) {
        gradient(e.worker, e.iteration, g);
        sgd<double>{0.125}(replay.data(), g.data(), model, e.worker);
      }
      CHECK(replay == std::vector<double>(server.weights().begin(), server.weights().end()));
    } else {
      ps_worker<mpi_communicator, double> worker(comm, model, o);
      std::vector<double> weights(model), g(model);
      worker.pull(weights.data());
      CHECK(weights == w0);
      for (std::int64_t k = 1; k <= iterations; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1 + 2 * (comm.rank() % 3)));
        gradient(worker.id(), k, g);
        worker.push_pull(g.data(), weights.data());
      }
      CHECK(worker.iteration() == iterations);
      worker.finish();
    }
  }
}

TEST_CASE("parameter server over MPI: a stalled worker is evicted, the others finish, and it "
          "is refused when it comes back" * doctest::timeout(120)) {
  const int n = world_size();
  if (n < 3) return;
  const int workers = n - 1;
  mpi_communicator comm(MPI_COMM_WORLD, {}, 30s);
  ps_options o;
  o.evict_after = 500ms;
  o.reply_timeout = 30s;
  const std::vector<double> w0 = initial();
  const int stalled_rank = n - 1;
  const std::int64_t iterations = 30;
  if (comm.rank() == 0) {
    parameter_server<mpi_communicator, any_controller, double> server(
        comm, model, w0.data(), make_controller("bsp", static_cast<std::size_t>(workers)),
        sgd<double>{0.125}, o);
    const auto t0 = std::chrono::steady_clock::now();
    server.run();
    const ps_stats& st = server.stats();
    REQUIRE(st.evictions.size() == 1);
    CHECK(st.evictions[0].worker == static_cast<worker_id>(stalled_rank - 1));
    CHECK(st.evictions[0].pushes == 2);
    CHECK(st.evictions[0].silent_seconds >= 0.5);
    for (int w = 0; w < workers - 1; ++w) CHECK(st.pushes[static_cast<std::size_t>(w)] == iterations);
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  } else {
    ps_worker<mpi_communicator, double> worker(comm, model, o);
    std::vector<double> weights(model), g(model);
    worker.pull(weights.data());
    for (std::int64_t k = 1; k <= iterations; ++k) {
      if (comm.rank() == stalled_rank && k == 3) {
        // Stalls past evict_after while the others run on; back before they finish.
        std::this_thread::sleep_for(1500ms);
        gradient(worker.id(), k, g);
        CHECK_THROWS_WITH_AS(worker.push_pull(g.data(), weights.data()),
                             doctest::Contains("was evicted"), worker_error);
        break;
      }
      std::this_thread::sleep_for(100ms);
      gradient(worker.id(), k, g);
      worker.push_pull(g.data(), weights.data());
    }
    if (comm.rank() != stalled_rank) {
      CHECK(worker.iteration() == iterations);
      worker.finish();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
