// cadence/exchange/ps/server.hpp: what a server measures and keeps (ps_stats: parked time per
// worker, the staleness histogram, the log only with keep_log), over in-process ranks; and the
// faults that must cost one worker at most: a worker that leaves right after its last reply
// (never evicted), one absent at the start (drop_absent), a drop while a server other than 0
// answers held releases, a worker that breaks the protocol (bad_peer_suite.hpp, also over
// ZeroMQ). The server's protocol under every policy and fault is tested with the workers', in
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
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;

namespace ps_server_test {

constexpr std::size_t test_model = 1000;

// The policies a test runs under, one after another.
const char* const every_policy[] = {"bsp", "ssp:1", "dssp:1:3", "asp", "elastic:3"};

// A server over `c` of test_model floats from the suite's initial weights, under `policy` for
// `workers` workers, with the shipped SGD (lr 0.125).
template <class C>
parameter_server<C, any_controller> make_server(C& c, const char* policy, std::size_t workers, const ps_options& o) {
  const auto w0 = cadence_ps_suite::initial<float>(test_model);  // the server keeps a copy of its slice
  return parameter_server<C, any_controller>(c, test_model, w0.data(), make_controller(policy, workers),
                                             sgd<float>{0.125f}, o);
}

// A ps_options::observer that posts "<name>.<worker>" to `ev` for each event of kind `kind`.
std::function<void(const ps_event&)> post_each(const cadence_test::events& ev, ps_event::kind kind, std::string name) {
  return [&ev, kind, name](const ps_event& e) {
    if (e.what == kind) ev.post(name + "." + std::to_string(e.worker));
  };
}

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
using ps_server_test::every_policy;
using ps_server_test::make_server;
using ps_server_test::post_each;
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

// ---- faults that must cost one worker at most ----

namespace ps_server_test {

// The server's communicator, as in-process ranks give it, except that the reply (header) to
// request `held_request` of rank `held_rank` looks unfinished to the server until that rank is
// gone, and then fails as a lost peer's transfer does. The worker gets its reply at once (the
// send is eager): this is the end of a policy where a worker took its last reply, called
// finish() and left before the server saw its reply complete (over ZeroMQ: before the engine
// noticed that ZeroMQ let go of a streamed reply's buffer).
class held_reply_comm {
public:
  held_reply_comm(inproc_communicator& c, int held_rank, int reply_tag, std::int64_t held_request)
      : c_(&c), held_rank_(held_rank), reply_tag_(reply_tag), held_request_(held_request) {}

  class work {
  public:
    work() = default;
    work(inproc_work inner, inproc_communicator* c, int peer, bool held)
        : inner_(std::move(inner)), c_(c), peer_(peer), held_(held) {}
    work(work&&) noexcept = default;
    work& operator=(work&&) noexcept = default;
    bool test() {
      if (held_) {
        // The worker leaves once it has its reply: 60 s only catches a hang.
        const auto until = std::chrono::steady_clock::now() + 60s;
        while (!c_->peer_lost(peer_) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
        held_ = false;
        failed_ = true;
      }
      if (failed_)
        throw transport_error("cadence::transport[inproc]: send on rank 0: lost rank " + std::to_string(peer_) +
                              " (it left: held by the test until then)");
      return inner_.test();
    }
    void wait(deadline d = {}) { inner_.wait(d); }
    int source() const noexcept { return inner_.source(); }
    bool cancel() noexcept { return inner_.cancel(); }

  private:
    inproc_work inner_;
    inproc_communicator* c_ = nullptr;
    int peer_ = -1;
    bool held_ = false, failed_ = false;
  };

  int rank() const noexcept { return c_->rank(); }
  int size() const noexcept { return c_->size(); }
  capability_flags capabilities() const noexcept { return c_->capabilities(); }
  void allreduce(void* b, std::size_t n, dtype t, reduce_op op, deadline d = {}) { c_->allreduce(b, n, t, op, d); }
  void broadcast(void* b, std::size_t n, int root, deadline d = {}) { c_->broadcast(b, n, root, d); }
  void send(const void* b, std::size_t n, int dst, int tag, deadline d = {}) { c_->send(b, n, dst, tag, d); }
  int recv(void* b, std::size_t n, int src, int tag, deadline d = {}) { return c_->recv(b, n, src, tag, d); }
  std::optional<int> try_recv(void* b, std::size_t n, int src, int tag, deadline d = {}) {
    return c_->try_recv(b, n, src, tag, d);
  }
  work iallreduce(void* b, std::size_t n, dtype t, reduce_op op) { return {c_->iallreduce(b, n, t, op), c_, -1, false}; }
  work ibroadcast(void* b, std::size_t n, int root) { return {c_->ibroadcast(b, n, root), c_, -1, false}; }
  work isend(const void* b, std::size_t n, int dst, int tag) {
    bool held = false;
    if (dst == held_rank_ && tag == reply_tag_ && n == sizeof(exchange::detail::ps_header)) {
      exchange::detail::ps_header h;
      std::memcpy(&h, b, sizeof h);
      held = h.request == held_request_;
    }
    return {c_->isend(b, n, dst, tag), c_, dst, held};
  }
  work irecv(void* b, std::size_t n, int src, int tag) { return {c_->irecv(b, n, src, tag), c_, src, false}; }
  void abort() noexcept { c_->abort(); }
  bool failed() const { return c_->failed(); }
  bool peer_lost(int p) const { return c_->peer_lost(p); }

private:
  inproc_communicator* c_;
  int held_rank_, reply_tag_;
  std::int64_t held_request_;
};

}  // namespace ps_server_test

TEST_CASE("a worker that takes its last reply, finishes and leaves before the server saw that reply complete "
          "is finished, never evicted (the end-of-policy race), under every policy" *
          doctest::timeout(120)) {
  constexpr int workers = 3;
  constexpr std::int64_t iterations = 5;
  constexpr int victim = 2;  // rank 2, worker 1
  for (const char* policy : every_policy) {
    CAPTURE(policy);
    inproc_world world(1 + workers);
    const cadence_test::events ev;
    ps_options o;
    o.evict_after = 60s;  // nobody is evicted for silence here
    o.reply_timeout = 200s;
    o.observer = post_each(ev, ps_event::kind::finished, "finished");
    ps_stats stats;
    std::string server_error;
    cadence_test::run_inproc_ranks(world, [&](inproc_communicator& comm) {
      if (comm.rank() == 0) {
        // The last push's reply: request 1 is the pull, request 1 + k the k-th push.
        ps_server_test::held_reply_comm held(comm, victim, o.tag_base + 2, 1 + iterations);
        auto server = make_server(held, policy, workers, o);
        server.run();
        stats = server.stats();
        return;
      }
      cadence_ps_suite::train(comm, test_model, o, iterations);
      // Each worker leaves now (its communicator is destroyed as the body returns), as a process
      // does after its policy: the server sees the victim lost while its reply looks unfinished.
    });
    CHECK(stats.evictions.empty());
    for (const auto& e : stats.evictions) INFO(e.worker << ": " << e.reason);
    for (int w = 0; w < workers; ++w) CHECK(ev.posted("finished." + std::to_string(w)));
    for (int w = 0; w < workers; ++w) CHECK(stats.pushes.at(w) == iterations);
  }
}

TEST_CASE("drop_absent: an initial member absent at the start is evicted before run(), nobody waits for it, "
          "and a process that comes later on its rank joins under a new id, under every policy" *
          doctest::timeout(120)) {
  constexpr int workers = 3;
  constexpr std::int64_t iterations = 4;
  constexpr int absent = 3;  // rank 3, worker 2
  for (const char* policy : every_policy) {
    CAPTURE(policy);
    inproc_world world(1 + workers);
    const cadence_test::events ev;
    ps_options o;  // no evict_after: a server that waited for the absent worker would wait forever
    o.observer = post_each(ev, ps_event::kind::joined, "joined");
    ps_stats stats;
    std::vector<std::int64_t> done(1 + workers, 0);
    worker_id late_id = 0;
    cadence_test::run_inproc_ranks(world, [&](inproc_communicator& comm) {
      if (comm.rank() == 0) {
        auto server = make_server(comm, policy, workers, o);
        CHECK_THROWS_AS(server.drop_absent(7, "no such worker"), invalid_parameter_error);
        server.drop_absent(absent - 1, "rank 3 never came");
        CHECK_THROWS_AS(server.drop_absent(absent - 1, "twice"), invalid_parameter_error);
        server.run();
        stats = server.stats();
        return;
      }
      // The absent rank comes once the others have started (a late process); they stay members
      // (so the server still runs) until it has joined. (They must not wait for it at their
      // last push: under elastic BSP one worker may be held at a barrier the other reaches
      // only with a push past the last.)
      if (comm.rank() == absent)
        for (int r = 1; r < absent; ++r) CHECK(ev.wait("started." + std::to_string(r)));
      ps_worker<inproc_communicator> worker(comm, test_model, o);
      std::vector<float> weights(test_model), g(test_model);
      worker.pull(weights.data());
      if (comm.rank() == absent) late_id = worker.id();
      ev.post("started." + std::to_string(comm.rank()));
      for (std::int64_t k = 1; k <= iterations; ++k) {
        cadence_ps_suite::gradient(worker.id(), k, g);
        worker.push_pull(g.data(), weights.data());
        ++done[static_cast<std::size_t>(comm.rank())];
      }
      if (comm.rank() != absent) CHECK(ev.wait("joined." + std::to_string(workers)));
      worker.finish();
    });
    REQUIRE(stats.evictions.size() == 1);
    CHECK(stats.evictions[0].worker == absent - 1);
    CHECK(stats.evictions[0].rank == absent);
    CHECK(stats.evictions[0].pushes == 0);
    CHECK(stats.evictions[0].reason == "absent at the start: rank 3 never came");
    CHECK(late_id == workers);  // a new id, after the initial members'
    REQUIRE(stats.joins.size() == 1);
    CHECK(stats.joins[0].rank == absent);
    CHECK(stats.joins[0].returning);
    for (int r = 1; r <= workers; ++r) CHECK(done[static_cast<std::size_t>(r)] == iterations);
  }
}

TEST_CASE("drop_absent is server 0's, and only before run()" * doctest::timeout(60)) {
  inproc_world world(3);
  ps_options o;
  o.servers = 2;
  std::thread second([&] {
    auto c = world.join(1);
    auto s = make_server(c, "asp", 1, o);
    CHECK_THROWS_WITH_AS(s.drop_absent(0, "x"), doctest::Contains("only server 0"), invalid_parameter_error);
  });
  second.join();
}

TEST_CASE("a server other than 0 that drops a worker while it answers held releases still answers the others "
          "(the drop edits the held list mid-walk)" *
          doctest::timeout(120)) {
  // BSP, servers 0 and 1; worker B (rank 2) is an ordinary worker, worker A (rank 3) speaks the
  // protocol by hand. Every send is a rendezvous (eager_limit 0): a reply stays in flight until
  // its receiver takes it. A lets one refusal from server 1 sit untaken, so server 1 holds
  // max_outstanding (1) transfers to it. B pushes first; A's push completes the round at
  // server 0, which tells server 1 to release A, then B (both held there until A's push is
  // applied). A pushes to server 1 only once both notices are in; server 1 then answers A
  // first, finds its transfers piled up, drops it, and must still answer B.
  inproc_options io;
  io.eager_limit = 0;
  inproc_world world(4, io);
  const cadence_test::events ev;
  ps_options o;
  o.servers = 2;
  o.max_outstanding = 1;
  o.transfer_timeout = 60s;
  o.reply_timeout = 120s;
  const exchange::detail::ps_tags tags(o.tag_base);
  constexpr int b_rank = 2, a_rank = 3;
  constexpr worker_id a = 1;
  // Server 0's second reply to B (the first answers its pull) goes after both notices.
  world.on_step(0, {"send", b_rank, tags.reply, 1}, [&](inproc_world&) { ev.post("released B"); });
  // B's third wait for a reply is its push's (two pulls before it).
  world.on_step(b_rank, {"try_recv", std::nullopt, tags.reply, 2}, [&](inproc_world&) { ev.post("B pushed"); });
  std::vector<ps_stats> stats(2);
  std::string errors;
  std::mutex m;
  std::vector<std::thread> threads;
  for (int s : {0, 1}) {
    threads.emplace_back([&, s] {
      auto c = world.join(s);
      try {
        auto server = make_server(c, "bsp", 2, o);
        server.run();
        std::lock_guard<std::mutex> lock(m);
        stats[static_cast<std::size_t>(s)] = server.stats();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        errors += "server " + std::to_string(s) + ": " + e.what() + "\n";
      }
    });
  }
  threads.emplace_back([&] {
    auto c = world.join(b_rank);
    try {
      ps_worker<inproc_communicator> worker(c, test_model, o);
      std::vector<float> weights(test_model), g(test_model, 0.25f);
      worker.pull(weights.data());
      worker.push_pull(g.data(), weights.data());  // answered by both servers, A dropped or not
      worker.finish();
      ev.post("B finished");
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(m);
      errors += "worker B: " + std::string(e.what()) + "\n";
    }
  });
  try {
    auto c = world.join(a_rank);
    const auto d = transport::deadline(60s);
    std::int64_t request = 0;
    auto send_header = [&](int server, exchange::detail::ps_header h) { c.send(&h, sizeof h, server, tags.control, d); };
    auto take_answer = [&](int server) {
      exchange::detail::ps_header h;
      c.recv(&h, sizeof h, server, tags.reply, d);
      std::vector<char> payload(static_cast<std::size_t>(h.count) * (h.status == 0 ? sizeof(float) : 1));
      c.recv(payload.data(), payload.size(), server, tags.reply_data, d);
      return h;
    };
    ++request;  // the pull, from server 0 only
    send_header(0, exchange::detail::make_header(exchange::detail::ps_kind::pull, a, 0,
                                                 static_cast<std::int64_t>(test_model), request));
    CHECK(take_answer(0).status == 0);
    // A message server 1 refuses, whose refusal A leaves in flight for now (A never pulls from
    // server 1, so that refusal is the only transfer server 1 has for it).
    send_header(1, exchange::detail::make_header(static_cast<exchange::detail::ps_kind>(99), a, 0, 0, request));
    CHECK(ev.wait("B pushed"));
    ++request;
    const std::vector<float> g(test_model, 0.5f);
    const auto push0 = exchange::detail::make_header(exchange::detail::ps_kind::push, a, 1,
                                                     static_cast<std::int64_t>(ps_slice_of(test_model, 2, 0).count), request);
    send_header(0, push0);
    c.send(g.data(), ps_slice_of(test_model, 2, 0).count * sizeof(float), 0, tags.data, d);
    CHECK(ev.wait("released B"));
    const auto push1 = exchange::detail::make_header(exchange::detail::ps_kind::push, a, 1,
                                                     static_cast<std::int64_t>(ps_slice_of(test_model, 2, 1).count), request);
    send_header(1, push1);
    c.send(g.data() + ps_slice_of(test_model, 2, 1).offset, ps_slice_of(test_model, 2, 1).count * sizeof(float), 1,
           tags.data, d);
    CHECK(ev.wait("B finished"));
    CHECK(take_answer(0).status == 0);  // server 0's release of A
    CHECK(take_answer(1).status != 0);  // the refusal left waiting
    // Server 1 first: it ends once server 0 does, and server 0 ends at A's finish (every send
    // here waits for its receiver).
    send_header(1, exchange::detail::make_header(exchange::detail::ps_kind::finish, a, 1, 0, request));
    send_header(0, exchange::detail::make_header(exchange::detail::ps_kind::finish, a, 1, 0, request));
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(m);
    errors += "worker A: " + std::string(e.what()) + "\n";
    world.kill(a_rank);  // the others see it gone instead of waiting for it
  }
  for (auto& t : threads) t.join();
  INFO(errors);
  CHECK(errors.empty());
  REQUIRE(stats[1].evictions.size() == 1);
  CHECK(stats[1].evictions[0].worker == a);
  CHECK(stats[1].evictions[0].reason.find("max_outstanding") != std::string::npos);
  CHECK(stats[0].evictions.empty());
  CHECK(stats[1].pushes.at(0) == 1);
}

#include "exchange/ps/bad_peer_suite.hpp"

using inproc_4 = cadence_test::inproc_harness<4>;
CADENCE_PS_BAD_PEER_SUITE(inproc_4);
