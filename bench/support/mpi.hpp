// What the command-line benchmarks' MPI backends share: one process's part of the job, from
// MPI_Init to MPI_Finalize, and the mean over ranks that lines them up. Not part of the library.
#pragma once

#include <mpi.h>

#include "roofline.hpp"

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

namespace cadence_bench {

/// Runs body(rank, size, raw) as this process's rank of the job and returns what it returns:
/// initializes MPI (funneled), gives body `raw`, a duplicate of MPI_COMM_WORLD for the raw side
/// and the averages (so they never match the communicator's own messages), and finalizes. An
/// exception aborts the whole job with "PROGRAM (rank R): message": the other ranks would
/// wait for this one.
template <class Body>
int run_mpi_rank(const char* program, Body body) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 0;
  try {
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    rc = body(rank, size, raw);
    MPI_Comm_free(&raw);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s (rank %d): %s\n", program, rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}

/// run_mpi_rank for a body that returns the rows this rank measured (the same on every rank):
/// rank 0 prints them with print(rows).
template <class Body, class Print>
int run_mpi_rows(const char* program, Body body, Print print) {
  return run_mpi_rank(program, [&](int rank, int size, MPI_Comm raw) {
    const auto rows = body(rank, size, raw);
    if (rank == 0) print(rows);
    return 0;
  });
}

/// The mean of v over the ranks of comm; doubles as the barrier before a timed block.
inline double mpi_average(MPI_Comm comm, double v) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  double sum = 0;
  MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, comm);
  return sum / size;
}

/// A barrier that waits without spinning (MPI's own barrier may poll on a core): an
/// MPI_Ibarrier tested every millisecond.
inline void quiet_barrier(MPI_Comm comm) {
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  int done = 0;
  for (MPI_Test(&req, &done, MPI_STATUS_IGNORE); !done; MPI_Test(&req, &done, MPI_STATUS_IGNORE))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

/// The roofline's copy rates at `sizes`, measured by rank 0 while the other ranks wait idle
/// (each rank returns them): on one host, ranks that spun meanwhile would take the cores it
/// measures.
inline copy_rates mpi_copy_rates(MPI_Comm comm, const std::vector<std::size_t>& sizes) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::vector<double> v(2 * sizes.size());
  if (rank == 0) {
    const copy_rates measured(sizes);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      v[2 * k] = measured.all()[k].second.one_thread_gbps;
      v[2 * k + 1] = measured.all()[k].second.two_threads_gbps;
    }
  }
  quiet_barrier(comm);
  MPI_Bcast(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, 0, comm);
  std::vector<copy_bandwidth> rates;
  for (std::size_t k = 0; k < sizes.size(); ++k) rates.push_back({v[2 * k], v[2 * k + 1]});
  return copy_rates(sizes, rates);
}

}  // namespace cadence_bench
