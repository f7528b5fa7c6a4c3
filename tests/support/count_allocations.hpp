// Replaces the global operator new/delete (every non-aligned form) with malloc/free plus a
// per-thread count, so tests can check that hot paths do not allocate. It defines global
// functions: include it in exactly one translation unit of a test executable.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

// g++ 12 inlines the replaced operator new into library code and then warns about free() on a
// pointer from `new`; the pair here is malloc/free, which is correct.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace cadence::test {
/// Allocations made by this thread through operator new so far.
inline thread_local std::size_t allocations = 0;
}  // namespace cadence::test

// Every form is replaced so that what one of ours allocates, the matching one of ours frees
// (sanitizers check that pairing; the standard library uses the nothrow forms too).
void* operator new(std::size_t size) {
  ++cadence::test::allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  ++cadence::test::allocations;
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
