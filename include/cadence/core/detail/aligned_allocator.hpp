// An allocator whose blocks start on a cache line (or any power-of-two boundary), for flat
// per-worker tables whose records must not straddle two lines: with 10^6 workers every line a
// push touches is a cache miss, so a record split over two lines costs two.
#pragma once

#include <cstddef>
#include <new>

namespace cadence::detail {

/// The cache line size the tables are laid out for (x86-64 and most ARM64 cores).
inline constexpr std::size_t cache_line_bytes = 64;

/// std::allocator's contract, with every block aligned to Align bytes (a power of two, at
/// least alignof(T)), through C++17's aligned operator new.
template <class T, std::size_t Align = cache_line_bytes>
struct aligned_allocator {
  static_assert(Align >= alignof(T) && (Align & (Align - 1)) == 0,
                "cadence::detail::aligned_allocator: Align must be a power of two >= alignof(T)");
  using value_type = T;
  template <class U>
  struct rebind {
    using other = aligned_allocator<U, Align>;
  };

  aligned_allocator() noexcept = default;
  template <class U>
  aligned_allocator(const aligned_allocator<U, Align>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{Align}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{Align}); }

  template <class U>
  bool operator==(const aligned_allocator<U, Align>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const aligned_allocator<U, Align>&) const noexcept { return false; }
};

}  // namespace cadence::detail
