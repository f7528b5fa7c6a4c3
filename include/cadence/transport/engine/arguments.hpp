// The argument checks at the start of every operation (communicator contract d), in one place
// so every backend refuses the same calls in the same words, before touching the network.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <cstddef>
#include <string>

namespace cadence::transport::detail {

/// What a backend's all-reduce can take beyond the concept's minimum.
struct allreduce_rules {
  /// Only dtypes with host arithmetic (not f16 or bf16): every host backend reduces on the CPU.
  bool host_arithmetic = true;
  /// A backend's own dtype check in its place (MPI: the dtype must have an MPI type).
  void (*native_type)(const call_info&, dtype) = nullptr;
};

/// Checks an all-reduce's arguments in the order every backend has (size, buffer, op, dtype,
/// average, deadline) and returns its size in bytes. `d` is null for the asynchronous forms.
inline std::size_t check_allreduce(const call_info& c, const void* buf, std::size_t count, dtype t, reduce_op op,
                                   bool average, const deadline* d, allreduce_rules rules = {}) {
  const std::size_t bytes = checked_bytes(c, count, t);
  check_buffer(c, buf, bytes);
  check_op(c, op);
  if (rules.native_type != nullptr) rules.native_type(c, t);
  if (rules.host_arithmetic && !host_reducible(t))
    bad_argument(c, std::string("dtype ") + dtype_name(t) +
                        " has no host arithmetic (it is for device backends such as NCCL)");
  if (average && !averageable(t))
    bad_argument(c, std::string("dtype ") + dtype_name(t) + " is not f32 or f64 (an integer average would have to round)");
  if (d) check_deadline(c, *d);
  return bytes;
}

inline void check_broadcast(const call_info& c, const void* buf, std::size_t bytes, int root, const deadline* d) {
  check_buffer(c, buf, bytes);
  check_peer(c, root, "root");
  if (d) check_deadline(c, *d);
}

/// What a backend's point-to-point calls can take beyond the concept's minimum.
struct p2p_rules {
  /// A send to (or receive from) this rank itself; the network backends have no loopback.
  bool self = false;
  /// A receive from any_source (capabilities().any_source): NCCL names its peer.
  bool any_source = true;
};

inline void check_send(const call_info& c, const void* buf, std::size_t bytes, int dst, int tag, const deadline* d,
                       p2p_rules rules = {}) {
  check_buffer(c, buf, bytes);
  check_peer(c, dst, "destination");
  check_tag(c, tag);
  if (d) check_deadline(c, *d);
  if (!rules.self && dst == c.rank)
    bad_argument(c, "a send to itself (rank " + std::to_string(dst) + ") is not supported by the " + c.backend +
                        " backend");
}

inline void check_recv(const call_info& c, const void* buf, std::size_t bytes, int src, int tag, const deadline* d,
                       p2p_rules rules = {}) {
  check_buffer(c, buf, bytes);
  check_peer(c, src, "source", rules.any_source);
  check_tag(c, tag);
  if (d) check_deadline(c, *d);
  if (!rules.self && src == c.rank)
    bad_argument(c, std::string("a ") + c.op + " from itself (rank " + std::to_string(src) +
                        ") is not supported by the " + c.backend + " backend");
  if (!rules.self && src == any_source && c.size == 1)
    bad_argument(c, "any_source on a communicator of one rank would wait forever");
}

}  // namespace cadence::transport::detail
