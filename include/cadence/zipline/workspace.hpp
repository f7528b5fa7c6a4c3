/// \file
/// \ingroup zipline
/// Scratch memory shared by every ZipLine variant, so a controller that plans a barrier per
/// superstep reuses one workspace and its hot loop stops allocating after the first call.
#pragma once

#include <cadence/zipline/detail/buffers.hpp>

#include <cstddef>

namespace cadence {
/// \addtogroup zipline
/// @{

namespace detail {
struct zipline_workspace_access;
}  // namespace detail

/// Memory reused across calls of any ZipLine variant (zipline, zipline_fast, the paper's
/// zipline_paper*, zipline_solve). Buffers only grow: once a workspace has served an input
/// of n rows and N points, later calls with inputs no larger do not allocate (zipline_fast:
/// inputs of the same kind; it keeps separate buffers for exact keys in 32 and in 64 bits
/// and for timestamps without exact keys, each grown on its first use). Not thread-safe:
/// use one workspace per thread. Its contents between calls are unspecified.
template <class T>
class zipline_workspace {
public:
  /// Bytes of memory held between calls (what a planner costs while it is idle).
  std::size_t bytes_reserved() const noexcept { return buffers_.bytes(); }

  /// Releases all memory (the next call allocates again).
  void clear() noexcept {
    // Move-assigning empty vectors frees their memory (assigning {} to a vector would keep
    // its capacity).
    buffers_ = detail::zipline_buffers<T>();
  }

private:
  friend struct detail::zipline_workspace_access;
  detail::zipline_buffers<T> buffers_;
};

namespace detail {
/// How the variants reach a workspace's buffers.
struct zipline_workspace_access {
  template <class T>
  static zipline_buffers<T>& buffers(zipline_workspace<T>& ws) noexcept {
    return ws.buffers_;
  }
};
}  // namespace detail

/// @}
}  // namespace cadence
