// The MPI backend (target cadence::mpi): a communicator over a caller-owned MPI_Comm whose
// every call is non-blocking MPI polled against its deadline, so no call can hang on a peer.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport {

// ---- mpi_options ----

struct mpi_options {
  /// Broadcasts and the all-reduces below ring_min_bytes (MPI collectives) run on a buffer the
  /// communicator owns, copied from and back to the caller's. MPI cannot cancel a collective:
  /// when one fails on its deadline its request stays posted, and if the late rank ever joins,
  /// MPI writes into that buffer. With the copy the buffer is the communicator's, kept
  /// (leaked) for as long as MPI may touch it; without it, the caller must never free or reuse
  /// a buffer whose collective failed. Costs two memcpy per call (the benchmark's --no-bounce
  /// measures it). Sends and the ring all-reduce's outgoing segments go from a copy too:
  /// Open MPI cannot cancel a send, so a failed one is released to complete on its own and
  /// reads the copy, which is leaked, instead of the caller's buffer.
  bool bounce_buffers = true;
  /// A collective is posted only once the peers it depends on have announced the same
  /// arguments (all peers for an all-reduce, the root for a broadcast receiver). MPI given
  /// mismatched arguments may corrupt memory or crash, and a collective never posted needs no
  /// abandoning when a peer is missing. Costs one small message per peer per collective and a
  /// wait for the slowest announcement; off, mismatches are still reported, after the fact.
  bool verify_before_posting = true;
  /// All-reduces of at least this many bytes run as a ring (reduce-scatter, then allgather)
  /// of point-to-point messages on the caller's buffer; smaller ones as one MPI_Iallreduce,
  /// which has the lower latency. Open MPI progresses point-to-point transfers far better than
  /// its non-blocking collectives (two to four times the bandwidth from 256 KiB up on one
  /// host, in cadence-bench-transport), and its receives can be cancelled: a ring that fails
  /// leaves MPI nothing to write into the caller's buffer. SIZE_MAX turns the ring off.
  std::size_t ring_min_bytes = 256 * 1024;
  /// Polling: the first waits spin on MPI_Test (latency); a call still waiting after this long
  /// sleeps `poll_sleep` between tests so a stalled job does not burn its cores.
  /// Long by default: Open MPI progresses a non-blocking collective only inside MPI_Test, so
  /// sleeping slows a large all-reduce.
  std::chrono::microseconds spin_for{200000};
  std::chrono::microseconds poll_sleep{50};
  /// How long the destructor waits for the peers' last announcements before it gives up and
  /// leaks the duplicated communicators rather than free them with messages in flight.
  std::chrono::milliseconds shutdown_wait{2000};
};

// ---- detail: the announcement of a collective, MPI's error text ----

namespace detail {

// What every rank announces to every other on entering a collective (on a communicator of its
// own): the collective's index and arguments. A rank whose deadline passes names the peers
// whose announcement of that index never came (MPI itself cannot say who is missing), and
// arguments that differ across ranks are reported instead of corrupting memory silently.
struct mpi_notice {
  std::int64_t index = 0;  // 1-based collective index
  std::int64_t kind = 0;   // 1 allreduce, 2 broadcast
  std::int64_t count = 0;  // elements (allreduce) or bytes (broadcast)
  std::int64_t type = 0;   // dtype
  std::int64_t op = 0;     // reduce_op
  std::int64_t root = 0;
  bool operator==(const mpi_notice& o) const {
    return index == o.index && kind == o.kind && count == o.count && type == o.type &&
           op == o.op && root == o.root;
  }
  std::string describe() const {
    return kind == 1 ? signature("allreduce", static_cast<std::size_t>(count),
                                 static_cast<dtype>(type), static_cast<reduce_op>(op))
                     : signature("broadcast", static_cast<std::size_t>(count), static_cast<int>(root));
  }
};
inline constexpr int mpi_notice_words = 6;

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

}  // namespace detail

// ---- mpi_communicator ----

/// Models transport::communicator over MPI. Construction is collective over `comm` (it
/// duplicates it, so our traffic never matches the caller's); `comm` stays the caller's and
/// must outlive this object. Only the thread that constructed it may call it (MPI needs at
/// least MPI_THREAD_FUNNELED, or MPI_THREAD_SERIALIZED when that thread is not the main one),
/// except abort() and failed(), which any thread may call: abort() only raises a flag that the
/// owning thread's polling loop sees, so MPI is never entered from two threads.
///
/// What it survives (Open MPI 4.1): a stalled rank is detected by the deadline and named, and
/// the survivors' communicators fail cleanly; they may go on over a new communicator that
/// excludes it (MPI_Comm_create_group involves only the survivors). A crashed rank is not
/// survivable: Open MPI's runtime kills the whole job (capabilities().survives_lost_peer is
/// false), and before it does, only the deadline sees the loss.
///
/// Neither copyable nor movable (MPI holds pointers into it while requests are posted): hold
/// it in a std::unique_ptr to hand it around.
class mpi_communicator {
public:
  // ---- construction and shutdown ----

  explicit mpi_communicator(MPI_Comm comm, mpi_options options = {}, deadline d = {})
      : options_(options), owner_(std::this_thread::get_id()) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      throw invalid_parameter_error("cadence::transport::mpi_communicator: MPI is not initialized");
    int provided = 0, is_main = 0;
    MPI_Query_thread(&provided);
    MPI_Is_thread_main(&is_main);
    if (provided < MPI_THREAD_FUNNELED || (!is_main && provided < MPI_THREAD_SERIALIZED))
      throw invalid_parameter_error(
          "cadence::transport::mpi_communicator: MPI was initialized with thread level " +
          std::to_string(provided) + ", too low for a communicator owned by " +
          (is_main ? std::string("the main thread (needs MPI_THREAD_FUNNELED)")
                   : std::string("another thread (needs MPI_THREAD_SERIALIZED)")));
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    const detail::call_info c{"mpi", "construction", 0, rank_, size_, deadline::clock::now()};
    detail::check_deadline(c, d);
    // MPI_Comm_idup, polled: a missing rank must not hang construction past its deadline.
    // MPI writes the new handles when the duplication completes, possibly after a timeout has
    // destroyed this object, so they land in storage that is leaked in that case.
    auto dups = std::make_unique<MPI_Comm[]>(2);
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    auto check = [&](int rc) {
      if (rc == MPI_SUCCESS) return;
      dups.release();  // a duplication may be posted: never freed
      throw transport_error(detail::describe(c) + ": " + detail::mpi_error_string(rc));
    };
    // One duplication at a time. With both outstanding, one rank's construction once never
    // completed while its peer's had (1 run in about 20 of the tests); several outstanding
    // idups on one communicator are a known trouble spot of Open MPI's context id agreement
    // (open-mpi/ompi#2025). Sequential duplications cost a few microseconds, once.
    for (int i = 0; i < 2; ++i) {
      check(MPI_Comm_idup(comm, &dups[i], &reqs[i]));
      for (;;) {
        int done = 0;
        check(MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE));
        if (done) break;
        if (d.passed()) {
          dups.release();  // MPI may still write them: never freed
          throw detail::deadline_error(c, others(), "the other ranks did not construct theirs");
        }
        pause(c.started);
      }
    }
    data_ = dups[0];
    notices_ = dups[1];
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(notices_, MPI_ERRORS_RETURN);
    seen_.assign(static_cast<std::size_t>(size_), {});
    last_index_.assign(static_cast<std::size_t>(size_), 0);
    inbox_.resize(static_cast<std::size_t>(size_));
    notice_reqs_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) post_notice_recv(p);
  }

  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  /// On the owning thread, before MPI_Finalize. Every message sent on the communicator must
  /// have been received by then. The duplicates are freed only when nothing can still arrive
  /// on them: Open MPI gives a freed context id to the next communicator, which would then
  /// receive the stragglers as its own. So a healthy communicator first waits (at most
  /// options.shutdown_wait) for its peers' announcements of the last collective; one that
  /// failed, was aborted, or abandoned a collective leaks its duplicates and buffers instead.
  ~mpi_communicator() {
    const bool clean = abandoned_.empty() && !failure_ &&
                       !aborted_.load(std::memory_order_acquire) && announcements_complete();
    for (auto& r : notice_reqs_) cancel_recv(r);
    // Our own announcements complete without us; one still in flight keeps its words (leaked)
    // since MPI may read them until it is delivered.
    for (auto& s : notice_sends_) {
      if (s.req == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&s.req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) continue;
      if (s.req != MPI_REQUEST_NULL) MPI_Request_free(&s.req);
      s.words.release();
    }
    if (clean) {
      MPI_Comm_free(&data_);
      MPI_Comm_free(&notices_);
    } else {
      for (auto& a : abandoned_) a.release();  // MPI may write into them: never freed
    }
  }

  // ---- the communicator concept: collectives, point to point, abort ----

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  capability_flags capabilities() const noexcept {
    capability_flags f;
    f.any_source = true;
    f.detects_lost_peer = false;   // a crashed rank is seen only by the deadline
    f.survives_lost_peer = false;  // Open MPI 4.1 takes the job down with it
    f.device_buffers = false;
    return f;
  }

  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, deadline d = {}) {
    const detail::call_info c = begin("allreduce");
    enter(c);
    const std::size_t bytes = detail::checked_bytes(c, count, t);
    detail::check_buffer(c, buf, bytes);
    detail::check_op(c, op);
    const MPI_Datatype type = mpi_type(c, t);
    check_int_count(c, count, "elements");
    detail::check_deadline(c, d);
    const detail::mpi_notice me{++collectives_, 1, static_cast<std::int64_t>(count),
                                static_cast<std::int64_t>(t), static_cast<std::int64_t>(op), 0};
    announce(c, me);
    if (options_.verify_before_posting) await_announcements(c, d, me, others());
    if (size_ > 1 && bytes >= options_.ring_min_bytes && count >= static_cast<std::size_t>(size_)) {
      ring_allreduce(c, d, static_cast<unsigned char*>(buf), count, t, op);
      await_announcements(c, d, me, others());  // without verify_before_posting: checked after
      return;
    }
    void* data = stage(buf, bytes, true);
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(c, MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), type, mpi_op(op),
                                data_, &req));
    finish_collective(c, d, me, req, others());
    if (data != buf && bytes != 0) std::memcpy(buf, data, bytes);
  }

  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    const detail::call_info c = begin("broadcast");
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, root, "root");
    check_int_count(c, bytes, "bytes");
    detail::check_deadline(c, d);
    const detail::mpi_notice me{++collectives_, 2, static_cast<std::int64_t>(bytes), 0, 0, root};
    announce(c, me);
    if (options_.verify_before_posting && rank_ != root) await_announcements(c, d, me, {root});
    void* data = stage(buf, bytes, rank_ == root);
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(c, MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, data_, &req));
    // Receivers wait for the root; the root, as in MPI_Bcast, for nobody in particular (its
    // call ends when its data is on its way), so a timeout there names every receiver.
    finish_collective(c, d, me, req, rank_ == root ? others() : std::vector<int>{root});
    if (data != buf && rank_ != root && bytes != 0) std::memcpy(buf, data, bytes);
  }

  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    const detail::call_info c = begin("send");
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, dst, "destination");
    detail::check_tag(c, tag);
    check_int_count(c, bytes, "bytes");
    detail::check_deadline(c, d);
    // Open MPI cannot cancel a send: one that fails stays posted and MPI reads its buffer
    // until the receiver takes it. So the bytes go from a buffer the communicator can leak.
    const void* from = bytes ? buf : &dummy_;
    if (options_.bounce_buffers && bytes != 0) {
      if (send_stage_size_ < bytes) {
        send_stage_.reset(new unsigned char[bytes]);
        send_stage_size_ = bytes;
      }
      std::memcpy(send_stage_.get(), buf, bytes);
      from = send_stage_.get();
    }
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(c, MPI_Isend(from, static_cast<int>(bytes), MPI_BYTE, dst, tag, data_, &req));
    MPI_Status status;
    poll_p2p(c, d, req, status, {dst}, "the matching recv was not posted", &send_stage_,
             &send_stage_size_);
  }

  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    return *receive("recv", buf, bytes, src, tag, d, /*poll=*/false);
  }

  /// recv() that treats a deadline with no matching message as "nothing yet": returns
  /// std::nullopt and the communicator stays usable (see try_recv in communicator.hpp). The
  /// receive is posted and cancelled at the deadline; MPI either cancels it or completes it,
  /// never half of it, so a message is never lost between two calls.
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    return receive("try_recv", buf, bytes, src, tag, d, /*poll=*/true);
  }

  /// Any thread; never enters MPI. The owning thread's call in progress (or its next call)
  /// throws; posted requests are cancelled or abandoned there.
  void abort() noexcept { aborted_.store(true, std::memory_order_release); }

  bool failed() const noexcept {
    return failed_.load(std::memory_order_acquire) || aborted_.load(std::memory_order_acquire);
  }

private:
  // Map of this class. Only the owning thread (owner_, checked by enter()) enters MPI; other
  // threads touch only the atomics failed_ and aborted_ (failed() reads them, abort() sets
  // aborted_, which every polling loop checks). The owning thread's state:
  //  - Calls: calls_ (each call's sequence number, from begin()), collectives_ (the index
  //    every announcement carries), failure_ (the first failure: fail() sets it, enter()
  //    rethrows it).
  //  - Two duplicates of the caller's communicator: data_ carries the operations' messages,
  //    notices_ the announcements (tag 0) and the ring's steps (ring_tag).
  //  - Announcements: announce() sends ours (notice_sends_ keeps each until it completes);
  //    per peer, notice_reqs_ is the receive posted into inbox_, drain_notices() moves what
  //    arrived into seen_ (and last_index_), await_announcements(), finish_collective() and
  //    check_agreement() read it; the destructor waits on last_index_ before freeing the
  //    duplicates (announcements_complete()).
  //  - Staging buffers, grown as needed and reused: bounce_ (stage(), for allreduce and
  //    broadcast with bounce_buffers), send_stage_ (send()), ring_scratch_ and ring_out_
  //    (ring_allreduce() and exchange()). An operation given up while MPI may still read or
  //    write its buffer is abandoned: abandon() and abandon_send() move that buffer into
  //    abandoned_, which is never freed.
  // The functions below, in order: calls, the receive and failures; MPI types, staging and
  // pacing; announcements; waiting for a collective; the ring; point-to-point polling,
  // cancelling and abandoning.

  // ---- calls, the receive and failures ----

  detail::call_info begin(const char* op) {
    return {"mpi", op, ++calls_, rank_, size_, deadline::clock::now()};
  }

  std::optional<int> receive(const char* op, void* buf, std::size_t bytes, int src, int tag,
                             const deadline& d, bool poll) {
    const detail::call_info c = begin(op);
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, src, "source", /*allow_any=*/true);
    detail::check_tag(c, tag);
    check_int_count(c, bytes, "bytes");
    if (!poll) detail::check_deadline(c, d);  // try_recv: a passed deadline polls once
    // Posted for exactly `bytes`: a longer message fails with MPI_ERR_TRUNCATE, a shorter one
    // is caught by its count below.
    void* target = buf;
    if (bytes == 0 || buf == nullptr) target = &dummy_;
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(c, MPI_Irecv(target, static_cast<int>(bytes), MPI_BYTE,
                           src == any_source ? MPI_ANY_SOURCE : src, tag, data_, &req));
    MPI_Status status;
    if (!poll_p2p(c, d, req, status, src == any_source ? others() : std::vector<int>{src},
                  "no matching message arrived", nullptr, nullptr, poll))
      return std::nullopt;
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    if (static_cast<std::size_t>(received) != bytes)
      fail(transport_error(detail::describe(c) + ": rank " + std::to_string(status.MPI_SOURCE) +
                           " sent " + std::to_string(received) + " bytes with tag " +
                           std::to_string(tag) + " but rank " + std::to_string(rank_) +
                           " received into " + std::to_string(bytes) + " bytes"));
    return status.MPI_SOURCE;
  }

  // Contract b: after a failure every call rethrows it; after abort() each call says so.
  void enter(const detail::call_info& c) {
    if (std::this_thread::get_id() != owner_)
      detail::bad_argument(c, "called from a thread that does not own the communicator "
                              "(only the constructing thread may call MPI through it)");
    if (failure_) throw *failure_;
    if (aborted_.load(std::memory_order_acquire))
      throw transport_error(detail::describe(c) + ": the communicator was aborted (abort())");
  }

  [[noreturn]] void fail(transport_error e) {
    if (!failure_) failure_ = std::move(e);
    failed_.store(true, std::memory_order_release);
    throw *failure_;
  }

  void check_mpi(const detail::call_info& c, int rc) {
    if (rc != MPI_SUCCESS) fail(transport_error(detail::describe(c) + ": " + detail::mpi_error_string(rc)));
  }

  void check_int_count(const detail::call_info& c, std::size_t n, const char* what) {
    if (n > static_cast<std::size_t>(INT_MAX))
      detail::bad_argument(c, std::to_string(n) + " " + what + " exceed MPI's int count");
  }

  // ---- MPI types, staging and pacing ----

  static MPI_Datatype mpi_type(const detail::call_info& c, dtype t) {
    switch (t) {
      case dtype::f32: return MPI_FLOAT;
      case dtype::f64: return MPI_DOUBLE;
      case dtype::i32: return MPI_INT32_T;
      case dtype::i64: return MPI_INT64_T;
      case dtype::u8: return MPI_UINT8_T;
      case dtype::f16:
      case dtype::bf16: break;
    }
    detail::bad_argument(c, std::string("dtype ") + dtype_name(t) +
                                " has no MPI host type (it is for device backends such as NCCL)");
  }

  static MPI_Op mpi_op(reduce_op op) {
    switch (op) {
      case reduce_op::min: return MPI_MIN;
      case reduce_op::max: return MPI_MAX;
      case reduce_op::sum: break;
    }
    return MPI_SUM;
  }

  std::vector<int> others() const {
    std::vector<int> v;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) v.push_back(p);
    return v;
  }

  // The buffer MPI works on: the caller's, or (bounce_buffers) ours with the caller's bytes.
  void* stage(void* buf, std::size_t bytes, bool copy_in) {
    if (!options_.bounce_buffers) return bytes ? buf : &dummy_;
    if (!bounce_ || bounce_size_ < bytes) {
      bounce_.reset(new unsigned char[bytes ? bytes : 1]);
      bounce_size_ = bytes;
    }
    if (copy_in && bytes != 0) std::memcpy(bounce_.get(), buf, bytes);
    return bounce_.get();
  }

  // Between two polls. Spinning (as MPI's blocking calls do) keeps small operations at MPI's
  // latency; yielding there gives the core away for a whole time slice on a busy machine.
  void pause(deadline::clock::time_point since) const {
    if (deadline::clock::now() - since >= options_.spin_for)
      std::this_thread::sleep_for(options_.poll_sleep);
  }

  // ---- announcements ----
  void post_notice_recv(int p) {
    auto& slot = inbox_[static_cast<std::size_t>(p)];
    MPI_Irecv(slot.data(), detail::mpi_notice_words, MPI_INT64_T, p, 0, notices_,
              &notice_reqs_[static_cast<std::size_t>(p)]);
  }

  void announce(const detail::call_info& c, const detail::mpi_notice& me) {
    // Completed sends are reclaimed first; the notices are small, so MPI sends them eagerly.
    while (!notice_sends_.empty()) {
      int done = 0;
      MPI_Test(&notice_sends_.front().req, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      notice_sends_.pop_front();
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      notice_sends_.push_back({MPI_REQUEST_NULL, std::make_unique<std::array<std::int64_t, 6>>(
                                                     std::array<std::int64_t, 6>{
                                                         me.index, me.kind, me.count, me.type,
                                                         me.op, me.root})});
      check_mpi(c, MPI_Isend(notice_sends_.back().words->data(), detail::mpi_notice_words,
                             MPI_INT64_T, p, 0, notices_, &notice_sends_.back().req));
    }
  }

  // Shutdown: whether every peer's announcement of our last collective has arrived (waiting
  // up to options_.shutdown_wait). Never throws: it runs in the destructor.
  bool announcements_complete() noexcept {
    const auto until = deadline::clock::now() + options_.shutdown_wait;
    for (;;) {
      bool complete = true;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        auto& req = notice_reqs_[static_cast<std::size_t>(p)];
        int done = 0;
        while (req != MPI_REQUEST_NULL && MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
          last_index_[static_cast<std::size_t>(p)] = inbox_[static_cast<std::size_t>(p)][0];
          post_notice_recv(p);
        }
        complete = complete && last_index_[static_cast<std::size_t>(p)] >= collectives_;
      }
      if (complete) return true;
      if (deadline::clock::now() >= until) return false;
      std::this_thread::sleep_for(options_.poll_sleep);
    }
  }

  // Takes in every announcement that has arrived; keeps the last one per peer.
  void drain_notices(const detail::call_info& c) {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      auto& req = notice_reqs_[static_cast<std::size_t>(p)];
      for (;;) {
        int done = 0;
        check_mpi(c, MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (!done) break;
        const auto& w = inbox_[static_cast<std::size_t>(p)];
        seen_[static_cast<std::size_t>(p)].push_back({w[0], w[1], w[2], w[3], w[4], w[5]});
        last_index_[static_cast<std::size_t>(p)] = w[0];
        post_notice_recv(p);
      }
    }
  }

  // Peer p's announcement of collective `index`, if it has come; older ones are dropped.
  const detail::mpi_notice* notice_of(int p, std::int64_t index) {
    auto& q = seen_[static_cast<std::size_t>(p)];
    while (!q.empty() && q.front().index < index) q.pop_front();
    return !q.empty() && q.front().index == index ? &q.front() : nullptr;
  }

  void check_agreement(const detail::call_info& c, const detail::mpi_notice& me) {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto* n = notice_of(p, me.index);
      if (n != nullptr && !(*n == me))
        fail(transport_error(detail::describe(c) + ": arguments differ across ranks in collective #" +
                             std::to_string(me.index) + ": rank " + std::to_string(p) +
                             " called " + n->describe() + ", rank " + std::to_string(rank_) +
                             " called " + me.describe()));
    }
  }

  // Waits until every rank in `peers` has announced collective me.index with the same
  // arguments; names the ones that did not by the deadline.
  void await_announcements(const detail::call_info& c, const deadline& d,
                           const detail::mpi_notice& me, const std::vector<int>& peers) {
    for (;;) {
      drain_notices(c);
      check_agreement(c, me);
      std::vector<int> missing;
      for (int p : peers)
        if (notice_of(p, me.index) == nullptr) missing.push_back(p);
      if (missing.empty()) return;
      if (aborted_.load(std::memory_order_acquire))
        fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort()) " +
                             "while waiting for " + detail::rank_list(missing)));
      if (d.passed()) fail(detail::deadline_error(c, missing, "they never started this collective"));
      pause(c.started);
    }
  }

  // ---- waiting for a collective ----

  // Polls a posted collective to completion, its deadline, an abort or an MPI error, checking
  // the peers' announcements as they come. `awaited`: whose announcement must arrive before
  // the call may return (all peers for an all-reduce; the root for a broadcast receiver).
  void finish_collective(const detail::call_info& c, const deadline& d, const detail::mpi_notice& me,
                         MPI_Request& req, const std::vector<int>& awaited) {
    const bool root_of_broadcast = me.kind == 2 && me.root == rank_;
    bool complete = false;
    std::string mpi_failure;
    for (;;) {
      drain_notices(c);
      if (!complete) {
        int done = 0;
        MPI_Status status;
        const int rc = MPI_Test(&req, &done, &status);
        if (rc != MPI_SUCCESS) {
          // An MPI error; most often the ranks' arguments differed. The announcements say so
          // more clearly, so look there before reporting MPI's words.
          mpi_failure = detail::mpi_error_string(rc);
          abandon(req);
          complete = true;
        } else if (done) {
          complete = true;
        }
      }
      check_agreement(c, me);
      std::vector<int> missing;
      for (int p : (complete ? awaited : others()))
        if (notice_of(p, me.index) == nullptr) missing.push_back(p);
      if (complete && (missing.empty() || root_of_broadcast)) break;
      if (aborted_.load(std::memory_order_acquire)) {
        if (!complete) abandon(req);
        fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort()) " +
                             "while waiting for " + detail::rank_list(missing.empty() ? awaited : missing)));
      }
      if (d.passed()) {
        if (!complete) abandon(req);
        // Who never announced this collective; if all did, the wait was inside MPI (a root's
        // broadcast still delivering), so name whom the call depends on.
        fail(detail::deadline_error(c, missing.empty() ? awaited : missing,
                                    missing.empty() ? "every rank arrived; MPI did not complete"
                                                    : "they never started this collective"));
      }
      pause(c.started);
    }
    if (!mpi_failure.empty())
      fail(transport_error(detail::describe(c) + ": " + mpi_failure));
  }

  // ---- the ring all-reduce ----

  // Ring all-reduce over n ranks: in reduce-scatter step s, rank r sends segment r - s to its
  // right neighbour and adds segment r - s - 1 from its left one; after n - 1 steps it owns
  // segment r + 1 fully reduced, and n - 1 allgather steps pass the reduced segments around.
  // Every rank ends with the same bytes: each segment is reduced once, by one rank, and copied.
  void ring_allreduce(const detail::call_info& c, const deadline& d, unsigned char* buf,
                      std::size_t count, dtype t, reduce_op op) {
    const int n = size_;
    const int right = (rank_ + 1) % n, left = (rank_ + n - 1) % n;
    const std::size_t esize = dtype_size(t);
    auto first = [&](int seg) { return count * static_cast<std::size_t>(seg) / static_cast<std::size_t>(n); };
    auto elems = [&](int seg) { return first(seg + 1) - first(seg); };
    auto at = [&](int seg) { return buf + first(seg) * esize; };
    const std::size_t largest = (count + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n) * esize;
    if (ring_scratch_size_ < largest) {
      ring_scratch_.reset(new unsigned char[largest]);
      ring_scratch_size_ = largest;
    }
    if (options_.bounce_buffers && ring_out_size_ < largest) {
      ring_out_.reset(new unsigned char[largest]);
      ring_out_size_ = largest;
    }
    for (int step = 0; step < n - 1; ++step) {
      const int out = (rank_ - step + n) % n, in = (rank_ - step - 1 + 2 * n) % n;
      exchange(c, d, at(out), elems(out) * esize, ring_scratch_.get(), elems(in) * esize, right, left);
      detail::reduce_into(at(in), ring_scratch_.get(), elems(in), t, op);
    }
    for (int step = 0; step < n - 1; ++step) {
      const int out = (rank_ + 1 - step + n) % n, in = (rank_ - step + n) % n;
      exchange(c, d, at(out), elems(out) * esize, at(in), elems(in) * esize, right, left);
    }
  }

  // One ring step: send to `right` while receiving from `left`, polled against the deadline.
  // On failure the receive is cancelled; the send, which Open MPI cannot cancel, is left to
  // complete from the communicator's copy of the segment (bounce_buffers), which is leaked.
  void exchange(const detail::call_info& c, const deadline& d, const void* out, std::size_t out_bytes,
                void* in, std::size_t in_bytes, int right, int left) {
    if (options_.bounce_buffers) {
      std::memcpy(ring_out_.get(), out, out_bytes);
      out = ring_out_.get();
    }
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    auto give_up = [&](transport_error e) {
      cancel_recv(reqs[0]);
      abandon_send(reqs[1], options_.bounce_buffers ? &ring_out_ : nullptr, &ring_out_size_);
      fail(std::move(e));
    };
    int rc = MPI_Irecv(in, static_cast<int>(in_bytes), MPI_BYTE, left, ring_tag, notices_, &reqs[0]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(out, static_cast<int>(out_bytes), MPI_BYTE, right, ring_tag, notices_, &reqs[1]);
    for (;;) {
      int recv_done = 0, send_done = 0;
      if (rc == MPI_SUCCESS) rc = MPI_Test(&reqs[0], &recv_done, MPI_STATUS_IGNORE);
      if (rc == MPI_SUCCESS) rc = MPI_Test(&reqs[1], &send_done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        give_up(transport_error(detail::describe(c) + ": " + detail::mpi_error_string(rc)));
      if (recv_done && send_done) return;
      std::vector<int> waiting;
      if (!recv_done) waiting.push_back(left);
      if (!send_done && right != left) waiting.push_back(right);
      if (aborted_.load(std::memory_order_acquire))
        give_up(transport_error(detail::describe(c) + ": the communicator was aborted (abort()) " +
                                "while waiting for " + detail::rank_list(waiting)));
      if (d.passed()) give_up(detail::deadline_error(c, waiting, "in the ring all-reduce"));
      pause(c.started);
    }
  }

  // ---- point-to-point polling; cancelling and abandoning ----

  // A collective cannot be cancelled in MPI; its buffer and request are kept forever.
  void abandon(MPI_Request& req) {
    if (req != MPI_REQUEST_NULL) {
      abandoned_.push_back(std::move(bounce_));
      bounce_size_ = 0;
      req = MPI_REQUEST_NULL;  // the handle is dropped; MPI still owns the operation
    }
  }

  // Point to point: polled like a collective. On deadline or abort a receive is cancelled
  // (the wait after a cancelled receive is local, so the caller's buffer is free again); a
  // send, which Open MPI cannot cancel, is abandoned with its staging buffer (`stage`, or
  // the caller's buffer when there is none).
  // With `poll` (receives only), a deadline that passes returns false when the cancel wins,
  // and true when the message arrived first; without it the return value is always true.
  bool poll_p2p(const detail::call_info& c, const deadline& d, MPI_Request& req,
                MPI_Status& status, const std::vector<int>& awaited, const char* note,
                std::unique_ptr<unsigned char[]>* stage, std::size_t* stage_size,
                bool poll = false) {
    const bool is_send = stage_size != nullptr;
    auto stop = [&] {
      if (is_send)
        abandon_send(req, options_.bounce_buffers ? stage : nullptr, stage_size);
      else
        cancel_recv(req);
    };
    for (;;) {
      int done = 0;
      const int rc = MPI_Test(&req, &done, &status);
      if (rc != MPI_SUCCESS) {  // single-completion calls return the request's error
        const int code = rc;
        stop();
        int cls = 0;
        MPI_Error_class(code, &cls);
        fail(transport_error(detail::describe(c) + ": " + detail::mpi_error_string(code) +
                             (cls == MPI_ERR_TRUNCATE ? " (a message longer than the receive "
                                                        "buffer; sizes must match exactly)"
                                                      : "")));
      }
      if (done) return true;
      if (aborted_.load(std::memory_order_acquire)) {
        stop();
        fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort()) " +
                             "while waiting for " + detail::rank_list(awaited)));
      }
      if (d.passed()) {
        if (poll) {
          MPI_Cancel(&req);
          MPI_Wait(&req, &status);
          int cancelled = 0;
          MPI_Test_cancelled(&status, &cancelled);
          if (cancelled) return false;
          return true;  // the message won the race: it is in the buffer
        }
        stop();
        fail(detail::deadline_error(c, awaited, note));
      }
      pause(c.started);
    }
  }

  // Receives only: MPI guarantees that the wait after cancelling a receive returns locally.
  static void cancel_recv(MPI_Request& req) {
    if (req == MPI_REQUEST_NULL) return;
    MPI_Cancel(&req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }

  // Open MPI's MPI_Cancel does not cancel a send, and a wait would last until the receiver
  // takes the message, perhaps forever. An unfinished send is released to complete on its
  // own; the buffer it reads from (`stage`, when the communicator owns it) is leaked, and the
  // duplicates are never freed. Without a stage the caller's buffer is what MPI may still read.
  void abandon_send(MPI_Request& req, std::unique_ptr<unsigned char[]>* stage,
                    std::size_t* stage_size) {
    if (req == MPI_REQUEST_NULL) return;
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) return;
    MPI_Request_free(&req);
    abandoned_.push_back(stage != nullptr ? std::move(*stage) : nullptr);
    if (stage_size != nullptr) *stage_size = 0;
  }

  struct notice_send {
    MPI_Request req;
    std::unique_ptr<std::array<std::int64_t, 6>> words;  // stable while the send is posted
  };

  // ---- state (the map above says who touches what) ----

  mpi_options options_;
  std::thread::id owner_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Comm data_ = MPI_COMM_NULL;     // every operation's traffic
  MPI_Comm notices_ = MPI_COMM_NULL;  // announcements only, so they never match data
  std::uint64_t calls_ = 0;
  std::int64_t collectives_ = 0;
  std::optional<transport_error> failure_;  // owning thread only
  std::atomic<bool> failed_{false};         // mirrors failure_ for failed() on other threads
  std::atomic<bool> aborted_{false};
  static constexpr int ring_tag = 1;  // on notices_, beside the announcements' tag 0
  std::unique_ptr<unsigned char[]> ring_scratch_;  // the incoming segment to reduce
  std::size_t ring_scratch_size_ = 0;
  std::unique_ptr<unsigned char[]> ring_out_;  // the outgoing segment (bounce_buffers)
  std::size_t ring_out_size_ = 0;
  std::unique_ptr<unsigned char[]> send_stage_;  // send()'s copy (bounce_buffers)
  std::size_t send_stage_size_ = 0;
  std::unique_ptr<unsigned char[]> bounce_;
  std::size_t bounce_size_ = 0;
  std::vector<std::unique_ptr<unsigned char[]>> abandoned_;  // buffers of abandoned collectives
  std::vector<MPI_Request> notice_reqs_;                     // per peer: posted announcement recv
  std::vector<std::array<std::int64_t, 6>> inbox_;           // per peer: its buffer
  std::vector<std::deque<detail::mpi_notice>> seen_;         // per peer: announcements not yet used
  std::vector<std::int64_t> last_index_;                     // per peer: latest index announced
  std::deque<notice_send> notice_sends_;
  unsigned char dummy_ = 0;  // MPI wants a valid address even for zero bytes
};

}  // namespace cadence::transport
