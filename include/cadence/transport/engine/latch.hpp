// The failure latch every backend keeps (communicator contract b): the first failure sticks and
// every later call rethrows it; abort() from any thread makes the owning thread's calls throw.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/detail/call.hpp>

#include <atomic>
#include <exception>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::transport::detail {

/// A transport error kept to be thrown later with its own type: a peer_error thrown again is
/// still a peer_error (a std::optional<transport_error> would slice it).
class held_error {
public:
  held_error() = default;
  template <class E, class = std::enable_if_t<std::is_base_of_v<transport_error, std::decay_t<E>>>>
  held_error& operator=(E&& e) {
    error_ = std::make_exception_ptr(std::forward<E>(e));
    return *this;
  }
  bool has_value() const noexcept { return static_cast<bool>(error_); }
  explicit operator bool() const noexcept { return has_value(); }
  [[noreturn]] void rethrow() const { std::rethrow_exception(error_); }

private:
  std::exception_ptr error_;
};

/// One communicator's failure state. The failure itself is the owning thread's (record, enter,
/// rethrow); failed() and abort() may be called from any thread (two atomics).
class failure_latch {
public:
  /// Contract b at the start of a call: the first failure again, or "aborted", naming the call.
  void enter(const call_info& c) const {
    if (failure_) failure_.rethrow();
    if (aborted()) throw transport_error(describe(c) + ": the communicator was aborted (abort())");
  }

  /// Keeps `e` unless a failure is kept already (the first one sticks). Owning thread only.
  template <class E>
  void record(E e) {
    if (!failure_) failure_ = std::move(e);
    failed_.store(true, std::memory_order_release);
  }

  /// Owning thread only: whether a failure is recorded, and throwing it.
  bool has_failure() const noexcept { return failure_.has_value(); }
  [[noreturn]] void rethrow() const { failure_.rethrow(); }

  /// Any thread.
  void abort() noexcept { aborted_.store(true, std::memory_order_release); }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire) || aborted(); }

  /// What a wait that abort() interrupted throws.
  static transport_error aborted_while(const call_info& c, const std::vector<int>& peers) {
    return transport_error(describe(c) + ": the communicator was aborted (abort())" +
                           (peers.empty() ? std::string() : " while waiting for " + rank_list(peers)));
  }

private:
  held_error failure_;
  std::atomic<bool> failed_{false};  // mirrors failure_ for failed() on other threads
  std::atomic<bool> aborted_{false};
};

}  // namespace cadence::transport::detail
