// The gloo backend's wire (transport/algorithms/wire.hpp): the shared collective algorithms'
// messages on gloo buffers of the communicator's own (one receive always posted per peer, so a
// message moves in one write instead of gloo's send-ready / recv-ready handshake), their bulk
// pieces on the caller's buffer and two scratch buffers; and the set-up and goodbye exchanges.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/wire.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/signature.hpp>
#include <cadence/transport/gloo/detail/link.hpp>
#include <cadence/transport/gloo/options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

namespace cadence::transport::detail {

/// Map of its state (the owning thread's; gloo's device thread reads and writes the registered
/// buffers while operations are posted): in_ (per peer, its next collective message;
/// in_posted_ says which receives are posted), out_ (our data message; out_pending_ and out_to_
/// track its sends), notice_out_ (our notice; notices_pending_), scratch_, staging_ and
/// caller_ (the bulk regions, caller_ registered on the caller's buffer for one collective),
/// recvs_ and sends_ (bulk pieces posted per peer, oldest first, each with its buffer), bye_
/// (the destructor's goodbye). Declared in the communicator after the link, so destroyed
/// before the context, and only after the connections are closed.
class gloo_wire {
public:
  static constexpr bool posts_over_delivered_sends = true;

  gloo_wire(gloo_link& link, const gloo_options& o) : link_(&link), o_(&o) {}
  gloo_wire(const gloo_wire&) = delete;
  gloo_wire& operator=(const gloo_wire&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// Collective messages carry up to this many bytes of data after their head; never fewer
  /// than one 8-byte element per rank, so an all-reduce too small for the ring always fits.
  std::size_t inline_capacity() const noexcept {
    return std::max(o_->eager_bytes, std::size_t{8} * static_cast<std::size_t>(size_));
  }
  /// A multiple of 8, so of every element size.
  std::size_t piece_bytes(std::size_t) const noexcept { return std::max<std::size_t>(o_->chunk_bytes / 8 * 8, 8); }

  // ---- set-up ----

  /// Registers our buffers, posts the first receives, then exchanges a message with every
  /// peer: a rank whose connections are all up may otherwise finish, and close them, while a
  /// peer is still connecting to it. The message also checks that every rank was given the
  /// same size.
  void setup(const call_info& c, const deadline& d, int rank, int size) {
    rank_ = rank;
    size_ = size;
    const std::size_t capacity = collective_head_bytes + inline_capacity();
    in_.resize(static_cast<std::size_t>(size_));
    in_posted_.assign(static_cast<std::size_t>(size_), false);
    recvs_.resize(static_cast<std::size_t>(size_));
    sends_.resize(static_cast<std::size_t>(size_));
    for (int p = 0; p < size_; ++p)
      if (p != rank_) link_->own(in_[static_cast<std::size_t>(p)], capacity);
    link_->own(out_, capacity);
    link_->own(notice_out_, collective_head_bytes);
    // Every peer's next collective message has a receive posted before it is sent, so it moves
    // in one write instead of gloo's send-ready / recv-ready handshake.
    for (int p = 0; p < size_; ++p)
      if (p != rank_) post_in(c, p);
    if (size_ == 1) return;
    const collective_signature hello{0, static_cast<std::int64_t>(collective_kind::construction), size_, 0, 0, 0};
    const std::vector<int> others = others_of();
    send_out(c, others, hello, collective_summary::of(hello, rank_), 0);
    for (std::size_t i = 0; i < others.size(); ++i) {
      const int p = others[i];
      auto& b = in_[static_cast<std::size_t>(p)];
      link_->wait(c, d, *b.ub, true, std::vector<int>(others.begin() + static_cast<std::ptrdiff_t>(i), others.end()),
                  nullptr, "they never started this collective");
      in_posted_[static_cast<std::size_t>(p)] = false;
      collective_signature theirs;
      std::memcpy(&theirs, b.bytes.get(), sizeof theirs);
      if (theirs != hello) throw transport_error(describe(c) + ": " + arguments_differ(hello, rank_, theirs, p));
      post_in(c, p);
    }
    while (out_pending_ > 0) {
      link_->wait(c, d, *out_.ub, false, out_pending(), nullptr, "it did not take this collective's message");
      --out_pending_;
    }
  }

  // ---- outgoing messages ----

  unsigned char* out_data(std::size_t) noexcept { return out_.bytes.get() + collective_head_bytes; }

  void send_out(const call_info& c, const std::vector<int>& to, const collective_signature& sig,
                const collective_summary& summary, std::size_t n) {
    std::memcpy(out_.bytes.get(), &sig, sizeof sig);
    std::memcpy(out_.bytes.get() + sizeof sig, &summary, sizeof summary);
    const std::size_t bytes = collective_head_bytes + n;
    out_to_ = to;
    out_pending_ = 0;
    for (int p : to) {
      link_->post(c, [&] { out_.ub->send(p, gloo_slot_collective, 0, bytes); }, p);
      ++out_pending_;
    }
  }
  bool out_sent(const call_info& c) {
    while (out_pending_ > 0) {
      if (!link_->try_take(c, *out_.ub, false, out_pending())) return false;
      --out_pending_;
    }
    return true;
  }
  std::vector<int> out_pending() const {
    return std::vector<int>(out_to_.end() - static_cast<std::ptrdiff_t>(out_pending_), out_to_.end());
  }

  void send_notices(const call_info& c, const std::vector<int>& to, const collective_signature& sig) {
    collective_summary only = collective_summary::of(sig, rank_);
    only.lo_rank = -1;  // a notice without data
    std::memcpy(notice_out_.bytes.get(), &sig, sizeof sig);
    std::memcpy(notice_out_.bytes.get() + sizeof sig, &only, sizeof only);
    for (int p : to) {
      link_->post(c, [&] { notice_out_.ub->send(p, gloo_slot_collective, 0, collective_head_bytes); }, p);
      notices_pending_.push_back(p);
    }
  }
  bool notices_sent(const call_info& c) {
    while (!notices_pending_.empty()) {
      if (!link_->try_take(c, *notice_out_.ub, false, notices_pending_)) return false;
      notices_pending_.erase(notices_pending_.begin());
    }
    return true;
  }
  std::vector<int> notices_pending() const { return notices_pending_; }

  // ---- incoming messages: one stream per peer, in the order it sent them ----

  bool take(const call_info& c, int p, coll_stream, std::int64_t, std::size_t, coll_message& m) {
    auto& b = in_[static_cast<std::size_t>(p)];
    if (!in_posted_[static_cast<std::size_t>(p)]) post_in(c, p);
    if (!link_->try_take(c, *b.ub, true, {p})) return false;
    in_posted_[static_cast<std::size_t>(p)] = false;
    std::memcpy(&m.sig, b.bytes.get(), sizeof m.sig);
    std::memcpy(&m.summary, b.bytes.get() + sizeof m.sig, sizeof m.summary);
    m.data = b.bytes.get() + collective_head_bytes;
    return true;
  }
  void release(const call_info& c, int p, coll_stream) { post_in(c, p); }
  void expect(const call_info&, int, std::size_t) noexcept {}

  // ---- bulk pieces ----

  void bulk_begin(const call_info&, void* buf, std::size_t bytes, std::size_t scratch) {
    if (scratch != 0)
      for (auto& sc : scratch_)
        if (sc.size < scratch) link_->own(sc, scratch);
    if (staging_.size < piece_bytes(1)) link_->own(staging_, piece_bytes(1));
    caller_bytes_ = static_cast<unsigned char*>(buf);
    caller_ = link_->buffer(buf, bytes);
  }
  unsigned char* bulk_base(bulk_region r) noexcept {
    switch (r) {
      case bulk_region::scratch0: return scratch_[0].bytes.get();
      case bulk_region::scratch1: return scratch_[1].bytes.get();
      case bulk_region::staging: return staging_.bytes.get();
      case bulk_region::caller: break;
    }
    return caller_bytes_;
  }
  void bulk_recv(const call_info& c, int p, bulk_region r, std::size_t offset, std::size_t capacity) {
    gloo_buffer* ub = buffer_of(r);
    link_->post(c, [&] { ub->recv(p, gloo_slot_bulk, offset, capacity); }, p);
    recvs_[static_cast<std::size_t>(p)].push_back({ub, ++posted_, false});
  }
  void bulk_send(const call_info& c, int p, bulk_region r, std::size_t offset, std::size_t n) {
    gloo_buffer* ub = buffer_of(r);
    link_->post(c, [&] { ub->send(p, gloo_slot_bulk, offset, n); }, p);
    sends_[static_cast<std::size_t>(p)].push_back({ub, ++posted_, false});
  }
  bool bulk_recv_done(const call_info& c, int p, std::size_t&) { return pieces_done(c, recvs_, p, true); }
  bool bulk_send_done(const call_info& c, int p) { return pieces_done(c, sends_, p, false); }
  /// Any failure from now on closes the connections at once, so gloo never touches the
  /// caller's buffer afterwards (the peers then see this rank as lost).
  void expose() noexcept { exposed_ = true; }
  /// No: a failure with the caller's buffer exposed closes every connection, so the ring's first
  /// piece leaves from the staging copy and the caller's buffer is exposed after agreement.
  bool reads_caller_early() const noexcept { return false; }
  void bulk_end(const call_info&) {
    if (caller_) link_->forget(caller_.get());
    caller_.reset();
    caller_bytes_ = nullptr;
    exposed_ = false;
  }
  bool exposed() const noexcept { return exposed_; }

  const void* native(wire_point point, int p) const noexcept {
    switch (point) {
      case wire_point::notice_in:
      case wire_point::data_in: return in_[static_cast<std::size_t>(p)].ub.get();
      case wire_point::out: return out_.ub.get();
      case wire_point::notices_out: return notice_out_.ub.get();
      case wire_point::bulk_in: return oldest_pending(recvs_, p);
      case wire_point::bulk_out: return oldest_pending(sends_, p);
    }
    return nullptr;
  }

  // ---- the goodbye ----

  /// Ours to every peer, theirs from every peer (collective index `index`), skipping what a
  /// failed collective left unread. A lost peer is skipped, not a reason to stop: the others
  /// still wait for our goodbye. The goodbye has a buffer of its own: out_ may still hold a
  /// failed collective's message, or carry gloo's error from a peer that died.
  void goodbye(const call_info& c, const deadline& until, std::int64_t index) noexcept {
    try {
      link_->own(bye_, collective_head_bytes);
    } catch (...) {
      return;
    }
    const collective_signature bye{index, static_cast<std::int64_t>(collective_kind::shutdown), 0, 0, 0, 0};
    std::memcpy(bye_.bytes.get(), &bye, sizeof bye);
    std::vector<int> sent;
    for (int p : others_of()) {
      try {
        bye_.ub->send(p, gloo_slot_collective, 0, collective_head_bytes);
        sent.push_back(p);
      } catch (const std::exception&) {
      }
    }
    for (int p : others_of()) {
      try {
        for (;;) {
          if (!in_posted_[static_cast<std::size_t>(p)]) post_in(c, p);
          auto& b = in_[static_cast<std::size_t>(p)];
          link_->wait(c, until, *b.ub, true, {p}, nullptr, "it did not say goodbye", /*abortable=*/false);
          in_posted_[static_cast<std::size_t>(p)] = false;
          collective_signature theirs;
          std::memcpy(&theirs, b.bytes.get(), sizeof theirs);
          if (theirs.is(collective_kind::shutdown)) break;
        }
      } catch (const std::exception&) {
      }
    }
    for (std::size_t i = 0; i < sent.size(); ++i) {
      try {
        link_->wait(c, until, *bye_.ub, false, {sent[i]}, nullptr, "it did not take our goodbye", false);
      } catch (const std::exception&) {
        break;
      }
    }
  }

private:
  struct piece {
    gloo_buffer* ub;
    std::uint64_t seq;  // posting order, over all peers
    bool done;
  };
  using piece_queues = std::vector<std::deque<piece>>;

  std::vector<int> others_of() const { return ranks_except(rank_, size_); }

  void post_in(const call_info& c, int p) {
    auto& b = in_[static_cast<std::size_t>(p)];
    link_->post(c, [&] { b.ub->recv(p, gloo_slot_collective, 0, b.size); }, p);
    in_posted_[static_cast<std::size_t>(p)] = true;
  }

  gloo_buffer* buffer_of(bulk_region r) const noexcept {
    switch (r) {
      case bulk_region::scratch0: return scratch_[0].ub.get();
      case bulk_region::scratch1: return scratch_[1].ub.get();
      case bulk_region::staging: return staging_.ub.get();
      case bulk_region::caller: break;
    }
    return caller_.get();
  }

  // The oldest piece posted to (from) p completes once gloo has completed it. gloo counts
  // completions per buffer and direction but names only the peer of the latest, so each
  // completion there marks the oldest pending piece on that buffer, whoever its peer: pieces
  // of one peer complete in order, and every piece is counted once.
  bool pieces_done(const call_info& c, piece_queues& queues, int p, bool recv) {
    auto& q = queues[static_cast<std::size_t>(p)];
    if (q.empty()) return false;
    while (!q.front().done) {
      gloo_buffer* ub = q.front().ub;
      if (!link_->try_take(c, *ub, recv, {p})) return false;
      piece* oldest = nullptr;
      for (auto& each : queues)
        for (auto& x : each)
          if (x.ub == ub && !x.done && (oldest == nullptr || x.seq < oldest->seq)) oldest = &x;
      if (oldest != nullptr) oldest->done = true;
    }
    q.pop_front();
    return true;
  }
  static const void* oldest_pending(const piece_queues& queues, int p) noexcept {
    if (p < 0 || static_cast<std::size_t>(p) >= queues.size()) return nullptr;
    for (const auto& x : queues[static_cast<std::size_t>(p)])
      if (!x.done) return x.ub;
    return nullptr;
  }

  gloo_link* link_;
  const gloo_options* o_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<gloo_owned> in_;  // per peer: its next collective message
  std::vector<bool> in_posted_;
  gloo_owned out_;  // our data message
  std::size_t out_pending_ = 0;
  std::vector<int> out_to_;
  gloo_owned notice_out_;  // our notice
  std::vector<int> notices_pending_;
  gloo_owned scratch_[2];  // the ring's incoming pieces, alternating by step
  gloo_owned staging_;     // the ring's first outgoing piece, sent before the check
  std::unique_ptr<gloo_buffer> caller_;
  unsigned char* caller_bytes_ = nullptr;
  bool exposed_ = false;
  piece_queues recvs_, sends_;
  std::uint64_t posted_ = 0;
  gloo_owned bye_;  // the destructor's goodbye
};

}  // namespace cadence::transport::detail
