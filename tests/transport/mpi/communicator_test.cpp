// The MPI backend: the conformance suite under mpirun (one rank per process), plus what is
// specific to MPI (construction, ownership, bounce buffers).
#include <cadence/transport/mpi/communicator.hpp>

#include "../conformance.hpp"

#include <doctest/doctest.h>

#include <mpi.h>

#include <chrono>
#include <exception>
#include <string>
#include <thread>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;
using cadence_conformance::expect_throw;

namespace {

template <mpi_options (*Options)()>
struct mpi_harness_for {
  template <class Body>
  static void run(Body body) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    try {
      mpi_communicator c(MPI_COMM_WORLD, Options(), 30s);
      body(c);
    } catch (const std::exception& e) {
      FAIL_CHECK("rank " << rank << " threw: " << e.what());
    }
  }
};

mpi_options bounced() { return {}; }
mpi_options unbounced() {
  mpi_options o;
  o.bounce_buffers = false;
  return o;
}
using mpi_harness = mpi_harness_for<&bounced>;
using mpi_unbounced_harness = mpi_harness_for<&unbounced>;

}  // namespace

TYPE_TO_STRING(mpi_harness);
TYPE_TO_STRING(mpi_unbounced_harness);
CADENCE_TRANSPORT_CONFORMANCE(mpi_harness);

TEST_CASE("without bounce buffers the data paths are the same" * doctest::timeout(120)) {
  // The conformance bodies that move data, on the caller's buffers directly.
  using cadence_conformance::check_allreduce;
  mpi_unbounced_harness::run([](auto& c) {
    check_allreduce<float>(c, 262147, reduce_op::sum);
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
