// The paper's last-interval predictor on the device for zipline_thrust_predicted. It gives
// exactly what the CPU last_interval predictor (cadence/predict/interval.hpp) gives for the
// same two pushes, including equal pushes and intervals lost to rounding.
#pragma once

#include <cadence/core/detail/bits.hpp>

#include <cadence/thrust/config.hpp>
#include <cadence/thrust/detail/device.hpp>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

namespace cadence::detail {

// e[i] = t_last + i * (t_last - t_prev), evaluated with the host's rounding on the device (no
// fused multiply-add) so both sides agree to the bit.
template <class T>
CADENCE_HOST_DEVICE T zl_last_interval(T t_prev, T t_last, zl_index i) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, double>) {
    return __dadd_rn(t_last, __dmul_rn(static_cast<double>(i), __dsub_rn(t_last, t_prev)));
  } else if constexpr (std::is_same_v<T, float>) {
    return __fadd_rn(t_last, __fmul_rn(static_cast<float>(i), __fsub_rn(t_last, t_prev)));
  } else {
    return static_cast<T>(t_last + static_cast<T>(i) * static_cast<T>(t_last - t_prev));
  }
#else
  return static_cast<T>(t_last + static_cast<T>(i) * static_cast<T>(t_last - t_prev));
#endif
}

// The next representable value above x: +1 for integers, nextafter towards infinity for
// floating point, as detail::make_strictly_increasing substitutes it on the host.
template <class T>
CADENCE_HOST_DEVICE T zl_next_above(T x) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(x + 1);
  } else {
#if defined(__CUDA_ARCH__)
    // std::nextafter and std::numeric_limits are host functions; CUDA's C functions are not.
    if constexpr (std::is_same_v<T, float>) {
      return ::nextafterf(x, HUGE_VALF);
    } else {
      return ::nextafter(x, HUGE_VAL);
    }
#else
    return std::nextafter(x, std::numeric_limits<T>::infinity());
#endif
  }
}

// Worker p's r predictions as last_interval::predict makes them: e[i] for i = 1..r, each one
// that is not above its predecessor (t_last for the first) replaced by the next value above
// that predecessor. The replacement depends on the value before it, so one thread walks one
// row; r is the lookahead (tens to hundreds), and there is one thread per worker.
template <class T>
struct zl_predict_row {
  const T* previous;
  const T* last;
  T* out;  // n x r, row-major
  zl_index r;
  CADENCE_HOST_DEVICE void operator()(zl_index p) const {
    T* const row = out + static_cast<std::size_t>(p) * r;
    const T t_prev = previous[p], t_last = last[p];
    T before = t_last;
    for (zl_index i = 0; i < r; ++i) {
      T e = zl_last_interval(t_prev, t_last, i + 1);
      if (!(e > before)) e = zl_next_above(before);
      row[i] = e;
      before = e;
    }
  }
};

// Writes the n x r predictions of n workers whose previous and last pushes are in device
// memory to out (device memory, row-major).
template <class T, class Policy>
void zl_predict_last_interval(const Policy& pol, const T* previous, const T* last, std::size_t n,
                              std::size_t r, T* out) {
  const ::thrust::counting_iterator<zl_index> zero(0);
  ::thrust::for_each(pol, zero, zero + static_cast<zl_index>(n),
                     zl_predict_row<T>{previous, last, out, static_cast<zl_index>(r)});
}

// Whether the host predictor would predict r pushes from (previous, last) without an error:
// previous <= last (equal pushes are a zero interval), both finite, and for integers the
// last prediction, last + r * max(last - previous, 1), representable (a zero interval
// predicts last + 1, last + 2, ...). Floating-point predictions that overflow to infinity
// are caught by the input check that follows prediction.
template <class T>
bool zl_history_predictable(T previous, T last, std::size_t r) {
  if (!(previous <= last)) return false;
  if constexpr (std::is_floating_point_v<T>) {
    return std::isfinite(previous) && std::isfinite(last);
  } else {
    T step, reach, end;
    if (static_cast<std::size_t>(static_cast<T>(r)) != r || sub_overflows(last, previous, &step))
      return false;
    if (step == 0) step = 1;
    return !mul_overflows(step, static_cast<T>(r), &reach) && !add_overflows(last, reach, &end);
  }
}

}  // namespace cadence::detail
