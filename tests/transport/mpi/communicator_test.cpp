// The MPI backend: the conformance suite under mpirun (one rank per process), plus what is
// specific to MPI (construction, ownership, bounce buffers).
#include <cadence/transport/mpi/communicator.hpp>

#include "transport/conformance.hpp"
#include "mpi_ranks.hpp"

#include <doctest/doctest.h>

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <vector>
#include <string>
#include <thread>

using namespace cadence_conformance::test_names;

namespace {

mpi_options bounced() { return {}; }
mpi_options unbounced() {
  mpi_options o;
  o.bounce_buffers = false;
  return o;
}
// Every message above 1000 bytes a derived type, the ring from 4 KiB in pieces of 1000 bytes:
// the arithmetic that keeps a 4 GiB tensor's 2 GiB segments below MPI's int count, on small
// buffers.
mpi_options tiny_messages() {
  mpi_options o;
  o.max_message_bytes = 1000;
  o.ring_min_bytes = 4096;
  return o;
}
// Collectives posted at once, without first checking that every rank called them: a rank that
// never joins leaves the others' operations posted inside MPI until their deadline.
mpi_options posting_at_once() {
  mpi_options o;
  o.verify_before_posting = false;
  return o;
}
using mpi_harness = cadence_mpi_test::mpi_harness_for<&bounced>;
using mpi_unbounced_harness = cadence_mpi_test::mpi_harness_for<&unbounced>;
using mpi_tiny_harness = cadence_mpi_test::mpi_harness_for<&tiny_messages>;

}  // namespace

static_assert(has_async_v<mpi_communicator>);
static_assert(has_async_average_v<mpi_communicator>);
static_assert(has_allreduce_average_v<mpi_communicator>);
static_assert(is_work_v<mpi_work>);
TYPE_TO_STRING(mpi_harness);
CADENCE_TRANSPORT_CONFORMANCE(mpi_harness);
TYPE_TO_STRING(mpi_tiny_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_point_to_point, mpi_tiny_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_async_collectives, mpi_tiny_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_async_p2p, mpi_tiny_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_average, mpi_tiny_harness);

TEST_CASE("messages above max_message_bytes travel whole and ring pieces stay below it" *
          doctest::timeout(120)) {
  using cadence_conformance::check_allreduce;
  mpi_tiny_harness::run([](auto& c) {
    for (std::size_t count : {std::size_t{1023}, std::size_t{1025}, std::size_t{4099}, std::size_t{65537}})
      check_allreduce<float>(c, count, reduce_op::sum);  // the small path, then the ring
    check_allreduce<std::int64_t>(c, 3001, reduce_op::max);
    check_allreduce<double>(c, 777, reduce_op::min);
    const int n = c.size(), r = c.rank();
    std::vector<unsigned char> out(5003), in(5003, 0);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 7 + static_cast<std::size_t>(r));
    auto rw = c.irecv(in.data(), in.size(), (r + n - 1) % n, 9);
    c.send(out.data(), out.size(), (r + 1) % n, 9, 30s);
    rw.wait(30s);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < in.size(); ++i)
      wrong += in[i] != static_cast<unsigned char>(i * 7 + static_cast<std::size_t>((r + n - 1) % n));
    CHECK(wrong == 0);
    // A message of another size than the receive is still caught, as one message.
    if (r == 0) c.send(out.data(), 4000, 1, 10, 30s);
    if (r == 1)
      expect_throw<transport_error>(1, [&] { c.recv(in.data(), 5003, 0, 10, 30s); },
                                    {"rank 0 sent 4000 bytes", "received into 5003 bytes"});
  });
}

TEST_CASE("a message of more than 2 GiB is one MPI message of a derived type: the layout") {
  const std::size_t gib = std::size_t{1} << 30;
  auto l = detail::mpi_layout_of((std::size_t{5} << 30) + 3, gib);
  CHECK(l.blocks == 5);
  CHECK(l.block == gib);
  CHECK(l.rest == 3);
  CHECK_FALSE(l.plain());
  l = detail::mpi_layout_of(gib, gib);
  CHECK(l.plain());
  CHECK(l.rest == gib);
  l = detail::mpi_layout_of(std::size_t{4} << 30, std::size_t{INT_MAX});
  CHECK(l.blocks == 2);
  CHECK(l.blocks * l.block + l.rest == (std::size_t{4} << 30));
  CHECK_THROWS_AS(detail::mpi_layout_of(std::size_t{1} << 32, 1), std::length_error);
  // Recursive doubling on a world that is not a power of two: the extra ranks hand over.
  const detail::doubling g(6);
  CHECK(g.p == 4);
  CHECK(g.extra == 2);
  CHECK(g.inner(0) == -1);
  CHECK(g.inner(1) == 0);
  CHECK(g.inner(2) == -1);
  CHECK(g.inner(3) == 1);
  CHECK(g.inner(5) == 3);
  for (int in = 0; in < g.p; ++in) CHECK(g.inner(g.outer(in)) == in);
  CHECK(g.rounds() == 2);
}

TEST_CASE("without bounce buffers the data paths are the same" * doctest::timeout(120)) {
  // The conformance bodies that move data through MPI collectives (all-reduces below the
  // ring's 256 KiB, broadcasts), on the caller's buffers directly.
  using cadence_conformance::check_allreduce;
  mpi_unbounced_harness::run([](auto& c) {
    check_allreduce<float>(c, 65521, reduce_op::sum);  // 262084 bytes: just below the ring
    check_allreduce<std::int64_t>(c, 1000, reduce_op::max);
    std::vector<unsigned char> b(1000, static_cast<unsigned char>(c.rank() == 1 ? 7 : 0));
    c.broadcast(b.data(), b.size(), 1, 30s);
    CHECK(std::count(b.begin(), b.end(), 7) == 1000);
  });
}

TEST_CASE("the MPI capabilities: any_source, but a crashed peer is seen only by the deadline" *
          doctest::timeout(60)) {
  mpi_communicator c(MPI_COMM_WORLD, {}, 30s);
  static_assert(is_communicator_v<mpi_communicator>);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(c.rank() == rank);
  CHECK(c.size() == size);
  CHECK(c.capabilities().any_source);
  CHECK_FALSE(c.capabilities().detects_lost_peer);
  CHECK_FALSE(c.capabilities().survives_lost_peer);
  CHECK_FALSE(c.capabilities().device_buffers);
}

TEST_CASE("a thread that does not own the communicator is refused before it enters MPI" *
          doctest::timeout(60)) {
  mpi_communicator c(MPI_COMM_WORLD, {}, 30s);
  float x = 0;
  std::string what;
  std::thread other([&] {
    try {
      c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 5s);
    } catch (const invalid_parameter_error& e) {
      what = e.what();
    }
    c.abort();  // allowed from any thread: it only raises a flag
  });
  other.join();
  CHECK(what.find("does not own the communicator") != std::string::npos);
  CHECK(c.failed());
  expect_throw<transport_error>(c.rank(), [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 5s); },
                                {"allreduce #2", "aborted"});
}

TEST_CASE("f16 and bf16 are refused: MPI has no host type for them" * doctest::timeout(60)) {
  mpi_communicator c(MPI_COMM_WORLD, {}, 30s);
  std::uint16_t h = 0;
  expect_throw<invalid_parameter_error>(c.rank(), [&] { c.allreduce(&h, 1, dtype::f16, reduce_op::sum, 5s); },
                                        {"allreduce #1", "dtype f16"});
  CHECK_FALSE(c.failed());
}

TEST_CASE("abort() from a watchdog thread ends a blocked call on the owning thread" *
          doctest::timeout(60)) {
  mpi_communicator c(MPI_COMM_WORLD, {}, 30s);
  if (c.rank() == 0) {
    // The watchdog cannot see the recv block; 300 ms makes it all but certain, and an abort
    // that lands before the call is still an abort (only the last needle would be missing).
    const abort_after watchdog(c, 300ms);
    float x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string what = expect_throw<transport_error>(0, [&] { c.recv(&x, sizeof x, 1, 77, 30s); },
                                                           {"recv #1 on rank 0", "aborted"});
    WARN_MESSAGE(what.find("waiting for rank 1") != std::string::npos, what);
    CHECK(cadence_conformance::seconds_since(t0) < 20.0);
  }
  // Everyone leaves together, so rank 1 cannot be gone while rank 0 still waits for it (that
  // would not change the outcome under MPI, but keeps the test's story simple).
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("construction with a deadline already passed is refused before any MPI call" *
          doctest::timeout(60)) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  expect_throw<invalid_parameter_error>(
      rank, [&] { mpi_communicator c(MPI_COMM_WORLD, {}, deadline::at(std::chrono::steady_clock::now() - 1s)); },
      {"construction on rank " + std::to_string(rank), "deadline had already passed"});
}

TEST_CASE("construction is bounded by its deadline when a rank never constructs" *
          doctest::timeout(60)) {
  // On a scratch duplicate: the abandoned MPI_Comm_idup stays posted on it forever, so it is
  // never freed and never used again.
  MPI_Comm scratch;
  MPI_Comm_dup(MPI_COMM_WORLD, &scratch);
  int rank = 0, size = 0;
  MPI_Comm_rank(scratch, &rank);
  MPI_Comm_size(scratch, &size);
  cadence_mpi_test::last_rank_stalls(
      rank, size,
      [&] {
        const auto t0 = std::chrono::steady_clock::now();
        expect_throw<transport_error>(
            rank, [&] { mpi_communicator c(scratch, {}, 500ms); },
            {"construction on rank " + std::to_string(rank), "deadline passed", std::to_string(size - 1)});
        CHECK(cadence_conformance::seconds_since(t0) >= 0.499);
        CHECK(cadence_conformance::seconds_since(t0) < 10.0);
      },
      [] {});  // never constructs
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a rank that joins a collective after the others gave up cannot write into their "
          "buffers" * doctest::timeout(60)) {
  // Without verify_before_posting the others post the all-reduce and abandon it on their
  // deadline; the late rank's call then completes it inside MPI. The bounce buffer, not the
  // caller's, receives that late result.
  mpi_communicator c(MPI_COMM_WORLD, posting_at_once(), 30s);
  const int late = c.size() - 1;
  std::vector<float> grad(1024, 1.0f);
  cadence_mpi_test::last_rank_stalls(
      c.rank(), c.size(),
      [&] {
        expect_throw<transport_error>(
            c.rank(), [&] { c.allreduce(grad.data(), grad.size(), dtype::f32, reduce_op::sum, 300ms); },
            {"allreduce #1 on rank " + std::to_string(c.rank()), "waiting for rank " + std::to_string(late)});
      },
      [&] {
        // Joins only once every other rank has given up (their 300 ms deadline passed). It
        // may even succeed: the others' abandoned requests are still posted inside MPI.
        try {
          c.allreduce(grad.data(), grad.size(), dtype::f32, reduce_op::sum, 1s);
        } catch (const transport_error&) {
        }
      });
  // Let MPI progress the abandoned operation everywhere, then look at the callers' buffers.
  MPI_Barrier(MPI_COMM_WORLD);
  std::this_thread::sleep_for(100ms);
  MPI_Barrier(MPI_COMM_WORLD);
  if (c.rank() != late)
    CHECK(std::all_of(grad.begin(), grad.end(), [](float v) { return v == 1.0f; }));
}

TEST_CASE("a ring all-reduce that a rank never joins fails on its deadline and leaves nothing "
          "posted" * doctest::timeout(60)) {
  // Without verify_before_posting the ring starts at once; its point-to-point steps wait for
  // the neighbours and are cancelled on the deadline.
  mpi_communicator c(MPI_COMM_WORLD, posting_at_once(), 30s);
  cadence_mpi_test::last_rank_stalls(
      c.rank(), c.size(),
      [&] {
        std::vector<float> grad(std::size_t{1} << 20, 1.0f);  // 4 MiB: the ring path
        expect_throw<transport_error>(
            c.rank(), [&] { c.allreduce(grad.data(), grad.size(), dtype::f32, reduce_op::sum, 500ms); },
            {"allreduce #1 on rank " + std::to_string(c.rank()), "in the ring all-reduce", "waiting for rank"});
      },
      [] {});
  MPI_Barrier(MPI_COMM_WORLD);
}
