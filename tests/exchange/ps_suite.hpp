// The parameter server's tests common to every backend that offers try_recv, written once over
// the communicator concept and instantiated per backend with CADENCE_PS_SUITE(H), H a harness as
// in collective_suite.hpp: H::run(body) calls body(comm) once per rank, ranks in parallel (threads,
// or the process itself under mpirun), a world of at least 3 ranks (4 in-tree: server rank 0,
// workers 1-3). Adding a backend is one line: CADENCE_PS_SUITE(its_harness). Also the helpers
// every backend's own parameter-server cases share: deterministic gradients, initial weights,
// the replay of a server's log.
//
// Each rank checks what it sees itself (the server its stats and the replay of its log, a worker
// its own progress), so the same bodies run with ranks as threads or as processes. Bodies use
// CHECK, never REQUIRE: a REQUIRE would throw out of a rank and leave the others waiting.
#pragma once

#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>

#include "support/events.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace cadence_ps_suite {

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;

// Worker w's gradient at its k-th push: deterministic, so a replay can recompute it. Multiples
// of 0.25, so float and double runs apply them exactly alike.
template <class T>
void gradient(worker_id w, std::int64_t k, std::vector<T>& g) {
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<T>(static_cast<int>((w * 31 + static_cast<std::size_t>(k) * 7 + i) % 13) - 6) * T(0.25);
}

template <class T>
std::vector<T> initial(std::size_t model) {
  std::vector<T> w(model);
  for (std::size_t i = 0; i < model; ++i) w[i] = static_cast<T>(i % 17) * T(0.5);
  return w;
}

// Slice `sl` of the initial weights `w0` with the pushes of `log` applied in log order by
// sgd{lr}: what that server's slice must equal, bit for bit.
template <class T>
std::vector<T> replay(const std::vector<T>& w0, ps_slice sl, const std::vector<ps_log_entry>& log, T lr) {
  std::vector<T> w(w0.begin() + static_cast<std::ptrdiff_t>(sl.offset),
                   w0.begin() + static_cast<std::ptrdiff_t>(sl.offset + sl.count));
  std::vector<T> g(w0.size());
  for (const ps_log_entry& e : log) {
    gradient(e.worker, e.iteration, g);
    sgd<T>{lr}(w.data(), g.data() + sl.offset, sl.count, e.worker);
  }
  return w;
}

// What the servers of a job with ranks as threads ended with, by server rank: the in-process
// tests keep it beside what their workers did.
struct server_results {
  std::vector<ps_stats> servers;
  std::vector<std::vector<float>> slices;
  std::string server_error;  // "server <rank>: <what>" for each server that threw, a line each
  std::string config;        // server 0's controller's config string
  /// Room for `n` servers' results, written by serve().
  void for_servers(int n) {
    servers.resize(static_cast<std::size_t>(n));
    slices.resize(static_cast<std::size_t>(n));
  }
};

// Server rank r's whole run over c, on its thread of such a job: a parameter server of w0.size()
// floats starting at w0, under `policy` for `workers` workers, applying sgd{lr}. What it ended
// with, or what it threw, goes to `out` under `m`.
template <class C>
void serve(C& c, int r, const std::vector<float>& w0, const std::string& policy, std::size_t workers, float lr,
           const ps_options& o, server_results& out, std::mutex& m) {
  try {
    parameter_server<C, any_controller> server(c, w0.size(), w0.data(), make_controller(policy, workers),
                                               sgd<float>{lr}, o);
    server.run();
    std::lock_guard<std::mutex> lock(m);
    out.servers[static_cast<std::size_t>(r)] = server.stats();
    out.slices[static_cast<std::size_t>(r)].assign(server.weights().begin(), server.weights().end());
    if (r == 0) out.config = server.controller().config();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(m);
    out.server_error += "server " + std::to_string(r) + ": " + e.what() + "\n";
  }
}

// A job with ranks as threads over `world` (world.join(r): rank r's communicator), ranks
// [0, o.servers) its servers: each serve()s `policy` for `workers` workers from `w0` with
// sgd{lr}, into `out` under `m`. Every other rank r runs work(comm, r) on a thread of its own.
// Returns once every rank has ended.
template <class World, class Work>
void run_job(World& world, int ranks, const std::string& policy, std::size_t workers, const std::vector<float>& w0,
             float lr, const ps_options& o, server_results& out, std::mutex& m, Work work) {
  out.for_servers(o.servers);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto comm = world.join(r);
      if (r < o.servers)
        serve(comm, r, w0, policy, workers, lr, o, out, m);
      else
        work(comm, r);
    });
  }
  for (auto& t : threads) t.join();
}

// Each of the `servers` slices in `r` equals its slice of the initial weights `w0` with its
// logged pushes applied in log order by sgd{lr}.
inline void check_replays(const server_results& r, const std::vector<float>& w0, int servers, float lr) {
  for (int s = 0; s < servers; ++s) {
    const auto i = static_cast<std::size_t>(s);
    CHECK_MESSAGE(replay(w0, ps_slice_of(w0.size(), servers, s), r.servers[i].log, lr) == r.slices[i],
                  "server " << s << ": replay differs");
  }
}

// What the servers saw, as events a rank can wait for: "evicted.<w>", "refused.<w>",
// "joined.<w>", "finished.<w>" (ps_options::observer).
inline std::string event_name(const ps_event& e) {
  const char* what = e.what == ps_event::kind::evicted  ? "evicted"
                     : e.what == ps_event::kind::refused ? "refused"
                     : e.what == ps_event::kind::joined  ? "joined"
                                                         : "finished";
  return std::string(what) + "." + std::to_string(e.worker);
}

// The options every rank of an in-process scenario runs with: `base` for `servers` servers, the
// log kept (the checks replay it) and each server event posted to `ev` under its event_name().
inline ps_options scenario_options(const ps_options& base, int servers, const cadence_test::events& ev) {
  ps_options o = base;
  o.servers = servers;
  o.keep_log = true;
  o.observer = [&ev](const ps_event& e) { ev.post(event_name(e)); };
  return o;
}

// A well-behaved worker's whole run over c: pull, `iterations` push_pulls of gradient(), finish().
// Returns the worker's iteration() before it finished.
template <class C>
std::int64_t train(C& c, std::size_t size, const ps_options& o, std::int64_t iterations) {
  ps_worker<C> worker(c, size, o);
  std::vector<float> weights(size), g(size);
  worker.pull(weights.data());
  for (std::int64_t k = 1; k <= iterations; ++k) {
    gradient(worker.id(), k, g);
    worker.push_pull(g.data(), weights.data());
  }
  const std::int64_t done = worker.iteration();
  worker.finish();
  return done;
}

constexpr std::size_t model = 4099;  // odd: slices of unequal length
constexpr double lr = 0.125;

struct policy_case {
  const char* config;
  clock_value bound;  // largest clock gap a worker may start an iteration with; -1: none
};

// One server (rank 0), c.size() - 1 workers; every policy: each worker's pushes applied exactly
// once, the policy's bound held at every release, the final weights equal to a replay of the log.
template <class H>
void every_policy() {
  for (const policy_case pc : {policy_case{"bsp", 0}, policy_case{"ssp:1", 1},
                               policy_case{"dssp:1:3", 3}, policy_case{"asp", -1},
                               policy_case{"elastic:3", -1}}) {
    H::run([&](auto& c) {
      using C = std::decay_t<decltype(c)>;
      CAPTURE(pc.config);
      const auto workers = static_cast<std::size_t>(c.size() - 1);
      const std::int64_t iterations = 10;
      ps_options o;
      o.keep_log = true;
      o.reply_timeout = 60s;
      o.transfer_timeout = 10s;
      o.evict_after = 20s;  // a worker that failed is evicted instead of awaited forever
      const std::vector<double> w0 = initial<double>(model);
      if (c.rank() == 0) {
        parameter_server<C, any_controller, double> server(c, model, w0.data(), make_controller(pc.config, workers),
                                                           sgd<double>{lr}, o);
        server.run();
        const ps_stats& st = server.stats();
        CHECK(st.pushes.size() == workers);
        CHECK(st.max_start_staleness.size() == workers);
        for (std::size_t w = 0; w < workers && w < st.pushes.size() && w < st.max_start_staleness.size(); ++w) {
          CAPTURE(w);
          CHECK(st.pushes[w] == iterations);
          if (pc.bound >= 0) CHECK(st.max_start_staleness[w] <= pc.bound);
        }
        CHECK(st.evictions.empty());
        CHECK(st.log.size() == workers * static_cast<std::size_t>(iterations));
        // One release per push_pull answered, each within the bound; the largest is the
        // per-worker maxima's largest.
        CHECK(st.start_staleness.size() == workers * static_cast<std::size_t>(iterations));
        if (!st.start_staleness.empty() && !st.max_start_staleness.empty()) {
          const clock_value top = *std::max_element(st.start_staleness.begin(), st.start_staleness.end());
          CHECK(top == *std::max_element(st.max_start_staleness.begin(), st.max_start_staleness.end()));
          if (pc.bound >= 0) CHECK(top <= pc.bound);
        }
        CHECK(replay(w0, ps_slice_of(model, 1, 0), st.log, lr) ==
              std::vector<double>(server.weights().begin(), server.weights().end()));
        return;
      }
      ps_worker<C, double> worker(c, model, o);
      std::vector<double> weights(model), g(model);
      worker.pull(weights.data());  // the current weights: another worker may have pushed already
      for (std::int64_t k = 1; k <= iterations; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1 + 2 * (c.rank() % 3)));
        gradient(worker.id(), k, g);
        worker.push_pull(g.data(), weights.data());
      }
      CHECK(worker.iteration() == iterations);
      worker.finish();
    });
  }
}

// BSP, evict_after 500 ms: the last worker falls silent before its 3rd push and stays silent
// until the others are past that barrier, which only its eviction lets them pass. Then it
// pushes: the running server refuses it (nothing applied). The others keep training (so none
// of them falls silent) until that refusal, then finish. Every step waits for the state it
// needs (support/events.hpp); 500 ms of silence is the only clock in it.
template <class H>
void stalled_worker() {
  H::run([](auto& c) {
    using C = std::decay_t<decltype(c)>;
    const int n = c.size();
    if (n < 3) return;  // needs a worker that keeps the server up
    const cadence_test::events& ev = cadence_test::current_events();
    const auto workers = static_cast<std::size_t>(n - 1);
    const int stalled_rank = n - 1;
    const auto stalled = static_cast<worker_id>(stalled_rank - 1);
    const std::int64_t most = 100000;  // iterations: only catches a refusal that never comes
    ps_options o;
    o.keep_log = true;
    o.evict_after = 500ms;
    o.reply_timeout = 30s;
    o.transfer_timeout = 10s;
    const std::vector<double> w0 = initial<double>(model);
    if (c.rank() == 0) {
      parameter_server<C, any_controller, double> server(c, model, w0.data(), make_controller("bsp", workers),
                                                         sgd<double>{lr}, o);
      const auto t0 = std::chrono::steady_clock::now();
      server.run();
      CHECK(std::chrono::steady_clock::now() - t0 < 60s);
      const ps_stats& st = server.stats();
      CHECK(st.evictions.size() == 1);
      if (st.evictions.size() == 1) {
        CHECK(st.evictions[0].worker == stalled);
        CHECK(st.evictions[0].pushes == 2);
        CHECK(st.evictions[0].silent_seconds >= 0.5);
      }
      CHECK(st.pushes.size() == workers);
      for (std::size_t w = 0; w < workers && w < st.pushes.size(); ++w) {
        CAPTURE(w);
        if (w == stalled) {
          CHECK(st.pushes[w] == 2);  // the late push refused, not applied
        } else {
          CHECK(st.pushes[w] >= 3);  // past the barrier the eviction opened
        }
        // Exactly once, in order: worker w's entries in the log are 1, 2, ..., pushes[w].
        std::int64_t next = 1;
        for (const ps_log_entry& e : st.log)
          if (e.worker == w) CHECK(e.iteration == next++);
        CHECK(next - 1 == st.pushes[w]);
      }
      CHECK(replay(w0, ps_slice_of(model, 1, 0), st.log, lr) ==
            std::vector<double>(server.weights().begin(), server.weights().end()));
      return;
    }
    ps_worker<C, double> worker(c, model, o);
    std::vector<double> weights(model), g(model);
    worker.pull(weights.data());
    std::int64_t k = 1;
    for (; k <= most; ++k) {
      if (c.rank() == stalled_rank && k == 3) {
        // Silent until every other worker has passed barrier 3 (60 s only catches a hang).
        for (int r = 1; r < stalled_rank; ++r) CHECK(ev.wait("past barrier 3." + std::to_string(r)));
        gradient(worker.id(), k, g);
        const std::string refusal = "worker " + std::to_string(stalled) + " was evicted";
        CHECK_THROWS_WITH_AS(worker.push_pull(g.data(), weights.data()), doctest::Contains(refusal.c_str()),
                             worker_error);
        ev.post("refused");
        return;
      }
      if (k > 3 && ev.posted("refused")) break;  // the server ran when it came back
      gradient(worker.id(), k, g);
      worker.push_pull(g.data(), weights.data());
      if (k == 3) ev.post_rank("past barrier 3", c.rank());
    }
    CHECK(k <= most);
    CHECK(worker.iteration() == k - 1);
    worker.finish();
  });
}

}  // namespace cadence_ps_suite

#define CADENCE_PS_TEST(name, id) TEST_CASE_TEMPLATE_DEFINE(name * doctest::timeout(120), H, id)

CADENCE_PS_TEST("parameter server: every policy, guarantee, exactly once, replay", ps_every_policy) {
  cadence_ps_suite::every_policy<H>();
}

CADENCE_PS_TEST("parameter server: a stalled worker is evicted at the liveness deadline, the others "
                "finish, and it is refused when it comes back",
                ps_stalled_worker) {
  cadence_ps_suite::stalled_worker<H>();
}

#define CADENCE_PS_SUITE(H)                          \
  TEST_CASE_TEMPLATE_INVOKE(ps_every_policy, H);     \
  TEST_CASE_TEMPLATE_INVOKE(ps_stalled_worker, H)
