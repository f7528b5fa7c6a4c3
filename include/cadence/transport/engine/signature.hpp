// The collective agreement record: a collective's index and arguments as every rank states
// them, so arguments that differ across ranks are reported naming both sides instead of
// corrupting a buffer; and the summary that spreads the lowest and highest of them.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace cadence::transport::detail {

/// What a signature stands for. The values travel on the wire.
enum class collective_kind : std::int64_t {
  allreduce = 1,
  broadcast = 2,
  construction = 3,      // a backend's set-up exchange; count is the size each rank was given
  shutdown = 4,          // a rank destroyed its communicator (a goodbye)
  allreduce_average = 5,
};

/// One collective as one rank called it. Six 64-bit words, trivially copyable: backends send it
/// as it is, at the head of a message or as an announcement.
struct collective_signature {
  std::int64_t index = 0;  // 1-based: the k-th collective of every rank meets the k-th
  std::int64_t kind = 0;   // collective_kind
  std::int64_t count = 0;  // elements (all-reduce), bytes (broadcast), ranks (construction)
  std::int64_t type = 0;   // dtype
  std::int64_t op = 0;     // reduce_op
  std::int64_t root = 0;

  static collective_signature allreduce(std::int64_t index, std::size_t count, dtype t, reduce_op op,
                                        bool average) noexcept {
    return {index,
            static_cast<std::int64_t>(average ? collective_kind::allreduce_average : collective_kind::allreduce),
            static_cast<std::int64_t>(count), static_cast<std::int64_t>(t), static_cast<std::int64_t>(op), 0};
  }
  static collective_signature broadcast(std::int64_t index, std::size_t bytes, int root) noexcept {
    return {index, static_cast<std::int64_t>(collective_kind::broadcast), static_cast<std::int64_t>(bytes), 0, 0,
            root};
  }

  bool is(collective_kind k) const noexcept { return kind == static_cast<std::int64_t>(k); }
  bool operator==(const collective_signature& o) const noexcept {
    return index == o.index && same_arguments(o);
  }
  bool operator!=(const collective_signature& o) const noexcept { return !(*this == o); }
  bool same_arguments(const collective_signature& o) const noexcept {
    return kind == o.kind && count == o.count && type == o.type && op == o.op && root == o.root;
  }
  /// An order of the arguments (not the index), for the summary's lowest and highest.
  bool arguments_before(const collective_signature& o) const noexcept {
    if (kind != o.kind) return kind < o.kind;
    if (count != o.count) return count < o.count;
    if (type != o.type) return type < o.type;
    if (op != o.op) return op < o.op;
    return root < o.root;
  }

  /// "allreduce(count 16, f32, sum)", as error messages name a call.
  std::string describe() const {
    switch (static_cast<collective_kind>(kind)) {
      case collective_kind::allreduce:
        return signature("allreduce", static_cast<std::size_t>(count), static_cast<dtype>(type),
                         static_cast<reduce_op>(op));
      case collective_kind::allreduce_average:
        return signature_average(static_cast<std::size_t>(count), static_cast<dtype>(type));
      case collective_kind::broadcast:
        return signature("broadcast", static_cast<std::size_t>(count), static_cast<int>(root));
      case collective_kind::construction: return "construction(size " + std::to_string(count) + ")";
      case collective_kind::shutdown: return "shutdown (destroyed its communicator)";
    }
    return "an unknown collective (kind " + std::to_string(kind) + ")";
  }
};

/// "arguments differ across ranks in collective #k: rank p called X, rank q called Y", with the
/// index of `theirs` added when it is another collective altogether.
inline std::string arguments_differ(const collective_signature& ours, int our_rank, const collective_signature& theirs,
                                    int their_rank) {
  return "arguments differ across ranks in collective #" + std::to_string(ours.index) + ": rank " +
         std::to_string(their_rank) + " called " +
         (theirs.index == ours.index ? theirs.describe()
                                     : theirs.describe() + " as collective #" + std::to_string(theirs.index)) +
         ", rank " + std::to_string(our_rank) + " called " + ours.describe();
}

/// The lowest and the highest arguments seen so far in one collective and who called them:
/// carried with the data of an exchange (recursive doubling), so every rank learns of a
/// mismatch anywhere and names both sides. Trivially copyable; lo_rank -1 marks a notice that
/// carries no data.
struct collective_summary {
  collective_signature lo, hi;
  std::int64_t lo_rank = 0, hi_rank = 0;

  static collective_summary of(const collective_signature& s, int rank) noexcept { return {s, s, rank, rank}; }
  void merge(const collective_summary& o) noexcept {
    if (o.lo.arguments_before(lo)) lo = o.lo, lo_rank = o.lo_rank;
    if (hi.arguments_before(o.hi)) hi = o.hi, hi_rank = o.hi_rank;
  }
  bool agree() const noexcept { return !lo.arguments_before(hi) && !hi.arguments_before(lo); }
  std::string disagreement(std::int64_t index) const {
    return "arguments differ across ranks in collective #" + std::to_string(index) + ": rank " +
           std::to_string(lo_rank) + " called " + lo.describe() + ", rank " + std::to_string(hi_rank) + " called " +
           hi.describe();
  }
};

/// A notice and a summary, the head of every message of the recursive doubling.
inline constexpr std::size_t collective_head_bytes = sizeof(collective_signature) + sizeof(collective_summary);

}  // namespace cadence::transport::detail
