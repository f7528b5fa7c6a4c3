/// \file
/// \ingroup membership
/// How the membership layer takes a piece of a replica's state: a pointer and a byte count,
/// never owned. Built from a vector, a span or any tensor-like type with `data` and `bytes()`
/// (exchange::tensor_ref), so the layer needs nothing from the layers above it.
#pragma once

#include <cadence/core/span.hpp>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// A caller-owned block of host memory: `bytes` bytes at `data`. The membership layer reads and
/// writes it during the call that takes it (a backup before a sync, the state streamed to a
/// newcomer), and only then.
struct buffer {
  void* data = nullptr;   ///< the first byte
  std::size_t bytes = 0;  ///< its length

  /// An empty block.
  buffer() = default;
  /// `n` bytes at `p`.
  buffer(void* p, std::size_t n) noexcept : data(p), bytes(n) {}
  /// The elements `v` holds (not resized while the layer uses them).
  template <class T, class = std::enable_if_t<std::is_trivially_copyable_v<T>>>
  buffer(std::vector<T>& v) noexcept : data(v.data()), bytes(v.size() * sizeof(T)) {}  // NOLINT: implicit
  /// The elements `s` views.
  template <class T, class = std::enable_if_t<std::is_trivially_copyable_v<T> && !std::is_const_v<T>>>
  buffer(span<T> s) noexcept : data(s.data()), bytes(s.size() * sizeof(T)) {}  // NOLINT: implicit
  /// The block of `t`: anything with a `data` pointer member and a `bytes()` function
  /// (exchange::tensor_ref).
  template <class T, class = decltype(static_cast<void*>(std::declval<const T&>().data)),
            class = decltype(std::size_t{std::declval<const T&>().bytes()}), class = void>
  buffer(const T& t) noexcept : data(t.data), bytes(t.bytes()) {}  // NOLINT: implicit
};

/// @}
}  // namespace cadence::membership
