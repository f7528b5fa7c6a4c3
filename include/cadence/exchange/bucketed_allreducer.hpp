// BSP gradient all-reduce over any communicator: registered tensors fused into buckets (as
// PyTorch DDP does), averaged every step with one all-reduce per bucket.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/exchange/detail/device.hpp>
#include <cadence/exchange/detail/tensor.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence::exchange {

struct bucketed_allreducer_options {
  /// Most bytes fused into one bucket (DDP's bucket_cap_mb, 25 MiB by default). A tensor
  /// larger than this travels alone, in place.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Deadline of one average() call, all of its all-reduces together.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// Device communicators (NCCL) only: the cudaStream_t every copy and all-reduce is enqueued
  /// on; null: the communicator's stream. A host communicator refuses a non-null stream.
  void* stream = nullptr;
};

/// Averages a fixed set of gradient tensors across all ranks every step (BSP data parallelism).
/// Register the tensors once with add(), in the same order and sizes on every rank; then call
/// average() after each backward pass. Small tensors of one dtype are fused, in registration
/// order, into buckets of at most bucket_bytes: one all-reduce per bucket instead of one per
/// tensor, which is what makes many small layers cheap. A bucket holding a single tensor (in
/// particular any tensor larger than a bucket) is reduced in place, without a copy.
///
/// Results equal an unbucketed allreduce_avg of each tensor exactly whenever the sums are
/// exact (integer-valued inputs); in general they can differ only by the backend's summation
/// order. Every rank issues the same all-reduces in the same order, so a rank that registered
/// different tensors fails the call on the backends that see the mismatch (transport_error);
/// a stalled rank makes the others throw transport_error naming it within the timeout.
///
/// Over a communicator with device buffers (nccl_communicator) the tensors are device pointers:
/// fusion copies are cudaMemcpyAsync on the stream, the fusion buffer and the view buckets are
/// device memory (allocated through the communicator), and the average is NCCL's own (ncclAvg:
/// each input times 1/n, then summed; exact when n is a power of two and the sums are), so no
/// host pass touches the data. average() returns when the results are in the tensors.
template <class C>
class bucketed_allreducer {
  CADENCE_REQUIRE_COMMUNICATOR(C);

public:
  explicit bucketed_allreducer(C& comm, bucketed_allreducer_options options = {})
      : comm_(&comm), options_(options),
        device_(detail::uses_device(comm, "bucketed_allreducer", options.stream)),
        stream_(detail::device_stream(comm, options.stream)) {
    if (options.bucket_bytes == 0)
      throw invalid_parameter_error(
          detail::where("bucketed_allreducer", comm.rank(), comm.size()) +
          "bucket_bytes must be > 0");
    detail::check_timeout("bucketed_allreducer", options.timeout);
  }

  /// Registers a tensor (f32 or f64; a zero count is allowed and moves nothing); returns its
  /// index. Buckets are rebuilt at the next average().
  std::size_t add(tensor_ref t) {
    detail::check_tensor("bucketed_allreducer", comm_->rank(), comm_->size(), t, tensors_.size());
    tensors_.push_back(t);
    planned_ = false;
    return tensors_.size() - 1;
  }
  std::size_t add(float* p, std::size_t n) { return add(tensor_ref(p, n)); }
  std::size_t add(double* p, std::size_t n) { return add(tensor_ref(p, n)); }

  /// Registers a tensor that lives inside a bucket (DDP's gradient_as_bucket_view): returns
  /// storage for `count` elements of T (float or double), zero-filled, valid as long as the
  /// allreducer (device memory over a device communicator); write the gradient there and average() reduces it in place, with no copy in
  /// or out of a fusion buffer. Consecutive views of one dtype share a bucket until it is full;
  /// view buckets are reduced after the buckets of add()ed tensors.
  template <class T>
  T* add_view(std::size_t count) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "cadence::exchange::bucketed_allreducer::add_view<T>: T must be float or double");
    constexpr transport::dtype type = transport::dtype_of_v<T>;
    const std::size_t bytes = count * sizeof(T);
    if (views_.empty() || views_.back().type != type ||
        views_.back().used + bytes > views_.back().capacity) {
      view_bucket b;
      b.type = type;
      b.capacity = std::max(bytes, options_.bucket_bytes);
      if (device_) {
        b.device = detail::device_block<C>(*comm_, b.capacity);
        if constexpr (detail::has_device_ops_v<C>) {
          comm_->zero_async(b.device.get(), b.capacity, stream_);
          comm_->synchronize(stream_, transport::deadline(options_.timeout));
        }
      } else {
        b.storage.reset(new double[(b.capacity + sizeof(double) - 1) / sizeof(double)]());
      }
      views_.push_back(std::move(b));
    }
    view_bucket& b = views_.back();
    T* p = reinterpret_cast<T*>(b.base() + b.used);
    b.used += bytes;
    return p;
  }

  /// Replaces every registered tensor with its average over all ranks.
  void average() {
    plan();
    const transport::deadline d = transport::deadline(options_.timeout);
    if (device_) {
      if constexpr (detail::has_device_ops_v<C>) average_on_device(d);
      return;
    }
    const double n = static_cast<double>(comm_->size());
    for (const bucket& b : buckets_) {
      if (b.last - b.first == 1) {  // alone: in place
        const tensor_ref& t = tensors_[b.first];
        comm_->allreduce(t.data, t.count, t.type, transport::reduce_op::sum, d);
        detail::divide(t, n);
        continue;
      }
      unsigned char* fused = fusion_.data();
      std::size_t at = 0;
      for (std::size_t i = b.first; i < b.last; ++i) {
        const tensor_ref& t = tensors_[i];
        if (t.count != 0) std::memcpy(fused + at, t.data, t.bytes());
        at += t.bytes();
      }
      const std::size_t count = at / transport::dtype_size(b.type);
      comm_->allreduce(fused, count, b.type, transport::reduce_op::sum, d);
      // Copy out and average in one pass.
      at = 0;
      for (std::size_t i = b.first; i < b.last; ++i) {
        const tensor_ref& t = tensors_[i];
        if (t.type == transport::dtype::f32)
          detail::divide_into(static_cast<float*>(t.data), reinterpret_cast<const float*>(fused + at),
                              t.count, n);
        else
          detail::divide_into(static_cast<double*>(t.data),
                              reinterpret_cast<const double*>(fused + at), t.count, n);
        at += t.bytes();
      }
    }
    for (const view_bucket& b : views_) {
      if (b.used == 0) continue;
      const tensor_ref t = b.type == transport::dtype::f32
                               ? tensor_ref(reinterpret_cast<float*>(b.base()), b.used / sizeof(float))
                               : tensor_ref(reinterpret_cast<double*>(b.base()), b.used / sizeof(double));
      comm_->allreduce(t.data, t.count, t.type, transport::reduce_op::sum, d);
      detail::divide(t, n);
    }
  }

  /// All-reduces per average() call: buckets of add()ed tensors plus non-empty view buckets.
  std::size_t buckets() {
    plan();
    std::size_t v = 0;
    for (const view_bucket& b : views_) v += b.used != 0 ? 1 : 0;
    return buckets_.size() + v;
  }
  std::size_t tensors() const noexcept { return tensors_.size(); }
  const bucketed_allreducer_options& options() const noexcept { return options_; }
  /// Whether the tensors are device buffers (the communicator's capabilities say so).
  bool on_device() const noexcept { return device_; }

private:
  struct bucket {
    std::size_t first, last;  // tensors [first, last), contiguous in registration order
    transport::dtype type;
  };
  struct view_bucket {
    transport::dtype type = transport::dtype::f32;
    std::size_t capacity = 0, used = 0;  // bytes
    std::unique_ptr<double[]> storage;   // host: doubles, so either dtype is aligned
    detail::device_block<C> device;      // device communicators
    unsigned char* base() const noexcept {
      return storage ? reinterpret_cast<unsigned char*>(storage.get())
                     : static_cast<unsigned char*>(device.get());
    }
  };

  // The device form of average(): the same buckets, fusion copies and ncclAvg on the stream,
  // one wait at the end for the copies out.
  void average_on_device(const transport::deadline& d) {
    if constexpr (detail::has_device_ops_v<C>) {
      bool copied = false;
      for (const bucket& b : buckets_) {
        if (b.last - b.first == 1) {
          const tensor_ref& t = tensors_[b.first];
          comm_->allreduce_average(t.data, t.count, t.type, stream_, d);
          continue;
        }
        auto* fused = static_cast<unsigned char*>(fusion_device_.get());
        std::size_t at = 0;
        for (std::size_t i = b.first; i < b.last; ++i) {
          const tensor_ref& t = tensors_[i];
          comm_->copy_async(fused + at, t.data, t.bytes(), stream_);
          at += t.bytes();
        }
        comm_->allreduce_average(fused, at / transport::dtype_size(b.type), b.type, stream_, d);
        at = 0;
        for (std::size_t i = b.first; i < b.last; ++i) {
          const tensor_ref& t = tensors_[i];
          comm_->copy_async(t.data, fused + at, t.bytes(), stream_);
          at += t.bytes();
        }
        copied = true;
      }
      for (const view_bucket& b : views_) {
        if (b.used == 0) continue;
        comm_->allreduce_average(b.base(), b.used / transport::dtype_size(b.type), b.type, stream_, d);
      }
      if (copied) comm_->synchronize(stream_, d);
    }
  }

  // Consecutive tensors of one dtype fill a bucket until the next would overflow it; empty
  // tensors join whatever bucket is open (they move nothing) and never form one of their own.
  void plan() {
    if (planned_) return;
    buckets_.clear();
    std::size_t largest = 0;
    std::size_t i = 0;
    while (i < tensors_.size()) {
      if (tensors_[i].count == 0) {
        ++i;
        continue;
      }
      bucket b{i, i + 1, tensors_[i].type};
      std::size_t bytes = tensors_[i].bytes();
      while (b.last < tensors_.size()) {
        const tensor_ref& t = tensors_[b.last];
        if (t.count != 0 && (t.type != b.type || bytes + t.bytes() > options_.bucket_bytes))
          break;
        bytes += t.bytes();
        ++b.last;
      }
      if (b.last - b.first > 1 && bytes > largest) largest = bytes;
      buckets_.push_back(b);
      i = b.last;
    }
    // A bucket of one non-empty tensor plus empty ones is still in place: drop the empties.
    for (bucket& b : buckets_) {
      std::size_t nonempty = 0, only = b.first;
      for (std::size_t k = b.first; k < b.last; ++k)
        if (tensors_[k].count != 0) ++nonempty, only = k;
      if (nonempty == 1) b = bucket{only, only + 1, b.type};
    }
    if (device_) {
      if (fusion_device_.bytes() < largest) fusion_device_ = detail::device_block<C>(*comm_, largest);
      planned_ = true;
      return;
    }
    // The fusion buffer as doubles, so either dtype is aligned in it.
    fusion_storage_.assign((largest + sizeof(double) - 1) / sizeof(double), 0.0);
    fusion_ = span<unsigned char>(reinterpret_cast<unsigned char*>(fusion_storage_.data()),
                                  fusion_storage_.size() * sizeof(double));
    planned_ = true;
  }

  C* comm_;
  bucketed_allreducer_options options_;
  bool device_ = false;
  void* stream_ = nullptr;
  std::vector<tensor_ref> tensors_;
  std::vector<bucket> buckets_;
  std::vector<view_bucket> views_;
  std::vector<double> fusion_storage_;
  span<unsigned char> fusion_;
  detail::device_block<C> fusion_device_;  // device communicators: the fusion buffer
  bool planned_ = false;
};

}  // namespace cadence::exchange
