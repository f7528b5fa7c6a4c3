// doctest's runner for the MPI tests: every process runs the same test cases in the same order
// (each is one rank), between MPI_Init_thread and MPI_Finalize.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  const int failed = context.run();
  // Every rank's verdict, so rank 0's summary line speaks for the job.
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("mpi tests: %s on every rank\n", any_failed ? "FAILED" : "passed");
  MPI_Finalize();
  return failed;
}
