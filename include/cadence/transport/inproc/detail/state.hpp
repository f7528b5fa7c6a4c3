// The in-process backend's shared world: every rank's mailbox, posted receives and collective
// slots under one mutex, and one operation's steps (enter, progress, wait, withdraw) over it.
// The ranks are threads of one process; inproc.hpp is the communicator over this state.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/latch.hpp>
#include <cadence/transport/inproc/options.hpp>

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

class inproc_world;

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
  held_error error;  // a point-to-point op that failed alone: its peer lost, or a size mismatch
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
        if (!msg->size_mismatch.empty()) {  // the receiver's fault or ours: this send alone fails
          error = peer_error(describe(c) + ": " + msg->size_mismatch, peer);
          error.rethrow();
        }
        if (done || msg->taken) return done = true;
        if (!msg->discarded.empty()) {
          error = lost_peer_error(c, {peer}, msg->discarded);  // isolates_lost_peer
          cancelled = true;
          error.rethrow();
        }
        waiting.push_back(peer);
        if (!state->at(peer).lost.empty()) lost.push_back(peer);
        note = "a message over the eager limit waits for the matching recv";
        return false;
      }
      case kind::recv: {
        match_posted(now);
        if (posted->matched) {
          if (!posted->size_mismatch.empty()) {  // fails alone, naming the sender (peer_error)
            error = peer_error(describe(c) + ": " + posted->size_mismatch, posted->from);
            error.rethrow();
          }
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
      error.rethrow();
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

}  // namespace cadence::transport
