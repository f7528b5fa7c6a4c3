/// \file
/// \ingroup membership
/// One process's part in a collective job that survives: it forms the first quorum or joins a
/// running one, runs each sync as a transaction over the quorum's view (committed on every
/// member that completes it, or given up or retried everywhere), re-forms the quorum when a
/// member is lost, and streams the replica's state to newcomers and to members left behind.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/membership/buffer.hpp>
#include <cadence/membership/detail/core.hpp>
#include <cadence/membership/errors.hpp>
#include <cadence/membership/options.hpp>
#include <cadence/membership/quorum.hpp>
#include <cadence/membership/report.hpp>
#include <cadence/membership/view.hpp>
#include <cadence/transport/communicator.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// A member of a fault-tolerant collective job over communicator `C` (in-process threads or
/// ZeroMQ: any communicator that isolates a lost peer and has the asynchronous operations).
///
///     zmq_communicator comm(rank, size, zmq_opts);       // heartbeats from member_options
///     membership::member<zmq_communicator> m(comm, opts);
///     m.add_state(params);                               // what a newcomer receives
///     m.add_state(momentum);
///     m.add_state("averager", save, load);               // small state: counters, clocks
///     restarted ? m.join() : m.start();
///     exchange::periodic_averager<membership::quorum_view<zmq_communicator>> avg(m.view(), 8);
///     for (;;) {
///       local_step(params);
///       if (avg.step_done()) m.transact([&] { avg.sync(params); }, {params});  // retried on a fault
///     }
///
/// **Quorum.** start() on every initial process forms the first quorum: the eligible ranks
/// that reach it within the quorum timeout. The lowest rank leads each reconfiguration (no fixed
/// coordinator: any rank, rank 0 included, may be lost). A quorum's successor must hold more
/// than half of it, or half with its leader, and the same of the quorum that last committed a
/// sync or confirmed an admission (quorum.hpp, may_succeed), and at least
/// member_options::min_size members.
///
/// **Transactions.** transact(body) runs body, which calls collectives on view() (directly or
/// through an adapter). A sync commits on a member when its collectives complete there. When a
/// member is lost (or stalls past the op timeout, or leaves the sync), every survivor's view
/// call fails, the survivors agree on a new quorum, the messages still on their way are drained,
/// and then: if some survivor had committed the sync, the others receive its state (healed);
/// otherwise the backup is restored and the sync runs again on the new quorum
/// (on_loss::retry) or is given up everywhere (on_loss::discard). So every member of the new
/// quorum holds the same state after every sync, whatever failed where. A member healed by
/// members that had already begun the next sync (it was one behind them) and give that one up
/// (on_loss::discard, or out of attempts) gives up its own next sync too, without running it
/// (sync_report::attempts 0): every member gives up the same syncs, so an application that
/// counts its syncs itself (DiLoCo's fragments) stays in step.
///
/// **Joining.** join() on a new process (a restart, a late or an extra one) asks every rank to
/// admit it; the members note it in the notices of their next sync, and once that sync commits
/// they re-form with it and the members at the committed count stream it the registered state
/// in parallel pieces (member_options::transfer_bytes each); a one-value all-reduce on the new
/// quorum then confirms that every member took it up, so that losing a member (the leader
/// included) before its first commit is measured against it. Nothing else waits: the quorum
/// pays for membership only at its sync points. The state is streamed inside the transact()
/// of the sync that admits it, as the sync's body left it: an update that belongs to the sync
/// (BSP's optimizer step after the gradients' all-reduce) goes inside the body.
///
/// **Threads.** The owning thread (the communicator's) makes every call; the member answers
/// the others only inside them, at sync points, which is where an all-reduce job waits anyway.
template <class C>
class member {
public:
  /// A member over `comm` (which must outlive it) with `options`. Does not communicate: register
  /// the state, then start() or join(). Throws invalid_parameter_error for bad options or a
  /// communicator that does not isolate lost peers.
  explicit member(C& comm, member_options options = {})
      : core_(std::make_unique<detail::core<C>>(comm, std::move(options))), view_(*core_) {}

  member(const member&) = delete;
  member& operator=(const member&) = delete;

  // ---- the replica's state ----

  /// Registers block `b` of the replica's state (parameters, optimizer moments): streamed to a
  /// newcomer or a member left behind, in registration order. Every member registers the same
  /// sizes in the same order, before start() or join().
  void add_state(buffer b) { core_->add_state(b); }
  /// Registers small state that is not a tensor, under `name` (an adapter's counters, a policy clock):
  /// `save()` runs on a member that sends the state, `load()` on the one that receives it.
  void add_state(std::string name, std::function<std::vector<unsigned char>()> save,
                 std::function<void(const std::vector<unsigned char>&)> load) {
    core_->add_blob({std::move(name), std::move(save), std::move(load)});
  }
  /// Calls `f` on every member after every reconfiguration (the first quorum included), after
  /// the state transfer: an adapter whose plan depends on the number of members starts afresh
  /// there.
  void on_change(std::function<void(const change&)> f) { core_->on_change(std::move(f)); }

  // ---- forming and joining ----

  /// Forms the first quorum with the other initial processes (each calls start()): the
  /// eligible ranks that reach it within the quorum timeout. Throws quorum_error when too few
  /// do.
  void start() { core_->start(); }
  /// Asks a running quorum to admit this process (new, or restarted in a lost rank's slot):
  /// returns once admitted, with the quorum's state in the registered blocks. Throws
  /// quorum_error after member_options::join_timeout.
  void join() { core_->join(); }

  // ---- syncs ----

  /// The quorum's communicator, for the adapters (stable: the same object across quorums).
  quorum_view<C>& view() noexcept { return view_; }

  /// Runs `body` (collectives on view()) as one sync of the quorum; `policy` says what a fault
  /// does to it (on_loss). `backup`: the blocks body
  /// changes that must be put back before a retry (the parameters of a model average); copied
  /// before the first run. On a fault: re-forms the quorum, then heals this member from one that
  /// committed the sync, or restores the backup and runs `body` again (on_loss::retry, up to
  /// member_options::max_attempts runs) or gives the sync up (on_loss::discard). Exceptions of
  /// body other than the quorum's faults end the sync on this member and are rethrown (the
  /// others see it leave); evicted_error and quorum_error come from the reconfiguration.
  template <class Body>
  sync_report transact(Body&& body, span<const buffer> backup = {}, on_loss policy = on_loss::retry) {
    core_->check_txn();
    sync_report report;
    if (core_->take_given_up_next()) {
      // Healed by members that had begun the sync after that one and gave it up: so does this
      // member, or its next sync would meet their next one (another sync of the application's).
      report.outcome = outcome::discarded;
      report.attempts = 0;
      report.committed = core_->committed();
      ++discarded_;
      return report;
    }
    saved_.resize(backup.size());
    for (std::size_t i = 0; i < backup.size(); ++i) {
      saved_[i].resize(backup[i].bytes);
      if (backup[i].bytes != 0) std::memcpy(saved_[i].data(), backup[i].data, backup[i].bytes);
    }
    auto restore = [&] {
      for (std::size_t i = 0; i < backup.size(); ++i)
        if (backup[i].bytes != 0) std::memcpy(backup[i].data, saved_[i].data(), backup[i].bytes);
    };
    for (int attempt = 1;; ++attempt) {
      report.attempts = attempt;
      bool ok = false;
      try {
        core_->begin_txn();
        body();
        ok = true;
      } catch (const sync_failed&) {
        // below
      } catch (const std::exception& e) {
        core_->leave(std::string("cadence::membership: the sync's body threw on this member: ") + e.what());
        throw;
      } catch (...) {
        core_->leave("cadence::membership: the sync's body threw on this member");
        throw;
      }
      if (ok && !core_->txn_failed()) {
        if (core_->end_txn()) {
          core_->reconfigure(detail::core<C>::mode::planned, {});
          ++report.reconfigurations;
        }
        report.outcome = outcome::committed;
        report.committed = core_->committed();
        return report;
      }
      const std::uint64_t before = core_->committed();
      // Whether this member gives the sync up unless healed: a member it streams the state to
      // in this reconfiguration (one sync behind it) gives up its next sync too.
      const bool gives_up = policy == on_loss::discard || attempt >= core_->options().max_attempts;
      const bool healed = core_->reconfigure(detail::core<C>::mode::failure, restore, gives_up);
      ++report.reconfigurations;
      report.committed = core_->committed();
      if (healed || core_->committed() > before) {
        report.outcome = outcome::healed;
        return report;
      }
      if (policy == on_loss::discard || attempt >= core_->options().max_attempts) {
        report.outcome = outcome::discarded;
        ++discarded_;
        return report;
      }
      ++retries_;
    }
  }
  /// transact() of `body` under `policy`, with the `backup` as a braced list:
  /// `m.transact(f, {params, moments})`.
  template <class Body>
  sync_report transact(Body&& body, std::initializer_list<buffer> backup, on_loss policy = on_loss::retry) {
    return transact(std::forward<Body>(body), span<const buffer>(backup.begin(), backup.size()), policy);
  }

  /// Ends this member's part in the job, after its last sync: one closing sync of the quorum
  /// that changes no state (an all-reduce of one value). A fault in the last sync can leave it
  /// committed on some members and failed on others (those that missed a lost peer's last
  /// message); the others are healed from a member that committed it only while that member
  /// still takes part, so a member that left right after its last commit would leave them to
  /// retry that sync without it, and the job would end with two states. Every member calls it
  /// once, after the same syncs, as any collective. A process admitted in the closing sync gets
  /// the state, without the admission's confirming collective (the members leave: one that
  /// completed it and left would leave the others to re-form alone). Returns the closing sync's
  /// report (committed() counts it); throws as transact() does.
  sync_report finish() {
    core_->closing();
    float closing = 0;
    return transact([&] { view_.allreduce(&closing, 1, transport::dtype::f32, transport::reduce_op::max); });
  }

  // ---- what it knows ----

  /// The quorum adopted last.
  const quorum& current() const noexcept { return core_->current(); }
  /// Syncs the quorum has committed.
  std::uint64_t committed() const noexcept { return core_->committed(); }
  /// This process's nonce (the quorum's name for it).
  std::uint64_t nonce() const noexcept { return core_->nonce(); }
  /// A hash (64-bit FNV-1a) of the registered state blocks: equal on every member after every
  /// sync (the tests and the chaos soak compare it).
  std::uint64_t state_hash() const noexcept { return core_->state_hash(); }
  /// Counts since start: reconfigurations, failed syncs, retries, the state streamed.
  member_stats stats() const noexcept {
    member_stats s = core_->stats();
    s.retries = retries_;
    s.discarded = discarded_;
    return s;
  }
  /// The options in force (eligible ranks filled in).
  const member_options& options() const noexcept { return core_->options(); }

private:
  std::unique_ptr<detail::core<C>> core_;
  quorum_view<C> view_;
  std::vector<std::vector<unsigned char>> saved_;
  std::uint64_t retries_ = 0, discarded_ = 0;
};

/// @}
}  // namespace cadence::membership
