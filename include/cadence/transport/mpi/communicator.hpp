// The MPI backend (target cadence::mpi): a communicator over a caller-owned MPI_Comm whose every
// operation is non-blocking MPI driven by a progress engine on the owning thread, so no call can
// hang on a peer and any operation can run in the background (work handles).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <mpi.h>

#include <algorithm>
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
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport {

// ---- mpi_options ----

struct mpi_options {
  /// Broadcasts (MPI_Ibcast) and sends run on a buffer the communicator owns, copied from and
  /// back to the caller's. MPI can cancel neither a collective nor (in Open MPI) a send: when
  /// one fails on its deadline its request stays posted, and if the late peer ever takes part,
  /// MPI reads or writes that buffer. With the copy the buffer is the communicator's, kept
  /// (leaked) for as long as MPI may touch it; without it, the caller must never free or reuse
  /// such a buffer. The all-reduces need no copy: they are our own point-to-point protocols,
  /// whose receives go into the communicator's scratch or are cancelled (see ring_min_bytes).
  bool bounce_buffers = true;
  /// A broadcast receiver posts MPI_Ibcast only once the root has announced the same size (an
  /// MPI collective given mismatched sizes may corrupt memory or crash). The all-reduces check
  /// arguments in their own first messages and need no round of announcements first.
  bool verify_before_posting = true;
  /// All-reduces of at least this many bytes run as a ring (reduce-scatter, then allgather) of
  /// point-to-point messages on the caller's buffer, in pieces of ring_piece_bytes, each piece
  /// forwarded as soon as it is reduced; smaller ones by recursive doubling (log2(n) exchanges
  /// of the whole buffer with a header, through the communicator's scratch), which has the
  /// lower latency. SIZE_MAX turns the ring off.
  std::size_t ring_min_bytes = 256 * 1024;
  /// The ring's pieces: a piece goes on to the right neighbour as soon as it is reduced, while
  /// the next one is still arriving.
  std::size_t ring_piece_bytes = std::size_t{1} << 20;
  /// The largest single MPI message (MPI counts are int): a larger send or receive is one
  /// message of a derived datatype of blocks of this size, and ring pieces never exceed it.
  /// Tests lower it to exercise the arithmetic on small buffers.
  std::size_t max_message_bytes = std::size_t{1} << 30;
  /// Polling: the first waits spin on MPI_Test (latency); a call still waiting after this long
  /// sleeps `poll_sleep` between tests so a stalled job does not burn its cores.
  std::chrono::microseconds spin_for{200000};
  std::chrono::microseconds poll_sleep{50};
  /// How long the destructor waits for the peers' last announcements before it gives up and
  /// leaks the duplicated communicators rather than free them with messages in flight.
  std::chrono::milliseconds shutdown_wait{2000};
};

// ---- detail: announcements, message layouts, MPI's error text ----

namespace detail {

// A collective's index and arguments: sent ahead to the peers (an announcement, so a rank whose
// deadline passes names the peers that never started it, which MPI cannot say) and carried at
// the head of the small all-reduce's messages (so a partner's arguments are checked before its
// data is used).
struct mpi_notice {
  std::int64_t index = 0;  // 1-based collective index
  std::int64_t kind = 0;   // 1 allreduce, 2 broadcast, 3 allreduce_average
  std::int64_t count = 0;  // elements (allreduce) or bytes (broadcast)
  std::int64_t type = 0;   // dtype
  std::int64_t op = 0;     // reduce_op
  std::int64_t root = 0;
  bool operator==(const mpi_notice& o) const {
    return index == o.index && kind == o.kind && count == o.count && type == o.type &&
           op == o.op && root == o.root;
  }
  std::string describe() const {
    if (kind == 3) return signature_average(static_cast<std::size_t>(count), static_cast<dtype>(type));
    return kind == 1 ? signature("allreduce", static_cast<std::size_t>(count),
                                 static_cast<dtype>(type), static_cast<reduce_op>(op))
                     : signature("broadcast", static_cast<std::size_t>(count), static_cast<int>(root));
  }
};
inline constexpr int mpi_notice_words = 6;
inline constexpr std::size_t mpi_header_bytes = sizeof(std::int64_t) * mpi_notice_words;

/// How `bytes` travel as one MPI message when MPI's int count cannot hold them: `blocks` blocks
/// of `block` bytes (a contiguous datatype) followed by `rest` bytes. For bytes <= limit:
/// blocks == 0 and rest == bytes (plain MPI_BYTE).
struct mpi_layout {
  std::size_t block = 0;
  std::size_t blocks = 0;
  std::size_t rest = 0;
  bool plain() const noexcept { return blocks == 0; }
};
/// limit in [1, INT_MAX]; throws std::length_error when even the blocks overflow int.
inline mpi_layout mpi_layout_of(std::size_t bytes, std::size_t limit) {
  if (bytes <= limit) return {limit, 0, bytes};
  const mpi_layout l{limit, bytes / limit, bytes % limit};
  if (l.blocks > static_cast<std::size_t>(INT_MAX))
    throw std::length_error("cadence: " + std::to_string(bytes) + " bytes need more than INT_MAX blocks of " +
                            std::to_string(limit));
  return l;
}

/// Recursive doubling over n ranks: p, the largest power of two <= n, ranks take part; the
/// n - p others (the even ranks below 2(n - p)) hand their data to the odd rank above them
/// first and take the result back last (MPICH's scheme).
struct mpi_doubling {
  int n = 1, p = 1, extra = 0;
  explicit mpi_doubling(int size) : n(size) {
    while (p * 2 <= n) p *= 2;
    extra = n - p;
  }
  /// The rank's index among the p, or -1 for a rank that only hands its data over.
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

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

}  // namespace detail

class mpi_communicator;

// ---- mpi_work: the work handle ----

/// A started MPI operation (iallreduce, iallreduce_average, ibroadcast, isend, irecv): models the
/// work handle of communicator.hpp. Only the communicator's owning thread may use it, and only
/// while the communicator lives (a handle of a destroyed communicator throws, or returns true
/// from cancel()). test() and wait() drive the communicator's whole progress engine, so any
/// handle moves every operation in flight. cancel() withdraws a receive; a send or a collective
/// cannot be withdrawn (MPI cannot cancel a send in Open MPI, and the peers need our part of a
/// collective): cancel() returns false and the operation goes on in the background, driven by
/// later calls, so its buffer must stay valid.
class mpi_work {
public:
  mpi_work() = default;
  mpi_work(mpi_work&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)), op_(std::move(o.op_)) {}
  mpi_work& operator=(mpi_work&& o) noexcept {
    if (this != &o) {
      cancel();
      comm_ = std::exchange(o.comm_, nullptr);
      op_ = std::move(o.op_);
    }
    return *this;
  }
  mpi_work(const mpi_work&) = delete;
  mpi_work& operator=(const mpi_work&) = delete;
  ~mpi_work() { cancel(); }

  inline bool test();
  inline void wait(deadline d = {});
  /// Progresses until the operation completes or `t` comes (beyond the concept): true once it
  /// completed; false at `t`, which, unlike wait()'s deadline, is no failure. For a caller
  /// whose thread is otherwise idle (its accelerator computes).
  inline bool wait_until(deadline::clock::time_point t);
  inline int source() const noexcept;
  inline bool cancel() noexcept;

private:
  friend class mpi_communicator;
  mpi_work(mpi_communicator* c, std::shared_ptr<void> op) : comm_(c), op_(std::move(op)) {}
  mpi_communicator* comm_ = nullptr;
  std::shared_ptr<void> op_;  // mpi_communicator::operation
};

// ---- mpi_communicator ----

/// Models transport::communicator over MPI, with try_recv, the asynchronous operations and the
/// averaging all-reduce. Construction is collective over `comm` (it duplicates it, so our
/// traffic never matches the caller's); `comm` stays the caller's and must outlive this object.
/// Only the thread that constructed it may call it, or use its work handles (MPI needs at least
/// MPI_THREAD_FUNNELED, or MPI_THREAD_SERIALIZED when that thread is not the main one), except
/// abort() and failed(), which any thread may call: abort() only raises a flag that the owning
/// thread's polling sees, so MPI is never entered from two threads.
///
/// Progress: every operation is non-blocking MPI plus our own protocol steps (the all-reduces
/// are point-to-point protocols: their reductions run on the owning thread). They advance only
/// when the owning thread is inside the communicator: in any call, in a handle's test() or
/// wait(). An asynchronous all-reduce overlaps computation as far as the caller polls (the
/// bucketed all-reducer polls in every mark_ready()). Collectives run one after the other in
/// issue order; point-to-point operations run beside them.
///
/// What it survives (Open MPI 4.1): a stalled rank is detected by the deadline and named, and
/// the survivors' communicators fail cleanly; they may go on over a new communicator that
/// excludes it (MPI_Comm_create_group involves only the survivors). A crashed rank is not
/// survivable: Open MPI's runtime kills the whole job (capabilities().survives_lost_peer is
/// false), and before it does, only the deadline sees the loss.
///
/// After a failed all-reduce Open MPI may still read (never write: receives are cancelled) the
/// caller's buffer, until the process ends, for the ring's sends it cannot withdraw: collectives
/// are fail-stop, so keep the buffer allocated for the rest of the job.
///
/// Neither copyable nor movable (MPI and the handles hold pointers into it): hold it in a
/// std::unique_ptr to hand it around. Destroy it before its handles are used again.
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
    if (options_.max_message_bytes == 0 || options_.max_message_bytes > static_cast<std::size_t>(INT_MAX))
      throw invalid_parameter_error("cadence::transport::mpi_communicator: max_message_bytes " +
                                    std::to_string(options_.max_message_bytes) + " is not in [1, INT_MAX]");
    if (options_.ring_piece_bytes == 0)
      throw invalid_parameter_error("cadence::transport::mpi_communicator: ring_piece_bytes must be > 0");
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
    last_announced_.assign(static_cast<std::size_t>(size_), 0);
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
  /// failed, was aborted, had operations in flight or abandoned one leaks its duplicates and
  /// buffers instead. Handles still held become orphans: they throw, or cancel() returns true.
  ~mpi_communicator() {
    const bool idle = ops_.empty();
    for (auto& o : ops_) {
      if (!o->finished()) abandon(*o);
      o->orphan = true;
    }
    ops_.clear();
    const bool clean = idle && abandoned_.empty() && !dirty_ && !failure_ &&
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
      for (auto& a : abandoned_) a.release();  // MPI may read or write them: never freed
      small_.release();
      scratch_[0].release();
      scratch_[1].release();
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
    finish(start_allreduce("allreduce", buf, count, t, op, false, &d), d);
  }
  /// The mean over ranks, in place (f32, f64): divided in the ring's last reduce step or the
  /// small path's copy out (communicator.hpp, "averaging all-reduce").
  void allreduce_average(void* buf, std::size_t count, dtype t, deadline d = {}) {
    finish(start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, &d), d);
  }
  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    finish(start_broadcast(buf, bytes, root, &d), d);
  }
  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    finish(start_send(buf, bytes, dst, tag, &d), d);
  }
  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto o = start_recv("recv", buf, bytes, src, tag, &d);
    finish(o, d);
    return o->source;
  }

  /// recv() that treats a deadline with no matching message as "nothing yet": returns
  /// std::nullopt and the communicator stays usable (see try_recv in communicator.hpp). The
  /// receive is posted and cancelled at the deadline; MPI either cancels it or completes it,
  /// never half of it, so a message is never lost between two calls.
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto o = start_recv("try_recv", buf, bytes, src, tag, nullptr);  // a passed deadline polls once
    if (!wait_op(*o, d, /*poll=*/true)) return std::nullopt;
    return o->source;
  }

  /// The asynchronous forms (communicator.hpp): they start the operation and return at once.
  mpi_work iallreduce(void* buf, std::size_t count, dtype t, reduce_op op) {
    return mpi_work(this, start_allreduce("allreduce", buf, count, t, op, false, nullptr));
  }
  mpi_work iallreduce_average(void* buf, std::size_t count, dtype t) {
    return mpi_work(this, start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, nullptr));
  }
  mpi_work ibroadcast(void* buf, std::size_t bytes, int root) {
    return mpi_work(this, start_broadcast(buf, bytes, root, nullptr));
  }
  mpi_work isend(const void* buf, std::size_t bytes, int dst, int tag) {
    return mpi_work(this, start_send(buf, bytes, dst, tag, nullptr));
  }
  mpi_work irecv(void* buf, std::size_t bytes, int src, int tag) {
    return mpi_work(this, start_recv("recv", buf, bytes, src, tag, nullptr));
  }

  /// Any thread; never enters MPI. The owning thread's call in progress (or its next call)
  /// throws; posted requests are cancelled or abandoned there.
  void abort() noexcept { aborted_.store(true, std::memory_order_release); }

  bool failed() const noexcept {
    return failed_.load(std::memory_order_acquire) || aborted_.load(std::memory_order_acquire);
  }

private:
  friend class mpi_work;

  // Map of this class. Only the owning thread (owner_, checked by enter()) enters MPI; other
  // threads touch only the atomics failed_ and aborted_ (failed() reads them, abort() sets
  // aborted_, which every wait checks). The owning thread's state:
  //  - Calls: calls_ (each call's sequence number, from begin()), collectives_ (the index every
  //    announcement carries), failure_ (the first failure: fail() sets it, enter() rethrows it).
  //  - Operations in flight: ops_, in issue order, each an `op` (its state machine); handles
  //    share them. progress() advances them all: point-to-point ones independently, the
  //    collectives one at a time, in order (activate() starts the next).
  //  - Two duplicates of the caller's communicator: data_ carries point-to-point messages and
  //    broadcasts, notices_ the announcements (notice_tag), the small all-reduce (small_tag) and
  //    the ring (ring_tag).
  //  - Announcements: announce() sends ours (notice_sends_ keeps each until it completes); per
  //    peer, notice_reqs_ is the receive posted into inbox_, drain_notices() moves what arrived
  //    into seen_ (by index; the small all-reduce's headers go there too) and last_announced_;
  //    the destructor waits on last_announced_ (announcements_complete()).
  //  - Scratch, grown as needed and reused by one collective at a time: small_ (the small
  //    all-reduce's accumulator and incoming message), scratch_ (the ring's incoming pieces,
  //    alternating by step). Buffers MPI may still touch after a failure go to abandoned_,
  //    never freed.
  // The functions below, in order: the operation and its states; starting; progress and
  // waiting; failures; MPI types and pacing; announcements; the small all-reduce; the ring;
  // broadcast and point to point; cancelling and abandoning.

  // ---- one operation ----

  struct operation {
    enum class kind : unsigned char { send, recv, allreduce, broadcast };
    kind what = kind::send;
    detail::call_info c{};
    bool active = false;     // collectives: started in MPI (the ones before it are done)
    bool done = false;
    bool cancelled = false;  // a receive withdrawn before it matched
    bool orphan = false;     // its communicator was destroyed
    bool failed = false;     // the communicator failed while it was in flight
    int source = -1;         // recv: the sender, once done
    int peer = -1;           // send: destination; recv: source as asked; broadcast: root
    int tag = 0;
    void* buf = nullptr;
    const void* cbuf = nullptr;
    std::size_t bytes = 0, count = 0;
    dtype type = dtype::u8;
    reduce_op rop = reduce_op::sum;
    bool average = false;
    detail::mpi_notice notice{};
    MPI_Request req = MPI_REQUEST_NULL;     // point to point, broadcast
    MPI_Datatype layout = MPI_DATATYPE_NULL;  // a derived type for a message above the limit
    std::unique_ptr<unsigned char[]> stage;   // bounce copy (send, broadcast)
    // The small all-reduce (recursive doubling): its phase and round.
    int phase = 0, round = 0;
    MPI_Request sreq = MPI_REQUEST_NULL;
    // The ring: the step and piece being received, and the sends in flight per step.
    int step = 0;
    std::size_t piece = 0;
    std::vector<MPI_Request> rreqs;              // the current step's piece receives
    std::vector<std::vector<MPI_Request>> sends;  // per step
    bool ring = false;
    bool posted = false;  // the current step's receives are posted
    std::string note;     // what a deadline error adds
    bool finished() const noexcept { return done || cancelled || failed; }
  };
  using op_ptr = std::shared_ptr<operation>;

  static constexpr int notice_tag = 0;
  static constexpr int ring_tag = 1;
  static constexpr int small_tag = 2;

  // ---- starting an operation ----

  detail::call_info begin(const char* name) {
    return {"mpi", name, ++calls_, rank_, size_, deadline::clock::now()};
  }

  op_ptr make(operation::kind what, const detail::call_info& c) {
    auto o = std::make_shared<operation>();
    o->what = what;
    o->c = c;
    return o;
  }

  op_ptr start_allreduce(const char* name, void* buf, std::size_t count, dtype t, reduce_op r,
                         bool average, const deadline* d) {
    const detail::call_info c = begin(name);
    enter(c);
    const std::size_t bytes = detail::checked_bytes(c, count, t);
    detail::check_buffer(c, buf, bytes);
    detail::check_op(c, r);
    (void)mpi_type(c, t);
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
    o->notice = {++collectives_, average ? 3 : 1, static_cast<std::int64_t>(count),
                 static_cast<std::int64_t>(t), static_cast<std::int64_t>(r), 0};
    o->ring = size_ > 1 && bytes >= options_.ring_min_bytes && count >= static_cast<std::size_t>(size_);
    // The two-rank small all-reduce needs no announcement: its one message carries the notice.
    if (o->ring || size_ > 2) announce(c, o->notice);
    enqueue(o);
    return o;
  }

  op_ptr start_broadcast(void* buf, std::size_t bytes, int root, const deadline* d) {
    const detail::call_info c = begin("broadcast");
    enter(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, root, "root");
    check_int_count(c, bytes, "bytes");
    if (d) detail::check_deadline(c, *d);
    auto o = make(operation::kind::broadcast, c);
    o->buf = buf;
    o->bytes = bytes;
    o->peer = root;
    o->notice = {++collectives_, 2, static_cast<std::int64_t>(bytes), 0, 0, root};
    announce(c, o->notice);
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
    auto o = make(operation::kind::send, c);
    o->cbuf = buf;
    o->bytes = bytes;
    o->peer = dst;
    o->tag = tag;
    o->note = "the matching recv was not posted";
    // Open MPI cannot cancel a send: one that fails stays posted and MPI reads its buffer
    // until the receiver takes it. So the bytes go from a buffer the communicator can leak.
    const void* from = bytes ? buf : &dummy_;
    if (options_.bounce_buffers && bytes != 0) {
      o->stage.reset(new unsigned char[bytes]);
      std::memcpy(o->stage.get(), buf, bytes);
      from = o->stage.get();
    }
    int n = 0;
    const MPI_Datatype type = message_type(c, bytes, o->layout, n);
    check_mpi(c, MPI_Isend(from, n, type, dst, tag, data_, &o->req));
    o->active = true;
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
    auto o = make(operation::kind::recv, c);
    o->buf = buf;
    o->bytes = bytes;
    o->peer = src;
    o->tag = tag;
    o->note = "no matching message arrived";
    // Posted for exactly `bytes`: a longer message fails with MPI_ERR_TRUNCATE, a shorter one
    // is caught by its count at completion.
    void* target = (bytes == 0 || buf == nullptr) ? static_cast<void*>(&dummy_) : buf;
    int n = 0;
    const MPI_Datatype type = message_type(c, bytes, o->layout, n);
    check_mpi(c, MPI_Irecv(target, n, type, src == any_source ? MPI_ANY_SOURCE : src, tag, data_, &o->req));
    o->active = true;
    enqueue(o);
    return o;
  }

  void enqueue(const op_ptr& o) {
    ops_.push_back(o);
    progress();  // every call moves what is in flight
  }

  // ---- progress and waiting ----

  // Advances every operation in flight as far as it goes without blocking, in issue order;
  // collectives one at a time. Throws (failing the communicator) on an error.
  void progress() {
    drain_notices();
    bool collective_busy = false;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      operation& o = *ops_[i];
      if (o.finished()) continue;
      if (o.what == operation::kind::send || o.what == operation::kind::recv) {
        progress_p2p(o);
        continue;
      }
      if (collective_busy) continue;
      if (!o.active) activate(o);
      progress_collective(o);
      if (!o.done) collective_busy = true;
    }
    while (!ops_.empty() && ops_.front()->finished()) ops_.pop_front();
  }

  // Until `o` completes, the deadline passes or the communicator is aborted. With `poll` (a
  // receive only): at the deadline the receive is withdrawn if it can be, and false returned.
  // With `timed` (a handle's wait_until): at the deadline it returns false, no failure.
  bool wait_op(operation& o, const deadline& d, bool poll = false, bool timed = false) {
    const auto since = deadline::clock::now();
    for (;;) {
      if (o.orphan) throw transport_error(detail::describe(o.c) + ": its communicator was destroyed");
      if (failure_ && !o.done) throw *failure_;
      progress();
      if (o.done) return true;
      if (o.cancelled) return false;
      if (aborted_.load(std::memory_order_acquire))
        fail(transport_error(detail::describe(o.c) + ": the communicator was aborted (abort()) " +
                             "while waiting for " + detail::rank_list(awaited(o))));
      const bool passed = d.passed();  // once: the two uses below must agree
      if (timed && passed) return false;
      if (passed) {
        if (poll && o.what == operation::kind::recv) {
          if (withdraw(o)) return false;
          continue;  // the message won the race: the next progress completes it
        }
        fail(detail::deadline_error(o.c, awaited(o), note_of(o)));
      }
      if (timed)
        std::this_thread::yield();  // an idle caller: the peers' processes may need the core
      else
        pause(since);
    }
  }

  // A blocking call: the operation started at once, waited at once.
  void finish(const op_ptr& o, const deadline& d) { wait_op(*o, d); }

  // Whom an unfinished operation waits for, for errors: the peers that never announced its
  // collective, else the peers its protocol step waits on.
  std::vector<int> awaited(const operation& o) {
    if (o.what == operation::kind::send || o.what == operation::kind::recv)
      return o.peer == any_source ? others() : std::vector<int>{o.peer};
    std::vector<int> missing;
    const bool root_of_broadcast = o.what == operation::kind::broadcast && o.peer == rank_;
    for (int p : others())
      if (notice_of(p, o.notice.index) == nullptr) missing.push_back(p);
    if (!missing.empty()) return missing;
    if (o.what == operation::kind::broadcast) return root_of_broadcast ? others() : std::vector<int>{o.peer};
    if (!o.active) return others();
    if (o.ring) return {(rank_ + size_ - 1) % size_};
    const int partner = small_partner(o);
    return partner >= 0 ? std::vector<int>{partner} : others();
  }

  std::string note_of(const operation& o) {
    if (o.what == operation::kind::send || o.what == operation::kind::recv) return o.note;
    bool missing = false;
    for (int p : others()) missing = missing || notice_of(p, o.notice.index) == nullptr;
    const std::string never = "they never started this collective";
    if (o.ring) return missing ? never + "; in the ring all-reduce" : "in the ring all-reduce";
    if (missing) return never;
    if (o.what == operation::kind::broadcast) return "every rank arrived; MPI did not complete";
    return "in the all-reduce's exchanges";
  }

  // ---- failures ----

  // Contract b: after a failure every call rethrows it; after abort() each call says so.
  void enter(const detail::call_info& c) {
    if (std::this_thread::get_id() != owner_)
      detail::bad_argument(c, "called from a thread that does not own the communicator "
                              "(only the constructing thread may call MPI through it)");
    if (failure_) throw *failure_;
    if (aborted_.load(std::memory_order_acquire))
      throw transport_error(detail::describe(c) + ": the communicator was aborted (abort())");
  }

  // The first failure sticks; every operation in flight is withdrawn (receives) or abandoned
  // (sends, collectives: their buffers are leaked) and fails with it.
  [[noreturn]] void fail(transport_error e) {
    if (!failure_) failure_ = std::move(e);
    failed_.store(true, std::memory_order_release);
    for (auto& o : ops_) {
      if (o->finished()) continue;
      abandon(*o);
      o->failed = true;
    }
    ops_.clear();
    throw *failure_;
  }

  void check_mpi(const detail::call_info& c, int rc) {
    if (rc != MPI_SUCCESS) fail(transport_error(detail::describe(c) + ": " + detail::mpi_error_string(rc)));
  }

  void check_int_count(const detail::call_info& c, std::size_t n, const char* what) {
    if (n > static_cast<std::size_t>(INT_MAX))
      detail::bad_argument(c, std::to_string(n) + " " + what + " exceed MPI's int count");
  }

  // ---- MPI types, message layouts and pacing ----

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

  // The datatype and count one message of `bytes` travels as: MPI_BYTE up to the limit, else a
  // derived type (blocks of max_message_bytes, then the rest), created into `made` (the op frees
  // it when it completes).
  MPI_Datatype message_type(const detail::call_info& c, std::size_t bytes, MPI_Datatype& made, int& n) {
    detail::mpi_layout l;
    try {
      l = detail::mpi_layout_of(bytes, options_.max_message_bytes);
    } catch (const std::length_error& e) {
      detail::bad_argument(c, e.what());
    }
    if (l.plain()) {
      n = static_cast<int>(l.rest);
      return MPI_BYTE;
    }
    MPI_Datatype block = MPI_DATATYPE_NULL, blocks = MPI_DATATYPE_NULL;
    check_mpi(c, MPI_Type_contiguous(static_cast<int>(l.block), MPI_BYTE, &block));
    check_mpi(c, MPI_Type_contiguous(static_cast<int>(l.blocks), block, &blocks));
    int lengths[2] = {1, static_cast<int>(l.rest)};
    MPI_Aint offsets[2] = {0, static_cast<MPI_Aint>(l.blocks * l.block)};
    MPI_Datatype types[2] = {blocks, MPI_BYTE};
    check_mpi(c, MPI_Type_create_struct(l.rest != 0 ? 2 : 1, lengths, offsets, types, &made));
    check_mpi(c, MPI_Type_commit(&made));
    MPI_Type_free(&block);
    MPI_Type_free(&blocks);
    n = 1;
    return made;
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

  // Between two polls. Spinning (as MPI's blocking calls do) keeps small operations at MPI's
  // latency; yielding there gives the core away for a whole time slice on a busy machine.
  void pause(deadline::clock::time_point since) const {
    if (deadline::clock::now() - since >= options_.spin_for)
      std::this_thread::sleep_for(options_.poll_sleep);
  }

  // Grows an owned buffer to at least `bytes` (its old contents are not kept).
  static unsigned char* grow(std::unique_ptr<unsigned char[]>& b, std::size_t& size, std::size_t bytes) {
    if (!b || size < bytes) {
      b.reset(new unsigned char[std::max<std::size_t>(bytes, 1)]);
      size = bytes;
    }
    return b.get();
  }

  // ---- announcements ----

  void post_notice_recv(int p) {
    auto& slot = inbox_[static_cast<std::size_t>(p)];
    MPI_Irecv(slot.data(), detail::mpi_notice_words, MPI_INT64_T, p, notice_tag, notices_,
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
                             MPI_INT64_T, p, notice_tag, notices_, &notice_sends_.back().req));
    }
  }

  // Takes in every announcement that has arrived.
  void drain_notices() {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      auto& req = notice_reqs_[static_cast<std::size_t>(p)];
      for (;;) {
        int done = 0;
        if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
        const auto& w = inbox_[static_cast<std::size_t>(p)];
        remember(p, {w[0], w[1], w[2], w[3], w[4], w[5]});
        last_announced_[static_cast<std::size_t>(p)] = w[0];
        post_notice_recv(p);
      }
    }
  }

  // Peer p's notice of a collective (announced, or at the head of its message), kept by index.
  void remember(int p, const detail::mpi_notice& n) {
    auto& q = seen_[static_cast<std::size_t>(p)];
    auto it = q.end();
    while (it != q.begin() && std::prev(it)->index > n.index) --it;
    if (it != q.begin() && std::prev(it)->index == n.index) return;
    q.insert(it, n);
  }

  // Peer p's notice of collective `index`, if it has come; older ones are dropped.
  const detail::mpi_notice* notice_of(int p, std::int64_t index) {
    auto& q = seen_[static_cast<std::size_t>(p)];
    while (!q.empty() && q.front().index < index) q.pop_front();
    return !q.empty() && q.front().index == index ? &q.front() : nullptr;
  }

  [[noreturn]] void mismatch(const operation& o, int p, const detail::mpi_notice& theirs) {
    fail(transport_error(detail::describe(o.c) + ": arguments differ across ranks in collective #" +
                         std::to_string(o.notice.index) + ": rank " + std::to_string(p) + " called " +
                         theirs.describe() + ", rank " + std::to_string(rank_) + " called " +
                         o.notice.describe()));
  }

  // Every notice of o's collective that has arrived must equal ours.
  void check_agreement(const operation& o) {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto* n = notice_of(p, o.notice.index);
      if (n != nullptr && !(*n == o.notice)) mismatch(o, p, *n);
    }
  }

  bool all_announced(const operation& o) {
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && notice_of(p, o.notice.index) == nullptr) return false;
    return true;
  }

  // Shutdown: whether every peer's announcement of our last collective has arrived (waiting
  // up to options_.shutdown_wait). Never throws: it runs in the destructor.
  bool announcements_complete() noexcept {
    if (!last_expects_announcements_) return true;  // the last was a two-rank small all-reduce
    const auto until = deadline::clock::now() + options_.shutdown_wait;
    for (;;) {
      bool complete = true;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        auto& req = notice_reqs_[static_cast<std::size_t>(p)];
        int done = 0;
        while (req != MPI_REQUEST_NULL && MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
          last_announced_[static_cast<std::size_t>(p)] = inbox_[static_cast<std::size_t>(p)][0];
          post_notice_recv(p);
        }
        complete = complete && last_announced_[static_cast<std::size_t>(p)] >= last_announced_index_;
      }
      if (complete) return true;
      if (deadline::clock::now() >= until) return false;
      std::this_thread::sleep_for(options_.poll_sleep);
    }
  }

  // ---- collectives: activation and dispatch ----

  // The collective before this one is done: it starts in MPI.
  void activate(operation& o) {
    o.active = true;
    last_expects_announcements_ = o.ring || size_ > 2 || o.what == operation::kind::broadcast;
    if (last_expects_announcements_) last_announced_index_ = o.notice.index;
    if (o.what == operation::kind::broadcast) return;  // posted by progress_broadcast (after verify)
    if (size_ == 1) return;
    if (o.ring)
      start_ring(o);
    else
      start_small(o);
  }

  void progress_collective(operation& o) {
    if (o.what == operation::kind::broadcast) {
      progress_broadcast(o);
      return;
    }
    if (size_ == 1) {
      if (o.average) detail::divide_into(o.buf, o.buf, o.count, o.type, 1.0);
      o.done = true;
      return;
    }
    if (o.ring)
      progress_ring(o);
    else
      progress_small(o);
  }

  // ---- the small all-reduce: recursive doubling with the notice at each message's head ----
  //
  // small_ holds [our notice | the accumulator] followed by [the incoming notice | data]. Every
  // pair combines the same two values (sum, min and max commute exactly), so every rank ends
  // with the same bits. Phases: 0 hand over (a rank outside the p), 1 take over (its partner),
  // 2 the rounds, 3 hand back / take back, then the copy out.

  std::size_t small_capacity(const operation& o) const {
    return std::max(o.bytes, std::min<std::size_t>(options_.ring_min_bytes, std::size_t{1} << 20));
  }
  unsigned char* small_acc() { return small_.get(); }
  unsigned char* small_in(const operation& o) { return small_.get() + detail::mpi_header_bytes + small_capacity(o); }

  int small_partner(const operation& o) const {
    const detail::mpi_doubling g(size_);
    const int in = g.inner(rank_);
    switch (o.phase) {
      case 0: return rank_ + 1;  // hand over, then take the result back from the same rank
      case 1: return rank_ - 1;
      case 2: return g.outer(in ^ (1 << o.round));
      case 3: return in < 0 ? rank_ + 1 : rank_ - 1;
      default: return -1;
    }
  }

  void start_small(operation& o) {
    const std::size_t cap = small_capacity(o);
    grow(small_, small_size_, 2 * (detail::mpi_header_bytes + cap));
    std::int64_t words[detail::mpi_notice_words] = {o.notice.index, o.notice.kind, o.notice.count,
                                                    o.notice.type, o.notice.op, o.notice.root};
    std::memcpy(small_acc(), words, sizeof words);
    if (o.bytes != 0) std::memcpy(small_acc() + detail::mpi_header_bytes, o.buf, o.bytes);
    const detail::mpi_doubling g(size_);
    const int in = g.inner(rank_);
    if (in < 0) {
      o.phase = 0;  // hand over to rank + 1, then take the result back from it
      post_small_send(o, rank_ + 1);
      post_small_recv(o, rank_ + 1);
    } else if (rank_ < 2 * g.extra) {
      o.phase = 1;  // take over rank - 1's data
      post_small_recv(o, rank_ - 1);
    } else {
      begin_rounds(o);
    }
  }

  void post_small_send(operation& o, int to) {
    check_mpi(o.c, MPI_Isend(small_acc(), static_cast<int>(detail::mpi_header_bytes + o.bytes), MPI_BYTE, to,
                             small_tag, notices_, &o.sreq));
  }
  void post_small_recv(operation& o, int from) {
    check_mpi(o.c, MPI_Irecv(small_in(o), static_cast<int>(detail::mpi_header_bytes + small_capacity(o)),
                             MPI_BYTE, from, small_tag, notices_, &o.req));
  }

  void begin_rounds(operation& o) {
    const detail::mpi_doubling g(size_);
    o.phase = 2;
    o.round = 0;
    if (g.rounds() == 0) {
      end_rounds(o);
      return;
    }
    const int partner = g.outer(g.inner(rank_) ^ 1);
    post_small_recv(o, partner);
    post_small_send(o, partner);
  }

  void end_rounds(operation& o) {
    const detail::mpi_doubling g(size_);
    if (rank_ < 2 * g.extra) {  // hand the result back to rank - 1
      o.phase = 3;
      post_small_send(o, rank_ - 1);
    } else {
      o.phase = 4;
    }
  }

  // The incoming message: checked (size, notice), then `reduce` folds its data into ours.
  // False while it has not arrived.
  bool take_small(operation& o, int from, bool reduce) {
    int done = 0;
    MPI_Status status;
    const int rc = MPI_Test(&o.req, &done, &status);
    if (rc != MPI_SUCCESS) {
      int cls = 0;
      MPI_Error_class(rc, &cls);
      if (cls == MPI_ERR_TRUNCATE)
        fail(transport_error(detail::describe(o.c) + ": rank " + std::to_string(from) +
                             " sent a longer message in collective #" + std::to_string(o.notice.index) +
                             " than " + o.notice.describe() + " on rank " + std::to_string(rank_) +
                             " takes: the ranks' arguments differ"));
      fail(transport_error(detail::describe(o.c) + ": " + detail::mpi_error_string(rc)));
    }
    if (!done) return false;
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    const unsigned char* in = small_in(o);
    detail::mpi_notice theirs;
    if (static_cast<std::size_t>(got) >= detail::mpi_header_bytes) {
      std::int64_t w[detail::mpi_notice_words];
      std::memcpy(w, in, sizeof w);
      theirs = {w[0], w[1], w[2], w[3], w[4], w[5]};
      remember(from, theirs);
    }
    if (!(theirs == o.notice) || static_cast<std::size_t>(got) != detail::mpi_header_bytes + o.bytes) mismatch(o, from, theirs);
    if (reduce && o.bytes != 0)
      detail::reduce_into(small_acc() + detail::mpi_header_bytes, in + detail::mpi_header_bytes, o.count, o.type, o.rop);
    else if (!reduce && o.bytes != 0)
      std::memcpy(small_acc() + detail::mpi_header_bytes, in + detail::mpi_header_bytes, o.bytes);
    return true;
  }

  bool sent(operation& o) {
    if (o.sreq == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(o.c, MPI_Test(&o.sreq, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }

  void progress_small(operation& o) {
    check_agreement(o);
    const detail::mpi_doubling g(size_);
    for (;;) {
      switch (o.phase) {
        case 0:  // handed over; the result comes back (into the accumulator, once it is sent)
          if (!sent(o)) return;
          if (!take_small(o, rank_ + 1, false)) return;
          o.phase = 5;
          break;
        case 1:
          if (!take_small(o, rank_ - 1, true)) return;
          begin_rounds(o);
          break;
        case 2: {
          const int partner = g.outer(g.inner(rank_) ^ (1 << o.round));
          if (!sent(o)) return;  // the accumulator is read until the send completes
          if (!take_small(o, partner, true)) return;
          if (++o.round < g.rounds()) {
            const int next = g.outer(g.inner(rank_) ^ (1 << o.round));
            post_small_recv(o, next);
            post_small_send(o, next);
          } else {
            end_rounds(o);
          }
          break;
        }
        case 3:  // handing the result back
          if (!sent(o)) return;
          o.phase = 5;
          break;
        case 4:
          o.phase = 5;
          break;
        case 5: {
          if (!sent(o)) return;
          // Every rank's notice must be in (so every rank sees a mismatch, with both sides).
          if (!all_announced(o)) return;
          check_agreement(o);
          const unsigned char* acc = small_acc() + detail::mpi_header_bytes;
          if (o.average)
            detail::divide_into(o.buf, acc, o.count, o.type, static_cast<double>(size_));
          else if (o.bytes != 0)
            std::memcpy(o.buf, acc, o.bytes);
          o.done = true;
          return;
        }
        default: return;
      }
    }
  }

  // ---- the ring all-reduce ----
  //
  // Over n ranks: in reduce-scatter step s, rank r sends segment r - s to its right neighbour
  // and adds segment r - s - 1 from its left one; after n - 1 steps it owns segment r + 1 fully
  // reduced (and, averaging, divided in that last addition), and n - 1 allgather steps pass
  // the reduced segments around. Segments move in pieces (ring_piece_bytes, at most
  // max_message_bytes): a piece received (and reduced) is sent on at once, so the next step
  // overlaps this one. Reduce-scatter pieces arrive in the communicator's scratch (two, by step
  // parity), allgather pieces in the caller's buffer, from which every send reads: no copies.
  // Before the first piece from the left is used, the left neighbour's notice must agree (its
  // announcement, sent before its first piece); the ring ends once every peer's has come.

  std::size_t ring_first(const operation& o, int seg) const {
    return o.count * static_cast<std::size_t>(seg) / static_cast<std::size_t>(size_);
  }
  std::size_t ring_seg_bytes(const operation& o, int seg) const {
    return (ring_first(o, seg + 1) - ring_first(o, seg)) * dtype_size(o.type);
  }
  std::size_t ring_piece(const operation& o) const {
    return detail::element_limit(std::min(options_.ring_piece_bytes, options_.max_message_bytes), dtype_size(o.type));
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

  void start_ring(operation& o) {
    const std::size_t largest = (o.count + static_cast<std::size_t>(size_) - 1) / static_cast<std::size_t>(size_) *
                                dtype_size(o.type);
    grow(scratch_[0], scratch_size_[0], largest);
    if (size_ > 2) grow(scratch_[1], scratch_size_[1], largest);
    o.sends.assign(static_cast<std::size_t>(ring_steps()), {});
    o.step = 0;
    o.piece = 0;
    o.posted = false;
    // Step 0's sends go at once; later steps' pieces follow as they are reduced or received.
    const int seg = ring_seg_out(0);
    const std::size_t piece = ring_piece(o), bytes = ring_seg_bytes(o, seg);
    for (std::size_t k = 0; k < detail::chunk_count(bytes, piece); ++k) ring_send(o, 0, seg, k);
    post_ring_recvs(o);
  }

  void ring_send(operation& o, int step, int seg, std::size_t k) {
    const std::size_t piece = ring_piece(o), bytes = ring_seg_bytes(o, seg);
    const auto* at = static_cast<const unsigned char*>(o.buf) + ring_first(o, seg) * dtype_size(o.type) + k * piece;
    MPI_Request r = MPI_REQUEST_NULL;
    check_mpi(o.c, MPI_Isend(at, static_cast<int>(detail::chunk_length(bytes, piece, k)), MPI_BYTE,
                             (rank_ + 1) % size_, ring_tag, notices_, &r));
    o.sends[static_cast<std::size_t>(step)].push_back(r);
  }

  // The current step's receives, once nothing still reads where they write: an allgather step
  // writes the segment the reduce-scatter step of the same index sent, so those sends first.
  void post_ring_recvs(operation& o) {
    const int s = o.step;
    if (!ring_rs(s)) {
      auto& before = o.sends[static_cast<std::size_t>(s - (size_ - 1))];
      if (!before.empty()) {
        int all = 0;
        check_mpi(o.c, MPI_Testall(static_cast<int>(before.size()), before.data(), &all, MPI_STATUSES_IGNORE));
        if (!all) return;
        before.clear();
      }
    }
    const int seg = ring_seg_in(s);
    const std::size_t piece = ring_piece(o), bytes = ring_seg_bytes(o, seg);
    const std::size_t pieces = detail::chunk_count(bytes, piece);
    o.rreqs.assign(pieces, MPI_REQUEST_NULL);
    const int left = (rank_ + size_ - 1) % size_;
    for (std::size_t k = 0; k < pieces; ++k) {
      unsigned char* to = ring_rs(s) ? scratch_[static_cast<std::size_t>(s % 2)].get() + k * piece
                                     : static_cast<unsigned char*>(o.buf) + ring_first(o, seg) * dtype_size(o.type) + k * piece;
      check_mpi(o.c, MPI_Irecv(to, static_cast<int>(detail::chunk_length(bytes, piece, k)), MPI_BYTE, left,
                               ring_tag, notices_, &o.rreqs[k]));
    }
    o.posted = true;
  }

  void progress_ring(operation& o) {
    check_agreement(o);
    const int left = (rank_ + size_ - 1) % size_;
    const std::size_t esize = dtype_size(o.type), piece = ring_piece(o);
    while (o.step < ring_steps()) {
      if (!o.posted) {
        post_ring_recvs(o);
        if (!o.posted) return;
      }
      const int s = o.step, seg = ring_seg_in(s);
      const std::size_t bytes = ring_seg_bytes(o, seg), pieces = detail::chunk_count(bytes, piece);
      while (o.piece < pieces) {
        // Nothing from the left is used before its arguments are known to agree.
        if (s == 0 && o.piece == 0 && notice_of(left, o.notice.index) == nullptr) return;
        int done = 0;
        MPI_Status status;
        const int rc = MPI_Test(&o.rreqs[o.piece], &done, &status);
        if (rc != MPI_SUCCESS) ring_size_error(o, left, rc, -1);
        if (!done) return;
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        const std::size_t len = detail::chunk_length(bytes, piece, o.piece);
        if (static_cast<std::size_t>(got) != len) ring_size_error(o, left, MPI_SUCCESS, got);
        unsigned char* at = static_cast<unsigned char*>(o.buf) + ring_first(o, seg) * esize + o.piece * piece;
        if (ring_rs(s)) {
          const unsigned char* in = scratch_[static_cast<std::size_t>(s % 2)].get() + o.piece * piece;
          if (o.average && s == size_ - 2)
            detail::reduce_divide_into(at, in, len / esize, o.type, static_cast<double>(size_));
          else
            detail::reduce_into(at, in, len / esize, o.type, o.rop);
        }
        if (s + 1 < ring_steps()) ring_send(o, s + 1, seg, o.piece);  // seg_in(s) is seg_out(s + 1)
        ++o.piece;
      }
      ++o.step;
      o.piece = 0;
      o.posted = false;
    }
    // Every send out, and every rank's notice in (so every rank sees any mismatch).
    for (auto& step : o.sends) {
      if (step.empty()) continue;
      int all = 0;
      check_mpi(o.c, MPI_Testall(static_cast<int>(step.size()), step.data(), &all, MPI_STATUSES_IGNORE));
      if (!all) return;
      step.clear();
    }
    if (!all_announced(o)) return;
    check_agreement(o);
    o.done = true;
  }

  // A ring piece of another size than ours: the arguments differ (the left neighbour's notice
  // says how, once it is in), or MPI's error.
  [[noreturn]] void ring_size_error(operation& o, int left, int rc, int got) {
    if (const auto* n = notice_of(left, o.notice.index); n != nullptr && !(*n == o.notice)) mismatch(o, left, *n);
    int cls = 0;
    if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
    fail(transport_error(detail::describe(o.c) + ": in the ring all-reduce, rank " + std::to_string(left) +
                         (rc != MPI_SUCCESS && cls != MPI_ERR_TRUNCATE
                              ? ": " + detail::mpi_error_string(rc)
                              : " sent a piece of another size (" +
                                    (got >= 0 ? std::to_string(got) + " bytes" : std::string("longer")) +
                                    ") than " + o.notice.describe() + " on rank " + std::to_string(rank_) +
                                    " expects: the ranks' arguments differ")));
  }

  // ---- broadcast and point to point ----

  void progress_broadcast(operation& o) {
    check_agreement(o);
    const bool root = o.peer == rank_;
    if (!o.posted) {
      // Receivers wait for the root's announcement first (an MPI collective given mismatched
      // sizes may crash), unless told not to.
      if (!root && options_.verify_before_posting && notice_of(o.peer, o.notice.index) == nullptr) return;
      void* data = o.bytes ? o.buf : static_cast<void*>(&dummy_);
      if (options_.bounce_buffers) {
        o.stage.reset(new unsigned char[std::max<std::size_t>(o.bytes, 1)]);
        if (root && o.bytes != 0) std::memcpy(o.stage.get(), o.buf, o.bytes);
        data = o.stage.get();
      }
      check_mpi(o.c, MPI_Ibcast(data, static_cast<int>(o.bytes), MPI_BYTE, o.peer, data_, &o.req));
      o.posted = true;
    }
    if (o.req != MPI_REQUEST_NULL) {
      int done = 0;
      const int rc = MPI_Test(&o.req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        // Most often the ranks' arguments differed; the announcements say so more clearly.
        drain_notices();
        check_agreement(o);
        fail(transport_error(detail::describe(o.c) + ": " + detail::mpi_error_string(rc)));
      }
      if (!done) return;
    }
    // A receiver returns once the root's notice is in and agrees; the root, as in MPI_Bcast,
    // waits for nobody.
    if (!root && notice_of(o.peer, o.notice.index) == nullptr) return;
    if (!root && o.stage && o.bytes != 0) std::memcpy(o.buf, o.stage.get(), o.bytes);
    o.stage.reset();
    o.done = true;
  }

  void progress_p2p(operation& o) {
    int done = 0;
    MPI_Status status;
    const int rc = MPI_Test(&o.req, &done, &status);
    if (rc != MPI_SUCCESS) {  // single-completion calls return the request's error
      int cls = 0;
      MPI_Error_class(rc, &cls);
      fail(transport_error(detail::describe(o.c) + ": " + detail::mpi_error_string(rc) +
                           (cls == MPI_ERR_TRUNCATE ? " (a message longer than the receive "
                                                      "buffer; sizes must match exactly)"
                                                    : "")));
    }
    if (!done) return;
    if (o.what == operation::kind::recv) {
      MPI_Count received = 0;
      MPI_Get_elements_x(&status, MPI_BYTE, &received);
      o.source = status.MPI_SOURCE;
      if (static_cast<std::size_t>(received) != o.bytes)
        fail(transport_error(detail::describe(o.c) + ": rank " + std::to_string(status.MPI_SOURCE) +
                             " sent " + std::to_string(received) + " bytes with tag " +
                             std::to_string(o.tag) + " but rank " + std::to_string(rank_) +
                             " received into " + std::to_string(o.bytes) + " bytes"));
    } else {
      o.source = o.peer;
    }
    free_layout(o);
    o.stage.reset();
    o.done = true;
  }

  static void free_layout(operation& o) {
    if (o.layout != MPI_DATATYPE_NULL) MPI_Type_free(&o.layout);
  }

  // ---- cancelling and abandoning ----

  // A receive not matched yet is cancelled: true when the cancel won (nothing arrived), false
  // when the message came first (the next progress completes it).
  bool withdraw(operation& o) {
    if (o.what != operation::kind::recv || o.finished()) return o.cancelled;
    MPI_Status status;
    MPI_Cancel(&o.req);
    MPI_Wait(&o.req, &status);
    int cancelled = 0;
    MPI_Test_cancelled(&status, &cancelled);
    if (cancelled) {
      o.cancelled = true;
      free_layout(o);
      ops_.erase(std::remove_if(ops_.begin(), ops_.end(), [&](const op_ptr& p) { return p.get() == &o; }), ops_.end());
      return true;
    }
    // It completed: take its status now (the request is spent).
    MPI_Count received = 0;
    MPI_Get_elements_x(&status, MPI_BYTE, &received);
    o.source = status.MPI_SOURCE;
    free_layout(o);
    if (static_cast<std::size_t>(received) != o.bytes)
      fail(transport_error(detail::describe(o.c) + ": rank " + std::to_string(status.MPI_SOURCE) + " sent " +
                           std::to_string(received) + " bytes with tag " + std::to_string(o.tag) + " but rank " +
                           std::to_string(rank_) + " received into " + std::to_string(o.bytes) + " bytes"));
    o.done = true;
    return false;
  }

  // Receives only: MPI guarantees that the wait after cancelling a receive returns locally.
  static void cancel_recv(MPI_Request& req) {
    if (req == MPI_REQUEST_NULL) return;
    MPI_Cancel(&req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }

  // Open MPI's MPI_Cancel does not cancel a send, and a wait would last until the receiver
  // takes the message, perhaps forever. An unfinished send is released to complete on its
  // own; whatever it reads from is leaked (or is the caller's buffer).
  void release_send(MPI_Request& req) {
    if (req == MPI_REQUEST_NULL) return;
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) return;
    MPI_Request_free(&req);
    dirty_ = true;
  }

  // An operation given up (a failure, the destructor): receives cancelled, sends and
  // collectives released with their buffers leaked.
  void abandon(operation& o) {
    switch (o.what) {
      case operation::kind::recv:
        cancel_recv(o.req);
        free_layout(o);
        return;
      case operation::kind::send:
        release_send(o.req);
        if (o.stage) abandoned_.push_back(std::move(o.stage));
        free_layout(o);
        return;
      case operation::kind::broadcast:
        if (o.req != MPI_REQUEST_NULL) {
          o.req = MPI_REQUEST_NULL;  // MPI cannot cancel a collective: it still owns it
          dirty_ = true;
          if (o.stage) abandoned_.push_back(std::move(o.stage));
        }
        return;
      case operation::kind::allreduce:
        if (!o.active) return;
        cancel_recv(o.req);
        for (auto& r : o.rreqs) cancel_recv(r);
        release_send(o.sreq);
        for (auto& step : o.sends)
          for (auto& r : step) release_send(r);
        // The small all-reduce's sends read small_ (kept, never freed, see the destructor);
        // the ring's read the caller's buffer (see the class comment).
        dirty_ = true;
        return;
    }
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
  MPI_Comm data_ = MPI_COMM_NULL;     // point to point and broadcasts
  MPI_Comm notices_ = MPI_COMM_NULL;  // announcements and the all-reduces' protocols
  std::uint64_t calls_ = 0;
  std::int64_t collectives_ = 0;
  std::optional<transport_error> failure_;  // owning thread only
  std::atomic<bool> failed_{false};         // mirrors failure_ for failed() on other threads
  std::atomic<bool> aborted_{false};
  bool dirty_ = false;  // a request was released or abandoned: never free the duplicates
  std::deque<op_ptr> ops_;
  std::unique_ptr<unsigned char[]> small_;  // the small all-reduce: accumulator, incoming
  std::size_t small_size_ = 0;
  std::unique_ptr<unsigned char[]> scratch_[2];  // the ring's incoming pieces, by step parity
  std::size_t scratch_size_[2] = {0, 0};
  std::vector<std::unique_ptr<unsigned char[]>> abandoned_;  // buffers MPI may still touch
  std::vector<MPI_Request> notice_reqs_;                     // per peer: posted announcement recv
  std::vector<std::array<std::int64_t, 6>> inbox_;           // per peer: its buffer
  std::vector<std::deque<detail::mpi_notice>> seen_;         // per peer: notices by index
  std::vector<std::int64_t> last_announced_;                 // per peer: latest announced index
  std::int64_t last_announced_index_ = 0;  // the last collective whose announcements we expect
  bool last_expects_announcements_ = false;
  std::deque<notice_send> notice_sends_;
  unsigned char dummy_ = 0;  // MPI wants a valid address even for zero bytes
};

// ---- mpi_work, out of line: it drives the communicator ----

inline bool mpi_work::test() {
  if (!op_) return true;
  auto& o = *static_cast<mpi_communicator::operation*>(op_.get());
  if (o.done || o.cancelled) return true;
  if (o.orphan) throw transport_error(detail::describe(o.c) + ": its communicator was destroyed");
  comm_->enter(o.c);
  comm_->progress();
  return o.done || o.cancelled;
}

inline void mpi_work::wait(deadline d) {
  if (!op_) return;
  auto& o = *static_cast<mpi_communicator::operation*>(op_.get());
  if (o.done || o.cancelled) return;
  if (o.orphan) throw transport_error(detail::describe(o.c) + ": its communicator was destroyed");
  comm_->enter(o.c);
  comm_->wait_op(o, d);
}

inline bool mpi_work::wait_until(deadline::clock::time_point t) {
  if (!op_) return true;
  auto& o = *static_cast<mpi_communicator::operation*>(op_.get());
  if (o.done || o.cancelled) return true;
  if (o.orphan) throw transport_error(detail::describe(o.c) + ": its communicator was destroyed");
  comm_->enter(o.c);
  return comm_->wait_op(o, deadline::at(t), false, /*timed=*/true);
}

inline int mpi_work::source() const noexcept {
  if (!op_) return -1;
  const auto& o = *static_cast<const mpi_communicator::operation*>(op_.get());
  return o.what == mpi_communicator::operation::kind::recv ? o.source : o.peer;
}

inline bool mpi_work::cancel() noexcept {
  if (!op_) return true;
  auto& o = *static_cast<mpi_communicator::operation*>(op_.get());
  if (o.done || o.cancelled || o.orphan || o.failed) return true;
  if (o.what != mpi_communicator::operation::kind::recv) return false;  // goes on in the background
  if (std::this_thread::get_id() != comm_->owner_) return false;  // never enter MPI elsewhere
  try {
    comm_->withdraw(o);
  } catch (...) {
    return true;  // it completed with an error, which failed the communicator: nothing more
  }
  return true;
}

}  // namespace cadence::transport
