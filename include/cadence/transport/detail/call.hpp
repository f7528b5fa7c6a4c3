// What every backend shares about one call: how it is named in errors, and the argument checks
// of the communicator contract (requirement d), so all backends word failures the same way.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace cadence::transport::detail {

/// One call on one communicator, as its error messages name it.
struct call_info {
  const char* backend;  // "inproc", "mpi", ...
  const char* op;       // "allreduce", "broadcast", "send", "recv"
  std::uint64_t seq;    // 1-based: the n-th call on this communicator (0: not a call)
  int rank;
  int size;
  deadline::clock::time_point started;
};

/// "cadence::transport[inproc]: allreduce #7 on rank 1 of 4"
inline std::string describe(const call_info& c) {
  // seq 0: not a call (a backend's construction), so no number.
  return std::string("cadence::transport[") + c.backend + "]: " + c.op +
         (c.seq != 0 ? " #" + std::to_string(c.seq) : std::string()) + " on rank " +
         std::to_string(c.rank) + " of " + std::to_string(c.size);
}

/// Every rank of `size` but `rank`: whom a collective waits for.
inline std::vector<int> ranks_except(int rank, int size) {
  std::vector<int> v;
  for (int p = 0; p < size; ++p)
    if (p != rank) v.push_back(p);
  return v;
}
/// The same, or this rank alone on a world of one: a timeout that names nobody is a bug.
inline std::vector<int> others_or_self(int rank, int size) {
  auto v = ranks_except(rank, size);
  if (v.empty()) v.push_back(rank);
  return v;
}

/// "rank 3", "ranks 1, 3"
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

inline std::string seconds_since(deadline::clock::time_point since) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s",
                std::chrono::duration<double>(deadline::clock::now() - since).count());
  return buf;
}

/// The deadline passed; `waited_for` must not be empty (a timeout that names nobody is a bug).
inline transport_error deadline_error(const call_info& c, const std::vector<int>& waited_for,
                                      const std::string& note = {}) {
  return transport_error(describe(c) + ": deadline passed " + seconds_since(c.started) +
                         " after the call while waiting for " + rank_list(waited_for) +
                         (note.empty() ? std::string() : " (" + note + ")"));
}

/// A peer the call depended on is gone.
inline transport_error lost_peer_error(const call_info& c, const std::vector<int>& lost,
                                       const std::string& how) {
  return transport_error(describe(c) + ": lost " + rank_list(lost) + " (" + how +
                         (lost.size() == 1 ? ") while waiting for it" : ") while waiting for them"));
}

[[noreturn]] inline void bad_argument(const call_info& c, const std::string& what) {
  throw invalid_parameter_error(describe(c) + ": " + what);
}

inline void check_deadline(const call_info& c, const deadline& d) {
  if (d.passed(c.started))
    bad_argument(c, "its deadline had already passed when it was called (" +
                        std::to_string(std::chrono::duration<double>(c.started - d.time_point()).count()) +
                        " s earlier)");
}

inline void check_buffer(const call_info& c, const void* buf, std::size_t bytes) {
  if (buf == nullptr && bytes != 0)
    bad_argument(c, "null buffer with " + std::to_string(bytes) + " bytes");
}

/// Bytes of `count` elements of `t`, rejecting counts whose size overflows.
inline std::size_t checked_bytes(const call_info& c, std::size_t count, dtype t) {
  const std::size_t size = dtype_size(t);
  if (size == 0) bad_argument(c, "unknown dtype " + std::to_string(static_cast<int>(t)));
  if (count > std::numeric_limits<std::size_t>::max() / size)
    bad_argument(c, "count " + std::to_string(count) + " of " + dtype_name(t) + " overflows size_t");
  return count * size;
}

inline void check_op(const call_info& c, reduce_op op) {
  if (op != reduce_op::sum && op != reduce_op::min && op != reduce_op::max)
    bad_argument(c, "unknown reduce_op " + std::to_string(static_cast<int>(op)));
}

/// `role` is "root", "destination" or "source"; any_source only where `allow_any`.
inline void check_peer(const call_info& c, int peer, const char* role, bool allow_any = false) {
  if (allow_any && peer == any_source) return;
  if (peer < 0 || peer >= c.size)
    bad_argument(c, std::string(role) + " rank " + std::to_string(peer) + " is out of range [0, " +
                        std::to_string(c.size) + ")" +
                        (peer == any_source ? " (any_source is only for recv on a backend with "
                                              "capabilities().any_source)"
                                            : ""));
}

inline void check_tag(const call_info& c, int tag) {
  if (tag < 0 || tag > max_tag)
    bad_argument(c, "tag " + std::to_string(tag) + " is outside [0, " + std::to_string(max_tag) + "]");
}

/// "allreduce(count 16, f32, sum)": a call's arguments as mismatch errors compare them.
inline std::string signature(const char* op, std::size_t count, dtype t, reduce_op r) {
  return std::string(op) + "(count " + std::to_string(count) + ", " + dtype_name(t) + ", " +
         reduce_op_name(r) + ")";
}
inline std::string signature_average(std::size_t count, dtype t) {
  return "allreduce_average(count " + std::to_string(count) + ", " + dtype_name(t) + ")";
}
inline std::string signature(const char* op, std::size_t bytes, int root) {
  return std::string(op) + "(" + std::to_string(bytes) + " bytes, root " + std::to_string(root) + ")";
}

}  // namespace cadence::transport::detail
