// The in-process backend: n ranks as threads of one process sharing a world, with the network
// backends' matching and failure semantics plus fault injection (stall, kill, delay a link), so
// adapters are tested deterministically, without a cluster, and under ThreadSanitizer.
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
/// call of `op` ("send", "recv", "try_recv", "allreduce", "broadcast"; empty: any call) with
/// this peer (send: destination, recv: source as passed, broadcast: root; unset: any) and tag
/// (unset: any), after `skip` such calls have gone by.
struct inproc_step {
  std::string op;
  std::optional<int> peer;
  std::optional<int> tag;
  int skip = 0;
};

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

struct inproc_rank {
  bool joined = false;
  bool stalled = false;
  std::string lost;  // why the rank is gone (killed, communicator destroyed); empty: alive
  std::optional<transport_error> failure;  // the first failure of its communicator
  bool aborted = false;
  std::deque<std::shared_ptr<inproc_message>> mailbox;  // messages to this rank, in send order
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

}  // namespace detail

/// One rank's view of an inproc_world: models transport::communicator. Owned and called by the
/// thread that plays the rank; abort() and failed() may be called from any thread (abort()
/// wakes the owner's blocking call, which then throws). Movable; a moved-from communicator may
/// only be destroyed or assigned. Destroying it tells the peers this rank is gone.
class inproc_communicator {
public:
  inproc_communicator(inproc_communicator&& other) noexcept
      : state_(std::move(other.state_)), rank_(other.rank_), calls_(other.calls_),
        collectives_(other.collectives_) {}
  inproc_communicator& operator=(inproc_communicator&& other) noexcept {
    if (this != &other) {
      leave();
      state_ = std::move(other.state_);
      rank_ = other.rank_;
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
    const detail::call_info c = begin("allreduce");
    std::unique_lock<std::mutex> lock(state_->mutex);
    throw_if_failed(c);
    const std::size_t bytes = detail::checked_bytes(c, count, t);
    detail::check_buffer(c, buf, bytes);
    detail::check_op(c, op);
    if (!detail::host_reducible(t))
      detail::bad_argument(c, std::string("dtype ") + dtype_name(t) +
                                  " has no host reduction (it is for device backends such as NCCL)");
    detail::check_deadline(c, d);
    fire(lock, c, -1, -1);
    enter(lock, c, d);
    const std::uint64_t k = collectives_++;
    detail::inproc_slot& s = arrive(c, k, detail::signature("allreduce", count, t, op), [&](auto& data, bool first) {
      if (first)
        data.assign(static_cast<const unsigned char*>(buf), static_cast<const unsigned char*>(buf) + bytes);
      else if (bytes != 0)
        detail::reduce_into(data.data(), buf, count, t, op);
    });
    // Done when every rank's contribution is in and has crossed its (possibly delayed) link.
    wait(lock, c, d, [&](auto now, auto& wake, auto& waiting, auto& lost, std::string& note) {
      if (!s.mismatch.empty()) fail(c, transport_error(detail::describe(c) + ": " + s.mismatch));
      for (int p = 0; p < size(); ++p) {
        if (p == rank_) continue;
        if (!s.arrived[static_cast<std::size_t>(p)]) {
          waiting.push_back(p);
          if (!state_->at(p).lost.empty()) lost.push_back(p);
        } else if (const auto at = s.arrived_at[static_cast<std::size_t>(p)] + state_->link_delay(p, rank_);
                   at > now) {
          waiting.push_back(p);
          wake = std::min(wake, at);
          note = "their contributions are on a link delayed by fault injection";
        }
      }
      return waiting.empty();
    });
    if (bytes != 0) std::memcpy(buf, s.data.data(), bytes);
    depart(k, s);
  }

  void broadcast(void* buf, std::size_t bytes, int root, deadline d = {}) {
    const detail::call_info c = begin("broadcast");
    std::unique_lock<std::mutex> lock(state_->mutex);
    throw_if_failed(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, root, "root");
    detail::check_deadline(c, d);
    fire(lock, c, root, -1);
    enter(lock, c, d);
    const std::uint64_t k = collectives_++;
    detail::inproc_slot& s = arrive(c, k, detail::signature("broadcast", bytes, root), [&](auto& data, bool) {
      if (rank_ == root)
        data.assign(static_cast<const unsigned char*>(buf), static_cast<const unsigned char*>(buf) + bytes);
    });
    if (rank_ != root) {
      // Like MPI_Bcast, the root does not wait for the others; they wait for the root only.
      wait(lock, c, d, [&](auto now, auto& wake, auto& waiting, auto& lost, std::string& note) {
        if (!s.mismatch.empty()) fail(c, transport_error(detail::describe(c) + ": " + s.mismatch));
        const auto r = static_cast<std::size_t>(root);
        if (!s.arrived[r]) {
          waiting.push_back(root);
          if (!state_->at(root).lost.empty()) lost.push_back(root);
        } else if (const auto at = s.arrived_at[r] + state_->link_delay(root, rank_); at > now) {
          waiting.push_back(root);
          wake = std::min(wake, at);
          note = "its payload is on a link delayed by fault injection";
        }
        return waiting.empty();
      });
      if (bytes != 0) std::memcpy(buf, s.data.data(), bytes);
    }
    depart(k, s);
  }

  void send(const void* buf, std::size_t bytes, int dst, int tag, deadline d = {}) {
    const detail::call_info c = begin("send");
    std::unique_lock<std::mutex> lock(state_->mutex);
    throw_if_failed(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, dst, "destination");
    detail::check_tag(c, tag);
    detail::check_deadline(c, d);
    fire(lock, c, dst, tag);
    enter(lock, c, d);
    if (!state_->at(dst).lost.empty())  // isolates_lost_peer: the others stay reachable
      throw detail::lost_peer_error(c, {dst}, state_->at(dst).lost);
    auto msg = std::make_shared<detail::inproc_message>();
    msg->src = rank_;
    msg->tag = tag;
    msg->bytes = bytes;
    msg->visible_at = detail::inproc_clock::now() + state_->link_delay(rank_, dst);
    const bool eager = bytes <= state_->options.eager_limit;
    if (eager) {
      const auto* p = static_cast<const unsigned char*>(buf);
      msg->eager.assign(p, p + bytes);
    } else {
      msg->rendezvous = buf;
    }
    auto& mailbox = state_->at(dst).mailbox;
    mailbox.push_back(msg);
    state_->changed.notify_all();
    if (eager) return;
    // Rendezvous: the receiver copies straight from `buf`, so whatever ends this wait, the
    // message must not stay in the mailbox pointing at a buffer the caller may free.
    struct withdraw {
      std::deque<std::shared_ptr<detail::inproc_message>>& mailbox;
      const std::shared_ptr<detail::inproc_message>& msg;
      ~withdraw() {
        if (!msg->taken) mailbox.erase(std::find(mailbox.begin(), mailbox.end(), msg));
      }
    } guard{mailbox, msg};
    wait(lock, c, d, /*poll=*/false, /*p2p=*/true, [&](auto, auto&, auto& waiting, auto& lost, std::string& note) {
      if (msg->taken) return true;
      waiting.push_back(dst);
      if (!state_->at(dst).lost.empty()) lost.push_back(dst);
      note = "a message over the eager limit waits for the matching recv";
      return false;
    });
    if (!msg->size_mismatch.empty())
      fail(c, transport_error(detail::describe(c) + ": " + msg->size_mismatch));
  }

  int recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    return *receive("recv", buf, bytes, src, tag, d, /*poll=*/false);
  }

  /// recv() that treats a deadline with no matching message as "nothing yet": returns
  /// std::nullopt and the communicator stays usable (see try_recv in communicator.hpp).
  std::optional<int> try_recv(void* buf, std::size_t bytes, int src, int tag, deadline d = {}) {
    return receive("try_recv", buf, bytes, src, tag, d, /*poll=*/true);
  }

  /// Marks the communicator failed (idempotent; any thread). A blocking call in progress on the
  /// owning thread wakes and throws, and so does every later call, each naming itself. Peers are
  /// not told: like a process that stops talking, this rank misses their deadlines.
  void abort() noexcept {
    if (!state_) return;
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->at(rank_).aborted = true;
    state_->changed.notify_all();
  }

  bool failed() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto& self = state_->ranks[static_cast<std::size_t>(rank_)];
    return self.failure.has_value() || self.aborted;
  }

private:
  friend class inproc_world;
  inproc_communicator(std::shared_ptr<detail::inproc_state> state, int rank)
      : state_(std::move(state)), rank_(rank) {}

  detail::call_info begin(const char* op) {
    return {"inproc", op, ++calls_, rank_, state_->size, detail::inproc_clock::now()};
  }

  std::optional<int> receive(const char* op, void* buf, std::size_t bytes, int src, int tag,
                             const deadline& d, bool poll) {
    const detail::call_info c = begin(op);
    std::unique_lock<std::mutex> lock(state_->mutex);
    throw_if_failed(c);
    detail::check_buffer(c, buf, bytes);
    detail::check_peer(c, src, "source", /*allow_any=*/true);
    detail::check_tag(c, tag);
    if (!poll) detail::check_deadline(c, d);  // try_recv: a passed deadline polls once
    fire(lock, c, src, tag);
    enter(lock, c, d);
    auto& mailbox = state_->at(rank_).mailbox;
    std::shared_ptr<detail::inproc_message> got;
    const bool arrived = wait(lock, c, d, poll, /*p2p=*/true, [&](auto now, auto& wake, auto& waiting, auto& lost, std::string& note) {
      // The oldest matching message wins. A message still on a delayed link blocks later ones
      // from the same source (FIFO per source and tag) but not other sources' (any_source).
      std::vector<int> in_flight;
      for (auto it = mailbox.begin(); it != mailbox.end(); ++it) {
        const auto& m = **it;
        if (m.tag != tag || (src != any_source && m.src != src)) continue;
        if (std::find(in_flight.begin(), in_flight.end(), m.src) != in_flight.end()) continue;
        if (m.visible_at > now) {
          in_flight.push_back(m.src);
          wake = std::min(wake, m.visible_at);
          continue;
        }
        got = *it;
        mailbox.erase(it);
        return true;
      }
      // Nothing yet: whom we wait for, and whether they can still send.
      for (int p = 0; p < size(); ++p) {
        if ((src != any_source && p != src) || (src == any_source && p == rank_)) continue;
        waiting.push_back(p);
      }
      if (waiting.empty()) waiting.push_back(rank_);  // any_source on a world of one
      bool all_lost = in_flight.empty();
      for (int p : waiting) all_lost = all_lost && !state_->at(p).lost.empty();
      if (all_lost) lost = waiting;
      if (!in_flight.empty()) note = "a matching message is on a link delayed by fault injection";
      return false;
    });
    if (!arrived) return std::nullopt;
    got->taken = true;
    state_->changed.notify_all();  // a rendezvous sender waits for `taken`
    if (got->bytes != bytes) {
      got->size_mismatch = "rank " + std::to_string(got->src) + " sent " +
                           std::to_string(got->bytes) + " bytes with tag " + std::to_string(tag) +
                           " but rank " + std::to_string(rank_) + " received into " +
                           std::to_string(bytes) + " bytes";
      fail(c, transport_error(detail::describe(c) + ": " + got->size_mismatch));
    }
    if (bytes != 0)
      std::memcpy(buf, got->rendezvous != nullptr ? got->rendezvous : got->eager.data(), bytes);
    return got->src;
  }


  // The first on_step trap of this rank that matches the call: counted down by skip, then
  // removed and run with the world unlocked (its action locks to kill, stall or delay).
  void fire(std::unique_lock<std::mutex>& lock, const detail::call_info& c, int peer, int tag);

  // After a failure every call rethrows the original error; after abort() (with no failure
  // before it) every call says it was aborted, naming itself.
  void throw_if_failed(const detail::call_info& c) const {
    const auto& self = state_->at(rank_);
    if (self.failure) throw *self.failure;
    if (self.aborted)
      throw transport_error(detail::describe(c) + ": the communicator was aborted (abort())");
  }

  // The first failure sticks: later calls rethrow it (contract b).
  [[noreturn]] void fail(const detail::call_info&, transport_error e) {
    auto& self = state_->at(rank_);
    if (!self.failure) self.failure = std::move(e);
    throw *self.failure;
  }

  // Own-rank faults before a call takes part: killed ranks fail, stalled ranks wait (without
  // taking part) until resumed, killed, aborted or out of time.
  void enter(std::unique_lock<std::mutex>& lock, const detail::call_info& c, const deadline& d) {
    for (;;) {
      auto& self = state_->at(rank_);
      throw_if_failed(c);
      if (!self.lost.empty())
        fail(c, transport_error(detail::describe(c) + ": this rank is gone (" + self.lost + ")"));
      if (!self.stalled) return;
      if (d.passed())
        fail(c, transport_error(detail::describe(c) + ": this rank is stalled by fault injection "
                                                     "(inproc_world::stall) and its deadline passed " +
                                detail::seconds_since(c.started) + " after the call"));
      state_->changed.wait_until(lock, d.time_point());
    }
  }

  // Takes part in collective k, creating its slot if this rank is first; `contribute(data,
  // first)` adds this rank's data. Arguments that differ from the first arriver's fail the
  // collective for everyone in it.
  template <class Contribute>
  detail::inproc_slot& arrive(const detail::call_info& c, std::uint64_t k, std::string signature,
                              Contribute contribute) {
    detail::inproc_slot& s = state_->slots[k];
    const bool first = s.first_rank < 0;
    if (first) {
      s.data = std::move(state_->spare);
      s.data.clear();
      s.signature = std::move(signature);
      s.first_rank = rank_;
      s.arrived.assign(static_cast<std::size_t>(size()), 0);
      s.arrived_at.resize(static_cast<std::size_t>(size()));
    } else if (s.mismatch.empty() && signature != s.signature) {
      s.mismatch = "arguments differ across ranks in collective #" + std::to_string(k + 1) +
                   ": rank " + std::to_string(s.first_rank) + " called " + s.signature +
                   ", rank " + std::to_string(rank_) + " called " + signature;
    }
    if (!s.mismatch.empty()) {
      state_->changed.notify_all();
      fail(c, transport_error(detail::describe(c) + ": " + s.mismatch));
    }
    contribute(s.data, first);
    s.arrived[static_cast<std::size_t>(rank_)] = 1;
    s.arrived_at[static_cast<std::size_t>(rank_)] = detail::inproc_clock::now();
    state_->changed.notify_all();
    return s;
  }

  void depart(std::uint64_t k, detail::inproc_slot& s) {
    if (++s.departures != size()) return;
    // The next collective reuses the storage: a fresh 64 MiB accumulator per call costs its
    // page faults every time.
    if (s.data.capacity() > state_->spare.capacity()) state_->spare = std::move(s.data);
    state_->slots.erase(k);
  }

  // The one wait loop of every call: `ready(now, wake, waiting, lost, note)` returns true when
  // the call can complete; otherwise it fills whom the call waits for, which of them are lost,
  // and the earliest time something could change without a notification (a delayed link).
  // With `poll`, a deadline that passes before the call is ready returns false instead of
  // failing (try_recv); without it the return value is always true.
  // With `p2p` (send, recv), losing the peer(s) it waited for throws without failing the
  // communicator: the other ranks stay reachable (capabilities().isolates_lost_peer).
  template <class Ready>
  bool wait(std::unique_lock<std::mutex>& lock, const detail::call_info& c, const deadline& d,
            Ready ready) {
    return wait(lock, c, d, false, false, ready);
  }
  template <class Ready>
  bool wait(std::unique_lock<std::mutex>& lock, const detail::call_info& c, const deadline& d,
            bool poll, bool p2p, Ready ready) {
    for (;;) {
      auto& self = state_->at(rank_);
      throw_if_failed(c);  // aborted from another thread
      if (!self.lost.empty())
        fail(c, transport_error(detail::describe(c) + ": this rank is gone (" + self.lost + ")"));
      const auto now = detail::inproc_clock::now();
      auto wake = d.time_point();
      std::vector<int> waiting, lost;
      std::string note;
      if (ready(now, wake, waiting, lost, note)) return true;
      if (!lost.empty()) {
        // One reason when they share it, else each rank's own.
        std::string how = state_->at(lost.front()).lost;
        for (int p : lost) {
          if (state_->at(p).lost == state_->at(lost.front()).lost) continue;
          how.clear();
          for (int q : lost)
            how += (how.empty() ? "rank " : "; rank ") + std::to_string(q) + ": " + state_->at(q).lost;
          break;
        }
        if (p2p) throw detail::lost_peer_error(c, lost, how);
        fail(c, detail::lost_peer_error(c, lost, how));
      }
      if (d.passed(now)) {
        if (poll) return false;
        fail(c, detail::deadline_error(c, waiting, note));
      }
      state_->changed.wait_until(lock, wake);
    }
  }

  void leave() noexcept {
    if (!state_) return;
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto& self = state_->at(rank_);
    if (self.lost.empty()) self.lost = "its communicator was destroyed";
    state_->changed.notify_all();
  }

  std::shared_ptr<detail::inproc_state> state_;
  int rank_;
  std::uint64_t calls_ = 0;        // every call, for error messages
  std::uint64_t collectives_ = 0;  // collectives only: the slot every rank's n-th one meets in
};

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
