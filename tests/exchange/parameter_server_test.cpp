// The parameter server over in-process ranks: the shared suite (ps_suite.hpp: every policy's
// guarantee, exactly-once application, replay of the log; a stalled worker evicted and refused
// when it comes back), then what needs this backend: 2 servers, more worker counts, eviction of a
// silent or killed worker under several policies, a dead server. Each end on its own:
// tests/exchange/ps/ (options, worker, server).
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/inproc.hpp>

#include "exchange/ps_suite.hpp"
#include "support/events.hpp"
#include "transport/inproc_ranks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;

using inproc_4 = cadence_test::inproc_harness<4>;
CADENCE_PS_SUITE(inproc_4);

namespace {

constexpr std::size_t model = 1000;

using cadence_ps_suite::gradient;

std::vector<float> initial() { return cadence_ps_suite::initial<float>(model); }

struct run_result : cadence_ps_suite::server_results {
  std::vector<std::int64_t> iterations;    // per worker, completed push_pulls
  std::vector<std::string> worker_errors;  // per worker, "" when none
  std::size_t supersteps_hint = 0;
};

struct scenario {
  std::string policy = "bsp";
  int servers = 1;
  int workers = 3;
  std::int64_t iterations = 12;
  std::vector<int> ms_per_iteration{1, 2, 3};
  ps_options options{};
  // Optional per-worker behaviour: return false to stall before iteration k (silent until the
  // server has evicted it, then gone without finish).
  std::function<bool(worker_id, std::int64_t)> keep_going;
  std::function<void(inproc_world&, worker_id, std::int64_t)> before_push;
  // Optional: return true to finish (healthy) before iteration k instead of pushing it.
  std::function<bool(worker_id, std::int64_t)> finish_before;
  // Runs before the ranks start (on_step fault injection).
  std::function<void(inproc_world&)> setup;
};

run_result run(const scenario& sc, const cadence_test::events& ev = cadence_test::events()) {
  const int n = sc.servers + sc.workers;
  inproc_world world(n);
  ps_options o = cadence_ps_suite::scenario_options(sc.options, sc.servers, ev);
  if (sc.setup) sc.setup(world);
  run_result out;
  out.iterations.assign(static_cast<std::size_t>(sc.workers), 0);
  out.worker_errors.assign(static_cast<std::size_t>(sc.workers), "");
  std::mutex m;
  auto work = [&](inproc_communicator& comm, int r) {
    const auto w = static_cast<worker_id>(r - sc.servers);
    try {
      ps_worker<inproc_communicator> worker(comm, model, o);
      CHECK(worker.id() == w);
      std::vector<float> weights(model), g(model);
      worker.pull(weights.data());
      for (std::int64_t k = 1; k <= sc.iterations; ++k) {
        if (sc.keep_going && !sc.keep_going(w, k)) {
          // Stalled, not crashed: silent while its rank stays up (a destroyed communicator
          // would make it a lost peer instead) until server 0 has evicted it.
          CHECK(ev.wait("evicted." + std::to_string(w)));
          return;
        }
        if (sc.finish_before && sc.finish_before(w, k)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(sc.ms_per_iteration[w]));
        if (sc.before_push) sc.before_push(world, w, k);
        gradient(w, k, g);
        worker.push_pull(g.data(), weights.data());
        std::lock_guard<std::mutex> lock(m);
        out.iterations[w] = k;
      }
      worker.finish();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(m);
      out.worker_errors[w] = e.what();
    }
  };
  cadence_ps_suite::run_job(world, n, sc.policy, static_cast<std::size_t>(sc.workers), initial(), 0.125f, o, out, m,
                            work);
  return out;
}

// Each server's slice equals the initial slice with its logged pushes applied in log order.
void check_replay(const run_result& r, int servers) { cadence_ps_suite::check_replays(r, initial(), servers, 0.125f); }

}  // namespace

TEST_CASE("every policy over 1 and 2 servers: guarantee, exactly-once, replay" * doctest::timeout(120)) {
  struct policy_case {
    const char* config;
    clock_value bound;  // largest clock gap a worker may start an iteration with
  };
  const policy_case cases[] = {{"bsp", 0},         {"ssp:2", 2},        {"dssp:1:4", 4},
                               {"asp", -1},        {"elastic:3", -1}};
  for (const auto& pc : cases) {
    for (int servers : {1, 2}) {
      for (int workers : {2, 4}) {
        CAPTURE(pc.config);
        CAPTURE(servers);
        CAPTURE(workers);
        scenario sc;
        sc.policy = pc.config;
        sc.servers = servers;
        sc.workers = workers;
        sc.ms_per_iteration = {1, 4, 2, 3};
        const run_result r = run(sc);
        INFO(r.server_error);
        REQUIRE(r.server_error.empty());
        for (int w = 0; w < workers; ++w) {
          CHECK_MESSAGE(r.worker_errors[static_cast<std::size_t>(w)].empty(), r.worker_errors[static_cast<std::size_t>(w)]);
          CHECK(r.iterations[static_cast<std::size_t>(w)] == sc.iterations);
          for (int s = 0; s < servers; ++s)  // every accepted push applied exactly once, everywhere
            CHECK(r.servers[static_cast<std::size_t>(s)].pushes[static_cast<std::size_t>(w)] == sc.iterations);
          if (pc.bound >= 0)
            CHECK(r.servers[0].max_start_staleness[static_cast<std::size_t>(w)] <= pc.bound);
        }
        for (int s = 0; s < servers; ++s)
          CHECK(r.servers[static_cast<std::size_t>(s)].log.size() ==
                static_cast<std::size_t>(workers * sc.iterations));
        // Server 0 records the staleness of every release: one per push_pull, within the
        // policy's bound, and its largest is the per-worker maxima's largest.
        const auto& gaps = r.servers[0].start_staleness;
        CHECK(gaps.size() == static_cast<std::size_t>(workers * sc.iterations));
        const clock_value top = gaps.empty() ? 0 : *std::max_element(gaps.begin(), gaps.end());
        CHECK(top == *std::max_element(r.servers[0].max_start_staleness.begin(),
                                       r.servers[0].max_start_staleness.end()));
        if (pc.bound >= 0) CHECK(top <= pc.bound);
        for (int s = 1; s < servers; ++s) CHECK(r.servers[static_cast<std::size_t>(s)].start_staleness.empty());
        check_replay(r, servers);
      }
    }
  }
}

TEST_CASE("BSP over two servers: weights at the start of an iteration contain the whole round" *
          doctest::timeout(60)) {
  // Under BSP a released worker's weights must include every worker's push of the round on
  // every shard: the release notice carries server 0's counts, the other server waits for them.
  scenario sc;
  sc.servers = 2;
  sc.workers = 3;
  sc.ms_per_iteration = {1, 6, 2};
  const run_result r = run(sc);
  INFO(r.server_error);
  REQUIRE(r.server_error.empty());
  for (int s = 0; s < 2; ++s) {
    // In each server's log, no worker's iteration k+1 comes before every worker's iteration k.
    std::vector<std::int64_t> seen(3, 0);
    for (const ps_log_entry& e : r.servers[static_cast<std::size_t>(s)].log) {
      for (int v = 0; v < 3; ++v) CHECK(seen[static_cast<std::size_t>(v)] >= e.iteration - 1);
      seen[e.worker] = e.iteration;
    }
  }
  CHECK(r.servers[0].parked > 0);
}

TEST_CASE("a worker that falls silent is evicted; the others finish; nothing they pushed is lost" *
          doctest::timeout(60)) {
  for (const char* policy : {"bsp", "ssp:1", "elastic:3"}) {
    for (int servers : {1, 2}) {
      if (std::string(policy) == "bsp" && servers == 1) continue;  // the suite's stalled-worker case
      CAPTURE(policy);
      CAPTURE(servers);
      scenario sc;
      sc.policy = policy;
      sc.servers = servers;
      sc.workers = 3;
      sc.iterations = 10;
      sc.options.evict_after = 500ms;  // heartbeats every 125 ms; 150 ms raced a loaded machine
      sc.keep_going = [](worker_id w, std::int64_t k) { return !(w == 1 && k == 4); };
      const run_result r = run(sc);
      INFO(r.server_error);
      REQUIRE(r.server_error.empty());
      REQUIRE(r.servers[0].evictions.size() == 1);
      CHECK(r.servers[0].evictions[0].worker == 1);
      // Evicted for its silence (not lost, nor broke the protocol): what evict_after is for.
      CHECK(r.servers[0].evictions[0].reason.rfind("silent for ", 0) == 0);
      CHECK(r.servers[0].evictions[0].pushes == 3);
      CHECK(r.servers[0].evictions[0].silent_seconds >= 0.5);
      for (worker_id w : {0u, 2u}) {
        CHECK(r.worker_errors[w].empty());
        CHECK(r.iterations[w] == 10);
        for (int s = 0; s < servers; ++s) CHECK(r.servers[static_cast<std::size_t>(s)].pushes[w] == 10);
      }
      CHECK(r.servers[0].pushes[1] == 3);
      check_replay(r, servers);
    }
  }
}

TEST_CASE("a killed worker is evicted and the survivors finish" * doctest::timeout(60)) {
  scenario sc;
  sc.policy = "bsp";
  sc.workers = 3;
  sc.iterations = 8;
  sc.options.evict_after = 500ms;
  // Worker 2's rank dies (as a crashed process would) while it computes its 5th iteration.
  sc.before_push = [](inproc_world& world, worker_id w, std::int64_t k) {
    if (w == 2 && k == 5) {
      world.kill(static_cast<int>(w) + 1);
      throw std::runtime_error("killed");
    }
  };
  const run_result r = run(sc);
  INFO(r.server_error);
  REQUIRE(r.server_error.empty());
  REQUIRE(r.servers[0].evictions.size() == 1);
  CHECK(r.servers[0].evictions[0].worker == 2);
  CHECK(r.iterations[0] == 8);
  CHECK(r.iterations[1] == 8);
  CHECK(r.servers[0].pushes[2] == 4);
  check_replay(r, 1);
}

TEST_CASE("a worker killed while it waits for its reply is dropped when the reply finds it gone" *
          doctest::timeout(60)) {
  // BSP. Worker 0 is killed as it starts waiting for the reply to its 3rd push (its push is
  // already sent, so the server parks it at the barrier); workers 1 and 2 push their 3rd only
  // after that, so the reply that releases worker 0 finds it gone (not silence: evict_after is
  // long), and the survivors go on.
  for (int servers : {1, 2}) {
    CAPTURE(servers);
    const cadence_test::events ev;
    scenario sc;
    sc.policy = "bsp";
    sc.servers = servers;
    sc.workers = 3;
    sc.iterations = 10;
    sc.ms_per_iteration = {0, 5, 5};
    sc.options.evict_after = 30s;
    sc.setup = [servers, &ev](inproc_world& world) {
      inproc_step at;
      at.op = "try_recv";                  // a worker waits for its reply with try_recv
      at.tag = ps_options{}.tag_base + 2;  // the reply tag
      at.skip = 3 * servers;               // the replies to pull() and two push_pulls
      world.on_step(servers, at, [servers, &ev](inproc_world& w) {  // worker 0's rank
        w.kill(servers);
        ev.post("worker 0 killed");
      });
    };
    sc.before_push = [&ev](inproc_world&, worker_id w, std::int64_t k) {
      if (w != 0 && k == 3) CHECK(ev.wait("worker 0 killed"));
    };
    // evict_after is 30 s: the reason below ("lost") says it was dropped for the kill, not then.
    const run_result r = run(sc, ev);
    INFO(r.server_error);
    REQUIRE(r.server_error.empty());
    REQUIRE(r.servers[0].evictions.size() == 1);
    CHECK(r.servers[0].evictions[0].worker == 0);
    CHECK(r.servers[0].evictions[0].pushes == 3);
    CHECK(r.servers[0].evictions[0].reason.find("lost") != std::string::npos);
    CHECK(r.worker_errors[0].find("this rank is gone") != std::string::npos);
    CHECK(r.iterations[1] == 10);
    CHECK(r.iterations[2] == 10);
    check_replay(r, servers);
  }
}

TEST_CASE("a dead server is fail-stop: the workers throw naming it, nobody hangs" *
          doctest::timeout(60)) {
  scenario sc;
  sc.policy = "bsp";
  sc.servers = 2;
  sc.workers = 2;
  sc.iterations = 200;
  sc.ms_per_iteration = {2, 3};
  sc.options.reply_timeout = 2s;
  sc.before_push = [](inproc_world& world, worker_id w, std::int64_t k) {
    if (w == 0 && k == 5) world.kill(1);  // server rank 1, mid-run
  };
  const run_result r = run(sc);  // the doctest timeout catches a hang; the errors say why
  for (int w = 0; w < 2; ++w) {
    const std::string& e = r.worker_errors[static_cast<std::size_t>(w)];
    INFO(e);
    CHECK(r.iterations[static_cast<std::size_t>(w)] < 200);
    // Either the push to it or the wait for its reply names server rank 1. The wait may
    // also list server 0, when the worker was parked at the BSP barrier (server 0 had not
    // answered yet either): "no reply from server rank(s) 0, 1".
    const std::string wait = "no reply from server rank(s) ";
    const auto at = e.find(wait);
    const std::string listed = at == std::string::npos ? "" : e.substr(at + wait.size(), e.find(':', at) - at - wait.size());
    // Or, when server 0 saw rank 1 gone first and stopped (fail-stop: it throws "server rank 1
    // is gone", below), the worker finds server 0 gone as well and names it.
    const bool names_1 = e.find("sending to server rank 1 failed") != std::string::npos || listed == "1" ||
                         listed == "0, 1";
    const bool cascade = (e.find("sending to server rank 0 failed") != std::string::npos || listed == "0") &&
                         e.find("lost rank 0") != std::string::npos;
    CHECK((names_1 || cascade));
  }
  INFO(r.server_error);
  CHECK(r.server_error.find("server 1:") != std::string::npos);
  CHECK(r.server_error.find("server rank 1 is gone") != std::string::npos);
}

TEST_CASE("an evicted worker that comes back gets a clear error" * doctest::timeout(60)) {
  scenario sc;
  sc.policy = "asp";
  sc.workers = 2;
  sc.iterations = 100000;  // worker 0's bound: only catches a refusal that never comes
  sc.options.evict_after = 500ms;
  sc.ms_per_iteration = {1, 1};
  // Worker 1 falls silent before its 3rd push until the server has evicted it; worker 0 keeps
  // training (never silent itself) and so keeps the server up until worker 1's late push has
  // been refused.
  const cadence_test::events ev;
  sc.before_push = [&ev](inproc_world&, worker_id w, std::int64_t k) {
    if (w == 1 && k == 3) CHECK(ev.wait("evicted.1"));
  };
  sc.finish_before = [&ev](worker_id w, std::int64_t k) { return w == 0 && k > 3 && ev.posted("refused.1"); };
  const run_result r = run(sc, ev);
  INFO(r.server_error);
  REQUIRE(r.server_error.empty());
  INFO(r.worker_errors[1]);
  CHECK(r.worker_errors[1].find("evicted") != std::string::npos);
  CHECK(r.worker_errors[1].find("worker 1") != std::string::npos);
  CHECK(r.iterations[1] == 2);
  CHECK(r.servers[0].pushes[1] == 2);  // the late push was refused, not applied
  CHECK(r.iterations[0] >= 3);
  CHECK(r.iterations[0] < sc.iterations);
  CHECK(r.servers[0].pushes[0] == r.iterations[0]);
  check_replay(r, 1);
}
