// The ZeroMQ backend's engine: one rank's sockets, its view of the peers (incarnations,
// liveness), the rendezvous, the matching of point-to-point messages, credits, and the progress
// loop that every call and every work handle drives. Owned by one thread; see the map below.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/latch.hpp>
#include <cadence/transport/zmq/detail/ops.hpp>
#include <cadence/transport/zmq/detail/sockets.hpp>
#include <cadence/transport/zmq/detail/wire.hpp>
#include <cadence/transport/zmq/options.hpp>

#include <zmq.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace cadence::transport::detail {

using zclock = deadline::clock;

// ---- the engine ----

class zmq_engine {
public:
  // Map of this class. Everything below is touched by the owning thread only (the thread that
  // constructs the communicator and makes its calls), except:
  //  - latch_'s atomics: abort() and failed() read or set them from any thread;
  //    abort() also writes wake_fd_ (an eventfd) to wake a zmq_poll in progress.
  //  - wake_fd_ is also written by ZeroMQ's I/O thread, through zc_release, when it lets go of
  //    a piece of a caller's buffer; it is closed only after zmq_ctx_term, after which ZeroMQ
  //    runs no callback.
  // ZeroMQ sockets are not thread-safe: only the owning thread calls into them.
  // State, by part: the sockets (router_: our data endpoint; rdv_: rank 0's rendezvous ROUTER
  // or, elsewhere, a DEALER to it; per peer a DEALER and its monitor's PAIR); peers_ (state,
  // incarnation, endpoint, outgoing queue, credits, messages from an incarnation not yet
  // announced); slots_ (rank 0 only: incarnations issued, rendezvous ids); the matching state
  // (posted_ receives, unexpected_ messages, large messages announced_ or streaming in and
  // out); the collectives (colls_ in progress, coll_in_ their inboxes, coll_failed_ failures
  // peers reported, done_sigs_ recent signatures); latch_ (the first failure).

  zmq_engine(int rank, int size, zmq_options options)
      : rank_(rank), size_(size), o_(std::move(options)), peers_(static_cast<std::size_t>(size)) {}
  zmq_engine(const zmq_engine&) = delete;
  zmq_engine& operator=(const zmq_engine&) = delete;
  ~zmq_engine() { close_all(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const zmq_options& options() const noexcept { return o_; }
  const std::string& endpoint() const noexcept { return endpoint_; }
  const std::string& rendezvous_endpoint() const noexcept { return rdv_endpoint_; }
  zmq_peer_state state_of(int p) const noexcept {
    return p == rank_ ? zmq_peer_state::alive : peer_at(p).state;
  }
  std::uint64_t incarnation_of(int p) const noexcept { return p == rank_ ? incarnation_ : peer_at(p).inc; }

  // ---- calls, failures, abort ----

  call_info begin(const char* op) { return {"zmq", op, ++calls_, rank_, size_, zclock::now()}; }

  /// Contract b: after a failure every call rethrows it; after abort() each call says so.
  void enter(const call_info& c) const {
    latch_.enter(c);
    if (closed_) throw transport_error(describe(c) + ": the communicator was destroyed");
  }

  void mark_failed(transport_error e) { latch_.record(std::move(e)); }

  void abort() noexcept {
    latch_.abort();
    wake();
  }
  bool failed() const noexcept { return latch_.failed(); }

  // ---- construction: sockets and rendezvous ----

  /// Binds, registers with rank 0 (rank 0: opens the rendezvous) and waits for whom
  /// options().wait_for says. Throws; the engine is then destroyed by its owner.
  void start(const call_info& c, const deadline& d) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw transport_error(describe(c) + ": eventfd: " + std::strerror(errno));
    sockets_.create(c, o_);

    router_ = sockets_.open(c, ZMQ_ROUTER);
    zmq_set_int(router_, ZMQ_ROUTER_HANDOVER, 1);
    // The fate of each peer's connection to us: a closed one means everything it sent before
    // is in our ROUTER's queue (see check_lost).
    router_monitor_ = sockets_.monitor(c, router_, "inproc://cadence-router-monitor",
                                       ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | zmq_handshake_failed);
    zmq_bind_endpoint(c, router_, o_.endpoint, "its endpoint");
    endpoint_ = zmq_last_endpoint(router_);

    if (rank_ == 0) {
      rdv_ = sockets_.open(c, ZMQ_ROUTER);
      zmq_bind_endpoint(c, rdv_, o_.rendezvous, "the rendezvous");
      rdv_endpoint_ = zmq_last_endpoint(rdv_);
      incarnation_ = 1;
      slots_.assign(static_cast<std::size_t>(size_), zmq_slot{});
      slots_[0].issued = 1;
      welcomed_ = true;
      if (o_.on_rendezvous_bound) o_.on_rendezvous_bound(rdv_endpoint_);
    } else {
      rdv_ = sockets_.open(c, ZMQ_DEALER);
      rdv_endpoint_ = o_.rendezvous;
      if (zmq_connect(rdv_, o_.rendezvous.c_str()) != 0)
        bad_argument(c, "cannot connect to the rendezvous \"" + o_.rendezvous + "\": " + zmq_reason());
      zmq_writer w(zmq_rdv_kind::hello);
      w.put(static_cast<std::int32_t>(rank_)).put(static_cast<std::int32_t>(size_)).put_string(endpoint_);
      rdv_send({}, w);
    }

    // Rank 0 answers registrations from here on, in every progress pass.
    while (!welcomed_) {
      if (refused_) throw transport_error(describe(c) + ": rank 0 refused the registration: " + *refused_);
      if (d.passed())
        throw deadline_error(c, {0}, "rank 0 never answered at the rendezvous " + o_.rendezvous);
      progress(d.time_point());
    }
    if (o_.wait_for == zmq_wait_for::all) {
      for (;;) {
        if (latch_.has_failure()) latch_.rethrow();
        std::vector<int> absent;
        for (int p = 0; p < size_; ++p)
          if (p != rank_ && peer_at(p).state == zmq_peer_state::absent) absent.push_back(p);
        if (absent.empty()) break;
        if (d.passed())
          throw deadline_error(c, absent, std::string(absent.size() == 1 ? "it" : "they") +
                                              " never registered at the rendezvous " +
                                              (rank_ == 0 ? rdv_endpoint_ : o_.rendezvous));
        progress(d.time_point());
      }
    }
    // The connections to the peers known now come up before the first call: ZeroMQ takes a
    // message only on a connection that is up (ZMQ_IMMEDIATE), so without this a message sent
    // right away would wait in this communicator for a later call. A peer that does not answer
    // is not waited for past the heartbeat timeout (it will be lost).
    const auto connect_until = std::min(d.time_point(), zclock::now() + o_.heartbeat_timeout);
    for (;;) {
      if (latch_.has_failure()) latch_.rethrow();
      bool pending = false;
      for (int p = 0; p < size_; ++p) {
        const zmq_peer& q = peer_at(p);
        pending = pending || (p != rank_ && q.state == zmq_peer_state::alive && q.dealer != nullptr && !q.connected &&
                              q.broken_at == zclock::time_point{});
      }
      if (!pending || zclock::now() >= connect_until) break;
      progress(connect_until);
    }
  }

  // ---- submitting operations ----

  void submit_send(const std::shared_ptr<zmq_send_op>& op) {
    zmq_peer& q = peer_at(op->peer);
    if (q.state == zmq_peer_state::lost) {
      op->isolated = lost_peer_error(op->c, {op->peer}, q.lost_how);
      return;
    }
    q.sends.push_back(op);
    hand_over(op->peer);
  }

  void submit_recv(const std::shared_ptr<zmq_recv_op>& op) {
    if (op->peer != any_source) {
      const zmq_peer& q = peer_at(op->peer);
      op->inc = q.state == zmq_peer_state::absent ? 0 : q.inc;
    }
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      if (!matches(*op, *it)) continue;
      zmq_incoming m = std::move(*it);
      unexpected_.erase(it);
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

  void submit_coll(const std::shared_ptr<zmq_coll_op>& op) {
    op->index = ++collectives_;
    if (auto f = coll_failed_.find(op->index); f != coll_failed_.end()) {
      mark_failed(transport_error(describe(op->c) + ": " + f->second));
      coll_failed_.erase(f);
      return;
    }
    colls_.push_back(op);
    op->start(*this);
    op->advance(*this);
    finish_colls();
    fail_colls_on_lost();
  }

  // ---- waiting, testing, cancelling ----

  /// Drives op to completion. With `poll` (try_recv): a deadline that passes before a message
  /// matched returns false and withdraws the receive (a deadline already passed polls once).
  bool wait(zmq_op& op, const deadline& d, bool poll) {
    auto until = d.time_point();
    bool extended = false;
    if (poll) {
      check(op);
      if (!op.done) progress(zclock::now());
    }
    for (;;) {
      check(op);
      if (op.done || op.cancelled) return true;
      const auto now = zclock::now();
      if (now >= until) {
        if (poll) {
          auto& r = static_cast<zmq_recv_op&>(op);
          if (!r.matched) {
            withdraw(op);
            return false;
          }
          if (!extended) {  // its data is on its way: take it rather than leave half of it
            extended = true;
            until = now + o_.body_wait;
            continue;
          }
        }
        std::vector<int> who;
        std::string note;
        awaited(op, who, note);
        fail(op, deadline_error(op.c, who, note));
      }
      progress(until);
    }
  }

  bool test(zmq_op& op) {
    if (op.isolated) {
      settle(op);
      throw *op.isolated;
    }
    if (op.done || op.cancelled) return true;
    check(op);
    progress(zclock::now());
    check(op);
    return op.done;
  }

  /// Withdraws what can be withdrawn; false when ZeroMQ may still read the caller's buffer (a
  /// large send streaming, a collective in progress: the latter keeps running for its peers).
  bool cancel(zmq_op& op) noexcept {
    if (op.finished()) return true;
    if (closed_) {
      op.cancelled = true;  // the context has terminated: ZeroMQ holds nothing any more
      return true;
    }
    try {
      if (op.what == zmq_op::kind::send) {
        auto& s = static_cast<zmq_send_op&>(op);
        if (s.st == zmq_send_op::stage::streaming) return false;
        if (s.st == zmq_send_op::stage::announced) {
          announced_.erase({s.peer, s.id});
          send_control(s.peer, zmq_kind::withdraw, s.id, 0);
        }
        withdraw(op);
        op.cancelled = true;
        return true;
      }
      if (op.what == zmq_op::kind::recv) {
        withdraw(op);  // pieces of a large message still on the way are dropped on arrival
        op.cancelled = true;
        return true;
      }
    } catch (...) {
      return false;
    }
    return false;  // a collective: its contribution is made and its peers wait for the rest
  }

  /// For the work handle (engine/work.hpp): test, wait and cancel above.
  static constexpr bool work_has_wait_until = false;
  bool work_test(zmq_op& op) { return test(op); }
  void work_wait(zmq_op& op, const deadline& d) { wait(op, d, /*poll=*/false); }
  bool work_cancel(zmq_op& op) noexcept { return cancel(op); }

  /// Closes everything (see close_all); idempotent. The communicator's destructor calls it.
  void shutdown() noexcept { close_all(); }

  void poll(const call_info& c) {
    enter(c);
    progress(zclock::now());
    enter(c);
  }

  // ---- the progress pass ----

  /// Sends what can leave, waits in zmq_poll until something arrives or `until`, takes in
  /// everything that arrived (registrations, messages, monitor events) and advances the
  /// operations. Does nothing once the communicator failed or was aborted.
  void progress(zclock::time_point until) {
    if (closed_ || latch_.has_failure() || latch_.aborted()) return;
    flush_all();
    const auto due = check_lost(zclock::now());  // may close sockets: before the poll list
    // The sockets we read from are polled by their ZMQ_FD, as plain descriptors: cheaper than
    // zmq_poll's ZMQ_EVENTS round on every socket before and after it sleeps. That is exact
    // because each of them is always read until EAGAIN (which rearms its descriptor) before the
    // next poll, and only the owning thread reads them.
    items_.clear();
    items_.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    items_.push_back({nullptr, zmq_fd_of(router_), ZMQ_POLLIN, 0});
    items_.push_back({nullptr, zmq_fd_of(rdv_), ZMQ_POLLIN, 0});
    items_.push_back({nullptr, zmq_fd_of(router_monitor_), ZMQ_POLLIN, 0});
    poll_peers_.clear();
    for (int p = 0; p < size_; ++p) {
      const zmq_peer& q = peer_at(p);
      if (q.monitor != nullptr) {
        items_.push_back({nullptr, zmq_fd_of(q.monitor), ZMQ_POLLIN, 0});
        poll_peers_.push_back(p);
      }
      if (q.dealer != nullptr && !q.out.empty()) {  // waiting for its connection: ZeroMQ's events
        items_.push_back({q.dealer, 0, ZMQ_POLLOUT, 0});
        poll_peers_.push_back(-1);
      }
    }
    const int rc = rdv_dirty_ ? 0
                              : zmq_poll(items_.data(), static_cast<int>(items_.size()),
                                         timeout_ms(std::min(until, due)));
    if (rc < 0) {
      if (errno == EINTR) return;
      mark_failed(transport_error("cadence::transport[zmq]: rank " + std::to_string(rank_) + " of " +
                                  std::to_string(size_) + ": zmq_poll: " + zmq_reason()));
      return;
    }
    if (rc > 0 || rdv_dirty_) {
      if (items_[0].revents != 0) drain_wake();
      if (items_[2].revents != 0 || rdv_dirty_) drain_rdv();
      // Monitors before the ROUTER: a connection reported closed has its last messages queued.
      for (std::size_t i = 4; i < items_.size(); ++i)
        if (poll_peers_[i - 4] >= 0 && items_[i].revents != 0) drain_monitor(poll_peers_[i - 4]);
      if (items_[3].revents != 0) drain_router_monitor();
      if (items_[1].revents != 0) drain_router();
    }
    check_lost(zclock::now());
    flush_all();
    advance();
  }

  // ---- what collectives use ----

  std::deque<zmq_incoming>& inbox(std::uint64_t index, int p) {
    auto& box = coll_in_[index];
    if (box.empty()) box.resize(static_cast<std::size_t>(size_));
    return box[static_cast<std::size_t>(p)];
  }

  zmq_header coll_header(const zmq_coll_op& op, int dst, std::uint32_t step, std::uint64_t offset,
                         std::size_t length) const {
    zmq_header h = header(zmq_kind::coll, dst);
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
    push(p, zmq_outgoing{std::move(m), std::nullopt, bound_inc(p), zmq_queued(op.shared_from_this())});
  }
  /// A collective's message whose data ZeroMQ reads from the caller's buffer, counted in the
  /// op's release group `group`.
  void coll_send_zero_copy(zmq_coll_op& op, std::size_t group, int p, const zmq_header& h, const void* data,
                           std::size_t n) {
    zc_release* rel = op.rel(group, wake_fd_);
    if (std::find(op.rel_peers.begin(), op.rel_peers.end(), p) == op.rel_peers.end()) op.rel_peers.push_back(p);
    zmq_message head(sizeof h);
    std::memcpy(head.data(), &h, sizeof h);
    push(p, zmq_outgoing{std::move(head), rel->piece(data, n), bound_inc(p), zmq_queued(op.shared_from_this())});
  }

  /// Checks a collective message against the op's arguments; on a difference fails the
  /// communicator, tells the peers, and returns false.
  bool check_sig(zmq_coll_op& op, const zmq_incoming& m) {
    const zmq_coll_sig theirs = zmq_coll_sig::of(m.h);
    if (theirs == op.sig) return true;
    coll_mismatch(op, m.src, theirs);
    return false;
  }
  void coll_mismatch(zmq_coll_op& op, int p, const zmq_coll_sig& theirs) {
    const std::string text = "arguments differ across ranks in collective #" + std::to_string(op.index) +
                             ": rank " + std::to_string(p) + " called " + theirs.text() + ", rank " +
                             std::to_string(rank_) + " called " + op.sig.text();
    mark_failed(transport_error(describe(op.c) + ": " + text));
    for (int q = 0; q < size_; ++q)
      if (q != rank_ && peer_at(q).state == zmq_peer_state::alive)
        send_control(q, zmq_kind::coll_fail, op.index, 0, text);
  }

  std::vector<int> others() const {
    std::vector<int> v;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) v.push_back(p);
    return v;
  }

  /// Waits (on the event fd only: nothing else progresses) until ZeroMQ has let go of op's
  /// pieces of the caller's buffer; when they are stuck (a peer that does not read), closes the
  /// sockets they wait in, which makes ZeroMQ drop them. Before any error reaches the caller.
  void settle(zmq_op& op) noexcept {
    if (op.outstanding() == 0 || closed_) return;
    wait_released(op, zclock::now() + std::chrono::milliseconds(200));
    if (op.outstanding() == 0) return;
    for (int p : op.rel_peers) {
      zmq_peer& q = peer_at(p);
      q.out.clear();
      close_dealer(q, 0);
    }
    wait_released(op, zclock::now() + std::chrono::seconds(30));
  }

private:
  // ---- peers ----

  struct zmq_outgoing {
    zmq_message head;
    std::optional<zmq_message> body;
    std::uint64_t inc = 0;  // the incarnation it is for (0: whichever comes first)
    zmq_queued owner;       // the operation it belongs to, if any
  };

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

  struct zmq_slot {  // rank 0's registry
    std::uint64_t issued = 0;
    std::string rdv_id;
  };

  zmq_peer& peer_at(int p) noexcept { return peers_[static_cast<std::size_t>(p)]; }
  const zmq_peer& peer_at(int p) const noexcept { return peers_[static_cast<std::size_t>(p)]; }

  std::uint64_t bound_inc(int p) const noexcept {
    const zmq_peer& q = peer_at(p);
    return q.state == zmq_peer_state::alive ? q.inc : 0;
  }

  static constexpr std::size_t overhead = 64;  // credit charged per message beyond its data

  // ---- sockets ----

  void close_dealer(zmq_peer& q, int linger) noexcept {
    if (q.monitor != nullptr && q.dealer != nullptr) zmq_socket_monitor(q.dealer, nullptr, 0);
    sockets_.close(q.monitor, 0);
    sockets_.close(q.dealer, linger);
  }

  // A DEALER to p's endpoint (our routing id names our rank and incarnation) and a monitor
  // that reports its connection's fate.
  void open_dealer(int p) {
    zmq_peer& q = peer_at(p);
    const call_info c{"zmq", "connect", 0, rank_, size_, zclock::now()};
    void* s = sockets_.open(c, ZMQ_DEALER);
    const std::string id = zmq_identity(rank_, incarnation_);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, id.data(), id.size());
    // ZeroMQ takes a message only once the connection is up (until then it waits in q.out, and
    // a connection that breaks drops its queue): nothing lingers for a connection that is gone,
    // and nothing is redelivered to a reconnection (a broken connection ends the incarnation).
    zmq_set_int(s, ZMQ_IMMEDIATE, 1);
    const std::string addr = "inproc://cadence-monitor-" + std::to_string(p) + "-" + std::to_string(++monitors_);
    q.dealer = s;
    q.monitor = sockets_.monitor(c, s, addr,
                        ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED |
                            ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                            ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    if (zmq_connect(s, q.endpoint.c_str()) != 0) {
      lose(p, "cannot connect to its endpoint " + q.endpoint + ": " + zmq_reason());
      return;
    }
    // The first message on the connection, ahead of anything queued while it was absent: the
    // peer learns which of its ROUTER's connections is ours.
    zmq_header h = header(zmq_kind::hello, p);
    zmq_message m(sizeof h);
    std::memcpy(m.data(), &h, sizeof h);
    q.out.push_front(zmq_outgoing{std::move(m), std::nullopt, q.inc, {}});
  }

  // Our DEALER to p: connected, or broken (check_lost decides when that makes p lost).
  void drain_monitor(int p) {
    zmq_peer& q = peer_at(p);
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
              std::to_string(o_.heartbeat_timeout.count()) + " ms)";
      else if (event == ZMQ_EVENT_CONNECT_RETRIED)
        how = "connecting to its endpoint " + q.endpoint + " failed";
      else if ((event & zmq_handshake_failed) != 0)
        how = "its ZeroMQ handshake failed (no answer within " + std::to_string(o_.heartbeat_timeout.count()) +
              " ms, or not a Cadence peer)";
      if (how.empty() || q.broken_at != zclock::time_point{}) continue;
      q.broken_at = zclock::now();
      q.broken_how = std::move(how);
    }
  }

  // Our ROUTER: a peer's connection to us closed. Everything it carried is in the ROUTER's queue
  // (ZeroMQ reports the close after reading the last bytes).
  void drain_router_monitor() {
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    while (router_monitor_ != nullptr && zmq_read_event(router_monitor_, event, value)) {
      const int fd = static_cast<int>(value);
      if (event == ZMQ_EVENT_ACCEPTED) {
        unknown_inbound_.insert(fd);  // whose it is, its hello will say
        continue;
      }
      if (event != ZMQ_EVENT_DISCONNECTED && (event & zmq_handshake_failed) == 0) continue;
      unknown_inbound_.erase(fd);
      const auto it = inbound_fds_.find(fd);
      if (it == inbound_fds_.end()) continue;
      const auto [p, inc] = it->second;
      inbound_fds_.erase(it);
      zmq_peer& q = peer_at(p);
      if (q.inc == inc && q.state == zmq_peer_state::alive && q.inbound_closed_at == zclock::time_point{})
        q.inbound_closed_at = zclock::now();
    }
  }

  // How long after its connection to our ROUTER closed a peer is declared lost: ZeroMQ reports
  // the close a moment before it hands over the last messages read, so the ROUTER is drained
  // once more within this grace.
  static constexpr std::chrono::milliseconds drain_grace{20};

  /// Declares lost the peers whose connections say so: our DEALER's broke and it never sent
  /// us anything (its hello never came, and no connection to us is still unidentified: nothing
  /// to wait for), or its connection to us closed (after drain_grace), or our DEALER's broke
  /// heartbeat_timeout ago (its connection to us never closed). Returns the earliest time a
  /// pending case comes due.
  zclock::time_point check_lost(zclock::time_point now) {
    auto next = zclock::time_point::max();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      zmq_peer& q = peer_at(p);
      if (q.state != zmq_peer_state::alive) continue;
      const bool broken = q.broken_at != zclock::time_point{};
      const bool closed = q.inbound_closed_at != zclock::time_point{};
      if (!broken && !closed) continue;
      auto due = zclock::time_point::max();
      if (closed) due = q.inbound_closed_at + drain_grace;
      if (broken)
        due = std::min(due, q.hello_seen || !unknown_inbound_.empty() ? q.broken_at + o_.heartbeat_timeout
                                                                       : q.broken_at);
      if (now >= due) {
        lose(p, broken ? q.broken_how
                       : "its connection closed, or it fell silent for the heartbeat timeout (" +
                             std::to_string(o_.heartbeat_timeout.count()) + " ms)");
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
    peer_at(p).out.push_back(std::move(o));
    flush(p);
  }

  void flush_all() {
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !peer_at(p).out.empty()) flush(p);
  }

  void flush(int p) {
    zmq_peer& q = peer_at(p);
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

  // False when ZeroMQ cannot take it now (the message stays queued) or the peer was lost.
  bool send_frame(int p, zmq_message& m, int more) {
    for (;;) {
      if (zmq_msg_send(m.get(), peer_at(p).dealer, ZMQ_DONTWAIT | more) >= 0) return true;
      if (errno == EINTR) continue;
      if (errno != EAGAIN) lose(p, "sending to it failed: " + zmq_reason());
      return false;
    }
  }

  void send_control(int p, zmq_kind k, std::uint64_t id, std::uint64_t offset, const std::string& text = {}) {
    zmq_peer& q = peer_at(p);
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

  // Point-to-point sends go to ZeroMQ in the order they were started, each once its peer is
  // alive and, for an eager message, once the peer's credit covers it.
  void hand_over(int p) {
    zmq_peer& q = peer_at(p);
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
      const bool eager = op->bytes <= o_.eager_bytes;
      const bool stream = !eager && op->bytes <= o_.credit_bytes / 4;
      const auto cost = static_cast<std::int64_t>(overhead + (eager || stream ? op->bytes : 0));
      if (q.credit < cost) return;
      q.credit -= cost;
      q.sends.pop_front();
      zmq_header h = header(eager ? zmq_kind::eager : stream ? zmq_kind::stream : zmq_kind::announce, p);
      h.tag = op->tag;
      h.bytes = op->bytes;
      if (eager) {
        h.length = static_cast<std::uint32_t>(op->bytes);
        zmq_message m(sizeof h + op->bytes);
        std::memcpy(m.data(), &h, sizeof h);
        if (op->bytes != 0) std::memcpy(m.data() + sizeof h, op->buf, op->bytes);
        push(p, zmq_outgoing{std::move(m), std::nullopt, q.inc, zmq_queued(op)});
        if (op->queued == 0)
          op->done = true;  // ZeroMQ has its copy
        else
          waiting_eager_.push_back(op);  // its connection is not up yet: advance() sees it leave
        continue;
      }
      op->id = h.id = ++q.next_id;
      zmq_message m(sizeof h);
      std::memcpy(m.data(), &h, sizeof h);
      push(p, zmq_outgoing{std::move(m), std::nullopt, q.inc, zmq_queued(op)});
      if (stream) {
        send_pieces(p, op);
        continue;
      }
      op->st = zmq_send_op::stage::announced;
      announced_[{p, op->id}] = op;
    }
  }

  // A large message's data, in pieces ZeroMQ reads from the caller's buffer; the send completes
  // when ZeroMQ has let go of every piece (advance()).
  void send_pieces(int p, const std::shared_ptr<zmq_send_op>& op) {
    op->st = zmq_send_op::stage::streaming;
    zc_release* rel = op->rel(0, wake_fd_);
    op->rel_peers = {p};
    const std::size_t chunk = std::max<std::size_t>(o_.chunk_bytes, 1);
    for (std::size_t off = 0; off < op->bytes; off += chunk) {
      const std::size_t len = std::min(chunk, op->bytes - off);
      zmq_header h = header(zmq_kind::piece, p);
      h.id = op->id;
      h.offset = off;
      h.length = static_cast<std::uint32_t>(len);
      zmq_message head(sizeof h);
      std::memcpy(head.data(), &h, sizeof h);
      push(p, zmq_outgoing{std::move(head), rel->piece(op->buf + off, len), peer_at(p).inc, zmq_queued(op)});
    }
    streaming_out_.push_back(op);
  }

  // ---- incoming ----

  void drain_router() {
    for (;;) {
      zmq_message id;
      if (zmq_msg_recv(id.get(), router_, ZMQ_DONTWAIT) < 0) return;
      if (!id.more()) continue;
      zmq_message first;
      if (zmq_msg_recv(first.get(), router_, ZMQ_DONTWAIT) < 0) return;
      std::optional<zmq_message> second;
      if (first.more()) {
        second.emplace();
        if (zmq_msg_recv(second->get(), router_, ZMQ_DONTWAIT) < 0) return;
        while (second->more()) {  // not ours: drop the rest
          zmq_message extra;
          if (zmq_msg_recv(extra.get(), router_, ZMQ_DONTWAIT) < 0) return;
          if (!extra.more()) break;
        }
      }
      zmq_incoming in;
      if (!zmq_parse_identity(id.data(), id.size(), in.src, in.inc) || first.size() < sizeof(zmq_header))
        continue;
      std::memcpy(&in.h, first.data(), sizeof in.h);
      if (static_cast<zmq_kind>(in.h.kind) == zmq_kind::hello) {
        // Which of our ROUTER's connections is this peer's (ZeroMQ's "__fd" metadata).
        if (const char* fd = zmq_msg_gets(first.get(), "__fd")) {
          inbound_fds_[std::atoi(fd)] = {in.src, in.inc};
          unknown_inbound_.erase(std::atoi(fd));
        }
      }
      if (second) {
        in.frame = std::move(*second);
        in.at = 0;
      } else {
        in.frame = std::move(first);
        in.at = sizeof(zmq_header);
      }
      if (in.size() != in.h.length) continue;
      arrive(std::move(in));
    }
  }

  void arrive(zmq_incoming in) {
    if (in.src < 0 || in.src >= size_ || in.src == rank_ || in.h.dst != rank_) return;
    if (!welcomed_) {  // a peer told of us before our own welcome arrived
      early_.push_back(std::move(in));
      return;
    }
    if (in.h.dst_incarnation != incarnation_) return;  // for another process in this slot
    zmq_peer& q = peer_at(in.src);
    if (in.inc < q.inc) return;  // from an older process in that slot
    if (in.inc > q.inc) {        // from a newer one rank 0 has not told us of yet
      if (in.inc > q.future_inc) {
        q.future.clear();
        q.future_inc = in.inc;
      }
      q.future.push_back(std::move(in));
      return;
    }
    if (q.state != zmq_peer_state::alive) return;  // what a lost peer still sends is dropped
    handle(std::move(in));
  }

  void handle(zmq_incoming in) {
    switch (static_cast<zmq_kind>(in.h.kind)) {
      case zmq_kind::eager:
      case zmq_kind::announce:
      case zmq_kind::stream: on_message(std::move(in)); return;
      case zmq_kind::clear: on_clear(in.src, in.h.id); return;
      case zmq_kind::refuse: on_refuse(in.src, in.h.id, text_of(in)); return;
      case zmq_kind::piece: on_piece(in); return;
      case zmq_kind::credit:
        peer_at(in.src).credit += static_cast<std::int64_t>(in.h.offset);
        hand_over(in.src);
        return;
      case zmq_kind::coll: on_coll(std::move(in)); return;
      case zmq_kind::coll_fail: on_coll_fail(in.h.id, in.src, text_of(in)); return;
      case zmq_kind::bye: {
        // It completed collectives 1..id: everything it sent for them came before this bye.
        zmq_peer& q = peer_at(in.src);
        q.bye_through = in.h.id;
        q.bye_inc = q.inc;
        lose(in.src, "it left: its communicator was destroyed");
        return;
      }
      case zmq_kind::withdraw: on_withdraw(in.src, in.h.id); return;
      case zmq_kind::hello: peer_at(in.src).hello_seen = true; return;
    }
  }

  static std::string text_of(zmq_incoming& in) {
    return std::string(reinterpret_cast<const char*>(in.data()), in.size());
  }

  static bool matches(const zmq_recv_op& r, const zmq_incoming& m) {
    if (m.h.tag != r.tag) return false;
    if (r.peer == any_source) return true;
    return m.src == r.peer && (r.inc == 0 || r.inc == m.inc);
  }

  void on_message(zmq_incoming in) {
    for (auto it = posted_.begin(); it != posted_.end(); ++it) {
      if (!matches(**it, in)) continue;
      const std::shared_ptr<zmq_recv_op> op = *it;
      posted_.erase(it);
      take(op, std::move(in));
      return;
    }
    if (static_cast<zmq_kind>(in.h.kind) == zmq_kind::stream) early_pieces_[{in.src, in.h.id}];
    unexpected_.push_back(std::move(in));
  }

  // A receive takes a message: its data (eager) or the go-ahead for it (announced).
  // A receive takes a message: its data (eager), its pieces (stream: those come, or came, at
  // once) or the go-ahead for it (announced).
  void take(const std::shared_ptr<zmq_recv_op>& op, zmq_incoming m) {
    const auto kind = static_cast<zmq_kind>(m.h.kind);
    op->matched = true;
    op->from = m.src;
    op->id = m.h.id;
    owe(m.src, overhead + (kind == zmq_kind::announce ? 0 : m.h.bytes));
    std::deque<zmq_incoming> early;
    if (kind == zmq_kind::stream) {
      const auto it = early_pieces_.find({m.src, m.h.id});
      if (it != early_pieces_.end()) {
        early = std::move(it->second);
        early_pieces_.erase(it);
      }
    }
    if (m.h.bytes != op->bytes) {
      const std::string what = "rank " + std::to_string(m.src) + " sent " + std::to_string(m.h.bytes) +
                               " bytes with tag " + std::to_string(op->tag) + " but rank " +
                               std::to_string(rank_) + " received into " + std::to_string(op->bytes) + " bytes";
      if (kind == zmq_kind::announce) send_control(m.src, zmq_kind::refuse, m.h.id, 0, what);
      mark_failed(transport_error(describe(op->c) + ": " + what));
      return;
    }
    if (kind == zmq_kind::eager) {
      if (op->bytes != 0) std::memcpy(op->buf, m.data(), op->bytes);
      op->done = true;
      return;
    }
    streaming_in_[{m.src, op->id}] = op;
    if (kind == zmq_kind::announce) {
      send_control(m.src, zmq_kind::clear, op->id, 0);
      return;
    }
    for (auto& piece : early) on_piece(piece);
    const zmq_peer& q = peer_at(m.src);
    if (!op->done && (q.state != zmq_peer_state::alive || q.inc != m.inc)) {  // the rest will not come
      op->isolated = lost_peer_error(op->c, {m.src}, q.lost_how.empty() ? "it is gone" : q.lost_how);
      streaming_in_.erase({m.src, op->id});
    }
  }

  // The receiver has taken `n` more of p's bytes: credit them back in batches (a quarter of the
  // window), so a sender that waits for credit always has messages here a receive can take.
  void owe(int p, std::uint64_t n) {
    zmq_peer& q = peer_at(p);
    q.owed += n;
    if (q.owed >= o_.credit_bytes / 4) {
      send_control(p, zmq_kind::credit, 0, q.owed);
      q.owed = 0;
    }
  }

  void on_clear(int p, std::uint64_t id) {
    const auto it = announced_.find({p, id});
    if (it == announced_.end()) return;  // withdrawn meanwhile: the receiver is told
    const std::shared_ptr<zmq_send_op> op = it->second;
    announced_.erase(it);
    send_pieces(p, op);
  }

  void on_refuse(int p, std::uint64_t id, const std::string& text) {
    const auto it = announced_.find({p, id});
    if (it == announced_.end()) return;
    const std::shared_ptr<zmq_send_op> op = it->second;
    announced_.erase(it);
    mark_failed(transport_error(describe(op->c) + ": " + text));
  }

  void on_piece(zmq_incoming& in) {
    const auto it = streaming_in_.find({in.src, in.h.id});
    if (it == streaming_in_.end()) {
      // A streamed message no receive has taken yet keeps its pieces (within the credit window);
      // otherwise its receive was cancelled.
      const auto early = early_pieces_.find({in.src, in.h.id});
      if (early != early_pieces_.end()) early->second.push_back(std::move(in));
      return;
    }
    zmq_recv_op& op = *it->second;
    if (in.h.offset > op.bytes || op.bytes - in.h.offset < in.size()) return;
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
      unexpected_.erase(it);
      owe(p, overhead);
      return;
    }
    const auto it = streaming_in_.find({p, id});
    if (it == streaming_in_.end()) return;
    zmq_recv_op& op = *it->second;
    op.isolated = transport_error(describe(op.c) + ": rank " + std::to_string(p) +
                                  " cancelled the message this receive had matched (its send was withdrawn)");
    streaming_in_.erase(it);
  }

  void on_coll(zmq_incoming in) {
    const std::uint64_t k = in.h.id;
    const bool active = std::any_of(colls_.begin(), colls_.end(), [&](const auto& op) { return op->index == k; });
    if (active || k > collectives_) {
      const int src = in.src;
      inbox(k, src).push_back(std::move(in));
      return;
    }
    // For a collective this rank has completed: only a rank whose arguments differ sends one.
    for (const auto& [index, sig] : done_sigs_) {
      if (index != k) continue;
      const zmq_coll_sig theirs = zmq_coll_sig::of(in.h);
      if (theirs != sig.first)
        mark_failed(transport_error(describe(sig.second) + ": arguments differ across ranks in collective #" +
                                    std::to_string(k) + ": rank " + std::to_string(in.src) + " called " +
                                    theirs.text() + ", rank " + std::to_string(rank_) + " called " +
                                    sig.first.text()));
    }
  }

  void on_coll_fail(std::uint64_t k, int p, const std::string& text) {
    const std::string why = text + " (reported by rank " + std::to_string(p) + ")";
    for (const auto& op : colls_)
      if (op->index == k && !op->finished()) {
        mark_failed(transport_error(describe(op->c) + ": " + why));
        return;
      }
    if (k > collectives_) coll_failed_.emplace(k, why);
  }

  // ---- lost peers and new incarnations ----

  /// p is lost: its socket closes, and what needs it fails (point to point alone; a collective
  /// fails the communicator). What it sent before stays deliverable until it registers again.
  void lose(int p, const std::string& how) {
    zmq_peer& q = peer_at(p);
    if (q.state != zmq_peer_state::alive) return;
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
    for (auto it = announced_.begin(); it != announced_.end();) {
      if (it->first.first != p) {
        ++it;
        continue;
      }
      it->second->isolated = lost_peer_error(it->second->c, {p}, how);
      it = announced_.erase(it);
    }
    for (auto& op : streaming_out_)
      if (op->peer == p && !op->finished()) op->isolated = lost_peer_error(op->c, {p}, how);
    for (auto it = streaming_in_.begin(); it != streaming_in_.end();) {
      if (it->first.first != p) {
        ++it;
        continue;
      }
      it->second->isolated = lost_peer_error(it->second->c, {p}, how);
      it = streaming_in_.erase(it);
    }
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
    // Collectives that need p fail in advance(), once they have taken what p sent before.
  }

  // Whether every rank a receive could match is lost (and nothing of theirs is queued here:
  // a queued message would have matched first).
  bool candidates_lost(const zmq_recv_op& r, std::vector<int>& lost, std::string& how) const {
    if (r.peer != any_source) {
      const zmq_peer& q = peer_at(r.peer);
      if (q.state != zmq_peer_state::lost || (r.inc != 0 && r.inc != q.inc)) return false;
      lost = {r.peer};
      how = q.lost_how;
      return true;
    }
    lost.clear();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (peer_at(p).state != zmq_peer_state::lost) return false;
      lost.push_back(p);
    }
    if (lost.empty()) return false;
    how = peer_at(lost.front()).lost_how;
    for (int p : lost)
      if (peer_at(p).lost_how != how) {
        how.clear();
        for (int q : lost) how += (how.empty() ? "rank " : "; rank ") + std::to_string(q) + ": " + peer_at(q).lost_how;
        break;
      }
    return true;
  }

  /// A process registered in p's slot under incarnation `inc`: it replaces the one before (lost
  /// from now, with everything of its queued here dropped), and receives waiting for the slot's
  /// first process belong to it. `alive` false: rank 0 reported it lost already.
  void adopt(int p, std::uint64_t inc, const std::string& endpoint, bool alive) {
    if (p == rank_ || p < 0 || p >= size_) return;
    zmq_peer& q = peer_at(p);
    if (inc <= q.inc) return;
    if (q.state == zmq_peer_state::alive)
      lose(p, "a new process registered in its rank slot (incarnation " + std::to_string(inc) + ")");
    unexpected_.erase(std::remove_if(unexpected_.begin(), unexpected_.end(),
                                     [&](const zmq_incoming& m) { return m.src == p; }),
                      unexpected_.end());
    for (auto it = early_pieces_.begin(); it != early_pieces_.end();)
      it = it->first.first == p ? early_pieces_.erase(it) : std::next(it);
    q.inc = inc;
    q.endpoint = endpoint;
    q.credit = static_cast<std::int64_t>(o_.credit_bytes);
    q.owed = 0;
    q.next_id = 0;
    q.connected = q.hello_seen = false;
    q.broken_at = q.inbound_closed_at = zclock::time_point{};
    q.broken_how.clear();
    if (!alive) {
      q.state = zmq_peer_state::lost;
      q.lost_how = "rank 0 reported it lost when this rank registered";
      return;
    }
    q.state = zmq_peer_state::alive;
    q.lost_how.clear();
    open_dealer(p);
    if (q.state != zmq_peer_state::alive) return;
    for (auto& r : posted_)
      if (r->peer == p && r->inc == 0) r->inc = inc;
    std::deque<zmq_incoming> early;
    if (q.future_inc == inc) early = std::move(q.future);
    if (q.future_inc <= inc) {
      q.future.clear();
      q.future_inc = 0;
    }
    for (auto& m : early) handle(std::move(m));
    hand_over(p);
    flush(p);
  }

  // ---- the rendezvous ----

  void rdv_send(const std::string& to, const zmq_writer& w) {
    if (rank_ == 0) {
      zmq_message id(to.size());
      std::memcpy(id.data(), to.data(), to.size());
      if (zmq_msg_send(id.get(), rdv_, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) return;
    }
    zmq_message m(w.bytes().size());
    std::memcpy(m.data(), w.bytes().data(), w.bytes().size());
    zmq_msg_send(m.get(), rdv_, ZMQ_DONTWAIT);
    rdv_dirty_ = true;  // a send may take the descriptor's signal of a message that came in
  }

  void drain_rdv() {
    rdv_dirty_ = false;
    for (;;) {
      zmq_message first;
      if (zmq_msg_recv(first.get(), rdv_, ZMQ_DONTWAIT) < 0) return;
      std::string from;
      zmq_message body;
      if (rank_ == 0) {  // ROUTER: the sender's id first
        if (!first.more()) continue;
        from.assign(reinterpret_cast<const char*>(first.data()), first.size());
        if (zmq_msg_recv(body.get(), rdv_, ZMQ_DONTWAIT) < 0) return;
      } else {
        body = std::move(first);
      }
      while (body.more()) {
        zmq_message extra;
        if (zmq_msg_recv(extra.get(), rdv_, ZMQ_DONTWAIT) < 0) break;
        if (!extra.more()) break;
      }
      zmq_reader rd(body.data(), body.size());
      const auto kind = rd.kind();
      if (!kind) continue;
      if (rank_ == 0) {
        if (*kind == zmq_rdv_kind::hello) on_hello(from, rd);
      } else {
        on_rdv(*kind, rd);
      }
    }
  }

  // Rank 0: a process registers in a rank slot. It gets the slot's next incarnation and the
  // table; every other live rank is told.
  void on_hello(const std::string& from, zmq_reader& rd) {
    std::int32_t r = -1, n = -1;
    std::string endpoint;
    if (!rd.get(r) || !rd.get(n) || !rd.get_string(endpoint)) return;
    auto refuse = [&](const std::string& why) {
      zmq_writer w(zmq_rdv_kind::refused);
      w.put_string(why);
      rdv_send(from, w);
    };
    if (n != size_)
      return refuse("rank " + std::to_string(r) + " was constructed with size " + std::to_string(n) +
                    ", rank 0 with size " + std::to_string(size_) +
                    " (arguments differ across ranks in construction)");
    if (r <= 0 || r >= size_)
      return refuse("rank " + std::to_string(r) + " is out of range [1, " + std::to_string(size_) +
                    ") for a registration (rank 0 is the rendezvous itself)");
    zmq_slot& slot = slots_[static_cast<std::size_t>(r)];
    const std::uint64_t inc = ++slot.issued;
    if (!slot.rdv_id.empty() && slot.rdv_id != from) {
      zmq_writer w(zmq_rdv_kind::replaced);
      w.put(inc);
      rdv_send(slot.rdv_id, w);
    }
    slot.rdv_id = from;
    adopt(r, inc, endpoint, true);
    zmq_writer w(zmq_rdv_kind::welcome);
    w.put(inc).put(static_cast<std::int32_t>(size_));
    for (int p = 0; p < size_; ++p) {
      const bool self = p == 0;
      w.put(self ? incarnation_ : peer_at(p).inc);
      w.put(static_cast<std::uint8_t>(self ? zmq_peer_state::alive : peer_at(p).state));
      w.put_string(self ? endpoint_ : peer_at(p).endpoint);
    }
    rdv_send(from, w);
    zmq_writer up(zmq_rdv_kind::update);
    up.put(static_cast<std::int32_t>(r)).put(inc).put_string(endpoint);
    for (int p = 1; p < size_; ++p)
      if (p != r && peer_at(p).state == zmq_peer_state::alive) rdv_send(slots_[static_cast<std::size_t>(p)].rdv_id, up);
  }

  // Ranks other than 0: rank 0's answers and news.
  void on_rdv(zmq_rdv_kind kind, zmq_reader& rd) {
    switch (kind) {
      case zmq_rdv_kind::welcome: {
        if (welcomed_) return;
        std::uint64_t inc = 0;
        std::int32_t n = 0;
        if (!rd.get(inc) || !rd.get(n) || n != size_) return;
        std::vector<std::uint64_t> incs(static_cast<std::size_t>(n));
        std::vector<std::uint8_t> states(static_cast<std::size_t>(n));
        std::vector<std::string> endpoints(static_cast<std::size_t>(n));
        for (std::size_t p = 0; p < incs.size(); ++p)
          if (!rd.get(incs[p]) || !rd.get(states[p]) || !rd.get_string(endpoints[p])) return;
        incarnation_ = inc;
        welcomed_ = true;
        for (int p = 0; p < size_; ++p) {
          const auto i = static_cast<std::size_t>(p);
          if (incs[i] != 0 && static_cast<zmq_peer_state>(states[i]) != zmq_peer_state::absent)
            adopt(p, incs[i], endpoints[i], static_cast<zmq_peer_state>(states[i]) == zmq_peer_state::alive);
        }
        std::deque<zmq_incoming> early = std::move(early_);
        early_.clear();
        for (auto& m : early) arrive(std::move(m));
        return;
      }
      case zmq_rdv_kind::refused: {
        std::string why;
        if (rd.get_string(why)) refused_ = why;
        return;
      }
      case zmq_rdv_kind::update: {
        std::int32_t r = -1;
        std::uint64_t inc = 0;
        std::string endpoint;
        if (welcomed_ && rd.get(r) && rd.get(inc) && rd.get_string(endpoint)) adopt(r, inc, endpoint, true);
        return;
      }
      case zmq_rdv_kind::replaced: {
        std::uint64_t inc = 0;
        if (!rd.get(inc)) return;
        mark_failed(transport_error("cadence::transport[zmq]: rank " + std::to_string(rank_) + " of " +
                                    std::to_string(size_) + ": a newer process registered in this rank slot "
                                    "(incarnation " + std::to_string(inc) + "); this one (incarnation " +
                                    std::to_string(incarnation_) + ") is cut off"));
        return;
      }
      case zmq_rdv_kind::hello: return;
    }
  }

  // ---- advancing, waiting ----

  void advance() {
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !peer_at(p).sends.empty()) hand_over(p);
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
      } else if (op.outstanding() == 0 && op.queued == 0 && peer_at(op.peer).broken_at == zclock::time_point{}) {
        // ZeroMQ has let go of every piece, written (not dropped with a broken connection: then
        // check_lost decides): the buffer is the caller's again.
        op.done = true;
        it = streaming_out_.erase(it);
        continue;
      }
      ++it;
    }
    for (std::size_t i = 0; i < colls_.size() && !latch_.has_failure(); ++i) {
      const std::shared_ptr<zmq_coll_op> op = colls_[i];
      if (!op->finished()) op->advance(*this);
    }
    finish_colls();
    fail_colls_on_lost();
  }

  // A collective that still needs a lost peer (after taking everything it had sent) fails the
  // communicator: collectives need every rank. A peer that left after completing the collective
  // (its goodbye says so) sent everything this rank needs from it before the goodbye, so it is
  // not needed any more: a ring's quick rank may finish and leave while a slower one still
  // receives from its left neighbour.
  void fail_colls_on_lost() {
    for (const auto& op : colls_) {
      if (op->finished() || latch_.has_failure()) continue;
      for (int p = 0; p < size_; ++p) {
        const zmq_peer& q = peer_at(p);
        if (p == rank_ || q.state != zmq_peer_state::lost || !op->needs(p)) continue;
        if (q.bye_inc == q.inc && q.bye_through >= op->index) continue;
        mark_failed(lost_peer_error(op->c, {p}, peer_at(p).lost_how));
        return;
      }
    }
  }

  void finish_colls() {
    for (auto it = colls_.begin(); it != colls_.end();) {
      if (!(*it)->done) {
        ++it;
        continue;
      }
      const auto k = (*it)->index;
      done_sigs_.emplace_back(k, std::make_pair((*it)->sig, (*it)->c));
      if (done_sigs_.size() > 64) done_sigs_.pop_front();
      coll_in_.erase(k);
      it = colls_.erase(it);
    }
  }

  /// Throws what op ended with: its own lost peer, the communicator's failure, abort().
  void check(zmq_op& op) {
    if (op.isolated) {
      settle(op);
      throw *op.isolated;
    }
    if (latch_.has_failure()) {
      withdraw(op);
      settle(op);
      latch_.rethrow();
    }
    if (latch_.aborted()) {
      withdraw(op);
      settle(op);
      std::vector<int> who;
      std::string note;
      if (!op.done) awaited(op, who, note);
      throw failure_latch::aborted_while(op.c, who);
    }
    if (closed_) throw transport_error(describe(op.c) + ": the communicator was destroyed");
  }

  [[noreturn]] void fail(zmq_op& op, transport_error e) {
    mark_failed(std::move(e));
    withdraw(op);
    settle(op);
    latch_.rethrow();
  }

  // Nothing of op stays where the engine could still write into (or read from) the caller's
  // buffer on its own; pieces ZeroMQ holds are settle()'s.
  void withdraw(zmq_op& op) {
    if (op.what == zmq_op::kind::recv) {
      auto& r = static_cast<zmq_recv_op&>(op);
      posted_.erase(std::remove_if(posted_.begin(), posted_.end(), [&](const auto& p) { return p.get() == &op; }),
                    posted_.end());
      if (r.matched && !r.done) streaming_in_.erase({r.from, r.id});
    } else if (op.what == zmq_op::kind::send) {
      auto& s = static_cast<zmq_send_op&>(op);
      auto& sends = peer_at(s.peer).sends;
      sends.erase(std::remove_if(sends.begin(), sends.end(), [&](const auto& p) { return p.get() == &op; }),
                  sends.end());
      if (s.st == zmq_send_op::stage::announced) announced_.erase({s.peer, s.id});
    }
  }

  void awaited(const zmq_op& op, std::vector<int>& who, std::string& note) const {
    switch (op.what) {
      case zmq_op::kind::send: {
        const auto& s = static_cast<const zmq_send_op&>(op);
        who = {s.peer};
        const zmq_peer& q = peer_at(s.peer);
        if (q.state == zmq_peer_state::absent)
          note = "it has not registered at the rendezvous";
        else if (s.queued != 0 && !q.connected)
          note = "the connection to it is not up yet";
        else if (s.st == zmq_send_op::stage::queued)
          note = "it has not taken this rank's earlier messages: the credit window of " +
                 std::to_string(o_.credit_bytes) + " bytes is full";
        else if (s.st == zmq_send_op::stage::announced)
          note = "the matching recv was not posted";
        else
          note = "the message's data has not left: it does not read";
        return;
      }
      case zmq_op::kind::recv: {
        const auto& r = static_cast<const zmq_recv_op&>(op);
        if (r.matched) {
          who = {r.from};
          note = "the message's data did not arrive";
          return;
        }
        who = r.peer == any_source ? others() : std::vector<int>{r.peer};
        if (who.empty()) who = {rank_};
        note = r.peer != any_source && peer_at(r.peer).state == zmq_peer_state::absent
                   ? "it has not registered at the rendezvous"
                   : "no matching message arrived";
        return;
      }
      case zmq_op::kind::allreduce:
      case zmq_op::kind::broadcast:
        static_cast<const zmq_coll_op&>(op).awaited(*this, who, note);
        if (who.empty()) who = others();
        return;
    }
  }

  void wait_released(zmq_op& op, zclock::time_point until) noexcept {
    while (op.outstanding() != 0 && zclock::now() < until) {
      zmq_pollitem_t item{nullptr, wake_fd_, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, std::min(timeout_ms(until), 10)) > 0) drain_wake();
    }
  }

  void wake() noexcept {
    if (wake_fd_ < 0) return;
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
  }
  void drain_wake() noexcept {
    std::uint64_t v = 0;
    [[maybe_unused]] const auto n = ::read(wake_fd_, &v, sizeof v);
  }

  static int timeout_ms(zclock::time_point until) {
    const auto now = zclock::now();
    if (until <= now) return 0;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    return static_cast<int>(std::min<std::int64_t>(left, INT_MAX / 2));
  }

  // ---- shutdown ----

  // A goodbye to every live peer (after everything sent to it before), then the sockets close:
  // live peers' with shutdown_wait to let the last messages leave, the others' at once; the
  // context terminates, which joins ZeroMQ's threads and drops whatever they still held.
  void close_all() noexcept {
    if (closed_) return;
    closed_ = true;
    const auto until = zclock::now() + o_.shutdown_wait;
    for (int p = 0; p < size_; ++p) {
      zmq_peer& q = peer_at(p);
      if (p == rank_ || q.state != zmq_peer_state::alive || q.dealer == nullptr || !welcomed_) continue;
      try {
        zmq_header h = header(zmq_kind::bye, p);
        h.id = completed_through();
        zmq_message m(sizeof h);
        std::memcpy(m.data(), &h, sizeof h);
        q.out.push_back(zmq_outgoing{std::move(m), std::nullopt, q.inc, {}});
      } catch (...) {
      }
    }
    finish_sending(until);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      zmq_peer& q = peer_at(p);
      q.out.clear();
      const bool up = q.state == zmq_peer_state::alive && q.broken_at == zclock::time_point{};
      close_dealer(q, up ? timeout_ms(until) : 0);
    }
    if (router_monitor_ != nullptr && router_ != nullptr) zmq_socket_monitor(router_, nullptr, 0);
    sockets_.close(router_monitor_, 0);
    sockets_.close(router_, 0);
    sockets_.close(rdv_, rank_ == 0 ? timeout_ms(until) : 0);
    sockets_.terminate();
    if (wake_fd_ >= 0) {
      ::close(wake_fd_);
      wake_fd_ = -1;
    }
  }

  // The collectives this rank completed, all of 1..k (one still in progress stops the count).
  std::uint64_t completed_through() const noexcept {
    std::uint64_t k = collectives_;
    for (const auto& op : colls_)
      if (!op->done) k = std::min<std::uint64_t>(k, op->index - 1);
    return k;
  }

  // Before closing: what waits in q.out for a live peer whose connection is not up yet (ZeroMQ
  // would drop it with the socket) goes once the connection is, within `until`; what ZeroMQ
  // holds for a connection that is up leaves within the linger the sockets then close with.
  void finish_sending(zclock::time_point until) noexcept {
    for (;;) {
      flush_all();
      std::vector<zmq_pollitem_t> items;
      std::vector<int> who;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        const zmq_peer& q = peer_at(p);
        if (q.state != zmq_peer_state::alive || q.dealer == nullptr || q.out.empty() ||
            q.broken_at != zclock::time_point{})
          continue;
        items.push_back({q.dealer, 0, ZMQ_POLLOUT, 0});
        if (q.monitor != nullptr) items.push_back({q.monitor, 0, ZMQ_POLLIN, 0});
        who.push_back(p);
      }
      if (who.empty() || zclock::now() >= until) return;
      if (zmq_poll(items.data(), static_cast<int>(items.size()), std::min(timeout_ms(until), 100)) < 0 &&
          errno != EINTR)
        return;
      for (int p : who) drain_monitor(p);
    }
  }

  // ---- state (the map above says who touches what) ----

  const int rank_;
  const int size_;
  const zmq_options o_;
  zmq_sockets sockets_;  // the context and every socket (declared first: closes last)
  int wake_fd_ = -1;
  void* router_ = nullptr;
  void* router_monitor_ = nullptr;
  std::map<int, std::pair<int, std::uint64_t>> inbound_fds_;  // our ROUTER's connection fd -> (rank, incarnation)
  std::set<int> unknown_inbound_;  // connections accepted whose hello has not been read yet
  void* rdv_ = nullptr;
  std::string endpoint_;
  std::string rdv_endpoint_;
  std::uint64_t incarnation_ = 0;
  bool welcomed_ = false;
  bool rdv_dirty_ = false;  // rdv_ must be read to EAGAIN before its descriptor is trusted
  std::optional<std::string> refused_;
  std::deque<zmq_incoming> early_;  // arrived before our welcome
  std::vector<zmq_peer> peers_;
  std::vector<zmq_slot> slots_;  // rank 0
  std::uint64_t monitors_ = 0;
  std::vector<zmq_pollitem_t> items_;
  std::vector<int> poll_peers_;
  std::deque<std::shared_ptr<zmq_recv_op>> posted_;
  std::deque<zmq_incoming> unexpected_;
  std::map<std::pair<int, std::uint64_t>, std::shared_ptr<zmq_send_op>> announced_;
  std::map<std::pair<int, std::uint64_t>, std::shared_ptr<zmq_recv_op>> streaming_in_;
  std::map<std::pair<int, std::uint64_t>, std::deque<zmq_incoming>> early_pieces_;  // of unexpected streams
  std::deque<std::shared_ptr<zmq_send_op>> streaming_out_;
  std::deque<std::shared_ptr<zmq_send_op>> waiting_eager_;  // eager sends whose copy waits for a connection
  std::uint64_t collectives_ = 0;
  std::deque<std::shared_ptr<zmq_coll_op>> colls_;
  std::map<std::uint64_t, std::vector<std::deque<zmq_incoming>>> coll_in_;
  std::map<std::uint64_t, std::string> coll_failed_;
  std::deque<std::pair<std::uint64_t, std::pair<zmq_coll_sig, call_info>>> done_sigs_;
  std::uint64_t calls_ = 0;
  failure_latch latch_;
  bool closed_ = false;
};

}  // namespace cadence::transport::detail
