/// \file
/// \ingroup transport
/// The communicator concept: what a transport backend (in-process threads, MPI, gloo, NCCL,
/// ZeroMQ) must offer so that exchange adapters are written once and run over any of them. The
/// numbered requirements, the failure contract every backend obeys and the optional extensions
/// (try_recv, the asynchronous operations, the averaging all-reduce, peer_lost) are written out
/// in this header beside the trait that checks each; the guide is `docs/transports.md`.
#pragma once

#include <cadence/core/error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

namespace cadence::transport {
/// \addtogroup transport
/// @{

/// Element types of all-reduce. Host backends reduce f32, f64, i32, i64 and u8; f16 and bf16
/// exist for backends whose buffers live on the device (NCCL), where the reduction runs there.
enum class dtype : std::uint8_t { f32, f64, i32, i64, u8, f16, bf16 };

/// Bytes per element of `t`.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::f64:
    case dtype::i64: return 8;
    case dtype::f32:
    case dtype::i32: return 4;
    case dtype::f16:
    case dtype::bf16: return 2;
    case dtype::u8: return 1;
  }
  return 0;
}

/// The name of `t` as error messages write it ("f32"), or "unknown dtype".
constexpr const char* dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
  }
  return "unknown dtype";
}

/// The dtype of a C++ element type: `dtype_of_v<float> == dtype::f32`. Only the host types
/// have one; f16 and bf16 have no standard C++17 type.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <>
struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <>
struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <>
struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <>
struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
/// The dtype of element type T (dtype_of<T>::value).
template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>::value;

/// Reductions every backend performs natively. Averaging is a sum followed by a scale
/// (allreduce_avg in collectives.hpp), as c10d does on backends without a native average.
enum class reduce_op : std::uint8_t { sum, min, max };

/// The name of `op` as error messages write it ("sum"), or "unknown op".
constexpr const char* reduce_op_name(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
  }
  return "unknown op";
}

/// recv()'s `src` for "whichever rank sends first"; only where capabilities().any_source.
inline constexpr int any_source = -1;

/// Tags run from 0 to max_tag on every backend: the range MPI guarantees everywhere.
inline constexpr int max_tag = 32767;

/// What a backend can do beyond the concept's minimum, so adapters choose a protocol (or
/// refuse) at run time instead of hanging on a backend that cannot deliver.
struct capability_flags {
  /// recv() accepts any_source. NCCL cannot: a parameter server over NCCL needs a control
  /// communicator that can.
  bool any_source = false;
  /// A peer that crashes surfaces as a transport_error naming it before the deadline (a closed
  /// connection, a dead thread). Without it, only the deadline catches a crashed peer.
  bool detects_lost_peer = false;
  /// The surviving ranks keep running after a peer crashes (their communicator may have
  /// failed; they can build a new one among themselves). Open MPI 4.1 kills the whole job.
  bool survives_lost_peer = false;
  /// Losing a peer fails only the point-to-point calls that need it (sends to it, receives
  /// from it, an any_source receive whose every candidate is lost), not the communicator:
  /// failed() stays false and traffic with the other ranks goes on, so a parameter server
  /// drops a crashed worker and serves the others. A message of another size than its receive
  /// fails that receive alone too (peer_error naming the sender). A collective that loses a
  /// peer still fails the communicator (rule b). The in-process and ZeroMQ backends do this;
  /// gloo and MPI do not (yet).
  bool isolates_lost_peer = false;
  /// Buffers are device pointers (NCCL); host-side helpers refuse such communicators.
  bool device_buffers = false;
};

/// When a blocking call must give up: a point on the steady clock. Every blocking call takes
/// one, so no call can hang forever. Default-constructed it is finite: 60 s from its creation,
/// which for a defaulted argument is the call itself. A duration converts implicitly, so
/// `comm.recv(buf, n, 0, tag, 5s)` reads as "within five seconds". A deadline that has already
/// passed when a call starts is a caller error, not a timeout: the call throws
/// invalid_parameter_error before touching the network.
class deadline {
public:
  /// The steady clock deadlines are points on: a change of the wall clock moves no deadline.
  using clock = std::chrono::steady_clock;
  /// How far away a default-constructed deadline is.
  static constexpr std::chrono::seconds default_timeout{60};

  /// A deadline default_timeout (60 s) from now.
  deadline() : at_(clock::now() + default_timeout) {}
  /// A deadline `from_now` after now; a duration too long for the clock (hours::max()) gives
  /// the clock's last point instead of overflowing into the past.
  template <class Rep, class Period>
  deadline(std::chrono::duration<Rep, Period> from_now)  // NOLINT: implicit on purpose
      : at_(after(clock::now(), from_now)) {}

  /// A deadline at the absolute time `when`, shared by several calls ("all of this within
  /// 10 s").
  static deadline at(clock::time_point when) noexcept { return deadline(when, 0); }

  /// The point on the steady clock at which it passes.
  clock::time_point time_point() const noexcept { return at_; }
  /// Whether it has passed at time `now`.
  bool passed(clock::time_point now = clock::now()) const noexcept { return now >= at_; }
  /// Time left at time `now`, zero once passed.
  clock::duration remaining(clock::time_point now = clock::now()) const noexcept {
    return now >= at_ ? clock::duration::zero() : at_ - now;
  }

private:
  deadline(clock::time_point when, int) noexcept : at_(when) {}

  // now + d, saturating: "wait practically forever" (hours::max()) must not overflow into
  // the past.
  template <class Rep, class Period>
  static clock::time_point after(clock::time_point now, std::chrono::duration<Rep, Period> d) {
    using period_duration = std::chrono::duration<long double, Period>;
    const long double left =
        std::chrono::duration_cast<period_duration>(clock::time_point::max() - now).count();
    if (static_cast<long double>(d.count()) >= left) return clock::time_point::max();
    return now + std::chrono::duration_cast<clock::duration>(d);
  }
  clock::time_point at_;
};

// A type C is a communicator when, for `C& c`, `const C& cc`, a buffer `void* buf`,
// `const void* cbuf`, std::size_t n, dtype t, reduce_op op, int peer, int tag, deadline d:
//  1. cc.rank(), cc.size() -> int, 0 <= rank < size. Adapters derive roles (server, worker)
//     from ranks, so both must be known without communicating.
//  2. c.allreduce(buf, n, t, op, d): n elements of t, reduced in place across all ranks. In
//     place because gradients already sit in the buffer the optimizer reads; a second buffer
//     would double the memory of the largest tensors.
//  3. c.broadcast(buf, n, root, d): n bytes from `root` into every rank's buf. Initial weights
//     and plans start on one rank.
//  4. c.send(cbuf, n, dst, tag, d) and c.recv(buf, n, src, tag, d) -> int (the sender's rank):
//     n bytes, matched by (source, tag), in order per (source, tag), tags in [0, max_tag].
//     recv's byte count must equal send's: a difference is reported, not truncated. A
//     parameter server needs point to point traffic, and with src == any_source (where
//     capabilities().any_source) it serves whichever worker pushes first, hence the returned
//     rank.
//  5. c.abort() noexcept, idempotent, callable from any thread; cc.failed() -> bool. A
//     watchdog or a failing peer's handler must be able to stop a communicator without
//     knowing its state (a call blocked on the owning thread then throws), and callers must be
//     able to ask whether it is still usable.
//  6. cc.capabilities() -> capability_flags, so adapters choose protocols at run time.
// try_recv and the asynchronous operations (below) are optional extensions. Every blocking
// call (2-4) takes the deadline as its last argument, and all backends obey one
// failure contract (docs/transports.md):
//  a. A call that misses its deadline or sees a peer vanish throws transport_error naming the
//     operation, its sequence number on this communicator, this rank and the peer(s) waited
//     for. A timeout that names no rank is a bug.
//  b. The first failure marks the communicator failed; every later call throws the original
//     error at once. Nothing retries silently. After abort() (with no failure before it) every
//     call throws transport_error naming itself.
//     One exception, where capabilities().isolates_lost_peer: a point-to-point call that
//     fails only because of its peer (the peer is lost, or its message has another size than
//     the receive: peer_error, naming it) throws without marking the communicator failed
//     (failed() stays false, calls with the other ranks go on), so one crashed or broken
//     process does not take a parameter server down with it.
//  c. No call outlives its deadline by more than a polling interval.
//  d. Bad arguments (null buffer with a nonzero size, rank or root out of range, a negative
//     tag, a deadline already passed) throw invalid_parameter_error naming the operation and
//     rank, and leave the communicator usable. Arguments that disagree across ranks (sizes,
//     dtypes, ops, roots), where the backend can see them, fail the call with transport_error.

namespace detail {
template <class C, class = void>
struct is_communicator_impl : std::false_type {};

template <class C>
struct is_communicator_impl<
    C, std::void_t<decltype(std::declval<const C&>().rank()),
                   decltype(std::declval<const C&>().size()),
                   decltype(std::declval<C&>().allreduce(std::declval<void*>(), std::size_t{},
                                                         dtype{}, reduce_op{},
                                                         std::declval<deadline>())),
                   decltype(std::declval<C&>().broadcast(std::declval<void*>(), std::size_t{},
                                                         int{}, std::declval<deadline>())),
                   decltype(std::declval<C&>().send(std::declval<const void*>(), std::size_t{},
                                                    int{}, int{}, std::declval<deadline>())),
                   decltype(std::declval<C&>().recv(std::declval<void*>(), std::size_t{}, int{},
                                                    int{}, std::declval<deadline>())),
                   decltype(std::declval<C&>().abort()),
                   decltype(std::declval<const C&>().failed()),
                   decltype(std::declval<const C&>().capabilities())>>
    : std::bool_constant<
          std::is_convertible_v<decltype(std::declval<const C&>().rank()), int> &&
          std::is_convertible_v<decltype(std::declval<const C&>().size()), int> &&
          std::is_convertible_v<decltype(std::declval<C&>().recv(std::declval<void*>(),
                                                                 std::size_t{}, int{}, int{},
                                                                 std::declval<deadline>())),
                                int> &&
          noexcept(std::declval<C&>().abort()) &&
          std::is_convertible_v<decltype(std::declval<const C&>().failed()), bool> &&
          std::is_same_v<std::decay_t<decltype(std::declval<const C&>().capabilities())>,
                         capability_flags>> {};
}  // namespace detail

/// Whether C models the communicator concept (requirements 1-6 above in this header, as far as
/// types can say): the C++17 form of the concept.
template <class C>
inline constexpr bool is_communicator_v = detail::is_communicator_impl<C>::value;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_communicator_v (same numbered requirements).
template <class C>
concept communicator = is_communicator_v<C>;
#endif

namespace detail {
// The detection idiom (std::experimental::detected_t): the type of the expression alias
// Op<Args...>, or `none` where that expression is ill-formed. Each optional extension below is
// an alias for its call and a test of what the call returns, not a pair of specializations.
struct none {
  none() = delete;
  none(const none&) = delete;
  ~none() = delete;
};
template <class Void, template <class...> class Op, class... Args>
struct detector {
  using type = none;
};
template <template <class...> class Op, class... Args>
struct detector<std::void_t<Op<Args...>>, Op, Args...> {
  using type = Op<Args...>;
};
template <template <class...> class Op, class... Args>
using detected_t = typename detector<void, Op, Args...>::type;
// Whether Op<Args...> is well-formed.
template <template <class...> class Op, class... Args>
inline constexpr bool is_detected_v = !std::is_same_v<detected_t<Op, Args...>, none>;
// Whether Op<Args...> is well-formed and converts to To (none converts to nothing).
template <class To, template <class...> class Op, class... Args>
inline constexpr bool detected_convertible_v = std::is_convertible_v<detected_t<Op, Args...>, To>;
}  // namespace detail

// An optional extension: c.try_recv(buf, n, src, tag, d) -> std::optional<int>. The same as
// recv(), except that a deadline passing before a matching message has arrived is not a
// failure: it returns std::nullopt, consumes nothing and leaves the communicator usable; a
// deadline already passed polls once. A server that must also act on time (evict a silent
// worker) waits for "the next message or the next liveness deadline" with it, which recv()
// cannot express: its deadline fails the communicator. Every other error is recv()'s.
namespace detail {
template <class C>
using try_recv_t =
    decltype(std::declval<C&>().try_recv(std::declval<void*>(), std::size_t{}, int{}, int{}, std::declval<deadline>()));
}  // namespace detail

/// Whether C offers try_recv (the in-process, MPI and gloo backends do).
template <class C>
inline constexpr bool has_try_recv_v = detail::detected_convertible_v<std::optional<int>, detail::try_recv_t, C>;

// ---- asynchronous operations (an optional extension) ----
//
// c.iallreduce(buf, n, t, op), c.ibroadcast(buf, n, root), c.isend(cbuf, n, dst, tag) and
// c.irecv(buf, n, src, tag) start what the blocking call does and return a work handle at once,
// so a caller overlaps communication with computation (a bucket all-reduced while backward
// still runs) or serves other peers while one transfer is outstanding (a parameter server
// replying to a worker that has stopped). The blocking calls are the async form waited at once.
// Arguments are checked at the call (invalid_parameter_error, as for the blocking form). For a
// work handle W and `W& w`:
//  1. w.test() -> bool: makes progress without blocking; true once the operation completed.
//     Once it failed, test() throws what the blocking call would have thrown, with the same
//     effect on the communicator. test() never fails on time: it has no deadline.
//  2. w.wait(deadline d): returns once the operation completed; throws as the blocking call
//     does, and when d passes throws the deadline's transport_error naming the operation and the
//     peers still awaited, failing the communicator (rule b; a point-to-point operation whose
//     only fault is a lost peer fails alone where isolates_lost_peer).
//  3. w.source() -> int: the sender of a completed irecv (any_source); the peer otherwise.
//  4. w.cancel() noexcept -> bool: withdraws the operation if the backend can. True: nothing
//     will touch the buffer any more (the handle is complete, cancelled). False: the operation
//     may still complete from or into the buffer later (MPI cannot withdraw a send or a posted
//     collective), so the buffer must stay valid until the communicator is destroyed. Destroying
//     an incomplete handle cancels it.
//  5. Handles are movable, not copyable; a default-constructed or moved-from handle is complete.
//     Only the communicator's owning thread uses them.
// Order is issue order: the k-th collective started on every rank meets the k-th, receives match
// messages in the order they were posted (FIFO per source and tag), whatever the order of the
// tests and waits. Buffers stay the caller's: valid, and for sends and collectives unchanged,
// until the handle completes (or see 4).
namespace detail {
template <class W>
using test_t = decltype(std::declval<W&>().test());
template <class W>
using wait_t = decltype(std::declval<W&>().wait(std::declval<deadline>()));
template <class W>
using source_t = decltype(std::declval<const W&>().source());
template <class W>
using noexcept_cancel_t = std::enable_if_t<noexcept(std::declval<W&>().cancel())>;

template <class C>
using iallreduce_t = decltype(std::declval<C&>().iallreduce(std::declval<void*>(), std::size_t{}, dtype{}, reduce_op{}));
template <class C>
using ibroadcast_t = decltype(std::declval<C&>().ibroadcast(std::declval<void*>(), std::size_t{}, int{}));
template <class C>
using isend_t = decltype(std::declval<C&>().isend(std::declval<const void*>(), std::size_t{}, int{}, int{}));
template <class C>
using irecv_t = decltype(std::declval<C&>().irecv(std::declval<void*>(), std::size_t{}, int{}, int{}));
}  // namespace detail

/// Whether W models a work handle (requirements 1-5 above, as far as types can say).
template <class W>
inline constexpr bool is_work_v =
    detail::detected_convertible_v<bool, detail::test_t, W> && detail::is_detected_v<detail::wait_t, W> &&
    detail::detected_convertible_v<int, detail::source_t, W> && detail::is_detected_v<detail::noexcept_cancel_t, W> &&
    std::is_move_constructible_v<W> && !std::is_copy_constructible_v<W>;

/// Whether C offers the asynchronous operations (iallreduce, ibroadcast, isend, irecv).
template <class C>
inline constexpr bool has_async_v =
    is_work_v<detail::detected_t<detail::iallreduce_t, C>> && is_work_v<detail::detected_t<detail::ibroadcast_t, C>> &&
    is_work_v<detail::detected_t<detail::isend_t, C>> && is_work_v<detail::detected_t<detail::irecv_t, C>>;

// ---- averaging all-reduce (an optional extension) ----
//
// c.allreduce_average(buf, n, t, d), and with the asynchronous operations
// c.iallreduce_average(buf, n, t) -> a work handle: n elements of t (f32 or f64) replaced in place
// by their mean over the ranks, the division done inside the backend's own last pass over the data
// (the ring's last reduce step, the small path's copy-out), so data-parallel averaging costs no
// pass of its own. On the host backends the result equals a sum all-reduce followed by a division
// by size() (correctly rounded, so exact whenever the mean is representable; multiplication by
// the reciprocal when size() is a power of two, which is the same); NCCL uses ncclAvg, which
// multiplies each input by 1/size() before summing (exact when size() is a power of two and the
// sums are). An integer dtype is refused with invalid_parameter_error (an integer mean would have
// to round). It is a collective of its own: every rank must call the averaging form for the same
// collective (a sum on one rank and an average on another is an argument mismatch).
namespace detail {
template <class C>
using allreduce_average_t = decltype(std::declval<C&>().allreduce_average(std::declval<void*>(), std::size_t{},
                                                                          dtype{}, std::declval<deadline>()));
template <class C>
using iallreduce_average_t =
    decltype(std::declval<C&>().iallreduce_average(std::declval<void*>(), std::size_t{}, dtype{}));
}  // namespace detail

/// Whether C offers allreduce_average (the in-process, MPI, gloo and NCCL backends do).
template <class C>
inline constexpr bool has_allreduce_average_v = detail::is_detected_v<detail::allreduce_average_t, C>;
/// Whether C offers iallreduce_average, returning a work handle.
template <class C>
inline constexpr bool has_async_average_v = is_work_v<detail::detected_t<detail::iallreduce_average_t, C>>;

// ---- lost peers (an optional extension) ----
//
// c.peer_lost(r) -> bool: true once the backend knows that rank r is gone (its connection
// closed, its heartbeats stopped, it was killed or destroyed its communicator), without a call
// to r; false while r is alive, not yet arrived, or back under a new incarnation. Current as of
// this rank's last call into the communicator; whatever r sent before it was lost is delivered
// first. Owning thread only. A parameter server drops a lost worker at once instead of at its
// liveness deadline, so survivors waiting for it (BSP) go on without waiting evict_after.
namespace detail {
template <class C>
using peer_lost_t = decltype(std::declval<const C&>().peer_lost(int{}));
}  // namespace detail

/// Whether C offers peer_lost (the in-process and ZeroMQ backends do).
template <class C>
inline constexpr bool has_peer_lost_v = detail::detected_convertible_v<bool, detail::peer_lost_t, C>;

// ---- absent peers (an optional extension) ----
//
// c.peer_absent(r) -> bool: true while no process has ever taken rank r's slot (a job whose
// ranks may start after the others: ZeroMQ's zmq_wait_for::self); false once one has, even
// after it is lost. The membership layer counts a slot still absent an op timeout after start()
// as lost while the first quorum forms, so a first member that never comes (the leader
// included) costs that wait instead of the job. Owning thread only.
namespace detail {
template <class C>
using peer_absent_t = decltype(std::declval<const C&>().peer_absent(int{}));
}  // namespace detail

/// Whether C offers peer_absent (the ZeroMQ backend does).
template <class C>
inline constexpr bool has_peer_absent_v = detail::detected_convertible_v<bool, detail::peer_absent_t, C>;

/// @}
}  // namespace cadence::transport

/// Use in templates that take a communicator: names the library and the misused type.
/// \ingroup transport
#define CADENCE_REQUIRE_COMMUNICATOR(C)                                                        \
  static_assert(::cadence::transport::is_communicator_v<C>,                                    \
                "cadence: " #C " does not model transport::communicator (see "                 \
                "cadence/transport/communicator.hpp for the required members)")
