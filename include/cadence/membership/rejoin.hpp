/// \file
/// \ingroup membership
/// A member that comes back when the quorum drops it while its process lives: it owns one
/// incarnation (a communicator in this process's slot and a member on it) and, where a sync
/// fails with evicted_error or quorum_error (its own transact(), or an adapter's sync that
/// transacts inside, run through guard()), makes a new one that joins with the quorum's state.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/membership/buffer.hpp>
#include <cadence/membership/errors.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/membership/options.hpp>
#include <cadence/membership/report.hpp>
#include <cadence/membership/view.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

namespace cadence::membership {
/// \addtogroup membership
/// @{

// ---- what a rejoin reports ----

/// What dropped an incarnation of a rejoining_member.
enum class drop_reason : std::uint8_t {
  /// evicted_error: the quorum re-formed without this member (it was silent past the timeouts,
  /// its report came too late, its communicator failed).
  evicted,
  /// quorum_error: no quorum could re-form on this member's side (it was cut off with a minority).
  no_quorum,
};

/// The name of `r`: "evicted" or "quorum" (the chaos rank's `reason`).
constexpr const char* drop_reason_name(drop_reason r) noexcept {
  return r == drop_reason::evicted ? "evicted" : "quorum";
}

/// One rejoin attempt, as rejoin_options::on_rejoin is told before it is made.
struct rejoin_attempt {
  /// The attempt's number over the helper's life (1 for its first; counted on across drops, so
  /// it is what rejoin_options::max_attempts bounds).
  int attempt = 0;
  /// What dropped the incarnation this attempt replaces.
  drop_reason reason = drop_reason::evicted;
  /// Seconds since the drop.
  double seconds = 0;
  /// The error that dropped the incarnation (the first attempt after a drop) or that failed the
  /// previous attempt (a connection refused, a join not admitted).
  std::string message;
};

/// How a rejoining_member comes back.
struct rejoin_options {
  /// Rejoin attempts in all, over the helper's life (a failed connection or join counts as
  /// one). 0 turns rejoining off: a drop propagates from transact() as from member::transact().
  int max_attempts = 3;
  /// The pause after a failed attempt before the next (unset: the member's heartbeat
  /// interval, so a link that is still down has a moment to come back). None before the first
  /// attempt after a drop.
  std::optional<std::chrono::milliseconds> pause;
  /// False on a rank whose communicator cannot be made anew in its slot: over ZeroMQ, rank 0
  /// when it hosts the job's rendezvous (a new communicator would bind it anew where no member
  /// looks). A drop then propagates with the refusal in its message instead of a rejoin.
  bool may_rejoin = true;
  /// Called on the owning thread before every attempt (after the pause), for the application's
  /// log. An exception it throws propagates from transact() or guard(), with no incarnation left.
  std::function<void(const rejoin_attempt&)> on_rejoin;

  // The caller's objects on an incarnation, for an adapter that runs the member itself (it
  // starts or joins it and transacts inside its own sync): exchange::diloco_member, which the
  // register function builds on each new member. Unset, the helper calls the member's own.

  /// How the first incarnation forms the first quorum (rejoining_member::start()), in place of
  /// member::start(): DiLoCo `[&] { dm->start(); }`.
  std::function<void()> start;
  /// How an incarnation joins a running quorum (rejoining_member::join() and every rejoin
  /// attempt, after the register function), in place of member::join(): DiLoCo
  /// `[&] { dm->join(); }` (member::join(), then the received state into the adapter). A
  /// cadence::error it throws fails the attempt, as member::join()'s does.
  std::function<void()> join;
  /// Ends what the caller built on an incarnation, before the helper destroys the incarnation's
  /// member and communicator (after a drop, after a failed attempt, in the helper's
  /// destructor): DiLoCo `[&] { dm.reset(); }`, whose destructor joins a streaming fragment's
  /// thread that uses the member. An exception it throws propagates, the incarnation gone, from
  /// the call that ended it (the destructor drops it).
  std::function<void()> teardown;

  /// Throws invalid_parameter_error naming the first bad field.
  void check() const {
    const std::string here = "cadence::membership::rejoin_options: ";
    if (max_attempts < 0)
      throw invalid_parameter_error(here + "max_attempts must be >= 0, got " + std::to_string(max_attempts));
    if (pause && pause->count() < 0)
      throw invalid_parameter_error(here + "pause must be >= 0 ms, got " + std::to_string(pause->count()) + " ms");
  }
};

/// What rejoining_member::transact() returns: member::transact()'s report, and whether the
/// sync's member was dropped and this call made a new incarnation. A sync that rejoined reports
/// outcome::healed (the new incarnation holds the quorum's state as of its admission, the
/// sync's result included when the quorum committed it: do not apply it again), `committed`
/// the quorum's count at the admission, `attempts` 1 and `reconfigurations` 0 (what the dropped
/// incarnation went through is gone with it).
struct rejoin_report : sync_report {
  /// Whether this call made a new incarnation that joined (then outcome is healed).
  bool rejoined = false;
  /// Rejoin attempts this call made (the failed ones included).
  int rejoin_attempts = 0;
  /// Seconds from the drop to the new incarnation's admission.
  double rejoin_seconds = 0;
};

// ---- rejoining_member ----

/// A member of a fault-tolerant collective job that comes back, in the same process, when the
/// quorum drops it while it lives (a short link cut stretched by TCP's backoff, a late resume
/// from SIGSTOP): where member::transact() throws evicted_error or quorum_error, this one ends
/// the incarnation (member, then communicator), makes a new communicator in the slot, a new
/// member on it with the same state registered in the same order, and join()s, which overwrites
/// the state with a donor's; then it returns a rejoin_report saying so.
///
///     mb::rejoin_options ro;
///     ro.max_attempts = 3;
///     ro.may_rejoin = !hosts_rendezvous;                  // rank 0 over ZeroMQ without a holder
///     mb::rejoining_member<zmq_communicator> m(
///         [&](int attempt) { return std::make_unique<zmq_communicator>(rank, size, zo, deadline(...)); },
///         opts, [&](mb::member<zmq_communicator>& mm) { mm.add_state(params); }, ro);
///     m.start();
///     for (;;) {
///       local_step(params);
///       auto r = m.transact([&] { m.view().allreduce_average(params.data(), n, dtype::f64); }, {params});
///       if (r.rejoined) { /* rebuild what was built on the old view() */ }
///     }
///     m.finish();
///
/// **When to use it.** Over a transport whose lost peer stays lost for its incarnation
/// (ZeroMQ: a peer silent past the heartbeat timeout), so a live process can be dropped; where
/// the process would otherwise exit and be restarted to join(). A member that is merely late to
/// a sync is healed back by member::transact() and never reaches it.
///
/// **What it costs.** Nothing on the path without a drop (one call through, no copy). A rejoin
/// costs a new communicator's registration at the rendezvous, an admission at the quorum's next
/// sync point and a state transfer, as a restarted process would, without the restart. Each
/// attempt's join() waits at most the quorum timeout (member_options::join_timeout is cut to
/// it), and the connect function should bound its own wait the same way on an attempt.
///
/// **What belongs to an incarnation.** view() and everything built on it (an adapter such as
/// periodic_averager) belong to one incarnation: rebuild them after a report with `rejoined`
/// (the register function, which runs before the join, is the place for the state and the
/// callbacks, and for an adapter built on the member that registers its own, as
/// diloco_member below; not for adapters that read the quorum). The registered buffers
/// outlive every incarnation: they belong to the caller.
///
/// **Limits.** The first life's connection, start() and join() propagate their errors (there is
/// no running job to rejoin yet), and so does finish() (the job's end is agreed: nothing is
/// left to rejoin). After rejoin_options::max_attempts attempts in all, the drop propagates, of
/// its kind (evicted_error or quorum_error), with the last failure's message and the attempt
/// count ("... (gave up after 3 rejoin attempts)"); the helper then holds no incarnation.
///
/// **Adapters that sync inside** (exchange::diloco_member: its sync() and finish() call
/// member::transact() themselves, streaming on a fragment's thread; it is built on a member and
/// joins through its own join()). Build the adapter in the register function, so every
/// incarnation has its own, registered in the same order; say how it starts, joins and ends in
/// rejoin_options (start, join, teardown: it must be gone before its member is); and run its
/// sync through guard(), which answers a drop that surfaces from it as transact() does:
///
///     std::vector<exchange::tensor_ref> tensors{exchange::tensor_ref(w.data(), w.size())};
///     std::optional<exchange::diloco_member<zmq_communicator>> dm;   // before m: outlives it
///     mb::rejoin_options ro;
///     ro.start = [&] { dm->start(); };
///     ro.join = [&] { dm->join(); };                       // member::join(), then adopt()
///     ro.teardown = [&] { dm.reset(); };                   // before its member is destroyed
///     mb::rejoining_member<zmq_communicator> m(connect, opts,
///         [&](mb::member<zmq_communicator>& mm) { dm.emplace(mm, tensors, outer, diloco_opts); }, ro);
///     m.start();
///     for (;;) {
///       inner_step(w);
///       if (!dm->step_done(us)) continue;
///       mb::rejoin_report r = m.guard([&] { return dm->sync(); });
///       if (r.rejoined) continue;   // a new dm, joined: w holds the quorum's global weights
///       ...
///     }
///     dm->finish();                 // a drop here propagates, as finish() does
///
/// **Threads.** As member: the owning thread makes every call, callbacks included.
template <class C>
class rejoining_member {
public:
  /// Makes the communicator of an incarnation in this process's slot: `attempt` 0 for the first
  /// life, then the rejoin attempt's number (bound the wait by the quorum timeout there). May
  /// throw cadence::error when it cannot connect (a failed attempt on a rejoin).
  using connect_fn = std::function<std::unique_ptr<C>(int attempt)>;
  /// Registers the state and the callbacks with a new member (add_state, on_change), before its
  /// start() or join(): called for every incarnation, so the order is the same every time.
  using register_fn = std::function<void(member<C>&)>;

  /// Makes the first incarnation: connect(0), a member on it with `options`, register_state on
  /// it. Throws what they throw, and invalid_parameter_error for bad `rejoin` options or a
  /// missing function.
  rejoining_member(connect_fn connect, member_options options, register_fn register_state,
                   rejoin_options rejoin = {})
      : connect_(std::move(connect)),
        register_(std::move(register_state)),
        options_(std::move(options)),
        rejoin_(std::move(rejoin)) {
    if (!connect_) throw invalid_parameter_error("cadence::membership::rejoining_member: no connect function");
    if (!register_) throw invalid_parameter_error("cadence::membership::rejoining_member: no register function");
    rejoin_.check();
    again_ = options_;
    again_.join_timeout = std::min(again_.join_timeout, again_.timeouts.quorum);
    make_incarnation(0, options_);
  }

  rejoining_member(const rejoining_member&) = delete;
  rejoining_member& operator=(const rejoining_member&) = delete;
  /// Ends the current incarnation: rejoin_options::teardown (its exception dropped), then the
  /// member, then the communicator.
  ~rejoining_member() {
    try {
      drop_incarnation();
    } catch (...) {  // a destructor: the teardown's failure has no caller to reach (the incarnation is gone)
    }
  }

  /// The first incarnation forms the first quorum (member::start(), or rejoin_options::start).
  void start() {
    member<C>& m = incarnation("start");
    if (rejoin_.start) rejoin_.start();
    else m.start();
  }
  /// The first incarnation joins a running quorum (a restarted or late process): member::join(),
  /// or rejoin_options::join.
  void join() {
    incarnation("join");
    join_incarnation();
  }

  /// member::transact(`body`, `backup`, `policy`) of the current incarnation (the sync's
  /// collectives, the buffers restored when an attempt fails, retry or discard on a loss);
  /// where it throws evicted_error or quorum_error, new incarnations join (up to
  /// rejoin_options::max_attempts in all) and the report says `rejoined` (outcome healed: the
  /// body is not run again). Throws the drop, with the attempt count, once the attempts are
  /// spent; with the refusal when may_rejoin is false; as it came when max_attempts is 0. Other errors propagate as from member::transact().
  template <class Body>
  rejoin_report transact(Body&& body, span<const buffer> backup = {}, on_loss policy = on_loss::retry) {
    return answer("transact", [&] { return member_->transact(std::forward<Body>(body), backup, policy); });
  }
  /// transact() with the `backup` as a braced list: `m.transact(body, {params, moments})`, the
  /// same `body` and `policy`.
  template <class Body>
  rejoin_report transact(Body&& body, std::initializer_list<buffer> backup, on_loss policy = on_loss::retry) {
    return transact(std::forward<Body>(body), span<const buffer>(backup.begin(), backup.size()), policy);
  }

  /// Calls `f`, a sync that transacts on the current incarnation's member itself (an adapter's:
  /// `m.guard([&] { return dm->sync(); })`), and answers a drop that surfaces from it as
  /// transact() answers its own: where `f` throws evicted_error or quorum_error, the incarnation
  /// ends (rejoin_options::teardown first) and new ones are made (the register function
  /// rebuilds the adapter) and join (rejoin_options::join), with the same attempts, limit,
  /// pause, refusal, on_rejoin and counters; the report then says `rejoined` (outcome healed:
  /// `f` is not run again, its sync's result is in the received state). Without a drop the
  /// report is f's result (a sync_report, or what converts to one), `rejoined` false. Throws as
  /// transact() does; f's other exceptions propagate as they came, the incarnation kept.
  template <class F>
  rejoin_report guard(F&& f) {
    return answer("guard", std::forward<F>(f));
  }

  /// member::finish() of the current incarnation. A drop there propagates: the job's end is
  /// agreed, so there is nothing left to rejoin. (An adapter that syncs inside ends with its own
  /// finish(), as DiLoCo's dm->finish(), called directly: the same holds.)
  sync_report finish() { return incarnation("finish").finish(); }

  // ---- the current incarnation ----

  /// The current incarnation's member (a new one after every rejoin). Throws
  /// invalid_parameter_error when there is none (the last rejoin gave up).
  member<C>& incarnation() { return incarnation("incarnation"); }
  /// The current incarnation's member (const).
  const member<C>& incarnation() const {
    if (!member_) throw no_incarnation("incarnation");
    return *member_;
  }
  /// The current incarnation's communicator.
  C& communicator() {
    if (!comm_) throw no_incarnation("communicator");
    return *comm_;
  }
  /// The current incarnation's view (member::view()): a new object after every rejoin.
  quorum_view<C>& view() { return incarnation("view").view(); }
  /// Whether an incarnation is held (false only after a rejoin gave up or failed otherwise).
  bool has_incarnation() const noexcept { return member_ != nullptr; }

  // ---- what it counts ----

  /// Incarnations that joined after a drop.
  int rejoins() const noexcept { return rejoins_; }
  /// Rejoin attempts made, the failed ones included (what max_attempts bounds).
  int attempts() const noexcept { return attempts_; }
  /// The member options of the first life (a rejoin's join_timeout is cut to the quorum timeout).
  const member_options& options() const noexcept { return options_; }
  /// The rejoin options in force.
  const rejoin_options& rejoin_settings() const noexcept { return rejoin_; }

private:
  // State: comm_ and member_ are one incarnation (made by make_incarnation(), ended by
  // drop_incarnation(): the caller's teardown, then the member, which refers to the
  // communicator, then the communicator); connect_, register_, options_ and again_ (the options
  // of a rejoin's member) are what every incarnation is made from, rejoin_ how it starts, joins,
  // ends and comes back; rejoins_ and attempts_ count over the helper's life.
  using clock = std::chrono::steady_clock;

  member<C>& incarnation(const char* what) {
    if (!member_) throw no_incarnation(what);
    return *member_;
  }
  static invalid_parameter_error no_incarnation(const char* what) {
    return invalid_parameter_error(std::string("cadence::membership::rejoining_member::") + what +
                                   ": no incarnation (the last rejoin gave up or failed)");
  }

  // One path for transact() and guard(): `f` on the current incarnation, and a drop it throws
  // answered by a rejoin (or propagated, as the options say).
  template <class F>
  rejoin_report answer(const char* what, F&& f) {
    static_assert(std::is_convertible<decltype(std::forward<F>(f)()), sync_report>::value,
                  "cadence::membership::rejoining_member::guard: the function must return a sync_report (the "
                  "report of the sync it ran, as exchange::diloco_member::sync() does)");
    incarnation(what);
    drop_reason reason = drop_reason::evicted;
    std::string message;
    try {
      rejoin_report r;
      static_cast<sync_report&>(r) = std::forward<F>(f)();
      return r;
    } catch (const evicted_error& e) {
      if (rejoin_.max_attempts == 0) throw;
      reason = drop_reason::evicted;
      message = e.what();
    } catch (const quorum_error& e) {
      if (rejoin_.max_attempts == 0) throw;
      reason = drop_reason::no_quorum;
      message = e.what();
    }
    if (!rejoin_.may_rejoin)
      raise(reason, message +
                        " (not rejoined: rejoin_options::may_rejoin is false on this rank, whose communicator "
                        "cannot be made anew in its slot, as rank 0 hosting a ZeroMQ rendezvous: restart the job, or "
                        "hold the rendezvous apart, membership::hold_rendezvous, so that every member may rejoin)");
    return rejoin(reason, std::move(message));
  }

  void make_incarnation(int attempt, const member_options& o) {
    comm_ = connect_(attempt);
    if (!comm_)
      throw invalid_parameter_error("cadence::membership::rejoining_member: the connect function returned no "
                                    "communicator (attempt " + std::to_string(attempt) + ")");
    member_ = std::make_unique<member<C>>(*comm_, o);
    try {
      register_(*member_);
    } catch (...) {  // what it built before it threw ends before the member
      drop_quietly();
      throw;
    }
  }

  void join_incarnation() {
    if (rejoin_.join) rejoin_.join();
    else member_->join();
  }

  // The caller's objects on the incarnation (teardown), then the member, then the communicator;
  // the teardown's exception after them.
  void drop_incarnation() {
    std::exception_ptr failed;
    if (member_ && rejoin_.teardown) {
      try {
        rejoin_.teardown();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    end_incarnation();
    if (failed) std::rethrow_exception(failed);
  }
  // drop_incarnation() where another exception is on its way (the incarnation is gone either way).
  void drop_quietly() noexcept {
    try {
      drop_incarnation();
    } catch (...) {
    }
  }
  void end_incarnation() noexcept {
    member_.reset();
    comm_.reset();
  }

  [[noreturn]] static void raise(drop_reason reason, const std::string& what) {
    if (reason == drop_reason::evicted) throw evicted_error(what);
    throw quorum_error(what);
  }

  // The incarnation was dropped (`reason`, `message`): attempts until one joins or the limit.
  rejoin_report rejoin(drop_reason reason, std::string message) {
    const clock::time_point dropped_at = clock::now();
    const auto since = [&] { return std::chrono::duration<double>(clock::now() - dropped_at).count(); };
    drop_incarnation();
    rejoin_report r;
    for (bool failed = false;; failed = true) {
      if (attempts_ >= rejoin_.max_attempts)
        raise(reason, message + " (gave up after " + std::to_string(attempts_) + " rejoin attempt" +
                          (attempts_ == 1 ? "" : "s") + ")");
      if (failed) std::this_thread::sleep_for(rejoin_.pause.value_or(options_.timeouts.heartbeat_interval));
      ++attempts_;
      ++r.rejoin_attempts;
      if (rejoin_.on_rejoin) rejoin_.on_rejoin(rejoin_attempt{attempts_, reason, since(), message});
      try {
        make_incarnation(attempts_, again_);
        join_incarnation();
        break;
      } catch (const error& e) {  // not connected or not admitted: a failed attempt
        drop_incarnation();
        message = e.what();
      } catch (...) {
        drop_quietly();
        throw;
      }
    }
    ++rejoins_;
    r.rejoin_seconds = since();
    r.rejoined = true;
    r.outcome = outcome::healed;
    r.committed = member_->committed();
    r.attempts = 1;
    r.reconfigurations = 0;
    return r;
  }

  connect_fn connect_;
  register_fn register_;
  member_options options_, again_;
  rejoin_options rejoin_;
  std::unique_ptr<C> comm_;
  std::unique_ptr<member<C>> member_;  // after comm_: destroyed first
  int rejoins_ = 0, attempts_ = 0;
};

/// @}
}  // namespace cadence::membership
