/// \file
/// \ingroup controllers
/// The synchronization-controller concept: what a policy must offer so that trainers, the
/// blocking wrapper, any_controller and the simulator can drive it interchangeably.
#pragma once

#include <cadence/core/types.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence {
/// \addtogroup controllers
/// @{

// Bounds on the parameters that size a controller's memory. Every controller checks them
// where it accepts the parameter (constructor, add_worker, make_controller), so a typo fails
// at once with invalid_parameter_error naming the parameter, its value and the bound, instead
// of allocating gigabytes or throwing std::bad_alloc in the middle of training.

/// Most worker ids one controller issues over its life: the initial workers plus every
/// add_worker() (ids are never reused, so departed workers count). 2^20 is about ten times the
/// largest data-parallel jobs reported (~10^5 accelerators), and per-worker state is tens of
/// bytes (about 21 MiB for SSP at the bound).
inline constexpr std::size_t max_workers = std::size_t{1} << 20;

/// Most push times a controller keeps per worker for its predictor (the `history` parameter of
/// basic_dssp and basic_elastic_bsp). The shipped predictors look at most 64 intervals back
/// (median_interval::max_k) or weigh old ones down geometrically (ewma); 1024 leaves room for
/// a user predictor with a long window while keeping each prediction O(1024).
inline constexpr std::size_t max_history = 1024;

/// Most push times kept over all workers (worker ids x history): 2^24 timestamps, 128 MiB.
/// max_workers with the default history of 16 fits exactly; only a long history on a very
/// large cluster reaches it.
inline constexpr std::size_t max_history_entries = std::size_t{1} << 24;

namespace detail {
template <class C, class = void>
struct is_controller_impl : std::false_type {};

template <class C>
struct is_controller_impl<
    C, std::void_t<
           decltype(std::declval<C&>().push(worker_id{}, timestamp{})),
           decltype(std::declval<C&>().remove_worker(worker_id{})),
           decltype(std::declval<C&>().add_worker()),
           decltype(std::declval<const C&>().worker_capacity()),
           decltype(std::declval<const C&>().clock(worker_id{})),
           decltype(std::declval<const C&>().is_active(worker_id{})),
           decltype(std::declval<const C&>().is_waiting(worker_id{})),
           decltype(std::declval<const C&>().active_workers()),
           decltype(std::declval<const C&>().min_clock()),
           decltype(std::declval<const C&>().staleness(worker_id{})),
           decltype(std::declval<const C&>().max_staleness()),
           decltype(std::declval<const C&>().waiting_for(worker_id{})),
           decltype(std::declval<const C&>().config())>>
    : std::bool_constant<
          std::is_same_v<decltype(std::declval<C&>().push(worker_id{}, timestamp{})), decision> &&
          std::is_convertible_v<decltype(std::declval<C&>().remove_worker(worker_id{})),
                                span<const worker_id>> &&
          std::is_same_v<decltype(std::declval<C&>().add_worker()), worker_id> &&
          std::is_convertible_v<decltype(std::declval<const C&>().clock(worker_id{})),
                                clock_value> &&
          std::is_convertible_v<decltype(std::declval<const C&>().waiting_for(worker_id{})),
                                std::vector<worker_id>> &&
          std::is_convertible_v<decltype(std::declval<const C&>().config()), std::string>> {};

template <class C, class = void>
struct has_prefetch : std::false_type {};
template <class C>
struct has_prefetch<C, std::void_t<decltype(std::declval<const C&>().prefetch(worker_id{}))>>
    : std::true_type {};
}  // namespace detail

/// Tells controller c that worker p will push soon, so that it starts loading p's state into
/// the cache; a no-op for a controller without the hint. Worth it only with many workers
/// (their state beyond the CPU's caches, about 10^5 and up) and when the caller holds the next
/// pushes before making them: hint each one a few pushes (8-16) ahead. Changes nothing, so it
/// is never wrong, only useless, to hint a push that does not come.
template <class C>
void prefetch(const C& c, worker_id p) noexcept {
  if constexpr (detail::has_prefetch<C>::value) c.prefetch(p);
}

/// True when C is a synchronization controller. Requirements, each with its reason, for
/// `C& c`, `const C& cc`, worker_id p and timestamp t:
///  1. c.push(p, t) -> decision. The only hot-path call: after worker p's push at time t, whether
///     p proceeds and whom the push released. Time is an argument so decisions replay exactly.
///  2. c.remove_worker(p) -> span<const worker_id>. A dead or departing worker must release
///     whoever waited only for it, or training deadlocks.
///  3. c.add_worker() -> worker_id. Elastic clusters grow; the new id is returned, not chosen,
///     so ids stay dense and per-worker state can live in vectors.
///  4. cc.worker_capacity() (ids issued so far), cc.clock(p), cc.is_active(p), cc.is_waiting(p),
///     cc.active_workers(), cc.min_clock(), cc.staleness(p), cc.max_staleness(): introspection
///     for tests, metrics and debugging.
///  5. cc.waiting_for(p) -> std::vector<worker_id>: whom a waiting worker waits for, so a
///     timeout can name the stragglers instead of just failing.
///  6. cc.config() -> std::string: the string make_controller() parses back into this policy,
///     so a run can be reported and reproduced.
///
/// Optional, not part of the concept: cc.prefetch(p), a hint that p will push soon (every
/// shipped controller has it; call it through cadence::prefetch, which accepts any
/// controller).
/// The shipped controllers also promise, without the concept being able to check it: a call
/// that throws (push, remove_worker, add_worker) leaves the controller exactly as it was, so a
/// trainer that catches the error can report it and carry on, or retry.
template <class C>
inline constexpr bool is_synchronization_controller_v = detail::is_controller_impl<C>::value;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_synchronization_controller_v (same numbered requirements).
template <class C>
concept synchronization_controller = is_synchronization_controller_v<C>;
#endif

/// @}
}  // namespace cadence

/// Use in templates that take a controller: names the library and the misused type.
/// \ingroup controllers
#define CADENCE_REQUIRE_CONTROLLER(C)                                                          \
  static_assert(::cadence::is_synchronization_controller_v<C>,                                 \
                "cadence: " #C " does not model synchronization_controller (see "              \
                "cadence/controllers/controller.hpp for the required members)")
