/// \file
/// \ingroup thrust
/// Device memory a caller keeps between Thrust ZipLine solves, so a controller that re-plans
/// every iteration allocates once: the solver's arrays and Thrust's temporary storage.
#pragma once

#include <cadence/thrust/config.hpp>
#include <cadence/thrust/detail/memory.hpp>

#include <cstddef>

namespace cadence {
/// \addtogroup thrust
/// @{

namespace detail {
struct thrust_zipline_workspace_access;
}  // namespace detail

/// Reusable memory for zipline_thrust and its variants. Keep one per stream (or per thread on
/// the CPU systems) and pass it to every solve: after the first solve of the largest size no
/// further allocation happens. Movable, not copyable; not safe for concurrent use.
class thrust_zipline_workspace {
public:
  /// Holds nothing until the first solve.
  thrust_zipline_workspace() = default;
  ///@{
  /// Takes over the memory; the moved-from workspace holds nothing and may be reused.
  thrust_zipline_workspace(thrust_zipline_workspace&&) noexcept = default;
  thrust_zipline_workspace& operator=(thrust_zipline_workspace&&) noexcept = default;
  ///@}

  /// Bytes of device memory currently held.
  std::size_t bytes_reserved() const noexcept {
    std::size_t s = pool_.size();
    for (const auto& b : buffers_) s += b.size();
    return s;
  }
  /// Frees everything; the next solve allocates again.
  void release() noexcept {
    for (auto& b : buffers_) b.release();
    pool_.release();
  }

private:
  friend struct detail::thrust_zipline_workspace_access;
  static constexpr std::size_t buffer_count = 21;
  detail::device_bytes buffers_[buffer_count];
  detail::temp_pool pool_;
  int sweeps_ = 0;  // sort-and-sweeps the last single-instance solve ran (1 or 2; tests)
};

namespace detail {
/// How the solver reaches a workspace's memory.
struct thrust_zipline_workspace_access {
  static device_bytes& buffer(thrust_zipline_workspace& ws, std::size_t i) { return ws.buffers_[i]; }
  static temp_pool& pool(thrust_zipline_workspace& ws) { return ws.pool_; }
  static int& sweeps(thrust_zipline_workspace& ws) { return ws.sweeps_; }
  static constexpr std::size_t buffer_count = thrust_zipline_workspace::buffer_count;
};
}  // namespace detail

/// @}
}  // namespace cadence
