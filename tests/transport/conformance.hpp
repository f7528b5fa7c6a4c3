// The communicator conformance suite: the contract of cadence/transport/communicator.hpp as
// test bodies written once and instantiated per backend with CADENCE_TRANSPORT_CONFORMANCE(H).
//
// A harness H provides
//   template <class Body> static void run(Body body);
// which calls body(comm) once per rank, ranks in parallel, each with a fresh communicator of
// the same world (size at least 2), and turns an exception escaping a rank into a test failure
// naming the rank. In one process (inproc) run() starts the threads; under mpirun each process
// is one rank and run() wraps a fresh duplicate of MPI_COMM_WORLD. It also makes fresh
// cadence_test::current_events() (support/events.hpp) for the run, through which a rank that
// must outlive a peer's deadline waits for that peer to say so, instead of sleeping.
//
// Every rank issues the same sequence of collectives whatever its checks find (CHECK, never
// REQUIRE, inside bodies), so a failed check on one rank cannot leave the others waiting; and
// every wait has a deadline, so a bug in a backend fails a test instead of hanging it.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/communicator.hpp>

#include "support/events.hpp"
#include "support/rank_tests.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace cadence_conformance {

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

inline double seconds_since(steady::time_point t0) {
  return std::chrono::duration<double>(steady::now() - t0).count();
}

// Element i of rank r's contribution: integer-valued, so every sum is exact in every dtype
// (u8 sums stay below 256 for up to 8 ranks; i64 values need all 64 bits).
template <class T>
T value(int r, std::size_t i) {
  const auto k = static_cast<std::int64_t>((i * 7 + static_cast<std::size_t>(r) * 13) % 31);
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    return static_cast<T>(k);
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return (k - 15) * (std::int64_t{1} << 40) + r;
  } else {
    return static_cast<T>(k - 15);
  }
}

// Runs f, which must throw E with every needle in its message; returns the message.
template <class E, class F>
std::string expect_throw(int rank, F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& needle : needles)
      CHECK_MESSAGE(msg.find(needle) != std::string::npos,
                    "rank " << rank << ": \"" << msg << "\" does not contain \"" << needle << "\"");
    return msg;
  } catch (const std::exception& e) {
    CHECK_MESSAGE(false, "rank " << rank << ": wrong exception type: " << e.what());
    return {};
  }
  CHECK_MESSAGE(false, "rank " << rank << ": expected an exception, none was thrown");
  return {};
}

template <class T, class C>
void check_allreduce(C& c, std::size_t count, reduce_op op, deadline d = 60s) {
  const int n = c.size();
  std::vector<T> buf(count);
  for (std::size_t i = 0; i < count; ++i) buf[i] = value<T>(c.rank(), i);
  c.allreduce(buf.data(), count, dtype_of_v<T>, op, d);
  std::size_t wrong = 0, first_wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    T expected = value<T>(0, i);
    for (int r = 1; r < n; ++r) {
      const T v = value<T>(r, i);
      expected = op == reduce_op::sum   ? static_cast<T>(expected + v)
                 : op == reduce_op::min ? std::min(expected, v)
                                        : std::max(expected, v);
    }
    if (buf[i] != expected && wrong++ == 0) first_wrong = i;
  }
  CHECK_MESSAGE(wrong == 0, "rank " << c.rank() << ": allreduce " << dtype_name(dtype_of_v<T>)
                                    << " " << reduce_op_name(op) << " of " << count
                                    << " elements: " << wrong << " wrong, first at " << first_wrong);
}

/// A watchdog: calls c.abort() (the one call allowed from any thread) from a thread of its own
/// once `after` has passed, as a user's watchdog would on a hung call; joined at scope exit.
class abort_after {
public:
  template <class C>
  abort_after(C& c, std::chrono::milliseconds after)
      : thread_([&c, after] {
          std::this_thread::sleep_for(after);
          c.abort();
        }) {}
  ~abort_after() { thread_.join(); }
  abort_after(const abort_after&) = delete;
  abort_after& operator=(const abort_after&) = delete;

private:
  std::thread thread_;
};

/// What a rank that gave up on a stalled peer saw: the error's message and the seconds it waited.
struct gave_up {
  std::string error;
  double waited = 0;
};

/// The stalled-rank fault: every rank but the last runs `call`, which must throw transport_error
/// with every needle within 10 s (a deadline of a second or so), failing the communicator; the
/// last rank stays away, alive and silent, until all of them have (a departed rank would be
/// reported as lost instead; 60 s only catches a hang). What the rank saw, or nothing on the last.
template <class C, class F>
std::optional<gave_up> expect_deadline_without_last(C& c, F&& call, std::initializer_list<std::string> needles) {
  const int stalled = c.size() - 1;
  const cadence_test::events& ev = cadence_test::current_events();
  if (c.rank() == stalled) {
    CHECK(ev.wait_ranks("threw", c.size(), stalled));
    return std::nullopt;
  }
  const auto t0 = steady::now();
  gave_up g;
  g.error = expect_throw<transport_error>(c.rank(), call, needles);
  g.waited = seconds_since(t0);
  ev.post_rank("threw", c.rank());
  CHECK_MESSAGE(g.waited < 10.0, "rank " << c.rank() << " overran its deadline: " << g.waited << " s");
  CHECK(c.failed());
  return g;
}

/// The deadline fault: rank 0 runs `call`, which must wait out a 300 ms deadline and throw
/// transport_error with every needle (naming the call and the rank it waited for), failing the
/// communicator; the other ranks stay alive, silent, until it has (a departed peer would be
/// reported as lost instead).
template <class C, class F>
void expect_deadline_on_rank0(C& c, F&& call, std::initializer_list<std::string> needles) {
  const cadence_test::events& ev = cadence_test::current_events();
  if (c.rank() != 0) {
    CHECK(ev.wait("rank 0 timed out"));
    return;
  }
  const auto t0 = steady::now();
  expect_throw<transport_error>(0, call, needles);
  ev.post("rank 0 timed out");
  CHECK(seconds_since(t0) >= 0.299);
  CHECK(c.failed());
}

/// A broadcast against an all-reduce: rank 0 broadcasts 4 MiB while the others all-reduce as
/// many floats. Only rank 0's call may succeed (its send may complete before anyone compares);
/// a rank whose call fails names `expected` in its transport_error.
template <class C>
void broadcast_against_allreduce(C& c, const std::string& expected) {
  std::vector<float> buf(std::size_t{1} << 20, 1.0f);
  try {
    if (c.rank() == 0)
      c.broadcast(buf.data(), buf.size() * sizeof(float), 0, 30s);
    else
      c.allreduce(buf.data(), buf.size(), dtype::f32, reduce_op::sum, 30s);
    CHECK_MESSAGE(c.rank() == 0, "rank " << c.rank() << ": a mismatched collective succeeded");
  } catch (const transport_error& e) {
    CHECK_MESSAGE(std::string(e.what()).find(expected) != std::string::npos, e.what());
  }
}

/// H::run(body) for a communicator with asynchronous operations (has_async_v); for one without,
/// every rank runs nothing.
template <class H, class Body>
void run_if_async(Body body) {
  H::run([&](auto& c) {
    if constexpr (has_async_v<std::decay_t<decltype(c)>>) body(c);
  });
}

/// What a backend's own test file uses beside the suite, in one
/// `using namespace cadence_conformance::test_names;`.
namespace test_names {
using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using cadence_conformance::expect_throw;
using cadence_conformance::abort_after;
using cadence_conformance::seconds_since;
using steady = std::chrono::steady_clock;
}  // namespace test_names

}  // namespace cadence_conformance

#define CADENCE_CONFORMANCE_TEST(name, id) \
  TEST_CASE_TEMPLATE_DEFINE(name * doctest::timeout(120), H, id)

// A conformance test whose body, written after the macro, runs on every rank as a function of
// `c`, the rank's communicator (C its type); ASYNC: only on communicators with asynchronous
// operations (run_if_async).
#define CADENCE_CONFORMANCE_RANK_TEST(name, id) \
  CADENCE_RANK_TEST(CADENCE_CONFORMANCE_TEST, name, id, cadence_conformance, H::run)
#define CADENCE_CONFORMANCE_ASYNC_RANK_TEST(name, id) \
  CADENCE_RANK_TEST(CADENCE_CONFORMANCE_TEST, name, id, cadence_conformance, cadence_conformance::run_if_async<H>)

CADENCE_CONFORMANCE_RANK_TEST("allreduce sums, mins and maxes every dtype exactly on every rank",
                              conformance_allreduce_dtypes) {
  for (reduce_op op : {reduce_op::sum, reduce_op::min, reduce_op::max}) {
    check_allreduce<float>(c, 1000, op);
    check_allreduce<double>(c, 1000, op);
    check_allreduce<std::int32_t>(c, 1000, op);
    check_allreduce<std::int64_t>(c, 1000, op);
    check_allreduce<std::uint8_t>(c, 1000, op);
  }
}

CADENCE_CONFORMANCE_RANK_TEST("allreduce is exact for every size from 0 bytes to 64 MiB",
                              conformance_allreduce_sizes) {
  check_allreduce<std::uint8_t>(c, 0, reduce_op::sum);
  check_allreduce<std::uint8_t>(c, 1, reduce_op::sum);
  for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{1023},
                            std::size_t{65537}, std::size_t{262147}})
    check_allreduce<float>(c, count, reduce_op::sum);
  check_allreduce<float>(c, std::size_t{16} << 20, reduce_op::sum);  // 64 MiB, once
}

CADENCE_CONFORMANCE_RANK_TEST("broadcast delivers the root's bytes to every rank, from every root",
                              conformance_broadcast) {
  for (int root = 0; root < c.size(); ++root) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{1000},
                              (std::size_t{1} << 20) + 3}) {
      auto pattern = [root](std::size_t i) {
        return static_cast<unsigned char>((i * 31 + static_cast<std::size_t>(root)) & 0xFF);
      };
      std::vector<unsigned char> buf(bytes, 0xEE);
      if (c.rank() == root)
        for (std::size_t i = 0; i < bytes; ++i) buf[i] = pattern(i);
      c.broadcast(buf.data(), bytes, root, 60s);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < bytes; ++i) wrong += buf[i] != pattern(i);
      CHECK_MESSAGE(wrong == 0, "rank " << c.rank() << ": broadcast of " << bytes
                                        << " bytes from root " << root << ": " << wrong
                                        << " bytes wrong");
    }
  }
}

CADENCE_CONFORMANCE_RANK_TEST("send and recv match by source and tag, in order per source and tag",
                              conformance_point_to_point) {
  const int n = c.size(), r = c.rank();
  const int dst = (r + 1) % n, src = (r + n - 1) % n;
  // Three messages on tag 1, then one on tag 2 and an empty one on tag 3; the receiver asks
  // for tag 2 first, so matching is by tag, not arrival.
  for (std::int64_t k = 0; k < 3; ++k) {
    const std::int64_t msg[2] = {r, k};
    c.send(msg, sizeof msg, dst, 1, 30s);
  }
  const std::int64_t last[2] = {r, 99};
  c.send(last, sizeof last, dst, 2, 30s);
  c.send(nullptr, 0, dst, 3, 30s);

  std::int64_t got[2] = {-1, -1};
  CHECK(c.recv(got, sizeof got, src, 2, 30s) == src);
  CHECK((got[0] == src && got[1] == 99));
  for (std::int64_t k = 0; k < 3; ++k) {
    CHECK(c.recv(got, sizeof got, src, 1, 30s) == src);
    CHECK_MESSAGE((got[0] == src && got[1] == k),
                  "rank " << r << ": message " << k << " from rank " << src << " arrived as {"
                          << got[0] << ", " << got[1] << "}");
  }
  CHECK(c.recv(nullptr, 0, src, 3, 30s) == src);

  // 4 MiB messages around the ring: above any eager limit, so each send completes only when
  // its receive is posted. Even ranks send first and odd ranks receive first, so the ring
  // cannot deadlock on an even number of ranks.
  if (n % 2 == 0) {
    std::vector<std::int32_t> out(std::size_t{1} << 20), in(out.size(), -1);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::int32_t>(i) * n + r;
    const std::size_t bytes = out.size() * sizeof(std::int32_t);
    if (r % 2 == 0) {
      c.send(out.data(), bytes, dst, 4, 30s);
      c.recv(in.data(), bytes, src, 4, 30s);
    } else {
      c.recv(in.data(), bytes, src, 4, 30s);
      c.send(out.data(), bytes, dst, 4, 30s);
    }
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < in.size(); ++i) wrong += in[i] != static_cast<std::int32_t>(i) * n + src;
    CHECK_MESSAGE(wrong == 0, "rank " << r << ": 4 MiB message from rank " << src << ": "
                                      << wrong << " elements wrong");
  }
}

CADENCE_CONFORMANCE_RANK_TEST("recv from any_source returns each sender's rank",
                              conformance_any_source) {
  if (!c.capabilities().any_source) return;  // the capability flag says so; nothing to test
  if (c.rank() == 0) {
    std::vector<int> seen;
    for (int k = 1; k < c.size(); ++k) {
      std::int32_t who = -1;
      const int src = c.recv(&who, sizeof who, any_source, 5, 30s);
      CHECK(src == who);
      seen.push_back(src);
    }
    std::sort(seen.begin(), seen.end());
    for (int k = 1; k < c.size(); ++k) CHECK(seen[static_cast<std::size_t>(k - 1)] == k);
  } else {
    const std::int32_t me = c.rank();
    c.send(&me, sizeof me, 0, 5, 30s);
  }
}

CADENCE_CONFORMANCE_RANK_TEST("barrier, allgather and allreduce_avg work over the backend",
                              conformance_helpers) {
  const int n = c.size(), r = c.rank();
  barrier(c, 30s);

  const unsigned char mine[3] = {static_cast<unsigned char>(r), static_cast<unsigned char>(200 + r),
                                 static_cast<unsigned char>(r * 2)};
  std::vector<unsigned char> all(static_cast<std::size_t>(n) * 3, 0xEE);
  allgather(c, mine, all.data(), 3, 30s);
  for (int p = 0; p < n; ++p) {
    const auto* block = &all[static_cast<std::size_t>(p) * 3];
    CHECK_MESSAGE((block[0] == p && block[1] == 200 + p && block[2] == 2 * p),
                  "rank " << r << ": allgather block of rank " << p << " is wrong");
  }

  // Rank r contributes n * (i + r): the average n * i + n(n-1)/2 is exact.
  std::vector<float> grad(100);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(n * (static_cast<int>(i) + r));
  allreduce_avg(c, grad.data(), grad.size(), dtype::f32, 30s);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < grad.size(); ++i)
    wrong += grad[i] != static_cast<float>(n * static_cast<int>(i) + n * (n - 1) / 2);
  CHECK_MESSAGE(wrong == 0, "rank " << r << ": allreduce_avg: " << wrong << " wrong");
}

CADENCE_CONFORMANCE_RANK_TEST("a stalled rank makes the others throw transport_error naming it "
                              "within the deadline; later calls rethrow that error at once",
                              conformance_stalled_rank) {
  float x = 1;
  const std::optional<gave_up> g = expect_deadline_without_last(
      c, [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 1s); },
      {"allreduce #1 on rank " + std::to_string(c.rank()), "rank " + std::to_string(c.size() - 1)});
  if (!g) return;  // the stalled rank
  const std::string& original = g->error;
  CHECK_MESSAGE(g->waited >= 0.99, "rank " << c.rank() << " gave up early, after " << g->waited << " s");

  // The first failure sticks: every later call throws it again, without waiting.
  const auto t1 = steady::now();
  const std::string again = expect_throw<transport_error>(
      c.rank(), [&] { c.broadcast(&x, sizeof x, 0, 30s); }, {});
  CHECK(again == original);
  const std::string again_p2p = expect_throw<transport_error>(
      c.rank(), [&] { c.send(&x, sizeof x, 0, 0, 30s); }, {});
  CHECK(again_p2p == original);
  CHECK_MESSAGE(seconds_since(t1) < 5.0, "rank " << c.rank() << ": a failed communicator waited");
}

CADENCE_CONFORMANCE_RANK_TEST("a recv that nobody answers throws after its deadline, naming the "
                              "awaited rank", conformance_recv_deadline) {
  char b[8];
  expect_deadline_on_rank0(c, [&] { c.recv(b, sizeof b, 1, 7, 300ms); },
                           {"recv #1 on rank 0", "deadline passed", "rank 1"});
}

CADENCE_CONFORMANCE_RANK_TEST("try_recv, where offered, reports nothing yet at its deadline and "
                              "leaves the communicator usable", conformance_try_recv) {
  if constexpr (has_try_recv_v<C>) {
    const int r = c.rank();
    if (r == 0) {
      int got = 0;
      const auto t0 = steady::now();
      CHECK_FALSE(c.try_recv(&got, sizeof got, 1, 9, 100ms).has_value());
      CHECK(seconds_since(t0) >= 0.099);
      CHECK_FALSE(c.failed());
      // A deadline already passed polls once instead of being a caller error.
      CHECK_FALSE(c.try_recv(&got, sizeof got, any_source, 9,
                             deadline::at(steady::now() - 1s)).has_value());
    }
    barrier(c, 30s);  // rank 1 sends only after rank 0's polls timed out
    if (r == 1) {
      const int v = 41;
      c.send(&v, sizeof v, 0, 9, 30s);
    }
    if (r == 0) {
      int got = 0;
      const std::optional<int> from = c.try_recv(&got, sizeof got, any_source, 9, 30s);
      CHECK(from == std::optional<int>(1));
      CHECK(got == 41);
    }
    barrier(c, 30s);
  }
}

CADENCE_CONFORMANCE_RANK_TEST("a large send that nobody receives throws after its deadline, naming "
                              "the receiver", conformance_send_deadline) {
  // 4 MiB: above every backend's eager limit, so the send needs the receiver.
  std::vector<unsigned char> big(c.rank() == 0 ? std::size_t{4} << 20 : 0, 1);
  expect_deadline_on_rank0(c, [&] { c.send(big.data(), big.size(), 1, 8, 300ms); },
                           {"send #1 on rank 0", "deadline passed", "rank 1"});
}

CADENCE_CONFORMANCE_RANK_TEST("bad arguments throw invalid_parameter_error naming the rank and the "
                              "call, and leave the communicator usable", conformance_bad_arguments) {
  const int n = c.size(), r = c.rank();
  const std::string me = " on rank " + std::to_string(r);
  float x[4] = {};
  auto bad = [&](auto&& f, std::initializer_list<std::string> needles) {
    expect_throw<invalid_parameter_error>(r, f, needles);
  };
  bad([&] { c.allreduce(nullptr, 4, dtype::f32, reduce_op::sum, 30s); },
      {"allreduce #1" + me, "null buffer"});
  bad([&] { c.broadcast(x, sizeof x, n, 30s); }, {"broadcast #2" + me, "root rank " + std::to_string(n)});
  bad([&] { c.broadcast(nullptr, 4, 0, 30s); }, {"broadcast #3" + me, "null buffer"});
  bad([&] { c.send(x, sizeof x, n, 0, 30s); }, {"send #4" + me, "destination rank"});
  bad([&] { c.send(x, sizeof x, any_source, 0, 30s); }, {"send #5" + me, "destination rank -1"});
  bad([&] { c.recv(x, sizeof x, -7, 0, 30s); }, {"recv #6" + me, "source rank -7"});
  bad([&] { c.send(x, sizeof x, 0, -1, 30s); }, {"send #7" + me, "tag -1"});
  bad([&] { c.recv(nullptr, 8, 0, 0, 30s); }, {"recv #8" + me, "null buffer"});
  bad([&] { c.allreduce(x, 1, dtype::f32, reduce_op::sum, deadline::at(steady::now() - 1s)); },
      {"allreduce #9" + me, "deadline had already passed"});
  CHECK_FALSE(c.failed());
  std::int64_t sum = r;
  c.allreduce(&sum, 1, dtype::i64, reduce_op::sum, 30s);
  CHECK(sum == std::int64_t{n} * (n - 1) / 2);
}

CADENCE_CONFORMANCE_TEST("collective arguments that differ across ranks fail with "
                         "transport_error on every rank", conformance_mismatch) {
  using namespace cadence_conformance;
  SUBCASE("count") {
    H::run([](auto& c) {
      std::vector<float> buf(8, 1.0f);
      const std::size_t count = c.rank() == 0 ? 8 : 4;
      expect_throw<transport_error>(
          c.rank(), [&] { c.allreduce(buf.data(), count, dtype::f32, reduce_op::sum, 30s); },
          {"allreduce #1 on rank " + std::to_string(c.rank()), "differ", "count 8", "count 4"});
      CHECK(c.failed());
    });
  }
  SUBCASE("dtype") {
    H::run([](auto& c) {
      std::int32_t buf[4] = {1, 2, 3, 4};
      const dtype t = c.rank() == 0 ? dtype::i32 : dtype::f32;
      expect_throw<transport_error>(
          c.rank(), [&] { c.allreduce(buf, 4, t, reduce_op::sum, 30s); },
          {"allreduce #1 on rank " + std::to_string(c.rank()), "differ", "i32", "f32"});
    });
  }
  SUBCASE("broadcast size") {
    // A root does not wait for the others (as in MPI), so only the ranks that receive are sure
    // to see the difference; the root may or may not, depending on who arrived first.
    H::run([](auto& c) {
      char buf[16] = {};
      const std::size_t bytes = c.rank() == 0 ? 16 : 8;
      if (c.rank() == 0) {
        try {
          c.broadcast(buf, bytes, 0, 30s);
        } catch (const transport_error&) {
        }
        return;
      }
      expect_throw<transport_error>(
          c.rank(), [&] { c.broadcast(buf, bytes, 0, 30s); },
          {"broadcast #1 on rank " + std::to_string(c.rank())});
      CHECK(c.failed());
    });
  }
}

CADENCE_CONFORMANCE_RANK_TEST("a message of another size than the receive fails the recv, naming "
                              "the sender", conformance_message_size) {
  if (c.rank() == 0) {
    const char small[8] = {};
    c.send(small, sizeof small, 1, 3, 30s);
  } else if (c.rank() == 1) {
    char big[16] = {};
    expect_throw<transport_error>(1, [&] { c.recv(big, sizeof big, 0, 3, 30s); },
                                  {"recv #1 on rank 1", "rank 0", "8 bytes", "16 bytes"});
    // Where a lost peer fails alone, so does a peer's message of the wrong size: a
    // peer_error naming the sender, and the communicator goes on (a parameter server outlives
    // one broken worker). Elsewhere the communicator fails (contract b).
    const bool isolates = c.capabilities().isolates_lost_peer;
    CHECK(c.failed() == !isolates);
    if (isolates) {
      try {
        c.recv(big, sizeof big, 0, 3, 30s);  // the same mismatch again: still alone
        CHECK_MESSAGE(false, "a second mismatching receive did not throw");
      } catch (const peer_error& e) {
        CHECK(e.peer() == 0);
      }
      std::int32_t v = 0;
      c.recv(&v, sizeof v, 0, 4, 30s);
      CHECK(v == 42);
      barrier(c, 30s);
    }
  }
  if (c.rank() == 0 && c.capabilities().isolates_lost_peer) {
    const char small[8] = {};
    c.send(small, sizeof small, 1, 3, 30s);
    const std::int32_t v = 42;
    c.send(&v, sizeof v, 1, 4, 30s);
    barrier(c, 30s);
  } else if (c.rank() >= 2 && c.capabilities().isolates_lost_peer) {
    barrier(c, 30s);
  }
}

CADENCE_CONFORMANCE_RANK_TEST("abort is idempotent and every later call throws transport_error "
                              "naming itself", conformance_abort) {
  const std::string me = " on rank " + std::to_string(c.rank());
  CHECK_FALSE(c.failed());
  c.abort();
  c.abort();
  CHECK(c.failed());
  float x = 0;
  const auto t0 = steady::now();
  expect_throw<transport_error>(c.rank(), [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 30s); },
                                {"allreduce #1" + me, "abort"});
  expect_throw<transport_error>(c.rank(), [&] { c.recv(&x, sizeof x, 0, 0, 30s); },
                                {"recv #2" + me, "abort"});
  CHECK(seconds_since(t0) < 5.0);
}

CADENCE_CONFORMANCE_RANK_TEST("allreduce_average, where offered, is the sum divided by the size, for "
                              "every size and both float dtypes; integers are refused",
                              conformance_average) {
  if constexpr (has_allreduce_average_v<C>) {
    const int n = c.size(), r = c.rank();
    auto check = [&](auto tag, std::size_t count) {
      using T = decltype(tag);
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = value<T>(r, i);
      c.allreduce_average(buf.data(), count, dtype_of_v<T>, 60s);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        T sum = 0;
        for (int q = 0; q < n; ++q) sum += value<T>(q, i);  // integers: exact
        T expected = 0;
        cadence::transport::detail::divide_typed(&expected, &sum, 1, static_cast<double>(n));
        wrong += buf[i] != expected;
      }
      CHECK_MESSAGE(wrong == 0, "rank " << r << ": allreduce_average " << dtype_name(dtype_of_v<T>)
                                        << " of " << count << " elements: " << wrong << " wrong");
    };
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1023},
                              std::size_t{65537}, std::size_t{262147}}) {
      check(float{}, count);
      check(double{}, count);
    }
    std::int32_t i32[4] = {};
    expect_throw<invalid_parameter_error>(r, [&] { c.allreduce_average(i32, 4, dtype::i32, 30s); },
                                          {"allreduce_average", "rank " + std::to_string(r), "i32"});
    CHECK_FALSE(c.failed());
    if constexpr (has_async_average_v<C>) {
      std::vector<double> a(5000), b(300000);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = n * value<double>(r, i);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = n * value<double>(r, i + 1);
      auto wa = c.iallreduce_average(a.data(), a.size(), dtype::f64);
      auto wb = c.iallreduce_average(b.data(), b.size(), dtype::f64);
      wb.wait(60s);
      wa.wait(60s);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        double sum = 0;
        for (int q = 0; q < n; ++q) sum += value<double>(q, i);
        wrong += a[i] != sum;
      }
      for (std::size_t i = 0; i < b.size(); ++i) {
        double sum = 0;
        for (int q = 0; q < n; ++q) sum += value<double>(q, i + 1);
        wrong += b[i] != sum;
      }
      CHECK_MESSAGE(wrong == 0, "rank " << r << ": iallreduce_average: " << wrong << " wrong");
    }
  }
}

CADENCE_CONFORMANCE_RANK_TEST("a long mixed sequence of collectives, blocking and in flight together, "
                              "gives the exact results on every rank", conformance_mixed_sequence) {
  // Every rank issues the same sequence (a seeded generator): small and ring-sized all-reduces,
  // averages, broadcasts from every root, and, where offered, several in flight at once,
  // waited in reverse. A protocol whose messages of consecutive collectives can overtake or
  // block each other hangs or goes wrong here.
  const int n = c.size(), r = c.rank();
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  std::size_t wrong = 0;
  for (int k = 0; k < 60; ++k) {
    const auto what = next() % 5;
    const std::size_t count = what == 2 ? 20000 + next() % 50000 : 1 + next() % 3000;
    if (what == 3) {
      const int root = static_cast<int>(next() % static_cast<std::uint64_t>(n));
      std::vector<std::int32_t> b(count, r == root ? k : -1);
      c.broadcast(b.data(), b.size() * sizeof(std::int32_t), root, 30s);
      for (auto v : b) wrong += v != k;
      continue;
    }
    if constexpr (has_async_v<C> && has_async_average_v<C>) {
      if (what == 4) {  // three in flight, waited in reverse
        std::vector<float> a(count, static_cast<float>(r)), b(count + 7, static_cast<float>(2 * r)),
            d(70000, static_cast<float>(r + k));
        auto wa = c.iallreduce(a.data(), a.size(), dtype::f32, reduce_op::sum);
        auto wb = c.iallreduce_average(b.data(), b.size(), dtype::f32);
        auto wd = c.iallreduce(d.data(), d.size(), dtype::f32, reduce_op::max);
        wd.wait(30s);
        wb.wait(30s);
        wa.wait(30s);
        for (float v : a) wrong += v != static_cast<float>(n * (n - 1) / 2);
        for (float v : b) wrong += v != static_cast<float>(n - 1);
        for (float v : d) wrong += v != static_cast<float>(n - 1 + k);
        continue;
      }
    }
    std::vector<double> x(count, static_cast<double>(r + k));
    c.allreduce(x.data(), x.size(), dtype::f64, reduce_op::sum, 30s);
    for (double v : x) wrong += v != static_cast<double>(n * k + n * (n - 1) / 2);
  }
  CHECK_MESSAGE(wrong == 0, "rank " << r << ": " << wrong << " wrong values");
  CHECK_FALSE(c.failed());
}

// ---- asynchronous operations (where has_async_v) ----

CADENCE_CONFORMANCE_ASYNC_RANK_TEST("async: several collectives in flight at once complete with the blocking "
                                    "results, waited in any order", conformance_async_collectives) {
  const int n = c.size(), r = c.rank();
  std::vector<std::vector<float>> bufs(4);
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    bufs[k].resize(1000 * (k + 1) + k);
    for (std::size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = value<float>(r, i + k);
  }
  std::vector<std::int64_t> root_data(17, r == n - 1 ? 42 : -1);
  std::vector<decltype(c.iallreduce(nullptr, 0, dtype::f32, reduce_op::sum))> works;
  for (auto& b : bufs) works.push_back(c.iallreduce(b.data(), b.size(), dtype::f32, reduce_op::sum));
  auto bcast = c.ibroadcast(root_data.data(), root_data.size() * sizeof(std::int64_t), n - 1);
  // Wait in reverse order, the broadcast last; test() on the rest meanwhile never fails.
  (void)works[0].test();
  for (std::size_t k = works.size(); k-- > 0;) works[k].wait(30s);
  bcast.wait(30s);
  CHECK(bcast.test());
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < bufs[k].size(); ++i) {
      float expected = 0;
      for (int q = 0; q < n; ++q) expected += value<float>(q, i + k);
      wrong += bufs[k][i] != expected;
    }
    CHECK_MESSAGE(wrong == 0, "rank " << r << ": iallreduce " << k << ": " << wrong << " wrong");
    CHECK(works[k].test());
  }
  CHECK(std::all_of(root_data.begin(), root_data.end(), [](std::int64_t v) { return v == 42; }));
  // A blocking call after them still lines up with the other ranks.
  check_allreduce<double>(c, 33, reduce_op::max, 30s);
  CHECK_FALSE(c.failed());
}

CADENCE_CONFORMANCE_ASYNC_RANK_TEST("async: receives match messages in the order they were posted, whichever "
                                    "is waited first; any_source reports the sender", conformance_async_p2p) {
  const int n = c.size(), r = c.rank();
  if (r == 0) {
    // Three receives from rank 1 on one tag, posted before anything was sent: they take
    // the three messages in order although the last one is waited first.
    std::vector<std::int32_t> got(3, -1);
    std::vector<decltype(c.irecv(nullptr, 0, 0, 0))> rs;
    for (auto& g : got) rs.push_back(c.irecv(&g, sizeof g, 1, 11));
    std::int32_t go = 1;
    c.send(&go, sizeof go, 1, 12, 30s);  // rank 1 sends only now
    rs[2].wait(30s);
    rs[0].wait(30s);
    rs[1].wait(30s);
    CHECK(got == std::vector<std::int32_t>{100, 101, 102});
    CHECK(rs[0].source() == 1);
    // any_source: one message from each other rank, whoever is first.
    std::vector<int> from;
    for (int k = 1; k < n; ++k) {
      std::int64_t v = 0;
      auto w = c.irecv(&v, sizeof v, any_source, 13);
      w.wait(30s);
      CHECK(v == 1000 + w.source());
      from.push_back(w.source());
    }
    std::sort(from.begin(), from.end());
    for (int k = 1; k < n; ++k) CHECK(from[static_cast<std::size_t>(k - 1)] == k);
    // A large isend completes once the peer took it; test() until then never fails.
    std::vector<unsigned char> big(std::size_t{4} << 20, 7);
    auto s = c.isend(big.data(), big.size(), 1, 14);
    s.wait(30s);
    CHECK(s.test());
  } else {
    if (r == 1) {
      std::int32_t go = 0;
      c.recv(&go, sizeof go, 0, 12, 30s);
      std::vector<decltype(c.isend(nullptr, 0, 0, 0))> ss;
      const std::int32_t vals[3] = {100, 101, 102};
      for (const auto& v : vals) ss.push_back(c.isend(&v, sizeof v, 0, 11));
      for (auto& w : ss) w.wait(30s);
    }
    const std::int64_t mine = 1000 + r;
    c.send(&mine, sizeof mine, 0, 13, 30s);
    if (r == 1) {
      std::vector<unsigned char> big(std::size_t{4} << 20, 0);
      auto w = c.irecv(big.data(), big.size(), 0, 14);
      while (!w.test()) std::this_thread::yield();
      CHECK(big.front() == 7);
      CHECK(big.back() == 7);
    }
  }
  barrier(c, 30s);
  CHECK_FALSE(c.failed());
}

CADENCE_CONFORMANCE_ASYNC_RANK_TEST("async: test() has no deadline; wait(d) names the awaited rank when d "
                                    "passes; bad arguments are refused at the start",
                                    conformance_async_deadline) {
  const int r = c.rank();
  const std::string me = " on rank " + std::to_string(r);
  expect_throw<invalid_parameter_error>(r, [&] { (void)c.iallreduce(nullptr, 4, dtype::f32, reduce_op::sum); },
                                        {"allreduce #1" + me, "null buffer"});
  std::int32_t x = 0;
  expect_throw<invalid_parameter_error>(r, [&] { (void)c.isend(&x, sizeof x, c.size(), 0); },
                                        {"send #2" + me, "destination rank"});
  expect_throw<invalid_parameter_error>(r, [&] { (void)c.irecv(&x, sizeof x, 0, -1); },
                                        {"recv #3" + me, "tag -1"});
  CHECK_FALSE(c.failed());
  expect_deadline_on_rank0(
      c,
      [&] {
        auto w = c.irecv(&x, sizeof x, 1, 21);
        for (int k = 0; k < 100; ++k) CHECK_FALSE(w.test());  // no deadline: never a failure
        CHECK_FALSE(c.failed());
        w.wait(300ms);
      },
      {"recv #4 on rank 0", "deadline passed", "rank 1"});
}

/// Instantiates the whole suite for harness H (once per test executable).
#define CADENCE_TRANSPORT_CONFORMANCE(H)                             \
  TEST_CASE_TEMPLATE_INVOKE(conformance_allreduce_dtypes, H);        \
  TEST_CASE_TEMPLATE_INVOKE(conformance_allreduce_sizes, H);         \
  TEST_CASE_TEMPLATE_INVOKE(conformance_broadcast, H);               \
  TEST_CASE_TEMPLATE_INVOKE(conformance_point_to_point, H);          \
  TEST_CASE_TEMPLATE_INVOKE(conformance_any_source, H);              \
  TEST_CASE_TEMPLATE_INVOKE(conformance_helpers, H);                 \
  TEST_CASE_TEMPLATE_INVOKE(conformance_stalled_rank, H);            \
  TEST_CASE_TEMPLATE_INVOKE(conformance_recv_deadline, H);           \
  TEST_CASE_TEMPLATE_INVOKE(conformance_try_recv, H);                \
  TEST_CASE_TEMPLATE_INVOKE(conformance_send_deadline, H);           \
  TEST_CASE_TEMPLATE_INVOKE(conformance_bad_arguments, H);           \
  TEST_CASE_TEMPLATE_INVOKE(conformance_mismatch, H);                \
  TEST_CASE_TEMPLATE_INVOKE(conformance_message_size, H);            \
  TEST_CASE_TEMPLATE_INVOKE(conformance_abort, H);                   \
  TEST_CASE_TEMPLATE_INVOKE(conformance_average, H);                 \
  TEST_CASE_TEMPLATE_INVOKE(conformance_mixed_sequence, H);          \
  TEST_CASE_TEMPLATE_INVOKE(conformance_async_collectives, H);       \
  TEST_CASE_TEMPLATE_INVOKE(conformance_async_p2p, H);               \
  TEST_CASE_TEMPLATE_INVOKE(conformance_async_deadline, H)
