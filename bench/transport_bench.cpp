// cadence-bench-transport: all-reduce through a Cadence communicator against the raw backend
// call on the same buffers, interleaved, measured as nccl-tests does (warm-up, N back-to-back
// operations, time averaged over ranks; algbw = bytes / t, busbw = algbw * 2(n-1)/n).
//
//   cadence-bench-transport --backend inproc [--ranks N] [--json]
//   mpirun -np 2 cadence-bench-transport --backend mpi [--json] [--no-bounce] [--no-verify]
//                                         [--no-ring]
//   cadence-bench-transport --backend gloo [--ranks N] [--json]   (ranks as threads, TCP on
//                                                                  127.0.0.1, a temp file store)
//   cadence-bench-transport --backend nccl [--ranks N] [--json]   (one thread per GPU)
//
// Raw: MPI_Allreduce for mpi; gloo::allreduce (gloo/allreduce.h, its ring) on the
// communicator's own gloo context for gloo; for nccl, ncclAllReduce on a communicator of its own
// (ncclCommInitAll) over the same device buffers, N back to back and one stream synchronize,
// against ours as N iallreduce and one wait on their handles; for inproc a plain
// shared-memory all-reduce among the same threads (each rank adds its buffer into a shared
// accumulator under a lock, then copies the sum out), the same data movement without matching,
// deadlines or failure handling. Not a
// Google Benchmark program: it must run as one job of several MPI processes or threads, and
// print one JSON array from one rank. These machines are shared: read the ratios, not the
// absolute times.
#include <cadence/transport/inproc.hpp>
#if defined(CADENCE_BENCH_WITH_MPI)
#include <cadence/transport/mpi/communicator.hpp>

#include <mpi.h>

#include "support/mpi.hpp"
#endif
#if defined(CADENCE_BENCH_WITH_NCCL)
#include <cadence/transport/nccl/communicator.hpp>

#include <cuda_runtime.h>
#include <nccl.h>
#endif
#if defined(CADENCE_BENCH_WITH_GLOO)
#include <cadence/transport/gloo/communicator.hpp>

#include <gloo/allreduce.h>
#include <gloo/math.h>

#include <filesystem>
#include <unistd.h>
#endif

#include "support/flags.hpp"
#include "support/measure.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace cadence::transport;
using steady = std::chrono::steady_clock;
using cadence::tools::usage_error;

struct config : cadence_bench::common_config {
  config() {
    min_bytes = 8;  // not a flag
    max_bytes = std::size_t{64} << 20;
  }
  bool bounce = true;
  bool verify = true;
  bool ring = true;
};

struct row {
  std::size_t bytes;
  int ranks;
  double raw_us;
  double ours_us;
};

// Operations one rank performs; `average` returns a value's mean over all ranks and doubles as
// the barrier that lines the ranks up before each timed block.
struct rank_ops {
  int rank = 0;
  int size = 1;
  std::function<void(float*, std::size_t)> raw;
  std::function<void(float*, std::size_t)> ours;
  // The one wait after a block of back-to-back operations (nccl: a stream synchronize for raw,
  // every work handle for ours); unset where each call waits for itself (the host backends).
  std::function<void()> raw_wait, ours_wait;
  std::function<double(double)> average;
  // Device backends: where the operations run (a device copy of the host buffer) and the copy
  // back for the correctness check. Unset: the host buffer itself.
  std::function<float*(const float*, std::size_t)> stage;
  std::function<void(float*, const float*, std::size_t)> unstage;
};

int iterations_for(std::size_t bytes) { return cadence_bench::iterations_for(bytes, std::size_t{256} << 20, 1000); }

double time_block(rank_ops& ops, const std::function<void(float*, std::size_t)>& op,
                  const std::function<void()>& wait, float* buf, std::size_t count, int iters) {
  ops.average(0);  // line up
  const auto t0 = steady::now();
  for (int i = 0; i < iters; ++i) op(buf, count);
  if (wait) wait();
  const double us = std::chrono::duration<double, std::micro>(steady::now() - t0).count() / iters;
  return ops.average(us);
}

std::vector<row> run_rank(rank_ops& ops, const config& cfg) {
  std::vector<row> rows;
  // 8 B, 64 B, ... by factors of 8, and max_bytes itself last (64 MiB by default).
  std::vector<std::size_t> sizes;
  for (std::size_t b = cfg.min_bytes; b < cfg.max_bytes; b *= 8) sizes.push_back(b);
  sizes.push_back(cfg.max_bytes);
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> buf(count);
    // Correctness first: both paths must produce the exact sum.
    auto stage = [&] { return ops.stage ? ops.stage(buf.data(), count) : buf.data(); };
    for (int which = 0; which < 2; ++which) {
      std::fill(buf.begin(), buf.end(), static_cast<float>(ops.rank + 1));
      float* p = stage();
      (which == 0 ? ops.raw : ops.ours)(p, count);
      if (const auto& w = which == 0 ? ops.raw_wait : ops.ours_wait) w();
      if (ops.unstage) ops.unstage(buf.data(), p, count);
      const float expected = static_cast<float>(ops.size * (ops.size + 1) / 2);
      if (std::any_of(buf.begin(), buf.end(), [&](float v) { return v != expected; }))
        throw std::runtime_error("wrong all-reduce result at " + std::to_string(bytes) + " bytes");
    }
    std::fill(buf.begin(), buf.end(), 0.0f);  // sums of zeros stay finite however often
    float* p = stage();
    const int iters = iterations_for(bytes);
    for (int w = 0; w < 2; ++w) {  // warm-up: caches, MPI's connections and buffers
      ops.raw(p, count);
      if (ops.raw_wait) ops.raw_wait();
      ops.ours(p, count);
      if (ops.ours_wait) ops.ours_wait();
    }
    std::vector<std::pair<double, double>> pairs;
    for (int rep = 0; rep < cfg.reps; ++rep) {
      const double raw = time_block(ops, ops.raw, ops.raw_wait, p, count, iters);
      const double ours = time_block(ops, ops.ours, ops.ours_wait, p, count, iters);
      pairs.emplace_back(raw, ours);
    }
    // The pair with the median ratio: one noisy block does not decide the result.
    const auto mid = cadence_bench::median_pair(pairs);
    rows.push_back({bytes, ops.size, mid.first, mid.second});
  }
  return rows;
}

double busbw(const row& r, double us) { return cadence_bench::allreduce_busbw(r.bytes, r.ranks, us); }

void print(const std::vector<row>& rows, const config& cfg) {
  if (cfg.json) {
    std::printf("[");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const row& r = rows[i];
      std::printf("%s\n  {\"backend\": \"%s\", \"op\": \"allreduce\", \"bytes\": %zu, \"ranks\": %d, "
                  "\"raw_us\": %.3f, \"ours_us\": %.3f, \"raw_busbw\": %.4f, \"ours_busbw\": %.4f}",
                  i ? "," : "", cfg.backend.c_str(), r.bytes, r.ranks, r.raw_us, r.ours_us,
                  busbw(r, r.raw_us), busbw(r, r.ours_us));
    }
    std::printf("\n]\n");
    return;
  }
  std::printf("all-reduce f32 sum, backend %s, %d ranks (busbw in GB/s)\n", cfg.backend.c_str(),
              rows.empty() ? 0 : rows.front().ranks);
  std::printf("%12s %12s %12s %10s %10s %8s\n", "bytes", "raw us", "ours us", "raw busbw",
              "ours busbw", "ours/raw");
  for (const row& r : rows)
    std::printf("%12zu %12.2f %12.2f %10.3f %10.3f %8.2f\n", r.bytes, r.raw_us, r.ours_us,
                busbw(r, r.raw_us), busbw(r, r.ours_us), r.ours_us / r.raw_us);
}

// ---- ranks as threads (inproc, gloo, nccl) ----

// A thread rank's operations but `raw`: ours is comm's all-reduce, and the average goes over
// the threads' barrier.
template <class Comm>
rank_ops thread_rank_ops(int rank, const config& cfg, Comm& comm, cadence_bench::summing_barrier& sync) {
  rank_ops ops;
  ops.rank = rank;
  ops.size = cfg.ranks;
  ops.ours = [&comm](float* b, std::size_t n) {
    comm.allreduce(b, n, dtype::f32, reduce_op::sum, std::chrono::seconds(60));
  };
  ops.average = [&sync, n = cfg.ranks](double v) { return sync.arrive_and_sum(v) / n; };
  return ops;
}

// ---- inproc ----

// The raw in-process all-reduce: accumulate under a lock, wait for all, copy out, wait again
// (so nobody starts the next accumulation while another still reads the sum).
class plain_shared_allreduce {
public:
  explicit plain_shared_allreduce(int n) : n_(n), barrier_(n) {}
  void run(float* buf, std::size_t count) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (contributed_++ == 0) {
        acc_.assign(buf, buf + count);
      } else {
        for (std::size_t i = 0; i < count; ++i) acc_[i] += buf[i];
      }
      if (contributed_ == n_) contributed_ = 0;
    }
    barrier_.arrive_and_sum(0);
    std::memcpy(buf, acc_.data(), count * sizeof(float));
    barrier_.arrive_and_sum(0);
  }

private:
  std::mutex m_;
  const int n_;
  int contributed_ = 0;
  std::vector<float> acc_;
  cadence_bench::summing_barrier barrier_;
};

std::vector<row> run_inproc(const config& cfg) {
  inproc_world world(cfg.ranks);
  cadence_bench::summing_barrier sync(cfg.ranks);
  plain_shared_allreduce raw(cfg.ranks);
  std::vector<row> rows;
  cadence_bench::run_ranks_as_threads(cfg.ranks, [&](int r) {
    auto comm = world.join(r);
    rank_ops ops = thread_rank_ops(r, cfg, comm, sync);
    ops.raw = [&](float* b, std::size_t n) { raw.run(b, n); };
    auto mine = run_rank(ops, cfg);
    if (r == 0) rows = std::move(mine);
  });
  return rows;
}

// ---- gloo: ranks as threads, each with its own gloo context over TCP on 127.0.0.1 ----

#if defined(CADENCE_BENCH_WITH_GLOO)
std::vector<row> run_gloo(const config& cfg) {
  std::string store = (std::filesystem::temp_directory_path() / "cadence-bench-gloo-XXXXXX").string();
  if (::mkdtemp(store.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  struct remove_on_exit {  // the store goes whether the ranks succeed or not
    const std::string& path;
    ~remove_on_exit() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_store{store};
  cadence_bench::summing_barrier sync(cfg.ranks);
  std::vector<row> rows;
  cadence_bench::run_ranks_as_threads(cfg.ranks, [&](int r) {
    gloo_options options;
    options.store_path = store;
    gloo_communicator comm(r, cfg.ranks, options, std::chrono::seconds(60));
    rank_ops ops = thread_rank_ops(r, cfg, comm, sync);
    ops.raw = [&](float* b, std::size_t n) {
      ::gloo::AllreduceOptions opts(comm.context());
      opts.setOutput(b, n);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(
          &::gloo::sum<float>));
      opts.setTag(1);
      opts.setTimeout(std::chrono::seconds(60));
      ::gloo::allreduce(opts);
    };
    auto mine = run_rank(ops, cfg);
    if (r == 0) rows = std::move(mine);
  });
  return rows;
}
#endif

// ---- mpi: one rank per process ----

#if defined(CADENCE_BENCH_WITH_MPI)
int run_mpi(const config& cfg) {
  return cadence_bench::run_mpi_rank("cadence-bench-transport", [&](int rank, int size, MPI_Comm raw) {
    mpi_options options;
    options.bounce_buffers = cfg.bounce;
    options.verify_before_posting = cfg.verify;
    if (!cfg.ring) options.ring_min_bytes = static_cast<std::size_t>(-1);
    mpi_communicator comm(MPI_COMM_WORLD, options);
    rank_ops ops;
    ops.rank = rank;
    ops.size = size;
    ops.raw = [&](float* b, std::size_t n) {
      MPI_Allreduce(MPI_IN_PLACE, b, static_cast<int>(n), MPI_FLOAT, MPI_SUM, raw);
    };
    ops.ours = [&](float* b, std::size_t n) {
      comm.allreduce(b, n, dtype::f32, reduce_op::sum, std::chrono::seconds(60));
    };
    ops.average = [&](double v) { return cadence_bench::mpi_average(raw, v); };
    const auto rows = run_rank(ops, cfg);
    if (rank == 0) print(rows, cfg);
    return 0;
  });
}
#endif

// ---- nccl: one thread per GPU, bootstrapped over the in-process communicator ----

#if defined(CADENCE_BENCH_WITH_NCCL)
std::vector<row> run_nccl(const config& cfg) {
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices < 1)
    throw std::runtime_error(std::string("the nccl backend needs a GPU: cudaGetDeviceCount: ") +
                             (probe != cudaSuccess ? cudaGetErrorString(probe) : "no device"));
  if (cfg.ranks > devices)
    throw std::runtime_error("--ranks " + std::to_string(cfg.ranks) + " needs as many GPUs; " +
                             std::to_string(devices) + " found (NCCL takes one rank per GPU)");
  // The raw side: a communicator of NCCL's own over the same GPUs, blocking as nccl-tests use it.
  std::vector<ncclComm_t> raw_comms(static_cast<std::size_t>(cfg.ranks));
  std::vector<int> devs(static_cast<std::size_t>(cfg.ranks));
  for (int r = 0; r < cfg.ranks; ++r) devs[static_cast<std::size_t>(r)] = r;
  if (ncclCommInitAll(raw_comms.data(), cfg.ranks, devs.data()) != ncclSuccess)
    throw std::runtime_error("ncclCommInitAll failed");
  struct destroy_on_exit {  // after every rank's thread has ended, whether they succeeded or not
    std::vector<ncclComm_t>& comms;
    ~destroy_on_exit() {
      for (auto c : comms) ncclCommDestroy(c);
    }
  } destroy_raw{raw_comms};
  const std::size_t max_count = cfg.max_bytes / sizeof(float);
  inproc_world boot(cfg.ranks);
  cadence_bench::summing_barrier sync(cfg.ranks);
  std::vector<row> rows;
  cadence_bench::run_ranks_as_threads(cfg.ranks, [&](int r) {
    float* dev = nullptr;
    // Declared before the communicator: dev is freed after it, whichever way the rank ends.
    std::unique_ptr<float, cudaError_t (*)(void*)> free_dev(nullptr, &cudaFree);
    auto b = boot.join(r);
    nccl_communicator comm(real_nccl_api(), b, r, {}, std::chrono::seconds(60));
    if (cudaMalloc(&dev, std::max<std::size_t>(max_count, 1) * sizeof(float)) != cudaSuccess)
      throw std::runtime_error("cudaMalloc failed");
    free_dev.reset(dev);
    auto stream = static_cast<cudaStream_t>(comm.stream());
    ncclComm_t raw = raw_comms[static_cast<std::size_t>(r)];
    rank_ops ops = thread_rank_ops(r, cfg, comm, sync);
    // Both on the communicator's stream, N back to back and one wait, as nccl-tests does: raw
    // synchronizes the stream once, ours waits for every work handle (each an event).
    ops.raw = [&](float* p, std::size_t n) {
      if (ncclAllReduce(p, p, n, ncclFloat32, ncclSum, raw, stream) != ncclSuccess)
        throw std::runtime_error("raw ncclAllReduce failed");
    };
    ops.raw_wait = [&] {
      if (cudaStreamSynchronize(stream) != cudaSuccess) throw std::runtime_error("cudaStreamSynchronize failed");
    };
    std::vector<nccl_work> handles;
    ops.ours = [&](float* p, std::size_t n) { handles.push_back(comm.iallreduce(p, n, dtype::f32, reduce_op::sum)); };
    ops.ours_wait = [&] {
      for (auto& h : handles) h.wait(std::chrono::seconds(60));
      handles.clear();
    };
    ops.stage = [&](const float* host, std::size_t n) {
      cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice);
      return dev;
    };
    ops.unstage = [&](float* host, const float* p, std::size_t n) {
      cudaMemcpy(host, p, n * sizeof(float), cudaMemcpyDeviceToHost);
    };
    auto mine = run_rank(ops, cfg);
    if (r == 0) rows = std::move(mine);
  });
  return rows;
}
#endif

constexpr const char* usage_text =
    "usage: cadence-bench-transport --backend inproc|mpi|gloo|nccl [--ranks N] [--json]\n"
    "         [--max-bytes B] [--reps R] [--no-bounce] [--no-verify] [--no-ring]\n"
    "  --ranks N      threads for inproc and gloo (default 2) or nccl (one per GPU,\n"
    "                 default 1); under MPI, mpirun -np sets it\n"
    "  --max-bytes B  largest all-reduce (default 64 MiB; sizes go 8 B, x8, ..., B)\n"
    "  --reps R       raw/ours pairs per size, median reported (default 5)\n"
    "  --no-bounce    mpi: mpi_options::bounce_buffers = false (broadcasts and sends)\n"
    "  --no-verify    mpi: mpi_options::verify_before_posting = false (broadcasts)\n"
    "  --no-ring      mpi: every all-reduce by recursive doubling (no ring)\n"
    "  --help         this text\n";

int run(int argc, char** argv) {
  config cfg;
  const bool help = !cadence_bench::read_flags(
      argc, argv, cfg, {"--backend", "--ranks", "--json", "--max-bytes", "--reps"},
      {{"--no-bounce", &cfg.bounce, false}, {"--no-verify", &cfg.verify, false},
       {"--no-ring", &cfg.ring, false}},
      usage_text);
  if (help) return 0;
  if (cfg.max_bytes < cfg.min_bytes || cfg.max_bytes % sizeof(float) != 0)
    throw usage_error("--max-bytes: must be a multiple of 4, at least 8, got " +
                      std::to_string(cfg.max_bytes));
  if (cfg.backend == "inproc") {
    print(run_inproc(cfg), cfg);
    return 0;
  }
  if (cfg.backend == "nccl") {
#if defined(CADENCE_BENCH_WITH_NCCL)
    if (!cfg.ranks_given) cfg.ranks = 1;
    print(run_nccl(cfg), cfg);
    return 0;
#else
    throw cadence_bench::backend_not_built("NCCL", "cadence::nccl");
#endif
  }
  if (cfg.backend == "gloo") {
#if defined(CADENCE_BENCH_WITH_GLOO)
    print(run_gloo(cfg), cfg);
    return 0;
#else
    throw cadence_bench::backend_not_built("gloo", "cadence::gloo");
#endif
  }
  if (cfg.backend == "mpi") {
#if defined(CADENCE_BENCH_WITH_MPI)
    return run_mpi(cfg);
#else
    throw cadence_bench::backend_not_built("MPI", "cadence::mpi");
#endif
  }
  throw cadence_bench::backend_error(cfg.backend, "inproc, mpi, gloo or nccl");
}

}  // namespace

int main(int argc, char** argv) {
  return cadence::tools::guarded_main("cadence-bench-transport", run, argc, argv);
}
