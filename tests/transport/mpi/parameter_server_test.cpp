// The parameter server across MPI processes (mpirun -np 4: server rank 0, workers 1-3): the
// shared suite (tests/transport/ps_suite.hpp), one rank per process; then the lifetime rule of
// the buffers the parameter server lends to MPI instead of copying (docs/parameter_server.md,
// "No copy by default"), on the timed-out path.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/mpi/communicator.hpp>

#include "exchange/ps_suite.hpp"
#include "mpi_ranks.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

using cadence_mpi_test::mpi_process_harness;

CADENCE_PS_SUITE(mpi_process_harness);

namespace {

using namespace std::chrono_literals;
using cadence::transport::mpi_communicator;
namespace ps = cadence::exchange::detail;

// 4 MiB of floats: far above any eager limit, so a send completes only once its peer takes it.
constexpr std::size_t lent_model = std::size_t{1} << 20;
constexpr int go_tag = 4343, verdict_tag = 4344;  // plain MPI on MPI_COMM_WORLD, beside the test

cadence::exchange::ps_options lone_worker() {
  cadence::exchange::ps_options o;
  o.servers = 1;
  o.initial_workers = 1;  // rank 1; ranks 2 and 3 stay out
  o.transfer_timeout = 300ms;
  return o;
}

void tell(int to, int tag, int v) { MPI_Send(&v, 1, MPI_INT, to, tag, MPI_COMM_WORLD); }
int hear(int from, int tag) {
  int v = 0;
  MPI_Recv(&v, 1, MPI_INT, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return v;
}

// Memory freed just before is likely handed out to these, filled with -1: a late read of a
// freed buffer would see them (or, under ASan, be reported).
std::vector<std::vector<float>> scribble() { return std::vector<std::vector<float>>(4, std::vector<float>(lent_model, -1.0f)); }

bool all_equal(const std::vector<float>& v, float x) {
  return std::all_of(v.begin(), v.end(), [x](float y) { return y == x; });
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// What both tests start from: this process's rank and a communicator over MPI_COMM_WORLD, the
// lone worker's tags and the size of the lent model in bytes.
struct lent_model_test {
  const int rank = world_rank();
  mpi_communicator c{MPI_COMM_WORLD, {}, 30s};
  const ps::ps_tags tags{lone_worker().tag_base};
  const std::size_t bytes = lent_model * sizeof(float);
};

}  // namespace

TEST_CASE_FIXTURE(lent_model_test,
                  "parameter server over MPI, default options: a server that never takes the gradient fails the push "
                  "naming it, and the send MPI cannot withdraw later reads what was pushed, not freed memory" *
                  doctest::timeout(120)) {
  if (rank == 0) {  // a server that answers the pull, then stalls until the worker gave up
    ps::ps_header h;
    c.recv(&h, sizeof h, 1, tags.control, 30s);
    REQUIRE(h.kind == static_cast<std::int64_t>(ps::ps_kind::pull));
    const auto reply = ps::make_header(ps::ps_kind::reply, 0, 0, static_cast<std::int64_t>(lent_model), h.request);
    const std::vector<float> weights(lent_model, 2.0f);
    c.send(&reply, sizeof reply, 1, tags.reply, 30s);
    c.send(weights.data(), bytes, 1, tags.reply_data, 30s);
    CHECK(hear(1, go_tag) == 1);  // the push failed, its gradient is freed and reused
    c.recv(&h, sizeof h, 1, tags.control, 30s);
    CHECK(h.kind == static_cast<std::int64_t>(ps::ps_kind::push));
    std::vector<float> got(lent_model, 0.0f);
    c.recv(got.data(), bytes, 1, tags.data, 30s);  // the late peer takes the abandoned send
    const bool intact = all_equal(got, 7.0f);
    CHECK(intact);
    tell(1, verdict_tag, intact ? 1 : 0);
  } else if (rank == 1) {
    std::string error;
    {
      cadence::exchange::ps_worker<mpi_communicator> w(c, lent_model, lone_worker());
      std::vector<float> weights(lent_model, 0.0f);
      auto gradient = std::make_unique<std::vector<float>>(lent_model, 7.0f);
      try {
        w.push_pull(gradient->data(), weights.data());
      } catch (const cadence::transport_error& e) {
        error = e.what();
      }
      CHECK(all_equal(weights, 2.0f));  // the pull before it went through
    }  // the worker and the caller's gradient are gone
    INFO(error);
    CHECK(error.find("push_pull after 0 iterations: sending to server rank 0 failed") != std::string::npos);
    CHECK(error.find("deadline") != std::string::npos);
    const auto junk = scribble();
    tell(0, go_tag, 1);
    CHECK(hear(0, verdict_tag) == 1);  // MPI keeps progressing the send while this waits
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE_FIXTURE(lent_model_test,
                  "parameter server over MPI, default options: a reply the worker never takes drops it as lost, and "
                  "the version it reads outlives the server for the send MPI cannot withdraw" *
                  doctest::timeout(120)) {
  if (rank == 0) {
    cadence::exchange::ps_stats stats;
    {
      const std::vector<float> initial(lent_model, 3.0f);
      cadence::exchange::parameter_server<mpi_communicator, cadence::any_controller, float> server(
          c, lent_model, initial.data(), cadence::make_controller("asp", 1), cadence::exchange::sgd<float>{},
          lone_worker());
      server.run();  // returns once its only worker is dropped
      stats = server.stats();
    }  // the server is gone; its reply's send is not
    REQUIRE(stats.evictions.size() == 1);
    CHECK(stats.evictions[0].reason == "lost: its reply was not taken within transfer_timeout");
    const auto junk = scribble();
    tell(1, go_tag, 1);
    CHECK(hear(1, verdict_tag) == 1);
  } else if (rank == 1) {  // a worker that pulls, then takes its reply only after the server is gone
    const auto pull = ps::make_header(ps::ps_kind::pull, 0, 0, static_cast<std::int64_t>(lent_model), 1);
    c.send(&pull, sizeof pull, 0, tags.control, 30s);
    CHECK(hear(0, go_tag) == 1);
    ps::ps_header h;
    c.recv(&h, sizeof h, 0, tags.reply, 30s);
    CHECK(h.status == 0);
    CHECK(h.count == static_cast<std::int64_t>(lent_model));
    std::vector<float> got(lent_model, 0.0f);
    c.recv(got.data(), bytes, 0, tags.reply_data, 30s);
    const bool intact = all_equal(got, 3.0f);
    CHECK(intact);
    tell(0, verdict_tag, intact ? 1 : 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
