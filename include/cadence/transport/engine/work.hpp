/// \file
/// \ingroup transport
/// The work handle of the backends built on the progress engine (mpi_work, gloo_work,
/// zmq_work): a started operation the caller tests, waits for (with a deadline, or until a time
/// that is no failure) or cancels; every test and wait drives all the communicator's
/// operations. The one public header of `transport/engine/`: the rest of that folder is the
/// backends' shared implementation (docs/compatibility.md). Include the backend's header.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>

#include <memory>
#include <type_traits>
#include <utility>

namespace cadence::transport {
/// \addtogroup transport
/// @{

template <class Engine, class Op, class Handle>
class basic_work;

namespace detail {
/// How a backend makes its work handles (their constructor is not for users).
struct work_access {
  template <class Work, class Handle, class OpPtr>
  static Work make(Handle engine, OpPtr op) {
    return Work(std::move(engine), std::move(op));
  }
};
}  // namespace detail

/// Models the work handle of communicator.hpp (requirements 1-5) for an engine `Engine` whose
/// operations are `Op`, reached through `Handle` (a plain pointer to a communicator derived
/// from detail::progress_engine, or a shared pointer that keeps the engine alive). The engine
/// provides work_test(op), work_wait(op, d), work_cancel(op) and, where
/// Engine::work_has_wait_until, work_wait_until(op, t); Op provides done, cancelled, orphan,
/// finished(), its call `c` and source_or_peer(). Only the communicator's owning thread uses
/// it, and only while the communicator lives: a handle of a destroyed communicator throws from
/// test() and wait(), and cancel() returns true. Movable, not copyable; a default-constructed
/// or moved-from handle is complete; destroying an incomplete one cancels it.
template <class Engine, class Op, class Handle = Engine*>
class basic_work {
public:
  /// A complete handle of no operation.
  basic_work() = default;
  /// Takes over `o`'s operation; `o` is left complete.
  basic_work(basic_work&& o) noexcept : engine_(std::exchange(o.engine_, Handle{})), op_(std::move(o.op_)) {}
  /// Cancels this handle's own operation (as destroying it would), then takes over `o`'s.
  basic_work& operator=(basic_work&& o) noexcept {
    if (this != &o) {
      cancel();
      engine_ = std::exchange(o.engine_, Handle{});
      op_ = std::move(o.op_);
    }
    return *this;
  }
  basic_work(const basic_work&) = delete;
  basic_work& operator=(const basic_work&) = delete;
  ~basic_work() { cancel(); }

  /// Makes progress without blocking; true once complete. Throws what the blocking call would.
  bool test() {
    if (complete()) return true;
    live();
    return engine_->work_test(*op_);
  }

  /// Returns once complete; when d passes first, throws the deadline's error naming whom the
  /// operation waits for and fails the communicator.
  void wait(deadline d = {}) {
    if (complete()) return;
    live();
    engine_->work_wait(*op_, d);
  }

  /// Progresses until the operation completes or `t` comes (beyond the concept): true once it
  /// completed; false at `t`, which, unlike wait()'s deadline, is no failure. For a caller whose
  /// thread is otherwise idle (its accelerator computes).
  template <class E = Engine, std::enable_if_t<E::work_has_wait_until, int> = 0>
  bool wait_until(deadline::clock::time_point t) {
    if (complete()) return true;
    live();
    return engine_->work_wait_until(*op_, t);
  }

  /// The sender of a completed receive (any_source); the peer otherwise.
  int source() const noexcept { return op_ ? op_->source_or_peer() : -1; }

  /// Withdraws the operation if the backend can (true: nothing touches the buffer any more);
  /// false when it goes on in the background, so the buffer must stay valid.
  bool cancel() noexcept {
    if (!op_ || op_->finished() || op_->orphan) return true;
    return engine_->work_cancel(*op_);
  }

private:
  friend struct detail::work_access;
  basic_work(Handle e, std::shared_ptr<Op> op) noexcept : engine_(std::move(e)), op_(std::move(op)) {}

  bool complete() const noexcept { return !op_ || op_->done || op_->cancelled; }
  void live() const {
    if (op_->orphan) throw transport_error(detail::describe(op_->c) + ": its communicator was destroyed");
  }

  Handle engine_{};
  std::shared_ptr<Op> op_;
};

/// @}
}  // namespace cadence::transport
