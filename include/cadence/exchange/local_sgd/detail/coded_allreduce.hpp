// The sum of a float vector over the ranks of a communicator, started now and finished later so
// that it overlaps inner steps: over f32, the communicator's own iallreduce; over a lossy codec
// (exchange/local_sgd/codec.hpp), a ring (reduce-scatter, then all-gather) of encoded segments
// over isend/irecv, every hop decoding, adding its own part and encoding again. The owner of a
// segment encodes the reduced segment once and every rank, the owner included, decodes those
// bytes, so every rank ends with the same floats. Error feedback lives in the ring: a rank
// encodes every segment exactly once per operation (its own part first, then the partial sums
// it passes on, last the segment it owns), always at the same place in the ring, so a residual
// per element (what the last encoding of that element lost) is added before each encoding and
// the loss of every hop is fed back at the next operation, not only the loss of this rank's own
// part. bytes_sent() counts what this rank sent.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/exchange/detail/device.hpp>
#include <cadence/exchange/local_sgd/codec.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::exchange::detail {

/// Bytes a ring all-reduce of `bytes` sends from each of `n` ranks: 2 (n - 1) / n of them, the
/// bandwidth-optimal figure (what the f32 path is counted at, whatever the backend's algorithm).
inline std::uint64_t ring_bytes(std::size_t bytes, std::size_t n) {
  return n <= 1 ? 0 : static_cast<std::uint64_t>(2 * (n - 1) * bytes / n);
}

template <class C>
class coded_allreduce {
  static constexpr bool async = transport::has_async_v<C>;
  using work = typename work_of<C>::type;

public:
  /// Starts the sum of `in` (n floats) over the ranks of `c` into `out` (n floats; may be `in`
  /// for f32 only): f32 through the communicator's all-reduce, other codecs through the coded
  /// ring on tag `tag`. `in` must stay unchanged and both valid until done. Over a
  /// communicator without asynchronous operations, f32 runs at once, blocking until `d`.
  /// `residual` (n floats, or null: no error feedback) is added before each encoding and
  /// replaced by what it lost; it must stay valid until done.
  void start(C& c, outer_codec codec, const float* in, float* out, std::size_t n, int tag,
             const transport::deadline& d, float* residual = nullptr) {
    c_ = &c;
    codec_ = codec;
    in_ = in;
    out_ = out;
    residual_ = residual;
    n_ = n;
    tag_ = tag;
    ranks_ = c.size();
    rank_ = c.rank();
    step_ = 0;
    posted_ = false;
    active_ = true;
    if (ranks_ == 1 || n == 0) {  // nothing to send, nobody to wait for
      if (out != in) std::memcpy(out, in, n * sizeof(float));
      active_ = false;
      return;
    }
    if (codec == outer_codec::f32) {
      if (out != in) std::memcpy(out, in, n * sizeof(float));
      bytes_ += ring_bytes(n * sizeof(float), static_cast<std::size_t>(ranks_));
      if constexpr (async) {
        whole_ = c.iallreduce(out, n, transport::dtype::f32, transport::reduce_op::sum);
      } else {
        c.allreduce(out, n, transport::dtype::f32, transport::reduce_op::sum, d);
        active_ = false;
      }
      return;
    }
    if constexpr (!async) {
      (void)d;
      throw invalid_parameter_error("cadence::exchange: codec " + std::string(outer_codec_name(codec)) +
                                    " needs a communicator with asynchronous operations (isend, irecv)");
    } else {
      std::size_t most = 0;
      for (int s = 0; s < ranks_; ++s) most = std::max(most, encoded_bytes(codec, seg_count(s)));
      tx_.resize(most);
      rx_.resize(most);
      scratch_.resize(n_ / static_cast<std::size_t>(ranks_) + 1);
      back_.resize(scratch_.size());
      const int seg = rank_;  // step 0 sends this rank's own segment, encoded from `in`
      std::memcpy(scratch_.data(), in_ + first(seg), seg_count(seg) * sizeof(float));
      encode_with_feedback(seg, scratch_.data());
      tx_seg_ = seg;
    }
  }

  /// Moves the operation on without blocking; true once the sum is in `out` (and whenever
  /// nothing is in flight). Throws the communicator's transport_error.
  bool progress() {
    if (!active_) return true;
    if constexpr (async) {
      if (codec_ == outer_codec::f32) {
        if (!whole_.test()) return false;
        active_ = false;
        return true;
      }
      const int steps = 2 * (ranks_ - 1);
      while (step_ < steps) {
        if (!posted_) post();
        if (!recv_.test() || !send_.test()) return false;
        finish_step();
        ++step_;
        posted_ = false;
      }
      active_ = false;
    }
    return true;
  }

  /// Blocks until done or `d` passes (the communicator's transport_error, naming the peer).
  void wait(const transport::deadline& d) {
    if constexpr (async) {
      while (!progress()) {
        if (codec_ == outer_codec::f32) {
          whole_.wait(d);
        } else {
          recv_.wait(d);
          send_.wait(d);
        }
      }
    } else {
      (void)d;
    }
  }

  /// Whether an operation is in flight.
  bool active() const noexcept { return active_; }
  /// Bytes this rank sent (payload) over every operation so far.
  std::uint64_t bytes_sent() const noexcept { return bytes_; }
  /// Drops what is in flight (after a failure: the communicator is failed or replaced).
  void drop() noexcept {
    if constexpr (async) {
      whole_ = work();
      recv_ = recv_work();
      send_ = send_work();
    }
    active_ = false;
  }

private:
  template <class X, bool = transport::has_async_v<X>>
  struct p2p {
    using recv = no_work;
    using send = no_work;
  };
  template <class X>
  struct p2p<X, true> {
    using recv = decltype(std::declval<X&>().irecv(std::declval<void*>(), std::size_t{}, int{}, int{}));
    using send = decltype(std::declval<X&>().isend(std::declval<const void*>(), std::size_t{}, int{}, int{}));
  };
  using recv_work = typename p2p<C>::recv;
  using send_work = typename p2p<C>::send;

  std::size_t first(int seg) const noexcept {
    return n_ * static_cast<std::size_t>(seg) / static_cast<std::size_t>(ranks_);
  }
  std::size_t seg_count(int seg) const noexcept { return first(seg + 1) - first(seg); }
  int left() const noexcept { return (rank_ + ranks_ - 1) % ranks_; }
  int right() const noexcept { return (rank_ + 1) % ranks_; }
  // Reduce-scatter step s < n - 1 receives segment r - s - 1; all-gather step s' = s - (n - 1)
  // receives segment r - s'.
  int seg_in(int s) const noexcept {
    return s < ranks_ - 1 ? (rank_ - s - 1 + 2 * ranks_) % ranks_ : (rank_ - (s - (ranks_ - 1)) + 2 * ranks_) % ranks_;
  }

  void post() {
    if constexpr (async) {
      const int in_seg = seg_in(step_);
      recv_ = c_->irecv(rx_.data(), encoded_bytes(codec_, seg_count(in_seg)), left(), tag_);
      const std::size_t out_bytes = encoded_bytes(codec_, seg_count(tx_seg_));
      send_ = c_->isend(tx_.data(), out_bytes, right(), tag_);
      bytes_ += out_bytes;
      posted_ = true;
    }
  }

  void finish_step() {
    const int seg = seg_in(step_);
    const std::size_t cnt = seg_count(seg);
    float* o = out_ + first(seg);
    if (step_ < ranks_ - 1) {
      // Reduce-scatter: the partial sum so far plus this rank's part, encoded for the next hop;
      // at the last step this rank owns the segment: its encoding is final, decoded here too.
      decode(codec_, rx_.data(), cnt, scratch_.data());
      const float* mine = in_ + first(seg);
      for (std::size_t i = 0; i < cnt; ++i) o[i] = scratch_[i] + mine[i];
      encode_with_feedback(seg, o);
      tx_seg_ = seg;
      if (step_ == ranks_ - 2) decode(codec_, tx_.data(), cnt, o);
    } else {
      // All-gather: the owner's bytes, decoded and passed on unchanged.
      decode(codec_, rx_.data(), cnt, o);
      std::swap(tx_, rx_);
      tx_seg_ = seg;
    }
  }

  // Encodes segment `seg`'s values `v` (modified: the residual is added) into tx_; the residual
  // keeps what the encoding lost.
  void encode_with_feedback(int seg, float* v) {
    const std::size_t cnt = seg_count(seg);
    if (residual_ == nullptr) {
      encode(codec_, v, cnt, tx_.data());
      return;
    }
    float* r = residual_ + first(seg);
    for (std::size_t i = 0; i < cnt; ++i) v[i] += r[i];
    encode(codec_, v, cnt, tx_.data());
    decode(codec_, tx_.data(), cnt, back_.data());
    for (std::size_t i = 0; i < cnt; ++i) r[i] = v[i] - back_[i];
  }

  C* c_ = nullptr;
  float* residual_ = nullptr;
  outer_codec codec_ = outer_codec::f32;
  const float* in_ = nullptr;
  float* out_ = nullptr;
  std::size_t n_ = 0;
  int tag_ = 0, ranks_ = 1, rank_ = 0, step_ = 0, tx_seg_ = 0;
  bool posted_ = false, active_ = false;
  std::uint64_t bytes_ = 0;
  std::vector<unsigned char> tx_, rx_;
  std::vector<float> scratch_, back_;
  work whole_{};
  recv_work recv_{};
  send_work send_{};
};

}  // namespace cadence::exchange::detail
