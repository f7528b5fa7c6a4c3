// What the collective adapters share: a caller's tensor as (pointer, count, dtype), the
// tensor and deadline checks, and the host-side averaging.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/communicator.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace cadence::exchange {

/// A caller-owned tensor of f32 or f64 elements: host memory, or device memory over a
/// communicator with device buffers (NCCL). Adapters never own or resize it; they read and
/// write `count` elements at `data` during the call that takes it.
struct tensor_ref {
  void* data = nullptr;
  std::size_t count = 0;
  transport::dtype type = transport::dtype::f32;

  tensor_ref() = default;
  tensor_ref(float* p, std::size_t n) noexcept : data(p), count(n), type(transport::dtype::f32) {}
  tensor_ref(double* p, std::size_t n) noexcept : data(p), count(n), type(transport::dtype::f64) {}
  tensor_ref(span<float> s) noexcept : tensor_ref(s.data(), s.size()) {}    // NOLINT: implicit
  tensor_ref(span<double> s) noexcept : tensor_ref(s.data(), s.size()) {}   // NOLINT: implicit
  tensor_ref(std::vector<float>& v) noexcept : tensor_ref(v.data(), v.size()) {}   // NOLINT
  tensor_ref(std::vector<double>& v) noexcept : tensor_ref(v.data(), v.size()) {}  // NOLINT

  std::size_t bytes() const noexcept { return count * transport::dtype_size(type); }
};

namespace detail {

/// "cadence::exchange::elastic_averager on rank 2 of 4: "
inline std::string where(const char* adapter, int rank, int size) {
  return std::string("cadence::exchange::") + adapter + " on rank " + std::to_string(rank) +
         " of " + std::to_string(size) + ": ";
}

inline void check_tensor(const char* adapter, int rank, int size, const tensor_ref& t,
                         std::size_t index) {
  if (t.data == nullptr && t.count != 0)
    throw invalid_parameter_error(where(adapter, rank, size) + "tensor " + std::to_string(index) +
                                  " is a null pointer with " + std::to_string(t.count) +
                                  " elements");
  if (t.type != transport::dtype::f32 && t.type != transport::dtype::f64)
    throw invalid_parameter_error(where(adapter, rank, size) + "tensor " + std::to_string(index) +
                                  " has dtype " + transport::dtype_name(t.type) +
                                  "; parameters are f32 or f64");
}

inline void check_timeout(const char* adapter, std::chrono::milliseconds timeout) {
  if (timeout <= std::chrono::milliseconds::zero())
    throw invalid_parameter_error(std::string("cadence::exchange::") + adapter +
                                  ": timeout must be > 0, got " + std::to_string(timeout.count()) +
                                  " ms");
}

/// Divides every element by `by`: multiplication by the reciprocal when `by` is a power of two
/// (then exact and the same result), else division, correctly rounded, so exact whenever the
/// quotient is representable (as allreduce_avg). `from` (default: in place) is read instead.
template <class T>
void divide_into(T* out, const T* from, std::size_t count, double by) {
  int e = 0;
  const bool pow2 = std::frexp(by, &e) == 0.5;
  const T f = static_cast<T>(by);
  if (pow2) {
    const T inv = static_cast<T>(1.0 / by);
    for (std::size_t i = 0; i < count; ++i) out[i] = from[i] * inv;
  } else {
    for (std::size_t i = 0; i < count; ++i) out[i] = from[i] / f;
  }
}

inline void divide(const tensor_ref& t, double by) {
  if (t.type == transport::dtype::f32)
    divide_into(static_cast<float*>(t.data), static_cast<const float*>(t.data), t.count, by);
  else
    divide_into(static_cast<double*>(t.data), static_cast<const double*>(t.data), t.count, by);
}

inline void scale(const tensor_ref& t, double by) {
  if (t.type == transport::dtype::f32) {
    auto* p = static_cast<float*>(t.data);
    const auto f = static_cast<float>(by);
    for (std::size_t i = 0; i < t.count; ++i) p[i] *= f;
  } else {
    auto* p = static_cast<double*>(t.data);
    for (std::size_t i = 0; i < t.count; ++i) p[i] *= by;
  }
}

}  // namespace detail
}  // namespace cadence::exchange
