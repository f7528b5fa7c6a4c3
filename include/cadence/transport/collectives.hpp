/// \file
/// \ingroup transport
/// Collectives derived from the communicator concept, so every backend has them without writing
/// them: barrier, allgather (fixed size per rank) and an averaging all-reduce.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace cadence::transport {
/// \addtogroup transport
/// @{

namespace detail {
template <class C>
void require_host_buffers(const C& c, const char* helper) {
  if (c.capabilities().device_buffers)
    throw invalid_parameter_error(std::string("cadence::transport::") + helper + " on rank " +
                                  std::to_string(c.rank()) +
                                  ": this communicator takes device buffers; the helper works on "
                                  "host memory (use the backend's own collective)");
}
}  // namespace detail

/// Returns once every rank of `c` has called barrier (or throws transport_error naming the ranks
/// that did not arrive by the deadline `d`). One all-reduce of a single byte: errors name that
/// call.
template <class C>
void barrier(C& c, deadline d = {}) {
  CADENCE_REQUIRE_COMMUNICATOR(C);
  detail::require_host_buffers(c, "barrier");
  std::uint8_t token = 0;
  c.allreduce(&token, 1, dtype::u8, reduce_op::max, d);
}

/// Gathers `bytes_per_rank` bytes from `send` on every rank of `c` into `recv` within deadline
/// `d` (size() * bytes_per_rank bytes, rank r's block at offset r * bytes_per_rank) on every
/// rank. `send` may be rank()'s own block inside `recv` (in place) but must not overlap any
/// other block. Implemented as one sum all-reduce of u8 blocks that are zero except the
/// caller's own: with a single nonzero term per byte the sum is that byte, exactly, and it is
/// one collective with one deadline instead of size() broadcasts. It moves size() times the data of a ring allgather: meant for records
/// and plans (kilobytes), not tensors.
template <class C>
void allgather(C& c, const void* send, void* recv, std::size_t bytes_per_rank, deadline d = {}) {
  CADENCE_REQUIRE_COMMUNICATOR(C);
  detail::require_host_buffers(c, "allgather");
  const auto n = static_cast<std::size_t>(c.size());
  const std::string where =
      "cadence::transport::allgather on rank " + std::to_string(c.rank()) + ": ";
  if (bytes_per_rank > std::numeric_limits<std::size_t>::max() / n)
    throw invalid_parameter_error(where + std::to_string(bytes_per_rank) +
                                  " bytes per rank times " + std::to_string(n) + " ranks overflows");
  const std::size_t total = bytes_per_rank * n;
  if (total != 0 && (send == nullptr || recv == nullptr))
    throw invalid_parameter_error(where + "null buffer with " + std::to_string(bytes_per_rank) +
                                  " bytes per rank");
  if (total == 0) {
    // Still one collective, so every rank stays in step and a missing rank is still noticed.
    std::uint8_t none = 0;
    c.allreduce(&none, 0, dtype::u8, reduce_op::sum, d);
    return;
  }
  auto* out = static_cast<unsigned char*>(recv);
  unsigned char* mine = out + static_cast<std::size_t>(c.rank()) * bytes_per_rank;
  if (send != mine) std::memcpy(mine, send, bytes_per_rank);
  std::memset(out, 0, static_cast<std::size_t>(mine - out));
  std::memset(mine + bytes_per_rank, 0, total - static_cast<std::size_t>(mine - out) - bytes_per_rank);
  c.allreduce(out, total, dtype::u8, reduce_op::sum, d);
}

/// Replaces the `count` elements of dtype `t` at `buf` by their mean over the ranks of `c`,
/// within deadline `d`: the gradient average of data-parallel training. Only f32 and f64: an
/// integer average would have to round, and callers disagree on how. Where the backend offers
/// allreduce_average (communicator.hpp), the division happens inside it, in its last pass over
/// the data; otherwise a sum all-reduce is followed by a pass dividing by size().
/// Either way the result is the sum divided by size(), correctly rounded.
template <class C>
void allreduce_avg(C& c, void* buf, std::size_t count, dtype t, deadline d = {}) {
  CADENCE_REQUIRE_COMMUNICATOR(C);
  detail::require_host_buffers(c, "allreduce_avg");
  if (t != dtype::f32 && t != dtype::f64)
    throw invalid_parameter_error("cadence::transport::allreduce_avg on rank " +
                                  std::to_string(c.rank()) + ": dtype " + dtype_name(t) +
                                  " is not f32 or f64 (an integer average would have to round)");
  if constexpr (has_allreduce_average_v<C>) {
    c.allreduce_average(buf, count, t, d);
  } else {
    c.allreduce(buf, count, t, reduce_op::sum, d);
    detail::divide_into(buf, buf, count, t, static_cast<double>(c.size()));
  }
}

/// @}
}  // namespace cadence::transport
