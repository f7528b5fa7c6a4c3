// The Thrust ZipLine's per-element functors (the parallel form in docs/thrust.md of the
// problem in docs/contract.md#5-zipline): next position of each row, window starts, window
// candidates and their arg-min, and choices. Host and device
// code alike (CADENCE_HOST_DEVICE).
#pragma once

#include <cadence/thrust/config.hpp>
#include <cadence/thrust/detail/device.hpp>
#include <cadence/zipline/detail/common.hpp>

#include <type_traits>

namespace cadence::detail {

// Index of the first of vals[lo, hi) greater than x (sorted, roughly evenly spaced: the
// interpolated search costs one or two cache lines where a binary search over a row of
// predictions costs several, which dominated the trim and the choices at 10^5 rows).
template <class T>
CADENCE_HOST_DEVICE zl_index zl_upper_bound(const T* vals, zl_index lo, zl_index hi, T x) {
  return lo + static_cast<zl_index>(zipline_upper_bound_interpolated(vals + lo, hi - lo, x));
}

template <class T>
struct zl_candidate {
  T d;
  T b;
  int valid;
};

// Lexicographic minimum over (spread, barrier): associative and commutative, so any reduction
// order gives the smallest barrier among the minimum spreads.
template <class T>
struct zl_candidate_min {
  CADENCE_HOST_DEVICE zl_candidate<T> operator()(const zl_candidate<T>& a,
                                                 const zl_candidate<T>& b) const {
    if (!a.valid) return b;
    if (!b.valid) return a;
    if (b.d < a.d || (!(a.d < b.d) && b.b < a.b)) return b;
    return a;
  }
};

struct zl_max {
  CADENCE_HOST_DEVICE zl_index operator()(zl_index a, zl_index b) const { return a < b ? b : a; }
};

struct zl_equal {
  CADENCE_HOST_DEVICE bool operator()(zl_index a, zl_index b) const { return a == b; }
};

// last[j] = 1 for the final point of every row.
struct zl_mark_row_end {
  const zl_index* roff;
  unsigned char* last;
  CADENCE_HOST_DEVICE void operator()(zl_index r) const { last[roff[r + 1] - 1] = 1; }
};

// Instance of the point at sorted position k (binary search over the instances' point offsets).
struct zl_instance_of {
  const zl_index* perm;
  const zl_index* ipoff;
  zl_index m;
  CADENCE_HOST_DEVICE zl_index operator()(zl_index k) const {
    const zl_index j = perm[k];
    zl_index lo = 0, hi = m;  // ipoff[lo] <= j < ipoff[hi]
    while (hi - lo > 1) {
      const zl_index mid = lo + (hi - lo) / 2;
      if (ipoff[mid] <= j) lo = mid; else hi = mid;
    }
    return lo;
  }
};

// Sorted position of the next point of the same row, or the end of the instance's segment.
struct zl_next_position {
  const zl_index* perm;
  const zl_index* pos;
  const unsigned char* last;
  const zl_index* ikey;   // instance of each sorted position; null for one instance
  const zl_index* ipoff;  // instances' point offsets (sorted segments coincide with them)
  zl_index n_points;
  CADENCE_HOST_DEVICE zl_index operator()(zl_index k) const {
    const zl_index j = perm[k];
    if (last[j]) return ikey ? ipoff[ikey[k] + 1] : n_points;
    return pos[j + 1];
  }
};

// Sorted position of each row's first point: a window is valid once all of them are inside.
struct zl_first_position {
  const zl_index* pos;
  const zl_index* roff;
  CADENCE_HOST_DEVICE zl_index operator()(zl_index r) const { return pos[roff[r]]; }
};

// With M the prefix maximum of next positions, the tightest window ending at i starts at the
// first j with M[j] > i. Those starts are the jumps of M: j starts every window ending in
// [M[j-1], M[j]). Writing j at M[j-1] and taking a prefix maximum gives every start in O(N),
// the same answer as a vectorised upper_bound over M without its log factor.
struct zl_mark_window_start {
  const zl_index* m_prefix;
  zl_index* start;
  CADENCE_HOST_DEVICE void operator()(zl_index j) const {
    const zl_index before = j == 0 ? 0 : m_prefix[j - 1];
    if (m_prefix[j] > before) start[before] = j;
  }
};

template <class T>
struct zl_window_candidate {
  const T* keys;
  const zl_index* start;
  const zl_index* ikey;         // null for one instance
  const zl_index* first_valid;  // per instance; used when ikey is set
  zl_index single_first_valid;
  CADENCE_HOST_DEVICE zl_candidate<T> operator()(zl_index i) const {
    const zl_index fv = ikey ? first_valid[ikey[i]] : single_first_valid;
    zl_candidate<T> c{T(), T(), 0};
    if (i >= fv) {
      c.d = static_cast<T>(keys[i] - keys[start[i]]);
      c.b = keys[i];
      c.valid = 1;
    }
    return c;
  }
};

// choice[r]: index of the latest point of row r that is <= its instance's barrier.
template <class T>
struct zl_choose {
  const T* vals;
  const zl_index* roff;
  const zl_index* rinst;             // null for one instance
  const zl_candidate<T>* best;       // per instance; used when rinst is set
  T single_barrier;
  CADENCE_HOST_DEVICE zl_index operator()(zl_index r) const {
    const T b = rinst ? best[rinst[r]].b : single_barrier;
    return zl_upper_bound(vals, roff[r], roff[r + 1], b) - roff[r] - 1;
  }
};

}  // namespace cadence::detail
