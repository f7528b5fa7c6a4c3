// The ZeroMQ backend's point to point: sends handed to ZeroMQ in order under the receiver's
// credit (small ones copied, medium ones streamed from the caller's buffer, large ones announced
// and sent once the receiver has matched them), receives matched in post order against what has
// arrived, and what a lost or replaced peer leaves behind.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/latch.hpp>
#include <cadence/transport/zmq/detail/ops.hpp>
#include <cadence/transport/zmq/detail/peers.hpp>
#include <cadence/transport/zmq/detail/wire.hpp>
#include <cadence/transport/zmq/options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cadence::transport::detail {

/// Owning thread only. Map of its state: posted_ (receives not matched yet, in post order),
/// unexpected_ (messages no receive has matched, in arrival order), announced_ (our large sends
/// waiting for the receiver's go-ahead), streaming_in_ (receives taking a large message's
/// pieces), early_pieces_ (pieces of a streamed message no receive has matched yet),
/// streaming_out_ (sends whose pieces ZeroMQ still holds), waiting_eager_ (eager sends whose
/// copy waits for a connection). The peers' queues and credit are the peer table's.
class zmq_p2p {
public:
  zmq_p2p(const zmq_options& o, zmq_peer_table& peers) : o_(&o), peers_(&peers) {}
  zmq_p2p(const zmq_p2p&) = delete;
  zmq_p2p& operator=(const zmq_p2p&) = delete;

  /// The descriptor ZeroMQ's I/O thread writes to when it lets go of a piece of a caller's buffer.
  void set_wake_fd(int fd) noexcept { wake_fd_ = fd; }

  /// Called when a peer breaks the protocol (more than its credit, a piece out of place, a
  /// credit beyond the window): the engine drops it, after the current message.
  std::function<void(int, const std::string&)> on_bad_peer;

  // ---- starting ----

  void submit_send(const std::shared_ptr<zmq_send_op>& op) {
    zmq_peer& q = peers_->at(op->peer);
    if (q.state == zmq_peer_state::lost) {
      op->isolated = lost_peer_error(op->c, {op->peer}, q.lost_how);
      return;
    }
    q.sends.push_back(op);
    hand_over(op->peer);
  }

  void submit_recv(const std::shared_ptr<zmq_recv_op>& op) {
    if (op->peer != any_source) {
      const zmq_peer& q = peers_->at(op->peer);
      op->inc = q.state == zmq_peer_state::absent ? 0 : q.inc;
    }
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      if (!matches(*op, *it)) continue;
      zmq_incoming m = std::move(*it);
      unexpected_.erase(it);
      peers_->at(m.src).held -= charge(m);
      take(op, std::move(m));
      return;
    }
    std::vector<int> lost;
    std::string how;
    if (candidates_lost(*op, lost, how)) {
      op->isolated = lost_peer_error(op->c, lost, how);
      return;
    }
    posted_.push_back(op);
  }

  // Point-to-point sends go to ZeroMQ in the order they were started, each once its peer is
  // alive and, for an eager message, once the peer's credit covers it.
  void hand_over(int p) {
    zmq_peer& q = peers_->at(p);
    while (!q.sends.empty()) {
      const std::shared_ptr<zmq_send_op> op = q.sends.front();
      if (op->finished()) {
        q.sends.pop_front();
        continue;
      }
      if (q.state != zmq_peer_state::alive || q.dealer == nullptr) return;
      // Up to eager_bytes: copied, sent at once. Up to a quarter of the credit window: sent at
      // once from the caller's buffer (no copy, no round trip). Larger: announced, and sent once
      // the receiver has posted a matching receive.
      const bool eager = op->bytes <= o_->eager_bytes;
      const bool stream = !eager && op->bytes <= o_->credit_bytes / 4;
      const auto cost = static_cast<std::int64_t>(zmq_overhead + (eager || stream ? op->bytes : 0));
      if (q.credit < cost) return;
      q.credit -= cost;
      q.sends.pop_front();
      zmq_header h = peers_->header(eager ? zmq_kind::eager : stream ? zmq_kind::stream : zmq_kind::announce, p);
      h.tag = op->tag;
      h.bytes = op->bytes;
      if (eager) {
        h.length = static_cast<std::uint32_t>(op->bytes);
        zmq_message m(sizeof h + op->bytes);
        std::memcpy(m.data(), &h, sizeof h);
        if (op->bytes != 0) std::memcpy(m.data() + sizeof h, op->buf, op->bytes);
        peers_->push(p, zmq_outgoing{std::move(m), std::nullopt, q.inc, zmq_queued(op)});
        if (op->queued == 0)
          op->done = true;  // ZeroMQ has its copy
        else
          waiting_eager_.push_back(op);  // its connection is not up yet: advance() sees it leave
        continue;
      }
      op->id = h.id = ++q.next_id;
      zmq_message m(sizeof h);
      std::memcpy(m.data(), &h, sizeof h);
      peers_->push(p, zmq_outgoing{std::move(m), std::nullopt, q.inc, zmq_queued(op)});
      if (stream) {
        send_pieces(p, op);
        continue;
      }
      op->st = zmq_send_op::stage::announced;
      announced_[{p, op->id}] = op;
    }
  }

  void hand_over_all() {
    for (int p = 0; p < peers_->size(); ++p)
      if (p != peers_->rank() && !peers_->at(p).sends.empty()) hand_over(p);
  }

  // ---- arriving ----

  /// An eager, stream or announce message: the oldest matching receive takes it, else it waits,
  /// within what the sender's credit allows.
  void on_message(zmq_incoming in) {
    for (auto it = posted_.begin(); it != posted_.end(); ++it) {
      if (!matches(**it, in)) continue;
      const std::shared_ptr<zmq_recv_op> op = *it;
      posted_.erase(it);
      take(op, std::move(in));
      return;
    }
    zmq_peer& q = peers_->at(in.src);
    q.held += charge(in);
    if (q.held > o_->credit_bytes) {
      on_bad_peer(in.src, "more than its credit window of " + std::to_string(o_->credit_bytes) +
                              " bytes in messages no receive has taken");
      return;
    }
    if (static_cast<zmq_kind>(in.h.kind) == zmq_kind::stream) early_pieces_[{in.src, in.h.id}].bytes = in.h.bytes;
    unexpected_.push_back(std::move(in));
  }

  /// The receiver of our announced message is ready: its pieces go.
  void on_clear(int p, std::uint64_t id) {
    const auto it = announced_.find({p, id});
    if (it == announced_.end()) return;  // withdrawn meanwhile: the receiver is told
    const std::shared_ptr<zmq_send_op> op = it->second;
    announced_.erase(it);
    send_pieces(p, op);
  }

  /// The receiver refused our announced message (its receive has another size): the send
  /// fails alone, naming the receiver.
  void on_refuse(int p, std::uint64_t id, const std::string& text) {
    const auto it = announced_.find({p, id});
    if (it == announced_.end()) return;
    const std::shared_ptr<zmq_send_op> op = it->second;
    announced_.erase(it);
    op->isolated = peer_error(describe(op->c) + ": " + text, p);
  }

  /// A piece of a large message. Pieces come in order (the sender sends them so, and a
  /// connection keeps order): one out of place, or beyond the message, breaks the protocol.
  void on_piece(zmq_incoming& in) {
    const auto it = streaming_in_.find({in.src, in.h.id});
    if (it == streaming_in_.end()) {
      // A streamed message no receive has taken yet keeps its pieces (they count in its credit);
      // otherwise its receive was cancelled.
      const auto early = early_pieces_.find({in.src, in.h.id});
      if (early == early_pieces_.end()) return;
      if (in.h.offset != early->second.got || early->second.bytes - early->second.got < in.size()) {
        on_bad_peer(in.src, piece_out_of_place(in, early->second.got, early->second.bytes));
        return;
      }
      early->second.got += in.size();
      early->second.pieces.push_back(std::move(in));
      return;
    }
    zmq_recv_op& op = *it->second;
    if (in.h.offset != op.got || op.bytes - op.got < in.size()) {
      on_bad_peer(in.src, piece_out_of_place(in, op.got, op.bytes));
      return;
    }
    std::memcpy(op.buf + in.h.offset, in.data(), in.size());
    op.got += in.size();
    if (op.got >= op.bytes) {
      op.done = true;
      streaming_in_.erase(it);
    }
  }

  void on_withdraw(int p, std::uint64_t id) {
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      if (it->src != p || it->h.id != id || static_cast<zmq_kind>(it->h.kind) != zmq_kind::announce) continue;
      peers_->at(p).held -= charge(*it);
      unexpected_.erase(it);
      owe(p, zmq_overhead);
      return;
    }
    const auto it = streaming_in_.find({p, id});
    if (it == streaming_in_.end()) return;
    zmq_recv_op& op = *it->second;
    op.isolated = transport_error(describe(op.c) + ": rank " + std::to_string(p) +
                                  " cancelled the message this receive had matched (its send was withdrawn)");
    streaming_in_.erase(it);
  }

  /// The receiver took n more of our bytes: more credit, never beyond the window.
  void on_credit(int p, std::uint64_t n) {
    zmq_peer& q = peers_->at(p);
    if (n > o_->credit_bytes || q.credit + static_cast<std::int64_t>(n) > static_cast<std::int64_t>(o_->credit_bytes)) {
      on_bad_peer(p, "a credit of " + std::to_string(n) + " bytes beyond the window of " +
                         std::to_string(o_->credit_bytes));
      return;
    }
    q.credit += static_cast<std::int64_t>(n);
    hand_over(p);
  }

  // ---- progress ----

  /// Sends whose data has left complete: eager copies once ZeroMQ took them, streamed ones once
  /// ZeroMQ has let go of every piece.
  void advance() {
    hand_over_all();
    for (auto it = waiting_eager_.begin(); it != waiting_eager_.end();) {
      zmq_send_op& op = **it;
      if (op.queued == 0 && !op.finished()) op.done = true;
      if (op.finished()) {
        it = waiting_eager_.erase(it);
        continue;
      }
      ++it;
    }
    for (auto it = streaming_out_.begin(); it != streaming_out_.end();) {
      zmq_send_op& op = **it;
      if (op.isolated || op.cancelled) {
        if (op.outstanding() == 0) {
          it = streaming_out_.erase(it);
          continue;
        }
      } else if (op.outstanding() == 0 && op.queued == 0 &&
                 peers_->at(op.peer).broken_at == zclock::time_point{}) {
        // ZeroMQ has let go of every piece, written (not dropped with a broken connection: then
        // check_lost decides): the buffer is the caller's again.
        op.done = true;
        it = streaming_out_.erase(it);
        continue;
      }
      ++it;
    }
  }

  // ---- withdrawing ----

  /// Nothing of op stays where this path could still write into (or read from) the caller's
  /// buffer on its own; pieces ZeroMQ holds are the engine's to settle.
  void withdraw(zmq_op& op) {
    if (op.what == zmq_op::kind::recv) {
      auto& r = static_cast<zmq_recv_op&>(op);
      posted_.erase(std::remove_if(posted_.begin(), posted_.end(), [&](const auto& p) { return p.get() == &op; }),
                    posted_.end());
      if (r.matched && !r.done) streaming_in_.erase({r.from, r.id});
    } else if (op.what == zmq_op::kind::send) {
      auto& s = static_cast<zmq_send_op&>(op);
      auto& sends = peers_->at(s.peer).sends;
      sends.erase(std::remove_if(sends.begin(), sends.end(), [&](const auto& p) { return p.get() == &op; }),
                  sends.end());
      if (s.st == zmq_send_op::stage::announced) announced_.erase({s.peer, s.id});
    }
  }

  /// cancel() of a send that has not started to stream: an announced one tells its receiver.
  void cancel_send(zmq_send_op& s) {
    if (s.st == zmq_send_op::stage::announced) {
      announced_.erase({s.peer, s.id});
      peers_->send_control(s.peer, zmq_kind::withdraw, s.id, 0);
    }
    withdraw(s);
  }

  // ---- lost and replaced peers ----

  // Fails alone, and forgets, every operation of `by_peer` (keyed by peer and id) with lost peer p.
  template <class Map>
  static void isolate(Map& by_peer, int p, const std::string& how) {
    for (auto it = by_peer.begin(); it != by_peer.end();) {
      if (it->first.first != p) {
        ++it;
        continue;
      }
      it->second->isolated = lost_peer_error(it->second->c, {p}, how);
      it = by_peer.erase(it);
    }
  }

  /// p is lost: what needs it fails (alone: point to point isolates a lost peer).
  void peer_lost(int p, const std::string& how) {
    isolate(announced_, p, how);
    for (auto& op : streaming_out_)
      if (op->peer == p && !op->finished()) op->isolated = lost_peer_error(op->c, {p}, how);
    isolate(streaming_in_, p, how);
    for (auto it = posted_.begin(); it != posted_.end();) {
      std::vector<int> lost;
      std::string why;
      if (candidates_lost(**it, lost, why)) {
        (*it)->isolated = lost_peer_error((*it)->c, lost, why);
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// A new process is taking p's slot: what the old one sent and no receive took is dropped.
  void forget_peer(int p) {
    unexpected_.erase(std::remove_if(unexpected_.begin(), unexpected_.end(),
                                     [&](const zmq_incoming& m) { return m.src == p; }),
                      unexpected_.end());
    peers_->at(p).held = 0;
    for (auto it = early_pieces_.begin(); it != early_pieces_.end();)
      it = it->first.first == p ? early_pieces_.erase(it) : std::next(it);
  }
  /// Receives waiting for the slot's first process belong to incarnation `inc`, now alive.
  void bind_receives(int p, std::uint64_t inc) {
    for (auto& r : posted_)
      if (r->peer == p && r->inc == 0) r->inc = inc;
  }

  /// Whether every rank a receive could match is lost (and nothing of theirs is queued here:
  /// a queued message would have matched first).
  bool candidates_lost(const zmq_recv_op& r, std::vector<int>& lost, std::string& how) const {
    if (r.peer != any_source) {
      const zmq_peer& q = peers_->at(r.peer);
      if (q.state != zmq_peer_state::lost || (r.inc != 0 && r.inc != q.inc)) return false;
      lost = {r.peer};
      how = q.lost_how;
      return true;
    }
    lost.clear();
    for (int p : peers_->others()) {
      if (peers_->at(p).state != zmq_peer_state::lost) return false;
      lost.push_back(p);
    }
    if (lost.empty()) return false;
    how = peers_->at(lost.front()).lost_how;
    for (int p : lost)
      if (peers_->at(p).lost_how != how) {
        how.clear();
        for (int q : lost)
          how += (how.empty() ? "rank " : "; rank ") + std::to_string(q) + ": " + peers_->at(q).lost_how;
        break;
      }
    return true;
  }

  // ---- what an unfinished operation waits for ----

  void awaited_send(const zmq_send_op& s, std::vector<int>& who, std::string& note) const {
    who = {s.peer};
    const zmq_peer& q = peers_->at(s.peer);
    if (q.state == zmq_peer_state::absent)
      note = "it has not registered at the rendezvous";
    else if (s.queued != 0 && !q.connected)
      note = "the connection to it is not up yet";
    else if (s.st == zmq_send_op::stage::queued)
      note = "it has not taken this rank's earlier messages: the credit window of " +
             std::to_string(o_->credit_bytes) + " bytes is full";
    else if (s.st == zmq_send_op::stage::announced)
      note = "the matching recv was not posted";
    else
      note = "the message's data has not left: it does not read";
  }

  void awaited_recv(const zmq_recv_op& r, std::vector<int>& who, std::string& note) const {
    if (r.matched) {
      who = {r.from};
      note = "the message's data did not arrive";
      return;
    }
    who = r.peer == any_source ? peers_->others() : std::vector<int>{r.peer};
    if (who.empty()) who = {peers_->rank()};
    note = r.peer != any_source && peers_->at(r.peer).state == zmq_peer_state::absent
               ? "it has not registered at the rendezvous"
               : "no matching message arrived";
  }

private:
  // The pieces of a streamed message no receive has taken yet, and how much of it came.
  struct early_stream {
    std::uint64_t bytes = 0;
    std::uint64_t got = 0;
    std::deque<zmq_incoming> pieces;
  };

  // What an unmatched message holds of its sender's credit (what the sender charged for it).
  static std::uint64_t charge(const zmq_incoming& m) {
    return zmq_overhead + (static_cast<zmq_kind>(m.h.kind) == zmq_kind::announce ? 0 : m.h.bytes);
  }

  static std::string piece_out_of_place(const zmq_incoming& in, std::uint64_t due, std::uint64_t bytes) {
    return "a piece of message " + std::to_string(in.h.id) + " at offset " + std::to_string(in.h.offset) + " (" +
           std::to_string(in.size()) + " bytes) where offset " + std::to_string(due) + " of " +
           std::to_string(bytes) + " was due";
  }

  static bool matches(const zmq_recv_op& r, const zmq_incoming& m) {
    if (m.h.tag != r.tag) return false;
    if (r.peer == any_source) return true;
    return m.src == r.peer && (r.inc == 0 || r.inc == m.inc);
  }

  // A receive takes a message: its data (eager), its pieces (stream: those come, or came, at
  // once) or the go-ahead for it (announced).
  void take(const std::shared_ptr<zmq_recv_op>& op, zmq_incoming m) {
    const auto kind = static_cast<zmq_kind>(m.h.kind);
    op->matched = true;
    op->from = m.src;
    op->id = m.h.id;
    owe(m.src, zmq_overhead + (kind == zmq_kind::announce ? 0 : m.h.bytes));
    std::deque<zmq_incoming> early;
    if (kind == zmq_kind::stream) {
      const auto it = early_pieces_.find({m.src, m.h.id});
      if (it != early_pieces_.end()) {
        early = std::move(it->second.pieces);
        early_pieces_.erase(it);
      }
    }
    if (m.h.bytes != op->bytes) {
      // The receive fails alone (the communicator goes on); a large message's sender is told.
      const std::string what = "rank " + std::to_string(m.src) + " sent " + std::to_string(m.h.bytes) +
                               " bytes with tag " + std::to_string(op->tag) + " but rank " +
                               std::to_string(peers_->rank()) + " received into " + std::to_string(op->bytes) +
                               " bytes";
      if (kind == zmq_kind::announce) peers_->send_control(m.src, zmq_kind::refuse, m.h.id, 0, what);
      op->isolated = peer_error(describe(op->c) + ": " + what, m.src);
      return;
    }
    if (kind == zmq_kind::eager) {
      if (op->bytes != 0) std::memcpy(op->buf, m.data(), op->bytes);
      op->done = true;
      return;
    }
    streaming_in_[{m.src, op->id}] = op;
    if (kind == zmq_kind::announce) {
      peers_->send_control(m.src, zmq_kind::clear, op->id, 0);
      return;
    }
    for (auto& piece : early) on_piece(piece);
    const zmq_peer& q = peers_->at(m.src);
    if (!op->done && (q.state != zmq_peer_state::alive || q.inc != m.inc)) {  // the rest will not come
      op->isolated = lost_peer_error(op->c, {m.src}, q.lost_how.empty() ? "it is gone" : q.lost_how);
      streaming_in_.erase({m.src, op->id});
    }
  }

  // The receiver has taken `n` more of p's bytes: credit them back in batches (a quarter of the
  // window), so a sender that waits for credit always has messages here a receive can take.
  void owe(int p, std::uint64_t n) {
    zmq_peer& q = peers_->at(p);
    q.owed += n;
    if (q.owed >= o_->credit_bytes / 4) {
      peers_->send_control(p, zmq_kind::credit, 0, q.owed);
      q.owed = 0;
    }
  }

  // A large message's data, in pieces ZeroMQ reads from the caller's buffer; the send completes
  // when ZeroMQ has let go of every piece (advance()).
  void send_pieces(int p, const std::shared_ptr<zmq_send_op>& op) {
    op->st = zmq_send_op::stage::streaming;
    zc_release* rel = op->rel(0, wake_fd_);
    op->rel_peers = {p};
    const std::size_t chunk = std::max<std::size_t>(o_->chunk_bytes, 1);
    for (std::size_t off = 0; off < op->bytes; off += chunk) {
      const std::size_t len = std::min(chunk, op->bytes - off);
      zmq_header h = peers_->header(zmq_kind::piece, p);
      h.id = op->id;
      h.offset = off;
      h.length = static_cast<std::uint32_t>(len);
      zmq_message head(sizeof h);
      std::memcpy(head.data(), &h, sizeof h);
      peers_->push(p, zmq_outgoing{std::move(head), rel->piece(op->buf + off, len), peers_->at(p).inc, zmq_queued(op)});
    }
    streaming_out_.push_back(op);
  }

  const zmq_options* o_;
  zmq_peer_table* peers_;
  int wake_fd_ = -1;
  std::deque<std::shared_ptr<zmq_recv_op>> posted_;
  std::deque<zmq_incoming> unexpected_;
  std::map<std::pair<int, std::uint64_t>, std::shared_ptr<zmq_send_op>> announced_;
  std::map<std::pair<int, std::uint64_t>, std::shared_ptr<zmq_recv_op>> streaming_in_;
  std::map<std::pair<int, std::uint64_t>, early_stream> early_pieces_;  // of unexpected streams
  std::deque<std::shared_ptr<zmq_send_op>> streaming_out_;
  std::deque<std::shared_ptr<zmq_send_op>> waiting_eager_;  // eager sends whose copy waits for a connection
};

}  // namespace cadence::transport::detail
