// A trainer that moves bytes over MPI through the exported cadence::mpi (a singleton job here).
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/mpi/communicator.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    cadence::transport::mpi_communicator comm(MPI_COMM_WORLD);
    float g[2] = {2.0f, 4.0f};
    cadence::transport::allreduce_avg(comm, g, 2, cadence::transport::dtype::f32,
                                      std::chrono::seconds(10));
    // One rank: the average is the rank's own gradient.
    if (comm.size() != 1 || g[0] != 2.0f || g[1] != 4.0f)
      rc = 1;
    else
      std::puts("consumer mpi ok");
  }
  MPI_Finalize();
  return rc;
}
