// The gloo backend's hold on gloo itself: one gloo context and its buffers, testing a buffer
// without waiting (gloo offers only blocking waits), blocking on one buffer until a time without
// gloo's own timeout (which would close every connection), posting that fails at once on a
// closed connection, and the slots our traffic uses.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/latch.hpp>

#include <gloo/context.h>
#if CADENCE_GLOO_TCP_PEEK
#include <gloo/transport/tcp/unbound_buffer.h>
#endif
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// Whether gloo's TCP buffer header compiles (cmake/CadenceGloo.cmake): test() without waiting
// reads its completion counts.
#ifndef CADENCE_GLOO_TCP_PEEK
#define CADENCE_GLOO_TCP_PEEK 0
#endif

namespace cadence::transport::detail {

// gloo slots of our traffic: point to point slots carry the tag in their low bits, and every
// range lies above gloo's own collectives (prefixes 1 to 8 in the top byte, gloo/types.h) so
// gloo::allreduce may share the context.
inline constexpr std::uint64_t gloo_slot_collective = std::uint64_t{0x20} << 56;
inline constexpr std::uint64_t gloo_slot_bulk = std::uint64_t{0x21} << 56;
inline constexpr std::uint64_t gloo_slot_p2p_head = std::uint64_t{0x22} << 56;
inline constexpr std::uint64_t gloo_slot_p2p_body = std::uint64_t{0x23} << 56;

using gloo_buffer = ::gloo::transport::UnboundBuffer;

// gloo's messages end in advice and an emoji; the first sentence is what a user needs.
inline std::string gloo_reason(const std::exception& e) {
  std::string s = e.what();
  const auto cut = s.find(". ");
  if (cut != std::string::npos) s.resize(cut);
  if (s.size() > 300) s.resize(300);
  return s;
}

// A buffer the communicator owns, registered with gloo once and reused.
struct gloo_owned {
  std::unique_ptr<unsigned char[]> bytes;
  std::size_t size = 0;
  std::unique_ptr<gloo_buffer> ub;
};

// Whether an operation on a gloo TCP buffer has completed, without waiting: gloo offers only
// blocking waits, but its TCP buffer counts completions under its own mutex. A class derived
// from it may name those protected members, and a pointer to them applies to any buffer of
// that type: the count is read under the buffer's mutex, as gloo's own waits read it. A buffer
// of another transport answers "unknown" (nullopt).
#if CADENCE_GLOO_TCP_PEEK
struct gloo_peek : ::gloo::transport::tcp::UnboundBuffer {
  static std::optional<bool> ready(gloo_buffer& any, bool recv) {
    using tcp_buffer = ::gloo::transport::tcp::UnboundBuffer;
    auto* ub = dynamic_cast<tcp_buffer*>(&any);
    if (ub == nullptr) return std::nullopt;
    std::mutex tcp_buffer::*m = &gloo_peek::m_;
    int tcp_buffer::*n = recv ? &gloo_peek::recvCompletions_ : &gloo_peek::sendCompletions_;
    std::exception_ptr tcp_buffer::*ex = &gloo_peek::ex_;
    std::lock_guard<std::mutex> lock(ub->*m);
    return ub->*n > 0 || ub->*ex != nullptr;
  }
};
#else
struct gloo_peek {
  static std::optional<bool> ready(gloo_buffer&, bool) { return std::nullopt; }
};
#endif

// Wakes one gloo wait at a time at a given time (abortWaitRecv or abortWaitSend), so that no
// wait relies on gloo's wait timeout, which closes every connection of the context. Its thread
// starts with the first arm() and stops with the object.
class gloo_timer {
public:
  gloo_timer() = default;
  gloo_timer(const gloo_timer&) = delete;
  gloo_timer& operator=(const gloo_timer&) = delete;
  ~gloo_timer() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  void arm(gloo_buffer* ub, bool recv, std::chrono::steady_clock::time_point when) {
    std::lock_guard<std::mutex> lock(m_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    armed_ = ub;
    recv_ = recv;
    when_ = when;
    fired_ = false;
    // The thread re-checks when it wakes at the time it sleeps until, so it needs waking only
    // for an earlier time: a wait re-armed for a later deadline costs no context switch.
    if (when < sleeping_until_) cv_.notify_one();
  }
  /// Whether it fired since arm(). Afterwards it touches the buffer no more.
  bool disarm() {
    std::lock_guard<std::mutex> lock(m_);
    armed_ = nullptr;
    return fired_;
  }

private:
  void loop() {
    std::unique_lock<std::mutex> lock(m_);
    while (!stop_) {
      if (armed_ == nullptr) {
        sleeping_until_ = std::chrono::steady_clock::time_point::max();
        cv_.wait(lock);
      } else if (std::chrono::steady_clock::now() >= when_) {
        if (recv_)
          armed_->abortWaitRecv();
        else
          armed_->abortWaitSend();
        armed_ = nullptr;
        fired_ = true;
      } else {
        sleeping_until_ = when_;
        cv_.wait_until(lock, when_);
      }
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false;
  gloo_buffer* armed_ = nullptr;
  bool recv_ = true;
  std::chrono::steady_clock::time_point when_{};
  std::chrono::steady_clock::time_point sleeping_until_ = std::chrono::steady_clock::time_point::min();
  bool fired_ = false;
};

/// One communicator's gloo context and the waits on its buffers. The owning thread uses it;
/// wake() may be called from any thread (abort()). Map of its state: context_; credits_ (a
/// completion a blocking wait consumed, kept for the buffer's owner to take); waiting_ under
/// waiting_mutex_ (the one buffer a wait is blocked on, which wake() aborts); closed_; the
/// timer (last: its thread stops before anything it could touch goes).
class gloo_link {
public:
  explicit gloo_link(const failure_latch& latch) noexcept : latch_(&latch) {}
  gloo_link(const gloo_link&) = delete;
  gloo_link& operator=(const gloo_link&) = delete;

  void adopt(std::shared_ptr<::gloo::Context> context) { context_ = std::move(context); }
  const std::shared_ptr<::gloo::Context>& context() const noexcept { return context_; }

  std::unique_ptr<gloo_buffer> buffer(void* p, std::size_t n) { return context_->createUnboundBuffer(p, n); }
  /// A buffer of our own of `n` bytes, registered.
  void own(gloo_owned& b, std::size_t n) {
    if (b.ub) forget(b.ub.get());
    b.ub.reset();
    b.bytes.reset(new unsigned char[std::max<std::size_t>(n, 1)]);
    b.size = n;
    b.ub = buffer(b.bytes.get(), n);
  }

  // ---- posting ----

  /// Posting fails at once when the connection is already closed: a lost peer.
  template <class F>
  void post(const call_info& c, F&& f, const std::vector<int>& peers) {
    std::string reason;
    try {
      f();
      return;
    } catch (const std::exception& e) {
      reason = gloo_reason(e);
    }
    throw lost_peer_error(c, peers, reason);
  }
  template <class F>
  void post(const call_info& c, F&& f, int peer) {
    post(c, std::forward<F>(f), std::vector<int>{peer});
  }

  // ---- testing without waiting: credits and peeks ----

  bool ready(gloo_buffer& ub, bool recv) {
    if (const credit* k = credit_of(&ub, recv); k != nullptr && k->count > 0) return true;
    const std::optional<bool> r = gloo_peek::ready(ub, recv);
    if (!r)
      throw invalid_parameter_error(
          "cadence::transport[gloo]: testing an operation without waiting needs gloo's TCP "
          "transport; this context has another");
    return *r;
  }

  /// Takes one completion that ready() saw (a credit, or gloo's own, which a wait then returns
  /// at once); returns its rank. A stored exception (a closed connection) fails the call,
  /// naming `peers`.
  int take(const call_info& c, gloo_buffer& ub, bool recv, const std::vector<int>& peers) {
    if (credit* k = credit_of(&ub, recv); k != nullptr && k->count > 0) {
      --k->count;
      const int r = k->ranks.front();
      k->ranks.pop_front();
      if (k->count == 0) credits_.erase(credits_.begin() + (k - credits_.data()));
      return r;
    }
    std::string reason;
    for (int tries = 0; tries < 3; ++tries) {  // a stale abort flag returns false once
      int r = -1;
      try {
        const bool done = recv ? ub.waitRecv(&r, std::chrono::hours(1)) : ub.waitSend(&r, std::chrono::hours(1));
        if (done) return r;
      } catch (const std::exception& e) {
        reason = gloo_reason(e);
        break;
      }
    }
    if (reason.empty()) reason = "a completion went missing";
    throw lost_peer_error(c, peers, "its connection closed: " + reason);
  }

  /// Takes a completion if one is there: the non-blocking step every progress step uses.
  bool try_take(const call_info& c, gloo_buffer& ub, bool recv, const std::vector<int>& peers, int* rank = nullptr) {
    if (!ready(ub, recv)) return false;
    const int r = take(c, ub, recv, peers);
    if (rank != nullptr) *rank = r;
    return true;
  }

  /// Forgets the credits of a buffer about to be destroyed.
  void forget(gloo_buffer* ub) {
    credits_.erase(std::remove_if(credits_.begin(), credits_.end(), [&](const credit& k) { return k.ub == ub; }),
                   credits_.end());
  }

  // ---- blocking ----

  /// Blocks on one buffer until it completes (credited, for its owner's next test), `until`
  /// (the timer's abort), a wake() or a failure (throws naming `peers`). gloo's own timeout,
  /// far beyond, never fires (it would close every connection).
  void block(const call_info& c, gloo_buffer& ub, bool recv, const std::vector<int>& peers,
             deadline::clock::time_point until) {
    bool done = false, fired = false;
    int r = -1;
    std::string reason;
    {
      registered guard(*this, ub, recv);
      if (latch_->aborted()) return;
      timer_.arm(&ub, recv, until);
      try {
        const auto margin = std::chrono::minutes(10);
        done = recv ? ub.waitRecv(&r, remaining_ms(deadline::at(until)) + margin)
                    : ub.waitSend(&r, remaining_ms(deadline::at(until)) + margin);
      } catch (const std::exception& e) {
        reason = gloo_reason(e);
      }
      fired = timer_.disarm();
    }
    if (done && fired) {
      try {  // the timer fired just after: its flag would end the next wait at once; clear it
        if (recv)
          ub.waitRecv(nullptr, std::chrono::hours(1));
        else
          ub.waitSend(nullptr, std::chrono::hours(1));
      } catch (const std::exception&) {
      }
    }
    if (!reason.empty()) {
      if (latch_->aborted()) return;  // the caller's loop names the abort
      throw lost_peer_error(c, peers, "its connection closed: " + reason);
    }
    if (!done) return;  // the timer, or wake()
    credit* k = credit_of(&ub, recv);
    if (k == nullptr) {
      credits_.push_back({&ub, recv, 0, {}});
      k = &credits_.back();
    }
    ++k->count;
    k->ranks.push_back(r);
  }

  /// A blocking wait for one posted operation with gloo's own wait (construction, shutdown):
  /// throws a deadline error naming `awaited` (with `note`), a lost peer, or the abort.
  /// In shutdown (`abortable` false) an abort no longer stops it.
  void wait(const call_info& c, const deadline& d, gloo_buffer& ub, bool is_recv, const std::vector<int>& awaited,
            int* source, const char* note, bool abortable = true) {
    std::string reason;
    bool done = false;
    {
      registered guard(*this, ub, is_recv);
      if (!(abortable && latch_->aborted())) {
        try {
          done = is_recv ? ub.waitRecv(source, remaining_ms(d)) : ub.waitSend(nullptr, remaining_ms(d));
        } catch (const std::exception& e) {
          reason = gloo_reason(e);
        }
      }
    }
    if (done) return;
    if (latch_->aborted() && (abortable || reason.empty())) throw failure_latch::aborted_while(c, awaited);
    if (d.passed()) throw deadline_error(c, awaited, note);
    throw lost_peer_error(c, awaited, "its connection closed: " + reason);
  }

  /// Any thread: a wait blocked on a buffer wakes (abort()).
  void wake() noexcept {
    std::lock_guard<std::mutex> lock(waiting_mutex_);
    if (waiting_ == nullptr) return;
    if (waiting_recv_)
      waiting_->abortWaitRecv();
    else
      waiting_->abortWaitSend();
  }

  void close() noexcept {
    if (closed_) return;
    closed_ = true;
    if (!context_) return;
    try {
      context_->closeConnections();
    } catch (...) {
    }
  }
  bool closed() const noexcept { return closed_; }

  static std::chrono::milliseconds remaining_ms(const deadline& d) {
    // Rounded up, plus one: a gloo wait must not end before our deadline has passed, or its
    // timeout would read as a lost peer.
    const auto left = d.remaining();
    const auto hours = std::chrono::hours(24 * 365);
    if (left >= hours) return hours;
    return std::chrono::duration_cast<std::chrono::milliseconds>(left) + std::chrono::milliseconds(2);
  }

private:
  // A blocking wait completes a buffer's oldest operation; it is credited to the buffer, and
  // the owner of the buffer takes it in its next progress step.
  struct credit {
    gloo_buffer* ub = nullptr;
    bool recv = true;
    int count = 0;
    std::deque<int> ranks;  // the sender (or destination) of each
  };
  credit* credit_of(gloo_buffer* ub, bool recv) {
    for (auto& k : credits_)
      if (k.ub == ub && k.recv == recv) return &k;
    return nullptr;
  }

  // The buffer a wait is blocked on, for wake(), while the guard lives.
  struct registered {
    gloo_link& self;
    registered(gloo_link& s, gloo_buffer& ub, bool recv) : self(s) {
      std::lock_guard<std::mutex> lock(self.waiting_mutex_);
      self.waiting_ = &ub;
      self.waiting_recv_ = recv;
    }
    ~registered() {
      std::lock_guard<std::mutex> lock(self.waiting_mutex_);
      self.waiting_ = nullptr;
    }
    registered(const registered&) = delete;
    registered& operator=(const registered&) = delete;
  };

  const failure_latch* latch_;
  std::shared_ptr<::gloo::Context> context_;
  std::vector<credit> credits_;
  std::mutex waiting_mutex_;  // guards waiting_ against wake() from another thread
  gloo_buffer* waiting_ = nullptr;
  bool waiting_recv_ = false;
  bool closed_ = false;
  gloo_timer timer_;  // last: its thread stops before anything it may touch goes
};

}  // namespace cadence::transport::detail
