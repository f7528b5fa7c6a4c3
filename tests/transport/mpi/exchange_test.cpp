// The collective adapters (cadence/exchange/) over the MPI backend: the shared suite under
// mpirun, one rank per process.
#include <cadence/transport/mpi/communicator.hpp>

#include "exchange/collective_suite.hpp"
#include "mpi_ranks.hpp"

using cadence_mpi_test::mpi_process_harness;

CADENCE_COLLECTIVE_SUITE(mpi_process_harness);
