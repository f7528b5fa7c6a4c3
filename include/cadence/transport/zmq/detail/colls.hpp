// The ZeroMQ backend's collectives in flight: their issue order and indices, each one's inbox of
// messages by sender, what a collective sends (copied or from the caller's buffer), the check of
// every message's arguments, and a lost peer that a collective still needs. The collectives
// themselves (detail/collectives.hpp) see the engine through this.
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
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cadence::transport::detail {

/// Owning thread only. Map of its state: issued_ (the index of the last collective started),
/// colls_ (in progress, in issue order), inbox_ (per collective index, per sender, what came),
/// failed_early_ (failures peers reported for collectives not started here yet), done_ (the
/// signatures of recently completed ones, to answer a late peer whose arguments differ).
class zmq_colls {
public:
  zmq_colls(const zmq_options& o, zmq_peer_table& peers, failure_latch& latch)
      : o_(&o), peers_(&peers), latch_(&latch) {}
  zmq_colls(const zmq_colls&) = delete;
  zmq_colls& operator=(const zmq_colls&) = delete;

  void set_wake_fd(int fd) noexcept { wake_fd_ = fd; }

  /// Called when a peer sends more collective data than this rank holds for it
  /// (options.max_inbox_bytes): the engine drops it, after the current message.
  std::function<void(int, const std::string&)> on_bad_peer;

  // ---- what a collective sees ----

  int rank() const noexcept { return peers_->rank(); }
  int size() const noexcept { return peers_->size(); }
  std::vector<int> others() const { return peers_->others(); }
  const zmq_options& options() const noexcept { return *o_; }
  zmq_peer_state state_of(int p) const noexcept { return peers_->state_of(p); }
  void mark_failed(transport_error e) { latch_->record(std::move(e)); }

  std::deque<zmq_incoming>& inbox(std::uint64_t index, int p) {
    auto& box = inbox_[index];
    if (box.empty()) box.resize(static_cast<std::size_t>(size()));
    return box[static_cast<std::size_t>(p)];
  }

  zmq_header coll_header(const zmq_coll_op& op, int dst, std::uint32_t step, std::uint64_t offset,
                         std::size_t length) const {
    zmq_header h = peers_->header(zmq_kind::coll, dst);
    h.coll = op.sig.coll;
    h.type = op.sig.type;
    h.op = op.sig.op;
    h.tag = op.sig.root;
    h.bytes = op.sig.count;
    h.id = op.index;
    h.step = step;
    h.offset = offset;
    h.length = static_cast<std::uint32_t>(length);
    return h;
  }

  /// A collective's message with a copy of `data`.
  void coll_send_copy(zmq_coll_op& op, int p, const zmq_header& h, const void* data, std::size_t n) {
    zmq_message m(sizeof h + n);
    std::memcpy(m.data(), &h, sizeof h);
    if (n != 0) std::memcpy(m.data() + sizeof h, data, n);
    peers_->push(p, zmq_outgoing{std::move(m), std::nullopt, peers_->bound_inc(p), zmq_queued(op.shared_from_this())});
  }
  /// A collective's message whose data ZeroMQ reads from the caller's buffer, counted in the
  /// op's release group `group`.
  void coll_send_zero_copy(zmq_coll_op& op, std::size_t group, int p, const zmq_header& h, const void* data,
                           std::size_t n) {
    zc_release* rel = op.rel(group, wake_fd_);
    if (std::find(op.rel_peers.begin(), op.rel_peers.end(), p) == op.rel_peers.end()) op.rel_peers.push_back(p);
    zmq_message head(sizeof h);
    std::memcpy(head.data(), &h, sizeof h);
    peers_->push(p, zmq_outgoing{std::move(head), rel->piece(data, n), peers_->bound_inc(p),
                                 zmq_queued(op.shared_from_this())});
  }

  /// Checks a collective message against the op's arguments; on a difference fails the
  /// communicator, tells the peers, and returns false.
  bool check_sig(zmq_coll_op& op, const zmq_incoming& m) {
    const zmq_coll_sig theirs = zmq_coll_sig::of(m.h);
    if (theirs == op.sig) return true;
    const std::string text = "arguments differ across ranks in collective #" + std::to_string(op.index) +
                             ": rank " + std::to_string(m.src) + " called " + theirs.text() + ", rank " +
                             std::to_string(rank()) + " called " + op.sig.text();
    mark_failed(transport_error(describe(op.c) + ": " + text));
    for (int q : others())
      if (peers_->at(q).state == zmq_peer_state::alive) peers_->send_control(q, zmq_kind::coll_fail, op.index, 0, text);
    return false;
  }

  // ---- the queue ----

  std::uint64_t issued() const noexcept { return issued_; }

  /// Takes the next index and starts: collectives of every rank meet by index.
  void submit(const std::shared_ptr<zmq_coll_op>& op) {
    op->index = ++issued_;
    if (const auto it = charged_.find(op->index); it != charged_.end())  // no longer ahead of this rank
      for (std::size_t p = 0; p < it->second.size(); ++p) held_[p] -= it->second[p];
    if (auto f = failed_early_.find(op->index); f != failed_early_.end()) {
      mark_failed(transport_error(describe(op->c) + ": " + f->second));
      failed_early_.erase(f);
      return;
    }
    colls_.push_back(op);
    op->start(*this);
    op->advance(*this);
    finish();
    fail_on_lost();
  }

  void advance() {
    for (std::size_t i = 0; i < colls_.size() && !latch_->has_failure(); ++i) {
      const std::shared_ptr<zmq_coll_op> op = colls_[i];
      if (!op->finished()) op->advance(*this);
    }
    finish();
    fail_on_lost();
  }

  /// A collective message arrived: into its inbox, or, for one this rank completed, a check.
  /// What it holds is charged to its sender: for a collective in progress here, against twice
  /// that collective's bytes (more than any of its algorithms sends one peer); for one this rank
  /// has not started, against max_inbox_bytes. A sender beyond either is dropped.
  void on_coll(zmq_incoming in) {
    const std::uint64_t k = in.h.id;
    const auto op = std::find_if(colls_.begin(), colls_.end(), [&](const auto& c) { return c->index == k; });
    const bool active = op != colls_.end();
    if (active || k > issued_) {
      const int src = in.src;
      const std::size_t cost = sizeof(zmq_header) + in.size();
      auto& charged = charge_of(k)[static_cast<std::size_t>(src)];
      auto& future = held_[static_cast<std::size_t>(src)];
      const std::size_t allowance = active ? budget((*op)->sig) : o_->max_inbox_bytes;
      const std::size_t used = active ? charged : future;
      if (cost > allowance || used > allowance - cost) {
        on_bad_peer(src, active ? "more collective data for collective #" + std::to_string(k) +
                                      " than its arguments allow (" + std::to_string(allowance) + " bytes)"
                                : "more than max_inbox_bytes (" + std::to_string(o_->max_inbox_bytes) +
                                      ") of messages for collectives this rank has not started");
        return;
      }
      charged += cost;
      if (!active) future += cost;
      inbox(k, src).push_back(std::move(in));
      return;
    }
    // For a collective this rank has completed: only a rank whose arguments differ sends one.
    for (const auto& [index, sig] : done_) {
      if (index != k) continue;
      const zmq_coll_sig theirs = zmq_coll_sig::of(in.h);
      if (theirs != sig.first)
        mark_failed(transport_error(describe(sig.second) + ": arguments differ across ranks in collective #" +
                                    std::to_string(k) + ": rank " + std::to_string(in.src) + " called " +
                                    theirs.text() + ", rank " + std::to_string(rank()) + " called " +
                                    sig.first.text()));
    }
  }

  /// A peer reports collective k failed (its arguments differ from another rank's).
  void on_coll_fail(std::uint64_t k, int p, const std::string& text) {
    const std::string why = text + " (reported by rank " + std::to_string(p) + ")";
    for (const auto& op : colls_)
      if (op->index == k && !op->finished()) {
        mark_failed(transport_error(describe(op->c) + ": " + why));
        return;
      }
    if (k > issued_) failed_early_.emplace(k, why);
  }

  /// The collectives this rank completed, all of 1..k (one still in progress stops the count).
  std::uint64_t completed_through() const noexcept {
    std::uint64_t k = issued_;
    for (const auto& op : colls_)
      if (!op->done) k = std::min<std::uint64_t>(k, op->index - 1);
    return k;
  }

private:
  // A collective that still needs a lost peer (after taking everything it had sent) fails the
  // communicator: collectives need every rank. A peer that left after completing the collective
  // (its goodbye says so) sent everything this rank needs from it before the goodbye, so it is
  // not needed any more: a ring's quick rank may finish and leave while a slower one still
  // receives from its left neighbour.
  void fail_on_lost() {
    for (const auto& op : colls_) {
      if (op->finished() || latch_->has_failure()) continue;
      for (int p : others()) {
        const zmq_peer& q = peers_->at(p);
        if (q.state != zmq_peer_state::lost || !op->needs(p)) continue;
        if (q.bye_inc == q.inc && q.bye_through >= op->index) continue;
        mark_failed(lost_peer_error(op->c, {p}, q.lost_how));
        return;
      }
    }
  }

  void finish() {
    for (auto it = colls_.begin(); it != colls_.end();) {
      if (!(*it)->done) {
        ++it;
        continue;
      }
      const auto k = (*it)->index;
      done_.emplace_back(k, std::make_pair((*it)->sig, (*it)->c));
      if (done_.size() > 64) done_.pop_front();
      inbox_.erase(k);
      charged_.erase(k);
      it = colls_.erase(it);
    }
  }

  std::vector<std::size_t>& charge_of(std::uint64_t k) {
    auto& c = charged_[k];
    if (c.empty()) c.resize(static_cast<std::size_t>(size()));
    return c;
  }

  // What one peer may send for a collective in progress: twice its bytes (the ring's
  // reduce-scatter and all-gather), a header for each piece, a notice, and slack.
  std::size_t budget(const zmq_coll_sig& sig) const {
    const std::size_t bytes = sig.coll == 1 ? sig.count * dtype_size(static_cast<dtype>(sig.type)) : sig.count;
    const std::size_t piece = std::max<std::size_t>(o_->chunk_bytes / 8 * 8, 8);
    const std::size_t messages = 2 * (bytes / piece) + 4 * static_cast<std::size_t>(size()) + 8;
    return 2 * bytes + messages * sizeof(zmq_header);
  }

  const zmq_options* o_;
  zmq_peer_table* peers_;
  failure_latch* latch_;
  int wake_fd_ = -1;
  // Per sender: bytes held for collectives this rank has not started.
  std::vector<std::size_t> held_ = std::vector<std::size_t>(static_cast<std::size_t>(peers_->size()), 0);
  std::map<std::uint64_t, std::vector<std::size_t>> charged_;  // per collective, per sender
  std::uint64_t issued_ = 0;
  std::deque<std::shared_ptr<zmq_coll_op>> colls_;
  std::map<std::uint64_t, std::vector<std::deque<zmq_incoming>>> inbox_;
  std::map<std::uint64_t, std::string> failed_early_;
  std::deque<std::pair<std::uint64_t, std::pair<zmq_coll_sig, call_info>>> done_;
};

}  // namespace cadence::transport::detail
