// cadence-bench-transport: all-reduce through a Cadence communicator against the raw backend
// call on the same buffers, interleaved, measured as nccl-tests does (warm-up, N back-to-back
// operations, time averaged over ranks; algbw = bytes / t, busbw = algbw * 2(n-1)/n).
//
//   cadence-bench-transport --backend inproc [--ranks N] [--json]
//   mpirun -np 2 cadence-bench-transport --backend mpi [--json] [--no-bounce] [--no-verify]
//                                         [--no-ring]
//   cadence-bench-transport --backend gloo --ranks N --rank R --rendezvous H:P [--address A]
//                                        (ranks as processes, on several hosts; rank 0 prints)
//   cadence-bench-transport --backend gloo [--ranks N] [--json]   (ranks as threads, TCP on
//                                                                  127.0.0.1, a temp file store)
//   cadence-bench-transport --backend nccl [--ranks N] [--json]   (one thread per GPU)
//   cadence-bench-transport --backend zmq [--ranks N] [--json]    (ranks as threads, TCP on
//                                                                  127.0.0.1)
//
// Raw: MPI_Allreduce for mpi; gloo::allreduce (gloo/allreduce.h, its ring) on the
// communicator's own gloo context for gloo; for nccl, ncclAllReduce on a communicator of its own
// (ncclCommInitAll) over the same device buffers, N back to back and one stream synchronize,
// against ours as N iallreduce and one wait on their handles; for inproc a plain
// shared-memory all-reduce among the same threads (each rank adds its buffer into a shared
// accumulator under a lock, then copies the sum out), the same data movement without matching,
// deadlines or failure handling. For zmq, raw is the same algorithms written directly on ZeroMQ
// (a PULL socket per rank, a PUSH to each peer, zmq_send copying each message, zmq_msg_recv):
// up to 64 KiB every rank sends its buffer to every other rank and reduces in rank order,
// larger all-reduces run the same chunked ring, without matching, credits, deadlines,
// argument checks or liveness. Not a
// Google Benchmark program: it must run as one job of several MPI processes or threads, and
// print one JSON array from one rank. These machines are shared: read the ratios, not the
// absolute times. The roofline (support/roofline.hpp): an all-reduce through a communicator
// must copy nothing beyond the native call, so each row's limit is raw itself (extra_bytes 0)
// and of_limit = of_native = raw/ours; the run still measures the memory copy bandwidth (one
// thread, two at once) and prints it, as the other two benchmarks do.
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

#include "support/nccl.hpp"
#endif
#if defined(CADENCE_BENCH_WITH_ZMQ)
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include <zmq.h>

#include "support/raw_zmq.hpp"
#if defined(CADENCE_BENCH_WITH_SODIUM)
#include <sodium.h>
#endif
#endif
#if defined(CADENCE_BENCH_WITH_GLOO)
#include <cadence/transport/gloo/communicator.hpp>

#include "support/raw_gloo.hpp"
#endif

#include "support/backends.hpp"
#include "support/command_line.hpp"
#include "support/measure.hpp"
#include "support/report.hpp"
#include "support/roofline.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace {

using namespace cadence::transport;
using steady = std::chrono::steady_clock;

struct config : cadence_bench::common_config {
  config() : common_config(8, std::size_t{64} << 20) {}  // min_bytes is not a flag
  bool bounce = true;
  bool verify = true;
  bool ring = true;
  bool security_cost = false;  // zmq: raw is the same all-reduce over an open communicator
  std::size_t chunk_bytes = 0;  // gloo: the ring's pieces (ours only); 0: gloo_options' default
  cadence_bench::copy_rates copy;  // the roofline's (at the largest size), before the ranks start
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
  for (std::size_t bytes : cadence_bench::sizes(cfg.min_bytes, cfg.max_bytes, 8)) {
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

// Prints the rows as cfg asks; returns main's status, 0.
int print(const std::vector<row>& rows, const config& cfg) {
  using cadence::tools::decimals;
  std::vector<cadence_bench::row> out;
  for (const row& r : rows) {
    out.push_back({{"backend", cfg.backend},
                   {"op", "allreduce"},
                   {"bytes", r.bytes},
                   {"ranks", r.ranks},
                   {"raw_us", decimals(r.raw_us, 3)},
                   {"ours_us", decimals(r.ours_us, 3)},
                   {"raw_busbw", decimals(busbw(r, r.raw_us), 4)},
                   {"ours_busbw", decimals(busbw(r, r.ours_us), 4)}});
    // Nothing to copy beyond the native all-reduce: the limit is raw.
    cadence_bench::add_roofline(out.back(), r.raw_us, r.ours_us, 0, cfg.copy.at(r.bytes).shared_rate(r.ranks));
  }
  cadence_bench::table t;
  t.title = "all-reduce f32 sum, backend " + cfg.backend + ", " + std::to_string(rows.empty() ? 0 : rows.front().ranks) +
            " ranks (busbw in GB/s); " + cfg.copy.note() +
            cadence_bench::security_cost_note(cfg.security_cost, "all-reduce");
  t.columns = cadence_bench::raw_ours_columns(12, "%.2f", "busbw", "busbw");
  t.columns.push_back(cadence_bench::ratio_column("ours/raw", 8, "ours_us", "raw_us", "%.2f"));
  for (auto& c : cadence_bench::roofline_columns()) t.columns.push_back(std::move(c));
  cadence_bench::print(out, cfg, t);
  cfg.copy.report("cadence-bench-transport");  // after the rows: stdout starts with them
  return 0;
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
  return cadence_bench::rank0_result(cfg.ranks, [&](int r) {
    auto comm = world.join(r);
    rank_ops ops = thread_rank_ops(r, cfg, comm, sync);
    ops.raw = [&](float* b, std::size_t n) { raw.run(b, n); };
    return run_rank(ops, cfg);
  });
}

// ---- gloo: ranks as threads, each with its own gloo context over TCP on 127.0.0.1 ----

#if defined(CADENCE_BENCH_WITH_GLOO)
// Ranks as processes (on several hosts, or network namespaces): they meet at the TCP store rank
// 0 serves at --rendezvous; the averages and the line-ups go over the communicator itself.
std::vector<row> run_gloo_process(const config& cfg) {
  gloo_options options;
  options.rendezvous = cfg.rendezvous;
  options.store.secret = cadence_bench::process_secret();  // the TCP store proves it
  options.hostname = cfg.address;
  options.prefix = "cadence-bench-transport";
  if (cfg.chunk_bytes != 0) options.chunk_bytes = cfg.chunk_bytes;
  gloo_communicator comm(cfg.rank, cfg.ranks, options, std::chrono::seconds(120));
  rank_ops ops;
  ops.rank = cfg.rank;
  ops.size = cfg.ranks;
  ops.ours = [&comm](float* b, std::size_t n) {
    comm.allreduce(b, n, dtype::f32, reduce_op::sum, std::chrono::seconds(60));
  };
  ops.raw = [&comm](float* b, std::size_t n) { cadence_bench::raw_gloo_allreduce(comm, b, n); };
  ops.average = [&comm](double v) {
    comm.allreduce(&v, 1, dtype::f64, reduce_op::sum, std::chrono::seconds(60));
    return v / comm.size();
  };
  return run_rank(ops, cfg);
}

std::vector<row> run_gloo(const config& cfg) {
  const cadence_bench::temp_folder store("cadence-bench-gloo");  // goes whether the ranks succeed or not
  cadence_bench::summing_barrier sync(cfg.ranks);
  return cadence_bench::rank0_result(cfg.ranks, [&](int r) {
    gloo_options options;
    options.store_path = store.path();
    if (cfg.chunk_bytes != 0) options.chunk_bytes = cfg.chunk_bytes;
    gloo_communicator comm(r, cfg.ranks, options, std::chrono::seconds(60));
    rank_ops ops = thread_rank_ops(r, cfg, comm, sync);
    ops.raw = [&](float* b, std::size_t n) { cadence_bench::raw_gloo_allreduce(comm, b, n); };
    return run_rank(ops, cfg);
  });
}
#endif

// ---- zmq: ranks as threads, each with its own communicator over TCP on 127.0.0.1 ----

#if defined(CADENCE_BENCH_WITH_ZMQ)
using zmsg = cadence::transport::detail::zmq_message;

// The raw baseline: the same algorithms as the zmq backend's all-reduce, on plain ZeroMQ.
class raw_zmq_allreduce {
public:
  // Binds a PULL socket; connect() then dials every other rank's.
  raw_zmq_allreduce(int rank, int n, std::size_t chunk)
      : rank_(rank), n_(n), chunk_(chunk / 8 * 8), pending_(static_cast<std::size_t>(n)) {
    pull_ = ctx_.socket(ZMQ_PULL);
    if (zmq_bind(pull_, "tcp://127.0.0.1:0") != 0) {
      zmq_close(pull_);  // or the context would wait for it
      throw std::runtime_error("raw zmq: bind failed");
    }
    endpoint_ = cadence_bench::last_endpoint(pull_);
  }
  ~raw_zmq_allreduce() {
    for (void* s : push_)
      if (s != nullptr) zmq_close(s);
    zmq_close(pull_);
  }
  raw_zmq_allreduce(const raw_zmq_allreduce&) = delete;
  raw_zmq_allreduce& operator=(const raw_zmq_allreduce&) = delete;
  const std::string& endpoint() const { return endpoint_; }
  void connect(const std::vector<std::string>& endpoints) {
    push_.assign(static_cast<std::size_t>(n_), nullptr);
    for (int p = 0; p < n_; ++p) {
      if (p == rank_) continue;
      push_[static_cast<std::size_t>(p)] = ctx_.socket(ZMQ_PUSH);
      zmq_connect(push_[static_cast<std::size_t>(p)], endpoints[static_cast<std::size_t>(p)].c_str());
    }
  }

  void run(float* buf, std::size_t count) {
    const std::size_t bytes = count * sizeof(float);
    if (n_ == 1) return;
    if (bytes <= std::size_t{64} << 10 || count < static_cast<std::size_t>(n_))
      all_to_all(buf, count);
    else
      ring(buf, count);
  }

private:
  // A message: the sender's rank, then its data.
  void send(int p, const void* data, std::size_t bytes) {
    zmq_msg_t m;
    zmq_msg_init_size(&m, sizeof(std::int32_t) + bytes);
    const std::int32_t me = rank_;
    std::memcpy(zmq_msg_data(&m), &me, sizeof me);
    if (bytes != 0) std::memcpy(static_cast<char*>(zmq_msg_data(&m)) + sizeof me, data, bytes);
    zmq_msg_send(&m, push_[static_cast<std::size_t>(p)], 0);
  }
  // The next message from rank p; messages from others that come first wait for their turn
  // (a rank may already be a call ahead).
  zmsg recv_from(int p) {
    auto& box = pending_[static_cast<std::size_t>(p)];
    while (box.empty()) {
      zmsg m;
      zmq_msg_recv(m.get(), pull_, 0);
      std::int32_t from = 0;
      std::memcpy(&from, m.data(), sizeof from);
      pending_[static_cast<std::size_t>(from)].push_back(std::move(m));
    }
    zmsg m = std::move(box.front());
    box.pop_front();
    return m;
  }
  // ZeroMQ's data may sit at any byte offset: reduce from aligned floats.
  static const float* data_of(zmsg& m, std::vector<float>& scratch, std::size_t count) {
    scratch.resize(count);
    std::memcpy(scratch.data(), m.data() + sizeof(std::int32_t), count * sizeof(float));
    return scratch.data();
  }

  void all_to_all(float* buf, std::size_t count) {
    const std::size_t bytes = count * sizeof(float);
    for (int p = 0; p < n_; ++p)
      if (p != rank_) send(p, buf, bytes);
    std::vector<zmsg> got(static_cast<std::size_t>(n_));
    for (int p = 0; p < n_; ++p)
      if (p != rank_) got[static_cast<std::size_t>(p)] = recv_from(p);
    std::vector<float> acc(count), scratch;
    for (int p = 0; p < n_; ++p) {
      const float* d = p == rank_ ? buf : data_of(got[static_cast<std::size_t>(p)], scratch, count);
      if (p == 0)
        std::memcpy(acc.data(), d, bytes);
      else
        cadence::transport::detail::reduce_into(acc.data(), d, count, dtype::f32, reduce_op::sum);
    }
    std::memcpy(buf, acc.data(), bytes);
  }

  void ring(float* buf, std::size_t count) {
    const int n = n_, r = rank_, left = (r + n - 1) % n, right = (r + 1) % n;
    auto first = [&](int seg) { return count * static_cast<std::size_t>(seg) / static_cast<std::size_t>(n); };
    auto seg_count = [&](int seg) { return first(seg + 1) - first(seg); };
    const std::size_t chunk = chunk_ / sizeof(float);
    auto chunks = [&](int seg) { return (seg_count(seg) + chunk - 1) / chunk; };
    auto seg_out = [&](int s) { return s < n - 1 ? (r - s + n) % n : (r + 1 - (s - (n - 1)) + 2 * n) % n; };
    auto seg_in = [&](int s) { return s < n - 1 ? (r - s - 1 + 2 * n) % n : (r - (s - (n - 1)) + 2 * n) % n; };
    auto send_chunk = [&](int s, std::size_t k) {
      const int seg = seg_out(s);
      const std::size_t len = std::min(chunk, seg_count(seg) - k * chunk);
      send(right, buf + first(seg) + k * chunk, len * sizeof(float));
    };
    const int steps = 2 * (n - 1);
    for (std::size_t k = 0; k < chunks(seg_out(0)); ++k) send_chunk(0, k);
    std::vector<float> scratch;
    for (int s = 0; s < steps; ++s) {
      const int seg = seg_in(s);
      for (std::size_t k = 0; k < chunks(seg); ++k) {
        zmsg m = recv_from(left);
        const std::size_t len = std::min(chunk, seg_count(seg) - k * chunk);
        float* at = buf + first(seg) + k * chunk;
        if (s < n - 1)
          cadence::transport::detail::reduce_into(at, data_of(m, scratch, len), len, dtype::f32, reduce_op::sum);
        else
          std::memcpy(at, m.data() + sizeof(std::int32_t), len * sizeof(float));
        if (s + 1 < steps) send_chunk(s + 1, k);
      }
    }
  }

  int rank_, n_;
  std::size_t chunk_;
  cadence_bench::raw_zmq_context ctx_;  // closed last: the sockets close first
  void* pull_ = nullptr;
  std::vector<void*> push_;
  std::vector<std::deque<zmsg>> pending_;
  std::string endpoint_;
};

// --security-cost: how fast libsodium encrypts and authenticates on this machine
// (crypto_secretbox_easy, XSalsa20-Poly1305, what CURVE does to every message after its
// handshake), one thread, 1 MiB messages, and one Curve25519 scalar multiplication (what a
// handshake's boxes cost), on stderr: the ceiling an encrypted link can reach.
void report_sodium_rate() {
#if defined(CADENCE_BENCH_WITH_SODIUM)
  if (sodium_init() < 0) throw std::runtime_error("sodium_init failed");
  const std::size_t n = std::size_t{1} << 20;
  std::vector<unsigned char> plain(n, 7), boxed(n + crypto_secretbox_MACBYTES);
  unsigned char key[crypto_secretbox_KEYBYTES], nonce[crypto_secretbox_NONCEBYTES] = {};
  randombytes_buf(key, sizeof key);
  int iters = 0;
  const auto t0 = steady::now();
  double seconds = 0;
  do {
    for (int i = 0; i < 16; ++i, ++iters) {
      sodium_increment(nonce, sizeof nonce);
      crypto_secretbox_easy(boxed.data(), plain.data(), n, nonce, key);
    }
    seconds = std::chrono::duration<double>(steady::now() - t0).count();
  } while (seconds < 0.5);
  std::fprintf(stderr, "cadence-bench-transport: libsodium crypto_secretbox_easy (XSalsa20-Poly1305), 1 MiB "
                       "messages, one thread: %.3f GB/s\n",
               static_cast<double>(n) * iters / seconds / 1e9);
  // A handshake's arithmetic: Curve25519 scalar multiplications (CurveZMQ's boxes each need one).
  unsigned char secret[crypto_scalarmult_SCALARBYTES], point[crypto_scalarmult_BYTES], shared[crypto_scalarmult_BYTES];
  randombytes_buf(secret, sizeof secret);
  crypto_scalarmult_base(point, secret);
  int mults = 0, refused = 0;
  const auto t1 = steady::now();
  do {
    for (int i = 0; i < 64; ++i, ++mults) refused += crypto_scalarmult(shared, secret, point) != 0;
    seconds = std::chrono::duration<double>(steady::now() - t1).count();
  } while (seconds < 0.2);
  std::fprintf(stderr, "cadence-bench-transport: libsodium crypto_scalarmult (Curve25519), one thread: %.1f us each%s\n",
               seconds * 1e6 / mults, refused ? " (some refused the point: the rate is not a handshake's)" : "");
#else
  std::fprintf(stderr, "cadence-bench-transport: built without libsodium's header: its rate not measured\n");
#endif
}

std::vector<row> run_zmq(const config& cfg) {
  if (cfg.security_cost) report_sodium_rate();
  cadence_bench::summing_barrier sync(cfg.ranks);
  cadence_bench::thread_rendezvous meet, meet_open, meet_again;
  std::mutex m;
  std::vector<std::string> raw_endpoints(static_cast<std::size_t>(cfg.ranks));
  return cadence_bench::rank0_result(cfg.ranks, [&](int r) {
    const auto options = cadence_bench::zmq_thread_options<zmq_options>(r, meet);
    zmq_communicator comm(r, cfg.ranks, options, std::chrono::seconds(60));
    raw_zmq_allreduce raw(r, cfg.ranks, options.chunk_bytes);
    std::unique_ptr<zmq_communicator> open;
    if (cfg.security_cost) {
      // Timed after the ranks line up: an open communicator, kept, and a second authenticated one.
      open = cadence_bench::open_beside_authenticated<zmq_communicator, zmq_options>(
          "cadence-bench-transport", r, cfg.ranks, meet_open, meet_again, sync);
    }
    {
      std::lock_guard<std::mutex> lock(m);
      raw_endpoints[static_cast<std::size_t>(r)] = raw.endpoint();
    }
    sync.arrive_and_sum(0);  // every raw endpoint is known
    raw.connect(raw_endpoints);
    rank_ops ops = thread_rank_ops(r, cfg, comm, sync);
    ops.raw = [&](float* b, std::size_t n) { raw.run(b, n); };
    if (open)
      ops.raw = [&](float* b, std::size_t n) {
        open->allreduce(b, n, dtype::f32, reduce_op::sum, std::chrono::seconds(60));
      };
    auto mine = run_rank(ops, cfg);
    sync.arrive_and_sum(0);  // nobody closes while another still runs
    return mine;
  });
}
#endif

// ---- mpi: one rank per process ----

#if defined(CADENCE_BENCH_WITH_MPI)
int run_mpi(const config& cfg) {
  config local = cfg;  // with the copy bandwidth rank 0 measures
  const auto measure = [&](int rank, int size, MPI_Comm raw) {
    local.copy = cadence_bench::mpi_copy_rates(raw, {cfg.max_bytes});
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
    return run_rank(ops, cfg);
  };
  return cadence_bench::run_mpi_rows("cadence-bench-transport", measure, [&](const auto& rows) { print(rows, local); });
}
#endif

// ---- nccl: one thread per GPU, bootstrapped over the in-process communicator ----

#if defined(CADENCE_BENCH_WITH_NCCL)
std::vector<row> run_nccl(const config& cfg) {
  // The raw side: a communicator of NCCL's own over the same GPUs, blocking as nccl-tests use it.
  const cadence_bench::nccl_raw_comms raw_comms(cfg.ranks);
  const std::size_t max_count = cfg.max_bytes / sizeof(float);
  inproc_world boot(cfg.ranks);
  cadence_bench::summing_barrier sync(cfg.ranks);
  return cadence_bench::rank0_result(cfg.ranks, [&](int r) {
    float* dev = nullptr;
    // Declared before the communicator: dev is freed after it, whichever way the rank ends.
    std::unique_ptr<float, cudaError_t (*)(void*)> free_dev(nullptr, &cudaFree);
    auto b = boot.join(r);
    nccl_communicator comm(real_nccl_api(), b, r, {}, std::chrono::seconds(60));
    if (cudaMalloc(&dev, std::max<std::size_t>(max_count, 1) * sizeof(float)) != cudaSuccess)
      throw std::runtime_error("cudaMalloc failed");
    free_dev.reset(dev);
    auto stream = static_cast<cudaStream_t>(comm.stream());
    ncclComm_t raw = raw_comms[r];
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
    return run_rank(ops, cfg);
  });
}
#endif

int run(int argc, char** argv) {
  config cfg;
  cadence::tools::command_line cli(
      "usage: cadence-bench-transport --backend inproc|mpi|gloo|nccl|zmq [--ranks N] [--json | --csv]\n"
      "         [--max-bytes B] [--reps R] [--no-bounce] [--no-verify] [--no-ring] [--security-cost]\n"
      "         [--chunk-bytes B]\n"
      "       cadence-bench-transport --backend gloo --ranks N --rank R --rendezvous H:P [--address A] ...\n",
      "", 17);
  cadence_bench::add_common_flags(
      cli, cfg,
      {{"--backend", "inproc, mpi, gloo, nccl or zmq"},
       {"--ranks", "threads for inproc, gloo and zmq (default 2) or nccl (one per GPU,\n"
                   "default 1); under MPI, mpirun -np sets it"},
       {"--rank", "gloo: ranks as processes (on several hosts): this one is rank R of\n"
                  "--ranks N; rank 0 prints"},
       {"--rendezvous", "gloo, with --rank: rank 0 serves a TCP store at H:P (one of its\n"
                        "addresses), the others reach it there"},
       {"--address", "gloo, with --rank: the address each binds (default 127.0.0.1)"},
       {"--max-bytes", "largest all-reduce (default 64 MiB; sizes go 8 B, x8, ..., B)"},
       {"--reps", "raw/ours pairs per size, median reported (default 5)"},
       {"--json", "one JSON array, an object per size"},
       {"--csv", "a header row and a row per size, the JSON's keys as columns"}});
  cli.add_flag_callback("--no-bounce", [&cfg] { cfg.bounce = false; },
                        "mpi: mpi_options::bounce_buffers = false (broadcasts and sends)");
  cli.add_flag_callback("--no-verify", [&cfg] { cfg.verify = false; },
                        "mpi: mpi_options::verify_before_posting = false (broadcasts)");
  cli.add_flag("--security-cost", cfg.security_cost,
               "zmq: raw = the same all-reduce over an open communicator (ours:\n"
               "authenticated); also libsodium's rate and the connect time");
  cli.add_flag_callback("--no-ring", [&cfg] { cfg.ring = false; },
                        "mpi: every all-reduce by recursive doubling (no ring)");
  cli.add_option("--chunk-bytes", cfg.chunk_bytes,
                 "gloo: gloo_options::chunk_bytes, the pieces of Cadence's ring (default:\n"
                 "the option's, 1 MiB; at least 8; gloo::allreduce, the raw call, keeps\n"
                 "its own)")
      ->option_text("B");
  if (!cadence_bench::read_flags(cli, cfg, argc, argv)) return 0;
  if (cfg.chunk_bytes != 0 && cfg.chunk_bytes < 8)
    throw cadence::tools::usage_error("--chunk-bytes must be at least 8, got " + std::to_string(cfg.chunk_bytes));
  if (cfg.chunk_bytes != 0 && cfg.backend != "gloo")
    throw cadence::tools::usage_error("--chunk-bytes is for --backend gloo, not " + cfg.backend);
  cadence_bench::check_sizes_and_backend(cfg, cfg.security_cost, "gloo");
  if (cadence_bench::measures_copy_first(cfg))
    cfg.copy = cadence_bench::copy_rates({cfg.max_bytes});  // no row copies: the largest size only
  return cadence_bench::run_backend(
      cfg.backend, {{"inproc", [&] { return print(run_inproc(cfg), cfg); }, {}},
                    CADENCE_BENCH_MPI([&] { return run_mpi(cfg); }),
                    CADENCE_BENCH_GLOO([&] {
                      if (!cfg.processes()) return print(run_gloo(cfg), cfg);
                      const auto rows = run_gloo_process(cfg);
                      return cfg.rank == 0 ? print(rows, cfg) : 0;
                    }),
                    CADENCE_BENCH_NCCL([&] {
                      if (!cfg.ranks_given) cfg.ranks = 1;
                      return print(run_nccl(cfg), cfg);
                    }),
                    CADENCE_BENCH_ZMQ([&] { return print(run_zmq(cfg), cfg); })});
}

}  // namespace

int main(int argc, char** argv) {
  return cadence::tools::guarded_main("cadence-bench-transport", run, argc, argv);
}
