// The ZeroMQ backend's peers: per rank, the process in its slot (incarnation, endpoint), the
// DEALER that carries our messages to it and that socket's monitor, the liveness its connections
// report, what waits to leave and the credit for more; and the outgoing path (headers, queues,
// flushing). A peer found lost is reported to the engine (on_lost), which decides what fails.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/zmq/detail/ops.hpp>
#include <cadence/transport/zmq/detail/sockets.hpp>
#include <cadence/transport/zmq/detail/wire.hpp>
#include <cadence/transport/zmq/options.hpp>

#include <zmq.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace cadence::transport::detail {

using zclock = deadline::clock;

/// A message prepared for a peer, not yet taken by ZeroMQ.
struct zmq_outgoing {
  zmq_message head;
  std::optional<zmq_message> body;
  std::uint64_t inc = 0;  // the incarnation it is for (0: whichever comes first)
  zmq_queued owner;       // the operation it belongs to, if any
};

/// One rank slot as this rank sees it.
struct zmq_peer {
  zmq_peer_state state = zmq_peer_state::absent;
  std::uint64_t inc = 0;
  std::string endpoint;
  std::string lost_how;
  void* dealer = nullptr;
  void* monitor = nullptr;
  std::deque<std::shared_ptr<zmq_send_op>> sends;  // point to point, not handed to ZeroMQ yet
  std::deque<zmq_outgoing> out;                    // prepared, not yet taken by ZeroMQ
  std::int64_t credit = 0;                         // bytes we may still send it eagerly
  std::uint64_t owed = 0;                          // its bytes taken here, not yet credited back
  std::uint64_t held = 0;                          // its bytes here no receive has taken (<= credit)
  std::uint64_t next_id = 0;
  std::deque<zmq_incoming> future;  // from an incarnation we have not been told of yet
  std::uint64_t future_inc = 0;
  // Liveness of the current incarnation: its connections' fate, as the monitors report it.
  bool connected = false;        // our DEALER's handshake with it succeeded
  bool hello_seen = false;       // its hello came in: its connection to our ROUTER is known
  zclock::time_point broken_at;  // our DEALER's connection to it broke (epoch: not)
  std::string broken_how;
  zclock::time_point inbound_closed_at;  // its connection to our ROUTER closed (epoch: not)
  // Its goodbye said it had completed collectives 1..bye_through (of incarnation bye_inc).
  std::uint64_t bye_through = 0;
  std::uint64_t bye_inc = 0;
};

/// Credit charged per message beyond its data.
inline constexpr std::size_t zmq_overhead = 64;

/// The table of peers and the outgoing path. Owning thread only. Map of its state: peers_ (per
/// rank); incarnation_ (this process's own); router_monitor_ with inbound_fds_ and
/// unknown_inbound_ (which of our ROUTER's connections is whose, and which are not yet known);
/// monitors_ (a counter naming monitor endpoints).
class zmq_peer_table {
public:
  zmq_peer_table(int rank, int size, const zmq_options& o, zmq_sockets& sockets)
      : rank_(rank), size_(size), o_(&o), sockets_(&sockets), peers_(static_cast<std::size_t>(size)) {}
  zmq_peer_table(const zmq_peer_table&) = delete;
  zmq_peer_table& operator=(const zmq_peer_table&) = delete;

  /// Called when a peer is found lost (a connection broke, a send failed): the engine's lose().
  std::function<void(int, const std::string&)> on_lost;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::uint64_t incarnation() const noexcept { return incarnation_; }
  void set_incarnation(std::uint64_t inc) noexcept { incarnation_ = inc; }

  zmq_peer& at(int p) noexcept { return peers_[static_cast<std::size_t>(p)]; }
  const zmq_peer& at(int p) const noexcept { return peers_[static_cast<std::size_t>(p)]; }
  zmq_peer_state state_of(int p) const noexcept { return p == rank_ ? zmq_peer_state::alive : at(p).state; }
  std::uint64_t incarnation_of(int p) const noexcept { return p == rank_ ? incarnation_ : at(p).inc; }
  /// The incarnation a message for p is bound to: the live one, or whichever comes first.
  std::uint64_t bound_inc(int p) const noexcept {
    const zmq_peer& q = at(p);
    return q.state == zmq_peer_state::alive ? q.inc : 0;
  }
  std::vector<int> others() const { return ranks_except(rank_, size_); }

  // ---- a new process in a slot, and its DEALER ----

  /// Forgets the slot's previous process (its liveness, credit, numbering) for incarnation `inc`.
  void reset(int p, std::uint64_t inc, const std::string& endpoint) {
    zmq_peer& q = at(p);
    q.inc = inc;
    q.endpoint = endpoint;
    q.credit = static_cast<std::int64_t>(o_->credit_bytes);
    q.owed = 0;
    q.held = 0;
    q.next_id = 0;
    q.connected = q.hello_seen = false;
    q.broken_at = q.inbound_closed_at = zclock::time_point{};
    q.broken_how.clear();
  }

  /// A DEALER to p's endpoint (our routing id names our rank and incarnation) and a monitor
  /// that reports its connection's fate.
  void open_dealer(int p) {
    zmq_peer& q = at(p);
    const call_info c{"zmq", "connect", 0, rank_, size_, zclock::now()};
    void* s = sockets_->open(c, ZMQ_DEALER);
    const std::string id = zmq_identity(rank_, incarnation_);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, id.data(), id.size());
    // ZeroMQ takes a message only once the connection is up (until then it waits in q.out, and
    // a connection that breaks drops its queue): nothing lingers for a connection that is gone,
    // and nothing is redelivered to a reconnection (a broken connection ends the incarnation).
    zmq_set_int(s, ZMQ_IMMEDIATE, 1);
    const std::string addr = "inproc://cadence-monitor-" + std::to_string(p) + "-" + std::to_string(++monitors_);
    q.dealer = s;
    q.monitor = sockets_->monitor(c, s, addr,
                                  ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    if (zmq_connect(s, q.endpoint.c_str()) != 0) {
      on_lost(p, "cannot connect to its endpoint " + q.endpoint + ": " + zmq_reason());
      return;
    }
    // The first message on the connection, ahead of anything queued while it was absent: the
    // peer learns which of its ROUTER's connections is ours.
    zmq_header h = header(zmq_kind::hello, p);
    zmq_message m(sizeof h);
    std::memcpy(m.data(), &h, sizeof h);
    q.out.push_front(zmq_outgoing{std::move(m), std::nullopt, q.inc, {}});
  }

  void close_dealer(zmq_peer& q, int linger) noexcept {
    if (q.monitor != nullptr && q.dealer != nullptr) zmq_socket_monitor(q.dealer, nullptr, 0);
    sockets_->close(q.monitor, 0);
    sockets_->close(q.dealer, linger);
  }

  /// p is lost: what never left fails with it (point to point alone), its socket closes.
  /// False when it was not alive.
  bool mark_lost(int p, const std::string& how) {
    zmq_peer& q = at(p);
    if (q.state != zmq_peer_state::alive) return false;
    q.state = zmq_peer_state::lost;
    q.lost_how = how;
    for (auto& o : q.out)  // a send whose message never left: it fails with the peer
      if (o.owner.op() && o.owner.op()->what == zmq_op::kind::send && !o.owner.op()->finished())
        o.owner.op()->isolated = lost_peer_error(o.owner.op()->c, {p}, how);
    q.out.clear();
    close_dealer(q, 0);
    for (auto& op : q.sends)
      if (!op->finished()) op->isolated = lost_peer_error(op->c, {p}, how);
    q.sends.clear();
    return true;
  }

  // ---- liveness ----

  /// Our ROUTER's connections: which peer each is (its hello says), and when one closes.
  void watch_router(const call_info& c, void* router) {
    router_monitor_ = sockets_->monitor(c, router, "inproc://cadence-router-monitor",
                                        ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | zmq_handshake_failed);
  }
  void* router_monitor() const noexcept { return router_monitor_; }
  /// Connections to our ROUTER whose handshake failed: without the job secret, of another
  /// security mode, or not ZeroMQ at all.
  std::size_t refused() const noexcept { return refused_; }
  void close_router_monitor(void* router) noexcept {
    if (router_monitor_ != nullptr && router != nullptr) zmq_socket_monitor(router, nullptr, 0);
    sockets_->close(router_monitor_, 0);
  }
  /// The peer's hello came in on our ROUTER's connection `fd` (ZeroMQ's "__fd" metadata).
  void note_hello(int fd, int p, std::uint64_t inc) {
    inbound_fds_[fd] = {p, inc};
    unknown_inbound_.erase(fd);
  }

  /// Our DEALER to p: connected, or broken (check_lost decides when that makes p lost).
  void drain_monitor(int p) {
    zmq_peer& q = at(p);
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    while (q.monitor != nullptr && zmq_read_event(q.monitor, event, value)) {
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        q.connected = true;
        continue;
      }
      std::string how;
      if (event == ZMQ_EVENT_DISCONNECTED)
        how = "its connection closed, or it fell silent for the heartbeat timeout (" +
              std::to_string(o_->heartbeat_timeout.count()) + " ms)";
      else if (event == ZMQ_EVENT_CONNECT_RETRIED)
        how = "connecting to its endpoint " + q.endpoint + " failed";
      else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        how = "it refused this rank's credentials (it holds another job secret)";
      else if ((event & zmq_handshake_failed) != 0)
        how = "its ZeroMQ handshake failed (no answer within " + std::to_string(o_->heartbeat_timeout.count()) +
              " ms, not a Cadence peer, or one of another security mode)";
      if (how.empty() || q.broken_at != zclock::time_point{}) continue;
      q.broken_at = zclock::now();
      q.broken_how = std::move(how);
    }
  }

  /// Our ROUTER: a peer's connection to us closed. Everything it carried is in the ROUTER's
  /// queue (ZeroMQ reports the close after reading the last bytes).
  void drain_router_monitor() {
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    while (router_monitor_ != nullptr && zmq_read_event(router_monitor_, event, value)) {
      if ((event & zmq_handshake_failed) != 0) {  // its value is an error, not the descriptor
        ++refused_;  // a DISCONNECTED for the connection follows
        continue;
      }
      const int fd = static_cast<int>(value);
      if (event == ZMQ_EVENT_ACCEPTED) {
        unknown_inbound_.insert(fd);  // whose it is, its hello will say
        continue;
      }
      if (event != ZMQ_EVENT_DISCONNECTED) continue;
      unknown_inbound_.erase(fd);
      const auto it = inbound_fds_.find(fd);
      if (it == inbound_fds_.end()) continue;
      const auto [p, inc] = it->second;
      inbound_fds_.erase(it);
      zmq_peer& q = at(p);
      if (q.inc == inc && q.state == zmq_peer_state::alive && q.inbound_closed_at == zclock::time_point{})
        q.inbound_closed_at = zclock::now();
    }
  }

  /// How long after its connection to our ROUTER closed a peer is declared lost: ZeroMQ
  /// reports the close a moment before it hands over the last messages read, so the ROUTER is
  /// drained once more within this grace.
  static constexpr std::chrono::milliseconds drain_grace{20};

  /// Reports lost the peers whose connections say so: our DEALER's broke and it never sent us
  /// anything (its hello never came, and no connection to us is still unidentified: nothing to
  /// wait for), or its connection to us closed (after drain_grace), or our DEALER's broke
  /// heartbeat_timeout ago (its connection to us never closed). Returns the earliest time a
  /// pending case comes due.
  zclock::time_point check_lost(zclock::time_point now) {
    auto next = zclock::time_point::max();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      zmq_peer& q = at(p);
      if (q.state != zmq_peer_state::alive) continue;
      const bool broken = q.broken_at != zclock::time_point{};
      const bool closed = q.inbound_closed_at != zclock::time_point{};
      if (!broken && !closed) continue;
      auto due = zclock::time_point::max();
      if (closed) due = q.inbound_closed_at + drain_grace;
      if (broken)
        due = std::min(due, q.hello_seen || !unknown_inbound_.empty() ? q.broken_at + o_->heartbeat_timeout
                                                                       : q.broken_at);
      if (now >= due) {
        on_lost(p, broken ? q.broken_how
                          : "its connection closed, or it fell silent for the heartbeat timeout (" +
                                std::to_string(o_->heartbeat_timeout.count()) + " ms)");
        continue;
      }
      next = std::min(next, due);
    }
    return next;
  }

  // ---- outgoing ----

  zmq_header header(zmq_kind k, int dst) const {
    zmq_header h;
    h.kind = static_cast<std::uint8_t>(k);
    h.src = rank_;
    h.dst = dst;
    h.src_incarnation = incarnation_;
    return h;
  }

  void push(int p, zmq_outgoing o) {
    at(p).out.push_back(std::move(o));
    flush(p);
  }

  void flush_all() {
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !at(p).out.empty()) flush(p);
  }

  void flush(int p) {
    zmq_peer& q = at(p);
    while (q.dealer != nullptr && !q.out.empty()) {
      zmq_outgoing& o = q.out.front();
      if (o.inc != 0 && o.inc != q.inc) {  // for an incarnation that is gone
        q.out.pop_front();
        continue;
      }
      std::memcpy(o.head.data() + zmq_dst_incarnation_offset, &q.inc, sizeof q.inc);
      if (!send_frame(p, o.head, o.body ? ZMQ_SNDMORE : 0)) return;
      if (o.body && !send_frame(p, *o.body, 0)) return;
      q.out.pop_front();
    }
  }

  /// A control message (no operation behind it), for p's current incarnation.
  void send_control(int p, zmq_kind k, std::uint64_t id, std::uint64_t offset, const std::string& text = {}) {
    zmq_peer& q = at(p);
    if (q.state != zmq_peer_state::alive) return;
    zmq_header h = header(k, p);
    h.id = id;
    h.offset = offset;
    h.length = static_cast<std::uint32_t>(text.size());
    zmq_message m(sizeof h + text.size());
    std::memcpy(m.data(), &h, sizeof h);
    if (!text.empty()) std::memcpy(m.data() + sizeof h, text.data(), text.size());
    push(p, zmq_outgoing{std::move(m), std::nullopt, q.inc, {}});
  }

  // ---- polling ----

  /// Adds what the progress pass polls for the peers: each DEALER's monitor (as a descriptor),
  /// and the DEALERs with messages waiting for their connection (ZeroMQ's events). `who` gets
  /// the peer of each item (-1 for a DEALER's).
  void poll_items(std::vector<zmq_pollitem_t>& items, std::vector<int>& who) const {
    for (int p = 0; p < size_; ++p) {
      const zmq_peer& q = at(p);
      if (q.monitor != nullptr) {
        items.push_back({nullptr, zmq_fd_of(q.monitor), ZMQ_POLLIN, 0});
        who.push_back(p);
      }
      if (q.dealer != nullptr && !q.out.empty()) {  // waiting for its connection: ZeroMQ's events
        items.push_back({q.dealer, 0, ZMQ_POLLOUT, 0});
        who.push_back(-1);
      }
    }
  }

private:
  // False when ZeroMQ cannot take it now (the message stays queued) or the peer was lost.
  bool send_frame(int p, zmq_message& m, int more) {
    for (;;) {
      if (zmq_msg_send(m.get(), at(p).dealer, ZMQ_DONTWAIT | more) >= 0) return true;
      if (errno == EINTR) continue;
      if (errno != EAGAIN) on_lost(p, "sending to it failed: " + zmq_reason());
      return false;
    }
  }

  const int rank_;
  const int size_;
  const zmq_options* o_;
  zmq_sockets* sockets_;
  std::vector<zmq_peer> peers_;
  std::uint64_t incarnation_ = 0;
  void* router_monitor_ = nullptr;
  std::size_t refused_ = 0;
  std::map<int, std::pair<int, std::uint64_t>> inbound_fds_;  // our ROUTER's connection fd -> (rank, incarnation)
  std::set<int> unknown_inbound_;  // connections accepted whose hello has not been read yet
  std::uint64_t monitors_ = 0;
};

}  // namespace cadence::transport::detail
