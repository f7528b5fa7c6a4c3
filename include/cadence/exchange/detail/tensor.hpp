// What the collective adapters share: the tensor and deadline checks, the host-side averaging,
// and the sync() overloads of the two averagers. The tensor itself: exchange/tensor_ref.hpp.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/exchange/tensor_ref.hpp>
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/communicator.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <type_traits>

namespace cadence::exchange::detail {

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

// The forms of sync() periodic_averager and elastic_averager both offer (a braced list, the
// tensors one by one, none), each forwarding to Derived::sync(span<const tensor_ref>). Derived
// brings them in with a using-declaration beside its own span form.
template <class Derived>
class tensor_sync {
public:
  void sync(std::initializer_list<tensor_ref> tensors) {
    self().sync(span<const tensor_ref>(tensors.begin(), tensors.size()));
  }
  template <class... T,
            class = std::enable_if_t<(sizeof...(T) > 0) && (std::is_constructible_v<tensor_ref, T&&> && ...)>>
  void sync(T&&... tensors) {
    const tensor_ref list[] = {tensor_ref(tensors)...};
    self().sync(span<const tensor_ref>(list, sizeof...(T)));
  }
  void sync() { self().sync(span<const tensor_ref>()); }

private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

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

}  // namespace cadence::exchange::detail
