// Fuzzes the parameter server's wire protocol (cadence/exchange/ps/detail/protocol.hpp: the
// ps_header and what each end makes of it, in server.hpp and worker.hpp) from both ends, over
// in-process ranks (threads):
//   - server end: real servers (1, or 2 so that server 1 follows server 0's notices) and one
//     rogue worker rank that sends headers and payloads the input makes (any kind, worker id,
//     iteration, count and request; payloads of any size, or none), then leaves;
//   - worker end: a real worker (pull, three push_pulls, finish) and a rogue server rank 0 that
//     answers each of its messages with a reply the input makes (any status and count, texts
//     and weights of any size, or none), then leaves.
// What must hold: no crash, no undefined behaviour, no allocation that a count from the wire
// sizes without bound; every end returns or throws a cadence::error (a refusal, a lost peer, a
// malformed message named), never another exception, and none hangs (libFuzzer's -timeout).
// Input: byte 0 picks the end (bit 0: worker end), the number of servers (bit 1: two) and the
// policy (bit 2: bsp, else asp); then steps of 8 bytes (server end) or 6 bytes (worker end).
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/inproc.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;

constexpr std::size_t model = 8;

[[noreturn]] void fail(const char* who, const char* what) {
  std::fprintf(stderr, "ps_protocol_fuzz: %s: %s\n", who, what);
  std::abort();
}

// Runs an end; a cadence::error is an answer it may give, anything else a bug.
template <class F>
void guarded(const char* who, F&& f) {
  try {
    f();
  } catch (const cadence::error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_protocol_fuzz: %s threw %s\n", who, e.what());
    fail(who, "an exception that is not a cadence::error");
  }
}

ps_options options(int servers) {
  ps_options o;
  o.servers = servers;
  o.initial_workers = 1;
  o.transfer_timeout = 2s;
  o.reply_timeout = 4s;
  o.server_idle_timeout = 4s;
  return o;
}

// A count of elements or bytes as the input picks it: the right one, small ones, negative
// ones and ones no buffer holds.
std::int64_t pick_count(std::uint8_t b, std::int64_t right) {
  switch (b % 8) {
    case 0: return right;
    case 1: return 0;
    case 2: return -1 - (b >> 3);
    case 3: return std::numeric_limits<std::int64_t>::max() - (b >> 3);
    case 4: return std::numeric_limits<std::int64_t>::min();
    case 5: return std::int64_t{1} << (20 + (b >> 3));
    default: return b >> 3;
  }
}

std::int64_t pick_small(std::uint8_t b) {
  switch (b % 4) {
    case 0: return b >> 2;
    case 1: return -static_cast<std::int64_t>(b >> 2);
    case 2: return std::numeric_limits<std::int64_t>::max();
    default: return std::numeric_limits<std::int64_t>::min() + (b >> 2);
  }
}

// ---- the server end: real servers, a rogue worker ----

void server_end(const std::uint8_t* d, std::size_t n, int servers, const char* policy) {
  const ps_options o = options(servers);
  const cadence::exchange::detail::ps_tags tags_of(o.tag_base);
  inproc_world world(servers + 1);
  const int rogue_rank = servers;
  std::vector<std::thread> threads;
  for (int s = 0; s < servers; ++s) {
    threads.emplace_back([&, s] {
      guarded("server", [&] {
        auto comm = world.join(s);
        const std::vector<float> w0(model, 1.0f);
        parameter_server<inproc_communicator, any_controller> server(comm, model, w0.data(),
                                                                     make_controller(policy, 1), sgd<float>{}, o);
        server.run();
      });
    });
  }
  guarded("rogue worker", [&] {
    auto rogue = world.join(rogue_rank);
    std::vector<float> payload(64, 0.5f);
    for (; n >= 8; d += 8, n -= 8) {
      cadence::exchange::detail::ps_header h;
      const int dst = d[0] % servers;
      const std::uint8_t k = static_cast<std::uint8_t>(d[0] >> 1);
      h.kind = k % 12 == 11 ? pick_small(d[1]) : 1 + k % 12;  // every kind, one unknown, any number
      h.worker = d[1] % 5 == 0 ? pick_small(d[1]) : static_cast<std::int64_t>(d[1] % 5) - 2;
      h.iteration = pick_small(d[2]);
      const auto slice = static_cast<std::int64_t>(ps_slice_of(model, servers, dst).count);
      h.count = pick_count(d[3], h.kind == 2 ? static_cast<std::int64_t>(model) : slice);
      h.status = pick_small(d[4]);
      h.request = pick_small(d[5]);
      const int tag = d[6] % 8 == 0 ? tags_of.reply : tags_of.control;  // now and then a tag it should not use
      rogue.send(&h, sizeof h, dst, tag, 1s);
      // A payload of any size, or none (d[7] == 0), on the data tag.
      if (d[7] != 0) {
        const std::size_t floats = (d[7] - 1u) % payload.size();
        rogue.send(payload.data(), floats * sizeof(float), dst, tags_of.data, 1s);
      }
    }
  });
  // The rogue's communicator is gone (it left): the servers drop its worker and end.
  for (auto& t : threads) t.join();
}

// ---- the worker end: a real worker, a rogue server 0 ----

void worker_end(const std::uint8_t* d, std::size_t n) {
  const ps_options o = options(1);
  const cadence::exchange::detail::ps_tags tags_of(o.tag_base);
  inproc_world world(2);
  std::thread worker([&] {
    guarded("worker", [&] {
      auto comm = world.join(1);
      ps_worker<inproc_communicator> w(comm, model, o);
      std::vector<float> weights(model), g(model, 0.25f);
      w.pull(weights.data());
      for (int k = 0; k < 3; ++k) w.push_pull(g.data(), weights.data());
      w.finish();
    });
  });
  guarded("rogue server", [&] {
    auto rogue = world.join(0);
    std::vector<char> bytes(256, 'x');
    std::int64_t request = 0;
    std::vector<float> gradient(model);
    for (; n >= 6; d += 6, n -= 6) {
      // Each answer follows the worker's next message (a conversation, not a race with its
      // start): its header, and a push's gradient. A worker that has ended sends nothing more.
      cadence::exchange::detail::ps_header got;
      if (!rogue.try_recv(&got, sizeof got, 1, tags_of.control, 2s)) break;
      if (got.kind == static_cast<std::int64_t>(cadence::exchange::detail::ps_kind::push))
        rogue.recv(gradient.data(), gradient.size() * sizeof(float), 1, tags_of.data, 2s);
      cadence::exchange::detail::ps_header h;
      h.kind = d[0] % 4 == 0 ? pick_small(d[0]) : static_cast<std::int64_t>(cadence::exchange::detail::ps_kind::reply);
      h.worker = d[1] % 4 == 0 ? pick_small(d[1]) : 0;
      h.iteration = pick_small(d[2]);
      h.status = d[3] % 4 == 3 ? pick_small(d[3]) : d[3] % 4;  // ok, evicted, error or any number
      h.count = pick_count(d[4], h.status == 0 ? static_cast<std::int64_t>(model) : 16);
      h.request = d[5] % 4 == 0 ? pick_small(d[5]) : ++request;  // usually the next one
      rogue.send(&h, sizeof h, 1, tags_of.reply, 1s);
      // Weights or a text of any size, or none.
      if ((d[5] & 4) == 0) {
        const std::size_t len = (static_cast<std::size_t>(d[4]) * 7) % bytes.size();
        rogue.send(bytes.data(), len, 1, tags_of.reply_data, 1s);
      }
    }
  });
  worker.join();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool worker = (data[0] & 1) != 0;
  const int servers = (data[0] & 2) != 0 ? 2 : 1;
  const char* policy = (data[0] & 4) != 0 ? "bsp" : "asp";
  if (worker)
    worker_end(data + 1, size - 1);
  else
    server_end(data + 1, size - 1, servers, policy);
  return 0;
}
