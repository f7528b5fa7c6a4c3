// The only place Cadence touches compiler builtins: checked integer arithmetic, bit counts and
// cache prefetch hints, with portable fallbacks, so every other header stays standard C++17.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

namespace cadence::detail {

#if defined(__GNUC__) || defined(__clang__)
#define CADENCE_DETAIL_HAS_OVERFLOW_BUILTINS 1
#else
#define CADENCE_DETAIL_HAS_OVERFLOW_BUILTINS 0
#endif

/// The checked operations add_overflows, sub_overflows and mul_overflows share.
enum class checked_op { add, sub, mul };

/// *r = a op b; returns true when the exact result does not fit T (then *r is unspecified). The
/// builtin where the compiler has one, else an exact range test before the operation.
template <checked_op Op, class T>
constexpr bool overflows(T a, T b, T* r) noexcept {
  static_assert(std::is_integral_v<T>, "cadence::detail::overflows (add_, sub_, mul_): T must be an integer");
#if CADENCE_DETAIL_HAS_OVERFLOW_BUILTINS
  if constexpr (Op == checked_op::add)
    return __builtin_add_overflow(a, b, r);
  else if constexpr (Op == checked_op::sub)
    return __builtin_sub_overflow(a, b, r);
  else
    return __builtin_mul_overflow(a, b, r);
#else
  using L = std::numeric_limits<T>;
  if constexpr (Op == checked_op::add) {
    if ((b > 0 && a > L::max() - b) || (b < 0 && a < L::min() - b)) return true;
    *r = static_cast<T>(a + b);
  } else if constexpr (Op == checked_op::sub) {
    if ((b < 0 && a > L::max() + b) || (b > 0 && a < L::min() + b)) return true;
    *r = static_cast<T>(a - b);
  } else {
    if (a != 0 && b != 0) {
      if constexpr (std::is_signed_v<T>) {
        if (a == -1 && b == L::min()) return true;
        if (b == -1 && a == L::min()) return true;
        if (a > 0 ? (b > 0 ? a > L::max() / b : b < L::min() / a)
                  : (b > 0 ? a < L::min() / b : a < L::max() / b))
          return true;
      } else if (a > L::max() / b) {
        return true;
      }
    }
    *r = static_cast<T>(a * b);
  }
  return false;
#endif
}

/// *r = a + b; returns true when the exact sum does not fit T (then *r is unspecified).
template <class T>
constexpr bool add_overflows(T a, T b, T* r) noexcept {
  return overflows<checked_op::add>(a, b, r);
}

/// *r = a - b; returns true when the exact difference does not fit T.
template <class T>
constexpr bool sub_overflows(T a, T b, T* r) noexcept {
  return overflows<checked_op::sub>(a, b, r);
}

/// *r = a * b; returns true when the exact product does not fit T.
template <class T>
constexpr bool mul_overflows(T a, T b, T* r) noexcept {
  return overflows<checked_op::mul>(a, b, r);
}

/// Number of trailing zero bits of x != 0.
constexpr unsigned countr_zero(std::uint32_t x) noexcept {
#if CADENCE_DETAIL_HAS_OVERFLOW_BUILTINS
  return static_cast<unsigned>(__builtin_ctz(x));
#else
  unsigned n = 0;
  while ((x & 1u) == 0) {
    x >>= 1;
    ++n;
  }
  return n;
#endif
}

/// Number of leading zero bits of x != 0, for U = std::uint32_t or std::uint64_t: the one body of
/// both countl_zero overloads.
template <class U>
constexpr unsigned leading_zeros(U x) noexcept {
  static_assert(std::is_same_v<U, std::uint32_t> || std::is_same_v<U, std::uint64_t>,
                "cadence::detail::leading_zeros: U must be std::uint32_t or std::uint64_t");
#if CADENCE_DETAIL_HAS_OVERFLOW_BUILTINS
  if constexpr (sizeof(U) == 4)
    return static_cast<unsigned>(__builtin_clz(x));
  else
    return static_cast<unsigned>(__builtin_clzll(x));
#else
  unsigned n = 0;
  for (U bit = U{1} << (8 * sizeof(U) - 1); (x & bit) == 0; bit >>= 1) ++n;
  return n;
#endif
}

/// Number of leading zero bits of x != 0 (32 bits).
constexpr unsigned countl_zero(std::uint32_t x) noexcept { return leading_zeros(x); }

/// Number of leading zero bits of x != 0 (64 bits).
constexpr unsigned countl_zero(std::uint64_t x) noexcept { return leading_zeros(x); }

#undef CADENCE_DETAIL_HAS_OVERFLOW_BUILTINS

/// Asks the CPU to start loading the cache line at `address` for a write soon. A hint only:
/// it never faults, changes nothing, and is a no-op where the compiler has no builtin.
inline void prefetch_for_write(const void* address) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address, 1, 3);
  // An empty volatile asm marks the call as having an effect: without it g++ 12 finds
  // functions whose only statement is a prefetch free of side effects and deletes the
  // calls to them, prefetch and all (checked at -O1 to -O3).
  __asm__ __volatile__("");
#else
  (void)address;
#endif
}

/// prefetch_for_write for a line that will only be read.
inline void prefetch_for_read(const void* address) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address, 0, 3);
  __asm__ __volatile__("");  // see prefetch_for_write
#else
  (void)address;
#endif
}

/// prefetch_for_read of the line `bytes` past `address`, which may lie beyond the object: the
/// address is formed as an integer, since a prefetch may name it but a pointer may not.
inline void prefetch_for_read_ahead(const void* address, std::uintptr_t bytes) noexcept {
  prefetch_for_read(
      reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(address) + bytes));
}

}  // namespace cadence::detail
