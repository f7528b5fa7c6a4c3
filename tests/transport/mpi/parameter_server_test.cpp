// The parameter server across MPI processes (mpirun -np 4: server rank 0, workers 1-3): the
// shared suite (tests/transport/ps_suite.hpp), one rank per process.
#include <cadence/transport/mpi/communicator.hpp>

#include "exchange/ps_suite.hpp"
#include "mpi_ranks.hpp"

using cadence_mpi_test::mpi_process_harness;

CADENCE_PS_SUITE(mpi_process_harness);
