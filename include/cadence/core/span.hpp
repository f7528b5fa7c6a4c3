/// \file
/// \ingroup core
/// A minimal read-only contiguous view for C++17 (std::span arrives only in C++20); public
/// APIs take and return it so results can point into buffers a controller reuses.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

namespace cadence {
/// \addtogroup core
/// @{

/// A view of size() elements of T starting at data(); it owns nothing, so it is valid while
/// what it points into is. Converts from std::vector and C arrays, as std::span does.
template <class T>
class span {
public:
  // The member types of std::span, so generic code reads a span as it reads a standard range.
  using element_type = T;                  ///< T, const included.
  using value_type = std::remove_cv_t<T>;  ///< T without const or volatile.
  using size_type = std::size_t;           ///< What size() returns.
  using iterator = T*;                     ///< A plain pointer into the viewed elements.

  /// An empty view (data() is nullptr).
  constexpr span() noexcept = default;
  /// The size elements from data on.
  constexpr span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  ///@{
  /// The elements v holds now: a view that any reallocation of v invalidates. Only where a U*
  /// converts to a T* as an array (adding const), never between different element types.
  template <class U, class A,
            class = std::enable_if_t<std::is_convertible_v<const U (*)[], T (*)[]>>>
  span(const std::vector<U, A>& v) noexcept : data_(v.data()), size_(v.size()) {}
  template <class U, class A, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  span(std::vector<U, A>& v) noexcept : data_(v.data()), size_(v.size()) {}
  ///@}
  /// The N elements of array a.
  template <std::size_t N>
  constexpr span(T (&a)[N]) noexcept : data_(a), size_(N) {}

  ///@{
  /// As std::span's: the first element, the count, iteration and element access. None checks
  /// bounds (operator[], front() and back() on an empty span are undefined).
  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }
  constexpr T* begin() const noexcept { return data_; }
  constexpr T* end() const noexcept { return data_ + size_; }
  constexpr T& front() const noexcept { return data_[0]; }
  constexpr T& back() const noexcept { return data_[size_ - 1]; }
  ///@}
  /// The count elements from offset on; unchecked, like operator[] (std::span's
  /// subspan(offset, count) with both given).
  constexpr span subspan(std::size_t offset, std::size_t count) const noexcept {
    return span(data_ + offset, count);
  }

private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// @}
}  // namespace cadence
