// The gloo backend (target cadence::gloo): a communicator over a gloo TCP context, found by a
// file-store rendezvous, whose every wait has a deadline and names the peer it waits for.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
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

namespace cadence::transport {

// ---- gloo_options ----

struct gloo_options {
  /// The rendezvous folder (gloo::rendezvous::FileStore) every rank can reach, typically on a
  /// shared file system or, on one host, a temporary folder. It must exist and be writable.
  std::string store_path;
  /// Names this communicator inside the folder (a subfolder of that name holds its keys), so
  /// several communicators, or survivors forming a new one after a peer died, share a folder.
  /// Must be fresh: keys left by an earlier job under the same prefix would be read as peers.
  std::string prefix = "cadence";
  /// The address our TCP device binds; peers connect to it. Loopback by default (one host).
  std::string hostname = "127.0.0.1";
  /// A network interface ("eth0") to bind instead of hostname, when not empty.
  std::string interface_name;
  /// Point to point messages and collectives of at most this many bytes travel in one framed
  /// message through buffers the communicator owns (a send returns as soon as it is posted,
  /// the way MPI's eager protocol does; an all-reduce sends its whole buffer to every peer and
  /// reduces in rank order); larger ones announce their size in a header and then move
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
  /// Construction polls the folder for the other ranks' arrival at this interval.
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
  std::int64_t kind = 0;   // 1 allreduce, 2 broadcast, 3 construction, 4 shutdown
  std::int64_t count = 0;  // elements (allreduce) or bytes (broadcast)
  std::int64_t type = 0;   // dtype
  std::int64_t op = 0;     // reduce_op
  std::int64_t root = 0;
  bool operator==(const gloo_notice& o) const {
    return index == o.index && kind == o.kind && count == o.count && type == o.type &&
           op == o.op && root == o.root;
  }
  std::string describe() const {
    if (kind == 3) return "construction(size " + std::to_string(count) + ")";
    if (kind == 4) return "shutdown (destroyed its communicator)";
    return kind == 1 ? signature("allreduce", static_cast<std::size_t>(count),
                                 static_cast<dtype>(type), static_cast<reduce_op>(op))
                     : signature("broadcast", static_cast<std::size_t>(count), static_cast<int>(root));
  }
};

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

// Wakes one gloo receive wait at a time at a given time (abortWaitRecv), so that try_recv
// never relies on gloo's wait timeout, which closes every connection of the context. Its
// thread starts with the first arm() and stops with the object.
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

  void arm(::gloo::transport::UnboundBuffer* ub, std::chrono::steady_clock::time_point when) {
    std::lock_guard<std::mutex> lock(m_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    armed_ = ub;
    when_ = when;
    fired_ = false;
    // The thread re-checks when it wakes at the time it sleeps until, so it needs waking only
    // for an earlier time: a server re-arming for a later deadline costs no context switch.
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
        armed_->abortWaitRecv();
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
  std::chrono::steady_clock::time_point when_{};
  std::chrono::steady_clock::time_point sleeping_until_ = std::chrono::steady_clock::time_point::min();
  bool fired_ = false;
};

}  // namespace detail

// ---- gloo_communicator ----

/// Models transport::communicator over gloo's TCP transport.
///
/// Construction is collective: every rank of `size` constructs one with the same store folder
/// and prefix. A rank that never arrives makes the others throw transport_error naming it when
/// the deadline passes.
///
/// Threads: one thread calls it at a time (the calls are not synchronized); abort() and
/// failed() may be called from any thread. gloo's own device thread moves the bytes.
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
/// A failure that leaves an operation on a caller's buffer posted (inside the ring, a large
/// message) closes the connections at once, so gloo never touches that buffer after the call
/// returned; the peers then see this rank as lost. Other failures leave the connections open
/// until the destructor, which says goodbye to every peer before it closes them.
///
/// Neither copyable nor movable (gloo holds pointers into it): hold it in a std::unique_ptr.
class gloo_communicator {
public:
  // ---- construction and shutdown ----

  /// Rendezvous through options.store_path. Throws invalid_parameter_error for a store folder
  /// that does not exist or is not writable (before waiting), and transport_error naming the
  /// missing ranks when the others do not all arrive before `d`.
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
    const std::string& folder = options_.store_path;
    struct stat st {};
    if (folder.empty() || ::stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      detail::bad_argument(c, "the store folder \"" + folder + "\" does not exist or is not a folder");
    if (::access(folder.c_str(), W_OK | X_OK) != 0)
      detail::bad_argument(c, "the store folder \"" + folder + "\" is not writable (" +
                                  std::strerror(errno) + ")");
    const std::string dir = folder + "/" + options_.prefix;
    if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
      detail::bad_argument(c, "cannot create \"" + dir + "\" in the store folder: " + std::strerror(errno));

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
    const std::string mark = dir + "/cadence-arrived-" + std::to_string(rank_);
    {
      const std::string tmp = mark + ".tmp";
      std::FILE* f = std::fopen(tmp.c_str(), "w");
      if (f == nullptr || std::fclose(f) != 0 || std::rename(tmp.c_str(), mark.c_str()) != 0)
        detail::bad_argument(c, "cannot write \"" + mark + "\" in the store folder: " +
                                    std::strerror(errno));
    }
    for (;;) {
      std::vector<int> missing;
      for (int p = 0; p < size_; ++p) {
        const std::string theirs = dir + "/cadence-arrived-" + std::to_string(p);
        if (p != rank_ && ::access(theirs.c_str(), F_OK) != 0) missing.push_back(p);
      }
      if (missing.empty()) break;
      if (d.passed())
        throw detail::deadline_error(c, missing, "they never arrived at the rendezvous in \"" +
                                                     dir + "\"");
      std::this_thread::sleep_for(options_.store_poll);
    }

    try {
      auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
      ctx->setTimeout(remaining_ms(d));
#if CADENCE_GLOO_RENDEZVOUS_SHARED_STORE
      auto store = std::make_shared<::gloo::rendezvous::FileStore>(dir);
      ctx->connectFullMesh(store, device);
#else
      ::gloo::rendezvous::FileStore store(dir);
      ctx->connectFullMesh(store, device);
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
  /// still calling collectives sees "rank r called shutdown".
  ~gloo_communicator() {
    if (context_ && !closed_) {
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
    const detail::call_info c = begin("allreduce");
    enter(c);
    const std::size_t bytes = detail::checked_bytes(c, count, t);
    detail::check_buffer(c, buf, bytes);
    detail::check_op(c, op);
    if (!detail::host_reducible(t))
      detail::bad_argument(c, std::string("dtype ") + dtype_name(t) +
                                  " has no host arithmetic (it is for device backends such as NCCL)");
    detail::check_deadline(c, d);
    const detail::gloo_notice me{++collectives_, 1, static_cast<std::int64_t>(count),
                                 static_cast<std::int64_t>(t), static_cast<std::int64_t>(op), 0};
    if (size_ == 1) return;
    // Every peer gets our notice (and, up to eager_bytes, our data); we take theirs. Larger
    // all-reduces run as a ring, which checks the notices while its first chunks move.
    const bool inline_data = bytes <= inline_capacity();
    post_collective(c, me, inline_data ? buf : nullptr, inline_data ? bytes : 0, others());
    if (inline_data) {
      collect(c, d, me, others());
      reduce_in_rank_order(buf, count, t, op);
      repost_collective(c, others());
    } else {
      ring_allreduce(c, d, static_cast<unsigned char*>(buf), count, t, op, me);
    }
    finish_collective_sends(c, d);
  }

  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    const detail::call_info c = begin("broadcast");
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, root, "root");
    detail::check_deadline(c, d);
    const detail::gloo_notice me{++collectives_, 2, static_cast<std::int64_t>(bytes), 0, 0, root};
    if (size_ == 1) return;
    const bool inline_data = bytes <= inline_capacity();
    const std::size_t chunk = bulk_chunk();
    const std::size_t chunks = (bytes + chunk - 1) / chunk;
    if (rank_ == root) {
      post_collective(c, me, inline_data ? buf : nullptr, inline_data ? bytes : 0, others());
      if (!inline_data) {
        exposed_ = true;
        auto ub = context_->createUnboundBuffer(buf, bytes);
        std::vector<int> pending = others();
        // In chunks: no message on the bulk slot is longer than a chunk, so a receive posted
        // for one (by a ring whose notices are still being checked) can take any of them.
        for (int p : pending)
          for (std::size_t k = 0; k < chunks; ++k)
            post(c, [&] { ub->send(p, detail::gloo_slot_bulk, k * chunk, std::min(chunk, bytes - k * chunk)); }, p);
        // As MPI_Bcast: the root's call ends when its data is delivered; a receiver that
        // never takes it is named.
        for (std::size_t i = 0; i < pending.size(); ++i) {
          for (std::size_t k = 0; k < chunks; ++k)
            wait(c, d, *ub, false, {pending.begin() + static_cast<std::ptrdiff_t>(i), pending.end()},
                 nullptr, "it did not take the broadcast's data");
        }
        exposed_ = false;
      }
      finish_collective_sends(c, d);
      return;
    }
    collect(c, d, me, {root});
    if (inline_data) {
      if (bytes != 0) std::memcpy(buf, in_[static_cast<std::size_t>(root)].bytes.get() + sizeof me, bytes);
    } else {
      exposed_ = true;
      auto ub = context_->createUnboundBuffer(buf, bytes);
      for (std::size_t k = 0; k < chunks; ++k)
        post(c, [&] { ub->recv(root, detail::gloo_slot_bulk, k * chunk, std::min(chunk, bytes - k * chunk)); }, root);
      for (std::size_t k = 0; k < chunks; ++k)
        wait(c, d, *ub, true, {root}, nullptr, "in the broadcast's data");
      exposed_ = false;
    }
    repost_collective(c, {root});
  }

  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    const detail::call_info c = begin("send");
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, dst, "destination");
    detail::check_tag(c, tag);
    detail::check_deadline(c, d);
    if (dst == rank_)
      detail::bad_argument(c, "a send to itself (rank " + std::to_string(rank_) +
                                  ") is not supported by the gloo backend");
    reap_eager(c, d);
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
    if (inline_data) return;
    // gloo reads the caller's buffer until the receiver has taken it: wait for that.
    exposed_ = true;
    auto ub = context_->createUnboundBuffer(const_cast<void*>(buf), bytes);
    post(c, [&] { ub->send(dst, detail::gloo_slot_p2p_body | static_cast<std::uint64_t>(tag), 0, bytes); }, dst);
    wait(c, d, *ub, false, {dst}, nullptr, "the matching recv was not posted");
    exposed_ = false;
  }

  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    return *receive("recv", buf, bytes, src, tag, d, /*poll=*/false);
  }

  /// recv() that treats a deadline with no matching message as "nothing yet": returns
  /// std::nullopt and the communicator stays usable (see try_recv in communicator.hpp); a
  /// deadline already passed polls once. gloo cannot cancel a receive, and its own wait
  /// timeout closes every connection of the context (Debian's snapshot and upstream both call
  /// Context::signalException on it), so a try_recv never lets gloo time out: a timer thread
  /// of the communicator wakes the wait with abortWaitRecv at the deadline, and the receive
  /// stays posted. The next receive whose (source, tag) it matches waits on that same
  /// receive instead of posting a second one, and a message it takes for another caller's
  /// source is kept until a receive asks for it, so nothing is lost or reordered.
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    return receive("try_recv", buf, bytes, src, tag, d, /*poll=*/true);
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
  // Map of this class. Its state (the members at the end), by who touches it:
  //  - The owning thread only (one call at a time): calls_ (each call's sequence number, from
  //    begin()), collectives_ (the collective index the notices carry), failure_ (the first
  //    failure: fail() sets it, enter() rethrows it), exposed_ (a caller's buffer is posted,
  //    so fail() must close the connections), closed_ (close() has run: from fail() or the
  //    destructor), shutting_down_ (in the destructor), acc_ (reduce_in_rank_order's sums).
  //  - Other threads too: failed_ and aborted_ (atomics: failed() reads them, abort() sets
  //    aborted_), and, under waiting_mutex_, waiting_ / waiting_recv_: the one gloo buffer a
  //    wait is blocked on, which abort() wakes (wait() and wait_head() register it).
  //  - gloo's device thread, while operations are posted, reads and writes the registered
  //    buffers: in_ (per peer, its next collective message; in_posted_ says which receives are
  //    posted), out_ (our collective message; out_pending_ and out_to_ track its sends),
  //    scratch_ and first_out_ (the ring), the point-to-point header receives (posted_ until
  //    they complete, then early_ when taken for a later receive; spare_heads_ for reuse),
  //    eager_ (small sends not yet known to be received; reap_eager() and the destructor wait
  //    for them) and bye_ (the destructor's goodbye). They are declared after context_, so
  //    destroyed before it, and only after close().
  //  - timer_'s thread wakes a header receive at a try_recv's deadline (wait_head() arms it);
  //    declared last, it stops first.
  // The functions below, in order: point-to-point receives; sizes, setup and closing; calls,
  // failures and waits; collectives (notices, goodbye, rank-order reduction, the ring); the
  // small sends' bound.

  struct eager_send {
    std::unique_ptr<unsigned char[]> bytes;
    std::size_t size = 0;
    std::unique_ptr<::gloo::transport::UnboundBuffer> ub;
    int dst = -1;
  };

  // ---- point to point receives ----
  // A message starts with a header (gloo_frame and, up to eager_bytes, the data) on slot
  // p2p_head | tag. Header receives are posted into buffers of our own, one per receive, and
  // may outlive the call that posted them: a try_recv that reaches its deadline leaves its
  // receive posted (gloo cannot cancel one). For each tag the posted receives cover disjoint
  // sets of senders, so a message can match only one of them, and gloo delivers each (sender,
  // slot) in order; a message taken for a sender the caller did not ask for waits in early_
  // for the receive that asks for it, which looks there first. Order per (source, tag) holds.
  struct p2p_head {
    std::vector<int> from;  // the senders it was posted for, ascending
    int tag = 0;
    int sender = -1;        // once it has completed
    bool reusable = true;   // false once gloo has stored an error on the buffer
    detail::gloo_owned buf;
  };

  std::optional<int> receive(const char* op, void* buf, std::size_t bytes, int src, int tag,
                             const deadline& d, bool poll) {
    const detail::call_info c = begin(op);
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, src, "source", /*allow_any=*/true);
    detail::check_tag(c, tag);
    if (!poll) detail::check_deadline(c, d);  // try_recv: a passed deadline polls once
    if (src == rank_)
      detail::bad_argument(c, std::string("a ") + op + " from itself (rank " + std::to_string(rank_) +
                                  ") is not supported by the gloo backend");
    if (src == any_source && size_ == 1)
      detail::bad_argument(c, "any_source on a communicator of one rank would wait forever");
    std::unique_ptr<p2p_head> head = take_head(c, src, tag, d);
    if (!head) {
      if (!poll) fail(detail::deadline_error(c, src == any_source ? others() : std::vector<int>{src},
                                             "no matching message arrived"));
      return std::nullopt;
    }
    const int sender = head->sender;
    detail::gloo_frame frame;
    std::memcpy(&frame, head->buf.bytes.get(), sizeof frame);
    if (frame.bytes != bytes)
      fail(transport_error(detail::describe(c) + ": rank " + std::to_string(sender) + " sent " +
                           std::to_string(frame.bytes) + " bytes with tag " + std::to_string(tag) +
                           " but rank " + std::to_string(rank_) + " received into " +
                           std::to_string(bytes) + " bytes"));
    if (bytes <= options_.eager_bytes) {
      if (bytes != 0) std::memcpy(buf, head->buf.bytes.get() + sizeof frame, bytes);
      if (head->reusable) spare_heads_.push_back(std::move(head->buf));
      return sender;
    }
    if (head->reusable) spare_heads_.push_back(std::move(head->buf));
    // The header has arrived, so the data follows it at once; a try_recv whose deadline has
    // passed by now still takes it (within body_wait) rather than leave half a message.
    const deadline body = d.passed() ? deadline(options_.body_wait) : d;
    exposed_ = true;
    auto ub = context_->createUnboundBuffer(buf, bytes);
    post(c, [&] { ub->recv(sender, detail::gloo_slot_p2p_body | static_cast<std::uint64_t>(tag), 0, bytes); }, sender);
    wait(c, body, *ub, true, {sender}, nullptr, "the message's data did not arrive");
    exposed_ = false;
    return sender;
  }

  // The next header for (src, tag): one taken earlier, or from the posted receives covering the
  // senders asked for (posting one for those not yet covered). Null when d passes first; the
  // receives stay posted for the next call.
  std::unique_ptr<p2p_head> take_head(const detail::call_info& c, int src, int tag, const deadline& d) {
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
      std::vector<p2p_head*> candidates;
      for (const auto& h : posted_)
        if (h->tag == tag && std::any_of(h->from.begin(), h->from.end(), wanted)) candidates.push_back(h.get());
      p2p_head* done = wait_heads(c, candidates, d);
      if (done == nullptr) return nullptr;
      auto it = std::find_if(posted_.begin(), posted_.end(), [&](const auto& h) { return h.get() == done; });
      std::unique_ptr<p2p_head> h = std::move(*it);
      posted_.erase(it);
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

  // Waits until one of `candidates` completes (returned, its sender set) or d passes (null,
  // after one last poll of each). gloo waits on one buffer at a time: with several candidates
  // (a caller mixing specific and any_source receives on one tag) it takes turns in slices.
  p2p_head* wait_heads(const detail::call_info& c, const std::vector<p2p_head*>& candidates, const deadline& d) {
    constexpr auto slice = std::chrono::milliseconds(2);
    constexpr auto last_poll = std::chrono::milliseconds(1);
    for (;;) {
      const bool final_round = d.passed();
      for (p2p_head* h : candidates) {
        const auto now = deadline::clock::now();
        auto until = final_round ? now + last_poll : d.time_point();
        if (!final_round && candidates.size() > 1) until = std::min(until, now + slice);
        if (wait_head(c, *h, until)) return h;
      }
      if (final_round) return nullptr;
    }
  }

  // One header receive until `until`: true when it completed. The timer thread wakes the wait
  // with abortWaitRecv at `until`; gloo's own timeout, far beyond, is never meant to fire (it
  // would close every connection). abortWaitRecv leaves a flag that only a wait consumes, so
  // when the timer fires just after the receive completed, the flag is cleared at once (a
  // wait with the flag set returns at once) and cannot wake a later wait early.
  bool wait_head(const detail::call_info& c, p2p_head& h, deadline::clock::time_point until) {
    auto& ub = *h.buf.ub;
    if (aborted_.load(std::memory_order_acquire))
      fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort())"));
    {
      std::lock_guard<std::mutex> lock(waiting_mutex_);
      waiting_ = &ub;
      waiting_recv_ = true;
    }
    struct unregister {
      gloo_communicator* self;
      ~unregister() {
        std::lock_guard<std::mutex> lock(self->waiting_mutex_);
        self->waiting_ = nullptr;
      }
    };
    bool done = false, fired = false;
    std::string reason;
    {
      unregister guard{this};
      timer_.arm(&ub, until);
      try {
        const auto margin = std::chrono::minutes(10);
        done = ub.waitRecv(&h.sender, remaining_ms(deadline::at(until)) + margin);
      } catch (const std::exception& e) {
        reason = detail::gloo_reason(e);
      }
      fired = timer_.disarm();
    }
    if (done && fired) {
      try {
        ub.waitRecv(nullptr, std::chrono::hours(1));  // returns at once: clears the flag
      } catch (const std::exception&) {
        h.reusable = false;  // the connection closed meanwhile; the message is here all the same
      }
    }
    if (!reason.empty()) {
      if (aborted_.load(std::memory_order_acquire))
        fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort()) " +
                             "while waiting for " + detail::rank_list(h.from)));
      fail(detail::lost_peer_error(c, h.from, "its connection closed: " + reason));
    }
    if (done) return true;
    if (aborted_.load(std::memory_order_acquire))
      fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort()) " +
                           "while waiting for " + detail::rank_list(h.from)));
    return false;  // the timer's: still posted
  }

  // ---- sizes, setup and closing ----

  // Collective messages carry up to this many bytes of data after their notice; never fewer
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
    const std::size_t capacity = sizeof(detail::gloo_notice) + inline_capacity();
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

  detail::call_info begin(const char* op) {
    return {"gloo", op, ++calls_, rank_, size_, deadline::clock::now()};
  }

  // Contract b: after a failure every call rethrows it; after abort() each call says so.
  void enter(const detail::call_info& c) {
    if (failure_) throw *failure_;
    if (aborted_.load(std::memory_order_acquire))
      throw transport_error(detail::describe(c) + ": the communicator was aborted (abort())");
  }

  [[noreturn]] void fail(transport_error e) {
    if (!failure_) failure_ = std::move(e);
    failed_.store(true, std::memory_order_release);
    // No receive or send of ours may complete into (or from) a caller's buffer after this:
    // with one posted, the connections close now (the peers then see this rank as lost).
    // Otherwise only the communicator's own buffers are involved, and they stay open until
    // the destructor's goodbye, so the peers learn what happened instead of seeing a reset.
    if (exposed_) close();
    throw *failure_;
  }

  std::vector<int> others() const {
    std::vector<int> v;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) v.push_back(p);
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

  // ---- collectives: posted receives, goodbye, notices, rank-order reduction, the ring ----

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

  // Our notice (and up to eager_bytes of data) to each of `to`, from out_.
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

  // result = d_0 op d_1 op ... op d_{n-1}, in rank order on every rank, so float sums are
  // bitwise identical everywhere.
  void reduce_in_rank_order(void* buf, std::size_t count, dtype t, reduce_op op) {
    const std::size_t bytes = count * dtype_size(t);
    if (bytes == 0) return;
    auto data_of = [&](int p) -> const void* {
      if (p == rank_) return buf;
      return in_[static_cast<std::size_t>(p)].bytes.get() + sizeof(detail::gloo_notice);
    };
    if (rank_ == 0) {
      for (int p = 1; p < size_; ++p) detail::reduce_into(buf, data_of(p), count, t, op);
      return;
    }
    if (acc_size_ < bytes) {
      acc_.reset(new unsigned char[bytes]);
      acc_size_ = bytes;
    }
    std::memcpy(acc_.get(), data_of(0), bytes);
    for (int p = 1; p < size_; ++p) detail::reduce_into(acc_.get(), data_of(p), count, t, op);
    std::memcpy(buf, acc_.get(), bytes);
  }

  // Ring all-reduce: in reduce-scatter step s, rank r sends segment r - s to its right
  // neighbour and adds segment r - s - 1 from its left one; after n - 1 steps it owns segment
  // r + 1 fully reduced, and n - 1 allgather steps pass the reduced segments around. Segments
  // move in chunks, pipelined: a chunk goes on to the right as soon as it is reduced (or, in
  // the allgather, received), while gloo's device thread already reads the next one, and the
  // next step's receives are posted a step ahead (two scratch buffers), so no chunk waits for
  // gloo's send-ready / recv-ready handshake.
  //
  // The peers' notices are checked while the first chunks move. Until then nothing touches the
  // caller's buffer: receives go into our scratch, each for a whole chunk (the longest message
  // any peer sends on the bulk slot, so arguments that differ can garble scratch but never
  // overrun a buffer), and the first chunk leaves from a copy. A mismatch therefore fails the
  // call without closing the connections, and every peer reads the notice that explains it.
  void ring_allreduce(const detail::call_info& c, const deadline& d, unsigned char* buf,
                      std::size_t count, dtype t, reduce_op op, const detail::gloo_notice& me) {
    const int n = size_;
    const int right = (rank_ + 1) % n, left = (rank_ + n - 1) % n;
    const std::size_t esize = dtype_size(t);
    auto first = [&](int seg) { return count * static_cast<std::size_t>(seg) / static_cast<std::size_t>(n); };
    auto seg_bytes = [&](int seg) { return (first(seg + 1) - first(seg)) * esize; };
    const std::size_t chunk = bulk_chunk();  // a multiple of 8, so of every element size
    auto chunks = [&](int seg) { return (seg_bytes(seg) + chunk - 1) / chunk; };
    auto chunk_len = [&](int seg, std::size_t k) { return std::min(chunk, seg_bytes(seg) - k * chunk); };
    const int steps = 2 * (n - 1);
    auto is_rs = [&](int s) { return s < n - 1; };
    auto seg_out = [&](int s) { return is_rs(s) ? (rank_ - s + n) % n : (rank_ + 1 - (s - (n - 1)) + 2 * n) % n; };
    auto seg_in = [&](int s) { return is_rs(s) ? (rank_ - s - 1 + 2 * n) % n : (rank_ - (s - (n - 1)) + 2 * n) % n; };

    const std::size_t largest = (count + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n) * esize;
    const std::size_t scratch_bytes = (largest + chunk - 1) / chunk * chunk;
    for (auto& sc : scratch_) {
      if (sc.size >= scratch_bytes) continue;
      sc.ub.reset();
      sc.bytes.reset(new unsigned char[scratch_bytes]);
      sc.size = scratch_bytes;
      sc.ub = context_->createUnboundBuffer(sc.bytes.get(), scratch_bytes);
    }
    const std::size_t total = count * esize;
    auto out = context_->createUnboundBuffer(buf, total);
    auto in = context_->createUnboundBuffer(buf, total);
    auto post_recvs = [&](int s) {
      const int seg = seg_in(s);
      for (std::size_t k = 0; k < chunks(seg); ++k) {
        if (is_rs(s))
          post(c, [&] { scratch_[static_cast<std::size_t>(s % 2)].ub->recv(left, detail::gloo_slot_bulk, k * chunk, chunk); }, left);
        else
          post(c, [&] { in->recv(left, detail::gloo_slot_bulk, first(seg) * esize + k * chunk, chunk_len(seg, k)); }, left);
      }
    };
    std::size_t sends = 0;
    auto post_send = [&](int s, std::size_t k) {
      const int seg = seg_out(s);
      post(c, [&] { out->send(right, detail::gloo_slot_bulk, first(seg) * esize + k * chunk, chunk_len(seg, k)); }, right);
      ++sends;
    };
    post_recvs(0);
    if (is_rs(1)) post_recvs(1);
    {
      const std::size_t len = chunk_len(seg_out(0), 0);
      if (first_out_.size < chunk) {
        first_out_.ub.reset();
        first_out_.bytes.reset(new unsigned char[chunk]);
        first_out_.size = chunk;
        first_out_.ub = context_->createUnboundBuffer(first_out_.bytes.get(), chunk);
      }
      std::memcpy(first_out_.bytes.get(), buf + first(seg_out(0)) * esize, len);
      post(c, [&] { first_out_.ub->send(right, detail::gloo_slot_bulk, 0, len); }, right);
    }
    collect(c, d, me, others());
    repost_collective(c, others());
    exposed_ = true;  // from here on gloo reads and writes the caller's buffer
    for (std::size_t k = 1; k < chunks(seg_out(0)); ++k) post_send(0, k);
    if (!is_rs(1)) post_recvs(1);
    for (int s = 0; s < steps; ++s) {
      if (s >= 1 && s + 1 < steps) post_recvs(s + 1);  // its scratch was step s - 1's: done
      const int seg = seg_in(s);
      auto& sc = scratch_[static_cast<std::size_t>(s % 2)];
      for (std::size_t k = 0; k < chunks(seg); ++k) {
        wait(c, d, is_rs(s) ? *sc.ub : *in, true, {left}, nullptr, "in the ring all-reduce");
        if (is_rs(s))
          detail::reduce_into(buf + first(seg) * esize + k * chunk, sc.bytes.get() + k * chunk,
                              chunk_len(seg, k) / esize, t, op);
        if (s + 1 < steps) post_send(s + 1, k);  // segment seg_in(s) is seg_out(s + 1)
      }
    }
    wait(c, d, *first_out_.ub, false, {right}, nullptr, "in the ring all-reduce");
    for (; sends > 0; --sends) wait(c, d, *out, false, {right}, nullptr, "in the ring all-reduce");
    exposed_ = false;
  }

  // ---- small sends ----

  // Small sends not yet known to be received: beyond max_eager_in_flight the oldest is
  // waited for. gloo has no non-blocking test of completion.
  void reap_eager(const detail::call_info& c, const deadline& d) {
    while (eager_.size() >= options_.max_eager_in_flight && !eager_.empty()) {
      auto& m = eager_.front();
      wait(c, d, *m.ub, false, {m.dst}, nullptr, "it has not received an earlier message");
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
  bool exposed_ = false;        // an operation on a caller's buffer is posted
  bool shutting_down_ = false;  // in the destructor: abort() no longer stops waits
  std::mutex waiting_mutex_;  // guards waiting_ against abort() from another thread
  ::gloo::transport::UnboundBuffer* waiting_ = nullptr;
  bool waiting_recv_ = false;
  std::shared_ptr<::gloo::Context> context_;
  // Buffers gloo may refer to: declared after context_, so destroyed before it, and only
  // after close() has shut the connections.
  std::vector<detail::gloo_owned> in_;  // per peer: its next collective message
  std::vector<bool> in_posted_;         // per peer: whether in_'s receive is posted
  detail::gloo_owned out_;              // our collective message, sent to every peer
  std::size_t out_pending_ = 0;
  std::vector<int> out_to_;
  std::vector<std::unique_ptr<p2p_head>> posted_;  // header receives posted, not completed
  std::deque<std::unique_ptr<p2p_head>> early_;    // headers taken for a later receive
  std::vector<detail::gloo_owned> spare_heads_;    // header buffers free for reuse
  detail::gloo_owned bye_;      // the destructor's goodbye
  detail::gloo_owned scratch_[2];  // the ring's incoming segments, alternating by step
  detail::gloo_owned first_out_;   // the ring's first outgoing chunk, sent before the check
  std::unique_ptr<unsigned char[]> acc_;
  std::size_t acc_size_ = 0;
  std::deque<eager_send> eager_;
  detail::gloo_timer timer_;  // last: its thread stops before any buffer it may touch goes
};

}  // namespace cadence::transport
