// cadence-bench-exchange: the collective adapters (cadence/exchange/) against the backend's native
// all-reduce of the same number of bytes, interleaved, measured as nccl-tests does (warm-up, N
// back-to-back operations, one wait, time averaged over ranks; algbw = bytes / t, busbw = algbw *
// 2(n-1)/n); and the bucketed all-reducer overlapping a backward stand-in.
//
//   cadence-bench-exchange --backend inproc|gloo [--ranks N] [--json]
//   mpirun -np 2 cadence-bench-exchange --backend mpi [--json]
//   cadence-bench-exchange --backend nccl [--ranks N] [--json]        (one thread per GPU)
//
// Raw is the backend's own all-reduce (sum) of one buffer of the same size: MPI_Allreduce (on a
// duplicate of MPI_COMM_WORLD), gloo::allreduce (gloo/allreduce.h, its ring, on the
// communicator's gloo context), ncclAllReduce N times back to back on a communicator of NCCL's own
// and one stream synchronize, and for inproc the communicator's all-reduce (the in-process
// backend has no other). Ours ("op"):
//  - bsp_allreduce: bucketed_allreducer::average() of 16 tensors in separate allocations, fused
//    into one bucket (copied in and out, divided inside the backend);
//  - bsp_allreduce_views: the same 16 tensors as bucket views (add_view: in place, no copies);
//  - periodic_sync: periodic_averager::sync() of the buffer as one tensor (in place);
//  - elastic_sync: elastic_averager::sync() of the buffer (record all-gather, merge, plan, hash
//    check);
//  - bsp_overlap (host backends): a backward stand-in on one core (arithmetic on a thread of its
//    own, 16 tensors, last first) while this thread, on another core, marks them ready and
//    drives 8 buckets of bucket views, sized to take about one all-reduce; raw_us is backward
//    then average() in sequence, ours_us the same overlapped; hidden = (compute + comm -
//    overlapped) / comm against hideable = min(compute, comm) / comm (measure_overlap() below),
//    and against cpu_hideable, which also counts the CPU the communication itself needs.
// The roofline (support/roofline.hpp): the run first measures this machine's memory copy
// bandwidth (one thread, two at once); each row's limit is raw_us + extra_bytes / copy rate,
// extra_bytes what its path must copy beyond the native all-reduce (bsp_allreduce: its 16
// tensors into the bucket and back, 2 x bytes; the in-place paths: 0), the copy rate the
// two-thread rate shared by the ranks copying at once (nccl: the GPU's device-to-device copy);
// of_native = raw/ours, of_limit = limit/ours (null for bsp_overlap, whose raw is not the
// native call).
// The JSON rows have the fields of cadence-bench-transport (plus compute_us, comm_us, hidden,
// hideable, of_hideable, pinned, comm_cpu_us, compute_cpu_us, ours_cpu_us, cores, cpu_hideable
// and of_cpu_hideable for bsp_overlap). These machines are shared: read the
// ratios, not the times.
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/transport/inproc.hpp>
#if defined(CADENCE_BENCH_WITH_MPI)
#include <cadence/transport/mpi/communicator.hpp>

#include <mpi.h>

#include "support/mpi.hpp"
#endif
#if defined(CADENCE_BENCH_WITH_GLOO)
#include <cadence/transport/gloo/communicator.hpp>

#include "support/raw_gloo.hpp"
#endif
#if defined(CADENCE_BENCH_WITH_NCCL)
#include <cadence/transport/nccl/communicator.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include "support/nccl.hpp"
#endif

#include "support/backends.hpp"
#include "support/backward.hpp"
#include "support/command_line.hpp"
#include "support/cpu_time.hpp"
#include "support/measure.hpp"
#include "support/report.hpp"
#include "support/roofline.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace cadence::transport;
using namespace cadence::exchange;
using steady = std::chrono::steady_clock;
using cadence::tools::usage_error;

struct config : cadence_bench::common_config {
  config() : common_config(1024, std::size_t{16} << 20) {}
  bool overlap = true;
  std::size_t part_bytes = bucketed_allreducer_options{}.part_bytes;  // bsp_allreduce's
  cadence_bench::copy_rates copy;  // the roofline's, measured before the ranks start
  double device_copy_gbps = 0;         // nccl: a device-to-device copy's rate (0: host memory)
};

struct row {
  std::string op;
  std::size_t bytes;
  int ranks;
  double raw_us, ours_us;
  double compute_us = 0, comm_us = 0;  // bsp_overlap
  bool pinned = false;                 // bsp_overlap: backward and communication on a core each
  // bsp_overlap: the CPU all ranks used per iteration of each block (negative: unknown), and the
  // cores they share
  double comm_cpu_us = -1, compute_cpu_us = -1, ours_cpu_us = -1;
  int cores = 0;
};

// What one rank runs. Buffers come from `buffer` (device memory for nccl) and are read and
// written through `load`/`store` for the checks.
struct rank_ops {
  int rank = 0, size = 1;
  std::function<void(float*, std::size_t)> raw;  // one native all-reduce (sum), maybe not waited
  std::function<void()> raw_wait;                // the one wait after a block of raws
  std::function<double(double)> average;         // a value's mean over ranks; lines the ranks up
  std::function<float*(std::size_t)> buffer;     // n floats, owned by the backend's runner
  std::function<void(float*, float, std::size_t)> fill;
  std::function<std::vector<float>(const float*, std::size_t)> load;
  bool one_process = true;  // the ranks are threads of this process (false: a process each, MPI)
};

int iterations_for(std::size_t bytes) { return cadence_bench::iterations_for(bytes, std::size_t{128} << 20, 500); }

// The mean of the per-iteration time of `iters` runs of f on every rank (one wait at the end).
// With `cpu_us`, also this process's CPU time per iteration over the same runs (negative where
// the platform has no CPU clock), not averaged.
double time_block(rank_ops& ops, int iters, const std::function<void()>& f, const std::function<void()>& end = {},
                  double* cpu_us = nullptr) {
  ops.average(0);
  const double c0 = cpu_us != nullptr ? cadence_bench::process_cpu_us() : 0;
  const auto t0 = steady::now();
  for (int i = 0; i < iters; ++i) f();
  if (end) end();
  const double wall = std::chrono::duration<double, std::micro>(steady::now() - t0).count() / iters;
  if (cpu_us != nullptr) *cpu_us = c0 < 0 ? -1.0 : (cadence_bench::process_cpu_us() - c0) / iters;
  return ops.average(wall);
}

// A block's time as time_block() measures it, and the CPU time (user and system) all ranks used
// per iteration of it: with ranks as threads, the process's CPU over the block, which every rank
// reads (the mean of their readings: they end a little apart); with a process per rank (MPI),
// the sum of the ranks' own. Negative where the platform has no CPU clock.
struct block_times {
  double wall_us, cpu_us;
};
block_times time_block_cpu(rank_ops& ops, int iters, const std::function<void()>& f) {
  double cpu = -1;
  const double wall = time_block(ops, iters, f, {}, &cpu);
  block_times t{wall, ops.average(cpu)};
  if (t.cpu_us >= 0 && !ops.one_process) t.cpu_us *= ops.size;
  return t;
}

// One adapter op against raw, interleaved, the median pair of cfg.reps.
row measure(const std::string& op, std::size_t bytes, rank_ops& ops, const config& cfg, float* raw_buf,
            const std::function<void()>& ours) {
  const std::size_t count = bytes / sizeof(float);
  const int iters = iterations_for(bytes);
  for (int w = 0; w < 2; ++w) {
    ops.raw(raw_buf, count);
    ops.raw_wait();
    ours();
  }
  std::vector<std::pair<double, double>> pairs;
  for (int rep = 0; rep < cfg.reps; ++rep) {
    const double raw = time_block(ops, iters, [&] { ops.raw(raw_buf, count); }, ops.raw_wait);
    const double mine = time_block(ops, iters, ours);
    pairs.emplace_back(raw, mine);
  }
  const auto mid = cadence_bench::median_pair(pairs);
  return {op, bytes, ops.size, mid.first, mid.second};
}

void check(const rank_ops& ops, const std::string& op, std::size_t bytes, const float* p, std::size_t n,
           float expected) {
  const std::vector<float> v = ops.load(p, n);
  for (float x : v)
    if (x != expected)
      throw std::runtime_error(op + ": wrong average at " + std::to_string(bytes) + " bytes: " + std::to_string(x) +
                               " instead of " + std::to_string(expected));
}

// The overlap of a backward pass with the bucketed all-reducer, against what it could hide.
// A backward stand-in (support/backward.hpp: arithmetic, no memory traffic) on a thread pinned
// to the first core this process may use computes 16 tensors' gradients, last first; this
// thread, pinned to the second, marks each ready as it comes (8 buckets of bucket views, so a
// launch copies nothing) and progresses the buckets in flight in between, waiting in the
// backend (poll_until) while the next gradient is not there. Every rank's backward shares the
// compute core and every rank's communication the other, and the backward is sized (units of
// arithmetic, timed with every rank computing at once) to take about one all-reduce.
// Measured per rep, each a block of iterations averaged over the ranks: comm (average() alone),
// compute (the backward alone), sequential (the backward, then average()), overlapped.
//   hidden      = (compute + comm - overlapped) / comm
//   hideable    = min(compute, comm) / comm         (a perfect overlap takes max(compute, comm))
//   of_hideable = hidden / hideable
// Beside the wall time of comm, compute and overlapped, the CPU all ranks used in them
// (time_block_cpu()), and the cores the process may use: the model above assumes the
// communication needs no CPU (a GPU's NCCL over NVLink), which loopback TCP or shared memory on a
// CPU does not. The CPU-aware limit (cpu_floor() below):
//   overlapped >= max(compute, comm, (compute_cpu + comm_cpu) / cores)
//   cpu_hideable    = (compute + comm - that) / comm
//   of_cpu_hideable = hidden / cpu_hideable
// Reported: each quantity's median over the reps; raw_us the sequential time (for reference:
// it also pays the hand-over from the backward thread to this one), ours_us the overlapped
// time.
template <class C>
row measure_overlap(C& comm, rank_ops& ops, const config& cfg, std::size_t bytes) {
  const std::size_t count = bytes / sizeof(float), piece = count / 16;
  bucketed_allreducer_options o;
  o.bucket_bytes = std::max<std::size_t>(bytes / 8, 64);
  bucketed_allreducer<C> red(comm, o);
  for (std::size_t k = 0; k < 16; ++k) (void)red.template add_view<float>(k == 15 ? count - 15 * piece : piece);
  const std::vector<int> cores = cadence_bench::allowed_cores();
  const int compute_core = cores.size() >= 2 ? cores[0] : -1;
  cadence_bench::backward_thread backward(compute_core);
  const cadence_bench::pinned_scope here(cores.size() >= 2 ? cores[1] : -1);
  const bool pinned = backward.pinned() && here.ok();
  const int iters = std::max(2, iterations_for(bytes) / 4);
  red.average();
  std::uint64_t units = 1;
  auto comm_only = [&] { red.average(); };
  auto compute_only = [&] {
    backward.start(16, units);
    backward.wait_for(16);
  };
  auto sequential = [&] {
    compute_only();
    red.average();
  };
  auto overlapped = [&] {
    backward.start(16, units);
    int marked = 0;
    while (marked < 16) {
      for (const int ready = backward.ready(); marked < ready; ++marked)
        red.mark_ready(static_cast<std::size_t>(15 - marked));
      if (marked == 16) break;
      // Buckets in flight: progress them a while, then look for the next gradient; none: sleep
      // until the next gradient comes.
      if (!red.poll_until(steady::now() + std::chrono::microseconds(20))) continue;
      backward.wait_for(marked + 1);
    }
    red.finish();
  };
  // Calibration: a unit's time with every rank computing at once; each rep then sizes the
  // backward (the same on every rank) to its own comm block at the latest unit time, so that
  // compute stays about one all-reduce on a machine whose load drifts.
  units = 64;
  double unit_us = time_block(ops, 3, compute_only) / (16.0 * static_cast<double>(units));
  struct rep_times {
    double comm, compute, seq, ovl;
    double comm_cpu, compute_cpu, ovl_cpu;
  };
  std::vector<rep_times> reps;
  for (int rep = 0; rep < cfg.reps; ++rep) {
    rep_times t{};
    const block_times c = time_block_cpu(ops, iters, comm_only);
    t.comm = c.wall_us;
    t.comm_cpu = c.cpu_us;
    units = static_cast<std::uint64_t>(std::max(1.0, ops.average(t.comm / unit_us / 16.0)));
    const block_times b = time_block_cpu(ops, iters, compute_only);
    t.compute = b.wall_us;
    t.compute_cpu = b.cpu_us;
    unit_us = t.compute / (16.0 * static_cast<double>(units));
    t.seq = time_block(ops, iters, sequential);
    const block_times v = time_block_cpu(ops, iters, overlapped);
    t.ovl = v.wall_us;
    t.ovl_cpu = v.cpu_us;
    reps.push_back(t);
  }
  // Each quantity's median over the reps: a machine whose load drifts between blocks moves one
  // block of a rep, not the median of each.
  const auto median = [&reps](double rep_times::*field) {
    std::vector<double> v;
    for (const rep_times& t : reps) v.push_back(t.*field);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  row r{"bsp_overlap", bytes, ops.size, median(&rep_times::seq), median(&rep_times::ovl)};
  r.compute_us = median(&rep_times::compute);
  r.comm_us = median(&rep_times::comm);
  r.pinned = pinned;
  r.comm_cpu_us = median(&rep_times::comm_cpu);
  r.compute_cpu_us = median(&rep_times::compute_cpu);
  r.ours_cpu_us = median(&rep_times::ovl_cpu);
  r.cores = static_cast<int>(cores.size());  // before this thread pinned itself
  return r;
}

template <class C>
std::vector<row> run_adapters(C& comm, rank_ops& ops, const config& cfg) {
  std::vector<row> rows;
  const bool host = !comm.capabilities().device_buffers;
  const float mean = static_cast<float>(ops.size - 1);  // of 2r over the ranks
  for (std::size_t bytes : cadence_bench::sizes(cfg.min_bytes, cfg.max_bytes, 4)) {
    const std::size_t count = bytes / sizeof(float), piece = count / 16;
    float* raw_buf = ops.buffer(count);
    ops.fill(raw_buf, 0.0f, count);
    // bsp_allreduce: 16 separate allocations, one fused bucket (in parts of --part-bytes).
    {
      bucketed_allreducer_options o;
      o.part_bytes = cfg.part_bytes;
      bucketed_allreducer<C> red(comm, o);
      std::vector<float*> t;
      for (std::size_t k = 0; k < 16; ++k) {
        const std::size_t n = k == 15 ? count - 15 * piece : piece;
        t.push_back(ops.buffer(n));
        ops.fill(t.back(), static_cast<float>(2 * ops.rank), n);
        red.add(t.back(), n);
      }
      red.average();
      check(ops, "bsp_allreduce", bytes, t.front(), piece, mean);
      for (std::size_t k = 0; k < 16; ++k) ops.fill(t[k], 0.0f, k == 15 ? count - 15 * piece : piece);
      rows.push_back(measure("bsp_allreduce", bytes, ops, cfg, raw_buf, [&] { red.average(); }));
    }
    // bsp_allreduce_views: the same as bucket views, one bucket, in place.
    {
      bucketed_allreducer_options o;
      o.bucket_bytes = std::max(o.bucket_bytes, bytes);
      bucketed_allreducer<C> red(comm, o);
      float* first = nullptr;
      for (std::size_t k = 0; k < 16; ++k) {
        float* p = red.template add_view<float>(k == 15 ? count - 15 * piece : piece);
        if (k == 0) first = p;
      }
      ops.fill(first, static_cast<float>(2 * ops.rank), count);
      red.average();
      check(ops, "bsp_allreduce_views", bytes, first, count, mean);
      ops.fill(first, 0.0f, count);
      rows.push_back(measure("bsp_allreduce_views", bytes, ops, cfg, raw_buf, [&] { red.average(); }));
    }
    // periodic_sync: one tensor, in place.
    {
      float* x = ops.buffer(count);
      periodic_averager<C> avg(comm, 1);
      ops.fill(x, static_cast<float>(2 * ops.rank), count);
      avg.step_done();
      avg.sync(tensor_ref(x, count));
      check(ops, "periodic_sync", bytes, x, count, mean);
      ops.fill(x, 0.0f, count);
      rows.push_back(measure("periodic_sync", bytes, ops, cfg, raw_buf, [&] {
        avg.step_done();
        avg.sync(tensor_ref(x, count));
      }));
    }
    // elastic_sync: records, merge, plan, hash check.
    if (host) {
      float* x = ops.buffer(count);
      elastic_averager<C> avg(comm, "elastic:4");
      ops.fill(x, static_cast<float>(2 * ops.rank), count);
      while (!avg.step_done(1000)) {
      }
      avg.sync(tensor_ref(x, count));
      check(ops, "elastic_sync", bytes, x, count, mean);
      ops.fill(x, 0.0f, count);
      rows.push_back(measure("elastic_sync", bytes, ops, cfg, raw_buf, [&] {
        while (!avg.step_done(1000)) {
        }
        avg.sync(tensor_ref(x, count));
      }));
    }
    // bsp_overlap: a backward stand-in on the compute core, the all-reducer on this thread.
    if (host && cfg.overlap) rows.push_back(measure_overlap(comm, ops, cfg, bytes));
  }
  return rows;
}

double busbw(const row& r, double us) { return cadence_bench::allreduce_busbw(r.bytes, r.ranks, us); }

// What the row's path must copy per all-reduce on each rank beyond the native call: the copying
// bucket moves its tensors into the bucket and back out; the views and merges work in place.
double extra_bytes(const row& r) { return r.op == "bsp_allreduce" ? 2.0 * static_cast<double>(r.bytes) : 0.0; }

// The rate of one rank's copies while every rank copies its bucket at once (nccl: each rank's
// own GPU).
double copy_rate(const row& r, const config& cfg) {
  return cfg.device_copy_gbps > 0 ? cfg.device_copy_gbps : cfg.copy.at(r.bytes).shared_rate(r.ranks);
}
// The model's terms: a perfect overlap takes max(compute, comm), so it hides min(compute, comm).
double hidden(const row& r) { return r.comm_us > 0 ? (r.compute_us + r.comm_us - r.ours_us) / r.comm_us : 0; }
double hideable(const row& r) { return r.comm_us > 0 ? std::min(r.compute_us, r.comm_us) / r.comm_us : 0; }
// The CPU-aware limit: the overlapped block does at least the CPU work of both blocks alone
// (all ranks' threads, the backend's and the kernel's work for them included) on the cores the
// ranks share, so it takes no less than max(compute, comm, (compute_cpu + comm_cpu) / cores);
// negative where the CPU time or the cores are unknown.
double cpu_floor(const row& r) {
  if (r.comm_cpu_us < 0 || r.compute_cpu_us < 0 || r.cores <= 0) return -1;
  return std::max({r.compute_us, r.comm_us, (r.compute_cpu_us + r.comm_cpu_us) / r.cores});
}
// What the CPU-aware limit lets an overlap hide, as hideable is for max(compute, comm) (<= it).
double cpu_hideable(const row& r) {
  return r.comm_us > 0 && cpu_floor(r) >= 0 ? (r.compute_us + r.comm_us - cpu_floor(r)) / r.comm_us : -1;
}

// The bsp_overlap line's CPU part: the blocks' CPU, the cores, and the CPU-aware limit.
std::string cpu_remark(const cadence_bench::row& j) {
  using cadence_bench::formatted;
  const auto us = [&](const char* key) {
    return j.at(key).is_null() ? std::string("-") : formatted("%.1f", j.at(key).get<double>());
  };
  const auto pct = [&](const char* key) {
    return j.at(key).is_null() ? std::string("-") : formatted("%.0f", 100.0 * j.at(key).get<double>());
  };
  return "; CPU: comm " + us("comm_cpu_us") + " us, backward " + us("compute_cpu_us") + " us, overlapped " +
         us("ours_cpu_us") + " us on " + std::to_string(j.at("cores").get<int>()) + " cores: cpu-hideable " +
         pct("cpu_hideable") + "%, " + pct("of_cpu_hideable") + "% of cpu-hideable";
}

// The rows with the keys of cadence-bench-transport's (bsp_overlap adds compute_us, comm_us,
// hidden, hideable, of_hideable, pinned, then the CPU's keys), and the table.
// Prints the rows as cfg asks; returns main's status, 0.
int print(const std::vector<row>& rows, const config& cfg) {
  using cadence::tools::decimals;
  std::vector<cadence_bench::row> out;
  for (const row& r : rows) {
    cadence_bench::row j = {{"backend", cfg.backend},
                            {"op", r.op},
                            {"bytes", r.bytes},
                            {"ranks", r.ranks},
                            {"raw_us", decimals(r.raw_us, 3)},
                            {"ours_us", decimals(r.ours_us, 3)},
                            {"raw_busbw", decimals(busbw(r, r.raw_us), 4)},
                            {"ours_busbw", decimals(busbw(r, r.ours_us), 4)}};
    if (r.op == "bsp_overlap")
      cadence_bench::add_no_roofline(j);
    else
      cadence_bench::add_roofline(j, r.raw_us, r.ours_us, extra_bytes(r), copy_rate(r, cfg));
    if (r.op == "bsp_overlap") {
      j["compute_us"] = decimals(r.compute_us, 3);
      j["comm_us"] = decimals(r.comm_us, 3);
      j["hidden"] = decimals(hidden(r), 4);
      j["hideable"] = decimals(hideable(r), 4);
      if (hideable(r) > 0)
        j["of_hideable"] = decimals(hidden(r) / hideable(r), 4);
      else
        j["of_hideable"] = nullptr;
      j["pinned"] = r.pinned;
      const auto or_null = [&](double v, int places) {
        return v >= 0 ? cadence::tools::json(decimals(v, places)) : cadence::tools::json(nullptr);
      };
      j["comm_cpu_us"] = or_null(r.comm_cpu_us, 3);
      j["compute_cpu_us"] = or_null(r.compute_cpu_us, 3);
      j["ours_cpu_us"] = or_null(r.ours_cpu_us, 3);
      j["cores"] = r.cores;
      // cpu_hideable may be negative (the CPU alone takes longer than both blocks in sequence)
      j["cpu_hideable"] = cpu_floor(r) >= 0 && r.comm_us > 0 ? cadence::tools::json(decimals(cpu_hideable(r), 4))
                                                             : cadence::tools::json(nullptr);
      if (cpu_floor(r) >= 0 && cpu_hideable(r) > 0)
        j["of_cpu_hideable"] = decimals(hidden(r) / cpu_hideable(r), 4);
      else
        j["of_cpu_hideable"] = nullptr;
    }
    out.push_back(std::move(j));
  }
  using cadence_bench::formatted;
  cadence_bench::table t;
  t.title = "collective adapters vs the native all-reduce, backend " + cfg.backend + ", " +
            std::to_string(rows.empty() ? 0 : rows.front().ranks) + " ranks (busbw in GB/s); " +
            (cfg.device_copy_gbps > 0 ? "device copy " + formatted("%.1f", cfg.device_copy_gbps) + " GB/s, host "
                                      : std::string()) +
            cfg.copy.note();
  t.columns = {cadence_bench::text_column("op", -20, "op")};
  for (auto& c : cadence_bench::raw_ours_columns(10, "%.1f", "busbw", "busbw")) t.columns.push_back(std::move(c));
  // the ratio of bus bandwidths: the inverse of the times' ratio
  t.columns.push_back(cadence_bench::ratio_column("ours/raw", 9, "raw_us", "ours_us", "%.1f%%", 100.0));
  for (auto& c : cadence_bench::roofline_columns()) t.columns.push_back(std::move(c));
  // bsp_overlap: its own line (its raw is the sequential run, not the native call).
  t.remark_after = 2;
  t.remark = [](const cadence_bench::row& j) {
    if (j.at("op") != "bsp_overlap") return std::string();
    const auto of = j.at("of_hideable");
    return "backward " + formatted("%.1f", j.at("compute_us").get<double>()) + " us, comm " +
           formatted("%.1f", j.at("comm_us").get<double>()) + " us, in sequence " +
           formatted("%.1f", j.at("raw_us").get<double>()) + " us, overlapped " +
           formatted("%.1f", j.at("ours_us").get<double>()) + " us: hidden " +
           formatted("%.0f", 100.0 * j.at("hidden").get<double>()) + "% of the comm, hideable " +
           formatted("%.0f", 100.0 * j.at("hideable").get<double>()) + "%, " +
           (of.is_null() ? std::string("-") : formatted("%.0f", 100.0 * of.get<double>())) + "% of hideable" +
           (j.at("pinned").get<bool>() ? "" : " (not pinned: fewer than 2 cores)") + cpu_remark(j);
  };
  cadence_bench::print(out, cfg, t);
  cfg.copy.report("cadence-bench-exchange");  // after the rows: stdout starts with them
  return 0;
}

// Host buffers, owned by the rank.
struct host_buffers {
  std::vector<std::unique_ptr<float[]>> blocks;
  void attach(rank_ops& ops) {
    ops.buffer = [this](std::size_t n) {
      blocks.emplace_back(new float[std::max<std::size_t>(n, 1)]());
      return blocks.back().get();
    };
    ops.fill = [](float* p, float v, std::size_t n) { std::fill(p, p + n, v); };
    ops.load = [](const float* p, std::size_t n) { return std::vector<float>(p, p + n); };
    ops.raw_wait = [] {};
  }
};

// A rank of cfg.ranks run as threads on host buffers: all of ops but raw.
rank_ops host_thread_ops(int r, const config& cfg, host_buffers& mem, cadence_bench::summing_barrier& sync) {
  rank_ops ops;
  mem.attach(ops);
  ops.rank = r;
  ops.size = cfg.ranks;
  ops.average = [&sync, n = cfg.ranks](double v) { return sync.arrive_and_sum(v) / n; };
  return ops;
}

std::vector<row> run_inproc(const config& cfg) {
  inproc_world world(cfg.ranks);
  cadence_bench::summing_barrier sync(cfg.ranks);
  return cadence_bench::rank0_result(cfg.ranks, [&](int r) {
    auto comm = world.join(r);
    host_buffers mem;
    rank_ops ops = host_thread_ops(r, cfg, mem, sync);
    ops.raw = [&](float* b, std::size_t n) {
      comm.allreduce(b, n, dtype::f32, reduce_op::sum, std::chrono::seconds(60));
    };
    return run_adapters(comm, ops, cfg);
  });
}

#if defined(CADENCE_BENCH_WITH_GLOO)
std::vector<row> run_gloo(const config& cfg) {
  const cadence_bench::temp_folder store("cadence-bench-gloo");
  cadence_bench::summing_barrier sync(cfg.ranks);
  return cadence_bench::rank0_result(cfg.ranks, [&](int r) {
    gloo_options options;
    options.store_path = store.path();
    gloo_communicator comm(r, cfg.ranks, options, std::chrono::seconds(60));
    host_buffers mem;
    rank_ops ops = host_thread_ops(r, cfg, mem, sync);
    ops.raw = [&](float* b, std::size_t n) { cadence_bench::raw_gloo_allreduce(comm, b, n); };
    return run_adapters(comm, ops, cfg);
  });
}
#endif

#if defined(CADENCE_BENCH_WITH_MPI)
int run_mpi(const config& cfg) {
  config local = cfg;  // with the copy bandwidth rank 0 measures
  const auto measure = [&](int rank, int size, MPI_Comm raw) {
    local.copy = cadence_bench::mpi_copy_rates(raw, cadence_bench::sizes(cfg.min_bytes, cfg.max_bytes, 4));
    mpi_communicator comm(MPI_COMM_WORLD, mpi_options{});
    rank_ops ops;
    host_buffers mem;
    mem.attach(ops);
    ops.rank = rank;
    ops.size = size;
    MPI_Comm native;
    MPI_Comm_dup(MPI_COMM_WORLD, &native);
    ops.raw = [&](float* b, std::size_t n) {
      MPI_Allreduce(MPI_IN_PLACE, b, static_cast<int>(n), MPI_FLOAT, MPI_SUM, native);
    };
    ops.average = [&](double v) { return cadence_bench::mpi_average(raw, v); };
    ops.one_process = false;  // a process per rank: time_block_cpu() sums their CPU
    auto rows = run_adapters(comm, ops, cfg);
    MPI_Comm_free(&native);
    return rows;
  };
  return cadence_bench::run_mpi_rows("cadence-bench-exchange", measure, [&](const auto& rows) { print(rows, local); });
}
#endif

#if defined(CADENCE_BENCH_WITH_NCCL)
std::vector<row> run_nccl(config& cfg) {
  const cadence_bench::nccl_raw_comms raw_comms(cfg.ranks);
  cfg.device_copy_gbps = cadence_bench::measure_device_copy_gbps();
  inproc_world boot(cfg.ranks);
  cadence_bench::summing_barrier sync(cfg.ranks);
  return cadence_bench::rank0_result(cfg.ranks, [&](int r) {
    struct device_buffers {
      std::vector<void*> blocks;
      ~device_buffers() {
        for (void* p : blocks) cudaFree(p);
      }
    } mem;  // freed after the communicator (declared before it)
    auto b = boot.join(r);
    nccl_communicator comm(real_nccl_api(), b, r, {}, std::chrono::seconds(60));
    auto stream = static_cast<cudaStream_t>(comm.stream());
    ncclComm_t raw = raw_comms[r];
    rank_ops ops;
    ops.rank = r;
    ops.size = cfg.ranks;
    ops.buffer = [&](std::size_t n) {
      void* p = nullptr;
      if (cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(float)) != cudaSuccess)
        throw std::runtime_error("cudaMalloc failed");
      mem.blocks.push_back(p);
      return static_cast<float*>(p);
    };
    ops.fill = [](float* p, float v, std::size_t n) {
      std::vector<float> h(n, v);
      cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    };
    ops.load = [](const float* p, std::size_t n) {
      std::vector<float> h(n);
      cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
      return h;
    };
    // N back to back on the communicator's stream, one synchronize (nccl-tests' method).
    ops.raw = [&](float* p, std::size_t n) {
      if (ncclAllReduce(p, p, n, ncclFloat32, ncclSum, raw, stream) != ncclSuccess)
        throw std::runtime_error("raw ncclAllReduce failed");
    };
    ops.raw_wait = [&] {
      if (cudaStreamSynchronize(stream) != cudaSuccess) throw std::runtime_error("cudaStreamSynchronize failed");
    };
    ops.average = [&](double v) { return sync.arrive_and_sum(v) / cfg.ranks; };
    return run_adapters(comm, ops, cfg);
  });
}
#endif

int run(int argc, char** argv) {
  config cfg;
  cadence::tools::command_line cli(
      "usage: cadence-bench-exchange --backend inproc|mpi|gloo|nccl [--ranks N] [--json | --csv]\n"
      "         [--min-bytes B] [--max-bytes B] [--reps R] [--no-overlap] [--part-bytes B]\n",
      "", 17);
  cadence_bench::add_common_flags(
      cli, cfg,
      {{"--backend", "inproc, mpi, gloo or nccl"},
       {"--ranks", "threads for inproc and gloo (default 2), nccl (one per GPU, default 1);\n"
                   "under MPI, mpirun -np sets it"},
       {"--min-bytes", "smallest buffer (default 1 KiB; sizes go x4 up to --max-bytes)"},
       {"--max-bytes", "largest buffer (default 16 MiB)"},
       {"--reps", "raw/ours pairs per size, median reported (default 5)"},
       {"--json", "one JSON array, an object per op and size"},
       {"--csv", "a header row and a row per op and size, the JSON's keys as columns"}});
  cli.add_flag_callback("--no-overlap", [&cfg] { cfg.overlap = false; }, "skip the bsp_overlap rows");
  cli.add_option("--part-bytes", cfg.part_bytes,
                 "bsp_allreduce's bucketed_allreducer_options::part_bytes (default 0: one\n"
                 "all-reduce per bucket)")
      ->option_text("B");
  if (!cadence_bench::read_flags(cli, cfg, argc, argv)) return 0;
  // The roofline's copy bandwidth, before the ranks start (mpi: rank 0's, in run_mpi).
  const auto measure_copy = [&cfg] {
    cfg.copy = cadence_bench::copy_rates(cadence_bench::sizes(cfg.min_bytes, cfg.max_bytes, 4));
  };
  if (cfg.max_bytes < cfg.min_bytes || cfg.min_bytes < 64 || cfg.max_bytes % 64 != 0 || cfg.min_bytes % 64 != 0)
    throw usage_error("--min-bytes and --max-bytes must be multiples of 64, min <= max, got " +
                      std::to_string(cfg.min_bytes) + " and " + std::to_string(cfg.max_bytes));
  return cadence_bench::run_backend(
      cfg.backend, {{"inproc",
                     [&] {
                       measure_copy();
                       return print(run_inproc(cfg), cfg);
                     },
                     {}},
                    CADENCE_BENCH_MPI([&] { return run_mpi(cfg); }),
                    CADENCE_BENCH_GLOO([&] {
                      measure_copy();
                      return print(run_gloo(cfg), cfg);
                    }),
                    CADENCE_BENCH_NCCL([&] {
                      measure_copy();
                      if (!cfg.ranks_given) cfg.ranks = 1;
                      return print(run_nccl(cfg), cfg);
                    })});
}

}  // namespace

int main(int argc, char** argv) {
  return cadence::tools::guarded_main("cadence-bench-exchange", run, argc, argv);
}
