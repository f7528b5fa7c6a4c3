// The collective adapters' device path: whether a communicator offers the device helpers that
// bucket fusion and merging need (nccl_communicator does), which stream to use, and device
// memory owned through the communicator. Includes no CUDA header.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/exchange/detail/tensor.hpp>
#include <cadence/transport/communicator.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace cadence::exchange::detail {

// C offers, besides the concept: allreduce(buf, n, t, op, stream, d), allreduce_average(buf, n,
// t, stream, d), allreduce_scaled(send, recv, n, t, scale, stream, d), copy_async(dst, src,
// bytes, stream), zero_async(p, bytes, stream), synchronize(stream, d), device_alloc(bytes),
// device_free(p), stream(), and for the asynchronous path iallreduce_average(buf, n, t, stream)
// and record(stream[, covered]) (work handles), stream_wait(waiter, waited): see nccl_communicator
// (cadence/transport/nccl/protocol.hpp).
template <class C, class = void>
struct has_device_ops : std::false_type {};
template <class C>
struct has_device_ops<
    C, std::void_t<decltype(std::declval<C&>().allreduce(std::declval<void*>(), std::size_t{},
                                                         transport::dtype{}, transport::reduce_op{},
                                                         std::declval<void*>(),
                                                         std::declval<transport::deadline>())),
                   decltype(std::declval<C&>().allreduce_average(std::declval<void*>(), std::size_t{},
                                                                 transport::dtype{}, std::declval<void*>(),
                                                                 std::declval<transport::deadline>())),
                   decltype(std::declval<C&>().allreduce_scaled(
                       std::declval<const void*>(), std::declval<void*>(), std::size_t{},
                       transport::dtype{}, double{}, std::declval<void*>(),
                       std::declval<transport::deadline>())),
                   decltype(std::declval<C&>().copy_async(std::declval<void*>(), std::declval<const void*>(),
                                                          std::size_t{}, std::declval<void*>())),
                   decltype(std::declval<C&>().zero_async(std::declval<void*>(), std::size_t{},
                                                          std::declval<void*>())),
                   decltype(std::declval<C&>().synchronize(std::declval<void*>(),
                                                           std::declval<transport::deadline>())),
                   decltype(std::declval<C&>().device_alloc(std::size_t{})),
                   decltype(std::declval<C&>().device_free(std::declval<void*>())),
                   decltype(std::declval<C&>().iallreduce_average(std::declval<void*>(), std::size_t{},
                                                                  transport::dtype{}, std::declval<void*>())),
                   decltype(std::declval<C&>().record(std::declval<void*>())),
                   decltype(std::declval<C&>().record(
                       std::declval<void*>(),
                       std::declval<C&>().iallreduce_average(std::declval<void*>(), std::size_t{},
                                                             transport::dtype{}, std::declval<void*>()))),
                   decltype(std::declval<C&>().stream_wait(std::declval<void*>(), std::declval<void*>())),
                   decltype(std::declval<const C&>().stream())>> : std::true_type {};
template <class C>
inline constexpr bool has_device_ops_v = has_device_ops<C>::value;

/// The work handle of C's asynchronous operations, or a placeholder where C has none (the
/// adapters then block in the call that starts the work).
struct no_work {
  bool test() { return true; }
  void wait(transport::deadline) {}
};
template <class C, bool = transport::has_async_v<C>>
struct work_of {
  using type = no_work;
};
template <class C>
struct work_of<C, true> {
  using type = decltype(std::declval<C&>().iallreduce(std::declval<void*>(), std::size_t{}, transport::dtype{},
                                                      transport::reduce_op{}));
};

/// Whether a work handle can wait with a time limit that is no failure (wait_until: the MPI and
/// gloo backends' handles, beyond the concept).
template <class W, class = void>
struct has_wait_until : std::false_type {};
template <class W>
struct has_wait_until<W, std::void_t<decltype(std::declval<W&>().wait_until(
                             std::declval<transport::deadline::clock::time_point>()))>> : std::true_type {};
template <class W>
inline constexpr bool has_wait_until_v = has_wait_until<W>::value;

/// Whether an adapter works on device buffers over `c`: a host communicator refuses a stream; a
/// device communicator without the helpers is refused.
template <class C>
bool uses_device(const C& c, const char* adapter, void* stream) {
  if (!c.capabilities().device_buffers) {
    if (stream != nullptr)
      throw invalid_parameter_error(where(adapter, c.rank(), c.size()) +
                                    "a stream was given, but this communicator works on host "
                                    "memory (streams are for device communicators such as NCCL)");
    return false;
  }
  if constexpr (!has_device_ops_v<C>)
    throw invalid_parameter_error(where(adapter, c.rank(), c.size()) +
                                  "this communicator takes device buffers but offers no device "
                                  "helpers (allreduce_average, copy_async, ...: see "
                                  "nccl_communicator)");
  return true;
}

/// The stream the adapter enqueues on: the caller's, or the communicator's own.
template <class C>
void* device_stream(const C& c, void* given) {
  if constexpr (has_device_ops_v<C>)
    return given != nullptr ? given : c.stream();
  else
    return given;
}

/// Device memory allocated through the communicator and freed through it (so the fake NCCL
/// tests allocation too). Move-only; empty for host communicators, where it is never filled.
template <class C>
class device_block {
public:
  device_block() = default;
  device_block(C& c, std::size_t bytes) : c_(&c) {
    if constexpr (has_device_ops_v<C>) {
      p_ = c.device_alloc(bytes);
      bytes_ = bytes;
    }
  }
  device_block(device_block&& o) noexcept
      : c_(std::exchange(o.c_, nullptr)), p_(std::exchange(o.p_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  device_block& operator=(device_block&& o) noexcept {
    if (this != &o) {
      release();
      c_ = std::exchange(o.c_, nullptr);
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  device_block(const device_block&) = delete;
  device_block& operator=(const device_block&) = delete;
  ~device_block() { release(); }

  void* get() const noexcept { return p_; }
  std::size_t bytes() const noexcept { return bytes_; }

private:
  void release() noexcept {
    if constexpr (has_device_ops_v<C>) {
      if (c_ != nullptr && p_ != nullptr) c_->device_free(p_);
    }
    p_ = nullptr;
    bytes_ = 0;
  }
  C* c_ = nullptr;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace cadence::exchange::detail
