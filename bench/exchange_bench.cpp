// cadence-bench-exchange: the collective adapters (cadence/exchange/) against a raw all-reduce
// of the same buffers, interleaved, measured as nccl-tests does (warm-up, N back-to-back
// operations, time averaged over ranks; algbw = bytes / t, busbw = algbw * 2(n-1)/n).
//
//   cadence-bench-exchange --backend inproc [--ranks N] [--json]
//   mpirun -np 2 cadence-bench-exchange --backend mpi [--json]
//
// Ops (the "op" field): "bsp_allreduce" is bucketed_allreducer::average() over the buffer
// registered as 16 tensors (fused into 25 MiB buckets, copied in and out);
// "bsp_allreduce_views" the same 16 tensors as bucket views (add_view: no copies); "elastic_sync" is
// one elastic_averager::sync() of the buffer (record all-gather, merge all-reduce, plan, hash
// check). Raw is one all-reduce (sum) of the whole buffer through the same communicator, so
// the ratio is the adapter's own cost; --raw-mpi compares against MPI_Allreduce instead (the
// communicator's cost against MPI is cadence-bench-transport's table). The JSON rows have the
// fields of cadence-bench-transport. These machines are shared: read the ratios, not the times.
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/transport/inproc.hpp>
#if defined(CADENCE_BENCH_WITH_MPI)
#include <cadence/transport/mpi/communicator.hpp>

#include <mpi.h>

#include "support/mpi.hpp"
#endif

#include "support/flags.hpp"
#include "support/measure.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace cadence::transport;
using namespace cadence::exchange;
using steady = std::chrono::steady_clock;
using cadence::tools::usage_error;

struct config : cadence_bench::common_config {
  config() {
    min_bytes = 1024;
    max_bytes = std::size_t{16} << 20;
  }
  bool raw_backend = false;  // mpi: raw is MPI_Allreduce instead of the communicator's allreduce
};

struct row {
  std::string op;
  std::size_t bytes;
  int ranks;
  double raw_us, ours_us;
};

// What one rank runs: `raw` and `ours` act on the buffer given to prepare(); `average` returns
// a value's mean over ranks and lines the ranks up.
struct rank_ops {
  int rank = 0, size = 1;
  std::function<void(float*, std::size_t)> raw;
  // (Re)binds the adapter to the buffer; returns the buffer to use instead, or nullptr.
  std::function<float*(float*, std::size_t)> prepare;
  std::function<void()> ours;
  std::function<double(double)> average;
};

int iterations_for(std::size_t bytes) { return cadence_bench::iterations_for(bytes, std::size_t{128} << 20, 500); }

std::vector<row> run_rank(const std::string& op, rank_ops& ops, const config& cfg) {
  std::vector<row> rows;
  std::vector<std::size_t> sizes;
  for (std::size_t b = cfg.min_bytes; b < cfg.max_bytes; b *= 4) sizes.push_back(b);
  sizes.push_back(cfg.max_bytes);
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> own(count);
    float* buf = ops.prepare(own.data(), count);
    if (buf == nullptr) buf = own.data();
    std::fill(buf, buf + count, static_cast<float>(ops.rank) * 2);
    ops.ours();  // correctness: the average of 2r is n - 1 exactly
    for (std::size_t i = 0; i < count; ++i)
      if (buf[i] != static_cast<float>(ops.size - 1))
        throw std::runtime_error(op + ": wrong average at " + std::to_string(bytes) + " bytes");
    std::fill(buf, buf + count, 0.0f);
    const int iters = iterations_for(bytes);
    for (int w = 0; w < 2; ++w) {
      ops.raw(buf, count);
      ops.ours();
    }
    std::vector<std::pair<double, double>> pairs;
    for (int rep = 0; rep < cfg.reps; ++rep) {
      ops.average(0);
      auto t0 = steady::now();
      for (int i = 0; i < iters; ++i) ops.raw(buf, count);
      const double raw = ops.average(std::chrono::duration<double, std::micro>(steady::now() - t0).count() / iters);
      ops.average(0);
      t0 = steady::now();
      for (int i = 0; i < iters; ++i) ops.ours();
      const double ours = ops.average(std::chrono::duration<double, std::micro>(steady::now() - t0).count() / iters);
      pairs.emplace_back(raw, ours);
    }
    const auto mid = cadence_bench::median_pair(pairs);
    rows.push_back({op, bytes, ops.size, mid.first, mid.second});
  }
  return rows;
}

double busbw(const row& r, double us) { return cadence_bench::allreduce_busbw(r.bytes, r.ranks, us); }

void print(const std::vector<row>& rows, const config& cfg) {
  if (cfg.json) {
    std::printf("[");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const row& r = rows[i];
      std::printf("%s\n  {\"backend\": \"%s\", \"op\": \"%s\", \"bytes\": %zu, \"ranks\": %d, "
                  "\"raw_us\": %.3f, \"ours_us\": %.3f, \"raw_busbw\": %.4f, \"ours_busbw\": %.4f}",
                  i ? "," : "", cfg.backend.c_str(), r.op.c_str(), r.bytes, r.ranks, r.raw_us,
                  r.ours_us, busbw(r, r.raw_us), busbw(r, r.ours_us));
    }
    std::printf("\n]\n");
    return;
  }
  std::printf("collective adapters vs raw all-reduce, backend %s, %d ranks (busbw in GB/s)\n",
              cfg.backend.c_str(), rows.empty() ? 0 : rows.front().ranks);
  std::printf("%-20s %10s %10s %10s %10s %10s %9s\n", "op", "bytes", "raw us", "ours us",
              "raw busbw", "ours busbw", "ours/raw");
  for (const row& r : rows)
    std::printf("%-20s %10zu %10.1f %10.1f %10.3f %10.3f %8.1f%%\n", r.op.c_str(), r.bytes,
                r.raw_us, r.ours_us, busbw(r, r.raw_us), busbw(r, r.ours_us),
                100.0 * busbw(r, r.ours_us) / busbw(r, r.raw_us));
}

// Both adapters on one communicator, for one rank.
template <class C>
std::vector<row> run_adapters(C& comm, rank_ops ops, const config& cfg) {
  std::vector<row> rows;
  std::unique_ptr<bucketed_allreducer<C>> bsp;
  ops.prepare = [&](float* b, std::size_t n) -> float* {
    bsp = std::make_unique<bucketed_allreducer<C>>(comm);
    const std::size_t piece = n / 16;
    for (std::size_t k = 0; k < 16; ++k) bsp->add(b + k * piece, k == 15 ? n - 15 * piece : piece);
    return nullptr;
  };
  ops.ours = [&] { bsp->average(); };
  for (auto& r : run_rank("bsp_allreduce", ops, cfg)) rows.push_back(r);
  // The same 16 tensors as bucket views: one bucket, reduced in place (the raw all-reduce
  // runs on the same memory).
  ops.prepare = [&](float*, std::size_t n) -> float* {
    bucketed_allreducer_options o;
    o.bucket_bytes = std::max(o.bucket_bytes, n * sizeof(float));
    bsp = std::make_unique<bucketed_allreducer<C>>(comm, o);
    const std::size_t piece = n / 16;
    float* first = nullptr;
    for (std::size_t k = 0; k < 16; ++k) {
      float* p = bsp->template add_view<float>(k == 15 ? n - 15 * piece : piece);
      if (k == 0) first = p;
    }
    return first;
  };
  for (auto& r : run_rank("bsp_allreduce_views", ops, cfg)) rows.push_back(r);
  bsp.reset();

  std::unique_ptr<elastic_averager<C>> avg;
  float* buf = nullptr;
  std::size_t count = 0;
  ops.prepare = [&](float* b, std::size_t n) -> float* {
    avg = std::make_unique<elastic_averager<C>>(comm, "elastic:4");
    buf = b;
    count = n;
    return nullptr;
  };
  ops.ours = [&] {
    while (!avg->step_done(1000)) {
    }
    avg->sync(tensor_ref(buf, count));
  };
  for (auto& r : run_rank("elastic_sync", ops, cfg)) rows.push_back(r);
  return rows;
}

std::vector<row> run_inproc(const config& cfg) {
  inproc_world world(cfg.ranks);
  cadence_bench::summing_barrier sync(cfg.ranks);
  std::vector<row> rows;
  cadence_bench::run_ranks_as_threads(cfg.ranks, [&](int r) {
    auto comm = world.join(r);
    rank_ops ops;
    ops.rank = r;
    ops.size = cfg.ranks;
    ops.raw = [&](float* b, std::size_t n) {
      comm.allreduce(b, n, dtype::f32, reduce_op::sum, std::chrono::seconds(60));
    };
    ops.average = [&](double v) { return sync.arrive_and_sum(v) / cfg.ranks; };
    auto mine = run_adapters(comm, ops, cfg);
    if (r == 0) rows = std::move(mine);
  });
  return rows;
}

#if defined(CADENCE_BENCH_WITH_MPI)
int run_mpi(const config& cfg) {
  return cadence_bench::run_mpi_rank("cadence-bench-exchange", [&](int rank, int size, MPI_Comm raw) {
    mpi_communicator comm(MPI_COMM_WORLD, mpi_options{});
    rank_ops ops;
    ops.rank = rank;
    ops.size = size;
    ops.raw = [&](float* b, std::size_t n) {
      if (cfg.raw_backend)
        MPI_Allreduce(MPI_IN_PLACE, b, static_cast<int>(n), MPI_FLOAT, MPI_SUM, raw);
      else
        comm.allreduce(b, n, dtype::f32, reduce_op::sum, std::chrono::seconds(60));
    };
    ops.average = [&](double v) { return cadence_bench::mpi_average(raw, v); };
    const auto rows = run_adapters(comm, ops, cfg);
    if (rank == 0) print(rows, cfg);
    return 0;
  });
}
#endif

constexpr const char* usage_text =
    "usage: cadence-bench-exchange --backend inproc|mpi [--ranks N] [--json]\n"
    "         [--min-bytes B] [--max-bytes B] [--reps R]\n"
    "  --ranks N      threads for inproc (default 2); under MPI, mpirun -np sets it\n"
    "  --min-bytes B  smallest buffer (default 1 KiB; sizes go x4 up to --max-bytes)\n"
    "  --max-bytes B  largest buffer (default 16 MiB)\n"
    "  --reps R       raw/ours pairs per size, median reported (default 5)\n"
    "  --raw-mpi      mpi: raw is MPI_Allreduce, not the communicator's allreduce\n"
    "  --help         this text\n";

int run(int argc, char** argv) {
  config cfg;
  const bool help = !cadence_bench::read_flags(
      argc, argv, cfg, {"--backend", "--ranks", "--json", "--min-bytes", "--max-bytes", "--reps"},
      {{"--raw-mpi", &cfg.raw_backend, true}}, usage_text);
  if (help) return 0;
  if (cfg.max_bytes < cfg.min_bytes || cfg.min_bytes < 64 || cfg.max_bytes % 64 != 0 ||
      cfg.min_bytes % 64 != 0)
    throw usage_error("--min-bytes and --max-bytes must be multiples of 64, min <= max, got " +
                      std::to_string(cfg.min_bytes) + " and " + std::to_string(cfg.max_bytes));
  if (cfg.backend == "inproc") {
    print(run_inproc(cfg), cfg);
    return 0;
  }
  if (cfg.backend == "mpi") {
#if defined(CADENCE_BENCH_WITH_MPI)
    return run_mpi(cfg);
#else
    throw cadence_bench::backend_not_built("MPI", "cadence::mpi");
#endif
  }
  throw cadence_bench::backend_error(cfg.backend, "inproc or mpi");
}

}  // namespace

int main(int argc, char** argv) {
  return cadence::tools::guarded_main("cadence-bench-exchange", run, argc, argv);
}
