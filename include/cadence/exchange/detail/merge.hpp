// The model merge of periodic_averager and elastic_averager: one fused all-reduce per dtype (not
// one per tensor), in place where the tensors of a dtype lie back to back, with the merge rule's
// arithmetic folded into the copies in and out (or, in place, into one pass before and one
// after), and the summed-deltas anchor kept in the fused layout so it is read once per pass.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/exchange/detail/device.hpp>
#include <cadence/exchange/detail/tensor.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <cstddef>
#include <cstring>
#include <vector>

namespace cadence::exchange::detail {

/// What a merge computes per element (x_r: rank r's value, a: the anchor).
enum class merge_kind : unsigned char {
  average,        // mean of x_r
  step_weighted,  // sum of w_r x_r / sum of w_r
  summed_deltas,  // a + sum of (x_r - a)
};

/// Merges tensors across the ranks of a communicator; keeps the fusion buffers and the anchor
/// between calls. `Bulk` is the communicator the tensors travel on.
template <class Bulk>
class merger {
public:
  /// Merges `ts` (f32 or f64, checked by the caller) by `kind`; weight / total_weight are this
  /// rank's w_r and the sum over ranks (step_weighted only). With `keep_anchor` the merged
  /// tensors become the anchor of the next summed_deltas merge (which needs one: anchored()).
  /// `device`: the tensors are device pointers of a device communicator; the work runs on its
  /// stream after an event on `caller_stream`, and the call returns once it is done.
  void merge(Bulk& c, span<const tensor_ref> ts, merge_kind kind, double weight, double total_weight,
             bool keep_anchor, const transport::deadline& d, bool device, void* caller_stream) {
    group gs[2];
    for (std::size_t i = 0; i < ts.size(); ++i) {
      if (ts[i].count == 0) continue;
      group& g = gs[ts[i].type == transport::dtype::f32 ? 0 : 1];
      g.type = ts[i].type;
      g.members.push_back(i);
      g.bytes += ts[i].bytes();
    }
    if (device) {
      if constexpr (has_device_ops_v<Bulk>) merge_on_device(c, ts, gs, kind, weight, total_weight, keep_anchor, d, caller_stream);
      return;
    }
    for (int k = 0; k < 2; ++k) {
      group& g = gs[k];
      if (g.members.empty()) {
        if (keep_anchor) anchor_[k].clear();
        continue;
      }
      merge_group(c, ts, g, k, kind, weight, total_weight, keep_anchor, d);
    }
    anchored_ = keep_anchor;
  }

  /// Whether an anchor from the previous merge is held (summed_deltas after its first barrier).
  bool anchored() const noexcept { return anchored_; }

private:
  struct group {
    transport::dtype type = transport::dtype::f32;
    std::vector<std::size_t> members;
    std::size_t bytes = 0;
    std::size_t count() const noexcept { return bytes / transport::dtype_size(type); }
  };

  // The members' memory when they lie back to back in order (so no fusion copy), else null.
  static void* contiguous(span<const tensor_ref> ts, const group& g) {
    for (std::size_t k = 1; k < g.members.size(); ++k) {
      const tensor_ref& prev = ts[g.members[k - 1]];
      if (static_cast<const unsigned char*>(prev.data) + prev.bytes() != ts[g.members[k]].data) return nullptr;
    }
    return ts[g.members.front()].data;
  }

  void merge_group(Bulk& c, span<const tensor_ref> ts, const group& g, int k, merge_kind kind, double weight,
                   double total_weight, bool keep_anchor, const transport::deadline& d) {
    if (g.type == transport::dtype::f32)
      merge_typed<float>(c, ts, g, k, kind, weight, total_weight, keep_anchor, d);
    else
      merge_typed<double>(c, ts, g, k, kind, weight, total_weight, keep_anchor, d);
  }

  template <class T>
  void merge_typed(Bulk& c, span<const tensor_ref> ts, const group& g, int k, merge_kind kind, double weight,
                   double total_weight, bool keep_anchor, const transport::deadline& d) {
    const std::size_t n = g.count();
    const T w = static_cast<T>(weight);
    T* a = nullptr;
    if (kind == merge_kind::summed_deltas || keep_anchor) {
      anchor_[k].resize((g.bytes + sizeof(double) - 1) / sizeof(double));
      a = reinterpret_cast<T*>(anchor_[k].data());
    }
    T* base = static_cast<T*>(contiguous(ts, g));
    const bool fused = base == nullptr;
    if (fused) {
      fusion_[k].resize((g.bytes + sizeof(double) - 1) / sizeof(double));
      base = reinterpret_cast<T*>(fusion_[k].data());
    }
    // Before: the copy in (fused) or one pass in place, with the rule's arithmetic.
    std::size_t at = 0;
    for (std::size_t m : g.members) {
      const auto* x = static_cast<const T*>(ts[m].data);
      T* f = base + at;
      const std::size_t cnt = ts[m].count;
      switch (kind) {
        case merge_kind::average:
          if (fused) std::memcpy(f, x, cnt * sizeof(T));
          break;
        case merge_kind::step_weighted:
          for (std::size_t i = 0; i < cnt; ++i) f[i] = x[i] * w;
          break;
        case merge_kind::summed_deltas:
          for (std::size_t i = 0; i < cnt; ++i) f[i] = x[i] - a[at + i];
          break;
      }
      at += cnt;
    }
    // The one all-reduce of this dtype; the average divides inside the backend where it can.
    const double size = static_cast<double>(c.size());
    bool divide_after = false;
    if (kind == merge_kind::average) {
      if constexpr (transport::has_allreduce_average_v<Bulk>) {
        c.allreduce_average(base, n, g.type, d);
      } else {
        c.allreduce(base, n, g.type, transport::reduce_op::sum, d);
        divide_after = true;
      }
    } else {
      c.allreduce(base, n, g.type, transport::reduce_op::sum, d);
    }
    // After: the copy out (fused) or one pass in place, and the anchor.
    at = 0;
    for (std::size_t m : g.members) {
      T* x = static_cast<T*>(ts[m].data);
      const T* f = base + at;
      const std::size_t cnt = ts[m].count;
      switch (kind) {
        case merge_kind::average:
          if (divide_after)
            transport::detail::divide_typed(x, f, cnt, size);
          else if (fused)
            std::memcpy(x, f, cnt * sizeof(T));
          break;
        case merge_kind::step_weighted:
          transport::detail::divide_typed(x, f, cnt, total_weight);
          break;
        case merge_kind::summed_deltas:
          for (std::size_t i = 0; i < cnt; ++i) {
            const T v = f[i] + a[at + i];
            x[i] = v;
            a[at + i] = v;
          }
          break;
      }
      if (keep_anchor && kind != merge_kind::summed_deltas) std::memcpy(a + at, x, cnt * sizeof(T));
      at += cnt;
    }
  }

  // The device form, on the communicator's stream after an event on the caller's: fused copies
  // with cudaMemcpyAsync, ncclAvg, a PreMulSum for the weights, and for summed deltas a sum then
  // a PreMulSum in which rank 0 passes the sum on and rank 1 adds -(n - 1) times the anchor.
  void merge_on_device(Bulk& c, span<const tensor_ref> ts, group* gs, merge_kind kind, double weight,
                       double total_weight, bool keep_anchor, const transport::deadline& d,
                       void* caller_stream) {
    if constexpr (has_device_ops_v<Bulk>) {
      void* s = c.stream();
      c.stream_wait(s, caller_stream);
      const int n = c.size();
      const int me = c.rank();
      for (int k = 0; k < 2; ++k) {
        group& g = gs[k];
        if (g.members.empty()) continue;
        void* base = contiguous(ts, g);
        const bool fused = base == nullptr;
        if (fused) {
          if (fusion_device_[k].bytes() < g.bytes) fusion_device_[k] = device_block<Bulk>(c, g.bytes);
          base = fusion_device_[k].get();
          std::size_t at = 0;
          for (std::size_t m : g.members) {
            c.copy_async(static_cast<unsigned char*>(base) + at, ts[m].data, ts[m].bytes(), s);
            at += ts[m].bytes();
          }
        }
        if ((kind == merge_kind::summed_deltas || keep_anchor) && anchor_device_[k].bytes() != g.bytes)
          anchor_device_[k] = device_block<Bulk>(c, g.bytes);
        switch (kind) {
          case merge_kind::average:
            c.allreduce_average(base, g.count(), g.type, s, d);
            break;
          case merge_kind::step_weighted:
            c.allreduce_scaled(base, base, g.count(), g.type, weight / total_weight, s, d);
            break;
          case merge_kind::summed_deltas: {
            c.allreduce(base, g.count(), g.type, transport::reduce_op::sum, s, d);
            if (n > 1) {
              const void* send = me == 0 ? base : anchor_device_[k].get();
              const double scale = me == 0 ? 1.0 : me == 1 ? -static_cast<double>(n - 1) : 0.0;
              c.allreduce_scaled(send, base, g.count(), g.type, scale, s, d);
            }
            break;
          }
        }
        if (fused) {
          std::size_t at = 0;
          for (std::size_t m : g.members) {
            c.copy_async(ts[m].data, static_cast<unsigned char*>(base) + at, ts[m].bytes(), s);
            at += ts[m].bytes();
          }
        }
        if (kind == merge_kind::summed_deltas || keep_anchor) c.copy_async(anchor_device_[k].get(), base, g.bytes, s);
      }
      c.synchronize(s, d);
      anchored_ = keep_anchor;
    }
  }

  std::vector<double> fusion_[2];  // host fusion buffers, f32 and f64 (doubles: aligned for both)
  std::vector<double> anchor_[2];  // the last merged values per dtype, in the fused layout
  device_block<Bulk> fusion_device_[2];
  device_block<Bulk> anchor_device_[2];
  bool anchored_ = false;
};

}  // namespace cadence::exchange::detail
