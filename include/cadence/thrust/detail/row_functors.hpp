// The Thrust ZipLine's per-row functors (docs/thrust.md#the-certified-subset): one pass over
// each row that checks the contract and finds its largest gap and ends, their summary, the
// trimmed range of a subset row (zipline/detail/fast_trim.hpp), the row subset and its cover
// check, the gather of the subset's points, and the choices. Host and device code alike
// (CADENCE_HOST_DEVICE).
#pragma once

#include <cadence/thrust/config.hpp>
#include <cadence/thrust/detail/device.hpp>
#include <cadence/thrust/detail/functors.hpp>
#include <cadence/zipline/detail/fast_trim.hpp>
#include <cadence/zipline/rows.hpp>

#include <type_traits>

namespace cadence::detail {

// What validation gathers over all rows: any violation, the range lo..hi that the contract
// requires T to represent, and what the trim needs (zipline_row_ends): L = max_p first(p)
// with its smallest row, min_p last(p) and the largest gap.
template <class T>
struct zl_rows_summary {
  int bad;
  T lo;         // smallest first point
  T hi;         // largest last point
  T max_front;  // L
  zl_index front_row;
  T min_back;
  T max_gap;
};

// Row r after the one pass that reads all its points: the contract check, its largest gap
// between neighbours (0 for one point), and its first and last points. Only bad is
// meaningful when bad != 0.
template <class T>
struct zl_row_info {
  T gap;
  T front;
  T back;
  int bad;
};

// The device form of zipline_rows_valid_gaps for one row: strictly increasing with finite
// ends, so finite throughout; the largest gap: zipline_row_increasing, whose SSE2 loop the
// CPU systems take for double rows.
template <class T>
struct zl_scan_row {
  const T* vals;
  const zl_index* roff;
  CADENCE_HOST_DEVICE zl_row_info<T> operator()(zl_index r) const {
    using D = typename zipline_gap_type<T>::type;  // integers subtract unsigned
    const zl_index b = roff[r], e = roff[r + 1];
    const zl_row_info<T> bad_row{T(), T(), T(), 1};
    if (e <= b) return bad_row;
    const T* const v = vals + b;
    const zl_index m = e - b;
    unsigned bad = 0;
    if constexpr (std::is_floating_point_v<T>) {
      bad |= static_cast<unsigned>(!(v[0] - v[0] == T(0)) || !(v[m - 1] - v[m - 1] == T(0)));
    }
    D g = 0;
    if (!zipline_row_increasing(v, m, g) || bad != 0) return bad_row;
    return zl_row_info<T>{static_cast<T>(g), v[0], v[m - 1], 0};
  }
};

// Row r's part of the summary.
template <class T>
struct zl_info_summary {
  const zl_row_info<T>* info;
  CADENCE_HOST_DEVICE zl_rows_summary<T> operator()(zl_index r) const {
    const zl_row_info<T> i = info[r];
    return zl_rows_summary<T>{i.bad, i.front, i.back, i.front, r, i.back, i.gap};
  }
};

// Associative and commutative; ties in L go to the smallest row (as zipline_rows_valid_gaps).
template <class T>
struct zl_summary_merge {
  CADENCE_HOST_DEVICE zl_rows_summary<T> operator()(const zl_rows_summary<T>& a,
                                                    const zl_rows_summary<T>& b) const {
    zl_rows_summary<T> s;
    s.bad = a.bad | b.bad;
    s.lo = b.lo < a.lo ? b.lo : a.lo;
    s.hi = a.hi < b.hi ? b.hi : a.hi;
    const bool take_b = a.max_front < b.max_front ||
                        (!(b.max_front < a.max_front) && b.front_row < a.front_row);
    s.max_front = take_b ? b.max_front : a.max_front;
    s.front_row = take_b ? b.front_row : a.front_row;
    s.min_back = b.min_back < a.min_back ? b.min_back : a.min_back;
    s.max_gap = a.max_gap < b.max_gap ? b.max_gap : a.max_gap;
    return s;
  }
};

// A subset row's trimmed range [start, end), as indices into vals.
struct zl_range {
  zl_index start;
  zl_index end;
};

// The trimmed range of row r (zipline_fast_trim_range): from its latest point <= L to one past
// its last point <= cut (computed for the subset's rows only; the others need none).
template <class T>
struct zl_trim_range {
  const T* vals;
  const zl_index* roff;
  T front;  // L
  T cut;
  CADENCE_HOST_DEVICE zl_range operator()(zl_index r) const {
    const zl_index b = roff[r];
    const zipline_row_range t = zipline_fast_trim_range(vals + b, roff[r + 1] - b, front, cut);
    return zl_range{b + static_cast<zl_index>(t.first), b + static_cast<zl_index>(t.end)};
  }
};

// Points of subset row i inside its trimmed range.
struct zl_trimmed_count {
  const zl_range* sub_range;
  CADENCE_HOST_DEVICE zl_index operator()(zl_index i) const {
    return sub_range[i].end - sub_range[i].start;
  }
};

// Every stride-th row's largest gap: the sample the first subset's threshold comes from.
template <class T>
struct zl_sampled_gap {
  const zl_row_info<T>* info;
  zl_index stride;
  CADENCE_HOST_DEVICE T operator()(zl_index i) const { return info[i * stride].gap; }
};

// The first subset: rows whose largest gap exceeds theta, and the row defining L.
template <class T>
struct zl_pick_wide_rows {
  const zl_row_info<T>* info;
  T theta;
  zl_index front_row;
  CADENCE_HOST_DEVICE unsigned char operator()(zl_index r) const {
    return static_cast<unsigned char>(theta < info[r].gap || r == front_row);
  }
};

// The certified second subset: the first, every row with a gap wider than the first
// subset's spread, and every row whose trimmed range reaches its last point (last <= cut).
template <class T>
struct zl_pick_certified_rows {
  const zl_row_info<T>* info;
  const unsigned char* in;
  T spread;
  T cut;
  CADENCE_HOST_DEVICE unsigned char operator()(zl_index r) const {
    return static_cast<unsigned char>(in[r] || spread < info[r].gap || !(cut < info[r].back));
  }
};

struct zl_is_set {
  CADENCE_HOST_DEVICE bool operator()(unsigned char x) const { return x != 0; }
};

// Copies subset row i's trimmed points to its place in the compacted rows.
template <class T>
struct zl_gather_row {
  const T* vals;
  const zl_range* sub_range;
  const zl_index* sub_roff;
  T* sub_vals;
  CADENCE_HOST_DEVICE void operator()(zl_index i) const {
    T* out = sub_vals + sub_roff[i];
    for (zl_index j = sub_range[i].start; j < sub_range[i].end; ++j) *out++ = vals[j];
  }
};

// Row r's choice for a barrier >= L (its latest point <= barrier, as an index into the
// row), and whether the row is outside the subset with no point in [barrier - spread,
// barrier]: the subset's answer is not certified while any is.
struct zl_choice_check {
  zl_index choice;
  zl_index uncovered;
};

template <class T>
struct zl_choose_and_check {
  const T* vals;
  const zl_index* roff;
  const unsigned char* in;  // null: no check
  T barrier;
  T spread;
  zl_index n = 0;  // rows; set to load the searches of rows r + 8 and r + 16 ahead (CPU)
  CADENCE_HOST_DEVICE zl_choice_check operator()(zl_index r) const {
#if !defined(__CUDA_ARCH__)
    // The OpenMP system hands each thread a contiguous block of rows, so the rows just ahead
    // are this thread's next ones: their misses overlap this search (as in zipline_fast).
    const auto ahead = [&](zl_index q, int stage) {
      if (q < n) zipline_prefetch_search(vals + roff[q], roff[q + 1] - roff[q], barrier, stage);
    };
    ahead(r + 16, 1);
    ahead(r + 8, 2);
#endif
    const zl_index j = zl_upper_bound(vals, roff[r], roff[r + 1], barrier) - 1;
    const bool out = in != nullptr && !in[r] && static_cast<T>(barrier - vals[j]) > spread;
    return zl_choice_check{j - roff[r], out ? zl_index(1) : zl_index(0)};
  }
};

struct zl_uncovered_count {
  CADENCE_HOST_DEVICE zl_index operator()(const zl_choice_check& c) const { return c.uncovered; }
};

}  // namespace cadence::detail
