/// \file
/// \ingroup exchange
/// Periodic model averaging over any communicator: every rank averages its parameters every k
/// local steps (PyTorch's post-local SGD), the baseline for elastic_averager.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/exchange/detail/device.hpp>
#include <cadence/exchange/detail/merge.hpp>
#include <cadence/exchange/detail/tensor.hpp>
#include <cadence/exchange/tensor_ref.hpp>
#include <cadence/transport/communicator.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// Local SGD with a fixed period: each rank runs k local steps, then every rank calls sync(),
/// which replaces the parameters with their average: one all-reduce per dtype, in place where the
/// tensors of a dtype lie back to back (one tensor, a flat parameter buffer), else through a
/// fusion buffer; the division happens inside the backend where it can. As PyTorch's
/// PeriodicModelAverager (post-local SGD, without its warm-up of BSP steps: run a
/// bucketed_allreducer for those). The fast ranks wait for the slowest at every barrier; pick
/// elastic_averager when ranks differ in speed.
///
/// Over a communicator with device buffers (nccl_communicator) the tensors are device pointers,
/// averaged by NCCL (ncclAvg) on the communicator's stream after an event on the caller's stream
/// (the constructor's `stream`; null: the legacy default stream).
///
/// sync() also takes the tensors as a braced list (`sync({a, b})`), one by one (`sync(a, b)`),
/// or none (`sync()`: a barrier without tensors).
template <class C>
class periodic_averager : public detail::tensor_sync<periodic_averager<C>> {
  CADENCE_REQUIRE_COMMUNICATOR(C);

public:
  /// An averager over `comm`: `period` k >= 1 local steps between barriers (1: BSP model
  /// averaging); `timeout` bounds one sync(). `stream`: device communicators only, the caller's
  /// cudaStream_t whose earlier work the merge waits for (null: the legacy default stream).
  /// Throws invalid_parameter_error for a period of 0, a timeout <= 0, or a stream over a host
  /// communicator.
  periodic_averager(C& comm, std::size_t period,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60),
                    void* stream = nullptr)
      : comm_(&comm), period_(period), timeout_(timeout),
        device_(detail::uses_device(comm, "periodic_averager", stream)), stream_(stream) {
    if (period < 1)
      throw invalid_parameter_error(detail::where("periodic_averager", comm.rank(), comm.size()) +
                                    "period k must be >= 1, got 0");
    detail::check_timeout("periodic_averager", timeout);
  }

  /// This rank finished a local step; true when sync() is due. Throws invalid_parameter_error
  /// when sync() was already due.
  bool step_done() {
    if (due())
      throw invalid_parameter_error(detail::where("periodic_averager", comm_->rank(), comm_->size()) +
                                    "step_done() after the step that made sync() due: call "
                                    "sync() first");
    ++local_steps_;
    return due();
  }
  /// Whether this rank must sync() now (period() local steps since the last barrier).
  bool due() const noexcept { return local_steps_ >= period_; }

  // sync({a, b}), sync(a, b, ...) and sync() (a barrier without tensors) call the one below.
  using detail::tensor_sync<periodic_averager>::sync;
  /// Averages the `tensors` across ranks (the same tensors, in the same order, on every rank).
  /// Throws invalid_parameter_error before communicating when sync() is not due or a tensor is
  /// bad; transport_error when a peer fails or stalls.
  void sync(span<const tensor_ref> tensors) {
    if (!due())
      throw invalid_parameter_error(detail::where("periodic_averager", comm_->rank(), comm_->size()) +
                                    "sync() before it is due: " + std::to_string(local_steps_) +
                                    " of " + std::to_string(period_) + " local steps done");
    for (std::size_t i = 0; i < tensors.size(); ++i)
      detail::check_tensor("periodic_averager", comm_->rank(), comm_->size(), tensors[i], i);
    const transport::deadline d = transport::deadline(timeout_);
    merger_.merge(*comm_, tensors, detail::merge_kind::average, 1.0, 1.0, false, d, device_, stream_);
    local_steps_ = 0;
    ++barriers_;
  }

  /// Starts the period again without a barrier: for a sync that did not complete here but is
  /// settled (a fault-tolerant job's membership::member::transact() healed this rank from
  /// another's state, or discarded the sync everywhere). The next sync() is due after period()
  /// local steps.
  void restart_period() noexcept { local_steps_ = 0; }

  /// k: local steps between barriers.
  std::size_t period() const noexcept { return period_; }
  /// Local steps since the last barrier.
  std::size_t local_steps() const noexcept { return local_steps_; }
  /// Barriers completed.
  std::uint64_t barriers() const noexcept { return barriers_; }

private:
  C* comm_;
  std::size_t period_;
  std::chrono::milliseconds timeout_;
  bool device_ = false;
  void* stream_ = nullptr;  // the caller's (device communicators)
  detail::merger<C> merger_;
  std::size_t local_steps_ = 0;
  std::uint64_t barriers_ = 0;
};

/// @}
}  // namespace cadence::exchange
