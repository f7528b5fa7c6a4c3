// cadence-bench-ps: the parameter server's push+pull round trip against a raw send/recv
// ping-pong of the same bytes over the same backend, interleaved (raw block, ours block, ...),
// and, with more than one worker, the server's throughput against raw echoes.
//
//   mpirun -np 2 cadence-bench-ps --backend mpi [--json] [--no-bounce] [--gradient-buffer] [--sgd]
//   mpirun -np 5 cadence-bench-ps --backend mpi --throughput      (1 server, 4 workers)
//   cadence-bench-ps --backend zmq [--ranks N] [--json] [--sgd] [--throughput]
//                                   (ranks as threads, TCP on 127.0.0.1; N = 1 server + workers)
//   cadence-bench-ps --backend zmq --ranks N --rank R --rendezvous H:P [--address A] ...
//                                   (ranks as processes, on several hosts; rank 0 prints)
//
// Round trip: rank 1 pushes a gradient of B bytes and pulls B bytes of weights from server
// rank 0 (one server, policy asp, so nobody waits on a policy); raw: rank 1 sends B bytes to
// rank 0, which sends B bytes back (MPI_Send/MPI_Recv for mpi; for zmq a DEALER per worker to a
// ROUTER on the server, zmq_send copying the worker's bytes, the server sending the message it
// received straight back, as a plain ZeroMQ echo server does). The update rule is a no-op
// unless --sgd: it is the integrator's work, not the adapter's. Sizes 4 KiB to 16 MiB by
// factors of 4; per size the pair of blocks with the median ratio is reported. Read the ratios,
// not the absolute times: these machines are shared.
//
// The roofline (support/roofline.hpp): the run first measures this machine's memory copy
// bandwidth; a row's limit is raw_us + extra_bytes / copy rate, extra_bytes the copies a round
// trip makes beyond raw's: over MPI with bounce buffers (the default) the worker copies the
// caller's gradient into its own buffer, which it lends to MPI, and the server lends its reply's
// weights (1 x bytes); with --gradient-buffer the gradient is written into the worker's buffer
// (ps_worker::gradient_buffer()) and with --no-bounce nothing is copied (0); over zmq ours
// copies each message once out of ZeroMQ on receipt and sends large ones from the caller's
// buffer, as many copies as raw's zmq_send and zmq_recv (0 extra). A ping-pong's copies run one
// after the other (one thread's rate); with --throughput the workers' round trips share the
// two-thread rate.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#if defined(CADENCE_BENCH_WITH_MPI)
#include <cadence/transport/mpi/communicator.hpp>

#include <mpi.h>

#include "support/mpi.hpp"
#endif
#if defined(CADENCE_BENCH_WITH_ZMQ)
#include <cadence/transport/zmq/communicator.hpp>

#include <zmq.h>

#include "support/raw_zmq.hpp"
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
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using steady = std::chrono::steady_clock;
using cadence::tools::usage_error;

struct config : cadence_bench::common_config {
  config() : common_config(4 << 10, 16 << 20) {}  // min_bytes is not a flag
  bool bounce = true;
  bool gradient_buffer = false;  // mpi: push from ps_worker::gradient_buffer()
  bool sgd = false;
  bool throughput = false;
  bool security_cost = false;  // zmq: raw is the same push_pull over an open communicator
  cadence_bench::copy_rates copy;  // the roofline's, measured before the ranks start
};

// The bytes one round trip copies beyond the raw ping-pong's: with MPI's bounce buffers on, the
// worker copies the caller's gradient into the buffer it lends to MPI (the server lends its
// weights without a copy); pushed from that buffer itself, or without bounce buffers, none.
double extra_bytes(const config& cfg, std::size_t bytes) {
  return cfg.backend == "mpi" && cfg.bounce && !cfg.gradient_buffer ? static_cast<double>(bytes) : 0.0;
}

struct no_update {
  void operator()(float*, const float*, std::size_t, worker_id) const {}
};

struct row {
  std::size_t bytes;
  double raw_us;
  double ours_us;
};

int iterations_for(std::size_t bytes) { return cadence_bench::iterations_for(bytes, std::size_t{128} << 20, 2000); }

/// What one rank measures with, whatever the backend: a block of raw ping-pongs, a block of
/// parameter-server round trips (both return µs per round trip on a worker, 0 elsewhere, and
/// line the ranks up before they start), and the mean of a value over the workers.
struct ps_rank {
  int rank = 0;
  int workers = 1;
  std::function<double(std::vector<float>&, int iters)> raw_block;
  std::function<double(std::vector<float>&, int iters)> ours_block;
  std::function<double(double)> average_over_workers;
};

// One block through the parameter server: a fresh server and workers (construction and the
// initial pull are not timed), `iters` push_pulls per worker, finish.
template <class Update, class Comm>
double ours_block(Comm& comm, int workers, std::vector<float>& buf, int iters, bool own) {
  ps_options o;
  o.servers = 1;
  const int rank = comm.rank();
  double us = 0;
  if (rank == 0) {
    parameter_server<Comm, any_controller, float, Update> server(
        comm, buf.size(), buf.data(), make_controller("asp", static_cast<std::size_t>(comm.size() - 1)), Update{}, o);
    server.run();
  } else {
    ps_worker<Comm> worker(comm, buf.size(), o);
    std::vector<float> weights(buf.size());
    worker.pull(weights.data());
    const float* gradient = buf.data();
    if (own) gradient = std::copy(buf.begin(), buf.end(), worker.gradient_buffer()) - buf.size();
    const auto t0 = steady::now();
    if (rank <= workers)
      for (int i = 0; i < iters; ++i) worker.push_pull(gradient, weights.data());
    us = std::chrono::duration<double, std::micro>(steady::now() - t0).count() / iters;
    worker.finish();
  }
  return us;
}

template <class Comm>
double ours_block(Comm& comm, int workers, std::vector<float>& buf, int iters, bool sgd, bool own = false) {
  return sgd ? ours_block<cadence::exchange::sgd<float>>(comm, workers, buf, iters, own)
             : ours_block<no_update>(comm, workers, buf, iters, own);
}

std::vector<row> measure(ps_rank& me, const config& cfg, const std::vector<std::size_t>& sizes) {
  std::vector<row> rows;
  for (std::size_t bytes : sizes) {
    std::vector<float> buf(bytes / sizeof(float), 0.0f);
    const int iters = iterations_for(bytes) / me.workers + 1;
    me.raw_block(buf, 2);  // warm-up: connections, caches
    me.ours_block(buf, iters);
    std::vector<std::pair<double, double>> pairs;
    for (int rep = 0; rep < cfg.reps; ++rep) {
      const double r = me.average_over_workers(me.raw_block(buf, iters));
      const double o = me.average_over_workers(me.ours_block(buf, iters));
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
  using cadence::tools::decimals;
  const char* op = workers == 1 ? "push_pull" : "push_pull_throughput";
  std::vector<cadence_bench::row> out;
  for (const row& r : rows) {
    out.push_back({{"backend", cfg.backend},
                   {"op", op},
                   {"workers", workers},
                   {"bytes", r.bytes},
                   {"raw_us", decimals(r.raw_us, 3)},
                   {"ours_us", decimals(r.ours_us, 3)},
                   {"raw_gbps", decimals(bandwidth(r.bytes, r.raw_us, workers), 4)},
                   {"ours_gbps", decimals(bandwidth(r.bytes, r.ours_us, workers), 4)}});
    // One worker: its copies and the server's alternate (one thread's rate); W workers: the
    // round trips in flight share the two-thread rate.
    cadence_bench::add_roofline(out.back(), r.raw_us, r.ours_us, extra_bytes(cfg, r.bytes),
                                cfg.copy.at(r.bytes).shared_rate(workers));
  }
  using cadence_bench::formatted;
  cadence_bench::table t;
  t.title = std::string(op) + ", backend " + cfg.backend + ", 1 server, " + std::to_string(workers) + " worker(s)" +
            (cfg.sgd ? ", sgd update" : ", no-op update") + " (GB/s both ways, all workers); " +
            cfg.copy.note() + cadence_bench::security_cost_note(cfg.security_cost, "push_pull");
  t.columns = cadence_bench::raw_ours_columns(12, "%.2f", "GB/s", "gbps");
  t.columns.push_back(cadence_bench::ratio_column("ours/raw", 9, "raw_us", "ours_us", "%.2f"));
  t.columns.push_back({"added us", 10, [](const cadence_bench::row& j) {
                         return formatted("%.2f", j.at("ours_us").get<double>() - j.at("raw_us").get<double>());
                       }});
  for (auto& c : cadence_bench::roofline_columns()) t.columns.push_back(std::move(c));
  cadence_bench::print(out, cfg, t);
  cfg.copy.report("cadence-bench-ps");  // after the rows: stdout starts with them
}

std::vector<std::size_t> sizes_for(const config& cfg) {
  if (cfg.throughput) return {std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{4} << 20};
  return cadence_bench::sizes(cfg.min_bytes, cfg.max_bytes, 4);
}

// ---- mpi: one rank per process ----

#if defined(CADENCE_BENCH_WITH_MPI)
constexpr int raw_tag = 11;

// One block of `iters` raw ping-pongs between worker ranks and rank 0; returns µs per round
// trip on each worker (rank 0 echoes `iters * workers` messages in arrival order).
double mpi_raw_block(MPI_Comm comm, int rank, int workers, std::vector<float>& buf, int iters) {
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

int run_mpi(const config& cfg) {
  return cadence_bench::run_mpi_rank("cadence-bench-ps", [&](int rank, int size, MPI_Comm raw) {
    if (size < 2) {
      if (rank == 0) std::fprintf(stderr, "cadence-bench-ps: run under mpirun -np 2 or more\n");
      return 2;
    }
    config local = cfg;  // with the copy bandwidth rank 0 measures
    local.copy = cadence_bench::mpi_copy_rates(raw, sizes_for(cfg));
    mpi_options options;
    options.bounce_buffers = cfg.bounce;
    mpi_communicator comm(MPI_COMM_WORLD, options);
    ps_rank me;
    me.rank = rank;
    me.workers = cfg.throughput ? size - 1 : 1;
    me.raw_block = [&](std::vector<float>& buf, int iters) { return mpi_raw_block(raw, rank, me.workers, buf, iters); };
    me.ours_block = [&](std::vector<float>& buf, int iters) {
      MPI_Barrier(raw);
      return ours_block(comm, me.workers, buf, iters, cfg.sgd, cfg.gradient_buffer);
    };
    me.average_over_workers = [&](double v) {
      double mine = (rank >= 1 && rank <= me.workers) ? v : 0.0, sum = 0;
      MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, raw);
      return sum / me.workers;
    };
    const auto rows = measure(me, cfg, sizes_for(cfg));
    if (rank == 0) print(rows, local, me.workers);
    return 0;
  });
}
#endif

// ---- zmq: ranks as threads, each with its own communicator over TCP on 127.0.0.1 ----

#if defined(CADENCE_BENCH_WITH_ZMQ)
// The raw side: a ROUTER on the server, a DEALER per worker; the server sends each message it
// receives straight back to its sender (no copy), a worker zmq_send's (copies) its bytes.
class raw_zmq_echo {
public:
  raw_zmq_echo() = default;
  ~raw_zmq_echo() {
    if (s_ != nullptr) zmq_close(s_);
  }
  raw_zmq_echo(const raw_zmq_echo&) = delete;
  raw_zmq_echo& operator=(const raw_zmq_echo&) = delete;

  std::string serve(const std::string& host = "127.0.0.1") {
    s_ = ctx_.socket(ZMQ_ROUTER);
    if (zmq_bind(s_, ("tcp://" + host + ":0").c_str()) != 0)
      throw std::runtime_error("raw zmq: cannot bind tcp://" + host + ":0: " + zmq_strerror(zmq_errno()));
    return cadence_bench::last_endpoint(s_);
  }
  void dial(const std::string& server) {
    s_ = ctx_.socket(ZMQ_DEALER);
    zmq_connect(s_, server.c_str());
  }
  void echo(int messages) {
    for (int i = 0; i < messages; ++i) {
      zmq_msg_t id, body;
      zmq_msg_init(&id);
      zmq_msg_init(&body);
      zmq_msg_recv(&id, s_, 0);
      zmq_msg_recv(&body, s_, 0);
      zmq_msg_send(&id, s_, ZMQ_SNDMORE);
      zmq_msg_send(&body, s_, 0);
    }
  }
  void round_trip(std::vector<float>& buf) {
    const std::size_t n = buf.size() * sizeof(float);
    zmq_send(s_, buf.data(), n, 0);
    zmq_recv(s_, buf.data(), n, 0);
  }

private:
  cadence_bench::raw_zmq_context ctx_;  // closed last: the socket closes first
  void* s_ = nullptr;
};

// What zmq rank r measures with: blocks of raw echoes and of parameter-server round trips over
// comm, each after the ranks line up, and the mean over the workers; `sum` adds one value over
// all ranks (and so lines them up).
template <class Comm>
ps_rank zmq_rank(int r, int workers, raw_zmq_echo& raw, Comm& comm, bool sgd, std::function<double(double)> sum) {
  ps_rank me;
  me.rank = r;
  me.workers = workers;
  me.raw_block = [=, &raw](std::vector<float>& buf, int iters) {
    sum(0);
    const auto t0 = steady::now();
    if (r == 0)
      raw.echo(iters * workers);
    else if (r <= workers)
      for (int i = 0; i < iters; ++i) raw.round_trip(buf);
    return std::chrono::duration<double, std::micro>(steady::now() - t0).count() / iters;
  };
  me.ours_block = [=, &comm](std::vector<float>& buf, int iters) {
    sum(0);
    return ours_block(comm, workers, buf, iters, sgd);
  };
  me.average_over_workers = [=](double v) { return sum(r >= 1 && r <= workers ? v : 0.0) / workers; };
  return me;
}

// --security-cost: the raw side is the same push_pull block over an open communicator.
template <class Comm>
std::function<double(std::vector<float>&, int)> zmq_open_block(Comm& open, int workers, bool sgd,
                                                                std::function<double(double)> sum) {
  return [=, &open](std::vector<float>& buf, int iters) {
    sum(0);
    return ours_block(open, workers, buf, iters, sgd);
  };
}

// Ranks as threads: rank 0 publishes its raw echo server's endpoint and the communicator's
// rendezvous; the others wait for both.
int run_zmq(const config& cfg) {
  if (cfg.ranks < 2) throw usage_error("--ranks: the zmq backend needs at least 2 (a server and a worker)");
  const int workers = cfg.throughput ? cfg.ranks - 1 : 1;
  cadence_bench::summing_barrier sync(cfg.ranks);
  cadence_bench::thread_rendezvous meet, meet_open, meet_again, echo_server;
  const auto rows = cadence_bench::rank0_result(cfg.ranks, [&](int r) {
    raw_zmq_echo raw;
    if (r == 0)
      echo_server.publish(raw.serve());
    else
      raw.dial(echo_server.wait());
    zmq_communicator comm(r, cfg.ranks, cadence_bench::zmq_thread_options<zmq_options>(r, meet),
                          std::chrono::seconds(60));
    ps_rank me = zmq_rank(r, workers, raw, comm, cfg.sgd, [&sync](double v) { return sync.arrive_and_sum(v); });
    std::unique_ptr<zmq_communicator> open;
    if (cfg.security_cost) {
      // Timed after the ranks line up: an open communicator, kept, and a second authenticated one.
      open = cadence_bench::open_beside_authenticated<zmq_communicator, zmq_options>(
          "cadence-bench-ps", r, cfg.ranks, meet_open, meet_again, sync);
      me.raw_block = zmq_open_block(*open, workers, cfg.sgd, [&sync](double v) { return sync.arrive_and_sum(v); });
    }
    auto mine = measure(me, cfg, sizes_for(cfg));
    sync.arrive_and_sum(0);  // nobody closes while another still runs
    return mine;
  });
  print(rows, cfg, workers);
  return 0;
}

// Ranks as processes (on several hosts, or network namespaces): rank 0 binds the communicator's
// rendezvous at --rendezvous and its raw echo server on --address, whose endpoint it broadcasts;
// the line-ups and averages go over the communicator's all-reduce.
int run_zmq_process(const config& cfg) {
  if (cfg.ranks < 2) throw usage_error("--ranks: the zmq backend needs at least 2 (a server and a worker)");
  const int r = cfg.rank;
  const int workers = cfg.throughput ? cfg.ranks - 1 : 1;
  zmq_options options;
  options.rendezvous = "tcp://" + cfg.rendezvous;
  options.endpoint = "tcp://" + cfg.address + ":0";
  // Processes of one job hold one secret: the launcher's, in the environment.
  options.secret = cadence_bench::process_secret();
  zmq_communicator comm(r, cfg.ranks, options, std::chrono::seconds(120));
  raw_zmq_echo raw;
  char endpoint[256] = {};
  if (r == 0) {
    const std::string e = raw.serve(cfg.address);
    std::snprintf(endpoint, sizeof endpoint, "%s", e.c_str());
  }
  comm.broadcast(endpoint, sizeof endpoint, 0, std::chrono::seconds(60));
  if (r != 0) raw.dial(endpoint);
  auto sum = [&comm](double v) {
    comm.allreduce(&v, 1, dtype::f64, reduce_op::sum, std::chrono::seconds(120));
    return v;
  };
  ps_rank me = zmq_rank(r, workers, raw, comm, cfg.sgd, sum);
  std::unique_ptr<zmq_communicator> open;
  if (cfg.security_cost) {
    // Timed after the ranks line up: a second communicator, open, kept (its rendezvous on the
    // next port, on a network address by name), and a third, authenticated (the port after).
    const auto colon = cfg.rendezvous.rfind(':');
    const int port = std::stoi(cfg.rendezvous.substr(colon + 1));
    const auto line_up = [&sum] { sum(0); };
    zmq_options o = options;
    o.rendezvous = "tcp://" + cfg.rendezvous.substr(0, colon) + ":" + std::to_string(port + 1);
    o.secret = {};
    o.security = wire_security::open;
    o.force_open_on_network = true;
    double open_ms = 0;
    std::tie(open, open_ms) =
        cadence_bench::timed_communicator<zmq_communicator>(r, cfg.ranks, [&] { return o; }, line_up);
    zmq_options again = options;
    again.rendezvous = "tcp://" + cfg.rendezvous.substr(0, colon) + ":" + std::to_string(port + 2);
    const double authenticated_ms =
        cadence_bench::timed_communicator<zmq_communicator>(r, cfg.ranks, [&] { return again; }, line_up).second;
    cadence_bench::report_connect("cadence-bench-ps", r, cfg.ranks, sum(open_ms) / cfg.ranks,
                                  sum(authenticated_ms) / cfg.ranks);
    me.raw_block = zmq_open_block(*open, workers, cfg.sgd, sum);
  }
  const auto rows = measure(me, cfg, sizes_for(cfg));
  sum(0);  // nobody closes while another still runs
  if (r == 0) print(rows, cfg, workers);
  return 0;
}
#endif

int run(int argc, char** argv) {
  config cfg;
  cadence::tools::command_line cli(
      "usage: mpirun -np 2 cadence-bench-ps --backend mpi [--json | --csv] [--reps R]\n"
      "         [--max-bytes B] [--no-bounce] [--gradient-buffer] [--sgd]\n"
      "       mpirun -np W+1 cadence-bench-ps --backend mpi --throughput\n"
      "       cadence-bench-ps --backend zmq [--ranks W+1] [--json | --csv] [--reps R] [--max-bytes B]\n"
      "         [--sgd] [--throughput] [--security-cost]\n"
      "       cadence-bench-ps --backend zmq --ranks W+1 --rank R --rendezvous H:P [--address A] ...\n",
      "", 17);
  cadence_bench::add_common_flags(
      cli, cfg,
      {{"--backend", "mpi or zmq"},
       {"--ranks", "zmq: ranks as threads, 1 server and N-1 workers (default 2)"},
       {"--rank", "zmq: ranks as processes (on several hosts): this one is rank R of\n"
                  "--ranks N; rank 0 prints"},
       {"--rendezvous", "zmq, with --rank: rank 0 binds the rendezvous H:P (one of its\n"
                        "addresses), the others reach it there"},
       {"--address", "zmq, with --rank: the address each binds (default 127.0.0.1)"},
       {"--max-bytes", "largest round trip (default 16 MiB; sizes go 4 KiB, x4, ..., B)"},
       {"--reps", "raw/ours pairs per size, median reported (default 5)"},
       {"--json", "one JSON array, an object per size"},
       {"--csv", "a header row and a row per size, the JSON's keys as columns"}});
  cli.add_flag("--throughput", cfg.throughput, "every worker pushes at once (sizes 64 KiB, 1 MiB, 4 MiB)");
  cli.add_flag_callback("--no-bounce", [&cfg] { cfg.bounce = false; }, "mpi_options::bounce_buffers = false");
  cli.add_flag_callback("--gradient-buffer", [&cfg] { cfg.gradient_buffer = true; },
                        "mpi: the worker pushes from ps_worker::gradient_buffer(), no copy");
  cli.add_flag("--sgd", cfg.sgd, "apply SGD on the server (default: a no-op update rule)");
  cli.add_flag("--security-cost", cfg.security_cost,
               "zmq: raw = the same push_pull over an open communicator (ours:\n"
               "authenticated); with --rank it also binds the next two ports");
  if (!cadence_bench::read_flags(cli, cfg, argc, argv)) return 0;
  cadence_bench::check_sizes_and_backend(cfg, cfg.security_cost, "zmq");
  if (cadence_bench::measures_copy_first(cfg)) cfg.copy = cadence_bench::copy_rates(sizes_for(cfg));
  return cadence_bench::run_backend(
      cfg.backend, {CADENCE_BENCH_MPI([&] { return run_mpi(cfg); }),
                    CADENCE_BENCH_ZMQ([&] { return cfg.processes() ? run_zmq_process(cfg) : run_zmq(cfg); })});
}

}  // namespace

int main(int argc, char** argv) { return cadence::tools::guarded_main("cadence-bench-ps", run, argc, argv); }
