// Test support for the MPI backend: the harness the shared suites (conformance.hpp,
// exchange/collective_suite.hpp, exchange/ps_suite.hpp) take under mpirun, where each process is one rank.
#pragma once

#include <cadence/transport/mpi/communicator.hpp>

#include "support/events.hpp"

#include <doctest/doctest.h>

#include <mpi.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace cadence_mpi_test {

inline cadence::transport::mpi_options default_mpi_options() { return {}; }

/// run(body) calls body(comm) on this process's rank, over a fresh communicator on
/// MPI_COMM_WORLD made with Options(), then waits for every rank: no rank starts the next case
/// (or leaves) while another may still talk to it in this one. An exception escaping the body
/// fails the test, naming the rank. current_events() is a folder rank 0 made for this run.
template <cadence::transport::mpi_options (*Options)() = &default_mpi_options>
struct mpi_harness_for {
  template <class Body>
  static void run(Body body) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::unique_ptr<cadence_test::events> ev;
    if (rank == 0) ev = std::make_unique<cadence_test::events>();
    std::vector<char> dir(4096, '\0');
    if (rank == 0) ev->dir().copy(dir.data(), dir.size() - 1);
    MPI_Bcast(dir.data(), static_cast<int>(dir.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank != 0) ev = std::make_unique<cadence_test::events>(std::string(dir.data()));
    const cadence_test::scoped_events scope(*ev);
    try {
      cadence::transport::mpi_communicator c(MPI_COMM_WORLD, Options(), std::chrono::seconds(30));
      body(c);
    } catch (const std::exception& e) {
      const std::string what = "rank " + std::to_string(rank) + " threw: " + e.what();
      FAIL_CHECK(what);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
};
using mpi_process_harness = mpi_harness_for<>;

/// The stalled-rank fault under mpirun, as two steps over plain MPI on MPI_COMM_WORLD (outside
/// the communicator under test): every rank but `stalled` reports that its deadline passed, and
/// `stalled` stays away until all of them have, instead of sleeping against their deadline.
constexpr int gave_up_tag = 4242;
inline void post_gave_up(int stalled) {
  int dummy = 0;
  MPI_Send(&dummy, 1, MPI_INT, stalled, gave_up_tag, MPI_COMM_WORLD);
}
inline void wait_others_gave_up(int stalled) {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int r = 0; r < size; ++r) {
    if (r == stalled) continue;
    int dummy = 0;
    MPI_Recv(&dummy, 1, MPI_INT, r, gave_up_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
}
/// The fault with the last rank of `size` stalled: every other rank runs `give_up` (a call that
/// must fail on its deadline) and reports it; the last stays away until all of them have, then
/// runs `late`.
template <class GiveUp, class Late>
void last_rank_stalls(int rank, int size, GiveUp&& give_up, Late&& late) {
  const int stalled = size - 1;
  if (rank == stalled) {
    wait_others_gave_up(stalled);
    late();
  } else {
    give_up();
    post_gave_up(stalled);
  }
}

}  // namespace cadence_mpi_test

// The suites' name for the harness, declared once here so that test files sharing a unity
// build do not declare it twice.
TYPE_TO_STRING_AS("mpi_process_harness", cadence_mpi_test::mpi_harness_for<>);
