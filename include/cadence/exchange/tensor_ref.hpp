/// \file
/// \ingroup exchange
/// How the collective adapters (bucketed_allreducer, periodic_averager, elastic_averager) take
/// a caller's tensor: a pointer, an element count and a dtype, in host or device memory, never
/// owned.
#pragma once

#include <cadence/core/span.hpp>
#include <cadence/transport/communicator.hpp>

#include <cstddef>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// A caller-owned tensor of f32 or f64 elements: host memory, or device memory over a
/// communicator with device buffers (NCCL). Adapters never own or resize it; they read and
/// write `count` elements at `data` during the call that takes it. Built implicitly from a
/// std::vector or a span of float or double, so `avg.sync(params)` reads as it should.
struct tensor_ref {
  void* data = nullptr;                           ///< the first element
  std::size_t count = 0;                          ///< elements
  transport::dtype type = transport::dtype::f32;  ///< f32 or f64 (the adapters refuse others)

  /// An empty tensor (no elements).
  tensor_ref() = default;
  /// `n` floats at `p`.
  tensor_ref(float* p, std::size_t n) noexcept : data(p), count(n), type(transport::dtype::f32) {}
  /// `n` doubles at `p`.
  tensor_ref(double* p, std::size_t n) noexcept : data(p), count(n), type(transport::dtype::f64) {}
  /// The floats `s` views.
  tensor_ref(span<float> s) noexcept : tensor_ref(s.data(), s.size()) {}    // NOLINT: implicit
  /// The doubles `s` views.
  tensor_ref(span<double> s) noexcept : tensor_ref(s.data(), s.size()) {}   // NOLINT: implicit
  /// The floats `v` holds (not resized by anyone while an adapter uses them).
  tensor_ref(std::vector<float>& v) noexcept : tensor_ref(v.data(), v.size()) {}   // NOLINT
  /// The doubles `v` holds.
  tensor_ref(std::vector<double>& v) noexcept : tensor_ref(v.data(), v.size()) {}  // NOLINT

  /// The tensor's size in bytes: count times the size of its dtype.
  std::size_t bytes() const noexcept { return count * transport::dtype_size(type); }
};

/// @}
}  // namespace cadence::exchange
