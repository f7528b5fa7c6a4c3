// The ZeroMQ backend's operations as its engine tracks them: a send, a receive, a collective
// (a state machine the engine advances), and a message as it arrived.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/latch.hpp>
#include <cadence/transport/engine/signature.hpp>
#include <cadence/transport/zmq/detail/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cadence::transport::detail {

// ---- operations ----

/// One started operation, blocking or not. The engine finishes it (done), or it fails alone
/// (isolated: a point-to-point operation whose peer is lost), or the communicator fails.
struct zmq_op : std::enable_shared_from_this<zmq_op> {
  enum class kind : std::uint8_t { send, recv, allreduce, broadcast };
  zmq_op(kind k, const call_info& ci) : what(k), c(ci) {}
  virtual ~zmq_op() = default;
  zmq_op(const zmq_op&) = delete;
  zmq_op& operator=(const zmq_op&) = delete;

  kind what;
  call_info c;
  int peer = -1;  // send: destination; recv: source as passed; broadcast: root
  bool done = false;
  bool cancelled = false;
  bool orphan = false;  // never: a work handle keeps the engine alive
  held_error isolated;  // thrown with its own type (a peer_error stays one)
  std::vector<zc_ref> rels;    // pieces of the caller's buffer ZeroMQ still holds, by group
  std::vector<int> rel_peers;  // whom those pieces go to
  // Its messages still in the communicator's own queues, not yet taken by ZeroMQ (a peer whose
  // connection is not up yet): the operation is not complete while any remain, or a caller that
  // stops calling would leave them there.
  std::size_t queued = 0;
  bool finished() const noexcept { return done || cancelled || isolated.has_value(); }
  /// For the work handle: the sender of a completed receive, the peer otherwise.
  inline int source_or_peer() const noexcept;
  /// Pieces of the caller's buffer ZeroMQ holds: the operation is not over while any remain.
  std::size_t outstanding() const noexcept {
    std::size_t n = 0;
    for (const auto& r : rels) n += r.outstanding();
    return n;
  }
  /// The release count of group i (a ring's segment; 0 for everything else).
  zc_release* rel(std::size_t i, int wake_fd) {
    if (rels.size() <= i) rels.resize(i + 1);
    if (!rels[i].get()) rels[i] = zc_ref(zc_release::make(wake_fd));
    return rels[i].get();
  }
};

struct zmq_send_op : zmq_op {
  using zmq_op::zmq_op;
  enum class stage : std::uint8_t { queued, announced, streaming };
  const unsigned char* buf = nullptr;
  std::size_t bytes = 0;
  int tag = 0;
  stage st = stage::queued;
  std::uint64_t id = 0;  // a large message's id, once announced
};

struct zmq_recv_op : zmq_op {
  using zmq_op::zmq_op;
  unsigned char* buf = nullptr;
  std::size_t bytes = 0;
  int tag = 0;
  std::uint64_t inc = 0;  // a specific source's incarnation it belongs to (0: the first to come)
  int from = -1;
  bool matched = false;
  std::uint64_t id = 0;  // a large message being received
  std::size_t got = 0;
};

inline int zmq_op::source_or_peer() const noexcept {
  return what == kind::recv ? static_cast<const zmq_recv_op*>(this)->from : peer;
}

/// A message that arrived on the data socket: its sender, header and the frame with its data.
struct zmq_incoming {
  int src = -1;
  std::uint64_t inc = 0;
  zmq_header h;
  zmq_message frame;
  std::size_t at = 0;  // where the data starts in frame
  unsigned char* data() noexcept { return frame.data() + at; }
  std::size_t size() const noexcept { return frame.size() - at; }
};

/// What every rank must agree on for one collective; compared on every message of it.
struct zmq_coll_sig {
  std::uint8_t coll = 0;  // 1 allreduce, 2 broadcast
  std::uint8_t type = 0;
  std::uint8_t op = 0;
  std::int32_t root = 0;
  std::uint64_t count = 0;  // elements (allreduce) or bytes (broadcast)
  bool operator==(const zmq_coll_sig& o) const noexcept {
    return coll == o.coll && type == o.type && op == o.op && root == o.root && count == o.count;
  }
  bool operator!=(const zmq_coll_sig& o) const noexcept { return !(*this == o); }
  static zmq_coll_sig of(const zmq_header& h) noexcept {
    return {h.coll, h.type, h.op, h.tag, h.bytes};
  }
  std::string text() const {
    return collective_signature{0, coll, static_cast<std::int64_t>(count), type, op, root}.describe();
  }
};

class zmq_colls;

/// Counts a message in its operation's `queued` while it waits in a queue of the communicator;
/// it uncounts when the message is taken by ZeroMQ or dropped (destroyed with it).
class zmq_queued {
public:
  zmq_queued() = default;
  explicit zmq_queued(std::shared_ptr<zmq_op> op) : op_(std::move(op)) {
    if (op_) ++op_->queued;
  }
  zmq_queued(zmq_queued&& o) noexcept : op_(std::move(o.op_)) {}
  zmq_queued& operator=(zmq_queued&& o) noexcept {
    if (this != &o) {
      reset();
      op_ = std::move(o.op_);
    }
    return *this;
  }
  zmq_queued(const zmq_queued&) = delete;
  zmq_queued& operator=(const zmq_queued&) = delete;
  ~zmq_queued() { reset(); }
  const std::shared_ptr<zmq_op>& op() const noexcept { return op_; }

private:
  void reset() noexcept {
    if (op_) --op_->queued;
    op_.reset();
  }
  std::shared_ptr<zmq_op> op_;
};

/// A collective as a state machine the engine advances on every progress pass: it reads its
/// messages from its inbox (zmq_colls, by its index) and sends through it.
class zmq_coll_op : public zmq_op {
public:
  zmq_coll_op(kind k, const call_info& ci) : zmq_op(k, ci) {}
  std::uint64_t index = 0;  // 1-based, in issue order: the k-th collective of every rank
  zmq_coll_sig sig;
  /// First step, when the engine takes it (after the index is set).
  virtual void start(zmq_colls& e) = 0;
  /// Uses what has arrived; sets done when complete. May mark the communicator failed.
  virtual void advance(zmq_colls& e) = 0;
  /// Whether losing `peer` now leaves it unable to complete.
  virtual bool needs(int peer) const = 0;
  /// Whom it still waits for, for a deadline's message.
  virtual void awaited(const zmq_colls& e, std::vector<int>& who, std::string& note) const = 0;
};

}  // namespace cadence::transport::detail
