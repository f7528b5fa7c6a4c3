// The gloo backend (target cadence::gloo): a communicator over a gloo TCP context, found by a
// file-store rendezvous or a TCP store (transport/tcp_store.hpp), whose every wait has a deadline and names the peer it waits for, and
// whose operations run in the background (work handles), driven by the calling thread.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/tcp_store.hpp>

#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#if CADENCE_GLOO_TCP_PEEK
#include <gloo/transport/tcp/unbound_buffer.h>
#endif
#include <gloo/transport/unbound_buffer.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// Which rendezvous API the installed gloo has; cmake/CadenceGloo.cmake detects it and defines
// CADENCE_GLOO_RENDEZVOUS_SHARED_STORE to 1 when connectFullMesh takes the store as a
// std::shared_ptr (upstream since 2023) instead of a reference (Debian's 2022 snapshot).
#ifndef CADENCE_GLOO_RENDEZVOUS_SHARED_STORE
#define CADENCE_GLOO_RENDEZVOUS_SHARED_STORE 0
#endif
// Whether gloo's TCP buffer header compiles (cmake/CadenceGloo.cmake): test() without waiting
// reads its completion counts.
#ifndef CADENCE_GLOO_TCP_PEEK
#define CADENCE_GLOO_TCP_PEEK 0
#endif

namespace cadence::transport {

// ---- gloo_options ----

struct gloo_options {
  /// The rendezvous folder (gloo::rendezvous::FileStore) every rank can reach, typically on a
  /// shared file system or, on one host, a temporary folder. It must exist and be writable.
  /// Not used when `rendezvous` is set.
  std::string store_path;
  /// Rendezvous over TCP instead of a folder, for hosts that share no file system: the
  /// "host:port" of a tcp_store_server (transport/tcp_store.hpp) every rank can reach.
  std::string rendezvous;
  /// With `rendezvous`: rank 0 serves the store itself, binding that address (so its host
  /// must be one of rank 0's addresses, or 0.0.0.0 with the others given rank 0's), for the
  /// construction only: it closes the port once every rank has connected. Clear it when the
  /// job serves a store there for longer (cadence-train's rank 0 serves one for the whole job,
  /// which every communicator of the job shares under its own prefix).
  bool serve_rendezvous = true;
  /// Names this communicator inside the folder or store (its keys are under that name), so
  /// several communicators, or survivors forming a new one after a peer died, share one.
  /// Must be fresh: keys left by an earlier job under the same prefix would be read as peers.
  std::string prefix = "cadence";
  /// The address our TCP device binds; peers connect to it. Loopback by default (one host).
  std::string hostname = "127.0.0.1";
  /// A network interface ("eth0") to bind instead of hostname, when not empty.
  std::string interface_name;
  /// Point to point messages and collectives of at most this many bytes travel in one framed
  /// message through buffers the communicator owns (a send returns as soon as it is posted,
  /// the way MPI's eager protocol does; an all-reduce runs recursive doubling, log2(n)
  /// exchanges of the buffer); larger ones announce their size in a header and then move
  /// between the caller's buffers directly (a send waits for its receiver).
  std::size_t eager_bytes = 64 * 1024;
  /// All-reduces larger than eager_bytes run as a ring (reduce-scatter, then allgather) on the
  /// caller's buffer, in chunks of this many bytes, pipelined; large broadcasts move in chunks
  /// too. Every rank must be given the same eager_bytes and chunk_bytes.
  std::size_t chunk_bytes = 256 * 1024;
  /// Small sends kept until known to be received (gloo has no test that does not block): at
  /// this many, a send first waits, with its deadline, for the oldest to be received (usually
  /// long done). Bounds the memory held to this many copies of up to eager_bytes.
  std::size_t max_eager_in_flight = 64;
  /// Construction polls the folder or store for the other ranks' arrival at this interval.
  std::chrono::milliseconds store_poll{5};
  /// How long a try_recv whose deadline passed while a large message's header arrived waits
  /// for the message's data (sent right behind the header), rather than leave half of it.
  std::chrono::milliseconds body_wait{10000};
  /// How long the destructor of a communicator that has not failed waits for its small sends
  /// to be received (a send returns before that) before it closes the connections.
  std::chrono::milliseconds shutdown_wait{5000};
  /// gloo writes to its sockets with writev(2), without MSG_NOSIGNAL, so a write to a peer
  /// that has died raises SIGPIPE, whose default action kills the whole process, survivors
  /// included. When set, construction sets SIGPIPE to SIG_IGN if it is still at its default
  /// (a handler or disposition the program chose is left alone); the write then fails with
  /// EPIPE and the call reports the peer as lost. This is the one process-wide effect of the
  /// backend (PyTorch and gRPC ignore SIGPIPE for the same reason); clear it to manage SIGPIPE
  /// yourself.
  bool ignore_sigpipe = true;
};

// ---- detail: what travels (notices, frames, slots), owned buffers, the wake-up timer ----

namespace detail {

// Sent before (or with) every collective's data, to every rank that receives it: the
// collective's index and arguments, so that arguments that differ across ranks are reported
// instead of reaching gloo (which would terminate the process on a longer message than the
// receive posted).
struct gloo_notice {
  std::int64_t index = 0;  // 1-based collective index
  std::int64_t kind = 0;   // 1 allreduce, 2 broadcast, 3 construction, 4 shutdown, 5 allreduce_average
  std::int64_t count = 0;  // elements (allreduce) or bytes (broadcast)
  std::int64_t type = 0;   // dtype
  std::int64_t op = 0;     // reduce_op
  std::int64_t root = 0;
  bool operator==(const gloo_notice& o) const {
    return index == o.index && kind == o.kind && count == o.count && type == o.type &&
           op == o.op && root == o.root;
  }
  bool operator<(const gloo_notice& o) const {  // an order of the arguments, for the summary
    if (kind != o.kind) return kind < o.kind;
    if (count != o.count) return count < o.count;
    if (type != o.type) return type < o.type;
    if (op != o.op) return op < o.op;
    return root < o.root;
  }
  std::string describe() const {
    if (kind == 3) return "construction(size " + std::to_string(count) + ")";
    if (kind == 4) return "shutdown (destroyed its communicator)";
    if (kind == 5) return signature_average(static_cast<std::size_t>(count), static_cast<dtype>(type));
    return kind == 1 ? signature("allreduce", static_cast<std::size_t>(count),
                                 static_cast<dtype>(type), static_cast<reduce_op>(op))
                     : signature("broadcast", static_cast<std::size_t>(count), static_cast<int>(root));
  }
};

// The small all-reduce's messages carry, after the sender's own notice, the lowest and the
// highest arguments seen so far and which rank called them: recursive doubling spreads them to
// every rank with the data, so every rank learns of a mismatch anywhere, and names both sides.
struct gloo_summary {
  gloo_notice lo, hi;
  std::int64_t lo_rank = 0, hi_rank = 0;
  void merge(const gloo_summary& o) {
    if (o.lo < lo) lo = o.lo, lo_rank = o.lo_rank;
    if (hi < o.hi) hi = o.hi, hi_rank = o.hi_rank;
  }
  bool agree() const { return !(lo < hi) && !(hi < lo); }
};
inline constexpr std::size_t gloo_small_header = sizeof(gloo_notice) + sizeof(gloo_summary);

// A point to point message's header: its size and tag.
struct gloo_frame {
  std::uint64_t bytes = 0;
  std::uint64_t tag = 0;
};

// gloo slots of our traffic: point to point slots carry the tag in their low bits, and every
// range lies above gloo's own collectives (prefixes 1 to 8 in the top byte, gloo/types.h) so
// gloo::allreduce may share the context.
inline constexpr std::uint64_t gloo_slot_collective = std::uint64_t{0x20} << 56;
inline constexpr std::uint64_t gloo_slot_bulk = std::uint64_t{0x21} << 56;
inline constexpr std::uint64_t gloo_slot_p2p_head = std::uint64_t{0x22} << 56;
inline constexpr std::uint64_t gloo_slot_p2p_body = std::uint64_t{0x23} << 56;

// gloo's messages end in advice and an emoji; the first sentence is what a user needs.
inline std::string gloo_reason(const std::exception& e) {
  std::string s = e.what();
  const auto cut = s.find(". ");
  if (cut != std::string::npos) s.resize(cut);
  if (s.size() > 300) s.resize(300);
  return s;
}

// A buffer the communicator owns, registered with gloo once and reused.
struct gloo_owned {
  std::unique_ptr<unsigned char[]> bytes;
  std::size_t size = 0;
  std::unique_ptr<::gloo::transport::UnboundBuffer> ub;
};

// Whether an operation on a gloo TCP buffer has completed, without waiting: gloo offers only
// blocking waits, but its TCP buffer counts completions under its own mutex. A class derived
// from it may name those protected members, and a pointer to them applies to any buffer of
// that type: the count is read under the buffer's mutex, as gloo's own waits read it. A buffer
// of another transport answers "unknown" (nullopt).
#if CADENCE_GLOO_TCP_PEEK
struct gloo_peek : ::gloo::transport::tcp::UnboundBuffer {
  static std::optional<bool> ready(::gloo::transport::UnboundBuffer& any, bool recv) {
    using tcp_buffer = ::gloo::transport::tcp::UnboundBuffer;
    auto* ub = dynamic_cast<tcp_buffer*>(&any);
    if (ub == nullptr) return std::nullopt;
    std::mutex tcp_buffer::*m = &gloo_peek::m_;
    int tcp_buffer::*n = recv ? &gloo_peek::recvCompletions_ : &gloo_peek::sendCompletions_;
    std::exception_ptr tcp_buffer::*ex = &gloo_peek::ex_;
    std::lock_guard<std::mutex> lock(ub->*m);
    return ub->*n > 0 || ub->*ex != nullptr;
  }
};
#else
struct gloo_peek {
  static std::optional<bool> ready(::gloo::transport::UnboundBuffer&, bool) { return std::nullopt; }
};
#endif

// Wakes one gloo wait at a time at a given time (abortWaitRecv or abortWaitSend), so that no
// wait relies on gloo's wait timeout, which closes every connection of the context. Its thread
// starts with the first arm() and stops with the object.
class gloo_timer {
public:
  gloo_timer() = default;
  gloo_timer(const gloo_timer&) = delete;
  gloo_timer& operator=(const gloo_timer&) = delete;
  ~gloo_timer() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  void arm(::gloo::transport::UnboundBuffer* ub, bool recv, std::chrono::steady_clock::time_point when) {
    std::lock_guard<std::mutex> lock(m_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    armed_ = ub;
    recv_ = recv;
    when_ = when;
    fired_ = false;
    // The thread re-checks when it wakes at the time it sleeps until, so it needs waking only
    // for an earlier time: a wait re-armed for a later deadline costs no context switch.
    if (when < sleeping_until_) cv_.notify_one();
  }
  /// Whether it fired since arm(). Afterwards it touches the buffer no more.
  bool disarm() {
    std::lock_guard<std::mutex> lock(m_);
    armed_ = nullptr;
    return fired_;
  }

private:
  void loop() {
    std::unique_lock<std::mutex> lock(m_);
    while (!stop_) {
      if (armed_ == nullptr) {
        sleeping_until_ = std::chrono::steady_clock::time_point::max();
        cv_.wait(lock);
      } else if (std::chrono::steady_clock::now() >= when_) {
        if (recv_)
          armed_->abortWaitRecv();
        else
          armed_->abortWaitSend();
        armed_ = nullptr;
        fired_ = true;
      } else {
        sleeping_until_ = when_;
        cv_.wait_until(lock, when_);
      }
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false;
  ::gloo::transport::UnboundBuffer* armed_ = nullptr;
  bool recv_ = true;
  std::chrono::steady_clock::time_point when_{};
  std::chrono::steady_clock::time_point sleeping_until_ = std::chrono::steady_clock::time_point::min();
  bool fired_ = false;
};

/// Recursive doubling over n ranks (as the MPI backend's): p, the largest power of two <= n,
/// ranks take part; the n - p others (even ranks below 2(n - p)) hand their data to the odd
/// rank above them first and take the result back last.
struct gloo_doubling {
  int n = 1, p = 1, extra = 0;
  explicit gloo_doubling(int size) : n(size) {
    while (p * 2 <= n) p *= 2;
    extra = n - p;
  }
  int inner(int rank) const noexcept {
    if (rank < 2 * extra) return rank % 2 == 0 ? -1 : rank / 2;
    return rank - extra;
  }
  int outer(int in) const noexcept { return in < extra ? 2 * in + 1 : in + extra; }
  int rounds() const noexcept {
    int r = 0;
    for (int m = 1; m < p; m *= 2) ++r;
    return r;
  }
};

}  // namespace detail

class gloo_communicator;

// ---- gloo_work: the work handle ----

/// A started gloo operation (iallreduce, iallreduce_average, ibroadcast, isend, irecv): models
/// the work handle of communicator.hpp. Only the thread that calls the communicator may use it,
/// and only while the communicator lives. test() and wait() drive every operation in flight.
/// cancel() withdraws a receive whose header has not arrived (the gloo receive stays posted for
/// the next one, as try_recv's does); a send, a collective, or a receive whose data is arriving
/// cannot be withdrawn: cancel() returns false and it goes on in the background.
class gloo_work {
public:
  gloo_work() = default;
  gloo_work(gloo_work&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)), op_(std::move(o.op_)) {}
  gloo_work& operator=(gloo_work&& o) noexcept {
    if (this != &o) {
      cancel();
      comm_ = std::exchange(o.comm_, nullptr);
      op_ = std::move(o.op_);
    }
    return *this;
  }
  gloo_work(const gloo_work&) = delete;
  gloo_work& operator=(const gloo_work&) = delete;
  ~gloo_work() { cancel(); }

  inline bool test();
  inline void wait(deadline d = {});
  /// Progresses, blocking in gloo's waits (the thread sleeps meanwhile), until the operation
  /// completes or `t` comes (beyond the concept): true once it completed; false at `t`, which,
  /// unlike wait()'s deadline, is no failure. For a caller whose thread is otherwise idle.
  inline bool wait_until(deadline::clock::time_point t);
  inline int source() const noexcept;
  inline bool cancel() noexcept;

private:
  friend class gloo_communicator;
  gloo_work(gloo_communicator* c, std::shared_ptr<void> op) : comm_(c), op_(std::move(op)) {}
  gloo_communicator* comm_ = nullptr;
  std::shared_ptr<void> op_;  // gloo_communicator::operation
};

// ---- gloo_communicator ----

namespace detail {

// gloo's view of a tcp_store: the keys of one communicator under its prefix, every wait
// bounded by the construction's deadline (and by gloo's own timeout, when shorter).
class gloo_tcp_store final : public ::gloo::rendezvous::Store {
public:
  gloo_tcp_store(tcp_store& store, std::string prefix, deadline d, std::chrono::milliseconds poll)
      : store_(&store), prefix_(std::move(prefix) + "/"), deadline_(d), poll_(poll) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::string(data.begin(), data.end()), deadline_);
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_->get(prefix_ + key, deadline_, poll_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    const deadline d = deadline::at(std::min(deadline_.time_point(), deadline::clock::now() + timeout));
    store_->wait(full, d, poll_);
  }

private:
  tcp_store* store_;
  std::string prefix_;
  deadline deadline_;
  std::chrono::milliseconds poll_;
};

}  // namespace detail

/// Models transport::communicator over gloo's TCP transport, with try_recv, the asynchronous
/// operations and the averaging all-reduce.
///
/// Construction is collective: every rank of `size` constructs one with the same store folder
/// (or TCP rendezvous address) and prefix. A rank that never arrives makes the others throw
/// transport_error naming it when the deadline passes.
///
/// Threads: one thread calls it (and uses its work handles) at a time (the calls are not
/// synchronized); abort() and failed() may be called from any thread. gloo's own device thread
/// moves the bytes; the communicator's protocol steps (the ring's reductions, posting the next
/// chunks, a message's data after its header) run on the calling thread, whenever it is inside
/// the communicator: any call, a handle's test() or wait(). Collectives run one after the other
/// in issue order; point-to-point operations run beside them.
///
/// What it survives: a peer that crashes or is killed (even with SIGKILL) closes its TCP
/// connections, which the kernel reports at once; a call waiting for that peer throws
/// transport_error naming it as lost, without waiting for its deadline
/// (capabilities().detects_lost_peer). The survivors keep running and may form a new
/// communicator among themselves under a fresh prefix (survives_lost_peer). A receive from
/// any_source waits on no particular connection: it sees a crash only through its deadline.
///
/// try_recv (the concept's optional receive) is offered: at its deadline it returns
/// std::nullopt and the receive stays posted in gloo, to serve the next receive of that source
/// and tag (docs/transports.md, "try_recv"), so a parameter server runs over gloo.
///
/// A failure while an operation on a caller's buffer is posted (the ring, a large message)
/// closes the connections at once, so gloo never touches that buffer afterwards; the peers
/// then see this rank as lost. Other failures leave the connections open until the destructor,
/// which says goodbye to every peer before it closes them.
///
/// Test without waiting needs gloo's TCP transport (the folder rendezvous always makes one):
/// over a context of another transport, test() and the background progress of several
/// operations in flight throw invalid_parameter_error; the blocking calls work.
///
/// Neither copyable nor movable (gloo and the handles hold pointers into it): hold it in a
/// std::unique_ptr.
class gloo_communicator {
public:
  // ---- construction and shutdown ----

  /// Rendezvous through options.store_path, or over TCP at options.rendezvous. Throws
  /// invalid_parameter_error for a store folder that does not exist or is not writable, or a
  /// rendezvous address that does not parse or resolve (before waiting), and transport_error
  /// naming the missing ranks when the others do not all arrive before `d` (rank 0, when the
  /// TCP store it should serve never answers).
  gloo_communicator(int rank, int size, gloo_options options, deadline d = {})
      : options_(std::move(options)), rank_(rank), size_(size) {
    const detail::call_info c{"gloo", "construction", 0, rank_, size_, deadline::clock::now()};
    if (size_ < 1 || rank_ < 0 || rank_ >= size_)
      detail::bad_argument(c, "rank " + std::to_string(rank_) + " is out of range for size " +
                                  std::to_string(size_));
    detail::check_deadline(c, d);
    if (options_.prefix.empty() || options_.prefix.find('/') != std::string::npos)
      detail::bad_argument(c, "the store prefix must be a non-empty name without '/', not \"" +
                                  options_.prefix + "\"");
    const bool tcp = !options_.rendezvous.empty();
    std::string dir;
    // With a TCP rendezvous served here, the server lives to the end of construction: setup()
    // hears every rank's hello, which each sends after connectFullMesh returned, so once it
    // is done nobody reads the store any more.
    std::optional<tcp_store_server> server;
    std::optional<tcp_store> store;
    if (tcp) {
      try {
        if (rank_ == 0 && options_.serve_rendezvous) server.emplace(options_.rendezvous);
        store.emplace(options_.rendezvous, d, options_.store_poll);
      } catch (const invalid_parameter_error& e) {
        detail::bad_argument(c, e.what());
      } catch (const transport_error& e) {
        if (d.passed())
          throw detail::deadline_error(c, {0}, "the rendezvous store at " + options_.rendezvous +
                                                   " never answered");
        throw transport_error(detail::describe(c) + ": " + e.what());
      }
    } else {
      const std::string& folder = options_.store_path;
      struct stat st {};
      if (folder.empty() || ::stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        detail::bad_argument(c, "the store folder \"" + folder + "\" does not exist or is not a folder");
      if (::access(folder.c_str(), W_OK | X_OK) != 0)
        detail::bad_argument(c, "the store folder \"" + folder + "\" is not writable (" +
                                    std::strerror(errno) + ")");
      dir = folder + "/" + options_.prefix;
      if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
        detail::bad_argument(c, "cannot create \"" + dir + "\" in the store folder: " + std::strerror(errno));
    }
    const std::string where = tcp ? "the store at " + options_.rendezvous + " (prefix \"" + options_.prefix + "\")"
                                  : "\"" + dir + "\"";

    ignore_sigpipe();  // before connecting: a rank may die during the rendezvous
    std::shared_ptr<::gloo::transport::Device> device;
    try {
      ::gloo::transport::tcp::attr attr;
      if (!options_.interface_name.empty())
        attr.iface = options_.interface_name;
      else
        attr.hostname = options_.hostname;
      device = ::gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      throw transport_error(detail::describe(c) + ": cannot open a TCP device on " +
                            (options_.interface_name.empty() ? options_.hostname
                                                             : options_.interface_name) +
                            ": " + detail::gloo_reason(e));
    }

    // Our own arrival marks first, polled against the deadline: gloo's store waits would
    // throw "Wait timeout" without saying which rank never came.
    auto mark = [&](int p) { return "cadence-arrived-" + std::to_string(p); };
    // The TCP store's own errors (its connection broke and did not come back) name this call.
    auto arrived = [&](int p) {
      if (!tcp) return ::access((dir + "/" + mark(p)).c_str(), F_OK) == 0;
      try {
        return store->missing({options_.prefix + "/" + mark(p)}, d).empty();
      } catch (const transport_error& e) {
        throw transport_error(detail::describe(c) + ": " + e.what());
      }
    };
    if (tcp) {
      try {
        store->set(options_.prefix + "/" + mark(rank_), "", d);
      } catch (const transport_error& e) {
        throw transport_error(detail::describe(c) + ": " + e.what());
      }
    } else {
      const std::string mine = dir + "/" + mark(rank_), tmp = mine + ".tmp";
      std::FILE* f = std::fopen(tmp.c_str(), "w");
      if (f == nullptr || std::fclose(f) != 0 || std::rename(tmp.c_str(), mine.c_str()) != 0)
        detail::bad_argument(c, "cannot write \"" + mine + "\" in the store folder: " + std::strerror(errno));
    }
    for (std::vector<int> missing = others();;) {
      std::vector<int> still;
      for (const int p : missing)
        if (!arrived(p)) still.push_back(p);
      missing = std::move(still);
      if (missing.empty()) break;
      if (d.passed()) throw detail::deadline_error(c, missing, "they never arrived at the rendezvous in " + where);
      std::this_thread::sleep_for(options_.store_poll);
    }

    try {
      auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
      ctx->setTimeout(remaining_ms(d));
#if CADENCE_GLOO_RENDEZVOUS_SHARED_STORE
      std::shared_ptr<::gloo::rendezvous::Store> gs;
      if (tcp)
        gs = std::make_shared<detail::gloo_tcp_store>(*store, options_.prefix, d, options_.store_poll);
      else
        gs = std::make_shared<::gloo::rendezvous::FileStore>(dir);
      ctx->connectFullMesh(gs, device);
#else
      if (tcp) {
        detail::gloo_tcp_store gs(*store, options_.prefix, d, options_.store_poll);
        ctx->connectFullMesh(gs, device);
      } else {
        ::gloo::rendezvous::FileStore gs(dir);
        ctx->connectFullMesh(gs, device);
      }
#endif
      context_ = std::move(ctx);
    } catch (const std::exception& e) {
      if (d.passed())
        throw detail::deadline_error(c, others(), "connecting: " + detail::gloo_reason(e));
      throw transport_error(detail::describe(c) + ": connecting to " + detail::rank_list(others()) +
                            ": " + detail::gloo_reason(e));
    }
    setup(c, d);
  }

  /// Over a connected gloo context the caller made (any transport, any rendezvous). The
  /// communicator takes it over: it posts receives on its own slots (above gloo's collectives,
  /// so gloo's algorithms may still share it) and closes its connections when it fails or is
  /// destroyed.
  explicit gloo_communicator(std::shared_ptr<::gloo::Context> context, gloo_options options = {},
                             deadline d = {})
      : options_(std::move(options)), context_(std::move(context)) {
    if (!context_)
      throw invalid_parameter_error("cadence::transport[gloo]: construction: null gloo context");
    rank_ = context_->rank;
    size_ = context_->size;
    const detail::call_info c{"gloo", "construction", 0, rank_, size_, deadline::clock::now()};
    detail::check_deadline(c, d);
    setup(c, d);
  }

  gloo_communicator(const gloo_communicator&) = delete;
  gloo_communicator& operator=(const gloo_communicator&) = delete;

  /// Leaves gracefully, then closes the connections and frees the buffers gloo may refer to.
  /// Unless its connections are already closed, it first waits (at most options.shutdown_wait)
  /// for its small sends to be received and for every peer's goodbye: closing a TCP connection
  /// with unread bytes resets it, and a reset destroys data the peer has not read yet, such as
  /// the last collective's (or, after a failure, the message that tells a peer why). A peer
  /// still calling collectives sees "rank r called shutdown". With operations still in flight
  /// it closes at once (they may be on callers' buffers); their handles become orphans.
  ~gloo_communicator() {
    const bool idle = ops_.empty();
    for (auto& o : ops_) o->orphan = true;
    ops_.clear();
    if (context_ && !closed_ && idle) {
      shutting_down_ = true;  // even after abort(): an aborted communicator leaves gracefully too
      const deadline until = options_.shutdown_wait;
      const detail::call_info c{"gloo", "shutdown", 0, rank_, size_, deadline::clock::now()};
      try {
        if (!failed())
          for (auto& m : eager_) wait(c, until, *m.ub, false, {m.dst}, nullptr, "it never received a message");
      } catch (...) {
        // A lost peer, or one that never receives: the goodbye still goes to the others.
      }
      try {
        if (size_ > 1) goodbye(c, until);
      } catch (...) {
      }
    }
    close();
  }

  // ---- the communicator concept: collectives, point to point, abort ----

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// The gloo context, e.g. to run gloo's own algorithms beside ours (the benchmark does).
  const std::shared_ptr<::gloo::Context>& context() const noexcept { return context_; }

  capability_flags capabilities() const noexcept {
    capability_flags f;
    f.any_source = true;
    f.detects_lost_peer = true;   // a closed connection; any_source receives see only the deadline
    f.survives_lost_peer = true;  // survivors continue, and may rendezvous anew without it
    f.device_buffers = false;
    return f;
  }

  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, deadline d = {}) {
    wait_op(*start_allreduce("allreduce", buf, count, t, op, false, &d), d);
  }
  /// The mean over ranks, in place (f32, f64): divided in the ring's last reduce step or the
  /// small path's copy out (communicator.hpp, "averaging all-reduce").
  void allreduce_average(void* buf, std::size_t count, dtype t, deadline d = {}) {
    wait_op(*start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, &d), d);
  }
  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    wait_op(*start_broadcast(buf, bytes, root, &d), d);
  }
  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    wait_op(*start_send(buf, bytes, dst, tag, &d), d);
  }
  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto o = start_recv("recv", buf, bytes, src, tag, &d);
    wait_op(*o, d);
    return o->source;
  }

  /// recv() that treats a deadline with no matching message as "nothing yet": returns
  /// std::nullopt and the communicator stays usable (see try_recv in communicator.hpp); a
  /// deadline already passed polls once. gloo cannot cancel a receive, and its own wait
  /// timeout closes every connection of the context (Debian's snapshot and upstream both call
  /// Context::signalException on it), so no wait here lets gloo time out: a timer thread of the
  /// communicator wakes the wait with abortWaitRecv at the deadline, and the receive stays
  /// posted. The next receive whose (source, tag) it matches waits on that same receive instead
  /// of posting a second one, and a message it takes for another caller's source is kept until a
  /// receive asks for it, so nothing is lost or reordered.
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto o = start_recv("try_recv", buf, bytes, src, tag, nullptr);  // a passed deadline polls once
    if (!wait_op(*o, d, /*poll=*/true)) return std::nullopt;
    return o->source;
  }

  /// The asynchronous forms (communicator.hpp): they start the operation and return at once.
  gloo_work iallreduce(void* buf, std::size_t count, dtype t, reduce_op op) {
    return gloo_work(this, start_allreduce("allreduce", buf, count, t, op, false, nullptr));
  }
  gloo_work iallreduce_average(void* buf, std::size_t count, dtype t) {
    return gloo_work(this, start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, nullptr));
  }
  gloo_work ibroadcast(void* buf, std::size_t bytes, int root) {
    return gloo_work(this, start_broadcast(buf, bytes, root, nullptr));
  }
  gloo_work isend(const void* buf, std::size_t bytes, int dst, int tag) {
    return gloo_work(this, start_send(buf, bytes, dst, tag, nullptr));
  }
  gloo_work irecv(void* buf, std::size_t bytes, int src, int tag) {
    return gloo_work(this, start_recv("recv", buf, bytes, src, tag, nullptr));
  }

  /// Any thread. A call blocked on the owning thread wakes and throws; the next call throws.
  void abort() noexcept {
    aborted_.store(true, std::memory_order_release);
    std::lock_guard<std::mutex> lock(waiting_mutex_);
    if (waiting_ == nullptr) return;
    if (waiting_recv_)
      waiting_->abortWaitRecv();
    else
      waiting_->abortWaitSend();
  }

  bool failed() const noexcept {
    return failed_.load(std::memory_order_acquire) || aborted_.load(std::memory_order_acquire);
  }

private:
  friend class gloo_work;

  // Map of this class. Its state (the members at the end), by who touches it:
  //  - The owning thread only (one call at a time): calls_ (each call's sequence number, from
  //    begin()), collectives_ (the collective index the notices carry), failure_ (the first
  //    failure: fail() sets it, enter() rethrows it), closed_ (close() has run: from fail() or
  //    the destructor), shutting_down_ (in the destructor), ops_ (the operations in flight, in
  //    issue order; progress() advances them), credits_ (completions a blocking wait consumed
  //    for the operation that will take them).
  //  - Other threads too: failed_ and aborted_ (atomics: failed() reads them, abort() sets
  //    aborted_), and, under waiting_mutex_, waiting_ / waiting_recv_: the one gloo buffer a
  //    wait is blocked on, which abort() wakes (block() and wait() register it).
  //  - gloo's device thread, while operations are posted, reads and writes the registered
  //    buffers: in_ (per peer, its next collective message; in_posted_ says which receives are
  //    posted), out_ (our collective message; out_pending_ and out_to_ track its sends),
  //    scratch_ and first_out_ (the ring), the point-to-point header receives (posted_ until
  //    they complete, then early_ when taken for a later receive; spare_heads_ for reuse),
  //    eager_ (small sends not yet known to be received; reap_eager() and the destructor wait
  //    for them), the operations' own buffers on callers' memory, and bye_ (the destructor's
  //    goodbye). They are declared after context_, so destroyed before it, and only after
  //    close().
  //  - timer_'s thread wakes a blocked wait at its time (block() arms it); declared last, it
  //    stops first.
  // The functions below, in order: the operation; starting one; progress and waiting (test
  // without waiting, blocking on one buffer); point to point; the small all-reduce; the ring;
  // broadcast; sizes, setup and closing; calls and failures; the construction and shutdown
  // exchanges; the small sends' bound.

  struct eager_send {
    std::unique_ptr<unsigned char[]> bytes;
    std::size_t size = 0;
    std::unique_ptr<::gloo::transport::UnboundBuffer> ub;
    int dst = -1;
  };

  // A header receive of the point-to-point protocol (see "point to point" below).
  struct p2p_head {
    std::vector<int> from;  // the senders it was posted for, ascending
    int tag = 0;
    int sender = -1;        // once it has completed
    bool reusable = true;   // false once gloo has stored an error on the buffer
    detail::gloo_owned buf;
  };

  // ---- one operation ----

  struct operation {
    enum class kind : unsigned char { send, recv, allreduce, broadcast };
    kind what = kind::send;
    detail::call_info c{};
    bool active = false;     // collectives: started (the ones before it are done)
    bool done = false;
    bool cancelled = false;  // a receive withdrawn before its header came
    bool failed = false;     // the communicator failed while it was in flight
    bool orphan = false;     // its communicator was destroyed
    bool exposed = false;    // gloo may read or write the caller's buffer
    int source = -1;         // recv: the sender, once known
    int peer = -1;           // send: destination; recv: source as asked; broadcast: root
    int tag = 0;
    void* buf = nullptr;
    const void* cbuf = nullptr;
    std::size_t bytes = 0, count = 0;
    dtype type = dtype::u8;
    reduce_op rop = reduce_op::sum;
    bool average = false;
    detail::gloo_notice notice{};
    int phase = 0;  // the state machine's (per kind, see its progress function)
    std::unique_ptr<::gloo::transport::UnboundBuffer> body;  // on the caller's buffer
    std::unique_ptr<::gloo::transport::UnboundBuffer> rout;  // the ring's sends from the caller's buffer
    // small all-reduce
    int round = 0;
    detail::gloo_summary summary{};
    // ring and broadcast
    bool ring = false;
    int step = 0;
    std::size_t chunk = 0, sends = 0;
    std::vector<char> collected;  // per peer: its notice is in
    bool first_out = false;       // the ring's first chunk is out of first_out_
    bool finished() const noexcept { return done || cancelled || failed; }
  };
  using op_ptr = std::shared_ptr<operation>;

  // What a wait blocks on: one gloo buffer, a direction, whom it depends on.
  struct block_point {
    ::gloo::transport::UnboundBuffer* ub = nullptr;
    bool recv = true;
    std::vector<int> peers;
    const char* note = "";
  };

  // ---- starting an operation ----

  detail::call_info begin(const char* name) {
    return {"gloo", name, ++calls_, rank_, size_, deadline::clock::now()};
  }

  op_ptr make(operation::kind what, const detail::call_info& c) {
    auto o = std::make_shared<operation>();
    o->what = what;
    o->c = c;
    return o;
  }

  op_ptr start_allreduce(const char* name, void* buf, std::size_t count, dtype t, reduce_op r, bool average,
                         const deadline* d) {
    const detail::call_info c = begin(name);
    enter(c);
    const std::size_t bytes = detail::checked_bytes(c, count, t);
    detail::check_buffer(c, buf, bytes);
    detail::check_op(c, r);
    if (!detail::host_reducible(t))
      detail::bad_argument(c, std::string("dtype ") + dtype_name(t) +
                                  " has no host arithmetic (it is for device backends such as NCCL)");
    if (average && !detail::averageable(t))
      detail::bad_argument(c, std::string("dtype ") + dtype_name(t) +
                                  " is not f32 or f64 (an integer average would have to round)");
    if (d) detail::check_deadline(c, *d);
    auto o = make(operation::kind::allreduce, c);
    o->buf = buf;
    o->bytes = bytes;
    o->count = count;
    o->type = t;
    o->rop = r;
    o->average = average;
    o->notice = {++collectives_, average ? 5 : 1, static_cast<std::int64_t>(count),
                 static_cast<std::int64_t>(t), static_cast<std::int64_t>(r), 0};
    o->ring = size_ > 1 && bytes > inline_capacity();
    enqueue(o);
    return o;
  }

  op_ptr start_broadcast(void* buf, std::size_t bytes, int root, const deadline* d) {
    const detail::call_info c = begin("broadcast");
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, root, "root");
    if (d) detail::check_deadline(c, *d);
    auto o = make(operation::kind::broadcast, c);
    o->buf = buf;
    o->bytes = bytes;
    o->peer = root;
    o->notice = {++collectives_, 2, static_cast<std::int64_t>(bytes), 0, 0, root};
    enqueue(o);
    return o;
  }

  op_ptr start_send(const void* buf, std::size_t bytes, int dst, int tag, const deadline* d) {
    const detail::call_info c = begin("send");
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, dst, "destination");
    detail::check_tag(c, tag);
    if (d) detail::check_deadline(c, *d);
    if (dst == rank_)
      detail::bad_argument(c, "a send to itself (rank " + std::to_string(rank_) +
                                  ") is not supported by the gloo backend");
    // The blocking send bounds the small sends held (waiting, with its deadline, for the
    // oldest); isend only lets go of those known received.
    if (d) reap_eager(c, *d);
    reap_received();
    auto o = make(operation::kind::send, c);
    o->cbuf = buf;
    o->bytes = bytes;
    o->peer = dst;
    o->tag = tag;
    o->source = dst;
    const detail::gloo_frame frame{bytes, static_cast<std::uint64_t>(tag)};
    const bool inline_data = bytes <= options_.eager_bytes;
    eager_send m;
    m.size = sizeof frame + (inline_data ? bytes : 0);
    m.bytes.reset(new unsigned char[m.size]);
    std::memcpy(m.bytes.get(), &frame, sizeof frame);
    if (inline_data && bytes != 0) std::memcpy(m.bytes.get() + sizeof frame, buf, bytes);
    m.ub = context_->createUnboundBuffer(m.bytes.get(), m.size);
    m.dst = dst;
    post(c, [&] { m.ub->send(dst, detail::gloo_slot_p2p_head | static_cast<std::uint64_t>(tag), 0, m.size); }, dst);
    eager_.push_back(std::move(m));
    o->active = true;
    if (inline_data) {
      o->done = true;  // buffered: complete at once, as MPI's eager sends
      return o;
    }
    // gloo reads the caller's buffer until the receiver has taken it.
    o->body = context_->createUnboundBuffer(const_cast<void*>(buf), bytes);
    o->exposed = true;
    post(c, [&] { o->body->send(dst, detail::gloo_slot_p2p_body | static_cast<std::uint64_t>(tag), 0, bytes); }, dst);
    o->phase = 1;
    enqueue(o);
    return o;
  }

  op_ptr start_recv(const char* name, void* buf, std::size_t bytes, int src, int tag, const deadline* d) {
    const detail::call_info c = begin(name);
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, src, "source", /*allow_any=*/true);
    detail::check_tag(c, tag);
    if (d) detail::check_deadline(c, *d);
    if (src == rank_)
      detail::bad_argument(c, std::string("a ") + name + " from itself (rank " + std::to_string(rank_) +
                                  ") is not supported by the gloo backend");
    if (src == any_source && size_ == 1)
      detail::bad_argument(c, "any_source on a communicator of one rank would wait forever");
    auto o = make(operation::kind::recv, c);
    o->buf = buf;
    o->bytes = bytes;
    o->peer = src;
    o->tag = tag;
    o->active = true;
    enqueue(o);
    return o;
  }

  void enqueue(const op_ptr& o) {
    ops_.push_back(o);
    progress();  // every call moves what is in flight
  }

  // ---- progress and waiting ----

  // Advances every operation in flight as far as it goes without waiting, in issue order;
  // collectives one at a time. Throws (failing the communicator) on an error.
  void progress() {
    bool collective_busy = false;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      operation& o = *ops_[i];
      if (o.finished()) continue;
      if (o.what == operation::kind::send) {
        progress_send(o);
        continue;
      }
      if (o.what == operation::kind::recv) {
        progress_recv(o);
        continue;
      }
      if (collective_busy) continue;
      if (!o.active) activate(o);
      if (o.what == operation::kind::allreduce)
        o.ring ? progress_ring(o) : progress_small(o);
      else
        progress_broadcast(o);
      if (!o.done) collective_busy = true;
    }
    while (!ops_.empty() && ops_.front()->finished()) ops_.pop_front();
  }

  // Until `o` completes, the deadline passes or the communicator is aborted, blocking on the
  // buffer it (or the collective ahead of it) waits on; in slices when other operations in
  // flight may need this thread. With `poll` (try_recv): at the deadline a receive whose
  // header has not come is withdrawn (false); one whose data is arriving gets body_wait more.
  // With `timed` (a handle's wait_until): at the deadline it returns false, no failure.
  bool wait_op(operation& o, const deadline& d, bool poll = false, bool timed = false) {
    deadline limit = d;
    bool extended = false;
    for (;;) {
      if (o.orphan) throw transport_error(detail::describe(o.c) + ": its communicator was destroyed");
      if (failure_ && !o.done) throw *failure_;
      progress();
      if (o.done) return true;
      if (o.cancelled) return false;
      if (aborted_.load(std::memory_order_acquire))
        fail(transport_error(detail::describe(o.c) + ": the communicator was aborted (abort()) " +
                             "while waiting for " + detail::rank_list(point_of(o).peers)));
      const bool passed = limit.passed();  // once: the two uses below must agree
      if (timed && passed) return false;
      if (passed) {
        if (poll && o.what == operation::kind::recv) {
          if (o.phase == 0) {
            withdraw(o);
            return false;
          }
          if (!extended) {  // once: the data follows the header
            limit = deadline(options_.body_wait);
            extended = true;
            continue;
          }
        }
        const block_point bp = point_of(o);
        fail(detail::deadline_error(o.c, bp.peers.empty() ? others_or_self() : bp.peers, bp.note));
      }
      const block_point bp = point_of(o);
      if (bp.ub == nullptr) {
        std::this_thread::yield();
        continue;
      }
      auto until = limit.time_point();
      if (busy_others(o)) until = std::min(until, deadline::clock::now() + std::chrono::milliseconds(2));
      block(o.c, bp, until);
    }
  }

  // Whether an operation other than `o` may need this thread while `o` waits: a receive (its
  // data follows its header only once this thread posts for it). Sends finish in gloo's device
  // thread; collectives run one at a time, and `o` waits on the one ahead of it, if any, itself;
  // those queued behind cannot start before. Then the wait goes in slices.
  bool busy_others(const operation& o) const {
    for (const auto& p : ops_)
      if (!p->finished() && p.get() != &o && p->what == operation::kind::recv) return true;
    return false;
  }

  // The buffer `o` waits on now: its own, or, for a collective not yet started, the one the
  // collective ahead of it waits on.
  block_point point_of(const operation& o) {
    if ((o.what == operation::kind::allreduce || o.what == operation::kind::broadcast) && !o.active) {
      for (const auto& p : ops_)
        if (!p->finished() && p->active && (p->what == operation::kind::allreduce || p->what == operation::kind::broadcast))
          return point_of(*p);
      return {nullptr, true, others(), "the collectives before it have not completed"};
    }
    switch (o.what) {
      case operation::kind::send:
        return {o.body.get(), false, {o.peer}, "the matching recv was not posted"};
      case operation::kind::recv: return recv_point(o);
      case operation::kind::allreduce: return o.ring ? ring_point(o) : small_point(o);
      case operation::kind::broadcast: return broadcast_point(o);
    }
    return {};
  }

  // -- test without waiting: credits and peeks --
  // A blocking wait consumes the completion it waited for; it is credited to the buffer, and
  // the operation that owns the buffer takes it in its next progress step.
  struct credit {
    ::gloo::transport::UnboundBuffer* ub = nullptr;
    bool recv = true;
    int count = 0;
    std::deque<int> ranks;  // the sender (or destination) of each
  };

  credit* credit_of(::gloo::transport::UnboundBuffer* ub, bool recv) {
    for (auto& k : credits_)
      if (k.ub == ub && k.recv == recv) return &k;
    return nullptr;
  }

  bool ready(::gloo::transport::UnboundBuffer& ub, bool recv) {
    if (const credit* k = credit_of(&ub, recv); k != nullptr && k->count > 0) return true;
    const std::optional<bool> r = detail::gloo_peek::ready(ub, recv);
    if (!r)
      throw invalid_parameter_error(
          "cadence::transport[gloo]: testing an operation without waiting needs gloo's TCP "
          "transport; this context has another");
    return *r;
  }

  // Takes one completion that ready() saw (a credit, or gloo's own, which a wait then returns
  // at once); returns its rank. A stored exception (a closed connection) fails the call,
  // naming `peers`.
  int take(const detail::call_info& c, ::gloo::transport::UnboundBuffer& ub, bool recv, const std::vector<int>& peers) {
    if (credit* k = credit_of(&ub, recv); k != nullptr && k->count > 0) {
      --k->count;
      const int r = k->ranks.front();
      k->ranks.pop_front();
      if (k->count == 0) credits_.erase(credits_.begin() + (k - credits_.data()));
      return r;
    }
    std::string reason;
    for (int tries = 0; tries < 3; ++tries) {  // a stale abort flag returns false once
      int r = -1;
      try {
        const bool done = recv ? ub.waitRecv(&r, std::chrono::hours(1)) : ub.waitSend(&r, std::chrono::hours(1));
        if (done) return r;
      } catch (const std::exception& e) {
        reason = detail::gloo_reason(e);
        break;
      }
    }
    if (reason.empty()) reason = "a completion went missing";
    fail(detail::lost_peer_error(c, peers, "its connection closed: " + reason));
  }

  // Takes a completion if one is there: the non-blocking step every progress function uses.
  bool try_take(const detail::call_info& c, ::gloo::transport::UnboundBuffer& ub, bool recv,
                const std::vector<int>& peers, int* rank = nullptr) {
    if (!ready(ub, recv)) return false;
    const int r = take(c, ub, recv, peers);
    if (rank != nullptr) *rank = r;
    return true;
  }

  // Blocks on one buffer until it completes (credited), `until` (the timer's abort) or a
  // failure. gloo's own timeout, far beyond, never fires (it would close every connection).
  void block(const detail::call_info& c, const block_point& bp, deadline::clock::time_point until) {
    auto& ub = *bp.ub;
    {
      std::lock_guard<std::mutex> lock(waiting_mutex_);
      waiting_ = &ub;
      waiting_recv_ = bp.recv;
    }
    struct unregister {
      gloo_communicator* self;
      ~unregister() {
        std::lock_guard<std::mutex> lock(self->waiting_mutex_);
        self->waiting_ = nullptr;
      }
    };
    bool done = false, fired = false;
    int r = -1;
    std::string reason;
    {
      unregister guard{this};
      if (aborted_.load(std::memory_order_acquire)) return;
      timer_.arm(&ub, bp.recv, until);
      try {
        const auto margin = std::chrono::minutes(10);
        done = bp.recv ? ub.waitRecv(&r, remaining_ms(deadline::at(until)) + margin)
                       : ub.waitSend(&r, remaining_ms(deadline::at(until)) + margin);
      } catch (const std::exception& e) {
        reason = detail::gloo_reason(e);
      }
      fired = timer_.disarm();
    }
    if (done && fired) {
      try {  // the timer fired just after: its flag would end the next wait at once; clear it
        if (bp.recv)
          ub.waitRecv(nullptr, std::chrono::hours(1));
        else
          ub.waitSend(nullptr, std::chrono::hours(1));
      } catch (const std::exception&) {
      }
    }
    if (!reason.empty()) {
      if (aborted_.load(std::memory_order_acquire))
        fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort()) " +
                             "while waiting for " + detail::rank_list(bp.peers)));
      fail(detail::lost_peer_error(c, bp.peers, "its connection closed: " + reason));
    }
    if (!done) return;  // the timer (or abort(): the caller's loop sees it)
    credit* k = credit_of(&ub, bp.recv);
    if (k == nullptr) {
      credits_.push_back({&ub, bp.recv, 0, {}});
      k = &credits_.back();
    }
    ++k->count;
    k->ranks.push_back(r);
  }

  // Forgets the credits of a buffer about to be destroyed.
  void forget(::gloo::transport::UnboundBuffer* ub) {
    credits_.erase(std::remove_if(credits_.begin(), credits_.end(), [&](const credit& k) { return k.ub == ub; }),
                   credits_.end());
  }

  // ---- point to point ----
  // A message starts with a header (gloo_frame and, up to eager_bytes, the data) on slot
  // p2p_head | tag. Header receives are posted into buffers of our own, one per receive, and
  // may outlive the operation that posted them: a receive withdrawn (try_recv's deadline,
  // cancel()) leaves its gloo receive posted (gloo cannot cancel one). For each tag the posted
  // receives cover disjoint sets of senders, so a message can match only one of them, and gloo
  // delivers each (sender, slot) in order; a message taken for a sender the caller did not ask
  // for waits in early_ for the receive that asks for it, which looks there first. Receives
  // progress in issue order, so order per (source, tag) holds. A large message's data follows
  // on slot p2p_body | tag, received straight into the caller's buffer.

  // phase 1: the data is on its way from the caller's buffer.
  void progress_send(operation& o) {
    if (o.phase != 1) return;
    if (!try_take(o.c, *o.body, false, {o.peer})) return;
    forget(o.body.get());
    o.body.reset();
    o.exposed = false;
    o.done = true;
  }

  // phase 0: waiting for the header; phase 1: for a large message's data.
  void progress_recv(operation& o) {
    if (o.phase == 0) {
      std::unique_ptr<p2p_head> head = take_head(o.c, o.peer, o.tag);
      if (!head) return;
      const int sender = head->sender;
      o.source = sender;
      detail::gloo_frame frame;
      std::memcpy(&frame, head->buf.bytes.get(), sizeof frame);
      const bool reusable = head->reusable;
      if (frame.bytes != o.bytes)
        fail(transport_error(detail::describe(o.c) + ": rank " + std::to_string(sender) + " sent " +
                             std::to_string(frame.bytes) + " bytes with tag " + std::to_string(o.tag) +
                             " but rank " + std::to_string(rank_) + " received into " +
                             std::to_string(o.bytes) + " bytes"));
      if (o.bytes <= options_.eager_bytes) {
        if (o.bytes != 0) std::memcpy(o.buf, head->buf.bytes.get() + sizeof frame, o.bytes);
        if (reusable) spare_heads_.push_back(std::move(head->buf));
        o.done = true;
        return;
      }
      if (reusable) spare_heads_.push_back(std::move(head->buf));
      o.body = context_->createUnboundBuffer(o.buf, o.bytes);
      o.exposed = true;
      post(o.c, [&] { o.body->recv(sender, detail::gloo_slot_p2p_body | static_cast<std::uint64_t>(o.tag), 0, o.bytes); },
           sender);
      o.phase = 1;
    }
    if (!try_take(o.c, *o.body, true, {o.source})) return;
    forget(o.body.get());
    o.body.reset();
    o.exposed = false;
    o.done = true;
  }

  std::vector<int> wanted_from(int src) const { return src == any_source ? others() : std::vector<int>{src}; }

  block_point recv_point(const operation& o) {
    if (o.phase == 1) return {o.body.get(), true, {o.source}, "the message's data did not arrive"};
    auto wanted = [&](int r) { return o.peer == any_source ? r != rank_ : r == o.peer; };
    for (const auto& h : posted_)
      if (h->tag == o.tag && std::any_of(h->from.begin(), h->from.end(), wanted))
        return {h->buf.ub.get(), true, wanted_from(o.peer), "no matching message arrived"};
    return {nullptr, true, wanted_from(o.peer), "no matching message arrived"};
  }

  // A receive whose header has not come leaves; its gloo receive stays posted for the next.
  void withdraw(operation& o) {
    o.cancelled = true;
    ops_.erase(std::remove_if(ops_.begin(), ops_.end(), [&](const op_ptr& p) { return p.get() == &o; }), ops_.end());
  }

  // The next header for (src, tag), if one has come: one taken earlier, or from the posted
  // receives covering the senders asked for (posting one for those not yet covered).
  std::unique_ptr<p2p_head> take_head(const detail::call_info& c, int src, int tag) {
    auto wanted = [&](int r) { return src == any_source ? r != rank_ : r == src; };
    for (auto it = early_.begin(); it != early_.end(); ++it) {
      if ((*it)->tag != tag || !wanted((*it)->sender)) continue;
      std::unique_ptr<p2p_head> h = std::move(*it);
      early_.erase(it);
      return h;
    }
    for (;;) {
      std::vector<int> uncovered;
      for (int p = 0; p < size_; ++p) {
        if (!wanted(p)) continue;
        bool covered = false;
        for (const auto& h : posted_)
          if (h->tag == tag && std::binary_search(h->from.begin(), h->from.end(), p)) covered = true;
        if (!covered) uncovered.push_back(p);
      }
      if (!uncovered.empty()) post_head(c, std::move(uncovered), tag);
      p2p_head* done = nullptr;
      for (const auto& h : posted_) {
        if (h->tag != tag || !std::any_of(h->from.begin(), h->from.end(), wanted)) continue;
        int sender = -1;
        bool got = false;
        try {
          got = try_take(c, *h->buf.ub, true, h->from, &sender);
        } catch (const transport_error&) {
          throw;
        }
        if (got) {
          h->sender = sender;
          done = h.get();
          break;
        }
      }
      if (done == nullptr) return nullptr;
      auto it = std::find_if(posted_.begin(), posted_.end(), [&](const auto& h) { return h.get() == done; });
      std::unique_ptr<p2p_head> h = std::move(*it);
      posted_.erase(it);
      forget(h->buf.ub.get());
      if (wanted(h->sender)) return h;
      early_.push_back(std::move(h));  // another sender's: for a later receive
    }
  }

  void post_head(const detail::call_info& c, std::vector<int> from, int tag) {
    auto h = std::make_unique<p2p_head>();
    h->from = std::move(from);
    h->tag = tag;
    if (!spare_heads_.empty()) {
      h->buf = std::move(spare_heads_.back());
      spare_heads_.pop_back();
    } else {
      h->buf.size = sizeof(detail::gloo_frame) + options_.eager_bytes;
      h->buf.bytes.reset(new unsigned char[h->buf.size]);
      h->buf.ub = context_->createUnboundBuffer(h->buf.bytes.get(), h->buf.size);
    }
    const std::uint64_t slot = detail::gloo_slot_p2p_head | static_cast<std::uint64_t>(tag);
    auto& ub = *h->buf.ub;
    const std::size_t n = h->buf.size;
    if (h->from.size() == 1)  // one sender: gloo then sees its connection close
      post(c, [&] { ub.recv(h->from.front(), slot, 0, n); }, h->from);
    else
      post(c, [&] { ub.recv(h->from, slot, 0, n); }, h->from);
    posted_.push_back(std::move(h));
  }

  // ---- collectives: activation ----

  // The collective before this one is done: it starts.
  void activate(operation& o) {
    o.active = true;
    if (size_ == 1) {
      o.done = true;  // nothing to exchange; an average over one rank is the value itself
      return;
    }
    if (o.what == operation::kind::broadcast)
      start_broadcast_op(o);
    else if (o.ring)
      start_ring(o);
    else
      start_small(o);
  }

  // Checks a peer's notice of the collective `o` against ours: a mismatch fails the call
  // (a peer at another collective, one that says goodbye, other arguments).
  void check_notice(const operation& o, int p, const detail::gloo_notice& theirs) {
    if (theirs == o.notice) return;
    if (theirs.kind == 4 && o.what == operation::kind::allreduce && !o.ring) {
      // A partner that left: the likelier cause is a peer that never started, if one is known.
      const std::vector<int> missing = notices_missing(o);
      fail(transport_error(detail::describe(o.c) + ": rank " + std::to_string(p) +
                           " destroyed its communicator (it called shutdown) while this rank waited for it" +
                           (missing.empty() ? std::string()
                                            : "; " + detail::rank_list(missing) + " never started this collective")));
    }
    fail(transport_error(detail::describe(o.c) + ": arguments differ across ranks in collective #" +
                         std::to_string(o.notice.index) + ": rank " + std::to_string(p) + " called " +
                         (theirs.index == o.notice.index ? theirs.describe()
                                                         : theirs.describe() + " as collective #" +
                                                               std::to_string(theirs.index)) +
                         ", rank " + std::to_string(rank_) + " called " + o.notice.describe()));
  }

  // Our message of a collective, from out_, to `p`.
  void send_out(const operation& o, int p, std::size_t bytes) {
    post(o.c, [&] { out_.ub->send(p, detail::gloo_slot_collective, 0, bytes); }, p);
    out_pending_ = 1;
    out_to_ = {p};
  }
  bool out_sent(const operation& o) {
    while (out_pending_ > 0) {
      const std::vector<int> left(out_to_.end() - static_cast<std::ptrdiff_t>(out_pending_), out_to_.end());
      if (!try_take(o.c, *out_.ub, false, left)) return false;
      --out_pending_;
    }
    return true;
  }
  block_point out_point(const char* note) const {
    return {out_.ub.get(), false,
            std::vector<int>(out_to_.end() - static_cast<std::ptrdiff_t>(out_pending_), out_to_.end()), note};
  }

  // ---- the small all-reduce: recursive doubling ----
  //
  // Up to inline_capacity() bytes. out_ holds [our notice | the summary | the accumulator], sent
  // to one partner per round; each partner's message arrives in its in_ (posted in advance, so it
  // moves in one write). Every pair combines the same two values (sum, min and max commute
  // exactly), so every rank ends with the same bits; log2(n) exchanges of the buffer instead of
  // sending it to every peer. The summary travels with the data, so every rank learns of
  // arguments that differ anywhere (the protocol runs to its end without reducing, then fails
  // on every rank naming both sides). Phases: 0 hand over (a rank outside the p) and take the
  // result back, 1 take over (its partner), 2 the rounds, 3 hand back, 5 the copy out.

  unsigned char* small_data() { return out_.bytes.get() + detail::gloo_small_header; }

  void write_small_header(const operation& o) {
    std::memcpy(out_.bytes.get(), &o.notice, sizeof o.notice);
    std::memcpy(out_.bytes.get() + sizeof o.notice, &o.summary, sizeof o.summary);
  }

  int small_partner(const operation& o) const {
    const detail::gloo_doubling g(size_);
    switch (o.phase) {
      case 0: return rank_ + 1;
      case 1: return rank_ - 1;
      case 2: return g.outer(g.inner(rank_) ^ (1 << o.round));
      case 3: return rank_ - 1;
      default: return -1;
    }
  }

  // The first rank that rank q sends its data to (-1: none): whom q's first message tells that
  // q has started. Every other peer gets a notice of its own at the start, so a rank waiting on
  // a partner can still name a peer that never started (the notices are the announcements).
  int first_target(int q) const {
    const detail::gloo_doubling g(size_);
    const int in = g.inner(q);
    if (in < 0) return q + 1;
    if (g.rounds() > 0) return g.outer(in ^ 1);
    return q < 2 * g.extra ? q - 1 : -1;
  }

  void start_small(operation& o) {
    o.summary.lo = o.summary.hi = o.notice;
    o.summary.lo_rank = o.summary.hi_rank = rank_;
    // Notices first, from bye_'s sibling buffer notice_out_ (out_ carries the data).
    o.collected.assign(static_cast<std::size_t>(size_), 0);
    std::vector<int> told;
    for (int p : others()) {
      if (first_target(p) != rank_) o.collected[static_cast<std::size_t>(p)] = 1;  // a notice will come
      if (p != first_target(rank_)) told.push_back(p);
    }
    if (!told.empty()) {
      if (!notice_out_.ub) {
        notice_out_.size = sizeof(detail::gloo_notice) + sizeof(detail::gloo_summary);
        notice_out_.bytes.reset(new unsigned char[notice_out_.size]);
        notice_out_.ub = context_->createUnboundBuffer(notice_out_.bytes.get(), notice_out_.size);
      }
      detail::gloo_summary only = o.summary;
      only.lo_rank = -1;  // marks a notice without data
      std::memcpy(notice_out_.bytes.get(), &o.notice, sizeof o.notice);
      std::memcpy(notice_out_.bytes.get() + sizeof o.notice, &only, sizeof only);
      for (int p : told)
        post(o.c, [&] { notice_out_.ub->send(p, detail::gloo_slot_collective, 0, notice_out_.size); }, p);
      notices_pending_ = told;
    }
    if (o.bytes != 0) std::memcpy(small_data(), o.buf, o.bytes);
    const detail::gloo_doubling g(size_);
    const int in = g.inner(rank_);
    if (in < 0) {
      o.phase = 0;
      write_small_header(o);
      send_out(o, rank_ + 1, detail::gloo_small_header + o.bytes);
    } else if (rank_ < 2 * g.extra) {
      o.phase = 1;
    } else {
      begin_rounds(o);
    }
  }

  void begin_rounds(operation& o) {
    const detail::gloo_doubling g(size_);
    o.phase = 2;
    o.round = 0;
    if (g.rounds() == 0) {
      end_rounds(o);
      return;
    }
    write_small_header(o);
    send_out(o, small_partner(o), detail::gloo_small_header + o.bytes);
  }

  void end_rounds(operation& o) {
    const detail::gloo_doubling g(size_);
    if (rank_ < 2 * g.extra) {
      o.phase = 3;
      write_small_header(o);
      send_out(o, rank_ - 1, detail::gloo_small_header + o.bytes);
    } else {
      o.phase = 5;
    }
  }

  // Partner p's message, if it has come (and our own message has left, so the accumulator may
  // change): its summary merged, its data folded in (`reduce`) or taken (`!reduce`) unless the
  // arguments already differ.
  // Takes the notices that have arrived (each peer's comes before any data of it).
  void take_notices(operation& o) {
    for (int p : others()) {
      if (!o.collected[static_cast<std::size_t>(p)]) continue;
      auto& b = in_[static_cast<std::size_t>(p)];
      if (!try_take(o.c, *b.ub, true, {p})) continue;
      in_posted_[static_cast<std::size_t>(p)] = false;
      detail::gloo_notice theirs;
      std::memcpy(&theirs, b.bytes.get(), sizeof theirs);
      check_notice(o, p, theirs);
      o.collected[static_cast<std::size_t>(p)] = 0;
      post_in(o.c, p);
    }
  }
  std::vector<int> notices_missing(const operation& o) const {
    std::vector<int> v;
    for (int p : others())
      if (o.collected[static_cast<std::size_t>(p)]) v.push_back(p);
    return v;
  }
  bool notices_sent(const operation& o) {
    while (!notices_pending_.empty()) {
      if (!try_take(o.c, *notice_out_.ub, false, notices_pending_)) return false;
      notices_pending_.erase(notices_pending_.begin());
    }
    return true;
  }

  bool take_small(operation& o, int p, bool reduce) {
    if (!out_sent(o)) return false;
    if (o.collected[static_cast<std::size_t>(p)]) return false;  // its notice comes first
    auto& b = in_[static_cast<std::size_t>(p)];
    if (!try_take(o.c, *b.ub, true, {p})) return false;
    in_posted_[static_cast<std::size_t>(p)] = false;
    detail::gloo_notice theirs;
    std::memcpy(&theirs, b.bytes.get(), sizeof theirs);
    if (theirs.index != o.notice.index || theirs.kind == 3 || theirs.kind == 4 || theirs.kind == 2)
      check_notice(o, p, theirs);  // not the same collective at all: no summary to read
    detail::gloo_summary s;
    std::memcpy(&s, b.bytes.get() + sizeof theirs, sizeof s);
    o.summary.merge(s);
    if (o.summary.agree() && o.bytes != 0) {
      const unsigned char* data = b.bytes.get() + detail::gloo_small_header;
      if (reduce)
        detail::reduce_into(small_data(), data, o.count, o.type, o.rop);
      else
        std::memcpy(small_data(), data, o.bytes);
    }
    post_in(o.c, p);
    return true;
  }

  void progress_small(operation& o) {
    for (;;) {
      take_notices(o);
      switch (o.phase) {
        case 0:
          if (!take_small(o, rank_ + 1, false)) return;
          o.phase = 5;
          break;
        case 1:
          if (!take_small(o, rank_ - 1, true)) return;
          begin_rounds(o);
          break;
        case 2: {
          if (!take_small(o, small_partner(o), true)) return;
          const detail::gloo_doubling g(size_);
          if (++o.round < g.rounds()) {
            write_small_header(o);
            send_out(o, small_partner(o), detail::gloo_small_header + o.bytes);
          } else {
            end_rounds(o);
          }
          break;
        }
        case 3:
          if (!out_sent(o)) return;
          o.phase = 5;
          break;
        case 5: {
          // Every notice in (none may be left for the next collective) and every send out.
          if (!notices_missing(o).empty() || !notices_sent(o)) return;
          if (!o.summary.agree())
            fail(transport_error(detail::describe(o.c) + ": arguments differ across ranks in collective #" +
                                 std::to_string(o.notice.index) + ": rank " + std::to_string(o.summary.lo_rank) +
                                 " called " + o.summary.lo.describe() + ", rank " +
                                 std::to_string(o.summary.hi_rank) + " called " + o.summary.hi.describe()));
          if (o.average)
            detail::divide_into(o.buf, small_data(), o.count, o.type, static_cast<double>(size_));
          else if (o.bytes != 0)
            std::memcpy(o.buf, small_data(), o.bytes);
          o.done = true;
          return;
        }
        default: return;
      }
    }
  }

  // Whom it waits for: the peers whose notice never came (they never started), else its
  // partner. The buffer: a missing notice first, since until it is taken (and the receive
  // posted again) a peer's next message to us cannot leave, and that peer may be waiting for
  // it to leave before it takes ours; then our message's send, then the partner's message.
  block_point small_point(const operation& o) {
    const std::vector<int> missing = notices_missing(o);
    if (!missing.empty())
      return {in_[static_cast<std::size_t>(missing.front())].ub.get(), true, missing,
              "they never started this collective"};
    if (out_pending_ > 0) return out_point("it did not take this collective's message");
    const int p = small_partner(o);
    if (p >= 0) return {in_[static_cast<std::size_t>(p)].ub.get(), true, {p}, "in the all-reduce's exchanges"};
    if (!notices_pending_.empty())
      return {notice_out_.ub.get(), false, notices_pending_, "it did not take this collective's notice"};
    return {};
  }

  // ---- the ring all-reduce ----
  //
  // In reduce-scatter step s, rank r sends segment r - s to its right neighbour and adds
  // segment r - s - 1 from its left one; after n - 1 steps it owns segment r + 1 fully reduced
  // (averaging: divided in that last addition), and n - 1 allgather steps pass the reduced
  // segments around. Segments move in chunks, pipelined: a chunk goes on to the right as soon
  // as it is reduced (or, in the allgather, received), while gloo's device thread already reads
  // the next one, and the next step's receives are posted a step ahead (two scratch buffers),
  // so no chunk waits for gloo's send-ready / recv-ready handshake.
  //
  // The peers' notices are checked while the first chunks move (phase 0). Until then nothing
  // touches the caller's buffer: receives go into our scratch, each for a whole chunk (the
  // longest message any peer sends on the bulk slot, so arguments that differ can garble
  // scratch but never overrun a buffer), and the first chunk leaves from a copy. A mismatch
  // therefore fails the call without closing the connections, and every peer reads the notice
  // that explains it. Phase 1 runs the steps; phase 2 waits for the last sends.

  std::size_t ring_first(const operation& o, int seg) const {
    return o.count * static_cast<std::size_t>(seg) / static_cast<std::size_t>(size_);
  }
  std::size_t ring_seg_bytes(const operation& o, int seg) const {
    return (ring_first(o, seg + 1) - ring_first(o, seg)) * dtype_size(o.type);
  }
  std::size_t ring_chunks(const operation& o, int seg) const {
    return detail::chunk_count(ring_seg_bytes(o, seg), bulk_chunk());
  }
  std::size_t ring_chunk_len(const operation& o, int seg, std::size_t k) const {
    return detail::chunk_length(ring_seg_bytes(o, seg), bulk_chunk(), k);
  }
  int ring_steps() const { return 2 * (size_ - 1); }
  bool ring_rs(int s) const { return s < size_ - 1; }
  int ring_seg_out(int s) const {
    const int n = size_;
    return ring_rs(s) ? (rank_ - s + n) % n : (rank_ + 1 - (s - (n - 1)) + 2 * n) % n;
  }
  int ring_seg_in(int s) const {
    const int n = size_;
    return ring_rs(s) ? (rank_ - s - 1 + 2 * n) % n : (rank_ - (s - (n - 1)) + 2 * n) % n;
  }
  int left() const { return (rank_ + size_ - 1) % size_; }
  int right() const { return (rank_ + 1) % size_; }

  void ring_post_recvs(operation& o, int s) {
    const int seg = ring_seg_in(s);
    const std::size_t chunk = bulk_chunk();
    for (std::size_t k = 0; k < ring_chunks(o, seg); ++k) {
      if (ring_rs(s))
        post(o.c, [&] { scratch_[static_cast<std::size_t>(s % 2)].ub->recv(left(), detail::gloo_slot_bulk, k * chunk, chunk); },
             left());
      else
        post(o.c, [&] {
          o.body->recv(left(), detail::gloo_slot_bulk, ring_first(o, seg) * dtype_size(o.type) + k * chunk,
                       ring_chunk_len(o, seg, k));
        }, left());
    }
  }

  void ring_post_send(operation& o, int s, std::size_t k) {
    const int seg = ring_seg_out(s);
    post(o.c, [&] {
      o.rout->send(right(), detail::gloo_slot_bulk, ring_first(o, seg) * dtype_size(o.type) + k * bulk_chunk(),
                   ring_chunk_len(o, seg, k));
    }, right());
    ++o.sends;
  }

  void start_ring(operation& o) {
    const std::size_t esize = dtype_size(o.type);
    const std::size_t chunk = bulk_chunk();  // a multiple of 8, so of every element size
    const std::size_t largest = (o.count + static_cast<std::size_t>(size_) - 1) / static_cast<std::size_t>(size_) * esize;
    const std::size_t scratch_bytes = (largest + chunk - 1) / chunk * chunk;
    for (auto& sc : scratch_) {
      if (sc.size >= scratch_bytes) continue;
      sc.ub.reset();
      sc.bytes.reset(new unsigned char[scratch_bytes]);
      sc.size = scratch_bytes;
      sc.ub = context_->createUnboundBuffer(sc.bytes.get(), scratch_bytes);
    }
    o.body = context_->createUnboundBuffer(o.buf, o.bytes);   // the allgather's receives
    o.rout = context_->createUnboundBuffer(o.buf, o.bytes);   // every send
    o.sends = 0;
    ring_post_recvs(o, 0);
    if (ring_rs(1)) ring_post_recvs(o, 1);
    o.step = ring_rs(1) ? 1 : 0;  // the last step whose receives are posted
    const std::size_t len = ring_chunk_len(o, ring_seg_out(0), 0);
    if (first_out_.size < chunk) {
      first_out_.ub.reset();
      first_out_.bytes.reset(new unsigned char[chunk]);
      first_out_.size = chunk;
      first_out_.ub = context_->createUnboundBuffer(first_out_.bytes.get(), chunk);
    }
    std::memcpy(first_out_.bytes.get(), static_cast<const unsigned char*>(o.buf) + ring_first(o, ring_seg_out(0)) * esize, len);
    post(o.c, [&] { first_out_.ub->send(right(), detail::gloo_slot_bulk, 0, len); }, right());
    o.first_out = true;
    post_collective(o.c, o.notice, nullptr, 0, others());
    o.collected.assign(static_cast<std::size_t>(size_), 0);
    o.collected[static_cast<std::size_t>(rank_)] = 1;
    o.phase = 0;
  }

  void progress_ring(operation& o) {
    if (o.phase == 0) {
      for (int p : others()) {
        if (o.collected[static_cast<std::size_t>(p)]) continue;
        auto& b = in_[static_cast<std::size_t>(p)];
        if (!try_take(o.c, *b.ub, true, {p})) return;
        in_posted_[static_cast<std::size_t>(p)] = false;
        detail::gloo_notice theirs;
        std::memcpy(&theirs, b.bytes.get(), sizeof theirs);
        check_notice(o, p, theirs);
        o.collected[static_cast<std::size_t>(p)] = 1;
      }
      repost_collective(o.c, others());
      o.exposed = true;  // from here on gloo reads and writes the caller's buffer
      for (std::size_t k = 1; k < ring_chunks(o, ring_seg_out(0)); ++k) ring_post_send(o, 0, k);
      if (!ring_rs(1)) {
        ring_post_recvs(o, 1);
        o.step = 1;
      }
      o.phase = 1;
      o.chunk = 0;
      o.round = 0;  // the step whose chunks are being received
    }
    const std::size_t esize = dtype_size(o.type), chunk = bulk_chunk();
    const int steps = ring_steps();
    while (o.phase == 1 && o.round < steps) {
      const int s = o.round;
      if (s >= 1 && s + 1 < steps && o.step < s + 1) {  // its scratch was step s - 1's: done
        ring_post_recvs(o, s + 1);
        o.step = s + 1;
      }
      const int seg = ring_seg_in(s);
      auto& sc = scratch_[static_cast<std::size_t>(s % 2)];
      while (o.chunk < ring_chunks(o, seg)) {
        if (!try_take(o.c, ring_rs(s) ? *sc.ub : *o.body, true, {left()})) return;
        const std::size_t k = o.chunk;
        if (ring_rs(s)) {
          unsigned char* at = static_cast<unsigned char*>(o.buf) + ring_first(o, seg) * esize + k * chunk;
          const unsigned char* in = sc.bytes.get() + k * chunk;
          const std::size_t n = ring_chunk_len(o, seg, k) / esize;
          if (o.average && s == size_ - 2)
            detail::reduce_divide_into(at, in, n, o.type, static_cast<double>(size_));
          else
            detail::reduce_into(at, in, n, o.type, o.rop);
        }
        if (s + 1 < steps) ring_post_send(o, s + 1, k);  // segment seg_in(s) is seg_out(s + 1)
        ++o.chunk;
      }
      ++o.round;
      o.chunk = 0;
    }
    o.phase = 2;
    if (o.first_out) {
      if (!try_take(o.c, *first_out_.ub, false, {right()})) return;
      o.first_out = false;
    }
    while (o.sends > 0) {
      if (!try_take(o.c, *o.rout, false, {right()})) return;
      --o.sends;
    }
    if (!out_sent(o)) return;
    forget(o.body.get());
    forget(o.rout.get());
    o.body.reset();
    o.rout.reset();
    o.exposed = false;
    o.done = true;
  }

  block_point ring_point(const operation& o) {
    if (o.phase == 0) {
      for (int p : others())
        if (!o.collected[static_cast<std::size_t>(p)])
          return {in_[static_cast<std::size_t>(p)].ub.get(), true, {p}, "they never started this collective"};
      return {};
    }
    if (o.phase == 1 && o.round < ring_steps()) {
      const int s = o.round;
      return {ring_rs(s) ? scratch_[static_cast<std::size_t>(s % 2)].ub.get() : o.body.get(), true, {left()},
              "in the ring all-reduce"};
    }
    if (o.first_out) return {first_out_.ub.get(), false, {right()}, "in the ring all-reduce"};
    if (o.sends > 0) return {o.rout.get(), false, {right()}, "in the ring all-reduce"};
    return out_point("it did not take this collective's message");
  }

  // ---- broadcast ----
  //
  // Up to inline_capacity() bytes the root sends [notice | data] to every peer; larger ones its
  // notice first, then the data in chunks (no message on the bulk slot is longer than a chunk,
  // so a receive posted for one, by a ring whose notices are still being checked, can take any
  // of them). A receiver checks the root's notice before it posts anything on its buffer. As
  // MPI_Bcast: the root's call ends when its data is delivered; a receiver that never takes it
  // is named. Phases: root 1 sending; receiver 0 the notice, 2 the chunks.

  void start_broadcast_op(operation& o) {
    const bool inline_data = o.bytes <= inline_capacity();
    if (rank_ == o.peer) {
      post_collective(o.c, o.notice, inline_data ? o.buf : nullptr, inline_data ? o.bytes : 0, others());
      o.phase = 1;
      if (inline_data) return;
      o.exposed = true;
      o.body = context_->createUnboundBuffer(o.buf, o.bytes);
      const std::size_t chunk = bulk_chunk(), chunks = detail::chunk_count(o.bytes, chunk);
      for (int p : others())
        for (std::size_t k = 0; k < chunks; ++k) {
          post(o.c, [&] { o.body->send(p, detail::gloo_slot_bulk, k * chunk, detail::chunk_length(o.bytes, chunk, k)); }, p);
          ++o.sends;
        }
      return;
    }
    o.phase = 0;
  }

  void progress_broadcast(operation& o) {
    const std::size_t chunk = bulk_chunk(), chunks = detail::chunk_count(o.bytes, chunk);
    if (rank_ == o.peer) {
      // Sends to the peers in rank order, chunk by chunk: each completion is one of them.
      while (o.sends > 0) {
        const auto peers = others();
        const std::size_t left_peers = (o.sends + chunks - 1) / chunks;
        if (!try_take(o.c, *o.body, false,
                      std::vector<int>(peers.end() - static_cast<std::ptrdiff_t>(left_peers), peers.end())))
          return;
        --o.sends;
      }
      if (!out_sent(o)) return;
      if (o.body) forget(o.body.get());
      o.body.reset();
      o.exposed = false;
      o.done = true;
      return;
    }
    auto& b = in_[static_cast<std::size_t>(o.peer)];
    if (o.phase == 0) {
      if (!try_take(o.c, *b.ub, true, {o.peer})) return;
      in_posted_[static_cast<std::size_t>(o.peer)] = false;
      detail::gloo_notice theirs;
      std::memcpy(&theirs, b.bytes.get(), sizeof theirs);
      check_notice(o, o.peer, theirs);
      if (o.bytes <= inline_capacity()) {
        if (o.bytes != 0) std::memcpy(o.buf, b.bytes.get() + sizeof theirs, o.bytes);
        post_in(o.c, o.peer);
        o.done = true;
        return;
      }
      o.exposed = true;
      o.body = context_->createUnboundBuffer(o.buf, o.bytes);
      for (std::size_t k = 0; k < chunks; ++k)
        post(o.c, [&] { o.body->recv(o.peer, detail::gloo_slot_bulk, k * chunk, detail::chunk_length(o.bytes, chunk, k)); },
             o.peer);
      o.sends = chunks;  // receives outstanding
      o.phase = 2;
    }
    while (o.sends > 0) {
      if (!try_take(o.c, *o.body, true, {o.peer})) return;
      --o.sends;
    }
    post_in(o.c, o.peer);
    forget(o.body.get());
    o.body.reset();
    o.exposed = false;
    o.done = true;
  }

  block_point broadcast_point(const operation& o) {
    const std::size_t chunks = detail::chunk_count(o.bytes, bulk_chunk());
    if (rank_ == o.peer) {
      if (o.sends > 0) {
        const auto peers = others();
        const std::size_t left_peers = (o.sends + chunks - 1) / chunks;
        return {o.body.get(), false, std::vector<int>(peers.end() - static_cast<std::ptrdiff_t>(left_peers), peers.end()),
                "it did not take the broadcast's data"};
      }
      return out_point("it did not take this collective's message");
    }
    if (o.phase == 0)
      return {in_[static_cast<std::size_t>(o.peer)].ub.get(), true, {o.peer}, "they never started this collective"};
    return {o.body.get(), true, {o.peer}, "in the broadcast's data"};
  }

  // ---- sizes, setup and closing ----

  // Collective messages carry up to this many bytes of data after their header; never fewer
  // than one 8-byte element per rank, so an all-reduce too small for the ring always fits.
  std::size_t inline_capacity() const noexcept {
    return std::max(options_.eager_bytes, std::size_t{8} * static_cast<std::size_t>(size_));
  }
  std::size_t bulk_chunk() const noexcept {
    return std::max<std::size_t>(options_.chunk_bytes / 8 * 8, 8);
  }

  static std::chrono::milliseconds remaining_ms(const deadline& d) {
    // Rounded up, plus one: a gloo wait must not end before our deadline has passed, or its
    // timeout would read as a lost peer.
    const auto left = d.remaining();
    const auto hours = std::chrono::hours(24 * 365);
    if (left >= hours) return hours;
    return std::chrono::duration_cast<std::chrono::milliseconds>(left) + std::chrono::milliseconds(2);
  }

  // Registers our buffers, posts the first receives, then exchanges a message with every peer:
  // a rank whose connections are all up may otherwise finish, and close them, while a peer is
  // still connecting to it. The message also checks that every rank was given the same size.
  void setup(const detail::call_info& c, const deadline& d) {
    ignore_sigpipe();
    const std::size_t capacity = detail::gloo_small_header + inline_capacity();
    in_.resize(static_cast<std::size_t>(size_));
    in_posted_.assign(static_cast<std::size_t>(size_), false);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      auto& b = in_[static_cast<std::size_t>(p)];
      b.size = capacity;
      b.bytes.reset(new unsigned char[capacity]);
      b.ub = context_->createUnboundBuffer(b.bytes.get(), capacity);
    }
    out_.size = capacity;
    out_.bytes.reset(new unsigned char[capacity]);
    out_.ub = context_->createUnboundBuffer(out_.bytes.get(), capacity);
    // Every peer's next collective message has a receive posted before it is sent, so it
    // moves in one write instead of gloo's send-ready / recv-ready handshake.
    for (int p = 0; p < size_; ++p)
      if (p != rank_) post_in(c, p);
    if (size_ == 1) return;
    const detail::gloo_notice hello{0, 3, size_, 0, 0, 0};
    post_collective(c, hello, nullptr, 0, others());
    collect(c, d, hello, others());
    repost_collective(c, others());
    finish_collective_sends(c, d);
  }

  void ignore_sigpipe() const noexcept {
    if (!options_.ignore_sigpipe) return;
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }

  void close() noexcept {
    if (closed_) return;
    closed_ = true;
    if (!context_) return;
    try {
      context_->closeConnections();
    } catch (...) {
    }
  }

  // ---- calls, failures and waits ----

  // ---- calls and failures ----

  // Contract b: after a failure every call rethrows it; after abort() each call says so.
  void enter(const detail::call_info& c) {
    if (failure_) throw *failure_;
    if (aborted_.load(std::memory_order_acquire))
      throw transport_error(detail::describe(c) + ": the communicator was aborted (abort())");
  }

  // The first failure sticks; every operation in flight fails with it. No receive or send of
  // ours may complete into (or from) a caller's buffer after this: with one posted, the
  // connections close now (the peers then see this rank as lost). Otherwise only the
  // communicator's own buffers are involved, and they stay open until the destructor's
  // goodbye, so the peers learn what happened instead of seeing a reset.
  [[noreturn]] void fail(transport_error e) {
    if (!failure_) failure_ = std::move(e);
    failed_.store(true, std::memory_order_release);
    bool exposed = false;
    for (auto& o : ops_) {
      if (o->finished()) continue;
      exposed = exposed || o->exposed;
      o->failed = true;
    }
    ops_.clear();
    if (exposed) close();
    throw *failure_;
  }

  std::vector<int> others() const {
    std::vector<int> v;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) v.push_back(p);
    return v;
  }
  std::vector<int> others_or_self() const {
    auto v = others();
    if (v.empty()) v.push_back(rank_);
    return v;
  }

  // Posting fails at once when the connection is already closed: a lost peer.
  template <class F>
  void post(const detail::call_info& c, F&& f, const std::vector<int>& peers) {
    std::string reason;
    try {
      f();
      return;
    } catch (const std::exception& e) {
      reason = detail::gloo_reason(e);
    }
    fail(detail::lost_peer_error(c, peers, reason));
  }
  template <class F>
  void post(const detail::call_info& c, F&& f, int peer) {
    post(c, std::forward<F>(f), std::vector<int>{peer});
  }

  // ---- the construction and shutdown exchanges (blocking, with gloo's own waits) ----

  // Waits for one posted operation; `awaited` names whom it depends on. gloo wakes it on
  // completion, on a closed connection (a lost peer), on its own timeout (set just past our
  // deadline) or through abort().
  void wait(const detail::call_info& c, const deadline& d, ::gloo::transport::UnboundBuffer& ub,
            bool is_recv, const std::vector<int>& awaited, int* source, const char* note) {
    {
      std::lock_guard<std::mutex> lock(waiting_mutex_);
      waiting_ = &ub;
      waiting_recv_ = is_recv;
    }
    struct unregister {
      gloo_communicator* self;
      ~unregister() {
        std::lock_guard<std::mutex> lock(self->waiting_mutex_);
        self->waiting_ = nullptr;
      }
    };
    std::string reason;
    bool done = false;
    const bool abortable = !shutting_down_;
    {
      unregister guard{this};
      if (!(abortable && aborted_.load(std::memory_order_acquire))) {
        try {
          done = is_recv ? ub.waitRecv(source, remaining_ms(d)) : ub.waitSend(nullptr, remaining_ms(d));
        } catch (const std::exception& e) {
          reason = detail::gloo_reason(e);
        }
      }
    }
    if (done) return;
    if (aborted_.load(std::memory_order_acquire) && (abortable || reason.empty()))
      fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort()) " +
                           "while waiting for " + detail::rank_list(awaited)));
    if (d.passed()) fail(detail::deadline_error(c, awaited, note));
    fail(detail::lost_peer_error(c, awaited, "its connection closed: " + reason));
  }

  void post_in(const detail::call_info& c, int p) {
    auto& b = in_[static_cast<std::size_t>(p)];
    post(c, [&] { b.ub->recv(p, detail::gloo_slot_collective, 0, b.size); }, p);
    in_posted_[static_cast<std::size_t>(p)] = true;
  }

  // Ours to every peer, theirs from every peer, skipping what a failed collective left unread.
  // A lost peer is skipped, not a reason to stop: the others still wait for our goodbye. The
  // goodbye has a buffer of its own: out_ may still hold a failed collective's message, or
  // carry gloo's error from a peer that died (gloo keeps it on the buffer).
  void goodbye(const detail::call_info& c, const deadline& until) {
    const detail::gloo_notice bye{collectives_ + 1, 4, 0, 0, 0, 0};
    bye_.size = sizeof bye;
    bye_.bytes.reset(new unsigned char[sizeof bye]);
    std::memcpy(bye_.bytes.get(), &bye, sizeof bye);
    bye_.ub = context_->createUnboundBuffer(bye_.bytes.get(), sizeof bye);
    std::vector<int> sent;
    for (int p : others()) {
      try {
        bye_.ub->send(p, detail::gloo_slot_collective, 0, sizeof bye);
        sent.push_back(p);
      } catch (const std::exception&) {
      }
    }
    for (int p : others()) {
      try {
        for (;;) {
          if (!in_posted_[static_cast<std::size_t>(p)]) post_in(c, p);
          auto& b = in_[static_cast<std::size_t>(p)];
          wait(c, until, *b.ub, true, {p}, nullptr, "it did not say goodbye");
          in_posted_[static_cast<std::size_t>(p)] = false;
          detail::gloo_notice theirs;
          std::memcpy(&theirs, b.bytes.get(), sizeof theirs);
          if (theirs.kind == 4) break;
        }
      } catch (const std::exception&) {
      }
    }
    for (std::size_t i = 0; i < sent.size(); ++i) {
      try {
        wait(c, until, *bye_.ub, false, {sent[i]}, nullptr, "it did not take our goodbye");
      } catch (const std::exception&) {
        break;
      }
    }
  }

  // Our notice (and up to inline_capacity() bytes of data) to each of `to`, from out_.
  void post_collective(const detail::call_info& c, const detail::gloo_notice& me, const void* data,
                       std::size_t bytes, const std::vector<int>& to) {
    std::memcpy(out_.bytes.get(), &me, sizeof me);
    if (bytes != 0) std::memcpy(out_.bytes.get() + sizeof me, data, bytes);
    for (int p : to) post(c, [&] { out_.ub->send(p, detail::gloo_slot_collective, 0, sizeof me + bytes); }, p);
    out_pending_ = to.size();
    out_to_ = to;
  }

  // The sends from out_ must have left before out_ is written again.
  void finish_collective_sends(const detail::call_info& c, const deadline& d) {
    while (out_pending_ > 0) {
      const std::vector<int> left(out_to_.end() - static_cast<std::ptrdiff_t>(out_pending_), out_to_.end());
      wait(c, d, *out_.ub, false, left, nullptr, "it did not take this collective's message");
      --out_pending_;
    }
  }

  // Waits for each of `from`'s message of this collective and checks its notice.
  void collect(const detail::call_info& c, const deadline& d, const detail::gloo_notice& me,
               const std::vector<int>& from) {
    for (std::size_t i = 0; i < from.size(); ++i) {
      const int p = from[i];
      auto& b = in_[static_cast<std::size_t>(p)];
      wait(c, d, *b.ub, true, std::vector<int>(from.begin() + static_cast<std::ptrdiff_t>(i), from.end()),
           nullptr, "they never started this collective");
      in_posted_[static_cast<std::size_t>(p)] = false;
      detail::gloo_notice theirs;
      std::memcpy(&theirs, b.bytes.get(), sizeof theirs);
      if (!(theirs == me))
        fail(transport_error(detail::describe(c) + ": arguments differ across ranks in collective #" +
                             std::to_string(me.index) + ": rank " + std::to_string(p) +
                             " called " + (theirs.index == me.index ? theirs.describe()
                                                                    : theirs.describe() + " as collective #" +
                                                                          std::to_string(theirs.index)) +
                             ", rank " + std::to_string(rank_) + " called " + me.describe()));
    }
  }

  void repost_collective(const detail::call_info& c, const std::vector<int>& from) {
    for (int p : from) post_in(c, p);
  }

  // ---- small sends ----

  // Small sends not yet known to be received: beyond max_eager_in_flight the oldest is
  // waited for.
  void reap_eager(const detail::call_info& c, const deadline& d) {
    while (eager_.size() >= options_.max_eager_in_flight && !eager_.empty()) {
      auto& m = eager_.front();
      wait(c, d, *m.ub, false, {m.dst}, nullptr, "it has not received an earlier message");
      eager_.pop_front();
    }
  }
  // Lets go of the small sends known to be received, without waiting.
  void reap_received() {
    while (!eager_.empty()) {
      auto& m = eager_.front();
      const std::optional<bool> r = detail::gloo_peek::ready(*m.ub, false);
      if (!r || !*r) return;
      try {
        if (!m.ub->waitSend(nullptr, std::chrono::hours(1))) return;
      } catch (const std::exception&) {
        return;  // its peer is gone; a later call waiting for that peer says so
      }
      eager_.pop_front();
    }
  }

  // ---- state (the map above says who touches what) ----

  gloo_options options_;
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t calls_ = 0;
  std::int64_t collectives_ = 0;
  std::optional<transport_error> failure_;  // owning thread only
  std::atomic<bool> failed_{false};         // mirrors failure_ for failed() on other threads
  std::atomic<bool> aborted_{false};
  bool closed_ = false;
  bool shutting_down_ = false;  // in the destructor: abort() no longer stops waits
  std::mutex waiting_mutex_;  // guards waiting_ against abort() from another thread
  ::gloo::transport::UnboundBuffer* waiting_ = nullptr;
  bool waiting_recv_ = false;
  std::vector<credit> credits_;
  std::shared_ptr<::gloo::Context> context_;
  // Buffers gloo may refer to: declared after context_, so destroyed before it, and only
  // after close() has shut the connections.
  std::deque<op_ptr> ops_;              // in flight, in issue order (their buffers on callers' memory)
  std::vector<detail::gloo_owned> in_;  // per peer: its next collective message
  std::vector<bool> in_posted_;         // per peer: whether in_'s receive is posted
  detail::gloo_owned out_;              // our collective message
  std::size_t out_pending_ = 0;
  std::vector<int> out_to_;
  std::vector<std::unique_ptr<p2p_head>> posted_;  // header receives posted, not completed
  std::deque<std::unique_ptr<p2p_head>> early_;    // headers taken for a later receive
  std::vector<detail::gloo_owned> spare_heads_;    // header buffers free for reuse
  detail::gloo_owned bye_;         // the destructor's goodbye
  detail::gloo_owned notice_out_;  // the small all-reduce's notices to the peers it does not send to first
  std::vector<int> notices_pending_;
  detail::gloo_owned scratch_[2];  // the ring's incoming segments, alternating by step
  detail::gloo_owned first_out_;   // the ring's first outgoing chunk, sent before the check
  std::deque<eager_send> eager_;
  detail::gloo_timer timer_;  // last: its thread stops before any buffer it may touch goes
};

// ---- gloo_work, out of line: it drives the communicator ----

inline bool gloo_work::test() {
  if (!op_) return true;
  auto& o = *static_cast<gloo_communicator::operation*>(op_.get());
  if (o.done || o.cancelled) return true;
  if (o.orphan) throw transport_error(detail::describe(o.c) + ": its communicator was destroyed");
  comm_->enter(o.c);
  comm_->progress();
  return o.done || o.cancelled;
}

inline void gloo_work::wait(deadline d) {
  if (!op_) return;
  auto& o = *static_cast<gloo_communicator::operation*>(op_.get());
  if (o.done || o.cancelled) return;
  if (o.orphan) throw transport_error(detail::describe(o.c) + ": its communicator was destroyed");
  comm_->enter(o.c);
  comm_->wait_op(o, d);
}

inline bool gloo_work::wait_until(deadline::clock::time_point t) {
  if (!op_) return true;
  auto& o = *static_cast<gloo_communicator::operation*>(op_.get());
  if (o.done || o.cancelled) return true;
  if (o.orphan) throw transport_error(detail::describe(o.c) + ": its communicator was destroyed");
  comm_->enter(o.c);
  return comm_->wait_op(o, deadline::at(t), false, /*timed=*/true);
}

inline int gloo_work::source() const noexcept {
  if (!op_) return -1;
  const auto& o = *static_cast<const gloo_communicator::operation*>(op_.get());
  return o.source >= 0 ? o.source : o.peer;
}

inline bool gloo_work::cancel() noexcept {
  if (!op_) return true;
  auto& o = *static_cast<gloo_communicator::operation*>(op_.get());
  if (o.done || o.cancelled || o.orphan || o.failed) return true;
  if (o.what != gloo_communicator::operation::kind::recv || o.phase != 0) return false;  // goes on
  comm_->withdraw(o);
  return true;
}

}  // namespace cadence::transport
