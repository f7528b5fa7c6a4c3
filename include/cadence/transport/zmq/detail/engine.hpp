// The ZeroMQ backend's engine: one rank's data socket and the progress loop that every call and
// every work handle drives. It joins the backend's parts: the peers (detail/peers.hpp), the
// rendezvous (detail/rendezvous.hpp), point to point (detail/p2p.hpp) and the collectives
// (detail/colls.hpp); it decides what a lost peer or a new incarnation means for each.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/latch.hpp>
#include <cadence/transport/zmq/detail/colls.hpp>
#include <cadence/transport/zmq/detail/ops.hpp>
#include <cadence/transport/zmq/detail/p2p.hpp>
#include <cadence/transport/zmq/detail/peers.hpp>
#include <cadence/transport/zmq/detail/rendezvous.hpp>
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
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport::detail {

class zmq_engine {
public:
  // Map of this class. Everything below is touched by the owning thread only (the thread that
  // constructs the communicator and makes its calls), except:
  //  - latch_'s atomics: abort() and failed() read or set them from any thread; abort() also
  //    writes wake_fd_ (an eventfd) to wake a zmq_poll in progress.
  //  - gate_ (an atomic) says who may touch the sockets: the owning thread inside a call (it
  //    takes the gate in every entry point that may touch them: an owner_scope), abort() on
  //    another thread telling the peers (tell_aborted), or nobody. abort() takes it only while
  //    it is free; otherwise the owning thread tells the peers as it leaves the call it is in.
  //  - wake_fd_ is also written by ZeroMQ's I/O thread, through zc_release, when it lets go of
  //    a piece of a caller's buffer; it is closed only after zmq_ctx_term, after which ZeroMQ
  //    runs no callback.
  // ZeroMQ sockets are not thread-safe: only the owning thread calls into them.
  // State: sockets_ (the context and every socket; declared first, so it closes last); router_
  // (our data endpoint); peers_ (the table and outgoing path); rdv_ (the rendezvous); p2p_
  // (point to point); colls_ (collectives); early_ (messages that came before our welcome);
  // calls_ (each call's number); latch_ (the first failure); closed_.

  zmq_engine(int rank, int size, zmq_options options)
      : rank_(rank), size_(size), o_(std::move(options)), peers_(rank, size, o_, sockets_),
        rdv_(rank, size, o_, sockets_, peers_, latch_), p2p_(o_, peers_), colls_(o_, peers_, latch_) {
    peers_.on_lost = [this](int p, const std::string& how) { lose(p, how); };
    // A peer that breaks the protocol is dropped once the message at hand is done with.
    p2p_.on_bad_peer = [this](int p, const std::string& why) { bad_.emplace_back(p, why); };
    colls_.on_bad_peer = p2p_.on_bad_peer;
    rdv_.adopt = [this](int p, std::uint64_t inc, const std::string& endpoint, bool alive) {
      adopt(p, inc, endpoint, alive);
    };
    rdv_.on_welcome = [this] {
      std::deque<zmq_incoming> early = std::move(early_);
      early_.clear();
      for (auto& m : early) arrive(std::move(m));
    };
  }
  zmq_engine(const zmq_engine&) = delete;
  zmq_engine& operator=(const zmq_engine&) = delete;
  ~zmq_engine() { close_all(); }

  /// Held by the owning thread while an entry point may touch the sockets (see gate_); nests.
  class owner_scope {
  public:
    explicit owner_scope(zmq_engine& e) noexcept : e_(e) { e_.take_gate(); }
    ~owner_scope() { e_.free_gate(); }
    owner_scope(const owner_scope&) = delete;
    owner_scope& operator=(const owner_scope&) = delete;

  private:
    zmq_engine& e_;
  };

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const zmq_options& options() const noexcept { return o_; }
  const std::string& endpoint() const noexcept { return endpoint_; }
  const std::string& rendezvous_endpoint() const noexcept { return rdv_.endpoint(); }
  zmq_peer_state state_of(int p) const noexcept { return peers_.state_of(p); }
  std::uint64_t incarnation_of(int p) const noexcept { return peers_.incarnation_of(p); }

  // ---- calls, failures, abort ----

  call_info begin(const char* op) { return {"zmq", op, ++calls_, rank_, size_, zclock::now()}; }

  /// Contract b: after a failure every call rethrows it; after abort() each call says so.
  void enter(const call_info& c) const {
    latch_.enter(c);
    if (closed_) throw transport_error(describe(c) + ": the communicator was destroyed");
  }

  /// Any thread. Wakes the owning thread's call, and tells every live peer (an aborted
  /// goodbye: it sees this rank lost at once, "it aborted its communicator") and closes the
  /// connections to them, so that no heartbeat keeps this rank alive to them: here when the
  /// owning thread is outside every call, else as that thread leaves its call.
  void abort() noexcept {
    latch_.abort();
    wake();
    // Ordered against free_gate's store and check (both fenced): either this CAS finds the gate
    // free, or the owning thread, freeing it, sees the abort and tells the peers itself.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    int idle = gate_idle;
    if (!gate_.compare_exchange_strong(idle, gate_aborting, std::memory_order_acquire)) return;
    tell_aborted();
    gate_.store(gate_idle, std::memory_order_release);
  }
  bool failed() const noexcept { return latch_.failed(); }

  /// What this rank refused so far: malformed messages, peers dropped for them (or for sending
  /// beyond their allowances), connections the authentication turned away.
  zmq_stats stats() const noexcept {
    zmq_stats s = stats_;
    s.refused_connections = refused_connections();
    return s;
  }

  // ---- construction: sockets and rendezvous ----

  /// Binds, registers with rank 0 (rank 0: opens the rendezvous) and waits for whom
  /// options().wait_for says. Throws; the engine is then destroyed by its owner.
  void start(const call_info& c, const deadline& d) {
    const owner_scope scope(*this);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw transport_error(describe(c) + ": eventfd: " + std::strerror(errno));
    p2p_.set_wake_fd(wake_fd_);
    colls_.set_wake_fd(wake_fd_);
    // The largest legal frame: a header and the most data one message carries (an eager
    // message, a piece, a small all-reduce's contribution), and room for a text or a welcome.
    const std::size_t most = std::max({o_.eager_bytes, o_.chunk_bytes, std::size_t{8} * static_cast<std::size_t>(size_)});
    sockets_.create(c, o_, sizeof(zmq_header) + most + 4096 + 600 * static_cast<std::size_t>(size_));

    router_ = sockets_.open(c, ZMQ_ROUTER);
    zmq_set_int(router_, ZMQ_ROUTER_HANDOVER, 1);
    // The fate of each peer's connection to us: a closed one means everything it sent before
    // is in our ROUTER's queue (see check_lost).
    peers_.watch_router(c, router_);
    zmq_bind_endpoint(c, router_, o_.endpoint, "its endpoint");
    endpoint_ = zmq_last_endpoint(router_);
    rdv_.open(c, endpoint_);

    // Rank 0 answers registrations from here on, in every progress pass.
    // The rendezvous socket's monitor is not polled: a look every 100 ms names a failing
    // handshake when the deadline passes.
    while (!rdv_.welcomed()) {
      if (rdv_.refused()) throw transport_error(describe(c) + ": rank 0 refused the registration: " + *rdv_.refused());
      if (d.passed()) {
        const std::string trouble = rdv_.trouble();
        throw deadline_error(c, {0}, "rank 0 never answered at the rendezvous " + o_.rendezvous +
                                         (trouble.empty() ? std::string() : ": " + trouble));
      }
      progress(std::min(d.time_point(), zclock::now() + std::chrono::milliseconds(100)));
      if (rank_ != 0) rdv_.trouble();
    }
    rdv_.stop_watching();
    if (o_.wait_for == zmq_wait_for::all) {
      for (;;) {
        if (latch_.has_failure()) latch_.rethrow();
        std::vector<int> absent;
        for (int p : peers_.others())
          if (peers_.at(p).state == zmq_peer_state::absent) absent.push_back(p);
        if (absent.empty()) break;
        if (d.passed())
          throw deadline_error(c, absent, std::string(absent.size() == 1 ? "it" : "they") +
                                              " never registered at the rendezvous " + rdv_.endpoint());
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
      for (int p : peers_.others()) {
        const zmq_peer& q = peers_.at(p);
        pending = pending || (q.state == zmq_peer_state::alive && q.dealer != nullptr && !q.connected &&
                              q.broken_at == zclock::time_point{});
      }
      if (!pending || zclock::now() >= connect_until) break;
      progress(connect_until);
    }
  }

  // ---- submitting operations ----

  void submit_send(const std::shared_ptr<zmq_send_op>& op) {
    const owner_scope scope(*this);
    p2p_.submit_send(op);
  }
  void submit_recv(const std::shared_ptr<zmq_recv_op>& op) {
    const owner_scope scope(*this);
    p2p_.submit_recv(op);
  }
  void submit_coll(const std::shared_ptr<zmq_coll_op>& op) {
    const owner_scope scope(*this);
    colls_.submit(op);
  }

  // ---- waiting, testing, cancelling ----

  /// Drives op to completion. With `poll` (try_recv): a deadline that passes before a message
  /// matched returns false and withdraws the receive (a deadline already passed polls once).
  bool wait(zmq_op& op, const deadline& d, bool poll) {
    const owner_scope scope(*this);
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
            p2p_.withdraw(op);
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

  /// Drives op until it completes (true) or `t` comes (false: no failure, and the operation
  /// stays posted, so a later test or wait may complete it). The thread sleeps in zmq_poll
  /// between passes, woken by a message, a peer's fate or abort(); a `t` already passed polls
  /// once. Throws only what wait() would for a real failure (op's lost peer, the communicator's
  /// failure, abort()).
  bool wait_until(zmq_op& op, zclock::time_point t) {
    const owner_scope scope(*this);
    if (op.isolated) return test(op);  // throws, after the pass that answers the rendezvous
    for (bool first = true;; first = false) {
      check(op);
      if (op.done || op.cancelled) return true;
      if (!first && zclock::now() >= t) return false;
      progress(t);
    }
  }

  bool test(zmq_op& op) {
    const owner_scope scope(*this);
    if (op.isolated) {
      // One progress pass even so: a rank whose every peer is lost (a membership quorum of one
      // polling any_source) must still answer registrations at the rendezvous, or a
      // replacement could never join it.
      try {
        progress(zclock::now());
      } catch (const std::exception&) {  // the operation's own error is the one to report
      }
      settle(op);
      op.isolated.rethrow();
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
    const owner_scope scope(*this);
    if (closed_) {
      op.cancelled = true;  // the context has terminated: ZeroMQ holds nothing any more
      return true;
    }
    try {
      if (op.what == zmq_op::kind::send) {
        auto& s = static_cast<zmq_send_op&>(op);
        if (s.st == zmq_send_op::stage::streaming) return false;
        p2p_.cancel_send(s);
        op.cancelled = true;
        return true;
      }
      if (op.what == zmq_op::kind::recv) {
        p2p_.withdraw(op);  // pieces of a large message still on the way are dropped on arrival
        op.cancelled = true;
        return true;
      }
    } catch (...) {
      return false;
    }
    return false;  // a collective: its contribution is made and its peers wait for the rest
  }

  /// For the work handle (engine/work.hpp): test, wait, wait_until and cancel above.
  static constexpr bool work_has_wait_until = true;
  bool work_test(zmq_op& op) { return test(op); }
  void work_wait(zmq_op& op, const deadline& d) { wait(op, d, /*poll=*/false); }
  bool work_wait_until(zmq_op& op, zclock::time_point t) { return wait_until(op, t); }
  bool work_cancel(zmq_op& op) noexcept { return cancel(op); }

  /// Closes everything (see close_all); idempotent. The communicator's destructor calls it.
  void shutdown() noexcept { close_all(); }

  void poll(const call_info& c) {
    const owner_scope scope(*this);
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
    const owner_scope scope(*this);
    peers_.flush_all();
    const auto due = peers_.check_lost(zclock::now());  // may close sockets: before the poll list
    // The sockets we read from are polled by their ZMQ_FD, as plain descriptors: cheaper than
    // zmq_poll's ZMQ_EVENTS round on every socket before and after it sleeps. That is exact
    // because each of them is always read until EAGAIN (which rearms its descriptor) before the
    // next poll, and only the owning thread reads them.
    items_.clear();
    items_.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    items_.push_back({nullptr, zmq_fd_of(router_), ZMQ_POLLIN, 0});
    items_.push_back({nullptr, zmq_fd_of(rdv_.socket()), ZMQ_POLLIN, 0});
    items_.push_back({nullptr, zmq_fd_of(peers_.router_monitor()), ZMQ_POLLIN, 0});
    items_.push_back({nullptr, rdv_.monitor() != nullptr ? zmq_fd_of(rdv_.monitor()) : -1, ZMQ_POLLIN, 0});
    poll_peers_.clear();
    peers_.poll_items(items_, poll_peers_);
    const int rc = rdv_.dirty() ? 0
                                : zmq_poll(items_.data(), static_cast<int>(items_.size()),
                                           timeout_ms(std::min(until, due)));
    if (rc < 0) {
      if (errno == EINTR) return;
      latch_.record(transport_error("cadence::transport[zmq]: rank " + std::to_string(rank_) + " of " +
                                    std::to_string(size_) + ": zmq_poll: " + zmq_reason()));
      return;
    }
    notice_refusals();
    if (rc > 0 || rdv_.dirty()) {
      if (items_[0].revents != 0) drain_wake();
      if (items_[2].revents != 0 || rdv_.dirty()) rdv_.drain();
      // Monitors before the ROUTER: a connection reported closed has its last messages queued.
      for (std::size_t i = 5; i < items_.size(); ++i)
        if (poll_peers_[i - 5] >= 0 && items_[i].revents != 0) peers_.drain_monitor(poll_peers_[i - 5]);
      if (items_[3].revents != 0) peers_.drain_router_monitor();
      if (items_[4].revents != 0) rdv_.drain_monitor();
      if (items_[1].revents != 0) drain_router();
    }
    peers_.check_lost(zclock::now());
    peers_.flush_all();
    p2p_.advance();
    colls_.advance();
  }

  /// Waits (on the event fd only: nothing else progresses) until ZeroMQ has let go of op's
  /// pieces of the caller's buffer; when they are stuck (a peer that does not read), closes the
  /// sockets they wait in, which makes ZeroMQ drop them. Before any error reaches the caller.
  void settle(zmq_op& op) noexcept {
    if (op.outstanding() == 0 || closed_) return;
    const owner_scope scope(*this);
    wait_released(op, zclock::now() + std::chrono::milliseconds(200));
    if (op.outstanding() == 0) return;
    for (int p : op.rel_peers) {
      zmq_peer& q = peers_.at(p);
      q.out.clear();
      peers_.close_dealer(q, 0);
    }
    wait_released(op, zclock::now() + std::chrono::seconds(30));
  }

private:
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
      const std::size_t second_len = second ? second->size() : 0;
      const zmq_parsed parsed =
          zmq_parse(id.data(), id.size(), first.data(), first.size(), second ? &second_len : nullptr, rank_, size_);
      if (!parsed.why.empty()) {
        malformed(parsed);
        continue;
      }
      zmq_incoming in;
      in.src = parsed.src;
      in.inc = parsed.inc;
      in.h = parsed.h;
      if (static_cast<zmq_kind>(in.h.kind) == zmq_kind::hello) {
        // Which of our ROUTER's connections is this peer's (ZeroMQ's "__fd" metadata).
        if (const char* fd = zmq_msg_gets(first.get(), "__fd")) peers_.note_hello(std::atoi(fd), in.src, in.inc);
      }
      if (second) {
        in.frame = std::move(*second);
        in.at = 0;
      } else {
        in.frame = std::move(first);
        in.at = sizeof(zmq_header);
      }
      arrive(std::move(in));
    }
  }

  // ---- peers that break the protocol ----

  // A message that fails its own checks: counted; its sender, when it names the live process
  // of a slot, is dropped (what it sent before stays deliverable, as for any lost peer).
  void malformed(const zmq_parsed& m) {
    ++stats_.malformed;
    if (m.src >= 0 && m.src < size_ && m.src != rank_) {
      const zmq_peer& q = peers_.at(m.src);
      if (q.state == zmq_peer_state::alive && q.inc == m.inc) {
        drop(m.src, m.why);
        return;
      }
    }
    report("dropped a malformed message: " + m.why);
  }

  void drop(int p, const std::string& why) {
    if (peers_.at(p).state != zmq_peer_state::alive) return;
    ++stats_.dropped_peers;
    report("dropped rank " + std::to_string(p) + ": it sent " + why);
    lose(p, "it sent " + why + " (dropped for breaking the protocol)");
  }

  // What the handling of one message found wrong with its sender.
  void drop_bad() {
    while (!bad_.empty()) {
      const auto [p, why] = bad_.front();
      bad_.pop_front();
      drop(p, why);
    }
  }

  // Connections whose handshake failed at the ROUTER or (rank 0) the rendezvous: the count
  // and a line for on_event, once per new batch.
  std::size_t refused_connections() const noexcept { return peers_.refused() + rdv_.refused_connections(); }
  void notice_refusals() {
    const std::size_t refused = refused_connections();
    if (refused == reported_refusals_) return;
    const std::size_t fresh = refused - reported_refusals_;
    reported_refusals_ = refused;
    report("refused " + std::to_string(fresh) + " connection" + (fresh == 1 ? "" : "s") +
           " that did not prove the job secret (their handshake failed: another secret, another security mode, "
           "or not ZeroMQ)");
  }


  void report(const std::string& line) {
    if (!o_.on_event) return;
    try {
      o_.on_event("cadence::transport[zmq]: rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
                  line);
    } catch (...) {
    }
  }

  void arrive(zmq_incoming in) {
    if (in.src < 0 || in.src >= size_ || in.src == rank_ || in.h.dst != rank_) return;
    if (!rdv_.welcomed()) {  // a peer told of us before our own welcome arrived
      early_.push_back(std::move(in));
      return;
    }
    if (in.h.dst_incarnation != peers_.incarnation()) return;  // for another process in this slot
    zmq_peer& q = peers_.at(in.src);
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
    drop_bad();
  }

  void handle(zmq_incoming in) {
    switch (static_cast<zmq_kind>(in.h.kind)) {
      case zmq_kind::eager:
      case zmq_kind::announce:
      case zmq_kind::stream: p2p_.on_message(std::move(in)); return;
      case zmq_kind::clear: p2p_.on_clear(in.src, in.h.id); return;
      case zmq_kind::refuse: p2p_.on_refuse(in.src, in.h.id, text_of(in)); return;
      case zmq_kind::piece: p2p_.on_piece(in); return;
      case zmq_kind::credit: p2p_.on_credit(in.src, in.h.offset); return;
      case zmq_kind::coll: colls_.on_coll(std::move(in)); return;
      case zmq_kind::coll_fail: colls_.on_coll_fail(in.h.id, in.src, text_of(in)); return;
      case zmq_kind::bye: {
        // It completed collectives 1..id: everything it sent for them came before this bye.
        zmq_peer& q = peers_.at(in.src);
        q.bye_through = in.h.id;
        q.bye_inc = q.inc;
        lose(in.src, in.h.offset == zmq_bye_aborted ? "it aborted its communicator"
                                                    : "it left: its communicator was destroyed");
        return;
      }
      case zmq_kind::withdraw: p2p_.on_withdraw(in.src, in.h.id); return;
      case zmq_kind::hello: peers_.at(in.src).hello_seen = true; return;
    }
  }

  static std::string text_of(zmq_incoming& in) {
    return std::string(reinterpret_cast<const char*>(in.data()), in.size());
  }

  // ---- lost peers and new incarnations ----

  /// p is lost: its socket closes, and what needs it fails (point to point alone; a collective
  /// fails the communicator, in the collectives' next pass, once they have taken what p sent
  /// before). What it sent before stays deliverable until it registers again.
  void lose(int p, const std::string& how) {
    if (!peers_.mark_lost(p, how)) return;
    p2p_.peer_lost(p, how);
  }

  /// A process registered in p's slot under incarnation `inc`: it replaces the one before (lost
  /// from now, with everything of its queued here dropped), and receives waiting for the slot's
  /// first process belong to it. `alive` false: rank 0 reported it lost already.
  void adopt(int p, std::uint64_t inc, const std::string& endpoint, bool alive) {
    if (p == rank_ || p < 0 || p >= size_) return;
    zmq_peer& q = peers_.at(p);
    if (inc <= q.inc) return;
    if (q.state == zmq_peer_state::alive)
      lose(p, "a new process registered in its rank slot (incarnation " + std::to_string(inc) + ")");
    p2p_.forget_peer(p);
    peers_.reset(p, inc, endpoint);
    if (!alive) {
      q.state = zmq_peer_state::lost;
      q.lost_how = "rank 0 reported it lost when this rank registered";
      return;
    }
    q.state = zmq_peer_state::alive;
    q.lost_how.clear();
    peers_.open_dealer(p);
    if (q.state != zmq_peer_state::alive) return;
    p2p_.bind_receives(p, inc);
    std::deque<zmq_incoming> early;
    if (q.future_inc == inc) early = std::move(q.future);
    if (q.future_inc <= inc) {
      q.future.clear();
      q.future_inc = 0;
    }
    for (auto& m : early) handle(std::move(m));
    drop_bad();
    p2p_.hand_over(p);
    peers_.flush(p);
  }

  // ---- checking and failing an operation ----

  /// Throws what op ended with: its own lost peer, the communicator's failure, abort().
  void check(zmq_op& op) {
    if (op.isolated) {
      settle(op);
      op.isolated.rethrow();
    }
    if (latch_.has_failure()) {
      p2p_.withdraw(op);
      settle(op);
      latch_.rethrow();
    }
    if (latch_.aborted()) {
      p2p_.withdraw(op);
      settle(op);
      std::vector<int> who;
      std::string note;
      if (!op.done) awaited(op, who, note);
      throw failure_latch::aborted_while(op.c, who);
    }
    if (closed_) throw transport_error(describe(op.c) + ": the communicator was destroyed");
  }

  [[noreturn]] void fail(zmq_op& op, transport_error e) {
    latch_.record(std::move(e));
    p2p_.withdraw(op);
    settle(op);
    latch_.rethrow();
  }

  void awaited(const zmq_op& op, std::vector<int>& who, std::string& note) const {
    switch (op.what) {
      case zmq_op::kind::send: p2p_.awaited_send(static_cast<const zmq_send_op&>(op), who, note); return;
      case zmq_op::kind::recv: p2p_.awaited_recv(static_cast<const zmq_recv_op&>(op), who, note); return;
      case zmq_op::kind::allreduce:
      case zmq_op::kind::broadcast:
        static_cast<const zmq_coll_op&>(op).awaited(colls_, who, note);
        if (who.empty()) who = peers_.others();
        return;
    }
  }

  // ---- waking ----

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

  // ---- the gate, and what abort() tells the peers ----

  static constexpr int gate_idle = 0;      // nobody touches the sockets
  static constexpr int gate_owner = 1;     // the owning thread, inside a call
  static constexpr int gate_aborting = 2;  // abort() on another thread, telling the peers

  void take_gate() noexcept {
    if (owner_depth_++ > 0) return;
    // Waits only while abort() tells the peers: a few non-blocking sends and closes.
    for (int idle = gate_idle; !gate_.compare_exchange_weak(idle, gate_owner, std::memory_order_acquire);
         idle = gate_idle)
      std::this_thread::yield();
  }
  void free_gate() noexcept {
    if (--owner_depth_ > 0) return;
    if (latch_.aborted()) tell_aborted();  // abort() came while this thread held the gate
    gate_.store(gate_idle, std::memory_order_release);
    // An abort() between the check above and the store found the gate held and left the
    // telling to this thread: take the gate back and tell (tell_aborted runs once).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (latch_.aborted()) {
      int idle = gate_idle;
      if (gate_.compare_exchange_strong(idle, gate_aborting, std::memory_order_acquire)) {
        tell_aborted();
        gate_.store(gate_idle, std::memory_order_release);
      }
    }
  }

  // Once, by whoever holds the gate after abort(): an aborted goodbye to every live peer (its
  // collectives completed, as the destructor's goodbye says; it then sees this rank lost at
  // once, and its operations with this rank fail naming it), each sent without waiting; then
  // the DEALERs close (what ZeroMQ took leaves within shutdown_wait) and so does the ROUTER,
  // so that no connection answers heartbeats for this rank any more: a peer the goodbye did not
  // reach (its connection was not up) finds the connections closed instead. Rank 0's
  // rendezvous stays open until destruction (it answers nobody meanwhile).
  void tell_aborted() noexcept {
    if (told_aborted_ || closed_) return;
    told_aborted_ = true;
    for (int p : peers_.others()) {
      zmq_peer& q = peers_.at(p);
      if (q.dealer == nullptr) continue;
      if (q.state == zmq_peer_state::alive && q.connected && q.broken_at == zclock::time_point{} && rdv_.welcomed()) {
        zmq_header h = peers_.header(zmq_kind::bye, p);
        h.id = colls_.completed_through();
        h.offset = zmq_bye_aborted;
        h.dst_incarnation = q.inc;
        try {
          zmq_message m(sizeof h);
          std::memcpy(m.data(), &h, sizeof h);
          while (zmq_msg_send(m.get(), q.dealer, ZMQ_DONTWAIT) < 0 && errno == EINTR) {
          }
        } catch (...) {  // no memory for a 64-byte message: the closed connection tells it
        }
      }
      peers_.close_dealer(q, static_cast<int>(std::min<std::int64_t>(o_.shutdown_wait.count(), INT_MAX)));
    }
    peers_.close_router_monitor(router_);
    sockets_.close(router_, 0);
  }

  // ---- shutdown ----

  // A goodbye to every live peer (after everything sent to it before), then the sockets close:
  // live peers' with shutdown_wait to let the last messages leave, the others' at once; the
  // context terminates, which joins ZeroMQ's threads and drops whatever they still held.
  void close_all() noexcept {
    if (closed_) return;
    const owner_scope scope(*this);
    closed_ = true;
    const auto until = zclock::now() + o_.shutdown_wait;
    for (int p : peers_.others()) {
      zmq_peer& q = peers_.at(p);
      if (q.state != zmq_peer_state::alive || q.dealer == nullptr || !rdv_.welcomed()) continue;
      try {
        zmq_header h = peers_.header(zmq_kind::bye, p);
        h.id = colls_.completed_through();
        if (latch_.aborted()) h.offset = zmq_bye_aborted;  // aborted before its goodbye went out
        zmq_message m(sizeof h);
        std::memcpy(m.data(), &h, sizeof h);
        q.out.push_back(zmq_outgoing{std::move(m), std::nullopt, q.inc, {}});
      } catch (...) {
      }
    }
    finish_sending(until);
    for (int p : peers_.others()) {
      zmq_peer& q = peers_.at(p);
      q.out.clear();
      const bool up = q.state == zmq_peer_state::alive && q.broken_at == zclock::time_point{};
      peers_.close_dealer(q, up ? timeout_ms(until) : 0);
    }
    peers_.close_router_monitor(router_);
    sockets_.close(router_, 0);
    rdv_.close(rank_ == 0 ? timeout_ms(until) : 0);
    sockets_.terminate();
    if (wake_fd_ >= 0) {
      ::close(wake_fd_);
      wake_fd_ = -1;
    }
  }

  // Before closing: what waits in q.out for a live peer whose connection is not up yet (ZeroMQ
  // would drop it with the socket) goes once the connection is, within `until`; what ZeroMQ
  // holds for a connection that is up leaves within the linger the sockets then close with.
  void finish_sending(zclock::time_point until) noexcept {
    for (;;) {
      peers_.flush_all();
      std::vector<zmq_pollitem_t> items;
      std::vector<int> who;
      for (int p : peers_.others()) {
        const zmq_peer& q = peers_.at(p);
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
      for (int p : who) peers_.drain_monitor(p);
    }
  }

  // ---- state (the map above says who touches what) ----

  const int rank_;
  const int size_;
  const zmq_options o_;
  zmq_sockets sockets_;  // the context and every socket (declared first: closes last)
  failure_latch latch_;
  zmq_peer_table peers_;
  zmq_rendezvous rdv_;
  zmq_p2p p2p_;
  zmq_colls colls_;
  int wake_fd_ = -1;
  void* router_ = nullptr;
  std::string endpoint_;
  std::deque<zmq_incoming> early_;  // arrived before our welcome
  std::vector<zmq_pollitem_t> items_;
  std::vector<int> poll_peers_;
  std::deque<std::pair<int, std::string>> bad_;  // peers found breaking the protocol, to drop
  zmq_stats stats_;
  std::size_t reported_refusals_ = 0;
  std::uint64_t calls_ = 0;
  bool closed_ = false;
  std::atomic<int> gate_{gate_idle};  // who may touch the sockets (the map above)
  int owner_depth_ = 0;               // the owning thread's nested owner_scopes
  bool told_aborted_ = false;         // tell_aborted ran (by whoever held the gate)
};

}  // namespace cadence::transport::detail
