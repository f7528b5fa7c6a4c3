// An allocator whose blocks start on a cache line (or any power-of-two boundary), for flat
// per-worker tables whose records must not straddle two lines: with 10^6 workers every line a
// push touches is a cache miss, so a record split over two lines costs two. Blocks of 2 MiB
// and more are also offered to the kernel for transparent huge pages: there each push's line
// sits on a random 4 KiB page, and the page walk, not the line, was what the hints to load it
// ahead (cadence::prefetch) could not hide.
#pragma once

#include <cstddef>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cadence::detail {

/// The cache line size the tables are laid out for (x86-64 and most ARM64 cores).
inline constexpr std::size_t cache_line_bytes = 64;

/// Blocks of at least this many bytes start on a 2 MiB boundary and, on Linux, are marked for
/// transparent huge pages (madvise MADV_HUGEPAGE: used when the kernel's THP mode is "madvise"
/// or "always", ignored when it is "never").
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

/// std::allocator's contract, with every block aligned to Align bytes (a power of two, at
/// least alignof(T)), through C++17's aligned operator new; large blocks as above.
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

  /// The boundary a block of `bytes` starts on (allocate and deallocate agree on it).
  static constexpr std::size_t alignment_for(std::size_t bytes) noexcept {
    return bytes >= huge_page_bytes && huge_page_bytes > Align ? huge_page_bytes : Align;
  }

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    void* const p = ::operator new(bytes, std::align_val_t{alignment_for(bytes)});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    // Advice only: a kernel without THP refuses it, and the block works as before.
    if (bytes >= huge_page_bytes)
      (void)::madvise(p, bytes / huge_page_bytes * huge_page_bytes, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ::operator delete(p, std::align_val_t{alignment_for(n * sizeof(T))});
  }

  template <class U>
  bool operator==(const aligned_allocator<U, Align>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const aligned_allocator<U, Align>&) const noexcept { return false; }
};

}  // namespace cadence::detail
