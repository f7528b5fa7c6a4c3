// The gloo backend's point to point: a message is a header (its size and tag, and up to
// eager_bytes of data) on a slot per tag, and a larger message's data follows straight into the
// caller's buffer; headers are matched to receives here, so any_source, try_recv's deadline and
// order per (source, tag) hold although gloo can neither cancel a receive nor test one.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/operation.hpp>
#include <cadence/transport/gloo/detail/link.hpp>
#include <cadence/transport/gloo/options.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence::transport::detail {

/// A gloo operation: the engine's record, the gloo buffer on the caller's memory of a large
/// message (its data moves straight between the callers' buffers), and whether gloo may read or
/// write that memory now.
struct gloo_op : operation {
  std::unique_ptr<gloo_buffer> body;
  bool exposed = false;
};

// A point to point message's header: its size and tag.
struct gloo_frame {
  std::uint64_t bytes = 0;
  std::uint64_t tag = 0;
};

/// The protocol. Header receives are posted into buffers of our own, one per receive, and may
/// outlive the operation that posted them: a receive withdrawn (try_recv's deadline, cancel())
/// leaves its gloo receive posted (gloo cannot cancel one). For each tag the posted receives
/// cover disjoint sets of senders, so a message can match only one of them, and gloo delivers
/// each (sender, slot) in order; a message taken for a sender the caller did not ask for waits
/// in early_ for the receive that asks for it, which looks there first. Receives progress in
/// issue order, so order per (source, tag) holds. Map of its state: posted_ (header receives
/// posted, not completed), early_ (headers taken for a later receive), spare_heads_ (header
/// buffers free for reuse), eager_ (small sends not yet known to be received).
class gloo_p2p {
public:
  gloo_p2p(gloo_link& link, const gloo_options& o) : link_(&link), o_(&o) {}
  gloo_p2p(const gloo_p2p&) = delete;
  gloo_p2p& operator=(const gloo_p2p&) = delete;

  void set_world(int rank, int size) noexcept {
    rank_ = rank;
    size_ = size;
  }

  // ---- sends ----

  /// Posts the header (and, up to eager_bytes, the data: then the send is complete at once, as
  /// MPI's eager sends); a larger message's data follows from the caller's buffer (phase 1). A
  /// blocking send (`d`) bounds the small sends held, waiting with its deadline for the oldest.
  void start_send(gloo_op& o, const deadline* d) {
    if (d) reap_eager(o.c, *d);
    reap_received();
    const gloo_frame frame{o.bytes, static_cast<std::uint64_t>(o.tag)};
    const bool inline_data = o.bytes <= o_->eager_bytes;
    eager_send m;
    m.size = sizeof frame + (inline_data ? o.bytes : 0);
    m.bytes.reset(new unsigned char[m.size]);
    std::memcpy(m.bytes.get(), &frame, sizeof frame);
    if (inline_data && o.bytes != 0) std::memcpy(m.bytes.get() + sizeof frame, o.cbuf, o.bytes);
    m.ub = link_->buffer(m.bytes.get(), m.size);
    m.dst = o.peer;
    const int dst = o.peer;
    link_->post(o.c, [&] { m.ub->send(dst, gloo_slot_p2p_head | static_cast<std::uint64_t>(o.tag), 0, m.size); }, dst);
    eager_.push_back(std::move(m));
    o.active = true;
    if (inline_data) {
      o.done = true;
      return;
    }
    // gloo reads the caller's buffer until the receiver has taken it.
    o.body = link_->buffer(const_cast<void*>(o.cbuf), o.bytes);
    o.exposed = true;
    link_->post(o.c, [&] { o.body->send(dst, gloo_slot_p2p_body | static_cast<std::uint64_t>(o.tag), 0, o.bytes); },
                dst);
    o.phase = 1;
  }

  void progress_send(gloo_op& o) {
    if (o.phase != 1) return;
    if (!link_->try_take(o.c, *o.body, false, {o.peer})) return;
    release_body(o);
  }

  // ---- receives ----

  /// Phase 0: waiting for the header; phase 1: for a large message's data.
  void progress_recv(gloo_op& o) {
    if (o.phase == 0) {
      std::unique_ptr<p2p_head> head = take_head(o.c, o.peer, o.tag);
      if (!head) return;
      const int sender = head->sender;
      o.source = sender;
      gloo_frame frame;
      std::memcpy(&frame, head->buf.bytes.get(), sizeof frame);
      const bool reusable = head->reusable;
      if (frame.bytes != o.bytes)
        throw transport_error(describe(o.c) + ": rank " + std::to_string(sender) + " sent " +
                              std::to_string(frame.bytes) + " bytes with tag " + std::to_string(o.tag) + " but rank " +
                              std::to_string(rank_) + " received into " + std::to_string(o.bytes) + " bytes");
      if (o.bytes <= o_->eager_bytes) {
        if (o.bytes != 0) std::memcpy(o.buf, head->buf.bytes.get() + sizeof frame, o.bytes);
        if (reusable) spare_heads_.push_back(std::move(head->buf));
        o.done = true;
        return;
      }
      if (reusable) spare_heads_.push_back(std::move(head->buf));
      o.body = link_->buffer(o.buf, o.bytes);
      o.exposed = true;
      link_->post(o.c, [&] { o.body->recv(sender, gloo_slot_p2p_body | static_cast<std::uint64_t>(o.tag), 0, o.bytes); },
                  sender);
      o.phase = 1;
    }
    if (!link_->try_take(o.c, *o.body, true, {o.source})) return;
    release_body(o);
  }

  /// What an unfinished send or receive waits on.
  waiting awaited(const gloo_op& o) const {
    if (o.what == op_kind::send) return {{o.peer}, "the matching recv was not posted", o.body.get(), false};
    if (o.phase == 1) return {{o.source}, "the message's data did not arrive", o.body.get(), true};
    auto wanted = [&](int r) { return o.peer == any_source ? r != rank_ : r == o.peer; };
    for (const auto& h : posted_)
      if (h->tag == o.tag && std::any_of(h->from.begin(), h->from.end(), wanted))
        return {wanted_from(o.peer), "no matching message arrived", h->buf.ub.get(), true};
    return {wanted_from(o.peer), "no matching message arrived"};
  }

  // ---- shutdown ----

  /// Waits (up to `until`) for the small sends to be received: a send returns before that, and
  /// closing a connection with unread bytes resets it, destroying what the peer has not read.
  void finish_sends(const call_info& c, const deadline& until) {
    for (auto& m : eager_) link_->wait(c, until, *m.ub, false, {m.dst}, nullptr, "it never received a message", false);
  }

private:
  struct eager_send {
    std::unique_ptr<unsigned char[]> bytes;
    std::size_t size = 0;
    std::unique_ptr<gloo_buffer> ub;
    int dst = -1;
  };
  // A header receive of the protocol.
  struct p2p_head {
    std::vector<int> from;  // the senders it was posted for, ascending
    int tag = 0;
    int sender = -1;        // once it has completed
    bool reusable = true;   // false once gloo has stored an error on the buffer
    gloo_owned buf;
  };

  void release_body(gloo_op& o) {
    link_->forget(o.body.get());
    o.body.reset();
    o.exposed = false;
    o.done = true;
  }

  std::vector<int> wanted_from(int src) const {
    if (src != any_source) return {src};
    return ranks_except(rank_, size_);
  }

  // The next header for (src, tag), if one has come: one taken earlier, or from the posted
  // receives covering the senders asked for (posting one for those not yet covered).
  std::unique_ptr<p2p_head> take_head(const call_info& c, int src, int tag) {
    auto wanted = [&](int r) { return src == any_source ? r != rank_ : r == src; };
    for (auto it = early_.begin(); it != early_.end(); ++it) {
      if ((*it)->tag != tag || !wanted((*it)->sender)) continue;
      std::unique_ptr<p2p_head> h = std::move(*it);
      early_.erase(it);
      return h;
    }
    for (;;) {
      std::vector<int> uncovered;
      for (int p = 0; p < size_; ++p) {
        if (!wanted(p)) continue;
        bool covered = false;
        for (const auto& h : posted_)
          if (h->tag == tag && std::binary_search(h->from.begin(), h->from.end(), p)) covered = true;
        if (!covered) uncovered.push_back(p);
      }
      if (!uncovered.empty()) post_head(c, std::move(uncovered), tag);
      p2p_head* done = nullptr;
      for (const auto& h : posted_) {
        if (h->tag != tag || !std::any_of(h->from.begin(), h->from.end(), wanted)) continue;
        int sender = -1;
        if (link_->try_take(c, *h->buf.ub, true, h->from, &sender)) {
          h->sender = sender;
          done = h.get();
          break;
        }
      }
      if (done == nullptr) return nullptr;
      auto it = std::find_if(posted_.begin(), posted_.end(), [&](const auto& h) { return h.get() == done; });
      std::unique_ptr<p2p_head> h = std::move(*it);
      posted_.erase(it);
      link_->forget(h->buf.ub.get());
      if (wanted(h->sender)) return h;
      early_.push_back(std::move(h));  // another sender's: for a later receive
    }
  }

  void post_head(const call_info& c, std::vector<int> from, int tag) {
    auto h = std::make_unique<p2p_head>();
    h->from = std::move(from);
    h->tag = tag;
    if (!spare_heads_.empty()) {
      h->buf = std::move(spare_heads_.back());
      spare_heads_.pop_back();
    } else {
      link_->own(h->buf, sizeof(gloo_frame) + o_->eager_bytes);
    }
    const std::uint64_t slot = gloo_slot_p2p_head | static_cast<std::uint64_t>(tag);
    auto& ub = *h->buf.ub;
    const std::size_t n = h->buf.size;
    if (h->from.size() == 1)  // one sender: gloo then sees its connection close
      link_->post(c, [&] { ub.recv(h->from.front(), slot, 0, n); }, h->from);
    else
      link_->post(c, [&] { ub.recv(h->from, slot, 0, n); }, h->from);
    posted_.push_back(std::move(h));
  }

  // Small sends not yet known to be received: beyond max_eager_in_flight the oldest is
  // waited for.
  void reap_eager(const call_info& c, const deadline& d) {
    while (eager_.size() >= o_->max_eager_in_flight && !eager_.empty()) {
      auto& m = eager_.front();
      link_->wait(c, d, *m.ub, false, {m.dst}, nullptr, "it has not received an earlier message");
      eager_.pop_front();
    }
  }
  // Lets go of the small sends known to be received, without waiting.
  void reap_received() {
    while (!eager_.empty()) {
      auto& m = eager_.front();
      const std::optional<bool> r = gloo_peek::ready(*m.ub, false);
      if (!r || !*r) return;
      try {
        if (!m.ub->waitSend(nullptr, std::chrono::hours(1))) return;
      } catch (const std::exception&) {
        return;  // its peer is gone; a later call waiting for that peer says so
      }
      eager_.pop_front();
    }
  }

  gloo_link* link_;
  const gloo_options* o_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::unique_ptr<p2p_head>> posted_;
  std::deque<std::unique_ptr<p2p_head>> early_;
  std::vector<gloo_owned> spare_heads_;
  std::deque<eager_send> eager_;
};

}  // namespace cadence::transport::detail
