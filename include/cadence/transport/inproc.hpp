// The in-process backend: n ranks as threads of one process sharing a world, with the network
// backends' matching and failure semantics plus fault injection (stall, kill, delay a link, a
// fault at a chosen protocol step), so adapters are tested deterministically, without a
// cluster, and under ThreadSanitizer.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence::transport {

struct inproc_options {
  /// send() of up to this many bytes copies the message and returns at once (MPI's eager
  /// protocol); a larger one waits until the matching recv() has taken it (rendezvous), as MPI
  /// and gloo do for large messages. So a protocol that only works with buffered sends fails
  /// here, on its deadline, instead of hanging later on a cluster.
  std::size_t eager_limit = 64 * 1024;
};

class inproc_world;

/// A protocol step of one rank, where inproc_world::on_step injects a fault: the rank's next
/// call of `op` ("send", "recv", "try_recv", "allreduce", "allreduce_average", "broadcast";
/// empty: any call; the asynchronous forms count as their blocking names) with this peer (send: destination, recv:
/// source as passed, broadcast: root; unset: any) and tag (unset: any), after `skip` such calls
/// have gone by.
struct inproc_step {
  std::string op;
  std::optional<int> peer;
  std::optional<int> tag;
  int skip = 0;
};

// ---- shared state ----

namespace detail {

using inproc_clock = deadline::clock;

struct inproc_trap {
  int rank = 0;
  inproc_step at;
  std::function<void(inproc_world&)> action;
};

struct inproc_message {
  int src = 0;
  int tag = 0;
  std::size_t bytes = 0;
  std::vector<unsigned char> eager;  // the copy, for an eager message
  const void* rendezvous = nullptr;  // the sender's buffer, for a rendezvous message
  inproc_clock::time_point visible_at;  // later than the send when the link is delayed
  bool taken = false;                // a rendezvous sender waits for this
  std::string size_mismatch;         // set by the receiver; the rendezvous sender throws it too
  std::string discarded;             // its receiver's process was replaced before taking it
};

// A receive posted and not matched yet. Receives of one rank match messages in the order they
// were posted (what MPI guarantees), whichever handle is tested first.
struct inproc_recv {
  void* buf = nullptr;
  std::size_t bytes = 0;
  int src = 0;
  int tag = 0;
  bool matched = false;
  int from = -1;
  std::string size_mismatch;
};

// One collective, found by its index: the n-th collective of every rank meets in slot n.
struct inproc_slot {
  std::string signature;  // the first arriver's arguments; everyone else must match them
  int first_rank = -1;
  std::vector<unsigned char> data;  // all-reduce accumulator, or the root's broadcast payload
  std::vector<char> arrived;
  std::vector<inproc_clock::time_point> arrived_at;
  int departures = 0;
  std::string mismatch;  // nonempty once two ranks' arguments disagreed
};

struct inproc_op;

struct inproc_rank {
  int incarnation = 0;  // bumped by inproc_world::restart: the old process's calls fail
  bool joined = false;
  bool stalled = false;
  std::string lost;  // why the rank is gone (killed, communicator destroyed); empty: alive
  std::optional<transport_error> failure;  // the first failure of its communicator
  bool aborted = false;
  std::deque<std::shared_ptr<inproc_message>> mailbox;  // messages to this rank, in send order
  std::deque<std::shared_ptr<inproc_recv>> posted;      // its receives not matched yet, in order
  std::deque<std::shared_ptr<inproc_op>> unentered;     // ops started while it was stalled
};

// Everything the ranks share, under one mutex: the ranks are few and the copies are memcpy,
// so contention is not what these tests measure; one lock keeps every invariant easy to see.
struct inproc_state {
  inproc_state(int n, inproc_options o)
      : size(n), options(o), ranks(static_cast<std::size_t>(n)),
        delay(static_cast<std::size_t>(n) * static_cast<std::size_t>(n),
              inproc_clock::duration::zero()) {}

  std::mutex mutex;
  std::condition_variable changed;  // any arrival, message, fault or abort: waiters re-check
  const int size;
  const inproc_options options;
  std::vector<inproc_rank> ranks;
  std::map<std::uint64_t, inproc_slot> slots;
  std::vector<unsigned char> spare;  // a finished slot's storage, for the next one
  std::vector<inproc_clock::duration> delay;  // [src * size + dst]
  std::vector<inproc_trap> traps;             // on_step faults not fired yet

  inproc_rank& at(int r) { return ranks[static_cast<std::size_t>(r)]; }
  inproc_clock::duration link_delay(int src, int dst) const {
    return delay[static_cast<std::size_t>(src) * static_cast<std::size_t>(size) +
                 static_cast<std::size_t>(dst)];
  }
};

// ---- one operation ----

// One started operation of one rank, blocking or not. It enters (takes part: a message
// queued, a receive posted, a contribution made) at its start, or, while its rank is
// stalled, at the first progress after resume(); progress() then finishes it when it can.
struct inproc_op {
  enum class kind : unsigned char { send, recv, allreduce, broadcast };
  kind what = kind::send;
  call_info c{};
  std::shared_ptr<inproc_state> state;
  int rank = 0;
  int incarnation = 0;
  bool entered = false;
  bool done = false;
  bool cancelled = false;
  std::optional<transport_error> error;  // a point-to-point op that lost its peer (alone)
  // send
  const void* cbuf = nullptr;
  int peer = -1;  // send: destination; recv: source as passed; broadcast: root
  int tag = 0;
  std::shared_ptr<inproc_message> msg;
  // recv
  std::shared_ptr<inproc_recv> posted;
  // collectives
  void* buf = nullptr;
  std::size_t bytes = 0;
  std::size_t count = 0;
  dtype type = dtype::u8;
  reduce_op op = reduce_op::sum;
  bool average = false;  // allreduce_average: the sum divided by the world's size at copy-out
  std::uint64_t k = 0;
  std::string signature;

  inproc_rank& self() const { return state->at(rank); }

  // After a failure every call rethrows the original error; after abort() (with no failure
  // before it) every call says it was aborted, naming itself.
  void throw_if_failed() const {
    const auto& me = self();
    if (me.failure) throw *me.failure;
    if (me.aborted) throw transport_error(describe(c) + ": the communicator was aborted (abort())");
  }

  // The first failure sticks: later calls rethrow it (contract b).
  [[noreturn]] void fail(transport_error e) const {
    auto& me = self();
    if (!me.failure) me.failure = std::move(e);
    state->changed.notify_all();
    throw *me.failure;
  }

  // Takes part. Called with the lock held, in start order (enter_pending keeps it).
  void enter() {
    entered = true;
    switch (what) {
      case kind::send: {
        if (!state->at(peer).lost.empty()) return;  // progress reports it
        msg = std::make_shared<inproc_message>();
        msg->src = rank;
        msg->tag = tag;
        msg->bytes = bytes;
        msg->visible_at = inproc_clock::now() + state->link_delay(rank, peer);
        if (bytes <= state->options.eager_limit) {
          const auto* p = static_cast<const unsigned char*>(cbuf);
          msg->eager.assign(p, p + bytes);
          done = true;  // buffered: complete at once, as MPI's eager sends
        } else {
          msg->rendezvous = cbuf;
        }
        state->at(peer).mailbox.push_back(msg);
        break;
      }
      case kind::recv:
        posted = std::make_shared<inproc_recv>();
        posted->buf = buf;
        posted->bytes = bytes;
        posted->src = peer;
        posted->tag = tag;
        self().posted.push_back(posted);
        break;
      case kind::allreduce:
      case kind::broadcast: arrive(); break;
    }
    state->changed.notify_all();
  }

  // A collective's contribution to slot k; arguments that differ from the first arriver's fail
  // it for everyone in it.
  void arrive() {
    inproc_slot& s = state->slots[k];
    const bool first = s.first_rank < 0;
    if (first) {
      s.data = std::move(state->spare);
      s.data.clear();
      s.signature = signature;
      s.first_rank = rank;
      s.arrived.assign(static_cast<std::size_t>(state->size), 0);
      s.arrived_at.resize(static_cast<std::size_t>(state->size));
    } else if (s.mismatch.empty() && signature != s.signature) {
      s.mismatch = "arguments differ across ranks in collective #" + std::to_string(k + 1) +
                   ": rank " + std::to_string(s.first_rank) + " called " + s.signature +
                   ", rank " + std::to_string(rank) + " called " + signature;
    }
    if (s.mismatch.empty()) {
      if (what == kind::allreduce) {
        if (first)
          s.data.assign(static_cast<const unsigned char*>(buf), static_cast<const unsigned char*>(buf) + bytes);
        else if (bytes != 0)
          reduce_into(s.data.data(), buf, count, type, op);
      } else if (rank == peer) {
        s.data.assign(static_cast<const unsigned char*>(buf), static_cast<const unsigned char*>(buf) + bytes);
      }
    }
    s.arrived[static_cast<std::size_t>(rank)] = 1;
    s.arrived_at[static_cast<std::size_t>(rank)] = inproc_clock::now();
  }

  void depart() {
    auto it = state->slots.find(k);
    if (it == state->slots.end() || ++it->second.departures != state->size) return;
    // The next collective reuses the storage: a fresh 64 MiB accumulator per call costs its
    // page faults every time.
    if (it->second.data.capacity() > state->spare.capacity()) state->spare = std::move(it->second.data);
    state->slots.erase(it);
  }

  // Enters, in start order, the ops this rank started while stalled, once it is not.
  void enter_pending() {
    auto& me = self();
    while (!me.stalled && !me.unentered.empty()) {
      auto next = std::move(me.unentered.front());
      me.unentered.pop_front();
      if (!next->cancelled) next->enter();
    }
  }

  // Matches this rank's posted receives, in post order, against its mailbox: the oldest
  // visible matching message wins; a message still on a delayed link blocks later ones from the
  // same source but not other sources' (any_source).
  void match_posted(inproc_clock::time_point now) {
    auto& me = self();
    for (auto pit = me.posted.begin(); pit != me.posted.end();) {
      inproc_recv& r = **pit;
      std::vector<int> in_flight;
      bool took = false;
      for (auto it = me.mailbox.begin(); it != me.mailbox.end(); ++it) {
        inproc_message& m = **it;
        if (m.tag != r.tag || (r.src != any_source && m.src != r.src)) continue;
        if (std::find(in_flight.begin(), in_flight.end(), m.src) != in_flight.end()) continue;
        if (m.visible_at > now) {
          in_flight.push_back(m.src);
          continue;
        }
        m.taken = true;
        r.matched = true;
        r.from = m.src;
        if (m.bytes != r.bytes) {
          m.size_mismatch = r.size_mismatch =
              "rank " + std::to_string(m.src) + " sent " + std::to_string(m.bytes) +
              " bytes with tag " + std::to_string(r.tag) + " but rank " + std::to_string(rank) +
              " received into " + std::to_string(r.bytes) + " bytes";
        } else if (r.bytes != 0) {
          std::memcpy(r.buf, m.rendezvous != nullptr ? m.rendezvous : m.eager.data(), r.bytes);
        }
        me.mailbox.erase(it);
        took = true;
        break;
      }
      if (took) {
        state->changed.notify_all();  // a rendezvous sender waits for `taken`
        pit = me.posted.erase(pit);
      } else {
        ++pit;
      }
    }
  }

  // One step: true when done. Otherwise fills whom it waits for, which of them are lost, and
  // the earliest time something could change without a notification (a delayed link). Throws
  // what the op fails with (the communicator failed where the contract says so).
  bool progress(inproc_clock::time_point now, inproc_clock::time_point& wake, std::vector<int>& waiting,
                std::vector<int>& lost, std::string& note) {
    if (self().incarnation != incarnation)  // restarted: this is the old process
      throw transport_error(describe(c) + ": this rank is gone (a new process took its slot)");
    throw_if_failed();
    auto& me = self();
    if (!me.lost.empty()) fail(transport_error(describe(c) + ": this rank is gone (" + me.lost + ")"));
    enter_pending();
    if (!entered) {
      note = "stalled";
      return false;
    }
    switch (what) {
      case kind::send: {
        if (!msg) {  // its destination was lost before it entered
          lost.push_back(peer);
          return false;
        }
        if (!msg->size_mismatch.empty()) fail(transport_error(describe(c) + ": " + msg->size_mismatch));
        if (done || msg->taken) return done = true;
        if (!msg->discarded.empty()) {
          error = lost_peer_error(c, {peer}, msg->discarded);  // isolates_lost_peer
          cancelled = true;
          throw *error;
        }
        waiting.push_back(peer);
        if (!state->at(peer).lost.empty()) lost.push_back(peer);
        note = "a message over the eager limit waits for the matching recv";
        return false;
      }
      case kind::recv: {
        match_posted(now);
        if (posted->matched) {
          if (!posted->size_mismatch.empty())
            fail(transport_error(describe(c) + ": " + posted->size_mismatch));
          return done = true;
        }
        // Nothing yet: whom we wait for, whether they can still send, what is in flight.
        bool in_flight = false;
        for (const auto& m : me.mailbox)
          if (m->tag == tag && (peer == any_source || m->src == peer) && m->visible_at > now) {
            in_flight = true;
            wake = std::min(wake, m->visible_at);
          }
        for (int p = 0; p < state->size; ++p) {
          if ((peer != any_source && p != peer) || (peer == any_source && p == rank)) continue;
          waiting.push_back(p);
        }
        if (waiting.empty()) waiting.push_back(rank);  // any_source on a world of one
        bool all_lost = !in_flight;
        for (int p : waiting) all_lost = all_lost && !state->at(p).lost.empty();
        if (all_lost) lost = waiting;
        if (in_flight) note = "a matching message is on a link delayed by fault injection";
        return false;
      }
      case kind::allreduce:
      case kind::broadcast: {
        inproc_slot& s = state->slots[k];
        if (!s.mismatch.empty()) fail(transport_error(describe(c) + ": " + s.mismatch));
        // Done when every contribution it needs (a broadcast: the root's only, as MPI_Bcast's
        // receivers; the root waits for nobody) is in and has crossed its link.
        for (int p = 0; p < state->size; ++p) {
          if (p == rank || (what == kind::broadcast && (rank == peer || p != peer))) continue;
          if (!s.arrived[static_cast<std::size_t>(p)]) {
            waiting.push_back(p);
            if (!state->at(p).lost.empty()) lost.push_back(p);
          } else if (const auto t = s.arrived_at[static_cast<std::size_t>(p)] + state->link_delay(p, rank);
                     t > now) {
            waiting.push_back(p);
            wake = std::min(wake, t);
            note = what == kind::allreduce ? "their contributions are on a link delayed by fault injection"
                                           : "its payload is on a link delayed by fault injection";
          }
        }
        if (!waiting.empty()) return false;
        if (average)
          divide_into(buf, s.data.data(), count, type, static_cast<double>(state->size));
        else if (bytes != 0 && (what == kind::allreduce || rank != peer))
          std::memcpy(buf, s.data.data(), bytes);
        depart();
        return done = true;
      }
    }
    return false;
  }

  // What a wait that cannot complete throws: a lost peer (alone, for point to point: the
  // other ranks stay reachable), else nothing.
  void throw_lost(const std::vector<int>& lost) {
    if (lost.empty()) return;
    // One reason when they share it, else each rank's own.
    std::string how = state->at(lost.front()).lost;
    for (int p : lost) {
      if (state->at(p).lost == state->at(lost.front()).lost) continue;
      how.clear();
      for (int q : lost) how += (how.empty() ? "rank " : "; rank ") + std::to_string(q) + ": " + state->at(q).lost;
      break;
    }
    if (what == kind::send || what == kind::recv) {
      withdraw();
      error = lost_peer_error(c, lost, how);  // isolates_lost_peer: the communicator goes on
      throw *error;
    }
    fail(lost_peer_error(c, lost, how));
  }

  // The one wait loop: until done, a lost peer, or the deadline. With `poll` (try_recv) a
  // deadline that passes first returns false and withdraws the receive.
  bool wait(std::unique_lock<std::mutex>& lock, const deadline& d, bool poll) {
    for (;;) {
      const auto now = inproc_clock::now();
      auto wake = d.time_point();
      std::vector<int> waiting, lost;
      std::string note;
      if (done || progress(now, wake, waiting, lost, note)) return true;
      throw_lost(lost);
      if (d.passed(now)) {
        if (poll) {
          withdraw();
          return false;
        }
        if (!entered) {
          withdraw();  // it never took part: out of the queue (which would keep the state alive)
          fail(transport_error(describe(c) + ": this rank is stalled by fault injection "
                                             "(inproc_world::stall) and its deadline passed " +
                               seconds_since(c.started) + " after the call"));
        }
        fail(deadline_error(c, waiting, note));
      }
      state->changed.wait_until(lock, wake);
    }
  }

  // Nothing of this op stays where another rank could act on it. Always possible in one
  // process: a queued rendezvous message leaves the mailbox, a posted receive leaves the list;
  // a contribution already made stays (the others may complete without this rank's result).
  void withdraw() {
    if (done || cancelled) return;
    cancelled = true;
    auto& me = self();
    if (!entered) {
      // Still in `unentered`: taken out, since the queue holds the op and the op holds the
      // shared state (a cycle that would outlive the world).
      auto& q = me.unentered;
      q.erase(std::remove_if(q.begin(), q.end(), [this](const std::shared_ptr<inproc_op>& p) { return p.get() == this; }),
              q.end());
      return;
    }
    if (what == kind::send && msg && !msg->taken) {
      auto& box = state->at(peer).mailbox;
      box.erase(std::remove(box.begin(), box.end(), msg), box.end());
    }
    if (what == kind::recv && posted && !posted->matched)
      me.posted.erase(std::remove(me.posted.begin(), me.posted.end(), posted), me.posted.end());
    // A collective's contribution stays (the others complete with it); this rank no longer
    // reads the slot, so it departs, and the slot goes once every rank has.
    if (what == kind::allreduce || what == kind::broadcast) depart();
  }
};

}  // namespace detail

// ---- the work handle ----

/// A started in-process operation (iallreduce, ibroadcast, isend, irecv): models the work
/// handle of communicator.hpp. cancel() always succeeds here: nothing touches the buffer after
/// it, though a collective's contribution, once made, still counts for the other ranks.
class inproc_work {
public:
  inproc_work() = default;
  inproc_work(inproc_work&&) noexcept = default;
  inproc_work& operator=(inproc_work&& other) noexcept {
    if (this != &other) {
      cancel();
      op_ = std::move(other.op_);
    }
    return *this;
  }
  inproc_work(const inproc_work&) = delete;
  inproc_work& operator=(const inproc_work&) = delete;
  ~inproc_work() { cancel(); }

  bool test() {
    if (op_ && op_->error) throw *op_->error;
    if (!op_ || op_->done || op_->cancelled) return true;
    std::unique_lock<std::mutex> lock(op_->state->mutex);
    auto wake = detail::inproc_clock::time_point::max();
    std::vector<int> waiting, lost;
    std::string note;
    if (op_->progress(detail::inproc_clock::now(), wake, waiting, lost, note)) return true;
    op_->throw_lost(lost);
    return false;
  }

  void wait(deadline d = {}) {
    if (op_ && op_->error) throw *op_->error;
    if (!op_ || op_->done || op_->cancelled) return;
    std::unique_lock<std::mutex> lock(op_->state->mutex);
    op_->wait(lock, d, /*poll=*/false);
  }

  int source() const noexcept {
    if (!op_) return -1;
    return op_->what == detail::inproc_op::kind::recv && op_->posted ? op_->posted->from : op_->peer;
  }

  bool cancel() noexcept {
    if (!op_ || op_->done || op_->cancelled) return true;
    std::lock_guard<std::mutex> lock(op_->state->mutex);
    op_->withdraw();
    op_->state->changed.notify_all();
    return true;
  }

private:
  friend class inproc_communicator;
  explicit inproc_work(std::shared_ptr<detail::inproc_op> op) : op_(std::move(op)) {}
  std::shared_ptr<detail::inproc_op> op_;
};

// ---- the communicator ----

/// One rank's view of an inproc_world: models transport::communicator, with try_recv and the
/// asynchronous operations. Owned and called by the thread that plays the rank; abort() and
/// failed() may be called from any thread (abort() wakes the owner's blocking call, which then
/// throws). Movable; a moved-from communicator may only be destroyed or assigned. Destroying it
/// tells the peers this rank is gone.
class inproc_communicator {
public:
  inproc_communicator(inproc_communicator&& other) noexcept
      : state_(std::move(other.state_)), rank_(other.rank_), incarnation_(other.incarnation_),
        calls_(other.calls_), collectives_(other.collectives_) {}
  inproc_communicator& operator=(inproc_communicator&& other) noexcept {
    if (this != &other) {
      leave();
      state_ = std::move(other.state_);
      rank_ = other.rank_;
      incarnation_ = other.incarnation_;
      calls_ = other.calls_;
      collectives_ = other.collectives_;
    }
    return *this;
  }
  inproc_communicator(const inproc_communicator&) = delete;
  inproc_communicator& operator=(const inproc_communicator&) = delete;
  ~inproc_communicator() { leave(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return state_->size; }

  capability_flags capabilities() const noexcept {
    capability_flags f;
    f.any_source = true;
    f.detects_lost_peer = true;   // a killed thread is seen at once
    f.survives_lost_peer = true;  // nothing outside the world is affected
    f.isolates_lost_peer = true;  // a lost peer fails only the sends and receives that need it
    f.device_buffers = false;
    return f;
  }

  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, deadline d = {}) {
    wait_now(start_allreduce("allreduce", buf, count, t, op, &d), d);
  }
  /// The mean over ranks, in place (f32, f64): the sum divided by size() as it is copied out of
  /// the shared accumulator (communicator.hpp, "averaging all-reduce").
  void allreduce_average(void* buf, std::size_t count, dtype t, deadline d = {}) {
    wait_now(start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, &d, true), d);
  }
  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    wait_now(start_broadcast("broadcast", buf, bytes, root, &d), d);
  }
  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    wait_now(start_send("send", buf, bytes, dst, tag, &d), d);
  }
  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto op = start_recv("recv", buf, bytes, src, tag, &d);
    wait_now(op, d);
    return op->posted->from;
  }

  /// recv() that treats a deadline with no matching message as "nothing yet": returns
  /// std::nullopt and the communicator stays usable (see try_recv in communicator.hpp).
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    auto op = start_recv("try_recv", buf, bytes, src, tag, nullptr);  // a passed deadline polls once
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!op->wait(lock, d, /*poll=*/true)) return std::nullopt;
    return op->posted->from;
  }

  /// The asynchronous forms (communicator.hpp): they start the call and return at once.
  inproc_work iallreduce(void* buf, std::size_t count, dtype t, reduce_op op) {
    return inproc_work(start_allreduce("allreduce", buf, count, t, op, nullptr));
  }
  inproc_work iallreduce_average(void* buf, std::size_t count, dtype t) {
    return inproc_work(start_allreduce("allreduce_average", buf, count, t, reduce_op::sum, nullptr, true));
  }
  inproc_work ibroadcast(void* buf, std::size_t bytes, int root) {
    return inproc_work(start_broadcast("broadcast", buf, bytes, root, nullptr));
  }
  inproc_work isend(const void* buf, std::size_t bytes, int dst, int tag) {
    return inproc_work(start_send("send", buf, bytes, dst, tag, nullptr));
  }
  inproc_work irecv(void* buf, std::size_t bytes, int src, int tag) {
    return inproc_work(start_recv("recv", buf, bytes, src, tag, nullptr));
  }

  /// Marks the communicator failed (idempotent; any thread). A blocking call in progress on the
  /// owning thread wakes and throws, and so does every later call, each naming itself. Peers are
  /// not told: like a process that stops talking, this rank misses their deadlines.
  void abort() noexcept {
    if (!state_) return;
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->at(rank_).incarnation != incarnation_) return;
    state_->at(rank_).aborted = true;
    state_->changed.notify_all();
  }

  /// The peer_lost extension (communicator.hpp): `peer` was killed or destroyed its
  /// communicator, and no new process took its slot since (inproc_world::restart).
  bool peer_lost(int peer) const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (peer < 0 || peer >= static_cast<int>(state_->ranks.size()))
      throw invalid_parameter_error("cadence::transport[inproc]: peer_lost(" + std::to_string(peer) + ") on rank " +
                                    std::to_string(rank_) + ": rank out of range [0, " +
                                    std::to_string(state_->ranks.size()) + ")");
    return !state_->ranks[static_cast<std::size_t>(peer)].lost.empty();
  }

  bool failed() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto& self = state_->ranks[static_cast<std::size_t>(rank_)];
    return self.incarnation != incarnation_ || self.failure.has_value() || self.aborted;
  }

private:
  friend class inproc_world;
  using op_ptr = std::shared_ptr<detail::inproc_op>;

  inproc_communicator(std::shared_ptr<detail::inproc_state> state, int rank)
      : state_(std::move(state)), rank_(rank), incarnation_(state_->at(rank).incarnation) {}

  op_ptr make_op(detail::inproc_op::kind what, const char* name) {
    auto op = std::make_shared<detail::inproc_op>();
    op->what = what;
    op->c = {"inproc", name, ++calls_, rank_, state_->size, detail::inproc_clock::now()};
    op->state = state_;
    op->rank = rank_;
    op->incarnation = incarnation_;
    return op;
  }

  op_ptr start_allreduce(const char* name, void* buf, std::size_t count, dtype t, reduce_op r,
                         const deadline* d, bool average = false) {
    auto op = make_op(detail::inproc_op::kind::allreduce, name);
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->throw_if_failed();
    const std::size_t bytes = detail::checked_bytes(op->c, count, t);
    detail::check_buffer(op->c, buf, bytes);
    detail::check_op(op->c, r);
    if (!detail::host_reducible(t))
      detail::bad_argument(op->c, std::string("dtype ") + dtype_name(t) +
                                      " has no host reduction (it is for device backends such as NCCL)");
    if (average && !detail::averageable(t))
      detail::bad_argument(op->c, std::string("dtype ") + dtype_name(t) +
                                      " is not f32 or f64 (an integer average would have to round)");
    if (d) detail::check_deadline(op->c, *d);
    op->buf = buf;
    op->bytes = bytes;
    op->count = count;
    op->type = t;
    op->op = r;
    op->average = average;
    op->signature = average ? detail::signature_average(count, t) : detail::signature("allreduce", count, t, r);
    start(lock, op, -1, -1);
    return op;
  }

  op_ptr start_broadcast(const char* name, void* buf, std::size_t bytes, int root, const deadline* d) {
    auto op = make_op(detail::inproc_op::kind::broadcast, name);
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->throw_if_failed();
    detail::check_buffer(op->c, buf, bytes);
    detail::check_peer(op->c, root, "root");
    if (d) detail::check_deadline(op->c, *d);
    op->buf = buf;
    op->bytes = bytes;
    op->peer = root;
    op->signature = detail::signature("broadcast", bytes, root);
    start(lock, op, root, -1);
    return op;
  }

  op_ptr start_send(const char* name, const void* buf, std::size_t bytes, int dst, int tag, const deadline* d) {
    auto op = make_op(detail::inproc_op::kind::send, name);
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->throw_if_failed();
    detail::check_buffer(op->c, buf, bytes);
    detail::check_peer(op->c, dst, "destination");
    detail::check_tag(op->c, tag);
    if (d) detail::check_deadline(op->c, *d);
    op->cbuf = buf;
    op->bytes = bytes;
    op->peer = dst;
    op->tag = tag;
    start(lock, op, dst, tag);
    return op;
  }

  op_ptr start_recv(const char* name, void* buf, std::size_t bytes, int src, int tag, const deadline* d) {
    auto op = make_op(detail::inproc_op::kind::recv, name);
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->throw_if_failed();
    detail::check_buffer(op->c, buf, bytes);
    detail::check_peer(op->c, src, "source", /*allow_any=*/true);
    detail::check_tag(op->c, tag);
    if (d) detail::check_deadline(op->c, *d);
    op->buf = buf;
    op->bytes = bytes;
    op->peer = src;
    op->tag = tag;
    start(lock, op, src, tag);
    return op;
  }

  // Fires this rank's matching on_step trap, then takes part at once, or queues the op behind
  // the others this rank started while stalled. Collectives take their index now: issue order.
  void start(std::unique_lock<std::mutex>& lock, const op_ptr& op, int peer, int tag) {
    fire(lock, op->c, peer, tag);
    if (state_->at(rank_).incarnation != incarnation_)
      throw transport_error(detail::describe(op->c) + ": this rank is gone (a new process took its slot)");
    op->throw_if_failed();
    auto& self = state_->at(rank_);
    if (!self.lost.empty())
      op->fail(transport_error(detail::describe(op->c) + ": this rank is gone (" + self.lost + ")"));
    if (op->what == detail::inproc_op::kind::allreduce || op->what == detail::inproc_op::kind::broadcast)
      op->k = collectives_++;
    op->enter_pending();
    if (self.stalled || !self.unentered.empty())
      self.unentered.push_back(op);
    else
      op->enter();
  }

  void wait_now(const op_ptr& op, const deadline& d) {
    std::unique_lock<std::mutex> lock(state_->mutex);
    op->wait(lock, d, /*poll=*/false);
  }

  // The first on_step trap of this rank that matches the call: counted down by skip, then
  // removed and run with the world unlocked (its action locks to kill, stall or delay).
  void fire(std::unique_lock<std::mutex>& lock, const detail::call_info& c, int peer, int tag);

  void leave() noexcept {
    if (!state_) return;
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto& self = state_->at(rank_);
    if (self.incarnation != incarnation_) return;  // a new process holds the slot now
    if (self.lost.empty()) self.lost = "its communicator was destroyed";
    state_->changed.notify_all();
  }

  std::shared_ptr<detail::inproc_state> state_;
  int rank_;
  int incarnation_ = 0;
  std::uint64_t calls_ = 0;        // every call, for error messages
  std::uint64_t collectives_ = 0;  // collectives only: the slot every rank's n-th one meets in
};

// ---- the world ----

/// n ranks in one process. Each thread takes its rank's communicator with join(r); the world
/// and its communicators share state, so either may outlive the other. Fault injection works
/// from any thread, at any time, and takes effect at the ranks' next wait.
class inproc_world {
public:
  explicit inproc_world(int size, inproc_options options = {}) {
    if (size < 1)
      throw invalid_parameter_error("cadence::transport::inproc_world: size " +
                                    std::to_string(size) + " is not at least 1");
    state_ = std::make_shared<detail::inproc_state>(size, options);
  }

  int size() const noexcept { return state_->size; }

  /// Rank r's communicator, once per rank: two owners of one rank would break its ordering.
  inproc_communicator join(int rank) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("join", rank);
    auto& r = state_->at(rank);
    if (r.joined)
      throw invalid_parameter_error("cadence::transport::inproc_world: rank " +
                                    std::to_string(rank) + " has already joined");
    r.joined = true;
    return inproc_communicator(state_, rank);
  }

  /// A new process in the slot of rank r, which must be gone (killed, or its communicator
  /// destroyed): a fresh communicator for r, with its own sequence numbers. What was sent to the
  /// old process and never taken is discarded; peers that saw r as lost see it alive again. A
  /// collective cannot span the restart (the others' collective count moved on): this is for
  /// point-to-point protocols that admit returning peers, such as the parameter server.
  inproc_communicator restart(int rank) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("restart", rank);
    auto& r = state_->at(rank);
    if (r.lost.empty())
      throw invalid_parameter_error("cadence::transport::inproc_world::restart: rank " + std::to_string(rank) +
                                    " is not gone (kill it, or destroy its communicator, first)");
    const int next = r.incarnation + 1;
    for (auto& m : r.mailbox) m->discarded = "its process was replaced by inproc_world::restart";
    r = detail::inproc_rank{};
    r.incarnation = next;
    r.joined = true;
    state_->changed.notify_all();
    return inproc_communicator(state_, rank);
  }

  /// Rank r stops taking part: its next call waits without contributing until resume(), or
  /// until its deadline. Its peers see it miss theirs and name it.
  void stall(int rank) { set_stalled(rank, true); }
  void resume(int rank) { set_stalled(rank, false); }

  /// Rank r crashes: peers waiting for it (or starting to) throw transport_error naming it, and
  /// its own calls throw. Messages it sent before the kill are still delivered.
  void kill(int rank) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("kill", rank);
    state_->at(rank).lost = "killed by fault injection";
    state_->changed.notify_all();
  }

  /// Fault injection at a protocol step: `action(world)` runs once, on rank r's thread, when r
  /// enters the call `at` names, before that call takes part. It may kill, stall or delay any
  /// rank (r itself too: r's call then throws, or waits, as for a fault injected from outside)
  /// and tell the test where the run is, so a test injects "while the server sends worker 2's
  /// reply" or "while worker 0 waits for its reply" without guessing at times. Traps fire in
  /// the order they were set.
  void on_step(int rank, inproc_step at, std::function<void(inproc_world&)> action) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("on_step", rank);
    if (at.skip < 0)
      throw invalid_parameter_error("cadence::transport::inproc_world::on_step: negative skip");
    if (!action)
      throw invalid_parameter_error("cadence::transport::inproc_world::on_step: empty action");
    state_->traps.push_back({rank, std::move(at), std::move(action)});
  }

  /// Everything rank src sends to rank dst, messages and collective contributions, arrives
  /// `delay` later (zero restores the link). Applies to what is sent from now on.
  void delay_link(int src, int dst, std::chrono::nanoseconds delay) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank("delay_link", src);
    check_rank("delay_link", dst);
    if (delay < delay.zero())
      throw invalid_parameter_error("cadence::transport::inproc_world::delay_link: negative delay");
    state_->delay[static_cast<std::size_t>(src) * static_cast<std::size_t>(state_->size) +
                  static_cast<std::size_t>(dst)] =
        std::chrono::duration_cast<detail::inproc_clock::duration>(delay);
  }

private:
  friend class inproc_communicator;
  explicit inproc_world(std::shared_ptr<detail::inproc_state> state) : state_(std::move(state)) {}

  void check_rank(const char* what, int rank) const {
    if (rank < 0 || rank >= state_->size)
      throw invalid_parameter_error(std::string("cadence::transport::inproc_world::") + what +
                                    ": rank " + std::to_string(rank) + " is out of range [0, " +
                                    std::to_string(state_->size) + ")");
  }
  void set_stalled(int rank, bool stalled) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    check_rank(stalled ? "stall" : "resume", rank);
    state_->at(rank).stalled = stalled;
    state_->changed.notify_all();
  }

  std::shared_ptr<detail::inproc_state> state_;
};

inline void inproc_communicator::fire(std::unique_lock<std::mutex>& lock, const detail::call_info& c,
                                      int peer, int tag) {
  auto& traps = state_->traps;
  for (auto it = traps.begin(); it != traps.end(); ++it) {
    const inproc_step& at = it->at;
    if (it->rank != rank_ || (!at.op.empty() && at.op != c.op) || (at.peer && *at.peer != peer) ||
        (at.tag && *at.tag != tag))
      continue;
    if (it->at.skip > 0) {
      --it->at.skip;
      return;
    }
    auto action = std::move(it->action);
    traps.erase(it);
    lock.unlock();
    inproc_world world(state_);
    action(world);
    lock.lock();
    return;
  }
}

}  // namespace cadence::transport
