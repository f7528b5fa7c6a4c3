/// \file
/// \ingroup exchange
/// BSP gradient all-reduce over any communicator: registered tensors fused into buckets (as
/// PyTorch DDP does), each bucket averaged as soon as its last gradient is ready, so
/// communication overlaps the rest of the backward pass.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/exchange/detail/device.hpp>
#include <cadence/exchange/detail/tensor.hpp>
#include <cadence/exchange/tensor_ref.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// How a bucketed_allreducer groups and waits.
struct bucketed_allreducer_options {
  /// Most bytes fused into one bucket (DDP's bucket_cap_mb, 25 MiB by default). A tensor
  /// larger than this travels alone, in place.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Deadline of one finish() (or average()): every bucket of the step must be reduced by then.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// Device communicators (NCCL) only: the caller's cudaStream_t, on which the gradients are
  /// written (null: the legacy default stream). A bucket's copies and all-reduce run on the
  /// communicator's own stream, made to wait (an event recorded on this stream at launch) for
  /// the work the caller enqueued here before the bucket's last mark_ready(). A host
  /// communicator refuses a non-null stream.
  void* stream = nullptr;
  /// Host communicators with the asynchronous operations (MPI, gloo, in-process) only: a bucket
  /// that is copied into a fusion buffer is all-reduced in parts of at most this many bytes
  /// (whole elements), each started as soon as the tensors that fill it are marked ready and
  /// copied in, so the copies of the rest (and the copies out of the parts already reduced)
  /// can overlap the all-reduce of the parts before them. 0 (the default): one all-reduce per
  /// bucket. Each part is a collective of its own (its own handshake); on the loaded 2-core
  /// machine where it was measured, parts of 64 KiB-1 MiB were slower than one all-reduce
  /// (docs/results.md), so try it where a core is free for the copies. Over more than 2 ranks
  /// parts can change the rounding (see the class). A bucket reduced in place, and every bucket
  /// over a device or a blocking communicator, is one all-reduce whatever this says.
  std::size_t part_bytes = 0;
};

/// Averages a fixed set of gradient tensors across all ranks every step (BSP data parallelism).
///
/// Register the tensors once with add() (or add_view()), in the same order and sizes on every
/// rank; tensor i is the i-th registered, views included. Tensors are grouped into buckets of
/// one dtype and at most bucket_bytes in **reverse registration order**, as DDP's reducer does:
/// backward produces the last layers' gradients first, so bucket 0 holds the last-registered
/// tensors. During backward, call mark_ready(i) when tensor i's gradient is complete: when that
/// completes its bucket (and every lower bucket has been launched, so every rank issues the
/// buckets' all-reduces in the same order whatever order its gradients come in), the bucket's
/// all-reduce starts and runs while backward goes on. finish() waits for all of them (marking
/// any tensor not marked yet, in reverse order); then every tensor holds the mean over ranks.
/// average() is mark-everything-then-finish, for a caller without hooks in its backward pass.
///
/// The overlap needs a communicator with the asynchronous operations (communicator.hpp); over
/// one without them a bucket's all-reduce runs, blocking, inside the mark_ready() that
/// launches it. Backends whose progress needs the caller's thread (MPI, gloo: only the owning
/// thread enters them) progress in-flight buckets in every mark_ready(), in poll(), and in
/// finish(); call poll() between pieces of work to keep them moving.
///
/// Copies: a bucket whose tensors lie back to back in memory (one tensor, a flat parameter
/// buffer cut into tensors, views from add_view()) is reduced in place, without copies, and the
/// division by the number of ranks happens inside the backend (allreduce_average) where it has
/// one. Other buckets are copied into a fusion buffer of their own (each bucket may be in
/// flight at once) and back, with no pass beyond those two copies: each tensor is copied in
/// when it is marked ready (during backward, not at the launch), the average is the backend's
/// (or, where it only sums, the division happens during the copy out), and over a host
/// communicator with the asynchronous operations a bucket can be all-reduced in parts
/// (options.part_bytes, off by default), each launched as soon as its bytes are in, so the
/// copies in of the rest and the copies out of the parts already reduced overlap the all-reduce.
///
/// Results equal an unbucketed allreduce_avg of each tensor exactly whenever the sums are
/// exact (integer-valued inputs); in general they can differ only by the backend's summation
/// order (over more than 2 ranks a ring sums an element in an order that depends on where it
/// falls in the buffer, so the parts can round differently from one whole-bucket all-reduce). Every rank issues the same all-reduces in the same order, so a rank that registered
/// different tensors fails the step on the backends that see the mismatch (transport_error); a
/// stalled rank makes the others throw transport_error naming it within the timeout.
///
/// Over a communicator with device buffers (nccl_communicator) the tensors are device pointers:
/// fusion copies are cudaMemcpyAsync, the fusion buffers and views are device memory allocated
/// through the communicator, and the average is NCCL's (ncclAvg). A bucket's work runs on the
/// communicator's stream after an event on the caller's stream (options.stream): see there.
/// finish() returns when the results are in the tensors (the host waits for the work's end).
template <class C>
class bucketed_allreducer {
  CADENCE_REQUIRE_COMMUNICATOR(C);

public:
  /// An all-reducer over `comm` with `options` (no tensors yet: add() them). Throws
  /// invalid_parameter_error for a zero bucket_bytes, a timeout <= 0, or a stream over a host
  /// communicator.
  explicit bucketed_allreducer(C& comm, bucketed_allreducer_options options = {})
      : comm_(&comm), options_(options),
        device_(detail::uses_device(comm, "bucketed_allreducer", options.stream)),
        caller_stream_(options.stream) {
    if (options.bucket_bytes == 0)
      throw invalid_parameter_error(here() + "bucket_bytes must be > 0");
    detail::check_timeout("bucketed_allreducer", options.timeout);
  }

  /// Not copyable: the buckets in flight point into it.
  bucketed_allreducer(const bucketed_allreducer&) = delete;
  /// Not copyable.
  bucketed_allreducer& operator=(const bucketed_allreducer&) = delete;

  /// Registers tensor `t` (f32 or f64; a zero count is allowed and moves nothing); returns its
  /// index. Buckets are planned again at the next step. Not during a step.
  std::size_t add(tensor_ref t) {
    check_between_steps("add()");
    detail::check_tensor("bucketed_allreducer", comm_->rank(), comm_->size(), t, tensors_.size());
    tensors_.push_back(t);
    arena_of_.push_back(npos);
    planned_ = false;
    return tensors_.size() - 1;
  }
  /// Registers the `n` floats at `p`, as add(tensor_ref).
  std::size_t add(float* p, std::size_t n) { return add(tensor_ref(p, n)); }
  /// Registers the `n` doubles at `p`, as add(tensor_ref).
  std::size_t add(double* p, std::size_t n) { return add(tensor_ref(p, n)); }

  /// Registers a tensor that lives inside a bucket (DDP's gradient_as_bucket_view): returns
  /// storage for `count` elements of T (float or double), zero-filled, valid as long as the
  /// allreducer (device memory over a device communicator). Its index is tensors() - 1 after the
  /// call. Consecutive views of one dtype are allocated back to back, so their buckets are
  /// reduced in place, with no copy in or out of a fusion buffer.
  template <class T>
  T* add_view(std::size_t count) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "cadence::exchange::bucketed_allreducer::add_view<T>: T must be float or double");
    check_between_steps("add_view()");
    constexpr transport::dtype type = transport::dtype_of_v<T>;
    const std::size_t bytes = count * sizeof(T);
    if (arenas_.empty() || arenas_.back().type != type ||
        arenas_.back().used + bytes > arenas_.back().capacity) {
      arena a;
      a.type = type;
      a.capacity = std::max(bytes, options_.bucket_bytes);
      if (device_) {
        a.device = detail::device_block<C>(*comm_, a.capacity);
        if constexpr (detail::has_device_ops_v<C>) {
          comm_->zero_async(a.device.get(), a.capacity, comm_->stream());
          comm_->synchronize(comm_->stream(), transport::deadline(options_.timeout));
        }
      } else {
        a.storage.reset(new double[(a.capacity + sizeof(double) - 1) / sizeof(double)]());
      }
      arenas_.push_back(std::move(a));
    }
    arena& a = arenas_.back();
    T* p = reinterpret_cast<T*>(a.base() + a.used);
    a.used += bytes;
    tensors_.push_back(tensor_ref(p, count));
    arena_of_.push_back(arenas_.size() - 1);
    planned_ = false;
    return p;
  }

  /// Tensor `index`'s gradient is complete for this step. Copies it into its bucket's fusion
  /// buffer (a bucket not reduced in place, host memory), launches its bucket's all-reduce (or
  /// the parts of it this tensor completes: options().part_bytes) when this was the last tensor
  /// it waited for (and the lower buckets are launched), and progresses the buckets in flight.
  /// The tensor is read here, not later: do not write to it before finish(). Throws
  /// invalid_parameter_error for an index out of range or a tensor already marked this step;
  /// transport_error from the backend.
  void mark_ready(std::size_t index) {
    plan();
    if (index >= tensors_.size())
      throw invalid_parameter_error(here() + "mark_ready(" + std::to_string(index) + "): there are " +
                                    std::to_string(tensors_.size()) + " tensors");
    if (!in_step_) begin_step();
    if (marked_[index])
      throw invalid_parameter_error(here() + "mark_ready(" + std::to_string(index) +
                                    "): tensor already marked ready in this step (call finish() "
                                    "to end the step)");
    mark(index);
  }

  /// Progresses the buckets in flight without blocking; true when every launched bucket has
  /// completed (its results in the tensors).
  bool poll() {
    if constexpr (transport::has_async_v<C>) {
      for (std::size_t p = 0; p < next_launch_; ++p) {
        part& k = parts_[p];
        if (k.done) continue;
        if (k.work && k.work->test()) {
          complete(k);
        } else {
          return false;  // the backends progress in issue order; a later one cannot be done first
        }
      }
    }
    return true;
  }

  /// poll() for a thread that is otherwise idle (its accelerator computes): progresses the
  /// buckets in flight until they have all completed (true) or `until` comes (false). Where the
  /// backend's work handles can wait with a time limit (MPI, gloo: wait_until), the thread
  /// waits in them, so the backend's own threads get the cores; elsewhere it tests and yields.
  bool poll_until(std::chrono::steady_clock::time_point until) {
    if constexpr (transport::has_async_v<C>) {
      for (std::size_t p = 0; p < next_launch_; ++p) {
        part& k = parts_[p];
        if (k.done) continue;
        if constexpr (detail::has_wait_until_v<work_type>) {
          if (!k.work->wait_until(until)) return false;
        } else {
          while (!k.work->test()) {
            if (std::chrono::steady_clock::now() >= until) return false;
            std::this_thread::yield();
          }
        }
        complete(k);
      }
    }
    return true;
  }

  /// Ends the step: marks every tensor not marked yet (in reverse registration order), then
  /// waits, within options().timeout, until every bucket's average is in its tensors.
  void finish() {
    plan();
    const transport::deadline d = transport::deadline(options_.timeout);
    struct end_step {
      bucketed_allreducer* self;
      ~end_step() { self->reset_step(); }
    } guard{this};
    if (!in_step_) begin_step();
    for (std::size_t i = tensors_.size(); i-- > 0;)
      if (!marked_[i]) mark(i);
    launch_ready();
    for (part& k : parts_) {
      if (k.done) continue;
      if constexpr (transport::has_async_v<C>) {
        if (k.work) k.work->wait(d);
      }
      complete(k);
    }
  }

  /// Replaces every registered tensor with its average over all ranks: mark_ready() for every
  /// tensor, then finish().
  void average() { finish(); }

  /// Buckets per step (tensors of zero elements join none); each is one all-reduce, or one per
  /// part (allreduces()).
  std::size_t buckets() {
    plan();
    return buckets_.size();
  }
  /// All-reduces per step: one per bucket, or one per part of a bucket cut into parts
  /// (options().part_bytes).
  std::size_t allreduces() {
    plan();
    return parts_.size();
  }
  /// Buckets whose all-reduce (every part of it) has been launched in the current step (0
  /// between steps).
  std::size_t launched() const noexcept {
    if (!in_step_ || next_launch_ == 0) return 0;
    const part& last = parts_[next_launch_ - 1];
    const bucket& b = buckets_[last.owner];
    return last.owner + (next_launch_ == b.first_part + b.parts ? 1 : 0);
  }
  /// Buckets reduced without a fusion copy (their tensors adjacent in memory).
  std::size_t in_place_buckets() {
    plan();
    std::size_t n = 0;
    for (const bucket& b : buckets_) n += b.in_place != nullptr ? 1 : 0;
    return n;
  }
  /// The bucket tensor `index` belongs to (buckets in launch order), or SIZE_MAX for an empty one.
  std::size_t bucket_of(std::size_t index) {
    plan();
    return index < owner_.size() ? owner_[index] : npos;
  }
  /// Tensors registered (views included).
  std::size_t tensors() const noexcept { return tensors_.size(); }
  /// The options it was built with.
  const bucketed_allreducer_options& options() const noexcept { return options_; }
  /// Whether the tensors are device buffers (the communicator's capabilities say so).
  bool on_device() const noexcept { return device_; }

private:
  // Map: tensors_ (registration order) and arena_of_ (the view arena of each, npos for add());
  // plan() derives buckets_ (bucket 0 = the last-registered tensors), owner_ and slot_ (tensor
  // -> bucket, and its place among the bucket's members), and parts_ (the all-reduces in launch
  // order: each bucket's parts together, bucket 0's first, a bucket's from its end back, as
  // backward fills it). A step: begin_step() resets marked_ and each part's pending count;
  // mark() copies a tensor into its fusion buffer and counts down the parts it covers;
  // launch_ready() launches parts in order from next_launch_; poll() and finish() complete them
  // (complete(): the copy out of the fusion buffer, dividing where the backend only summed).
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  using work_type = typename detail::work_of<C>::type;

  struct arena {
    transport::dtype type = transport::dtype::f32;
    std::size_t capacity = 0, used = 0;  // bytes
    std::unique_ptr<double[]> storage;   // host: doubles, so either dtype is aligned
    detail::device_block<C> device;      // device communicators
    unsigned char* base() const noexcept {
      return storage ? reinterpret_cast<unsigned char*>(storage.get())
                     : static_cast<unsigned char*>(device.get());
    }
  };

  struct bucket {
    std::vector<std::size_t> members;  // non-empty tensors, ascending
    std::vector<std::size_t> offsets;  // each member's first byte in the bucket
    transport::dtype type = transport::dtype::f32;
    std::size_t bytes = 0, count = 0;
    void* in_place = nullptr;           // the members' memory when adjacent (no fusion copies)
    std::vector<double> fusion;         // host fusion buffer (doubles: aligned for either dtype)
    detail::device_block<C> fusion_device;
    std::size_t first_part = 0, parts = 1;  // its all-reduces: parts_[first_part, +parts)
    unsigned char* data() noexcept {
      if (in_place != nullptr) return static_cast<unsigned char*>(in_place);
      return fusion_device.get() != nullptr ? static_cast<unsigned char*>(fusion_device.get())
                                            : reinterpret_cast<unsigned char*>(fusion.data());
    }
  };

  // One all-reduce: bytes [begin, end) of bucket `owner`.
  struct part {
    std::size_t owner = 0, begin = 0, end = 0;
    std::size_t covering = 0;  // members with bytes in it
    std::size_t pending = 0;   // of those, not marked yet in this step
    bool done = false;
    bool divide = false;  // the backend summed: divide at completion
    std::optional<work_type> work;
  };

  std::string here() const { return detail::where("bucketed_allreducer", comm_->rank(), comm_->size()); }

  void check_between_steps(const char* what) const {
    if (in_step_)
      throw invalid_parameter_error(here() + what + " during a step (after mark_ready(), before "
                                    "finish())");
  }

  void begin_step() {
    marked_.assign(tensors_.size(), 0);
    for (part& k : parts_) {
      k.pending = k.covering;
      k.done = false;
      k.divide = false;
      k.work.reset();
    }
    next_launch_ = 0;
    in_step_ = true;
  }

  void reset_step() noexcept {
    in_step_ = false;
    next_launch_ = 0;
  }

  // Whether a bucket's members are copied into its host fusion buffer (as they are marked).
  bool copies_in(const bucket& b) const noexcept { return !device_ && b.in_place == nullptr; }

  // Marks tensor i ready: copies it in (a host fusion buffer), counts down the parts it covers,
  // launches what became ready.
  void mark(std::size_t i) {
    marked_[i] = 1;
    const std::size_t o = owner_[i];
    if (o == npos) {
      poll();
      return;
    }
    bucket& b = buckets_[o];
    const std::size_t at = b.offsets[slot_[i]], end = at + tensors_[i].bytes();
    if (copies_in(b)) copy_in(b, at, tensors_[i]);
    bool ready = false;
    for (std::size_t p = b.first_part; p < b.first_part + b.parts; ++p) {
      part& k = parts_[p];
      if (k.begin < end && at < k.end) ready |= --k.pending == 0;
    }
    if (ready) launch_ready();
    else poll();
  }

  // Copies tensor t into the fusion buffer at byte `at`, in pieces of part_bytes with a poll()
  // between them while parts are in flight, so that they progress meanwhile.
  void copy_in(bucket& b, std::size_t at, const tensor_ref& t) {
    auto* to = b.data() + at;
    const auto* from = static_cast<const unsigned char*>(t.data);
    const std::size_t piece = b.parts > 1 ? options_.part_bytes : t.bytes();
    for (std::size_t done = 0; done < t.bytes();) {
      const std::size_t n = std::min(piece, t.bytes() - done);
      std::memcpy(to + done, from + done, n);
      done += n;
      if (done < t.bytes() && next_launch_ > 0) poll();
    }
  }

  // Parts launch in order: a ready part waits for the ones before it, so every rank issues the
  // same all-reduces in the same order.
  void launch_ready() {
    poll();
    while (next_launch_ < parts_.size() && parts_[next_launch_].pending == 0) launch(parts_[next_launch_++]);
  }

  void launch(part& k) {
    bucket& b = buckets_[k.owner];
    if (device_) {
      if constexpr (detail::has_device_ops_v<C>) launch_on_device(b, k);
      return;
    }
    void* data = b.data() + k.begin;
    const std::size_t count = (k.end - k.begin) / transport::dtype_size(b.type);
    if constexpr (transport::has_async_average_v<C>) {
      k.work.emplace(comm_->iallreduce_average(data, count, b.type));
    } else if constexpr (transport::has_async_v<C>) {
      k.work.emplace(comm_->iallreduce(data, count, b.type, transport::reduce_op::sum));
      k.divide = true;
    } else {
      if constexpr (transport::has_allreduce_average_v<C>) {
        comm_->allreduce_average(data, count, b.type, transport::deadline(options_.timeout));
      } else {
        comm_->allreduce(data, count, b.type, transport::reduce_op::sum, transport::deadline(options_.timeout));
        k.divide = true;  // divided in place, or during the copy out
      }
      complete(k);  // blocking: the results go out at once
    }
  }

  // The device form (one part per bucket): after the caller's stream (an event), on the
  // communicator's stream: the copies in, ncclAvg, the copies out; the bucket's handle
  // completes after the last of them.
  void launch_on_device(bucket& b, part& k) {
    if constexpr (detail::has_device_ops_v<C>) {
      void* s = comm_->stream();
      comm_->stream_wait(s, caller_stream_);
      if (b.in_place != nullptr) {
        k.work.emplace(comm_->iallreduce_average(b.in_place, b.count, b.type, s));
        return;
      }
      auto* fused = static_cast<unsigned char*>(b.fusion_device.get());
      std::size_t at = 0;
      for (std::size_t i : b.members) {
        comm_->copy_async(fused + at, tensors_[i].data, tensors_[i].bytes(), s);
        at += tensors_[i].bytes();
      }
      auto reduce = comm_->iallreduce_average(fused, b.count, b.type, s);
      at = 0;
      for (std::size_t i : b.members) {
        comm_->copy_async(tensors_[i].data, fused + at, tensors_[i].bytes(), s);
        at += tensors_[i].bytes();
      }
      k.work.emplace(comm_->record(s, std::move(reduce)));  // after the copies out, named as the all-reduce
    }
  }

  // A launched part whose all-reduce has completed: the copy out of its fusion buffer (host)
  // and, where the backend only summed, the division (during that copy, or in place).
  void complete(part& k) {
    if (k.done) return;
    k.done = true;
    k.work.reset();
    if (device_) return;  // the copies out were enqueued behind the all-reduce
    bucket& b = buckets_[k.owner];
    const double n = static_cast<double>(comm_->size());
    const std::size_t esize = transport::dtype_size(b.type);
    if (b.in_place != nullptr) {
      if (k.divide) divide_into(b.data() + k.begin, b.data() + k.begin, (k.end - k.begin) / esize, b.type, n);
      return;
    }
    for (std::size_t m = 0; m < b.members.size(); ++m) {
      const tensor_ref& t = tensors_[b.members[m]];
      const std::size_t at = b.offsets[m];
      const std::size_t from = std::max(at, k.begin), to = std::min(at + t.bytes(), k.end);
      if (from >= to) continue;
      unsigned char* out = static_cast<unsigned char*>(t.data) + (from - at);
      if (k.divide)
        divide_into(out, b.data() + from, (to - from) / esize, b.type, n);
      else
        std::memcpy(out, b.data() + from, to - from);
    }
  }

  static void divide_into(void* out, const void* from, std::size_t count, transport::dtype t, double n) {
    transport::detail::divide_into(out, from, count, t, n);
  }

  // Buckets from the last tensor back: consecutive non-empty tensors of one dtype (and one view
  // arena) until the next would overflow bucket_bytes; empty tensors belong to none. A copying
  // bucket over a host communicator with the asynchronous operations is cut into parts of
  // part_bytes, launched from its end back.
  void plan() {
    if (planned_) return;
    buckets_.clear();
    parts_.clear();
    owner_.assign(tensors_.size(), npos);
    slot_.assign(tensors_.size(), npos);
    std::size_t i = tensors_.size();
    while (i > 0) {
      --i;
      if (tensors_[i].count == 0) continue;
      bucket b;
      b.type = tensors_[i].type;
      b.members.push_back(i);
      b.bytes = tensors_[i].bytes();
      std::size_t j = i;
      while (j > 0) {
        const tensor_ref& t = tensors_[j - 1];
        if (t.count != 0 && (t.type != b.type || arena_of_[j - 1] != arena_of_[i] ||
                             b.bytes + t.bytes() > options_.bucket_bytes))
          break;
        --j;
        if (t.count == 0) continue;
        b.members.push_back(j);
        b.bytes += t.bytes();
      }
      std::reverse(b.members.begin(), b.members.end());
      b.count = b.bytes / transport::dtype_size(b.type);
      std::size_t at = 0;
      for (std::size_t m = 0; m < b.members.size(); ++m) {
        b.offsets.push_back(at);
        slot_[b.members[m]] = m;
        at += tensors_[b.members[m]].bytes();
      }
      // In place when the members lie back to back in registration order.
      bool adjacent = true;
      for (std::size_t k = 1; k < b.members.size() && adjacent; ++k) {
        const tensor_ref& prev = tensors_[b.members[k - 1]];
        adjacent = static_cast<const unsigned char*>(prev.data) + prev.bytes() == tensors_[b.members[k]].data;
      }
      if (adjacent) {
        b.in_place = tensors_[b.members.front()].data;
      } else if (device_) {
        b.fusion_device = detail::device_block<C>(*comm_, b.bytes);
      } else {
        b.fusion.assign((b.bytes + sizeof(double) - 1) / sizeof(double), 0.0);
      }
      for (std::size_t m : b.members) owner_[m] = buckets_.size();
      plan_parts(b, buckets_.size());
      buckets_.push_back(std::move(b));
      i = j;
    }
    marked_.assign(tensors_.size(), 0);
    planned_ = true;
  }

  void plan_parts(bucket& b, std::size_t owner) {
    const std::size_t esize = transport::dtype_size(b.type);
    std::size_t size = b.bytes;  // one part
    if (transport::has_async_v<C> && copies_in(b) && options_.part_bytes > 0)
      size = std::max(esize, options_.part_bytes / esize * esize);
    b.first_part = parts_.size();
    b.parts = (b.bytes + size - 1) / size;
    for (std::size_t p = b.parts; p-- > 0;) {
      part k;
      k.owner = owner;
      k.begin = p * size;
      k.end = std::min(b.bytes, k.begin + size);
      for (std::size_t m = 0; m < b.members.size(); ++m)
        k.covering += b.offsets[m] < k.end && k.begin < b.offsets[m] + tensors_[b.members[m]].bytes() ? 1 : 0;
      parts_.push_back(std::move(k));
    }
  }

  C* comm_;
  bucketed_allreducer_options options_;
  bool device_ = false;
  void* caller_stream_ = nullptr;
  std::vector<tensor_ref> tensors_;
  std::vector<std::size_t> arena_of_;
  std::vector<arena> arenas_;
  std::vector<bucket> buckets_;
  std::vector<part> parts_;
  std::vector<std::size_t> owner_, slot_;
  std::vector<unsigned char> marked_;
  std::size_t next_launch_ = 0;  // the next part to launch
  bool in_step_ = false;
  bool planned_ = false;
};

/// @}
}  // namespace cadence::exchange
