// How the command-line benchmarks start the ranks of a backend as threads of one process:
// ZeroMQ ranks (rank 0 binds its rendezvous on a port the system picks and the others wait for
// its address; tests/consumer/zmq_main.cpp starts its ranks so too) and gloo ranks (a
// rendezvous folder that goes when they end). nccl.hpp and mpi.hpp hold the NCCL and MPI
// parts, command_line.hpp the choice of --backend. Not part of the library: it needs only the
// standard library (a backend's options type comes in as a template argument).
#pragma once

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace cadence_bench {

/// One text rank 0 publishes and the other ranks (threads) wait for: the address its
/// rendezvous got, an endpoint of its own.
class thread_rendezvous {
public:
  void publish(std::string value) {
    std::lock_guard<std::mutex> lock(m_);
    value_ = std::move(value);
    published_.notify_all();
  }
  /// The published text; throws std::runtime_error when rank 0 has published nothing within
  /// `timeout`.
  std::string wait(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::unique_lock<std::mutex> lock(m_);
    if (!published_.wait_for(lock, timeout, [&] { return !value_.empty(); }))
      throw std::runtime_error("rank 0 never bound its rendezvous");
    return value_;
  }

private:
  std::mutex m_;
  std::condition_variable published_;
  std::string value_;
};

/// The options of ZeroMQ rank `rank` of ranks run as threads on 127.0.0.1 (Options is
/// cadence::transport::zmq_options): rank 0 binds its rendezvous on a port the system picks
/// and publishes the address on `meet`; the others wait for it there.
template <class Options>
Options zmq_thread_options(int rank, thread_rendezvous& meet) {
  Options options;
  // One job secret for the ranks of this process (threads): authenticated and encrypted, as a
  // job runs by default.
  static const auto secret = decltype(options.secret)::generate();
  options.secret = secret;
  if (rank == 0) {
    options.rendezvous = "tcp://127.0.0.1:0";
    options.on_rendezvous_bound = [&meet](const std::string& address) { meet.publish(address); };
  } else {
    options.rendezvous = meet.wait();
  }
  return options;
}

/// --security-cost: a communicator made after the ranks line up (`line_up()`: every rank
/// calls it, none returns before all did) with the options `make_options()` gives then (a rank
/// of threads waits there for rank 0's rendezvous, which rank 0 binds in its constructor), and
/// how long its constructor took here in ms; the ranks line up again before it is handed back,
/// so that none is closed while another still connects to it.
template <class Comm, class MakeOptions, class LineUp>
std::pair<std::unique_ptr<Comm>, double> timed_communicator(int rank, int ranks, MakeOptions&& make_options,
                                                            LineUp&& line_up) {
  line_up();
  const auto options = make_options();
  const auto t0 = std::chrono::steady_clock::now();
  auto comm = std::make_unique<Comm>(rank, ranks, options, std::chrono::seconds(120));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  line_up();
  return {std::move(comm), ms};
}

/// --security-cost: rank 0 says on stderr what making a communicator took (each value the mean
/// over the ranks), open and authenticated: the handshakes' cost, each rank connecting to n - 1.
inline void report_connect(const char* program, int rank, int ranks, double open_ms, double authenticated_ms) {
  if (rank != 0) return;
  std::fprintf(stderr,
               "%s: connecting (a communicator, mean over %d ranks, each with %d peers): open %.2f ms, "
               "authenticated %.2f ms, %.2f ms more per peer\n",
               program, ranks, ranks - 1, open_ms, authenticated_ms, (authenticated_ms - open_ms) / (ranks - 1));
}

/// --security-cost with ZeroMQ ranks as threads: after the ranks line up on `sync` (a
/// summing_barrier), an open communicator (no secret, wire_security::open) meeting on `meet_open`,
/// kept and returned for the open rows, and a second authenticated one meeting on `meet_again`,
/// timed and closed; rank 0 reports both connect times (report_connect). Comm and Options are
/// zmq_communicator and zmq_options.
template <class Comm, class Options, class Sync>
std::unique_ptr<Comm> open_beside_authenticated(const char* program, int rank, int ranks, thread_rendezvous& meet_open,
                                                thread_rendezvous& meet_again, Sync& sync) {
  const auto line_up = [&sync] { sync.arrive_and_sum(0); };
  const auto open_options = [&] {
    auto o = zmq_thread_options<Options>(rank, meet_open);
    o.secret = {};
    o.security = decltype(o.security)::open;
    return o;
  };
  auto [open, open_ms] = timed_communicator<Comm>(rank, ranks, open_options, line_up);
  const double authenticated_ms =
      timed_communicator<Comm>(rank, ranks, [&] { return zmq_thread_options<Options>(rank, meet_again); }, line_up)
          .second;
  report_connect(program, rank, ranks, sync.arrive_and_sum(open_ms) / ranks,
                 sync.arrive_and_sum(authenticated_ms) / ranks);
  return std::move(open);
}

/// A fresh folder under the system's temporary directory ("PREFIX-XXXXXX"), removed with
/// everything in it when this object goes, whether the ranks that met there succeeded or
/// not: gloo's rendezvous store for ranks as threads.
class temp_folder {
public:
  explicit temp_folder(const std::string& prefix) {
    path_ = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(path_.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + path_);
  }
  temp_folder(const temp_folder&) = delete;
  temp_folder& operator=(const temp_folder&) = delete;
  ~temp_folder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const noexcept { return path_; }

private:
  std::string path_;
};

}  // namespace cadence_bench
