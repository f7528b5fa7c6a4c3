/// \file
/// \ingroup transport
/// The NCCL backend's logic without NCCL: nccl_communicator and its work handle, over the
/// function table of nccl/api.hpp. Includes no CUDA header, so the protocol is unit-tested on
/// CPU against a fake table; nccl/communicator.hpp adds the real one.
///
///     ---- nccl_work ----            the work handle (test, wait, cancel), its bodies at the end
///     ---- the concept's calls ----  on stream(), after the caller's stream; on an explicit stream
///     ---- device helpers ----       what the collective adapters (cadence/exchange/) call
///     ---- construction ----         the communicator's init, abort and re-init
///     ---- calls, starts, events --  argument checks, ordering after the caller's stream
///     ---- polling ----              the work handle's test against NCCL's async error
///
/// Over 800 lines: the communicator and its work handle are one protocol (each handle polls
/// the communicator's events and abort state), which a split would only spread over files.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/arguments.hpp>
#include <cadence/transport/engine/latch.hpp>
#include <cadence/transport/engine/pacing.hpp>
#include <cadence/transport/nccl/api.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport {

namespace detail {
// The events work handles wait on, shared by the communicator and its handles: a handle gives
// its event back even after the communicator is gone, and then learns that it is.
struct nccl_events {
  nccl_api api;
  std::vector<void*> free;
  bool alive = true;  // the communicator exists
  ~nccl_events() {
    for (void* e : free)
      if (api.event_destroy != nullptr) api.event_destroy(e);
  }
};
}  // namespace detail

/// \addtogroup transport
/// @{

class nccl_communicator;

// ---- nccl_work: the work handle ----

/// A started NCCL operation (the asynchronous forms, and record()): models the work handle of
/// communicator.hpp. An event recorded behind the operation says when it is done: test() polls
/// it and ncclCommGetAsyncError, wait(d) until d (then the communicator is aborted and names
/// whom the operation waited for). NCCL cannot withdraw an enqueued operation: cancel() returns
/// false until it is done, and the buffer must stay valid until then (or until the communicator
/// is aborted and destroyed). Only the communicator's owning thread may use it.
class nccl_work {
public:
  /// A complete handle of no operation.
  nccl_work() = default;
  /// Takes over `o`'s operation; `o` is left complete.
  nccl_work(nccl_work&& o) noexcept { *this = std::move(o); }
  /// Lets go of this handle's own operation (it goes on: NCCL cannot withdraw it), then takes
  /// over `o`'s; `o` is left complete.
  nccl_work& operator=(nccl_work&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      events_ = std::move(o.events_);
      c_ = o.c_;
      event_ = std::exchange(o.event_, nullptr);
      awaited_ = std::move(o.awaited_);
      note_ = std::move(o.note_);
      source_ = o.source_;
      done_ = std::exchange(o.done_, true);
    }
    return *this;
  }
  nccl_work(const nccl_work&) = delete;
  nccl_work& operator=(const nccl_work&) = delete;
  ~nccl_work() { release(); }

  /// Polls the operation's event and NCCL's asynchronous error without blocking; true once
  /// complete. Throws what the blocking call would.
  inline bool test();
  /// Returns once complete; when deadline `d` passes first, aborts the communicator and throws
  /// transport_error naming whom the operation waited for.
  inline void wait(deadline d = {});
  /// The peer of the operation (send: the destination; recv: the source asked for; broadcast:
  /// the root).
  int source() const noexcept { return source_; }
  /// True once the operation is done; false before (NCCL cannot withdraw it: the buffer must
  /// stay valid).
  bool cancel() noexcept { return done_; }

private:
  friend class nccl_communicator;
  static nccl_work completed(int source) {
    nccl_work w;
    w.source_ = source;
    return w;
  }
  nccl_work(nccl_communicator* comm, std::shared_ptr<detail::nccl_events> events, detail::call_info c, void* event,
            std::vector<int> awaited, std::string note, int source)
      : comm_(comm), events_(std::move(events)), c_(c), event_(event), awaited_(std::move(awaited)),
        note_(std::move(note)), source_(source), done_(false) {}
  inline void check_alive() const;
  // The event goes back to the pool (it may be recorded again: a later record overwrites it).
  void release() noexcept {
    if (event_ != nullptr && events_) events_->free.push_back(event_);
    event_ = nullptr;
    done_ = true;
  }

  nccl_communicator* comm_ = nullptr;
  std::shared_ptr<detail::nccl_events> events_;
  detail::call_info c_{};
  void* event_ = nullptr;
  std::vector<int> awaited_;
  std::string note_;
  int source_ = -1;
  bool done_ = true;  // a default-constructed or moved-from handle is complete
};

/// Models transport::communicator over NCCL (target cadence::nccl for the real table).
///
/// Construction is collective over a **bootstrap communicator** (any host communicator: MPI,
/// gloo, inproc), used only inside the constructor: every rank sets up its device, stream and
/// event; rank 0 creates the NCCL unique id and broadcasts it over the bootstrap; the ranks
/// agree that all of them are set up (a one-byte allgather, so a rank without a device fails
/// everyone at once instead of at the deadline); each initialises NCCL non-blocking
/// (ncclConfig_t::blocking = 0) and polls ncclCommGetAsyncError until the communicator is
/// ready; then a barrier over the bootstrap. An init that does not complete by the deadline is
/// aborted (ncclCommAbort, on the constructing thread) and throws transport_error.
///
/// Buffers are device pointers (capabilities().device_buffers), f16 and bf16 included.
///
/// Streams, and which work comes first. The calls of the concept (allreduce, broadcast, send,
/// recv, allreduce_average, and their asynchronous forms) run on the communicator's stream
/// (stream()) after the caller's: each first records an event on nccl_options::caller_stream
/// (null: the legacy default stream) and makes stream() wait for it (cudaStreamWaitEvent), so
/// an all-reduce never reads a gradient before the kernels the caller enqueued on its stream
/// have written it, and the caller's later kernels need not wait for the communication. The
/// overloads with an explicit `stream` enqueue on that stream itself: the stream's own order
/// covers it. Either way an event behind the operation says when it is done: the blocking calls
/// poll it (and ncclCommGetAsyncError) until then, an error, abort(), or the deadline, so the
/// buffer is ready when they return; the asynchronous forms return a work handle (nccl_work)
/// whose test() and wait() poll it. Zero-byte calls are local no-ops, as in NCCL.
///
/// Failure: the first failure (deadline, asynchronous NCCL error, abort()) calls ncclCommAbort on
/// the owning thread, marks the communicator failed and throws transport_error; every later
/// call rethrows that error at once. NCCL cannot say which rank a collective waits for, so a
/// timed-out collective names every other rank and says so; send and recv name their peer.
///
/// What NCCL cannot do, and so this backend does not claim: recv from any_source; matching by
/// tag (tags are range-checked, but the n-th send from a to b meets the n-th recv on b from a,
/// whatever their tags); seeing argument mismatches (counts, dtypes, roots, or a recv size
/// different from the send's: NCCL has no header to compare, and a message-size header would
/// cost a second transfer per message, so callers must agree on sizes, as the parameter
/// server's host-side announcements do); seeing a lost peer other than by the deadline
/// (detects_lost_peer false); surviving one (survives_lost_peer false: the communicator is
/// aborted and a new one must be built among the survivors).
///
/// Only the constructing thread may call it, except abort() and failed(): abort() only raises a
/// flag that the owning thread's polling loop sees, so ncclCommAbort never runs on another
/// thread. Neither copyable nor movable: hold it in a std::unique_ptr to hand it around.
class nccl_communicator {
public:
  /// This rank's communicator on CUDA device `device`, reaching NCCL through `api`, built with
  /// `options` over the host communicator `bootstrap` (this rank's rank and size are its own)
  /// within deadline `d`, as described above. Throws invalid_parameter_error for a table without
  /// a required function or a bootstrap with device buffers, and transport_error when a rank's
  /// setup or NCCL's init fails or does not complete in time.
  template <class Bootstrap>
  nccl_communicator(const nccl_api& api, Bootstrap& bootstrap, int device,
                    nccl_options options = {}, deadline d = {})
      : api_(api), options_(options), device_(device), owner_(std::this_thread::get_id()) {
    CADENCE_REQUIRE_COMMUNICATOR(Bootstrap);
    events_->api = api_;
    rank_ = bootstrap.rank();
    size_ = bootstrap.size();
    const detail::call_info c{"nccl", "construction", 0, rank_, size_, deadline::clock::now()};
    detail::check_deadline(c, d);
    check_table(c);
    if (bootstrap.capabilities().device_buffers)
      detail::bad_argument(c, "the bootstrap communicator takes device buffers; the unique id "
                              "travels in host memory (bootstrap over MPI, gloo or inproc)");
    try {
      construct(c, bootstrap, d);
    } catch (...) {
      release();
      throw;
    }
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  /// On the owning thread. A healthy communicator is finalized (ncclCommFinalize, polled for at
  /// most options.shutdown_wait, then ncclCommDestroy); a failed one was aborted already; one
  /// whose finalize does not complete in time is aborted.
  ~nccl_communicator() { release(); }

  /// This rank, the bootstrap communicator's.
  int rank() const noexcept { return rank_; }
  /// The number of ranks, the bootstrap communicator's.
  int size() const noexcept { return size_; }
  /// The CUDA device this communicator's buffers and streams are on.
  int device() const noexcept { return device_; }
  /// The stream calls without an explicit stream use (a cudaStream_t).
  void* stream() const noexcept { return stream_; }

  /// What this backend offers beyond the concept: device buffers only (no any_source, and a
  /// lost peer is seen by the deadline alone and fails the communicator).
  capability_flags capabilities() const noexcept {
    capability_flags f;
    f.any_source = false;          // NCCL receives from one named peer
    f.detects_lost_peer = false;   // a crashed peer is seen only by the deadline
    f.survives_lost_peer = false;  // the communicator is aborted; rebuild among the survivors
    f.device_buffers = true;
    return f;
  }

  // ---- the concept's calls: on stream(), after the caller's stream ----

  /// Reduces the `count` elements of dtype `t` at device buffer `buf` with `op` across all
  /// ranks, in place, within deadline `d`.
  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, deadline d = {}) {
    start_allreduce("allreduce", buf, count, t, op, false, nullptr, &d).wait(d);
  }
  /// Copies `bytes` bytes from rank `root`'s device buffer `buf` into every rank's `buf`,
  /// within deadline `d`.
  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    start_broadcast(buf, bytes, root, nullptr, &d).wait(d);
  }
  /// Sends `bytes` bytes from device buffer `buf` to rank `dst` within deadline `d`; `tag` is
  /// range-checked only (NCCL matches in order, not by tag).
  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    start_p2p("send", const_cast<void*>(buf), bytes, dst, tag, nullptr, &d).wait(d);
  }
  /// Receives `bytes` bytes from rank `src` (never any_source) into device buffer `buf` within
  /// deadline `d`, and returns `src`; `tag` is range-checked only.
  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    start_p2p("recv", buf, bytes, src, tag, nullptr, &d).wait(d);
    return src;
  }
  /// Replaces the `count` elements of dtype `t` (f32, f64) at `buf` by their mean over ranks,
  /// within deadline `d`: ncclAvg, which multiplies every input by 1/size() and sums (exact
  /// when size() is a power of two and the sum is exact).
  void allreduce_average(void* buf, std::size_t count, dtype t, deadline d = {}) {
    start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, nullptr, &d).wait(d);
  }

  /// Enqueues allreduce(buf, count, t, op) and returns its work handle at once (the
  /// asynchronous forms of communicator.hpp).
  nccl_work iallreduce(void* buf, std::size_t count, dtype t, reduce_op op) {
    return start_allreduce("allreduce", buf, count, t, op, false, nullptr, nullptr);
  }
  /// Enqueues allreduce_average(buf, count, t) and returns its work handle at once.
  nccl_work iallreduce_average(void* buf, std::size_t count, dtype t) {
    return start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, nullptr, nullptr);
  }
  /// Enqueues broadcast(buf, bytes, root) and returns its work handle at once.
  nccl_work ibroadcast(void* buf, std::size_t bytes, int root) {
    return start_broadcast(buf, bytes, root, nullptr, nullptr);
  }
  /// Enqueues send(buf, bytes, dst, tag) and returns its work handle at once.
  nccl_work isend(const void* buf, std::size_t bytes, int dst, int tag) {
    return start_p2p("send", const_cast<void*>(buf), bytes, dst, tag, nullptr, nullptr);
  }
  /// Enqueues recv(buf, bytes, src, tag) and returns its work handle at once.
  nccl_work irecv(void* buf, std::size_t bytes, int src, int tag) {
    return start_p2p("recv", buf, bytes, src, tag, nullptr, nullptr);
  }

  // ---- on an explicit stream (a cudaStream_t of this communicator's device) ----

  /// allreduce(buf, count, t, op, d) enqueued on `stream` itself, after what is already there.
  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, void* stream, deadline d) {
    start_allreduce("allreduce", buf, count, t, op, false, &stream, &d).wait(d);
  }
  /// broadcast(buf, bytes, root, d) enqueued on `stream` itself, after what is already there.
  void broadcast(void* buf, std::size_t bytes, int root, void* stream, deadline d) {
    start_broadcast(buf, bytes, root, &stream, &d).wait(d);
  }
  /// send(buf, bytes, dst, tag, d) enqueued on `stream` itself, after what is already there.
  void send(const void* buf, std::size_t bytes, int dst, int tag, void* stream, deadline d) {
    start_p2p("send", const_cast<void*>(buf), bytes, dst, tag, &stream, &d).wait(d);
  }
  /// recv(buf, bytes, src, tag, d) enqueued on `stream` itself, after what is already there.
  int recv(void* buf, std::size_t bytes, int src, int tag, void* stream, deadline d) {
    start_p2p("recv", buf, bytes, src, tag, &stream, &d).wait(d);
    return src;
  }
  /// iallreduce(buf, count, t, op) enqueued on `stream` itself, after what is already there.
  nccl_work iallreduce(void* buf, std::size_t count, dtype t, reduce_op op, void* stream) {
    return start_allreduce("allreduce", buf, count, t, op, false, &stream, nullptr);
  }

  // ---- Device helpers for the collective adapters (cadence/exchange/) ----
  // Not part of the communicator concept: what bucket fusion and merging need on the device
  // (NCCL has no elementwise kernels of its own, and this header includes no CUDA), reached
  // through the same table, so the fake tests them, and under the same failure contract. Only
  // the owning thread; `stream` is a cudaStream_t of this communicator's device (stream()),
  // the work is enqueued on it.

  /// allreduce_average(buf, count, t, d) enqueued on `stream` itself: in place, each element
  /// becomes the mean over ranks (ncclAvg). For f32 and f64 NCCL multiplies every input by
  /// 1/size() and sums, so the mean is exact when size() is a power of two and the sum is
  /// exact (allreduce_avg of collectives.hpp divides instead).
  void allreduce_average(void* buf, std::size_t count, dtype t, void* stream, deadline d) {
    start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, &stream, &d).wait(d);
  }
  /// iallreduce_average(buf, count, t) enqueued on `stream` itself.
  nccl_work iallreduce_average(void* buf, std::size_t count, dtype t, void* stream) {
    return start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, true, &stream, nullptr);
  }

  /// recv = the sum over ranks r of scale_r * send_r, where scale_r is the `scale` rank r
  /// passed (ncclRedOpCreatePreMulSum with a host scalar, converted to the element type), for
  /// `count` elements of dtype `t` (f32 or f64), enqueued on `stream` and waited for until
  /// deadline `d`. `send` may be `recv` (in place), and may be another buffer on each rank: a
  /// rank that passes 0 contributes nothing.
  void allreduce_scaled(const void* send, void* recv, std::size_t count, dtype t, double scale,
                        void* stream, deadline d) {
    const detail::call_info c = begin("allreduce_scaled");
    enter(c);
    const std::size_t bytes = detail::checked_bytes(c, count, t);
    detail::check_buffer(c, send, bytes);
    detail::check_buffer(c, recv, bytes);
    if (t != dtype::f32 && t != dtype::f64)
      detail::bad_argument(c, std::string("dtype ") + dtype_name(t) + " is not f32 or f64");
    require(c, api_.all_reduce_op && api_.red_op_create_premul_sum && api_.red_op_destroy,
            "all_reduce_op, red_op_create_premul_sum or red_op_destroy");
    detail::check_deadline(c, d);
    if (bytes == 0) return;
    settle(c, d);
    int op = 0;
    const int rc = api_.red_op_create_premul_sum(&op, scale, t, comm_);
    if (rc != nccl_codes::success)
      fail(transport_error(detail::describe(c) + ": ncclRedOpCreatePreMulSum failed: " + nccl_error(rc)));
    try {
      check_nccl(c, api_.all_reduce_op(send, recv, count, t, op, comm_, stream));
      nccl_work w = behind(c, stream, others_or_self(), "NCCL cannot say which of them is missing", &d);
      w.wait(d);
    } catch (...) {
      if (comm_ != nullptr) api_.red_op_destroy(op, comm_);
      throw;
    }
    api_.red_op_destroy(op, comm_);
  }

  /// A handle that completes once everything enqueued on `stream` so far has (an event behind
  /// it): how an adapter waits for its copies out behind an all-reduce.
  nccl_work record(void* stream) {
    const detail::call_info c = begin("record");
    enter(c);
    return behind(c, stream, {rank_}, "this rank's device did not finish the stream's work", nullptr);
  }
  /// The same, standing for `covered` (an operation enqueued on `stream` before the work this
  /// waits for, e.g. an all-reduce before its copies out): it completes after all of it and,
  /// on failure, names what `covered` names (the call and the ranks it waited for).
  nccl_work record(void* stream, nccl_work&& covered) {
    const detail::call_info c = begin("record");
    enter(c);
    nccl_work w = behind(c, stream, {rank_}, "this rank's device did not finish the stream's work", nullptr);
    if (covered.done_) return w;
    w.c_ = covered.c_;
    w.awaited_ = std::move(covered.awaited_);
    w.note_ = std::move(covered.note_);
    covered.release();
    return w;
  }

  /// Work enqueued on `waiter` from now on waits for what was enqueued on `waited` before this
  /// call (an event, cudaStreamWaitEvent); nothing when they are the same stream. Null is the
  /// legacy default stream.
  void stream_wait(void* waiter, void* waited) {
    const detail::call_info c = begin("stream_wait");
    enter(c);
    order(c, waiter, waited);
  }

  /// Enqueues a copy of `bytes` from `src` to `dst` (device memory) on `stream`
  /// (cudaMemcpyAsync) and returns; a later call on the same stream sees it done.
  void copy_async(void* dst, const void* src, std::size_t bytes, void* stream) {
    const detail::call_info c = begin("copy_async");
    enter(c);
    detail::check_buffer(c, dst, bytes);
    detail::check_buffer(c, src, bytes);
    require(c, api_.memcpy_async != nullptr, "memcpy_async");
    if (bytes == 0) return;
    const int rc = api_.memcpy_async(dst, src, bytes, stream);
    if (rc != nccl_codes::success)
      fail(transport_error(detail::describe(c) + ": cudaMemcpyAsync failed: " + cuda_error(rc)));
  }

  /// Enqueues zeroing `bytes` at `p` (device memory) on `stream` (cudaMemsetAsync).
  void zero_async(void* p, std::size_t bytes, void* stream) {
    const detail::call_info c = begin("zero_async");
    enter(c);
    detail::check_buffer(c, p, bytes);
    require(c, api_.memset_async != nullptr, "memset_async");
    if (bytes == 0) return;
    const int rc = api_.memset_async(p, 0, bytes, stream);
    if (rc != nccl_codes::success)
      fail(transport_error(detail::describe(c) + ": cudaMemsetAsync failed: " + cuda_error(rc)));
  }

  /// Returns once everything enqueued on `stream` so far has completed on the device (an event
  /// behind it, polled as a call's), or throws transport_error at deadline `d`.
  void synchronize(void* stream, deadline d) {
    const detail::call_info c = begin("synchronize");
    enter(c);
    detail::check_deadline(c, d);
    behind(c, stream, {rank_}, "this rank's device did not finish the stream's work", &d).wait(d);
  }

  /// `bytes` of device memory on this communicator's device (cudaMalloc), for device_free.
  /// Throws transport_error when the allocation fails (the communicator stays usable).
  void* device_alloc(std::size_t bytes) {
    const detail::call_info c = begin("device_alloc");
    enter(c);
    require(c, api_.device_malloc && api_.device_free, "device_malloc or device_free");
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const int rc = api_.device_malloc(&p, bytes);
    if (rc != nccl_codes::success || p == nullptr)
      throw transport_error(detail::describe(c) + ": cudaMalloc of " + std::to_string(bytes) +
                            " bytes failed: " + cuda_error(rc));
    return p;
  }
  /// Frees `p`, which device_alloc returned (null: nothing); never throws.
  void device_free(void* p) noexcept {
    if (p != nullptr && api_.device_free != nullptr) api_.device_free(p);
  }

  /// Any thread; never enters NCCL. The owning thread's call in progress (or its next call)
  /// sees the flag, calls ncclCommAbort and throws.
  void abort() noexcept { latch_.abort(); }

  /// Whether the communicator has failed or was aborted (any thread).
  bool failed() const noexcept { return latch_.failed(); }

private:
  friend class nccl_work;

  // ---- construction ----
  template <class Bootstrap>
  void construct(const detail::call_info& c, Bootstrap& bootstrap, const deadline& d) {
    // Local setup first, its failure only recorded: the ranks must learn of each other's
    // failures over the bootstrap, or the healthy ones would wait in NCCL init until the deadline.
    std::string local_error = local_setup();
    nccl_unique_id id{};
    if (rank_ == 0 && local_error.empty()) {
      const int rc = api_.get_unique_id(api_.context, &id);
      if (rc != nccl_codes::success) local_error = "ncclGetUniqueId failed: " + nccl_error(rc);
    }
    // The id (meaningless if rank 0 failed), then whether each rank is ready: the allgather
    // tells everyone about everyone's setup, rank 0's unique id included.
    std::vector<std::uint8_t> ready(static_cast<std::size_t>(size_), 0);
    const std::uint8_t mine = local_error.empty() ? 1 : 0;
    try {
      bootstrap.broadcast(&id, sizeof id, 0, d);
      allgather(bootstrap, &mine, ready.data(), 1, d);
    } catch (const cadence::error& e) {
      throw transport_error(detail::describe(c) + ": the bootstrap communicator failed while " +
                            "exchanging the NCCL unique id: " + e.what());
    }
    if (!local_error.empty()) {
      if (bad_device_) detail::bad_argument(c, local_error);
      throw transport_error(detail::describe(c) + ": " + local_error);
    }
    std::vector<int> unready;
    for (int p = 0; p < size_; ++p)
      if (ready[static_cast<std::size_t>(p)] == 0) unready.push_back(p);
    if (!unready.empty())
      throw transport_error(detail::describe(c) + ": " + detail::rank_list(unready) +
                            " could not set up (the error is on " +
                            (unready.size() == 1 ? "that rank)" : "those ranks)"));

    // Non-blocking init, polled: a rank that never joins must not hang us past the deadline.
    void* comm = nullptr;
    const int rc = api_.comm_init_rank_nonblocking(&comm, size_, &id, rank_);
    comm_ = comm;
    if (rc != nccl_codes::success && rc != nccl_codes::in_progress) {
      abort_backend();
      throw transport_error(detail::describe(c) + ": ncclCommInitRankConfig failed: " +
                            nccl_error(rc));
    }
    for (;;) {
      int state = nccl_codes::in_progress;
      const int q = api_.comm_get_async_error(comm_, &state);
      if (q != nccl_codes::success) state = q;
      if (state == nccl_codes::success) break;
      if (state != nccl_codes::in_progress) {
        abort_backend();
        throw transport_error(detail::describe(c) + ": NCCL init failed: " + nccl_error(state) +
                              " (the communicator was aborted with ncclCommAbort)");
      }
      if (d.passed()) {
        abort_backend();
        throw detail::deadline_error(c, others_or_self(),
                                     "NCCL init (non-blocking ncclCommInitRankConfig) did not "
                                     "complete; NCCL cannot say which rank is missing; aborted "
                                     "with ncclCommAbort");
      }
      pause(c.started);
    }
    try {
      barrier(bootstrap, d);
    } catch (const cadence::error& e) {
      abort_backend();
      throw transport_error(detail::describe(c) + ": the barrier after NCCL init failed on the " +
                            "bootstrap communicator: " + e.what());
    }
  }

  // Device, stream, event; returns the first failure's description instead of throwing.
  std::string local_setup() {
    int devices = 0;
    int rc = api_.get_device_count(api_.context, &devices);
    if (rc != nccl_codes::success) return "cudaGetDeviceCount failed: " + cuda_error(rc);
    if (device_ < 0 || device_ >= devices) {
      bad_device_ = true;  // an argument error, thrown once the other ranks know
      return "device " + std::to_string(device_) + " is out of range [0, " +
             std::to_string(devices) + ")";
    }
    rc = api_.set_device(device_);
    if (rc != nccl_codes::success)
      return "cudaSetDevice(" + std::to_string(device_) + ") failed: " + cuda_error(rc);
    if (options_.stream != nullptr) {
      stream_ = options_.stream;
    } else {
      rc = api_.stream_create(&stream_);
      if (rc != nccl_codes::success) {
        stream_ = nullptr;
        return "cudaStreamCreateWithFlags failed: " + cuda_error(rc);
      }
      own_stream_ = true;
    }
    rc = api_.event_create(&event_);
    if (rc != nccl_codes::success) {
      event_ = nullptr;
      return "cudaEventCreateWithFlags failed: " + cuda_error(rc);
    }
    return {};
  }

  void check_table(const detail::call_info& c) const {
    const bool complete_table =
        api_.get_unique_id && api_.comm_init_rank_nonblocking && api_.comm_get_async_error &&
        api_.comm_abort && api_.comm_finalize && api_.comm_destroy && api_.all_reduce &&
        api_.broadcast && api_.send && api_.recv && api_.get_error_string &&
        api_.get_device_count && api_.set_device && api_.stream_create && api_.stream_destroy &&
        api_.event_create && api_.event_record && api_.event_query && api_.event_destroy &&
        api_.stream_wait_event && api_.cuda_error_string;
    if (!complete_table) detail::bad_argument(c, "the nccl_api table has a null function");
  }

  // Never throws: the destructor and failed constructions run it.
  void release() noexcept {
    if (comm_ != nullptr) {
      if (latch_.has_failure() || latch_.aborted()) {
        abort_backend();
      } else {
        // in_progress is the usual answer of a non-blocking finalize; the poll below waits.
        const int rc = api_.comm_finalize(comm_);
        bool clean = rc == nccl_codes::success || rc == nccl_codes::in_progress;
        const auto until = deadline::clock::now() + options_.shutdown_wait;
        while (clean) {
          int state = nccl_codes::in_progress;
          if (api_.comm_get_async_error(comm_, &state) != nccl_codes::success) state = -1;
          if (state == nccl_codes::success) break;
          if (state != nccl_codes::in_progress || deadline::clock::now() >= until) {
            clean = false;
            break;
          }
          std::this_thread::sleep_for(options_.poll_sleep);
        }
        if (clean) {
          api_.comm_destroy(comm_);
          comm_ = nullptr;
        } else {
          abort_backend();
        }
      }
    }
    if (event_ != nullptr) api_.event_destroy(event_);
    event_ = nullptr;
    events_->alive = false;  // handles still held give their events back to the pool, which frees them
    if (own_stream_ && stream_ != nullptr) api_.stream_destroy(stream_);
    stream_ = nullptr;
    own_stream_ = false;
  }

  // ncclCommAbort, once, on the owning thread (every caller runs there).
  void abort_backend() noexcept {
    if (comm_ == nullptr) return;
    api_.comm_abort(comm_);
    comm_ = nullptr;
  }

  // ---- calls ----
  detail::call_info begin(const char* op) {
    return {"nccl", op, ++calls_, rank_, size_, deadline::clock::now()};
  }

  // Contract b: after a failure every call rethrows it; after abort() each call says so (and
  // the owning thread aborts NCCL, if no call has yet).
  void enter(const detail::call_info& c) {
    if (std::this_thread::get_id() != owner_)
      detail::bad_argument(c, "called from a thread that does not own the communicator "
                              "(only the constructing thread may call NCCL through it)");
    if (!latch_.has_failure() && latch_.aborted()) abort_backend();
    latch_.enter(c);
  }

  [[noreturn]] void fail(transport_error e) {
    latch_.record(std::move(e));
    abort_backend();
    latch_.rethrow();
  }

  // An enqueue's result: in_progress means a non-blocking NCCL call still being issued, which
  // settle() waits out through ncclCommGetAsyncError.
  void check_nccl(const detail::call_info& c, int rc) {
    if (rc != nccl_codes::success && rc != nccl_codes::in_progress)
      fail(transport_error(detail::describe(c) + ": NCCL failed to enqueue it: " + nccl_error(rc)));
  }

  // A device helper whose table entries are missing: the caller built the table by hand.
  void require(const detail::call_info& c, bool present, const char* entries) const {
    if (!present)
      detail::bad_argument(c, std::string("the nccl_api table has no ") + entries +
                                  " (the collective adapters' device path needs it)");
  }

  // ---- starting operations, ordering, events ----

  // The stream an operation runs on: the explicit one, or stream() ordered after the caller's.
  void* stream_for(const detail::call_info& c, void** explicit_stream) {
    if (explicit_stream != nullptr) return *explicit_stream;
    order(c, stream_, options_.caller_stream);
    return stream_;
  }

  nccl_work start_allreduce(const char* name, void* buf, std::size_t count, dtype t, reduce_op op, bool average,
                            void** explicit_stream, const deadline* d) {
    const detail::call_info c = begin(name);
    enter(c);
    const std::size_t bytes = detail::check_allreduce(c, buf, count, t, op, false, nullptr, {/*host_arithmetic=*/false});
    if (average) {
      require(c, api_.all_reduce_op != nullptr, "all_reduce_op");
      if (t != dtype::f32 && t != dtype::f64 && t != dtype::f16 && t != dtype::bf16)
        detail::bad_argument(c, std::string("dtype ") + dtype_name(t) +
                                    " is not a floating type (an integer average would have to round)");
    }
    if (d) detail::check_deadline(c, *d);
    if (bytes == 0) return nccl_work::completed(rank_);
    void* stream = stream_for(c, explicit_stream);
    settle(c, d);
    check_nccl(c, average ? api_.all_reduce_op(buf, buf, count, t, nccl_codes::op_avg, comm_, stream)
                          : api_.all_reduce(buf, buf, count, t, op, comm_, stream));
    return behind(c, stream, others_or_self(), "NCCL cannot say which of them is missing", d);
  }

  nccl_work start_broadcast(void* buf, std::size_t bytes, int root, void** explicit_stream, const deadline* d) {
    const detail::call_info c = begin("broadcast");
    enter(c);
    detail::check_broadcast(c, buf, bytes, root, d);
    if (bytes == 0) return nccl_work::completed(root);
    void* stream = stream_for(c, explicit_stream);
    settle(c, d);
    check_nccl(c, api_.broadcast(buf, buf, bytes, root, comm_, stream));
    return behind(c, stream, rank_ == root ? others_or_self() : std::vector<int>{root},
                  rank_ == root ? "NCCL cannot say which of them is missing" : "", d, root);
  }

  nccl_work start_p2p(const char* name, void* buf, std::size_t bytes, int peer, int tag, void** explicit_stream,
                      const deadline* d) {
    const bool is_send = name[0] == 's';
    const detail::call_info c = begin(name);
    enter(c);
    if (is_send)
      detail::check_send(c, buf, bytes, peer, tag, d, {/*self=*/true});
    else  // no any_source: NCCL names its peer
      detail::check_recv(c, buf, bytes, peer, tag, d, {/*self=*/true, /*any_source=*/false});
    if (bytes == 0) return nccl_work::completed(peer);
    void* stream = stream_for(c, explicit_stream);
    settle(c, d);
    check_nccl(c, is_send ? api_.send(buf, bytes, peer, comm_, stream) : api_.recv(buf, bytes, peer, comm_, stream));
    return behind(c, stream, {peer}, is_send ? "the matching recv was not posted" : "no matching send arrived", d, peer);
  }

  // A non-blocking communicator may still be issuing the last call (ncclInProgress): NCCL wants
  // that finished before the next call or an event behind it. Polled against the call's
  // deadline, or issue_timeout for the asynchronous forms.
  void settle(const detail::call_info& c, const deadline* d, const std::vector<int>& awaited = {}) {
    const deadline limit = d != nullptr ? *d : deadline(options_.issue_timeout);
    for (;;) {
      int state = nccl_codes::in_progress;
      const int q = api_.comm_get_async_error(comm_, &state);
      if (q != nccl_codes::success) state = q;
      if (state == nccl_codes::success) return;
      if (state != nccl_codes::in_progress)
        fail(transport_error(detail::describe(c) + ": NCCL reported an asynchronous error while waiting for " +
                             detail::rank_list(awaited.empty() ? others_or_self() : awaited) + ": " +
                             nccl_error(state) + " (aborted with ncclCommAbort)"));
      if (latch_.aborted())
        fail(transport_error(detail::describe(c) + ": the communicator was aborted (abort())"));
      if (limit.passed())
        fail(detail::deadline_error(c, others_or_self(), "NCCL did not finish issuing the previous operation; "
                                                         "aborted with ncclCommAbort"));
      pause(c.started);
    }
  }
  void settle(const detail::call_info& c, const deadline& d) { settle(c, &d); }

  // `waiter` waits for `waited`'s work so far: an event recorded on `waited`, waited on by
  // `waiter`. The event is free again at once (cudaStreamWaitEvent takes its state now).
  void order(const detail::call_info& c, void* waiter, void* waited) {
    if (waiter == waited) return;
    int rc = api_.event_record(event_, waited);
    if (rc != nccl_codes::success)
      fail(transport_error(detail::describe(c) + ": cudaEventRecord on the caller's stream failed: " + cuda_error(rc)));
    rc = api_.stream_wait_event(waiter, event_);
    if (rc != nccl_codes::success)
      fail(transport_error(detail::describe(c) + ": cudaStreamWaitEvent failed: " + cuda_error(rc)));
  }

  // A handle on an event recorded behind what is enqueued on `stream` now.
  nccl_work behind(const detail::call_info& c, void* stream, std::vector<int> awaited, std::string note,
                   const deadline* d, int source = -1) {
    settle(c, d, awaited);
    void* e = acquire_event(c);
    const int rc = api_.event_record(e, stream);
    if (rc != nccl_codes::success) {
      events_->free.push_back(e);
      fail(transport_error(detail::describe(c) + ": cudaEventRecord failed: " + cuda_error(rc)));
    }
    return nccl_work(this, events_, c, e, std::move(awaited), std::move(note), source);
  }

  void* acquire_event(const detail::call_info& c) {
    if (!events_->free.empty()) {
      void* e = events_->free.back();
      events_->free.pop_back();
      return e;
    }
    void* e = nullptr;
    const int rc = api_.event_create(&e);
    if (rc != nccl_codes::success)
      fail(transport_error(detail::describe(c) + ": cudaEventCreateWithFlags failed: " + cuda_error(rc)));
    return e;
  }

  // ---- the work handle's polling ----

  // One look: true when the operation behind `w` is done; throws (and aborts NCCL) on an
  // asynchronous error or abort().
  bool poll(nccl_work& w) {
    int state = nccl_codes::in_progress;
    const int q = api_.comm_get_async_error(comm_, &state);
    if (q != nccl_codes::success) state = q;
    if (state != nccl_codes::success && state != nccl_codes::in_progress)
      fail(transport_error(detail::describe(w.c_) + ": NCCL reported an asynchronous error while waiting for " +
                           detail::rank_list(w.awaited_) + ": " + nccl_error(state) + " (aborted with ncclCommAbort)"));
    const int e = api_.event_query(w.event_);
    if (e == nccl_codes::success) return true;
    if (e != nccl_codes::cuda_not_ready)
      fail(transport_error(detail::describe(w.c_) + ": cudaEventQuery failed while waiting for " +
                           detail::rank_list(w.awaited_) + ": " + cuda_error(e) + " (aborted with ncclCommAbort)"));
    if (latch_.aborted())
      fail(transport_error(detail::describe(w.c_) + ": the communicator was aborted (abort()) while waiting for " +
                           detail::rank_list(w.awaited_)));
    return false;
  }

  void wait_work(nccl_work& w, const deadline& d) {
    const auto since = deadline::clock::now();
    for (;;) {
      if (poll(w)) return;
      if (d.passed())
        fail(detail::deadline_error(w.c_, w.awaited_,
                                    w.note_.empty() ? std::string("aborted with ncclCommAbort")
                                                    : w.note_ + "; aborted with ncclCommAbort"));
      pause(since);
    }
  }

  void pause(deadline::clock::time_point since) const {
    detail::polling_pace{options_.spin_for, options_.poll_sleep, /*yield_while_spinning=*/true}.pause(since);
  }

  // Whom a collective or an init waits for: the others; on a single rank, the device itself,
  // named as this rank (a timeout that names nobody is a bug).
  std::vector<int> others_or_self() const { return detail::others_or_self(rank_, size_); }

  std::string nccl_error(int rc) const {
    const char* s = api_.get_error_string ? api_.get_error_string(rc) : nullptr;
    return std::string(s ? s : "unknown NCCL error") + " (ncclResult_t " + std::to_string(rc) + ")";
  }
  std::string cuda_error(int rc) const {
    const char* s = api_.cuda_error_string ? api_.cuda_error_string(rc) : nullptr;
    return std::string(s ? s : "unknown CUDA error") + " (cudaError_t " + std::to_string(rc) + ")";
  }

  nccl_api api_;
  nccl_options options_;
  int device_ = 0;
  std::thread::id owner_;
  int rank_ = 0;
  int size_ = 1;
  void* comm_ = nullptr;  // null once aborted or destroyed
  void* stream_ = nullptr;
  bool own_stream_ = false;
  bool bad_device_ = false;
  void* event_ = nullptr;                // orders stream() after the caller's stream
  std::shared_ptr<detail::nccl_events> events_ = std::make_shared<detail::nccl_events>();
  std::uint64_t calls_ = 0;
  detail::failure_latch latch_;
};

/// @}

inline void nccl_work::check_alive() const {
  if (!events_ || !events_->alive)
    throw transport_error(detail::describe(c_) + ": its communicator was destroyed");
}

inline bool nccl_work::test() {
  if (done_) return true;
  check_alive();
  comm_->enter(c_);
  if (!comm_->poll(*this)) return false;
  release();
  return true;
}

inline void nccl_work::wait(deadline d) {
  if (done_) return;
  check_alive();
  comm_->enter(c_);
  comm_->wait_work(*this, d);
  release();
}

}  // namespace cadence::transport
