// Data-parallel ZipLine on Thrust (sort, scan, search, reduce): one source that runs on the
// device system of the including translation unit (CUDA, OpenMP or serial C++) and returns
// exactly zipline_brute_force's answer. Not part of the umbrella header; link cadence::thrust.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/thrust/config.hpp>
#include <cadence/thrust/workspace.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/gather.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/scatter.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/system_error.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#  include <thrust/system/cuda/error.h>
#  include <thrust/system/cuda/execution_policy.h>
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
#  include <thrust/system/omp/execution_policy.h>
#else
#  include <thrust/system/cpp/execution_policy.h>
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence {

namespace detail {

// 32-bit positions halve the memory traffic of the scans and the sort's payload; inputs are
// limited to 2^32 - 2 points in all (a million workers x 4000 predicted pushes).
using zl_index = std::uint32_t;
inline constexpr std::size_t zl_max_points = std::numeric_limits<zl_index>::max() - 1;

// The API name and the step running, so a device failure says what failed.
struct zl_context {
  const char* api;
  const char* step;
};

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
    zl_index lo = roff[r], hi = roff[r + 1];  // first point > b lies in [lo, hi]
    const zl_index begin = lo;
    while (lo < hi) {
      const zl_index mid = lo + (hi - lo) / 2;
      if (b < vals[mid]) hi = mid; else lo = mid + 1;
    }
    return lo - begin - 1;
  }
};

// The paper's last-interval predictor, e[i] = t_last + i * (t_last - t_prev), evaluated with
// the host's rounding on the device (no fused multiply-add) so both sides agree to the bit.
template <class T>
CADENCE_HOST_DEVICE T zl_last_interval(T t_prev, T t_last, zl_index i) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, double>) {
    return __dadd_rn(t_last, __dmul_rn(static_cast<double>(i), __dsub_rn(t_last, t_prev)));
  } else if constexpr (std::is_same_v<T, float>) {
    return __fadd_rn(t_last, __fmul_rn(static_cast<float>(i), __fsub_rn(t_last, t_prev)));
  } else {
    return static_cast<T>(t_last + static_cast<T>(i) * static_cast<T>(t_last - t_prev));
  }
#else
  return static_cast<T>(t_last + static_cast<T>(i) * static_cast<T>(t_last - t_prev));
#endif
}

template <class T>
struct zl_predict {
  const T* prev;
  const T* last;
  zl_index r;
  CADENCE_HOST_DEVICE T operator()(zl_index j) const {
    const zl_index p = j / r;
    return zl_last_interval(prev[p], last[p], j % r + 1);
  }
};

// Device-side contract check of a matrix: any non-finite or non-increasing point, and the range.
template <class T>
struct zl_check {
  int bad;
  T lo;
  T hi;
};

template <class T>
struct zl_check_point {
  const T* v;
  zl_index r;
  CADENCE_HOST_DEVICE zl_check<T> operator()(zl_index j) const {
    const T x = v[j];
    bool bad = false;
    if constexpr (std::is_floating_point_v<T>) bad = !(x - x == T(0));  // NaN or infinite
    if (j % r != 0 && !(v[j - 1] < x)) bad = true;
    return zl_check<T>{bad ? 1 : 0, x, x};
  }
};

template <class T>
struct zl_check_merge {
  CADENCE_HOST_DEVICE zl_check<T> operator()(const zl_check<T>& a, const zl_check<T>& b) const {
    return zl_check<T>{a.bad | b.bad, b.lo < a.lo ? b.lo : a.lo, a.hi < b.hi ? b.hi : a.hi};
  }
};

template <class T>
bool zl_range_overflows(T lo, T hi) {
  if constexpr (std::is_integral_v<T>) {
    T diff;
    return __builtin_sub_overflow(hi, lo, &diff);
  } else {
    const T diff = hi - lo;
    return !(diff - diff == T(0));
  }
}

inline auto zl_policy(thrust_zipline_workspace& ws, device_stream stream) {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  // Temporary storage comes from the workspace's pool instead of cudaMalloc on every call.
  // nosync: the steps queue back to back; the reductions and the final copies synchronise.
  return ::thrust::cuda::par_nosync(temp_allocator{&workspace_access::pool(ws)}).on(stream);
#else
  // On the CPU systems malloc is cheap and the OpenMP sort allocates from many threads at
  // once, so Thrust's own temporary allocation is kept.
  (void)ws;
  (void)stream;
#  if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
  return ::thrust::omp::par;
#  else
  return ::thrust::cpp::par;
#  endif
#endif
}

template <class U>
void zl_to_device(U* dst, const U* src, std::size_t count, device_stream stream) {
  if (count == 0) return;
#if CADENCE_THRUST_CUDA
  cuda_check(cudaMemcpyAsync(dst, src, count * sizeof(U), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync host to device");
#else
  (void)stream;
  std::memcpy(dst, src, count * sizeof(U));
#endif
}

template <class U>
void zl_to_host(U* dst, const U* src, std::size_t count, device_stream stream) {
  if (count == 0) return;
#if CADENCE_THRUST_CUDA
  cuda_check(cudaMemcpyAsync(dst, src, count * sizeof(U), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync device to host");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#else
  (void)stream;
  std::memcpy(dst, src, count * sizeof(U));
#endif
}

// Runs f, turning Thrust's and CUDA's failures into cadence::device_error with the API, the
// step and (under CUDA) the CUDA error name.
template <class F>
void zl_guard(zl_context& ctx, F&& f) {
  try {
    f();
  } catch (const ::thrust::system_error& e) {
    std::string msg = std::string("cadence::") + ctx.api + ": " + ctx.step + " failed: ";
#if CADENCE_THRUST_CUDA
    if (e.code().category() == ::thrust::cuda_category())
      msg += std::string(cudaGetErrorName(static_cast<cudaError_t>(e.code().value()))) + ": ";
#endif
    throw device_error(msg + e.what());
  }
#if CADENCE_THRUST_CUDA
  catch (const std::bad_alloc& e) {
    throw device_error(std::string("cadence::") + ctx.api + ": " + ctx.step +
                       " failed: out of device memory (" + e.what() + ")");
  }
#endif
}

enum zl_buffer : std::size_t {
  zl_values,
  zl_keys,
  zl_perm,
  zl_pos,
  zl_next,
  zl_last,
  zl_roff,
  zl_choice,
  zl_ikey,
  zl_ipoff,
  zl_rinst,
  zl_first_valid,
  zl_best,
  zl_history,
};

template <class U>
U* zl_buf(thrust_zipline_workspace& ws, zl_buffer b, std::size_t count) {
  return workspace_access::buffer(ws, b).get<U>(count);
}

inline void zl_check_size(std::size_t points, const char* api) {
  if (points > zl_max_points)
    throw zipline_input_error(std::string("cadence::") + api + ": " + std::to_string(points) +
                              " points in all, more than the " + std::to_string(zl_max_points) +
                              " the Thrust solver indexes");
}

// The solver proper. vals: all points, row after row, instance after instance; roff: rows + 1
// point offsets; for m > 1 instances, ipoff (m + 1 point offsets) and rinst (instance of each
// row) on the device. Writes one best candidate per instance to best_host and the choices (local
// indices, row after row) to choice_host.
template <class T, class Policy>
void zl_solve(Policy& pol, thrust_zipline_workspace& ws, device_stream stream, zl_context& ctx,
              const T* vals, zl_index n_points, const zl_index* roff, zl_index rows, zl_index m,
              const zl_index* ipoff, const zl_index* rinst, zl_candidate<T>* best_host,
              zl_index* choice_host) {
  namespace th = ::thrust;
  const th::counting_iterator<zl_index> zero(0);
  T* keys = zl_buf<T>(ws, zl_keys, n_points);
  zl_index* perm = zl_buf<zl_index>(ws, zl_perm, n_points);
  zl_index* pos = zl_buf<zl_index>(ws, zl_pos, n_points);
  zl_index* next = zl_buf<zl_index>(ws, zl_next, n_points);
  unsigned char* last = zl_buf<unsigned char>(ws, zl_last, n_points);
  zl_index* choice = zl_buf<zl_index>(ws, zl_choice, rows);
  zl_index* ikey = nullptr;
  zl_index* first_valid = nullptr;
  zl_candidate<T>* best = nullptr;
  if (m > 1) {
    ikey = zl_buf<zl_index>(ws, zl_ikey, n_points);
    first_valid = zl_buf<zl_index>(ws, zl_first_valid, m);
    best = zl_buf<zl_candidate<T>>(ws, zl_best, m);
  }

  // 1. Sort all points by time (stable: equal times keep row order), then by instance.
  ctx.step = "sort by time";
  th::copy(pol, vals, vals + n_points, keys);
  th::sequence(pol, perm, perm + n_points);
  th::stable_sort_by_key(pol, keys, keys + n_points, perm);
  if (m > 1) {
    ctx.step = "sort by instance";
    th::transform(pol, zero, zero + n_points, ikey, zl_instance_of{perm, ipoff, m});
    th::stable_sort_by_key(pol, ikey, ikey + n_points, perm);
    th::gather(pol, perm, perm + n_points, vals, keys);
  }

  // 2. Next position of the same row, and its prefix maximum.
  ctx.step = "next position of each row";
  th::scatter(pol, zero, zero + n_points, perm, pos);
  th::fill(pol, last, last + n_points, static_cast<unsigned char>(0));
  th::for_each(pol, zero, zero + rows, zl_mark_row_end{roff, last});
  th::transform(pol, zero, zero + n_points, next,
                zl_next_position{perm, pos, last, ikey, ipoff, n_points});
  zl_index single_first_valid = 0;
  if (m > 1) {
    th::reduce_by_key(pol, rinst, rinst + rows,
                      th::make_transform_iterator(zero, zl_first_position{pos, roff}),
                      th::make_discard_iterator(), first_valid, zl_equal{}, zl_max{});
  } else {
    single_first_valid = th::transform_reduce(pol, zero, zero + rows, zl_first_position{pos, roff},
                                              zl_index(0), zl_max{});
  }
  ctx.step = "prefix maximum";
  th::inclusive_scan(pol, next, next + n_points, next, zl_max{});

  // 3. Tightest window start for every end position (reusing pos).
  ctx.step = "window starts";
  zl_index* start = pos;
  th::fill(pol, start, start + n_points, zl_index(0));
  th::for_each(pol, zero, zero + n_points, zl_mark_window_start{next, start});
  th::inclusive_scan(pol, start, start + n_points, start, zl_max{});

  // 4. Arg-min over (spread, barrier), then each row's choice.
  ctx.step = "arg-min reduce";
  const zl_window_candidate<T> cand{keys, start, ikey, first_valid, single_first_valid};
  T single_barrier{};
  if (m > 1) {
    th::reduce_by_key(pol, ikey, ikey + n_points, th::make_transform_iterator(zero, cand),
                      th::make_discard_iterator(), best, zl_equal{}, zl_candidate_min<T>{});
  } else {
    best_host[0] = th::transform_reduce(pol, zero + single_first_valid, zero + n_points, cand,
                                        zl_candidate<T>{T(), T(), 0}, zl_candidate_min<T>{});
    single_barrier = best_host[0].b;
  }
  ctx.step = "choice search";
  th::transform(pol, zero, zero + rows, choice,
                zl_choose<T>{vals, roff, rinst, best, single_barrier});
  ctx.step = "copy results to host";
  if (m > 1) zl_to_host(best_host, best, m, stream);
  zl_to_host(choice_host, choice, rows, stream);
}

template <class T>
void zl_store(const zl_candidate<T>& c, const zl_index* choice, std::size_t rows,
              zipline_result<T>& out) {
  out.spread = c.d;
  out.barrier = c.b;
  out.choice.assign(choice, choice + rows);
}

// Checks a matrix in device memory against the contract on the device; on a violation copies
// it to the host so cadence::validate reports the row and index exactly as for host input.
template <class T, class Policy>
void zl_validate_device_matrix(Policy& pol, const T* vals, std::size_t n, std::size_t r,
                               device_stream stream, zl_context& ctx) {
  namespace th = ::thrust;
  const th::counting_iterator<zl_index> zero(0);
  const auto n_points = static_cast<zl_index>(n * r);
  ctx.step = "input check";
  const zl_check<T> chk = th::transform_reduce(
      pol, zero, zero + n_points, zl_check_point<T>{vals, static_cast<zl_index>(r)},
      zl_check<T>{0, std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest()},
      zl_check_merge<T>{});
  if (chk.bad == 0 && !zl_range_overflows(chk.lo, chk.hi)) return;
  std::vector<T> host(n * r);
  zl_to_host(host.data(), vals, host.size(), stream);
  validate(rows_view<T>::matrix(host.data(), n, r));
  throw zipline_input_error(std::string("cadence::") + ctx.api +
                            ": the input breaks the ZipLine contract");  // not reached
}

template <class T>
void zl_solve_device_matrix(const T* vals, std::size_t n, std::size_t r, zipline_result<T>& out,
                            thrust_zipline_workspace& ws, device_stream stream, zl_context& ctx) {
  namespace th = ::thrust;
  auto pol = zl_policy(ws, stream);
  zl_guard(ctx, [&] {
    zl_validate_device_matrix(pol, vals, n, r, stream, ctx);
    ctx.step = "row offsets";
    zl_index* roff = zl_buf<zl_index>(ws, zl_roff, n + 1);
    th::sequence(pol, roff, roff + n + 1, zl_index(0), static_cast<zl_index>(r));
    std::vector<zl_index> choice(n);
    zl_candidate<T> best{};
    zl_solve(pol, ws, stream, ctx, vals, static_cast<zl_index>(n * r), roff,
             static_cast<zl_index>(n), zl_index(1), nullptr, nullptr, &best, choice.data());
    zl_store(best, choice.data(), n, out);
  });
}

inline void zl_check_matrix_shape(std::size_t n, std::size_t r, const char* api) {
  if (n == 0) throw zipline_input_error("cadence::zipline: no rows (n = 0)");
  if (r == 0) throw zipline_input_error("cadence::zipline: row 0 is empty");
  if (n > zl_max_points / r)
    throw zipline_input_error(std::string("cadence::") + api + ": " + std::to_string(n) + " x " +
                              std::to_string(r) + " points, more than the " +
                              std::to_string(zl_max_points) + " the Thrust solver indexes");
}

}  // namespace detail

/// ZipLine on the Thrust device system, input on the host (matrix or ragged rows). Returns
/// exactly zipline_brute_force(rows). Validates on the host first (zipline_input_error);
/// device failures throw device_error. Reuses ws's memory; work is queued on stream (CUDA).
template <class T>
void zipline_thrust(rows_view<T> rows, zipline_result<T>& out, thrust_zipline_workspace& ws,
                    device_stream stream = nullptr) {
  namespace th = ::thrust;
  using detail::zl_index;
  validate(rows);
  detail::zl_check_size(rows.total(), "zipline_thrust");
  const std::size_t n = rows.size();
  const std::size_t n_points = rows.total();
  detail::zl_context ctx{"zipline_thrust", "copy input to device"};
  auto pol = detail::zl_policy(ws, stream);
  detail::zl_guard(ctx, [&] {
    T* vals = detail::zl_buf<T>(ws, detail::zl_values, n_points);
    zl_index* roff = detail::zl_buf<zl_index>(ws, detail::zl_roff, n + 1);
    detail::zl_to_device(vals, rows.values(), n_points, stream);
    std::vector<zl_index> host_roff;  // outlives the asynchronous copy (zl_solve synchronises)
    if (rows.is_matrix()) {
      th::sequence(pol, roff, roff + n + 1, zl_index(0), static_cast<zl_index>(rows.width()));
    } else {
      host_roff.resize(n + 1);
      for (std::size_t p = 0; p <= n; ++p)
        host_roff[p] = static_cast<zl_index>(rows.offsets()[p] - rows.offsets()[0]);
      detail::zl_to_device(roff, host_roff.data(), n + 1, stream);
    }
    std::vector<zl_index> choice(n);
    detail::zl_candidate<T> best{};
    detail::zl_solve(pol, ws, stream, ctx, static_cast<const T*>(vals),
                     static_cast<zl_index>(n_points), roff, static_cast<zl_index>(n), zl_index(1),
                     nullptr, nullptr, &best, choice.data());
    detail::zl_store(best, choice.data(), n, out);
  });
}

/// Convenience form: a fresh workspace, the default stream.
template <class T>
zipline_result<T> zipline_thrust(rows_view<T> rows) {
  thrust_zipline_workspace ws;
  zipline_result<T> out;
  zipline_thrust(rows, out, ws);
  return out;
}

/// ZipLine on an n x r matrix already in device memory (row p at device_values[p*r ..]); on
/// the CPU systems "device memory" is ordinary memory. Validated on the device; a violation is
/// reported as cadence::validate would report it.
template <class T>
void zipline_thrust_device(const T* device_values, std::size_t n, std::size_t r,
                           zipline_result<T>& out, thrust_zipline_workspace& ws,
                           device_stream stream = nullptr) {
  detail::zl_check_matrix_shape(n, r, "zipline_thrust_device");
  detail::zl_context ctx{"zipline_thrust_device", "input check"};
  detail::zl_solve_device_matrix(device_values, n, r, out, ws, stream, ctx);
}

/// Solves count independent instances in one pass (one segmented sort by instance, time, row);
/// out[k] equals zipline_thrust(instances[k]). Pays off for many small instances, where a
/// single solve is dominated by launch and transfer latency.
template <class T>
void zipline_thrust_batched(const rows_view<T>* instances, std::size_t count,
                            std::vector<zipline_result<T>>& out, thrust_zipline_workspace& ws,
                            device_stream stream = nullptr) {
  using detail::zl_index;
  out.resize(count);
  if (count == 0) return;
  std::size_t n_points = 0, rows = 0;
  for (std::size_t k = 0; k < count; ++k) {
    try {
      validate(instances[k]);
    } catch (const zipline_input_error& e) {
      throw zipline_input_error(std::string("instance ") + std::to_string(k) + ": " + e.what());
    }
    n_points += instances[k].total();
    rows += instances[k].size();
  }
  detail::zl_check_size(n_points, "zipline_thrust_batched");
  std::vector<zl_index> roff(rows + 1), ipoff(count + 1), rinst(rows);
  {
    std::size_t r = 0, pt = 0;
    for (std::size_t k = 0; k < count; ++k) {
      ipoff[k] = static_cast<zl_index>(pt);
      const auto& inst = instances[k];
      for (std::size_t p = 0; p < inst.size(); ++p, ++r) {
        roff[r] = static_cast<zl_index>(pt + inst.row_begin(p));
        rinst[r] = static_cast<zl_index>(k);
      }
      pt += inst.total();
    }
    roff[rows] = static_cast<zl_index>(pt);
    ipoff[count] = static_cast<zl_index>(pt);
  }
  detail::zl_context ctx{"zipline_thrust_batched", "copy input to device"};
  auto pol = detail::zl_policy(ws, stream);
  detail::zl_guard(ctx, [&] {
    T* vals = detail::zl_buf<T>(ws, detail::zl_values, n_points);
    zl_index* d_roff = detail::zl_buf<zl_index>(ws, detail::zl_roff, rows + 1);
    zl_index* d_ipoff = detail::zl_buf<zl_index>(ws, detail::zl_ipoff, count + 1);
    zl_index* d_rinst = detail::zl_buf<zl_index>(ws, detail::zl_rinst, rows);
    for (std::size_t k = 0; k < count; ++k)
      detail::zl_to_device(vals + ipoff[k], instances[k].values(), instances[k].total(), stream);
    detail::zl_to_device(d_roff, roff.data(), roff.size(), stream);
    detail::zl_to_device(d_ipoff, ipoff.data(), ipoff.size(), stream);
    detail::zl_to_device(d_rinst, rinst.data(), rinst.size(), stream);
    std::vector<zl_index> choice(rows);
    std::vector<detail::zl_candidate<T>> best(count);
    detail::zl_solve(pol, ws, stream, ctx, static_cast<const T*>(vals),
                     static_cast<zl_index>(n_points), d_roff, static_cast<zl_index>(rows),
                     static_cast<zl_index>(count), count > 1 ? d_ipoff : nullptr,
                     count > 1 ? d_rinst : nullptr, best.data(), choice.data());
    std::size_t r = 0;
    for (std::size_t k = 0; k < count; ++k) {
      detail::zl_store(best[k], choice.data() + r, instances[k].size(), out[k]);
      r += instances[k].size();
    }
  });
}

/// Convenience form of the batched solve.
template <class T>
std::vector<zipline_result<T>> zipline_thrust_batched(const rows_view<T>* instances,
                                                      std::size_t count) {
  thrust_zipline_workspace ws;
  std::vector<zipline_result<T>> out;
  zipline_thrust_batched(instances, count, out, ws);
  return out;
}

/// ZipLine over predictions made on the device: worker p's next r pushes are
/// e[i] = last_push[p] + i * (last_push[p] - previous_push[p]), i = 1..r (the paper's
/// predictor), so only 2n timestamps cross the bus instead of n * r. choice[p] = i - 1.
/// Equals predicting the same way on the host and calling zipline_thrust.
template <class T>
void zipline_thrust_predicted(const T* previous_push, const T* last_push, std::size_t n,
                              std::size_t r, zipline_result<T>& out, thrust_zipline_workspace& ws,
                              device_stream stream = nullptr) {
  namespace th = ::thrust;
  using detail::zl_index;
  const char* api = "zipline_thrust_predicted";
  detail::zl_check_matrix_shape(n, r, api);
  for (std::size_t p = 0; p < n; ++p) {
    const T a = previous_push[p], b = last_push[p];
    bool ok = a < b;
    if constexpr (std::is_floating_point_v<T>) ok = ok && std::isfinite(a) && std::isfinite(b);
    if constexpr (std::is_integral_v<T>) {
      T step, reach, end;
      ok = ok && !__builtin_sub_overflow(b, a, &step) &&
           !__builtin_mul_overflow(step, static_cast<T>(r), &reach) &&
           !__builtin_add_overflow(b, reach, &end) && static_cast<std::size_t>(static_cast<T>(r)) == r;
    }
    if (!ok)
      throw zipline_input_error(std::string("cadence::") + api + ": worker " + std::to_string(p) +
                                ": pushes " + detail::timestamp_to_string(a) + " then " +
                                detail::timestamp_to_string(b) +
                                " do not predict " + std::to_string(r) +
                                " increasing, representable push times");
  }
  detail::zl_context ctx{api, "copy push history to device"};
  auto pol = detail::zl_policy(ws, stream);
  T* vals = nullptr;
  detail::zl_guard(ctx, [&] {
    T* hist = detail::zl_buf<T>(ws, detail::zl_history, 2 * n);
    detail::zl_to_device(hist, previous_push, n, stream);
    detail::zl_to_device(hist + n, last_push, n, stream);
    ctx.step = "predict";
    vals = detail::zl_buf<T>(ws, detail::zl_values, n * r);
    const th::counting_iterator<zl_index> zero(0);
    th::transform(pol, zero, zero + static_cast<zl_index>(n * r), vals,
                  detail::zl_predict<T>{hist, hist + n, static_cast<zl_index>(r)});
  });
  detail::zl_solve_device_matrix(static_cast<const T*>(vals), n, r, out, ws, stream, ctx);
}

/// Convenience form of the predicted solve.
template <class T>
zipline_result<T> zipline_thrust_predicted(const T* previous_push, const T* last_push,
                                           std::size_t n, std::size_t r) {
  thrust_zipline_workspace ws;
  zipline_result<T> out;
  zipline_thrust_predicted(previous_push, last_push, n, r, out, ws);
  return out;
}

}  // namespace cadence
