// The gloo backend: the conformance suite with ranks as threads (each its own gloo context over
// a temporary file store), plus what is gloo's own: rendezvous failures, abort from a watchdog,
// and ranks as real processes, one of them killed with SIGKILL mid-call.
#include <cadence/transport/gloo/communicator.hpp>

#include "transport/conformance.hpp"
#include "gloo_ranks.hpp"
#include "support/processes.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace cadence_conformance::test_names;

CADENCE_REQUIRE_COMMUNICATOR(gloo_communicator);

using cadence_gloo_test::gloo_harness;
using cadence_gloo_test::gloo_pair_harness;
using cadence_gloo_test::options_for;
using cadence_gloo_test::temp_store;

static_assert(has_async_v<gloo_communicator>);
static_assert(has_async_average_v<gloo_communicator>);
static_assert(has_allreduce_average_v<gloo_communicator>);
static_assert(is_work_v<gloo_work>);
CADENCE_TRANSPORT_CONFORMANCE(gloo_harness);

TEST_CASE("two gloo ranks pass the all-reduce and point to point cases too" * doctest::timeout(120)) {
  using cadence_conformance::check_allreduce;
  gloo_pair_harness::run([](auto& c) {
    check_allreduce<float>(c, 1000, reduce_op::sum);
    check_allreduce<float>(c, 262147, reduce_op::max);  // the ring
    check_allreduce<std::int64_t>(c, 16, reduce_op::min);
    std::int32_t v = c.rank() == 0 ? 42 : -1;
    c.broadcast(&v, sizeof v, 0, 30s);
    CHECK(v == 42);
  });
}

TEST_CASE("ring-sized all-reduces whose counts differ fail with transport_error on every rank, "
          "without overrunning a buffer" * doctest::timeout(120)) {
  // The ring checks the notices while its first chunks move; only the scratch receives may be
  // posted by then. Under AddressSanitizer an overrun would stop the test.
  gloo_harness::run([](auto& c) {
    const std::size_t count = c.rank() == 0 ? (std::size_t{1} << 20) : (std::size_t{3} << 17);
    std::vector<float> buf(count, 1.0f);
    expect_throw<transport_error>(
        c.rank(), [&] { c.allreduce(buf.data(), count, dtype::f32, reduce_op::sum, 30s); },
        {"allreduce #1 on rank " + std::to_string(c.rank()), "differ"});
    CHECK(c.failed());
  });
  // A broadcast against an all-reduce: the root's chunks never exceed a ring receive.
  gloo_harness::run([](auto& c) {
    cadence_conformance::broadcast_against_allreduce(c, "rank 0");
  });
}

TEST_CASE("the gloo capabilities: any_source, and a crashed peer is detected and survived" *
          doctest::timeout(60)) {
  gloo_pair_harness::run([](auto& c) {
    CHECK(c.capabilities().any_source);
    CHECK(c.capabilities().detects_lost_peer);
    CHECK(c.capabilities().survives_lost_peer);
    CHECK_FALSE(c.capabilities().device_buffers);
    CHECK(c.size() == 2);
  });
}

TEST_CASE("a rank that never arrives at the rendezvous fails construction within the "
          "deadline, naming it" * doctest::timeout(60)) {
  temp_store store;
  const auto t0 = steady::now();
  expect_throw<transport_error>(0, [&] { gloo_communicator c(0, 3, options_for(store.path), 500ms); },
                                {"construction on rank 0 of 3", "deadline passed", "ranks 1, 2",
                                 store.path});
  const double waited = std::chrono::duration<double>(steady::now() - t0).count();
  CHECK(waited >= 0.499);
  CHECK(waited < 5.0);
}

TEST_CASE("a store folder that does not exist, is no folder or is not writable is refused "
          "before waiting, naming it" * doctest::timeout(60)) {
  temp_store store;
  const std::string missing = store.path + "/no/such/folder";
  const auto t0 = steady::now();
  expect_throw<invalid_parameter_error>(0, [&] { gloo_communicator c(0, 2, options_for(missing), 30s); },
                                        {"construction on rank 0 of 2", missing, "does not exist"});
  const std::string file = store.path + "/a-file";
  std::fclose(std::fopen(file.c_str(), "w"));
  expect_throw<invalid_parameter_error>(0, [&] { gloo_communicator c(0, 2, options_for(file), 30s); },
                                        {file, "not a folder"});
  expect_throw<invalid_parameter_error>(
      0, [&] { gloo_communicator c(0, 2, options_for(store.path, "a/b"), 30s); }, {"prefix"});
  if (::geteuid() != 0) {  // root may write anywhere: this check means nothing there
    const std::string locked = store.path + "/locked";
    std::filesystem::create_directory(locked);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    expect_throw<invalid_parameter_error>(0, [&] { gloo_communicator c(0, 2, options_for(locked), 30s); },
                                          {locked, "not writable"});
    std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  }
  CHECK(std::chrono::duration<double>(steady::now() - t0).count() < 5.0);
}

TEST_CASE("abort() from a watchdog thread ends a blocked call; later calls throw at once" *
          doctest::timeout(60)) {
  gloo_pair_harness::run([](gloo_communicator& c) {
    if (c.rank() == 0) {
      const abort_after watchdog(c, 100ms);
      float x = 0;
      const auto t0 = steady::now();
      const std::string first = expect_throw<transport_error>(
          0, [&] { c.recv(&x, sizeof x, 1, 77, 30s); }, {"recv #1 on rank 0", "aborted", "rank 1"});
      CHECK(std::chrono::duration<double>(steady::now() - t0).count() < 10.0);
      CHECK(c.failed());
      // The first failure sticks: the same error, at once.
      const std::string again = expect_throw<transport_error>(
          0, [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 30s); }, {});
      CHECK(again == first);
      cadence_test::current_events().post("rank 0 done");
      return;
    }
    // Rank 1 sends nothing, and leaves only after rank 0's checks: a departed rank 1 would be
    // reported as lost instead.
    CHECK(cadence_test::current_events().wait("rank 0 done"));
  });
}

TEST_CASE("several communicators share one store folder under different prefixes" *
          doctest::timeout(60)) {
  temp_store store;
  std::vector<std::int64_t> sums(4, -1);
  cadence_test::run_threads(4, [&](int r) {
    // Two worlds of two ranks: {0, 1} under "a", {2, 3} under "b".
    gloo_communicator c(r % 2, 2, options_for(store.path, r < 2 ? "a" : "b"), 30s);
    std::int64_t v = r;
    c.allreduce(&v, 1, dtype::i64, reduce_op::sum, 30s);
    sums[static_cast<std::size_t>(r)] = v;
  });
  CHECK(sums == std::vector<std::int64_t>{1, 1, 5, 5});
}

static_assert(has_try_recv_v<gloo_communicator>, "the gloo backend offers try_recv");

TEST_CASE("gloo try_recv: a receive left posted at the deadline serves the next call, in order, "
          "and the connections stay up" * doctest::timeout(60)) {
  // gloo's own wait timeout would close every connection; try_recv must never let it fire.
  // Rank 0 times out repeatedly on tag 5 (rank 1's and any_source's receives stay posted and
  // are taken over, never posted twice), then rank 1 sends three messages: they arrive in
  // order through the leftover receives, and collectives still work afterwards.
  gloo_harness::run([](auto& c) {
    const int r = c.rank();
    if (r == 0) {
      int got = 0;
      for (int k = 0; k < 5; ++k) CHECK_FALSE(c.try_recv(&got, sizeof got, 1, 5, 20ms).has_value());
      for (int k = 0; k < 3; ++k) CHECK_FALSE(c.try_recv(&got, sizeof got, any_source, 5, 20ms).has_value());
      CHECK_FALSE(c.failed());
    }
    barrier(c, 30s);
    if (r == 1)
      for (int v = 1; v <= 3; ++v) c.send(&v, sizeof v, 0, 5, 30s);
    if (r == 2) {
      const int v = 7;
      c.send(&v, sizeof v, 0, 6, 30s);  // another tag: not taken by tag 5's receives
    }
    if (r == 0) {
      int got = 0;
      CHECK(c.try_recv(&got, sizeof got, any_source, 5, 30s) == std::optional<int>(1));
      CHECK(got == 1);
      CHECK(c.recv(&got, sizeof got, 1, 5, 30s) == 1);  // a specific receive: the next in order
      CHECK(got == 2);
      CHECK(c.try_recv(&got, sizeof got, 1, 5, 30s) == std::optional<int>(1));
      CHECK(got == 3);
      CHECK(c.try_recv(&got, sizeof got, 2, 6, 30s) == std::optional<int>(2));
      CHECK(got == 7);
      CHECK_FALSE(c.try_recv(&got, sizeof got, any_source, 5, 20ms).has_value());
    }
    std::int64_t sum = r;
    c.allreduce(&sum, 1, dtype::i64, reduce_op::sum, 30s);
    CHECK(sum == 3);
  });
}

TEST_CASE("gloo try_recv: a message taken for another sender waits for its own receive" *
          doctest::timeout(60)) {
  // Rank 0's any_source receive is posted first; rank 2's message completes it while rank 0
  // asks for rank 1 only. Rank 2's message must be kept for the next receive that matches.
  gloo_harness::run([](auto& c) {
    const int r = c.rank();
    if (r == 0) {
      int got = 0;
      CHECK_FALSE(c.try_recv(&got, sizeof got, any_source, 3, 20ms).has_value());
    }
    barrier(c, 30s);
    if (r == 2) {
      const int v = 20;
      c.send(&v, sizeof v, 0, 3, 30s);
    }
    barrier(c, 30s);  // rank 2's message has left before rank 1's
    if (r == 1) {
      const int v = 10;
      c.send(&v, sizeof v, 0, 3, 30s);
    }
    if (r == 0) {
      int got = 0;
      CHECK(c.recv(&got, sizeof got, 1, 3, 30s) == 1);
      CHECK(got == 10);
      CHECK(c.try_recv(&got, sizeof got, any_source, 3, 30s) == std::optional<int>(2));
      CHECK(got == 20);
    }
    barrier(c, 30s);
  });
}

TEST_CASE("gloo try_recv: a large message, and abort() wakes a waiting try_recv" * doctest::timeout(60)) {
  gloo_pair_harness::run([](auto& c) {
    std::vector<float> big(std::size_t{1} << 18);  // 1 MiB: header, then the data
    if (c.rank() == 0) {
      CHECK_FALSE(c.try_recv(big.data(), big.size() * sizeof(float), 1, 4, 20ms).has_value());
      barrier(c, 30s);
      CHECK(c.try_recv(big.data(), big.size() * sizeof(float), 1, 4, 30s) == std::optional<int>(1));
      CHECK(big[12345] == 2.5f);
    } else {
      barrier(c, 30s);
      std::fill(big.begin(), big.end(), 2.5f);
      c.send(big.data(), big.size() * sizeof(float), 0, 4, 30s);
    }
    barrier(c, 30s);
    if (c.rank() == 0) {
      const abort_after watchdog(c, 200ms);
      int got = 0;
      const auto t0 = steady::now();
      expect_throw<transport_error>(0, [&] { (void)c.try_recv(&got, sizeof got, 1, 9, 20s); },
                                    {"try_recv", "abort"});
      CHECK(std::chrono::duration<double>(steady::now() - t0).count() < 5.0);
    }
  });
}

// ---- ranks as processes ----

namespace {

using cadence_test::rank_check;

// One rank of a scenario, in a child process. Exit 0: as expected; 1: a check failed (the
// reason on stderr); the victim never exits by itself: it kills itself with SIGKILL.
int run_rank(const std::string& scenario, int rank, int size, const std::string& store) {
  const int victim = size - 1;
  gloo_communicator c(rank, size, options_for(store, "world"), 20s);
  std::vector<float> buf(std::size_t{1} << 18, 1.0f);  // 1 MiB: the ring
  if (scenario == "collective")
    for (int k = 0; k < 3; ++k) c.allreduce(buf.data(), buf.size(), dtype::f32, reduce_op::sum, 20s);
  if (rank == victim) {
    std::this_thread::sleep_for(300ms);  // the others are blocked waiting for it by now
    ::kill(::getpid(), SIGKILL);
  }
  // "collective": every survivor is in the all-reduce; "recv": rank 0 waits in recv for the
  // victim while the others go straight on.
  if (scenario == "collective" || rank == 0) {
    const auto t0 = steady::now();
    const std::string needle = "lost rank " + std::to_string(victim);
    const std::string what = cadence_test::rank_expect_throw<transport_error>(
        [&] {
          if (scenario == "collective") {
            c.allreduce(buf.data(), buf.size(), dtype::f32, reduce_op::sum, 20s);
          } else {
            float x = 0;
            c.recv(&x, sizeof x, victim, 5, 20s);
          }
        },
        needle);
    const double waited = std::chrono::duration<double>(steady::now() - t0).count();
    rank_check(waited <= 10.0, "\"" + what + "\" came after " + std::to_string(waited) + " s, not well within the deadline");
    rank_check(c.failed(), "the communicator that lost a rank in a collective call did not fail");
    std::fprintf(stderr, "rank %d (expected): %s (after %.3f s)\n", rank, what.c_str(), waited);
  }
  // The survivors go on: a new communicator among themselves under a fresh prefix.
  gloo_communicator after(rank, size - 1, options_for(store, "survivors"), 20s);
  std::int64_t v = 1;
  after.allreduce(&v, 1, dtype::i64, reduce_op::sum, 20s);
  rank_check(v == size - 1, "the survivors' all-reduce gave " + std::to_string(v));
  return 0;
}

// Starts `size` processes of this executable on one scenario, waits for all of them (killing
// leftovers at 60 s) and checks that the victim (the last rank) died of its SIGKILL and every
// other rank passed its checks.
void run_processes(const std::string& scenario, int size) {
  temp_store store;
  std::vector<cadence_test::rank_process> ranks;
  for (int r = 0; r < size; ++r)
    ranks.push_back(cadence_test::start_rank(
        "rank " + std::to_string(r) + " of scenario " + scenario,
        {"cadence-gloo-rank", "--gloo-rank", scenario, std::to_string(r), std::to_string(size), store.path}));
  cadence_test::wait_ranks(ranks, 60s);
  for (int r = 0; r + 1 < size; ++r) cadence_test::check_exited(ranks[static_cast<std::size_t>(r)]);
  cadence_test::check_killed(ranks.back());
}

}  // namespace

int cadence_gloo_rank_main(int argc, char** argv) {
  if (argc != 6) return 2;
  return cadence_test::rank_main("rank " + std::string(argv[3]),
                                 [&] { return run_rank(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), argv[5]); });
}

TEST_CASE("a rank killed with SIGKILL mid all-reduce: the others throw transport_error naming "
          "it at once, and go on without it" * doctest::timeout(120)) {
  run_processes("collective", 3);
}

TEST_CASE("a rank killed with SIGKILL while another waits in recv for it: the recv throws "
          "naming it at once" * doctest::timeout(120)) {
  run_processes("recv", 3);
}

// The conformance suite's mixed sequence on four ranks too: recursive doubling with two rounds
// and notices to the peers a rank does not send to first.
namespace {
using gloo_4 = cadence_gloo_test::gloo_threads_harness<4>;
}
TEST_CASE_TEMPLATE_INVOKE(conformance_mixed_sequence, gloo_4);
