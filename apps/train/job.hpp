// cadence-train's transports: how the processes of a run connect and talk (MPI under mpirun,
// or gloo or ZeroMQ processes started by launch-gloo.sh that meet in a shared folder or at a
// TCP store rank 0 serves), behind one face,
// so the server, the workers and the collective modes are written once over the communicator
// concept.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#if CADENCE_TRAIN_HAS_MPI
#include <cadence/transport/mpi/communicator.hpp>
#include <mpi.h>
#endif
#if CADENCE_TRAIN_HAS_GLOO
#include <cadence/transport/gloo/communicator.hpp>
#endif
#if CADENCE_TRAIN_HAS_ZMQ
#include <cadence/transport/zmq/communicator.hpp>
#endif
#include <cadence/transport/tcp_store.hpp>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

namespace cadence::train {

/// How long connecting and the bookkeeping exchanges between policies may take.
inline constexpr std::chrono::seconds connect_timeout{120};

/// Rank 0 gets every rank's `mine` (index = rank; its own included); the others get nothing.
/// Point to point over any communicator, so the same code runs over MPI and gloo.
template <class C>
std::vector<std::vector<double>> gather_to_root(C& c, const std::vector<double>& mine, int tag,
                                                transport::deadline d) {
  std::vector<std::vector<double>> out;
  if (c.rank() != 0) {
    const std::uint64_t n = mine.size();
    c.send(&n, sizeof n, 0, tag, d);
    if (n != 0) c.send(mine.data(), n * sizeof(double), 0, tag, d);
    return out;
  }
  out.resize(static_cast<std::size_t>(c.size()));
  out[0] = mine;
  for (int r = 1; r < c.size(); ++r) {
    std::uint64_t n = 0;
    c.recv(&n, sizeof n, r, tag, d);
    auto& v = out[static_cast<std::size_t>(r)];
    v.resize(static_cast<std::size_t>(n));
    if (n != 0) c.recv(v.data(), n * sizeof(double), r, tag, d);
  }
  return out;
}

/// gather_to_root for after a policy in which the server evicted some workers: rank 0 first
/// receives from every other rank, then waits at most `grace` (in all) for the first word of
/// each rank in `may_be_gone` (an evicted worker that was only stopped sends once resumed; a
/// killed one never does) and lists in `gone` those that sent nothing, leaving their entry
/// empty. A rank that is gone shows as silence (MPI: try_recv's deadline, the communicator
/// stays usable) or as a lost peer (zmq: the connection closed, which fails only the calls
/// with that rank; gloo: the same, but it fails the communicator; the suspects not probed yet
/// are then counted gone too, and the caller must not use `c` again). The others as
/// gather_to_root, except that over a communicator that isolates a lost peer (zmq) any rank
/// found lost is listed in `gone` too: a worker killed after it finished, so never evicted.
template <class C>
std::vector<std::vector<double>> gather_to_root(C& c, const std::vector<double>& mine, int tag,
                                                transport::deadline d, const std::vector<int>& may_be_gone,
                                                std::chrono::nanoseconds grace, std::vector<int>& gone) {
  gone.clear();
  const bool isolates = c.capabilities().isolates_lost_peer;
  if (c.rank() != 0 || (may_be_gone.empty() && !isolates)) return gather_to_root(c, mine, tag, d);
  std::vector<std::vector<double>> out(static_cast<std::size_t>(c.size()));
  out[0] = mine;
  auto rest = [&](int r, std::uint64_t n) {
    auto& v = out[static_cast<std::size_t>(r)];
    v.resize(static_cast<std::size_t>(n));
    if (n != 0) c.recv(v.data(), n * sizeof(double), r, tag, d);
  };
  auto suspect = [&](int r) { return std::find(may_be_gone.begin(), may_be_gone.end(), r) != may_be_gone.end(); };
  for (int r = 1; r < c.size(); ++r) {
    if (suspect(r)) continue;
    try {
      std::uint64_t n = 0;
      c.recv(&n, sizeof n, r, tag, d);
      rest(r, n);
    } catch (const transport_error&) {
      if (!isolates || c.failed()) throw;
      out[static_cast<std::size_t>(r)].clear();
      gone.push_back(r);  // lost: its connection closed (killed after it finished)
    }
  }
  const transport::deadline silent_by(grace);  // one wait for all of them, not one each
  for (int r = 1; r < c.size(); ++r) {
    if (!suspect(r)) continue;
    if (c.failed()) {  // a suspect probed before was lost and took the communicator with it
      gone.push_back(r);
      continue;
    }
    std::uint64_t n = 0;
    try {
      if (!c.try_recv(&n, sizeof n, r, tag, silent_by)) {
        gone.push_back(r);
        continue;
      }
    } catch (const transport_error&) {
      if (!c.failed() && !c.capabilities().isolates_lost_peer) throw;
      gone.push_back(r);  // lost (its connection closed)
      continue;
    }
    try {
      rest(r, n);
    } catch (const transport_error&) {
      if (!isolates || c.failed()) throw;
      out[static_cast<std::size_t>(r)].clear();
      gone.push_back(r);  // lost halfway through its record
    }
  }
  std::sort(gone.begin(), gone.end());
  return out;
}

#if CADENCE_TRAIN_HAS_MPI
/// The processes mpirun started. MPI must be initialized (MPI_THREAD_FUNNELED) for as long as
/// the object lives.
class mpi_job {
public:
  using comm_type = transport::mpi_communicator;
  /// Whether a process can join a running policy (connect_all(k, true)): not under MPI.
  static constexpr bool joinable = false;

  mpi_job() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  mpi_job(const mpi_job&) = delete;
  mpi_job& operator=(const mpi_job&) = delete;
  ~mpi_job() {
    control_.reset();
    world_.reset();
    if (sub_ != MPI_COMM_NULL) MPI_Comm_free(&sub_);
  }

  const char* name() const noexcept { return "mpi"; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// Over every rank, for the bookkeeping between policies (made on first use).
  comm_type& world() {
    if (!world_) world_ = std::make_unique<comm_type>(MPI_COMM_WORLD, options(), connect_timeout);
    return *world_;
  }
  /// Over every rank, for rank 0's word to the workers after each policy (go on or stop);
  /// apart from world(), which a lost rank may fail. Made on first use (collective): call it
  /// on every rank before the first policy.
  comm_type& control() {
    if (!control_) control_ = std::make_unique<comm_type>(MPI_COMM_WORLD, options(), connect_timeout);
    return *control_;
  }
  /// A fresh communicator over every rank for policy number `k` (collective).
  std::unique_ptr<comm_type> connect_all(std::size_t /*k*/) {
    return std::make_unique<comm_type>(MPI_COMM_WORLD, options(), connect_timeout);
  }
  /// A fresh communicator over the workers (ranks 1..n-1, as ranks 0..n-2) for policy `k`;
  /// collective over every rank, null on rank 0. Give it back with disconnect_workers.
  std::unique_ptr<comm_type> connect_workers(std::size_t /*k*/) {
    MPI_Comm_split(MPI_COMM_WORLD, rank_ == 0 ? MPI_UNDEFINED : 1, 0, &sub_);
    if (rank_ == 0) return nullptr;
    return std::make_unique<comm_type>(sub_, options(), connect_timeout);
  }
  void disconnect_workers(std::unique_ptr<comm_type>& c) {
    c.reset();
    if (sub_ != MPI_COMM_NULL) MPI_Comm_free(&sub_);
  }
  /// Ends every process of the job (a rank failed mid-run; the others may wait for it).
  [[noreturn]] void abort_all() {
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }
  /// A rank of the job is gone (killed; mpirun --enable-recovery kept the others running).
  /// MPI_Finalize then must not be called: it waits for every rank, the dead one too, and
  /// under Open MPI 4.1 it hung in about 1 run in 8 (ompi_mpi_finalize, in its PMIx fence).
  void note_gone() noexcept { gone_ = true; }
  bool gone() const noexcept { return gone_; }

private:
  static transport::mpi_options options() {
    transport::mpi_options mo;
    // Five ranks share two cores: a waiting rank must give its core to the computing ones
    // soon (the default spins 200 ms, which would steal the profile's compute time).
    mo.spin_for = std::chrono::microseconds(2000);
    mo.poll_sleep = std::chrono::microseconds(50);
    return mo;
  }
  int rank_ = 0, size_ = 1;
  bool gone_ = false;
  MPI_Comm sub_ = MPI_COMM_NULL;
  std::unique_ptr<comm_type> world_, control_;
};
#endif

/// How the processes of a gloo or zmq run guard their connections: the job secret (every process
/// of the run holds the same), or a run without one asked for by name (--insecure).
struct job_security {
  transport::job_secret secret;
  transport::wire_security mode = transport::wire_security::authenticated;
  bool force_open_on_network = false;

  transport::tcp_store_options store() const {
    transport::tcp_store_options o;
    o.secret = secret;
    o.security = mode;
    o.force_open_on_network = force_open_on_network;
    o.on_event = [](const std::string& line) { std::fprintf(stderr, "cadence-train: %s\n", line.c_str()); };
    return o;
  }
#if CADENCE_TRAIN_HAS_ZMQ
  void apply(transport::zmq_options& o) const {
    o.secret = secret;
    o.security = mode;
    o.force_open_on_network = force_open_on_network;
    o.on_event = [](const std::string& line) { std::fprintf(stderr, "cadence-train: %s\n", line.c_str()); };
  }
#endif
};

/// Where the processes of a gloo or zmq run meet: a folder they all share (--store), or a TCP
/// store that rank 0 serves at a known host:port for the whole run (--rendezvous), for hosts
/// that share no file system. Small named values (a zmq communicator's rendezvous address, the
/// policy running) are files in the folder or keys in the store.
class meeting_point {
public:
  /// A folder every process of the run can write.
  static meeting_point folder(std::string dir) {
    meeting_point m;
    m.folder_ = std::move(dir);
    return m;
  }
  /// The store at `address`, guarded by `security`; `serve`: this process (rank 0) serves it
  /// until it ends. Throws when rank 0 cannot listen there (the port is taken, the host is not
  /// its own) or the security options are refused.
  static meeting_point tcp(std::string address, bool serve, const job_security& security) {
    meeting_point m;
    transport::detail::parse_host_port(address, "cadence::transport::tcp_store");  // the same error on every rank
    m.address_ = std::move(address);
    m.store_ = security.store();
    if (serve) m.server_ = std::make_shared<transport::tcp_store_server>(m.address_, m.store_);
    return m;
  }

  bool is_tcp() const noexcept { return !address_.empty(); }
  const std::string& address() const noexcept { return address_; }
  /// How the TCP store is guarded (the secret a communicator's own rendezvous there needs).
  const transport::tcp_store_options& store_options() const noexcept { return store_; }
  const std::string& folder_path() const noexcept { return folder_; }

  /// Sets `name` to `value` whole: a reader sees the old value or the new one.
  void publish(const std::string& name, const std::string& value) {
    if (is_tcp()) {
      std::lock_guard<std::mutex> lock(*mutex_);
      client().set(name, value, connect_timeout);
      return;
    }
    const std::string file = folder_ + "/" + name, tmp = file + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << value;
      if (!out.flush()) throw cadence::invalid_parameter_error("cadence-train: cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), file.c_str()) != 0)
      throw cadence::invalid_parameter_error("cadence-train: cannot rename " + tmp + " to " + file);
  }
  /// What `name` holds, or nothing when no process has published it.
  std::optional<std::string> read(const std::string& name) {
    if (is_tcp()) {
      std::lock_guard<std::mutex> lock(*mutex_);
      return client().try_get(name, connect_timeout);
    }
    std::ifstream in(folder_ + "/" + name);
    if (!in) return std::nullopt;
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  }
  /// Where `name` lives, for messages: the file, or the key and the store.
  std::string where(const std::string& name) const {
    return is_tcp() ? "key '" + name + "' of the store at " + address_ : folder_ + "/" + name;
  }

private:
  transport::tcp_store& client() {
    if (!client_) client_ = std::make_shared<transport::tcp_store>(address_, store_, connect_timeout);
    return *client_;
  }
  std::string folder_, address_;
  transport::tcp_store_options store_;
  std::shared_ptr<transport::tcp_store_server> server_;
  std::shared_ptr<transport::tcp_store> client_;
  std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
};

#if CADENCE_TRAIN_HAS_GLOO
/// Processes that found each other through a rendezvous folder (gloo's file store) or rank 0's
/// TCP store (meeting_point), each told its rank and the job's size (launch-gloo.sh does this).
/// Each communicator rendezvouses under a prefix of its own: "world", "control",
/// "policy-<k>", "policy-<k>-workers".
class gloo_job {
public:
  using comm_type = transport::gloo_communicator;
  static constexpr bool joinable = false;  // gloo's mesh is fixed at rendezvous

  /// `address`: the one this process's gloo device binds and the others reach it by.
  gloo_job(int rank, int size, meeting_point meet, std::string address = "127.0.0.1", job_security security = {})
      : rank_(rank), size_(size), meet_(std::move(meet)), address_(std::move(address)),
        security_(std::move(security)) {}

  const char* name() const noexcept { return "gloo"; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  comm_type& world() {
    if (!world_) world_ = std::make_unique<comm_type>(rank_, size_, options("world"), connect_timeout);
    return *world_;
  }
  comm_type& control() {
    if (!control_) control_ = std::make_unique<comm_type>(rank_, size_, options("control"), connect_timeout);
    return *control_;
  }
  std::unique_ptr<comm_type> connect_all(std::size_t k) {
    return std::make_unique<comm_type>(rank_, size_, options("policy-" + std::to_string(k)), connect_timeout);
  }
  std::unique_ptr<comm_type> connect_workers(std::size_t k) {
    if (rank_ == 0) return nullptr;
    return std::make_unique<comm_type>(rank_ - 1, size_ - 1, options("policy-" + std::to_string(k) + "-workers"),
                                       connect_timeout);
  }
  void disconnect_workers(std::unique_ptr<comm_type>& c) { c.reset(); }
  /// gloo has no job to end: this process exits, its peers see it lost (or their deadline),
  /// and the launcher ends the rest.
  [[noreturn]] void abort_all() { std::_Exit(1); }
  /// A rank of the job is gone (nothing to do over gloo: each communicator's destructor
  /// skips a lost peer).
  void note_gone() noexcept {}

private:
  transport::gloo_options options(std::string prefix) const {
    transport::gloo_options o;
    if (meet_.is_tcp()) {
      o.rendezvous = meet_.address();
      o.serve_rendezvous = false;  // rank 0 serves the run's store (meeting_point)
      o.store = meet_.store_options();
    } else {
      o.store_path = meet_.folder_path();
    }
    o.prefix = std::move(prefix);
    o.hostname = address_;
    return o;
  }
  int rank_ = 0, size_ = 1;
  meeting_point meet_;
  std::string address_;
  job_security security_;
  std::unique_ptr<comm_type> world_, control_;
};
#endif

#if CADENCE_TRAIN_HAS_ZMQ
/// Processes over ZeroMQ (transport/zmq): launched as for gloo (launch-gloo.sh sets rank, size
/// and where they meet: a folder all of them share, or rank 0's TCP store). For each
/// communicator ("world", "control", "policy-<k>", "policy-<k>-workers") its rank 0 binds a
/// rendezvous port of the system's choosing and publishes the address as "<name>.zmq"
/// (meeting_point: no rank reads half of it); the others wait for it and register there. Each rank binds its data endpoint on
/// `address` ($CADENCE_TRAIN_ADDR, default 127.0.0.1: on several hosts, one the others reach
/// this one by). A lost peer fails only the calls that need it, so the server outlives a
/// killed worker at any moment (transports.md, zmq).
class zmq_job {
public:
  using comm_type = transport::zmq_communicator;
  static constexpr bool joinable = true;

  zmq_job(int rank, int size, meeting_point meet, std::string address, job_security security = {})
      : rank_(rank), size_(size), meet_(std::move(meet)), address_(std::move(address)),
        security_(std::move(security)) {}

  const char* name() const noexcept { return "zmq"; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// How long each start-up step may take (cadence-train --start-timeout): rank 0 waits this
  /// long for the workers at each step; a worker waits for rank 0 worker_start_timeout().
  void set_start_timeout(std::chrono::nanoseconds t) noexcept { start_timeout_ = t; }
  std::chrono::nanoseconds start_timeout() const noexcept { return start_timeout_; }
  /// A worker's wait for rank 0 at one start-up step (its rendezvous address and registration,
  /// its go): three times start_timeout(), since rank 0 may first spend a whole
  /// start_timeout() waiting for another worker at this step and one more answering the rest.
  std::chrono::nanoseconds worker_start_timeout() const noexcept { return 3 * start_timeout_; }

  /// The job's world and control communicators wait only for this rank's own registration
  /// (zmq_wait_for::self): a worker that dies before it registers holds nobody, and rank 0
  /// finds who is there point to point, within the start-up deadline (introduce_ranks).
  comm_type& world() {
    if (!world_) world_ = connect("world", rank_, size_, transport::zmq_wait_for::self, step_timeout());
    return *world_;
  }
  comm_type& control() {
    if (!control_) control_ = connect("control", rank_, size_, transport::zmq_wait_for::self, step_timeout());
    return *control_;
  }
  /// This rank's bound on one start-up step: start_timeout() on rank 0, worker_start_timeout()
  /// on a worker.
  std::chrono::nanoseconds step_timeout() const noexcept {
    return rank_ == 0 ? start_timeout_ : worker_start_timeout();
  }
  std::unique_ptr<comm_type> connect_all(std::size_t k) { return connect("policy-" + std::to_string(k), rank_, size_); }
  /// Rank 0, on a communicator made with zmq_wait_for::self: answers the other ranks'
  /// registrations (rank 0 answers only inside a call) until every rank but those in `skip`
  /// has registered or is lost, or the start-up deadline passed. Returns those still absent.
  std::vector<int> await_registrations(comm_type& c, const std::vector<int>& skip) {
    const transport::deadline d(start_timeout_);
    std::vector<int> absent;
    for (;;) {
      c.poll();
      absent.clear();
      for (int q = 1; q < c.size(); ++q)
        if (std::find(skip.begin(), skip.end(), q) == skip.end() &&
            c.peer_state(q) == transport::zmq_peer_state::absent)
          absent.push_back(q);
      if (absent.empty() || d.passed()) return absent;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  /// With `open`, construction waits only for this rank's own registration
  /// (zmq_wait_for::self): the server starts without a rank that joins later, and that rank
  /// can register while the policy runs (cadence-train --join-after), or a process replacing
  /// a killed one register in its slot under a new incarnation (--rejoin). `timeout` bounds
  /// the wait for rank 0: a joiner gives up once the policy must be over (a server whose
  /// members are all gone ends early and never answers).
  std::unique_ptr<comm_type> connect_all(std::size_t k, bool open,
                                         std::chrono::nanoseconds timeout = connect_timeout) {
    return connect("policy-" + std::to_string(k), rank_, size_,
                   open ? transport::zmq_wait_for::self : transport::zmq_wait_for::all, timeout);
  }
  std::unique_ptr<comm_type> connect_workers(std::size_t k) {
    if (rank_ == 0) return nullptr;
    return connect("policy-" + std::to_string(k) + "-workers", rank_ - 1, size_ - 1);
  }
  void disconnect_workers(std::unique_ptr<comm_type>& c) { c.reset(); }
  [[noreturn]] void abort_all() { std::_Exit(1); }
  void note_gone() noexcept {}

  /// Rank 0, as a parameter-server policy starts: its index and start (seconds since the
  /// system clock's epoch) as "running", for a process that replaces a killed worker
  /// (cadence-train --rejoin).
  void publish_running(std::size_t k, double start) {
    std::ostringstream out;
    out.precision(17);
    out << k << " " << start << "\n";
    meet_.publish("running", out.str());
  }
  /// What publish_running wrote last; false when no policy has started.
  bool running(std::size_t& k, double& start) {
    const auto v = meet_.read("running");
    if (!v) return false;
    std::istringstream in(*v);
    return static_cast<bool>(in >> k >> start);
  }

private:
  std::unique_ptr<comm_type> connect(const std::string& name, int rank, int size,
                                     transport::zmq_wait_for wait_for = transport::zmq_wait_for::all,
                                     std::chrono::nanoseconds timeout = connect_timeout) {
    const transport::deadline d(timeout);
    const std::string key = name + ".zmq";
    transport::zmq_options o;
    o.endpoint = "tcp://" + address_ + ":0";
    o.wait_for = wait_for;
    security_.apply(o);
    if (rank == 0) {
      o.rendezvous = "tcp://" + address_ + ":0";
      meeting_point* meet = &meet_;
      o.on_rendezvous_bound = [meet, key](const std::string& bound) { meet->publish(key, bound + "\n"); };
    } else {
      for (;;) {  // bounded by the deadline: rank 0 publishes the address once it has bound
        if (const auto v = meet_.read(key)) {
          std::istringstream in(*v);
          if (std::getline(in, o.rendezvous) && !o.rendezvous.empty()) break;
        }
        if (d.passed())
          throw transport_error("cadence-train: rank " + std::to_string(rank) + " of communicator '" + name +
                                "': no rendezvous address in " + meet_.where(key) + " within " +
                                std::to_string(std::chrono::duration<double>(timeout).count()) +
                                " s (is rank 0 running?)");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return std::make_unique<comm_type>(rank, size, std::move(o), d);
  }

  int rank_ = 0, size_ = 1;
  meeting_point meet_;
  std::string address_;
  job_security security_;
  std::chrono::nanoseconds start_timeout_ = connect_timeout;
  std::unique_ptr<comm_type> world_, control_;
};
#endif

}  // namespace cadence::train
