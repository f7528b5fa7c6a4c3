/// \file
/// \ingroup zipline
/// Input of a ZipLine search: n rows of strictly increasing predicted push times, stored as a
/// dense n x R matrix, as ragged rows (values plus n+1 offsets) or as separately allocated rows
/// (one pointer per row), and the contract check.
#pragma once

#include <cadence/core/detail/bits.hpp>
#include <cadence/core/detail/host_device.hpp>

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

/// 1 where the ZipLine searches use SSE2, 0 for the scalar loop. SSE2 is part of every x86-64
/// target, so this needs no flag; other targets take the scalar loop. Define it to 0 to force
/// the scalar loop (in every translation unit of a program alike: the inline functions differ).
/// \ingroup zipline
#ifndef CADENCE_ZIPLINE_SSE2
#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#define CADENCE_ZIPLINE_SSE2 1
#else
#define CADENCE_ZIPLINE_SSE2 0
#endif
#endif
#if CADENCE_ZIPLINE_SSE2
#include <emmintrin.h>
#endif

namespace cadence {
/// \addtogroup zipline
/// @{

/// Non-owning view of n rows of timestamps. Rows may have unequal lengths (>= 1 each).
/// Three layouts share one type so every ZipLine variant takes all of them:
/// - matrix(data, n, r): row p is data[p*r .. p*r + r);
/// - ragged(values, offsets, n): row p is values[offsets[p] .. offsets[p+1]);
/// - separate(rows, offsets, n): row p is rows[p][0 .. offsets[p+1] - offsets[p]), each row in
///   its own allocation (rows kept as separate arrays, e.g. one NumPy array per worker): the
///   search reads them in place, where the other layouts would need them copied into one.
/// Pick the one the rows already have; the CPU variants run as fast on each.
template <class T>
class rows_view {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                "cadence::rows_view<T>: T must be an integer or floating-point timestamp type");

public:
  /// The timestamp type.
  using value_type = T;

  /// No rows (validate() rejects it).
  constexpr rows_view() noexcept = default;

  /// n rows of r points each, row after row in data (n * r points). data must outlive the
  /// view.
  static constexpr rows_view matrix(const T* data, std::size_t n, std::size_t r) noexcept {
    return rows_view(data, nullptr, nullptr, n, r);
  }

  /// Rows of different lengths in one array: row p is values[offsets[p]] up to
  /// values[offsets[p+1]] (n + 1 non-decreasing offsets). values and offsets must outlive the
  /// view.
  static constexpr rows_view ragged(const T* values, const std::size_t* offsets,
                                    std::size_t n) noexcept {
    return rows_view(values, nullptr, offsets, n, 0);
  }

  /// Rows that are not in one allocation: row p at rows[p], its length offsets[p+1] -
  /// offsets[p] (n + 1 non-decreasing offsets, as for ragged; they need not start at 0).
  /// rows and offsets must outlive the view.
  static constexpr rows_view separate(const T* const* rows, const std::size_t* offsets,
                                      std::size_t n) noexcept {
    return rows_view(nullptr, rows, offsets, n, 0);
  }

  /// Number of rows (workers).
  constexpr std::size_t size() const noexcept { return n_; }
  /// Whether every row has the same length (the matrix layout).
  constexpr bool is_matrix() const noexcept { return offsets_ == nullptr; }
  /// Length of row p.
  constexpr std::size_t row_size(std::size_t p) const noexcept {
    return offsets_ ? offsets_[p + 1] - offsets_[p] : width_;
  }
  /// Index of row p's first point among all points, row after row (its offset in values()
  /// when the rows are contiguous).
  constexpr std::size_t row_begin(std::size_t p) const noexcept {
    return offsets_ ? offsets_[p] - offsets_[0] : p * width_;
  }
  /// Row p's first point.
  constexpr const T* row_data(std::size_t p) const noexcept {
    return rows_ ? rows_[p] : values_ + (offsets_ ? offsets_[p] : p * width_);
  }
  /// Row p, whatever the layout.
  constexpr span<const T> operator[](std::size_t p) const noexcept {
    return span<const T>(row_data(p), row_size(p));
  }
  /// Whether all points lie in one array, row after row (matrix and ragged views).
  constexpr bool is_contiguous() const noexcept { return rows_ == nullptr; }
  /// All points of all rows, row after row; nullptr for a separate() view (use row_data).
  constexpr const T* values() const noexcept {
    return rows_ ? nullptr : offsets_ ? values_ + offsets_[0] : values_;
  }
  /// Total number of points over all rows.
  constexpr std::size_t total() const noexcept {
    return offsets_ ? (n_ == 0 ? 0 : offsets_[n_] - offsets_[0]) : n_ * width_;
  }
  /// The common row length of a matrix view (0 for ragged views).
  constexpr std::size_t width() const noexcept { return offsets_ ? 0 : width_; }
  /// The offsets array of a ragged or separate view (nullptr for a matrix view).
  constexpr const std::size_t* offsets() const noexcept { return offsets_; }
  /// The row pointers of a separate view (nullptr otherwise).
  constexpr const T* const* row_pointers() const noexcept { return rows_; }

private:
  // What the three layouts set; each leaves what it does not use null (or 0).
  constexpr rows_view(const T* values, const T* const* rows, const std::size_t* offsets, std::size_t n,
                      std::size_t width) noexcept
      : values_(values), rows_(rows), offsets_(offsets), n_(n), width_(width) {}

  const T* values_ = nullptr;
  const T* const* rows_ = nullptr;  // separate(): one pointer per row
  const std::size_t* offsets_ = nullptr;
  std::size_t n_ = 0;
  std::size_t width_ = 0;
};

namespace detail {
template <class T>
std::string timestamp_to_string(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    std::ostringstream os;
    os.precision(std::numeric_limits<T>::max_digits10);
    os << v;
    return os.str();
  } else {
    return std::to_string(v);
  }
}
}  // namespace detail

namespace detail {

/// Whether lo..hi (the smallest front and the largest back) is a span T can represent; the
/// check validate() reports as "a range the timestamp type cannot represent".
template <class T>
bool zipline_span_ok(T lo, T hi) noexcept {
  if constexpr (std::is_integral_v<T>) {
    T diff;
    return !detail::sub_overflows(hi, lo, &diff);
  } else {
    return std::isfinite(hi - lo);
  }
}

/// How every validity pass starts row p: sets v and m to its points and their count, and returns
/// whether it has any and, for floating point, finite first and last ones.
template <class T>
bool zipline_row_ends_valid(rows_view<T> rows, std::size_t p, const T*& v, std::size_t& m) noexcept {
  m = rows.row_size(p);
  if (m == 0) return false;
  v = rows.row_data(p);
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(v[0]) || !std::isfinite(v[m - 1])) return false;
  }
  return true;
}

/// A branch-free pass over the input that returns true only if validate(rows) would not
/// throw (callers that get false call validate for the exact error). Rows that are strictly
/// increasing with a finite first and last element are finite throughout, so the inner loop
/// is a plain comparison reduction the compiler can vectorize.
template <class T>
bool zipline_rows_valid(rows_view<T> rows) noexcept {
  const std::size_t n = rows.size();
  if (n == 0) return false;
  T lo = T(), hi = T();
  for (std::size_t p = 0; p < n; ++p) {
    const T* v = nullptr;
    std::size_t m = 0;
    if (!zipline_row_ends_valid(rows, p, v, m)) return false;
    unsigned bad0 = 0, bad1 = 0, bad2 = 0, bad3 = 0;
    std::size_t i = 1;
    for (; i + 4 <= m; i += 4) {
      bad0 |= static_cast<unsigned>(!(v[i - 1] < v[i]));
      bad1 |= static_cast<unsigned>(!(v[i] < v[i + 1]));
      bad2 |= static_cast<unsigned>(!(v[i + 1] < v[i + 2]));
      bad3 |= static_cast<unsigned>(!(v[i + 2] < v[i + 3]));
    }
    for (; i < m; ++i) bad0 |= static_cast<unsigned>(!(v[i - 1] < v[i]));
    if ((bad0 | bad1 | bad2 | bad3) != 0) return false;
    if (p == 0 || v[0] < lo) lo = v[0];
    if (p == 0 || v[m - 1] > hi) hi = v[m - 1];
  }
  return zipline_span_ok(lo, hi);
}

/// The type row gaps are computed in: T, or for integers its unsigned type (defined for any
/// input, exact for valid rows).
template <class T, bool = std::is_integral_v<T>>
struct zipline_gap_type {
  using type = T;
};
template <class T>
struct zipline_gap_type<T, true> {
  using type = std::make_unsigned_t<T>;
};

/// What zipline_fast's trim needs from the rows, gathered by the validation pass while it
/// reads them: L = max_p first(p), the first row that has it, min_p last(p) and the largest
/// gap between neighbours in any row.
template <class T>
struct zipline_row_ends {
  T max_front;
  std::size_t front_row;
  T min_back;
  T max_gap;
};

#if CADENCE_ZIPLINE_SSE2
/// How far ahead (bytes) zipline_row_check_sse2 asks for the lines it will read. The hardware
/// prefetchers stop at every 4 KiB page; at 10^6 x 150 doubles (1.2 GB, read from memory)
/// the hint took the pass from 1.33x to 1.03x of a min/max pass without it (2 KiB ahead;
/// 1 and 4 KiB were no better).
inline constexpr std::uintptr_t zipline_validate_ahead = 2048;

/// One double row of zipline_rows_valid_gaps, eight points a step: g0 receives the largest
/// gap among the points before the returned index (the caller finishes the tail), bad any
/// !(v[i-1] < v[i]). g++ does not vectorize the scalar loop (a floating-point max reduction
/// needs -ffast-math), and this pass reads every point: at n = 1000, R = 150 it took 0.084 of
/// zipline_fast's 0.28 ms. Four independent maxima and flags: with two, the maxima's latency
/// chain (4 cycles a step) bounded the pass below the memory's pace. A row of 9 points or
/// more ends with one step over its last 8 neighbour pairs, overlapping pairs already seen
/// (max and or do not mind), instead of a scalar tail: at 10^5 rows of 150 the tail cost
/// a tenth of the whole solve.
inline std::size_t zipline_row_check_sse2(const double* v, std::size_t m, unsigned& bad,
                                          double& g0) noexcept {
  __m128d bad_a = _mm_setzero_pd(), bad_b = bad_a, bad_c = bad_a, bad_d = bad_a;
  __m128d g_a = _mm_setzero_pd(), g_b = g_a, g_c = g_a, g_d = g_a;
  const auto step = [&](std::size_t i) {
    const __m128d a0 = _mm_loadu_pd(v + i - 1), b0 = _mm_loadu_pd(v + i);
    const __m128d a1 = _mm_loadu_pd(v + i + 1), b1 = _mm_loadu_pd(v + i + 2);
    const __m128d a2 = _mm_loadu_pd(v + i + 3), b2 = _mm_loadu_pd(v + i + 4);
    const __m128d a3 = _mm_loadu_pd(v + i + 5), b3 = _mm_loadu_pd(v + i + 6);
    bad_a = _mm_or_pd(bad_a, _mm_cmpnlt_pd(a0, b0));  // !(a < b): also true for NaN
    bad_b = _mm_or_pd(bad_b, _mm_cmpnlt_pd(a1, b1));
    bad_c = _mm_or_pd(bad_c, _mm_cmpnlt_pd(a2, b2));
    bad_d = _mm_or_pd(bad_d, _mm_cmpnlt_pd(a3, b3));
    g_a = _mm_max_pd(g_a, _mm_sub_pd(b0, a0));
    g_b = _mm_max_pd(g_b, _mm_sub_pd(b1, a1));
    g_c = _mm_max_pd(g_c, _mm_sub_pd(b2, a2));
    g_d = _mm_max_pd(g_d, _mm_sub_pd(b3, a3));
  };
  std::size_t i = 1;
  for (; i + 8 <= m; i += 8) {
    prefetch_for_read_ahead(v + i, zipline_validate_ahead);
    step(i);
  }
  if (i < m && m >= 9) {
    step(m - 8);
    i = m;
  }
  bad |= static_cast<unsigned>(
      _mm_movemask_pd(_mm_or_pd(_mm_or_pd(bad_a, bad_b), _mm_or_pd(bad_c, bad_d))));
  const __m128d g = _mm_max_pd(_mm_max_pd(g_a, g_b), _mm_max_pd(g_c, g_d));
  const double lo_lane = _mm_cvtsd_f64(g), hi_lane = _mm_cvtsd_f64(_mm_unpackhi_pd(g, g));
  g0 = lo_lane > hi_lane ? lo_lane : hi_lane;
  return i;
}
#endif

/// Whether v[0..m) is strictly increasing (m >= 1; a NaN anywhere fails), and its largest gap
/// between neighbours in `gap` (0 for one point), in D = zipline_gap_type<T>: zipline_fast's
/// validation and the Thrust form's row pass share it. A double row takes the SSE2 loop on
/// the host.
template <class T, class D>
CADENCE_HOST_DEVICE_INLINE bool zipline_row_increasing(const T* v, std::size_t m,
                                                       D& gap) noexcept {
  unsigned bad0 = 0, bad1 = 0;
  D g0 = 0, g1 = 0;
  std::size_t i = 1;
#if CADENCE_ZIPLINE_SSE2 && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, double>) i = zipline_row_check_sse2(v, m, bad0, g0);
#endif
  for (; i + 2 <= m; i += 2) {
    bad0 |= static_cast<unsigned>(!(v[i - 1] < v[i]));
    bad1 |= static_cast<unsigned>(!(v[i] < v[i + 1]));
    const D d0 = static_cast<D>(static_cast<D>(v[i]) - static_cast<D>(v[i - 1]));
    const D d1 = static_cast<D>(static_cast<D>(v[i + 1]) - static_cast<D>(v[i]));
    g0 = d0 > g0 ? d0 : g0;
    g1 = d1 > g1 ? d1 : g1;
  }
  for (; i < m; ++i) {
    bad0 |= static_cast<unsigned>(!(v[i - 1] < v[i]));
    const D d0 = static_cast<D>(static_cast<D>(v[i]) - static_cast<D>(v[i - 1]));
    g0 = d0 > g0 ? d0 : g0;
  }
  gap = g0 > g1 ? g0 : g1;
  return (bad0 | bad1) == 0;
}

/// zipline_rows_valid that also writes each row's largest gap between neighbours to gaps[p]
/// (0 for a row of one point), and the rows' ends to *ends when given, in the same
/// branch-free pass. The gaps are meaningful only when it returns true.
template <class T>
bool zipline_rows_valid_gaps(rows_view<T> rows, T* gaps,
                             zipline_row_ends<T>* ends = nullptr) noexcept {
  using D = typename zipline_gap_type<T>::type;
  const std::size_t n = rows.size();
  if (n == 0) return false;
  T lo = T(), hi = T(), front = T(), back = T(), widest = T();
  std::size_t front_row = 0;
  for (std::size_t p = 0; p < n; ++p) {
    const T* v = nullptr;
    std::size_t m = 0;
    if (!zipline_row_ends_valid(rows, p, v, m)) return false;
    D gap = 0;
    if (!zipline_row_increasing(v, m, gap)) return false;
    const T row_gap = static_cast<T>(gap);
    gaps[p] = row_gap;
    if (p == 0 || row_gap > widest) widest = row_gap;
    if (p == 0 || v[0] < lo) lo = v[0];
    if (p == 0 || v[m - 1] > hi) hi = v[m - 1];
    if (p == 0 || v[0] > front) {
      front = v[0];
      front_row = p;
    }
    if (p == 0 || v[m - 1] < back) back = v[m - 1];
  }
  if (ends != nullptr) *ends = {front, front_row, back, widest};
  return zipline_span_ok(lo, hi);
}

}  // namespace detail

/// Checks rows against the ZipLine input contract and throws zipline_input_error naming the
/// offending row and index: n >= 1, every row non-empty, finite, strictly increasing, and the
/// whole input's span (largest minus smallest value) representable in T so spreads cannot
/// overflow.
template <class T>
void validate(rows_view<T> rows) {
  if (rows.size() == 0) throw zipline_input_error("cadence::zipline: no rows (n = 0)");
  T lo = T(), hi = T();
  bool first = true;
  for (std::size_t p = 0; p < rows.size(); ++p) {
    const auto row = rows[p];
    if (row.empty())
      throw zipline_input_error("cadence::zipline: row " + std::to_string(p) + " is empty");
    for (std::size_t i = 0; i < row.size(); ++i) {
      if constexpr (std::is_floating_point_v<T>) {
        if (!std::isfinite(row[i]))
          throw zipline_input_error("cadence::zipline: row " + std::to_string(p) + " index " +
                                    std::to_string(i) + " is not finite (" +
                                    detail::timestamp_to_string(row[i]) + ")");
      }
      if (i > 0 && !(row[i - 1] < row[i]))
        throw zipline_input_error("cadence::zipline: row " + std::to_string(p) +
                                  " is not strictly increasing at index " + std::to_string(i) +
                                  " (" + detail::timestamp_to_string(row[i - 1]) + " then " +
                                  detail::timestamp_to_string(row[i]) + ")");
    }
    if (first || row.front() < lo) lo = row.front();
    if (first || row.back() > hi) hi = row.back();
    first = false;
  }
  if (!detail::zipline_span_ok(lo, hi))
    throw zipline_input_error("cadence::zipline: timestamps span from " +
                              detail::timestamp_to_string(lo) + " to " +
                              detail::timestamp_to_string(hi) +
                              ", a range the timestamp type cannot represent");
}

/// @}
}  // namespace cadence
