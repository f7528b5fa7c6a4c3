// Element-wise reduction on the host for the dtypes host backends support: the in-process
// backend's all-reduce and the averaging helper use it, and the benchmark's raw baseline too.
#pragma once

#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace cadence::transport::detail {

/// f16 and bf16 have no host arithmetic here: only device backends (NCCL) reduce them.
constexpr bool host_reducible(dtype t) noexcept { return t != dtype::f16 && t != dtype::bf16; }

template <class T>
T combine(T a, T b, reduce_op op) noexcept {
  switch (op) {
    case reduce_op::min: return std::min(a, b);
    case reduce_op::max: return std::max(a, b);
    case reduce_op::sum: break;
  }
  if constexpr (std::is_integral_v<T>) {
    // Wrap around like MPI implementations do, without signed-overflow UB.
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class T>
void reduce_typed(T* acc, const T* in, std::size_t count, reduce_op op) noexcept {
  // One switch outside the loop so each loop body vectorizes.
  switch (op) {
    case reduce_op::sum:
      for (std::size_t i = 0; i < count; ++i) acc[i] = combine(acc[i], in[i], reduce_op::sum);
      return;
    case reduce_op::min:
      for (std::size_t i = 0; i < count; ++i) acc[i] = std::min(acc[i], in[i]);
      return;
    case reduce_op::max:
      for (std::size_t i = 0; i < count; ++i) acc[i] = std::max(acc[i], in[i]);
      return;
  }
}

/// acc[i] = acc[i] op in[i] for `count` elements of `t`; t must be host_reducible. The buffers
/// must be aligned for the element type (any buffer allocated for it is).
inline void reduce_into(void* acc, const void* in, std::size_t count, dtype t,
                        reduce_op op) noexcept {
  switch (t) {
    case dtype::f32:
      return reduce_typed(static_cast<float*>(acc), static_cast<const float*>(in), count, op);
    case dtype::f64:
      return reduce_typed(static_cast<double*>(acc), static_cast<const double*>(in), count, op);
    case dtype::i32:
      return reduce_typed(static_cast<std::int32_t*>(acc), static_cast<const std::int32_t*>(in),
                          count, op);
    case dtype::i64:
      return reduce_typed(static_cast<std::int64_t*>(acc), static_cast<const std::int64_t*>(in),
                          count, op);
    case dtype::u8:
      return reduce_typed(static_cast<std::uint8_t*>(acc), static_cast<const std::uint8_t*>(in),
                          count, op);
    case dtype::f16:
    case dtype::bf16: return;
  }
}

}  // namespace cadence::transport::detail
