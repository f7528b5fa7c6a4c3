// cadence-train's start of a parameter-server policy over a communicator that isolates a lost
// peer (roles.hpp: start_open on rank 0, start_open_worker on a worker), over in-process ranks
// under every parameter-server policy: a worker lost at the ready step, one silent past the
// start-up deadline and one found absent before (introduce_ranks) are dropped before the server
// runs (parameter_server::drop_absent), each with its reason, and the one ready worker trains
// and finishes alone. The same steps as processes: tests/startup_fault_test.sh.
#include "roles.hpp"

#include <cadence/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

TEST_CASE("start_open: a worker lost at the start, one silent past the deadline and one absent since introduce_ranks "
          "are dropped before the server runs, and the ready one trains alone, under every policy" *
          doctest::timeout(120)) {
  constexpr std::size_t model = 64;
  constexpr std::int64_t iterations = 4;
  // Rank 1 is ready; rank 2 leaves before it says so (lost); rank 3 never says it (silent);
  // rank 4 never came (absent: its thread never joins the world).
  for (const char* policy : {"bsp", "ssp:1", "dssp:1:3", "asp", "elastic:3"}) {
    CAPTURE(policy);
    cadence::transport::inproc_world world(5);
    cadence::exchange::ps_options po;
    std::vector<std::pair<int, std::string>> missing;
    cadence::exchange::ps_stats stats;
    std::int64_t trained = 0;
    std::string server_error, worker_error;  // one per thread
    std::thread server([&] {
      auto c = world.join(0);
      try {
        const std::vector<float> w0(model, 0.5f);
        cadence::exchange::parameter_server<cadence::transport::inproc_communicator, cadence::any_controller> s(
            c, model, w0.data(), cadence::make_controller(policy, 4), cadence::exchange::sgd<float>{0.125f}, po);
        // Rank 2 is gone before rank 0 listens: wait for it (a lost peer, not a race).
        while (!c.peer_lost(2)) std::this_thread::sleep_for(1ms);
        missing = cadence::train::start_open(c, -1, {4}, std::chrono::milliseconds(300));
        for (const auto& m : missing)
          s.drop_absent(static_cast<cadence::worker_id>(m.first - 1), "rank " + std::to_string(m.first) + ": " + m.second);
        s.run();
        stats = s.stats();
      } catch (const std::exception& e) {
        server_error = e.what();
      }
    });
    std::thread ready([&] {
      auto c = world.join(1);
      try {
        cadence::train::start_open_worker(c, "policy 1 ready", 60s);
        cadence::exchange::ps_worker<cadence::transport::inproc_communicator> w(c, model, po);
        std::vector<float> weights(model), g(model, 0.25f);
        w.pull(weights.data());
        for (std::int64_t k = 0; k < iterations; ++k) w.push_pull(g.data(), weights.data());
        trained = w.iteration();
        w.finish();
      } catch (const std::exception& e) {
        worker_error = e.what();
      }
    });
    std::thread lost([&] { auto c = world.join(2); });  // leaves at once: its communicator is destroyed
    std::thread silent([&] {
      auto c = world.join(3);
      // Silent until the server is done (it never says ready); then it leaves.
      while (!c.peer_lost(0)) std::this_thread::sleep_for(1ms);
    });
    server.join();
    ready.join();
    lost.join();
    silent.join();
    CHECK(server_error == "");
    CHECK(worker_error == "");
    REQUIRE(missing.size() == 3);
    CHECK(missing[0].first == 2);
    CHECK(missing[0].second.find("lost while starting") != std::string::npos);
    CHECK(missing[1].first == 3);
    CHECK(missing[1].second.find("not ready within --start-timeout 0.3 s") != std::string::npos);
    CHECK(missing[2].first == 4);
    CHECK(missing[2].second.find("did not introduce itself") != std::string::npos);
    REQUIRE(stats.evictions.size() == 3);
    for (const auto& e : stats.evictions) {
      CHECK(e.pushes == 0);
      CHECK(e.reason.rfind("absent at the start: rank " + std::to_string(e.rank), 0) == 0);
    }
    CHECK(trained == iterations);
    CHECK(stats.pushes.at(0) == iterations);
  }
}
