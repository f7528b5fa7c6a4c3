// cadence-bench-ps: the parameter server's push+pull round trip against a raw send/recv
// ping-pong of the same bytes over the same backend, interleaved (raw block, ours block, ...),
// and, with more than one worker, the server's throughput against raw echoes.
//
//   mpirun -np 2 cadence-bench-ps --backend mpi [--json] [--no-bounce] [--sgd]
//   mpirun -np 5 cadence-bench-ps --backend mpi --throughput      (1 server, 4 workers)
//
// Round trip: rank 1 pushes a gradient of B bytes and pulls B bytes of weights from server
// rank 0 (one server, policy asp, so nobody waits on a policy); raw: rank 1 MPI_Send's B bytes
// to rank 0, which MPI_Send's B bytes back. The update rule is a no-op unless --sgd: it is the
// integrator's work, not the adapter's. Sizes 4 KiB to 16 MiB by factors of 4; per size the
// pair of blocks with the median ratio is reported. Read the ratios, not the absolute times:
// these machines are shared.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/mpi/communicator.hpp>

#include <mpi.h>

#include "support/flags.hpp"
#include "support/measure.hpp"
#include "support/mpi.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using steady = std::chrono::steady_clock;
using cadence::tools::usage_error;

struct config : cadence_bench::common_config {
  config() {
    min_bytes = 4 << 10;  // not a flag
    max_bytes = 16 << 20;
  }
  bool bounce = true;
  bool sgd = false;
  bool throughput = false;
};

struct no_update {
  void operator()(float*, const float*, std::size_t, worker_id) const {}
};

struct row {
  std::size_t bytes;
  double raw_us;
  double ours_us;
};

int iterations_for(std::size_t bytes) { return cadence_bench::iterations_for(bytes, std::size_t{128} << 20, 2000); }

constexpr int raw_tag = 11;

// One block of `iters` raw ping-pongs between worker ranks and rank 0; returns µs per round
// trip on each worker (rank 0 echoes `iters * workers` messages in arrival order).
double raw_block(MPI_Comm comm, int rank, int workers, std::vector<float>& buf, int iters) {
  const int n = static_cast<int>(buf.size() * sizeof(float));
  MPI_Barrier(comm);
  const auto t0 = steady::now();
  if (rank == 0) {
    for (int i = 0; i < iters * workers; ++i) {
      MPI_Status st;
      MPI_Recv(buf.data(), n, MPI_BYTE, MPI_ANY_SOURCE, raw_tag, comm, &st);
      MPI_Send(buf.data(), n, MPI_BYTE, st.MPI_SOURCE, raw_tag, comm);
    }
  } else if (rank <= workers) {
    for (int i = 0; i < iters; ++i) {
      MPI_Send(buf.data(), n, MPI_BYTE, 0, raw_tag, comm);
      MPI_Recv(buf.data(), n, MPI_BYTE, 0, raw_tag, comm, MPI_STATUS_IGNORE);
    }
  }
  return std::chrono::duration<double, std::micro>(steady::now() - t0).count() / iters;
}

// One block through the parameter server: a fresh server and workers (construction and the
// initial pull are not timed), `iters` push_pulls per worker, finish.
template <class Update>
double ours_block(mpi_communicator& comm, MPI_Comm raw, int workers, std::vector<float>& buf,
                  int iters) {
  ps_options o;
  o.servers = 1;
  const int rank = comm.rank();
  double us = 0;
  MPI_Barrier(raw);
  if (rank == 0) {
    parameter_server<mpi_communicator, any_controller, float, Update> server(
        comm, buf.size(), buf.data(), make_controller("asp", static_cast<std::size_t>(comm.size() - 1)),
        Update{}, o);
    server.run();
  } else {
    ps_worker<mpi_communicator> worker(comm, buf.size(), o);
    std::vector<float> weights(buf.size());
    worker.pull(weights.data());
    const auto t0 = steady::now();
    if (rank <= workers)
      for (int i = 0; i < iters; ++i) worker.push_pull(buf.data(), weights.data());
    us = std::chrono::duration<double, std::micro>(steady::now() - t0).count() / iters;
    worker.finish();
  }
  return us;
}

double average_over_workers(MPI_Comm comm, int rank, int workers, double v) {
  double mine = (rank >= 1 && rank <= workers) ? v : 0.0, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, comm);
  return sum / workers;
}

std::vector<row> measure(mpi_communicator& comm, MPI_Comm raw, const config& cfg, int workers,
                         const std::vector<std::size_t>& sizes) {
  std::vector<row> rows;
  const int rank = comm.rank();
  for (std::size_t bytes : sizes) {
    std::vector<float> buf(bytes / sizeof(float), 0.0f);
    const int iters = iterations_for(bytes) / workers + 1;
    auto ours = [&] {
      return cfg.sgd ? ours_block<sgd<float>>(comm, raw, workers, buf, iters)
                     : ours_block<no_update>(comm, raw, workers, buf, iters);
    };
    raw_block(raw, rank, workers, buf, 2);  // warm-up: connections, caches
    ours();
    std::vector<std::pair<double, double>> pairs;
    for (int rep = 0; rep < cfg.reps; ++rep) {
      const double r = average_over_workers(raw, rank, workers, raw_block(raw, rank, workers, buf, iters));
      const double o = average_over_workers(raw, rank, workers, ours());
      pairs.emplace_back(r, o);
    }
    const auto mid = cadence_bench::median_pair(pairs);
    rows.push_back({bytes, mid.first, mid.second});
  }
  return rows;
}

// GB/s moved by one round trip (the bytes go both ways).
double bandwidth(std::size_t bytes, double us, int workers) {
  return 2.0 * static_cast<double>(bytes) * workers / (us * 1e-6) / 1e9;
}

void print(const std::vector<row>& rows, const config& cfg, int workers) {
  const char* op = workers == 1 ? "push_pull" : "push_pull_throughput";
  if (cfg.json) {
    std::printf("[");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const row& r = rows[i];
      std::printf("%s\n  {\"backend\": \"%s\", \"op\": \"%s\", \"workers\": %d, \"bytes\": %zu, "
                  "\"raw_us\": %.3f, \"ours_us\": %.3f, \"raw_gbps\": %.4f, \"ours_gbps\": %.4f}",
                  i ? "," : "", cfg.backend.c_str(), op, workers, r.bytes, r.raw_us, r.ours_us,
                  bandwidth(r.bytes, r.raw_us, workers), bandwidth(r.bytes, r.ours_us, workers));
    }
    std::printf("\n]\n");
    return;
  }
  std::printf("%s, backend %s, 1 server, %d worker(s)%s (GB/s both ways, all workers)\n", op,
              cfg.backend.c_str(), workers, cfg.sgd ? ", sgd update" : ", no-op update");
  std::printf("%12s %12s %12s %10s %10s %9s %10s\n", "bytes", "raw us", "ours us", "raw GB/s",
              "ours GB/s", "ours/raw", "added us");
  for (const row& r : rows)
    std::printf("%12zu %12.2f %12.2f %10.3f %10.3f %9.2f %10.2f\n", r.bytes, r.raw_us, r.ours_us,
                bandwidth(r.bytes, r.raw_us, workers), bandwidth(r.bytes, r.ours_us, workers),
                r.raw_us / r.ours_us, r.ours_us - r.raw_us);
}

constexpr const char* usage_text =
    "usage: mpirun -np 2 cadence-bench-ps --backend mpi [--json] [--reps R]\n"
    "         [--max-bytes B] [--no-bounce] [--sgd]\n"
    "       mpirun -np W+1 cadence-bench-ps --backend mpi --throughput\n"
    "  --throughput   every worker pushes at once (sizes 64 KiB, 1 MiB, 4 MiB)\n"
    "  --no-bounce    mpi_options::bounce_buffers = false\n"
    "  --sgd          apply SGD on the server (default: a no-op update rule)\n"
    "  --help         this text\n";

int run(int argc, char** argv) {
  config cfg;
  const bool help = !cadence_bench::read_flags(
      argc, argv, cfg, {"--backend", "--json", "--reps", "--max-bytes"},
      {{"--no-bounce", &cfg.bounce, false}, {"--sgd", &cfg.sgd, true},
       {"--throughput", &cfg.throughput, true}},
      usage_text);
  if (help) return 0;
  if (cfg.backend != "mpi") throw cadence_bench::backend_error(cfg.backend, "mpi");
  if (cfg.max_bytes < cfg.min_bytes || cfg.max_bytes % sizeof(float) != 0)
    throw usage_error("--max-bytes: must be a multiple of 4, at least 4096, got " +
                      std::to_string(cfg.max_bytes));
  return cadence_bench::run_mpi_rank("cadence-bench-ps", [&](int rank, int size, MPI_Comm raw) {
    if (size < 2) {
      if (rank == 0) std::fprintf(stderr, "cadence-bench-ps: run under mpirun -np 2 or more\n");
      return 2;
    }
    mpi_options options;
    options.bounce_buffers = cfg.bounce;
    mpi_communicator comm(MPI_COMM_WORLD, options);
    const int workers = cfg.throughput ? size - 1 : 1;
    std::vector<std::size_t> sizes;
    if (cfg.throughput) {
      sizes = {std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{4} << 20};
    } else {
      for (std::size_t b = cfg.min_bytes; b < cfg.max_bytes; b *= 4) sizes.push_back(b);
      sizes.push_back(cfg.max_bytes);
    }
    const auto rows = measure(comm, raw, cfg, workers, sizes);
    if (rank == 0) print(rows, cfg, workers);
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) { return cadence::tools::guarded_main("cadence-bench-ps", run, argc, argv); }
