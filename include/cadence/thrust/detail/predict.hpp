// The paper's last-interval predictor on the device for zipline_thrust_predicted.
#pragma once

#include <cadence/thrust/config.hpp>
#include <cadence/thrust/detail/device.hpp>

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

template <class T>
struct zl_predict {
  const T* prev;
  const T* last;
  zl_index r;
  CADENCE_HOST_DEVICE T operator()(zl_index j) const {
    const zl_index p = j / r;
    return zl_last_interval(prev[p], last[p], j % r + 1);
  }
};

}  // namespace cadence::detail
