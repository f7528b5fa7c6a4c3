// What members say to each other, byte for byte: the control frames (join, abort, request,
// announce, drain, reject), the notice that opens every collective, and the tags each travels on.
// Every frame carries the quorum (id and stamp) it belongs to, so a stale one, or one of another
// quorum announced under the same id, is recognised and dropped.
#pragma once

#include <cadence/membership/options.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence::membership::detail {

// ---- tags ----
//
// From tag_base: +0 control frames, +1 their bodies, +16..+31 the state transfer (by quorum id
// mod 16), +32..+287 the view's own point-to-point tags, +288.. the collectives: one tag per
// (quorum id mod 16, operation number mod 128), so operations in flight together never share a
// tag and a stale message of one quorum cannot meet a receive of the next.
struct tags {
  int base = 0;
  static constexpr int user_tags = 256;
  static constexpr int quorum_slots = 16;
  static constexpr int op_slots = 128;

  int control() const noexcept { return base; }
  int body() const noexcept { return base + 1; }
  int state(std::uint64_t qid) const noexcept { return base + 16 + static_cast<int>(qid % quorum_slots); }
  int user(int tag) const noexcept { return base + 32 + tag; }
  int op(std::uint64_t qid, std::uint64_t seq) const noexcept {
    return base + 288 + static_cast<int>(qid % quorum_slots) * op_slots + static_cast<int>(seq % op_slots);
  }
};
static_assert(288 + tags::quorum_slots * tags::op_slots <= reserved_tags, "membership tags overflow the range");

// ---- control frames ----

enum class frame_kind : std::uint8_t {
  join = 1,      // a new process asks to be admitted (a: state bytes, b: state tensors)
  abort = 2,     // the sender left quorum `qid`'s sync: fail it and re-form
  request = 3,   // to the candidate leader: my committed count (a: failed operations I hold, b: state
                 // bytes); body: the newcomers I know of (rank, nonce), then the members of my
                 // quorum I count lost (-1 - rank, nonce): the leader keeps no two that cannot reach each other
  announce = 4,  // the new quorum (qid), the committed count K; body: the member table
  drain = 5,     // the messages of failed operations I posted to you; body: their list
  reject = 6,    // you are not in the quorum that formed: come back as a new process
};

inline const char* frame_name(frame_kind k) noexcept {
  switch (k) {
    case frame_kind::join: return "join";
    case frame_kind::abort: return "abort";
    case frame_kind::request: return "request";
    case frame_kind::announce: return "announce";
    case frame_kind::drain: return "drain";
    case frame_kind::reject: return "reject";
  }
  return "unknown";
}

inline constexpr std::uint32_t frame_magic = 0x424d4443;  // "CDMB"

/// A control frame: 64 bytes, copied as is (every process of a job runs the same build). `qid`
/// and `stamp` name a quorum together (quorum::stamp): two leaders can announce quorums with
/// the same id in a race, never with the same stamp.
struct frame {
  std::uint32_t magic = frame_magic;
  frame_kind kind = frame_kind::abort;
  std::uint8_t flags = 0;
  std::uint16_t version = 2;
  std::int32_t from = -1;
  std::uint32_t body_bytes = 0;
  std::uint64_t nonce = 0;
  std::uint64_t qid = 0;
  std::uint64_t stamp = 0;
  std::uint64_t committed = 0;
  std::uint64_t a = 0;
  std::uint64_t b = 0;
};
static_assert(sizeof(frame) == 64 && std::is_trivially_copyable_v<frame>, "membership frames are 64 bytes");

// frame::flags
inline constexpr std::uint8_t flag_initial = 1;  // announce: the first quorum
inline constexpr std::uint8_t flag_drain = 2;    // announce: members exchange drain lists
inline constexpr std::uint8_t flag_sync_all = 4; // announce: every member but the leader receives its state
inline constexpr std::uint8_t flag_confirmed = 8; // request: the sender completed the confirming collective of the quorum it names
inline constexpr std::uint8_t flag_closing = 16;  // announce: formed in the closing sync (member::finish()): no confirming collective

/// A member of an announced quorum: its rank, its process, the syncs it has committed (or
/// `newcomer`: it needs the whole state).
struct member_entry {
  static constexpr std::uint64_t newcomer = ~std::uint64_t{0};
  std::int64_t rank = -1;
  std::uint64_t nonce = 0;
  std::uint64_t committed = 0;
};
static_assert(sizeof(member_entry) == 24 && std::is_trivially_copyable_v<member_entry>, "");

/// One failed operation's messages to one peer, in a drain list: the operation's tag, then
/// `count` message sizes.
struct drain_head {
  std::int64_t tag = 0;
  std::uint64_t count = 0;
};

template <class T>
void append_pod(std::vector<unsigned char>& out, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>, "");
  const auto* p = reinterpret_cast<const unsigned char*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

template <class T>
bool read_pod(const std::vector<unsigned char>& in, std::size_t& at, T& v) {
  if (at + sizeof(T) > in.size()) return false;
  std::memcpy(&v, in.data() + at, sizeof(T));
  at += sizeof(T);
  return true;
}

// ---- the notice that opens every collective ----

inline constexpr std::uint32_t notice_magic = 0x504f4443;  // "CDOP"

enum class op_kind : std::uint8_t { allreduce = 1, broadcast = 2 };

/// The first bytes every member sends every other member in a collective (alone, or at the head
/// of the data of a small one): what it is (checked: the members' arguments must agree) and
/// what the sender knows of pending newcomers (not checked: every member that completes the
/// collective has seen every member's flags, so they all decide alike to admit them after it).
struct notice {
  std::uint32_t magic = notice_magic;
  op_kind kind = op_kind::allreduce;
  std::uint8_t type = 0;   // transport::dtype
  std::uint8_t rop = 0;    // transport::reduce_op
  std::uint8_t flags = 0;  // bit 0: average; bit 1: the sender knows of a newcomer
  std::int32_t root = -1;  // broadcast: the root's view rank
  std::int32_t from = -1;  // the sender's view rank
  std::uint64_t qid = 0;
  std::uint64_t txn = 0;   // the sync (transaction) number
  std::uint64_t seq = 0;   // the operation's number in its quorum
  std::uint64_t count = 0; // elements (all-reduce) or bytes (broadcast)
  std::uint64_t stamp = 0; // with qid, the quorum (quorum::stamp)
  std::uint64_t pad = 0;

  static constexpr std::uint8_t average_flag = 1;
  static constexpr std::uint8_t joiner_flag = 2;

  /// Whether `o` describes the same collective (flags apart from average, and the sender, may
  /// differ).
  bool same_call(const notice& o) const noexcept {
    return magic == o.magic && kind == o.kind && type == o.type && rop == o.rop &&
           (flags & average_flag) == (o.flags & average_flag) && root == o.root && qid == o.qid &&
           stamp == o.stamp && txn == o.txn && seq == o.seq && count == o.count;
  }
  std::string describe() const {
    std::string s = kind == op_kind::allreduce ? "allreduce" : "broadcast";
    s += "(quorum " + std::to_string(qid) + ", sync " + std::to_string(txn) + ", operation " + std::to_string(seq);
    if (kind == op_kind::allreduce)
      s += ", count " + std::to_string(count) + ", dtype " + std::to_string(type) + ", op " + std::to_string(rop) +
           ((flags & average_flag) != 0 ? ", average" : "");
    else
      s += ", " + std::to_string(count) + " bytes, root " + std::to_string(root);
    return s + ")";
  }
};
static_assert(sizeof(notice) == 64 && std::is_trivially_copyable_v<notice>, "notices are 64 bytes");

}  // namespace cadence::membership::detail
