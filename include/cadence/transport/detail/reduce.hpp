// Element-wise reduction on the host for the dtypes host backends support: the in-process
// backend's all-reduce and the averaging helper use it, and the benchmark's raw baseline too; and
// the averaging all-reduce's division, fused into a backend's last pass over the data.
#pragma once

#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <cmath>
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

// ---- averaging: the division fused into a backend's last pass ----

/// Whether dividing by n is multiplying by 1/n exactly (n a power of two): then the cheaper
/// multiplication gives the same, correctly rounded, result.
inline bool power_of_two(double n) noexcept {
  int e = 0;
  return n > 0 && std::frexp(n, &e) == 0.5;
}

template <class T>
void divide_typed(T* out, const T* in, std::size_t count, double n) noexcept {
  if (power_of_two(n)) {
    const T inv = static_cast<T>(1.0 / n);
    for (std::size_t i = 0; i < count; ++i) out[i] = in[i] * inv;
  } else {
    const T f = static_cast<T>(n);
    for (std::size_t i = 0; i < count; ++i) out[i] = in[i] / f;
  }
}

template <class T>
void reduce_divide_typed(T* acc, const T* in, std::size_t count, double n) noexcept {
  if (power_of_two(n)) {
    const T inv = static_cast<T>(1.0 / n);
    for (std::size_t i = 0; i < count; ++i) acc[i] = (acc[i] + in[i]) * inv;
  } else {
    const T f = static_cast<T>(n);
    for (std::size_t i = 0; i < count; ++i) acc[i] = (acc[i] + in[i]) / f;
  }
}

/// Whether the averaging all-reduce takes `t`: f32 and f64 (an integer mean would have to round).
constexpr bool averageable(dtype t) noexcept { return t == dtype::f32 || t == dtype::f64; }

/// out[i] = in[i] / n for `count` elements of t (f32 or f64): division, correctly rounded, or
/// multiplication by 1/n when that is the same (n a power of two). `out` may be `in`.
inline void divide_into(void* out, const void* in, std::size_t count, dtype t, double n) noexcept {
  if (t == dtype::f32)
    divide_typed(static_cast<float*>(out), static_cast<const float*>(in), count, n);
  else if (t == dtype::f64)
    divide_typed(static_cast<double*>(out), static_cast<const double*>(in), count, n);
}

/// acc[i] = (acc[i] + in[i]) / n: a ring's last reduce step of an averaging all-reduce, the sum
/// and the division in one pass (the same bits as summing, then dividing).
inline void reduce_divide_into(void* acc, const void* in, std::size_t count, dtype t, double n) noexcept {
  if (t == dtype::f32)
    reduce_divide_typed(static_cast<float*>(acc), static_cast<const float*>(in), count, n);
  else if (t == dtype::f64)
    reduce_divide_typed(static_cast<double*>(acc), static_cast<const double*>(in), count, n);
}

// ---- chunks: no size overflows a backend's message ----

/// How many messages of at most `limit` bytes carry `bytes` (0 for 0 bytes). `limit` > 0.
constexpr std::size_t chunk_count(std::size_t bytes, std::size_t limit) noexcept {
  return bytes == 0 ? 0 : (bytes - 1) / limit + 1;
}
/// The length of chunk i of `bytes` cut into chunks of `limit` (the last one shorter).
constexpr std::size_t chunk_length(std::size_t bytes, std::size_t limit, std::size_t i) noexcept {
  return bytes - i * limit < limit ? bytes - i * limit : limit;
}
/// The largest multiple of `element` not above `limit` (at least one element): chunks of
/// elements, so a reduction never splits one.
constexpr std::size_t element_limit(std::size_t limit, std::size_t element) noexcept {
  return limit / element * element < element ? element : limit / element * element;
}

}  // namespace cadence::transport::detail
