// The collective adapters (cadence/exchange/) over the MPI backend: the shared suite under
// mpirun, one rank per process.
#include <cadence/transport/mpi/communicator.hpp>

#include "../exchange_suite.hpp"

#include <doctest/doctest.h>

#include <mpi.h>

#include <exception>
#include <string>

using namespace cadence;
using namespace cadence::transport;
using namespace std::chrono_literals;

namespace {

struct mpi_exchange_harness {
  template <class Body>
  static void run(Body body) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    try {
      mpi_communicator c(MPI_COMM_WORLD, mpi_options{}, 30s);
      body(c);
    } catch (const std::exception& e) {
      const std::string what = "rank " + std::to_string(rank) + " threw: " + e.what();
      FAIL_CHECK(what);
    }
  }
};

}  // namespace

TYPE_TO_STRING(mpi_exchange_harness);
CADENCE_EXCHANGE_SUITE(mpi_exchange_harness);
