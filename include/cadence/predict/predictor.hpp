/// \file
/// \ingroup predict
/// What a push-time predictor is: the C++17 trait is_predictor_v and the C++20 concept
/// cadence::predictor, plus the checks and the strictly-increasing rule every predictor shares.
#pragma once

#include <cadence/core/detail/bits.hpp>

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
#include <concepts>
#endif

namespace cadence {
/// \addtogroup predict
/// @{

namespace detail {

template <class P, class T, class = void>
struct is_predictor_impl : std::false_type {};

template <class P, class T>
struct is_predictor_impl<
    P, T,
    std::void_t<decltype(std::declval<const P&>().predict(std::declval<span<const T>>(),
                                                          std::declval<std::size_t>(),
                                                          std::declval<T*>())),
                decltype(std::declval<const P&>().min_history()),
                decltype(std::declval<const P&>().name())>>
    : std::bool_constant<
          std::is_convertible_v<decltype(std::declval<const P&>().min_history()), std::size_t> &&
          std::is_convertible_v<decltype(std::declval<const P&>().name()), std::string> &&
          std::is_copy_constructible_v<P>> {};

}  // namespace detail

/// True when P is a predictor of timestamps of type T. Requirements, each with its reason:
/// 1. `p.predict(span<const T> history, std::size_t r, T* out)` is callable on a const P:
///    writes the next r push times after history (oldest to newest) into out[0..r). Const
///    because one predictor serves every worker, possibly from several threads.
/// 2. `p.min_history()` converts to std::size_t: the fewest timestamps predict accepts
///    (2 for interval-based predictors), so a controller knows when it may call predict.
/// 3. `p.name()` converts to std::string: the config string that make_predictor parses back
///    ("last", "mean:4", ...), so logs and tools can say which predictor ran.
/// 4. P is copy constructible: predictors are small values; any_predictor copies them.
/// Semantic requirements (not checkable): out is strictly increasing and its first value is
/// above history.back(); predict does not allocate; it throws invalid_parameter_error when the
/// history is shorter than min_history() and time_error on non-finite, decreasing or
/// overflowing times.
template <class P, class T = double>
inline constexpr bool is_predictor_v = detail::is_predictor_impl<P, T>::value;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_predictor_v (same numbered requirements).
template <class P, class T = double>
concept predictor = requires(const P& p, span<const T> history, std::size_t r, T* out) {
  p.predict(history, r, out);
  { p.min_history() } -> std::convertible_to<std::size_t>;
  { p.name() } -> std::convertible_to<std::string>;
} && std::copy_constructible<P>;
#endif

namespace detail {

/// Checks a push history against the predictor contract (length, finite, non-decreasing).
template <class T>
void check_history(span<const T> history, std::size_t min_history, const char* who) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                "cadence predictors: T must be an integer or floating-point timestamp type");
  if (history.size() < min_history)
    throw invalid_parameter_error(std::string("cadence::") + who + ": needs at least " +
                                  std::to_string(min_history) + " push timestamps, got " +
                                  std::to_string(history.size()));
  for (std::size_t i = 0; i < history.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(history[i]))
        throw time_error(std::string("cadence::") + who + ": history index " +
                         std::to_string(i) + " is not finite");
    }
    if (i > 0 && history[i] < history[i - 1])
      throw time_error(std::string("cadence::") + who + ": history goes back in time at index " +
                       std::to_string(i));
  }
}

[[noreturn]] inline void prediction_overflow(const char* who, std::size_t i) {
  throw time_error(std::string("cadence::") + who + ": predicted push " + std::to_string(i) +
                   " does not fit the timestamp type");
}

/// t + i * step for integers, checked; step >= 0.
template <class T>
T advance(T t, std::size_t i, T step, const char* who) {
  if constexpr (std::is_integral_v<T>) {
    T di;
    T r;
    if (i > static_cast<std::size_t>(std::numeric_limits<T>::max()) ||
        detail::mul_overflows(static_cast<T>(i), step, &di) || detail::add_overflows(t, di, &r))
      prediction_overflow(who, i);
    return r;
  } else {
    return static_cast<T>(t + static_cast<T>(i) * step);
  }
}

/// Enforces "strictly increasing, first above last": a value not above its predecessor
/// (history.back() for out[0]) becomes the next representable value above the predecessor
/// (+1 for integers, std::nextafter for floating point). Also rejects non-finite results.
template <class T>
void make_strictly_increasing(T last, T* out, std::size_t r, const char* who) {
  T prev = last;
  for (std::size_t i = 0; i < r; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(out[i])) prediction_overflow(who, i + 1);
      if (!(out[i] > prev)) {
        out[i] = std::nextafter(prev, std::numeric_limits<T>::infinity());
        if (!std::isfinite(out[i])) prediction_overflow(who, i + 1);
      }
    } else {
      if (!(out[i] > prev)) {
        if (prev == std::numeric_limits<T>::max()) prediction_overflow(who, i + 1);
        out[i] = static_cast<T>(prev + 1);
      }
    }
    prev = out[i];
  }
}

}  // namespace detail
/// @}
}  // namespace cadence
