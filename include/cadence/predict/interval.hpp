/// \file
/// \ingroup predict
/// The interval predictors: the paper's last_interval and the robust mean_interval,
/// median_interval and ewma. Each extrapolates the worker's push interval linearly.
#pragma once

#include <cadence/core/detail/bits.hpp>

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/predict/predictor.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>

namespace cadence {
/// \addtogroup predict
/// @{

namespace detail {

/// Interval between history[j-1] and history[j] (history is non-decreasing), checked.
template <class T>
T interval_at(span<const T> h, std::size_t j, const char* who) {
  if constexpr (std::is_integral_v<T>) {
    T d;
    if (detail::sub_overflows(h[j], h[j - 1], &d))
      throw time_error(std::string("cadence::") + who + ": interval at history index " +
                       std::to_string(j) + " does not fit the timestamp type");
    return d;
  } else {
    return static_cast<T>(h[j] - h[j - 1]);
  }
}

/// t + round(i * (a + b) / 2) for integers (half up), with a <= b; t + i*(a + (b-a)/2) else.
template <class T>
T advance_half(T t, std::size_t i, T a, T b, const char* who) {
  if constexpr (std::is_integral_v<T>) {
    const T base = advance(t, i, a, who);
    const T extra = advance(T{0}, i, static_cast<T>(b - a), who);
    T r;
    if (detail::add_overflows(base, static_cast<T>(extra / 2 + extra % 2), &r))
      prediction_overflow(who, i);
    return r;
  } else {
    return static_cast<T>(t + static_cast<T>(i) * static_cast<T>(a + (b - a) / 2));
  }
}

inline std::string format_double(double v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

/// What mean_interval and median_interval share: k, the most of the last intervals they read,
/// and the two push times (one interval) they need at the least.
class last_k_intervals {
public:
  /// Two push times: the fewest that hold an interval.
  static constexpr std::size_t min_history() noexcept { return 2; }
  /// The most intervals read: averaged by mean_interval, their median taken by median_interval.
  std::size_t k() const noexcept { return k_; }

protected:
  explicit last_k_intervals(std::size_t k) noexcept : k_(k) {}

private:
  std::size_t k_;
};

}  // namespace detail

/// The paper's predictor: e[i] = t_last + i * (t_last - t_prev), i = 1..r. Exact for
/// integers. Pick it for workers with steady iteration times (it reacts at once to a change,
/// but also to a single outlier).
class last_interval {
public:
  /// Writes the r push times after history (oldest first) into out[0..r), as is_predictor_v
  /// requires: throws invalid_parameter_error for fewer than min_history() times, time_error
  /// for a non-finite or decreasing history or a prediction T cannot hold.
  template <class T>
  void predict(span<const T> history, std::size_t r, T* out) const {
    detail::check_history(history, min_history(), "last_interval");
    const std::size_t h = history.size();
    const T t = history[h - 1];
    const T step = detail::interval_at(history, h - 1, "last_interval");
    for (std::size_t i = 0; i < r; ++i) out[i] = detail::advance(t, i + 1, step, "last_interval");
    detail::make_strictly_increasing(t, out, r, "last_interval");
  }
  /// Two push times: the fewest that hold an interval.
  static constexpr std::size_t min_history() noexcept { return 2; }
  /// "last": the config string make_predictor parses back into this predictor.
  std::string name() const { return "last"; }
};

/// Mean of the last k intervals (fewer when the history is shorter):
/// e[i] = t_last + i * (t_last - t_{last-m}) / m with m the intervals used. Integers round
/// i * mean to the nearest value (halves up), computed exactly. Pick it for noisy but
/// stationary iteration times.
class mean_interval : public detail::last_k_intervals {
public:
  /// Averages the last k intervals; throws invalid_parameter_error for k = 0.
  explicit mean_interval(std::size_t k) : last_k_intervals(k) {
    if (k == 0) throw invalid_parameter_error("cadence::mean_interval: k must be >= 1, got 0");
  }
  /// Writes the r push times after history (oldest first) into out[0..r), as is_predictor_v
  /// requires: throws invalid_parameter_error for fewer than min_history() times, time_error
  /// for a non-finite or decreasing history or a prediction T cannot hold.
  template <class T>
  void predict(span<const T> history, std::size_t r, T* out) const {
    detail::check_history(history, min_history(), "mean_interval");
    const std::size_t h = history.size();
    const std::size_t m = std::min(k(), h - 1);
    const T t = history[h - 1];
    if constexpr (std::is_integral_v<T>) {
      T total;
      if (detail::sub_overflows(t, history[h - 1 - m], &total))
        detail::prediction_overflow("mean_interval", 1);
      // i * total / m = i * q + i * rem / m, so no product exceeds i * m.
      const auto mm = static_cast<unsigned long long>(m);
      const auto q = static_cast<T>(static_cast<unsigned long long>(total) / mm);
      const auto rem = static_cast<unsigned long long>(total) % mm;
      for (std::size_t i = 0; i < r; ++i) {
        const T base = detail::advance(t, i + 1, q, "mean_interval");
        unsigned long long frac;
        if (detail::mul_overflows(static_cast<unsigned long long>(i + 1), rem, &frac))
          detail::prediction_overflow("mean_interval", i + 1);
        frac = frac / mm + ((frac % mm) * 2 >= mm ? 1 : 0);
        T v;
        if (frac > static_cast<unsigned long long>(std::numeric_limits<T>::max()) ||
            detail::add_overflows(base, static_cast<T>(frac), &v))
          detail::prediction_overflow("mean_interval", i + 1);
        out[i] = v;
      }
    } else {
      const T step = static_cast<T>((t - history[h - 1 - m]) / static_cast<T>(m));
      for (std::size_t i = 0; i < r; ++i) out[i] = detail::advance(t, i + 1, step, "mean_interval");
    }
    detail::make_strictly_increasing(t, out, r, "mean_interval");
  }
  /// "mean:K": the config string make_predictor parses back into this predictor.
  std::string name() const { return "mean:" + std::to_string(k()); }
};

/// Median of the last k intervals (fewer when the history is shorter); an even count takes
/// the mean of the two middle intervals (integers: i * that mean rounded half up).
/// e[i] = t_last + i * median. Pick it when occasional stragglers (one slow iteration) should
/// not move the prediction. k <= max_k: the intervals are sorted in a fixed stack buffer so
/// predict never allocates.
class median_interval : public detail::last_k_intervals {
public:
  /// The largest k: the size of the stack buffer predict sorts in.
  static constexpr std::size_t max_k = 64;

  /// The median of the last k intervals; throws invalid_parameter_error unless 1 <= k <= max_k.
  explicit median_interval(std::size_t k) : last_k_intervals(k) {
    if (k == 0 || k > max_k)
      throw invalid_parameter_error("cadence::median_interval: k must be in [1, " +
                                    std::to_string(max_k) + "], got " + std::to_string(k));
  }
  /// Writes the r push times after history (oldest first) into out[0..r), as is_predictor_v
  /// requires: throws invalid_parameter_error for fewer than min_history() times, time_error
  /// for a non-finite or decreasing history or a prediction T cannot hold.
  template <class T>
  void predict(span<const T> history, std::size_t r, T* out) const {
    detail::check_history(history, min_history(), "median_interval");
    const std::size_t h = history.size();
    const std::size_t m = std::min(k(), h - 1);
    std::array<T, max_k> buf;
    for (std::size_t j = 0; j < m; ++j)
      buf[j] = detail::interval_at(history, h - 1 - j, "median_interval");
    for (std::size_t j = 1; j < m; ++j) {  // insertion sort: m <= 64
      const T v = buf[j];
      std::size_t q = j;
      for (; q > 0 && v < buf[q - 1]; --q) buf[q] = buf[q - 1];
      buf[q] = v;
    }
    const T t = history[h - 1];
    const T a = buf[(m - 1) / 2], b = buf[m / 2];
    for (std::size_t i = 0; i < r; ++i)
      out[i] = detail::advance_half(t, i + 1, a, b, "median_interval");
    detail::make_strictly_increasing(t, out, r, "median_interval");
  }
  /// "median:K": the config string make_predictor parses back into this predictor.
  std::string name() const { return "median:" + std::to_string(k()); }
};

/// Exponentially weighted mean of all intervals in the history, oldest first:
/// s = I_1, then s = alpha * I_j + (1 - alpha) * s; e[i] = t_last + i * s. Computed in double
/// (long double for long double timestamps); integers round t_last + i * s to the nearest.
/// Pick it when iteration times drift (alpha near 1 follows fast, near 0 smooths hard).
class ewma {
public:
  /// Weight alpha on the newest interval; throws invalid_parameter_error unless
  /// 0 < alpha <= 1 (alpha = 1 is last_interval computed in floating point).
  explicit ewma(double alpha) : alpha_(alpha) {
    if (!(alpha > 0.0 && alpha <= 1.0))
      throw invalid_parameter_error("cadence::ewma: alpha must be in (0, 1], got " +
                                    detail::format_double(alpha));
  }
  /// Writes the r push times after history (oldest first) into out[0..r), as is_predictor_v
  /// requires: throws invalid_parameter_error for fewer than min_history() times, time_error
  /// for a non-finite or decreasing history or a prediction T cannot hold.
  template <class T>
  void predict(span<const T> history, std::size_t r, T* out) const {
    using F = std::conditional_t<std::is_same_v<T, long double>, long double, double>;
    detail::check_history(history, min_history(), "ewma");
    const std::size_t h = history.size();
    const auto a = static_cast<F>(alpha_);
    F s = static_cast<F>(detail::interval_at(history, 1, "ewma"));
    for (std::size_t j = 2; j < h; ++j)
      s = a * static_cast<F>(detail::interval_at(history, j, "ewma")) + (1 - a) * s;
    const T t = history[h - 1];
    for (std::size_t i = 0; i < r; ++i) {
      const F step = static_cast<F>(i + 1) * s;
      if constexpr (std::is_integral_v<T>) {
        const F rounded = std::round(step);
        // Convert only values the type can hold (the bound is exact: a power of two).
        if (!(rounded < std::ldexp(F(1), std::numeric_limits<T>::digits)))
          detail::prediction_overflow("ewma", i + 1);
        T v;
        if (detail::add_overflows(t, static_cast<T>(rounded), &v))
          detail::prediction_overflow("ewma", i + 1);
        out[i] = v;
      } else {
        out[i] = static_cast<T>(static_cast<F>(t) + step);
      }
    }
    detail::make_strictly_increasing(t, out, r, "ewma");
  }
  /// Two push times: the fewest that hold an interval.
  static constexpr std::size_t min_history() noexcept { return 2; }
  /// "ewma:ALPHA" with the shortest decimal that reads back as alpha, so make_predictor
  /// rebuilds this predictor exactly.
  std::string name() const { return "ewma:" + detail::format_double(alpha_); }
  /// The weight on the newest interval.
  double alpha() const noexcept { return alpha_; }

private:
  double alpha_;
};

static_assert(is_predictor_v<last_interval, double> && is_predictor_v<mean_interval, long> &&
                  is_predictor_v<median_interval, float> && is_predictor_v<ewma, int>,
              "cadence: the built-in predictors must satisfy is_predictor_v");

/// @}
}  // namespace cadence
