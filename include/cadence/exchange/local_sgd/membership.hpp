/// \file
/// \ingroup exchange
/// DiLoCo on the fault-tolerant membership layer (membership::member): every outer sync a
/// transaction over the quorum's view, the global weights, outer state and counters carried by
/// the member, so a worker lost during an outer sync drops out of it and a joiner starts from
/// the current global weights and outer state.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/exchange/local_sgd/diloco.hpp>
#include <cadence/exchange/tensor_ref.hpp>
#include <cadence/membership/member.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// What a restart of a whole diloco_member job needs (diloco_member::checkpoint(), restore()):
/// the state every member holds alike after a committed sync. Not in it: this rank's local work
/// since that sync (a restored job starts from the global weights), the timed schedules' plan
/// (it warms up again, as after a reconfiguration) and a lossy codec's error-feedback residuals
/// (dropped, as at a reconfiguration).
struct diloco_checkpoint {
  /// The global weights, flat in the tensors' order.
  std::vector<float> global_weights;
  /// The outer optimizer's state: its state_slots() arrays of global_weights' length, end to end.
  std::vector<float> outer_state;
  /// Outer syncs committed (timed schedules: the outer steps).
  std::uint64_t syncs = 0;
  /// Outer steps applied, counted per fragment.
  std::uint64_t fragment_steps = 0;
  /// Contributions that came late (quorum schedule).
  std::uint64_t stale_contributions = 0;
  /// The largest staleness among them.
  std::int64_t max_staleness = 0;
  /// The fixed schedule's step clock at the last committed sync (0 with a timed schedule).
  std::uint64_t clock = 0;
  /// Each fragment's outer steps (the outer optimizer's step count t: Adam's bias correction).
  std::vector<std::uint64_t> fragment_outer_steps;
};

/// A diloco adapter run on a membership::member over communicator `C`, with outer optimizer
/// `O`. Use (every rank; a restarted or new process calls join() instead of start()):
///
///     membership::member<inproc_communicator> m(comm, member_opts);
///     diloco_member<inproc_communicator> dm(m, {w}, outer_nesterov{0.7f, 0.9f}, options);
///     restarted ? dm.join() : dm.start();      // not m.start(): the adapter is built after it
///     for (;;) {
///       inner_step(w);
///       if (dm.step_done(measured_us)) dm.sync();   // a transaction; retried on a new quorum
///     }
///
/// **What it registers** with the member (before start()/join(), so construct it first): the
/// global weights, the outer optimizer's state and the counters every rank shares (outer
/// steps, per-fragment steps, the fixed schedule's step clock). member::state_hash() covers
/// them: equal on every member after every commit.
///
/// **A sync** is member::transact() of the adapter's sync with on_loss::retry, its backup this
/// rank's local weights, the global weights, the outer state and every counter. When a member
/// is lost during it (in any collective, the all-reduce of the pseudo-gradients included) the
/// survivors re-form, restore the backup and run the sync again without it: the lost rank's
/// pseudo-gradient is dropped from that outer step, the survivors' pseudo-gradients (their
/// local work since the last sync) are kept. When another member had completed the sync, this
/// one receives its global weights, outer state and counters (outcome healed) and takes the
/// global weights as its local weights, as a joiner does.
///
/// **A reconfiguration** (member::on_change: a loss, or an admission after a commit) restarts
/// the schedule for the new number of members (the timed schedules warm up again; the fixed
/// one keeps its step clock), drops the error-feedback residuals, and keeps every rank's local
/// work. A joiner (join()) receives the state, takes the global weights as its local weights and
/// starts with the others' clock.
///
/// **Streaming** (fixed schedule, `fragments` F, `delay` D > 0: a fragment's exchange overlaps
/// the next D inner steps). At fragment f's send point sync() takes its pseudo-gradient (global
/// minus local weights over the fragment, as delay 0 does) and runs the fragment's sync (its
/// all-reduce, its outer step on the global weights and outer state, the counters) as a
/// transaction with on_loss::retry on one background thread, its backup that pseudo-gradient,
/// the fragment's global weights and outer state and the counters: a loss drops the lost
/// rank's pseudo-gradient and the survivors run the sync again from the backup, a joiner is
/// admitted and streamed the state by that thread. step_done() counts inner steps meanwhile
/// and returns true at the completion point (D steps later), where sync() joins the thread and
/// applies the outcome as delay 0 does: committed, the fragment's global weights mixed into
/// the local ones with alpha; healed, the global weights taken as the local ones; discarded,
/// nothing (the fragment's local work goes into its next exchange). The member runs one
/// transaction at a time, so D must not exceed the steps between two fragments' send points
/// (the least of them: H / F rounded down, or H with one fragment); a completion point that is
/// also a send point completes first. The timed schedules have no overlap (refused with D > 0,
/// as diloco does). **While an exchange is in flight** (in_flight(); from a send point to its
/// completion point) the member, the view and the adapter's global weights, outer state and
/// counters belong to that thread (the member's on_event and on_change callbacks run on it):
/// the owning thread calls only step_done(), due(), sync(), finish(), in_flight(), the
/// adapter's step counters (local_steps(), progress(), total_steps()) and the destructor, which
/// joins the thread (a fault that ends it is rethrown by the sync() or finish() that joins it;
/// the destructor drops it). The thread's start and join order what the two threads touch.
///
/// **An agreed stop** (a time budget, a target loss, SIGTERM from the scheduler: one rank
/// decides, every rank must call finish() after the same syncs, as member::finish() is a
/// collective of the quorum): request_stop() on any rank, from any thread, sets a flag that the
/// next outer sync's transaction carries (one i64 all-reduce, max, at the end of its body; the
/// flag also lives in the counters every member shares, so a healed member and a joiner
/// receive it). stop_agreed() is then true on every member after that same sync: the first
/// committed one whose transaction saw a request. A retried sync reads the flags again; a sync
/// given up everywhere agrees nothing (its backup puts the flag back) and the request goes into
/// the next one. A request of a rank lost before the sync that carries it commits is agreed
/// only when some survivor completed that sync (its flag was in the all-reduce): otherwise it
/// is lost with the rank; a survivor's request is always agreed. Streaming: the flag travels in
/// the fragment's transaction and is seen at its completion point (sync() there). Then every
/// rank leaves its loop and calls finish(). A checkpoint does not carry the stop.
///
/// **A restart of the whole job** (a maintenance window, a preemption): checkpoint() on any
/// member after a sync (nothing in flight) returns the global weights, the outer state and the
/// shared counters (diloco_checkpoint); in the new job, restore() it before start() on every
/// member. start() then broadcasts the first member's checkpoint (the first quorum's lowest
/// rank; the others must have restored the same one, or none) instead of its tensors: every
/// member begins with the checkpoint's global weights as its local and global weights, its
/// outer state and counters (the fixed schedule's clock too), as if the job had not stopped.
/// start() throws invalid_parameter_error on every member when some member restored a
/// checkpoint and the first did not (it would be dropped), or when the members restored
/// different checkpoints.
///
/// Limits: a lossy codec needs `options.tag + fragments` within the view's 256 user tags; every
/// sync of the member goes through this object (no other transact() on the same member).
template <class C, class O = any_outer_optimizer>
class diloco_member {
public:
  /// The communicator the adapter runs on: the quorum's view.
  using view_type = membership::quorum_view<C>;
  /// The adapter.
  using adapter_type = diloco<view_type, O>;

  /// Glue for member `m` (not started yet) and this rank's f32 `weights` (which, like `m`, must
  /// outlive it), with outer optimizer `outer` and `options` (as diloco's). Registers the
  /// state with `m` and a reconfiguration hook. Throws invalid_parameter_error for what the
  /// membership cannot carry (a delay with a timed schedule, at or above H, or above the steps
  /// between two fragments' send points; a lossy codec's tags beyond the view's; a tensor that
  /// is not f32), naming it.
  diloco_member(membership::member<C>& m, span<const tensor_ref> weights, O outer = O(), diloco_options options = {})
      : m_(&m), weights_(weights.begin(), weights.end()), outer_(std::move(outer)), options_(std::move(options)) {
    const std::string here = "cadence::exchange::diloco_member: ";
    if (options_.delay != 0) check_delay(here);
    if (codec_is_lossy(options_.codec) &&
        static_cast<std::size_t>(options_.tag) + options_.fragments > static_cast<std::size_t>(user_tags))
      throw invalid_parameter_error(here + "codec " + outer_codec_name(options_.codec) + " uses tags " +
                                    std::to_string(options_.tag) + ".." +
                                    std::to_string(static_cast<std::size_t>(options_.tag) + options_.fragments - 1) +
                                    "; the quorum view has " + std::to_string(user_tags) +
                                    " (set diloco_options::tag lower)");
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      if (weights_[i].type != transport::dtype::f32)
        throw invalid_parameter_error(here + "tensor " + std::to_string(i) + " is " +
                                      transport::dtype_name(weights_[i].type) + "; the outer state is f32");
      total_ += weights_[i].count;
    }
    global_.assign(total_, 0.0f);
    state_.assign(outer_.state_slots() * total_, 0.0f);
    shared_.assign(shared_head + std::max<std::size_t>(options_.fragments, 1), 0);
    local_.assign(local_words, 0);
    m.add_state(membership::buffer(global_));
    m.add_state(membership::buffer(state_));
    m.add_state(membership::buffer(shared_));
    m.on_change([this](const membership::change& c) { changed(c); });
  }
  /// The same (`m`, `weights` as a braced list, `outer`, `options`).
  diloco_member(membership::member<C>& m, std::initializer_list<tensor_ref> weights, O outer = O(),
                diloco_options options = {})
      : diloco_member(m, span<const tensor_ref>(weights.begin(), weights.size()), std::move(outer), std::move(options)) {}

  diloco_member(const diloco_member&) = delete;  // the member's hook holds `this`
  diloco_member& operator=(const diloco_member&) = delete;
  /// Joins a streaming fragment's thread still in flight (its outcome, or its fault, dropped).
  ~diloco_member() {
    if (worker_.joinable()) worker_.join();
  }

  /// Starts the member (member::start(), the first quorum) and builds the adapter in the first
  /// transaction: the first member's weights are broadcast into every member's tensors and
  /// global weights, and its outer state and counters (zero, or as restore() set them) into
  /// every member's. Throws the member's errors (quorum_error) and the adapter's
  /// (parse_error, invalid_parameter_error for bad options or tensors).
  void start() {
    m_->start();
    // Which checkpoints the members restored: each one's hash (a restore() is the first
    // member's, or its copy, or a mistake that would be dropped without a word).
    const std::int64_t mine = restored_ ? static_cast<std::int64_t>(registered_hash() >> 2) + 1 : 0;
    std::int64_t restored[2] = {0, 0};
    std::uint64_t from_checkpoint = 0;
    const membership::sync_report rep = m_->transact(
        [&] {
          if (restored_) global_into_tensors();  // the checkpoint's weights are what is broadcast
          adapter_.reset();
          adapter_.emplace(m_->view(), span<const tensor_ref>(weights_.data(), weights_.size()), outer_, options_,
                           diloco_start::fresh);
          std::copy(adapter_->global_.begin(), adapter_->global_.end(), global_.begin());
          // Whether the first member restored a checkpoint: then its outer state and counters too.
          const transport::deadline d(options_.timeout);
          from_checkpoint = restored_ ? 1 : 0;
          m_->view().broadcast(&from_checkpoint, sizeof from_checkpoint, 0, d);
          // The largest hash and (as hash_span minus it) the smallest, over those that restored.
          restored[0] = mine;
          restored[1] = restored_ ? hash_span - mine : 0;
          m_->view().allreduce(restored, 2, transport::dtype::i64, transport::reduce_op::max, d);
          if (from_checkpoint != 0) {
            if (!state_.empty()) m_->view().broadcast(state_.data(), state_.size() * 4, 0, d);
            m_->view().broadcast(shared_.data(), shared_.size() * 8, 0, d);
            std::copy(state_.begin(), state_.end(), adapter_->state_.begin());  // attach() keeps the adapter's
            load(true);  // the counters and the clock into the adapter
          } else {
            std::fill(state_.begin(), state_.end(), 0.0f);
          }
          publish();
        },
        {membership::buffer(global_), membership::buffer(state_), membership::buffer(shared_)});
    if (rep.outcome == membership::outcome::committed) {
      check_restored(from_checkpoint != 0, restored);
      attach();
      restart_schedule();  // the quorum may have admitted someone right after the commit
      publish();
    } else if (rep.outcome == membership::outcome::healed) {
      adapter_.reset();
      adopt();
    } else {
      throw membership::quorum_error("cadence::exchange::diloco_member: the first sync (the weights' broadcast) was "
                                     "given up after " + std::to_string(rep.attempts) + " attempts");
    }
  }

  /// Joins a running quorum (member::join(): a restarted or new process): returns once admitted,
  /// with the current global weights in this rank's tensors and the outer state and counters in
  /// the adapter. Throws membership::quorum_error after member_options::join_timeout.
  void join() {
    if (restored_)
      throw invalid_parameter_error("cadence::exchange::diloco_member: join() after restore(): a joiner takes the "
                                    "running job's state; restore a checkpoint before start() instead");
    m_->join();
    adopt();
  }

  /// This rank finished an inner step of `duration` (microseconds, or a std::chrono duration;
  /// diloco::step_done): returns whether sync() is due (streaming: at a send point, or at the
  /// completion point of the fragment in flight). Throws invalid_parameter_error as diloco's
  /// (a bad duration, or a sync() due and not called).
  template <class D>
  bool step_done(D duration) {
    adapter_type& a = adapter();
    if (lands_now())
      throw invalid_parameter_error("cadence::exchange::diloco_member: step_done() at fragment " +
                                    std::to_string(job_->fragment) + "'s completion point (step " +
                                    std::to_string(a.t_) + "): call sync() first");
    return a.step_done(duration) || lands_now();
  }

  /// Whether sync() is due now: diloco::due(), or the completion point of the streaming
  /// fragment in flight. Throws invalid_parameter_error before start() or join().
  bool due() {
    adapter_type& a = adapter();
    return a.due() || lands_now();
  }

  /// Whether a streaming fragment's exchange is in flight (between its send point and its
  /// completion point): the member and the adapter's global state belong to its thread then.
  bool in_flight() const noexcept { return job_.has_value(); }

  /// The adapter's outer_steps() as of the last point with nothing in flight (every member
  /// holds it alike there): with nothing in flight, the current count; streaming, the count
  /// after the fragment that last completed, even when each completion point sends the next
  /// fragment (delay = H / F) and the adapter is never idle at a sync() (the owning thread).
  /// Throws invalid_parameter_error before start() or join().
  std::uint64_t outer_steps() {
    adapter_type& a = adapter();
    return job_ ? settled_.outer_steps : a.outer_steps();
  }

  /// The outer sync due now, as a transaction of the quorum (see the class comment). Returns
  /// the member's report: committed (the outer step applied here), healed (received from a
  /// member that committed it; the local weights are the global ones) or discarded (every
  /// attempt failed: the local work is kept for the next sync). Streaming: the report of the
  /// fragment's transaction that this call completed, and attempts 0 from a call that only
  /// started one. Throws invalid_parameter_error when no sync is due, and the member's
  /// evicted_error and quorum_error (streaming: those of the transaction it completed).
  membership::sync_report sync() {
    adapter_type& a = adapter();
    if (!due())
      throw invalid_parameter_error("cadence::exchange::diloco_member: sync() before it is due (" +
                                    std::to_string(a.local_steps()) + " of " + std::to_string(a.planned()) +
                                    " inner steps done)");
    if (streaming()) return sync_streaming(a);
    publish();
    std::vector<membership::buffer> backup;
    for (const tensor_ref& t : weights_) backup.emplace_back(t.data, t.bytes());
    backup.emplace_back(a.global_);
    backup.emplace_back(a.state_);
    if (!a.anchor_.empty()) backup.emplace_back(a.anchor_);
    backup.emplace_back(shared_);
    backup.emplace_back(local_);
    bool first = true;
    const membership::sync_report rep = m_->transact(
        [&] {
          const span<const tensor_ref> w(weights_.data(), weights_.size());
          if (first || !a.schedule_.timed()) {
            // The fixed schedule's clock survives a reconfiguration, so sync() is due again.
            first = false;
            a.sync(w);
          } else {
            // A retry on a new quorum: the plan started again for its size; the sync is the
            // one this rank was due for, with the local work it had then.
            const transport::deadline d(a.options_.timeout);
            a.sync_timed(w, d);
            a.local_steps_ = 0;
          }
          agree_stop(transport::deadline(a.options_.timeout));
          publish();
        },
        span<const membership::buffer>(backup.data(), backup.size()), membership::on_loss::retry);
    if (rep.outcome == membership::outcome::discarded) {
      // Given up everywhere: the backup is back; carry the local work to the next sync.
      a.local_steps_ = 0;
      a.synced_at_ = a.t_;
      publish();
    }
    return rep;
  }

  /// After this rank's last outer sync: the member's closing sync (member::finish()), so that a
  /// last sync committed here but failed on others reaches them (healed) before this rank leaves.
  /// A streaming fragment in flight completes first (joined and applied as at its completion
  /// point). Every rank calls it once, after the same syncs. Throws as sync() does.
  membership::sync_report finish() {
    if (job_) (void)land();
    return m_->finish();
  }

  /// Asks the quorum to stop: the next outer sync's transaction carries this rank's request
  /// (see the class comment), after which stop_agreed() is true on every member. Any thread may
  /// call it, at any time (before start() too; an atomic flag, so a signal handler may where
  /// std::atomic<bool> is lock-free); it cannot be taken back, and a second call changes
  /// nothing. A request made while a sync runs goes into that sync if its transaction had not
  /// read the flag yet (streaming: the fragment's thread reads it at the end of its body),
  /// else into the next one.
  void request_stop() noexcept { requested_.store(true, std::memory_order_relaxed); }

  /// Whether this rank asked (request_stop()). Any thread.
  bool stop_requested() const noexcept { return requested_.load(std::memory_order_relaxed); }

  /// Whether the quorum agreed to stop: true on every member after the same committed outer
  /// sync, the first whose transaction saw a request (a healed member or a joiner receives it
  /// with the state), and from then on. Streaming: as of the last completion point (sync()
  /// there). Leave the training loop on it and call finish(). The owning thread.
  bool stop_agreed() const noexcept { return job_ ? settled_.stop : shared_[s_stop] != 0; }

  /// The adapter (its monitoring: outer_steps(), global_weights(), outer_state(), plan()).
  /// Throws invalid_parameter_error before start() or join().
  adapter_type& adapter() {
    if (!adapter_ || !attached_)
      throw invalid_parameter_error("cadence::exchange::diloco_member: the adapter is built by start() or join()");
    return *adapter_;
  }
  /// The member.
  membership::member<C>& member() noexcept { return *m_; }
  /// A hash (64-bit FNV-1a) of the global weights and the outer state: equal on every member
  /// after every commit. Throws invalid_parameter_error while a streaming fragment is in flight.
  std::uint64_t global_hash() {
    adapter_type& a = adapter();
    if (job_)
      throw invalid_parameter_error("cadence::exchange::diloco_member: global_hash() while fragment " +
                                    std::to_string(job_->fragment) + "'s exchange is in flight (it completes at step " +
                                    std::to_string(job_->started + options_.delay) + ")");
    return fnv1a(fnv1a(fnv_basis, a.global_.data(), a.global_.size() * sizeof(float)), a.state_.data(),
                 a.state_.size() * sizeof(float));
  }

  /// What a restart of the whole job needs (see the class comment), as of the last committed
  /// sync: equal on every member between two syncs. Throws invalid_parameter_error before
  /// start() or join() and while a streaming fragment is in flight (naming it).
  diloco_checkpoint checkpoint() {
    adapter_type& a = adapter();
    if (job_)
      throw invalid_parameter_error("cadence::exchange::diloco_member: checkpoint() while fragment " +
                                    std::to_string(job_->fragment) + "'s exchange is in flight (it completes at step " +
                                    std::to_string(job_->started + options_.delay) + "); take it after that sync()");
    diloco_checkpoint c;
    c.global_weights = a.global_;
    c.outer_state = a.state_;
    c.syncs = a.syncs_;
    c.fragment_steps = a.fragment_steps_;
    c.stale_contributions = a.stale_contributions_;
    c.max_staleness = a.max_staleness_;
    c.clock = a.schedule_.timed() ? 0 : a.synced_at_;
    for (const auto& fr : a.frags_) c.fragment_outer_steps.push_back(fr.steps);
    return c;
  }

  /// Sets checkpoint `c` (from checkpoint() of a job with the same model, outer optimizer and
  /// fragments) as the state start() begins from; call it before start() on every member (the
  /// first member's is the one broadcast; see the class comment). Its global weights go into
  /// this rank's tensors now and again at start(). Throws invalid_parameter_error after start()
  /// or join(), and for a checkpoint of other sizes, naming what differs.
  void restore(const diloco_checkpoint& c) {
    const std::string here = "cadence::exchange::diloco_member::restore: ";
    if (adapter_) throw invalid_parameter_error(here + "called after start() or join(); call it before start()");
    if (c.global_weights.size() != total_)
      throw invalid_parameter_error(here + "the checkpoint has " + std::to_string(c.global_weights.size()) +
                                    " global weights; this member's tensors hold " + std::to_string(total_) +
                                    " (another model?)");
    const std::size_t slots = outer_.state_slots();
    if (c.outer_state.size() != slots * total_)
      throw invalid_parameter_error(
          here + "the checkpoint's outer state has " + std::to_string(c.outer_state.size()) + " floats (" +
          (total_ == 0 || c.outer_state.size() % total_ != 0
               ? std::string("not a whole number of slots")
               : std::to_string(c.outer_state.size() / total_) + " state slots") +
          " of " + std::to_string(total_) + "); this outer optimizer has " + std::to_string(slots) +
          " (another outer optimizer?)");
    const std::size_t f = std::max<std::size_t>(options_.fragments, 1);
    if (c.fragment_outer_steps.size() != f)
      throw invalid_parameter_error(here + "the checkpoint has " + std::to_string(c.fragment_outer_steps.size()) +
                                    " fragments' step counts; this member's options have fragments=" +
                                    std::to_string(f));
    std::copy(c.global_weights.begin(), c.global_weights.end(), global_.begin());
    std::copy(c.outer_state.begin(), c.outer_state.end(), state_.begin());
    shared_[s_syncs] = c.syncs;
    shared_[s_fragment_steps] = c.fragment_steps;
    shared_[s_stale] = c.stale_contributions;
    shared_[s_max_staleness] = static_cast<std::uint64_t>(c.max_staleness);
    shared_[s_clock] = c.clock;
    for (std::size_t k = 0; k < f; ++k) shared_[shared_head + k] = c.fragment_outer_steps[k];
    global_into_tensors();
    restored_ = true;
  }

private:
  static constexpr int user_tags = 256;  // membership::detail::tags::user_tags
  static constexpr std::int64_t hash_span = (std::int64_t{1} << 62) + 2;  // start()'s restored-hash pair

  // 64-bit FNV-1a: `h` (fnv_basis to start) mixed with `bytes` bytes at `data`.
  static constexpr std::uint64_t fnv_basis = 1469598103934665603ull;
  static std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t bytes) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }

  // A hash of the registered blocks: what restore() set, before start().
  std::uint64_t registered_hash() const {
    std::uint64_t h = fnv1a(fnv_basis, global_.data(), global_.size() * sizeof(float));
    h = fnv1a(h, state_.data(), state_.size() * sizeof(float));
    return fnv1a(h, shared_.data(), shared_.size() * sizeof(std::uint64_t));
  }

  // After the first sync: a checkpoint restored by some member and not by the first (it would
  // be dropped), or different checkpoints restored, end start() on every member alike.
  void check_restored(bool first_restored, const std::int64_t (&restored)[2]) const {
    const std::string here = "cadence::exchange::diloco_member::start: ";
    if (restored[0] == 0) return;  // nobody restored
    if (!first_restored)
      throw invalid_parameter_error(here + "a member restored a checkpoint but the first member (rank " +
                                    std::to_string(m_->current().leader()) +
                                    ") did not, so the job would start from its tensors and drop the checkpoint: "
                                    "restore() it on every member, or on the first one");
    if (restored[0] != hash_span - restored[1])
      throw invalid_parameter_error(here + "the members restored different checkpoints (their hashes differ): "
                                    "restore() the same checkpoint on every member, or on the first one only");
  }
  // Inside a sync's body (on the thread that runs it): the quorum's stop flag, the largest of
  // every member's request and the flag already agreed, into shared_ (the body's backup holds
  // it, so a retry or a sync given up puts it back).
  void agree_stop(const transport::deadline& d) {
    std::int64_t flag = shared_[s_stop] != 0 || requested_.load(std::memory_order_relaxed) ? 1 : 0;
    m_->view().allreduce(&flag, 1, transport::dtype::i64, transport::reduce_op::max, d);
    shared_[s_stop] = flag != 0 ? 1 : 0;
  }

  // shared_: what every member holds alike (registered, hashed, streamed). s_stop: the agreed
  // stop (0 or 1; not in a checkpoint).
  enum : std::size_t { s_syncs, s_fragment_steps, s_stale, s_max_staleness, s_clock, s_stop, shared_head };
  // local_: this rank's own counters (in the backup only).
  enum : std::size_t { l_t, l_synced_at, l_progress, l_carried, l_local_steps, l_record_bytes, local_words };

  // The adapter's counters into shared_ and local_.
  void publish() {
    if (!adapter_) return;
    adapter_type& a = *adapter_;
    shared_[s_syncs] = a.syncs_;
    shared_[s_fragment_steps] = a.fragment_steps_;
    shared_[s_stale] = a.stale_contributions_;
    shared_[s_max_staleness] = static_cast<std::uint64_t>(a.max_staleness_);
    // The fixed schedule's clock at the last committed sync (a donor may be past it, at its
    // next sync point); timed schedules: 0 (each rank counts its own steps).
    shared_[s_clock] = a.schedule_.timed() ? 0 : a.synced_at_;
    for (std::size_t f = 0; f < a.frags_.size(); ++f) shared_[shared_head + f] = a.frags_[f].steps;
    local_[l_t] = static_cast<std::int64_t>(a.t_);
    local_[l_synced_at] = static_cast<std::int64_t>(a.synced_at_);
    local_[l_progress] = a.progress_;
    local_[l_carried] = a.carried_;
    local_[l_local_steps] = a.local_steps_;
    local_[l_record_bytes] = static_cast<std::int64_t>(a.record_bytes_);
  }

  // The counters every member shares (shared_) into the adapter.
  void load_shared() {
    adapter_type& a = *adapter_;
    a.syncs_ = shared_[s_syncs];
    a.fragment_steps_ = shared_[s_fragment_steps];
    a.stale_contributions_ = shared_[s_stale];
    a.max_staleness_ = static_cast<std::int64_t>(shared_[s_max_staleness]);
    for (std::size_t f = 0; f < a.frags_.size(); ++f) a.frags_[f].steps = shared_[shared_head + f];
  }

  // The global weights become this rank's local weights, with no local work since.
  void take_global() {
    adapter_type& a = *adapter_;
    a.pieces(span<const tensor_ref>(weights_.data(), weights_.size()), 0, a.total_,
             [&](float* p, std::size_t at, std::size_t n) { std::memcpy(p, a.global_.data() + at, n * 4); });
    if (!a.anchor_.empty()) a.anchor_ = a.global_;
    a.progress_ = 0;
    a.carried_ = 0;
    a.local_steps_ = 0;
  }

  // shared_ (and, unless `fresh`, local_) into the adapter.
  void load(bool fresh) {
    adapter_type& a = *adapter_;
    load_shared();
    if (fresh) {
      // New, or behind: start from the global weights with the others' clock.
      take_global();
      if (!a.schedule_.timed()) a.t_ = shared_[s_clock];
      a.synced_at_ = a.t_;
    } else {
      a.t_ = static_cast<std::uint64_t>(local_[l_t]);
      a.synced_at_ = static_cast<std::uint64_t>(local_[l_synced_at]);
      a.progress_ = local_[l_progress];
      a.carried_ = local_[l_carried];
      a.local_steps_ = local_[l_local_steps];
      a.record_bytes_ = static_cast<std::uint64_t>(local_[l_record_bytes]);
    }
  }

  // ---- streaming: one fragment's transaction on worker_ ----

  bool streaming() const noexcept { return options_.delay != 0; }

  // Whether the fragment in flight completes at this step.
  bool lands_now() const noexcept { return job_ && job_->started + options_.delay == adapter_->t_; }

  // The constructor's checks of a delay: the fixed schedule, and at most the fewest steps
  // between two send points (one transaction at a time).
  void check_delay(const std::string& here) {
    std::optional<outer_schedule> s;
    try {
      s.emplace(options_.schedule, 1, options_.history);
    } catch (const error&) {
      return;  // start() builds the adapter, which names what is wrong with the schedule
    }
    check_diloco_options(options_, *s, here);
    const std::size_t h = s->period(), f = options_.fragments;
    std::vector<std::size_t> at;
    for (std::size_t k = 0; k < f; ++k) at.push_back((k + 1) * h / f % h);
    std::sort(at.begin(), at.end());
    std::size_t gap = at.front() + h - at.back();
    for (std::size_t k = 1; k < f; ++k) gap = std::min(gap, at[k] - at[k - 1]);
    if (options_.delay > gap)
      throw invalid_parameter_error(here + "delay=" + std::to_string(options_.delay) + " with fragments=" +
                                    std::to_string(f) + " and H = " + std::to_string(h) +
                                    ": fragments are sent as few as " + std::to_string(gap) +
                                    " steps apart and the member runs one exchange at a time; use delay <= " +
                                    std::to_string(gap));
  }

  // sync() with delay > 0 (fixed schedule): the fragment that completes now, then the one sent
  // now (as diloco::sync_fixed orders them).
  membership::sync_report sync_streaming(adapter_type& a) {
    membership::sync_report rep;
    rep.attempts = 0;
    if (lands_now()) rep = land();
    a.synced_at_ = a.t_;
    a.progress_ = 0;
    a.local_steps_ = 0;
    publish();  // the clock a joiner admitted by the next transaction starts from
    for (std::size_t f = 0; f < a.frags_.size(); ++f)
      if (a.sends_at(f, a.t_)) {
        if (job_) rep = land();  // only after a reconfiguration moved a clock
        settled_ = {a.outer_steps(), shared_[s_stop] != 0};  // nothing in flight: read while it is
        send(f);
      }
    return rep;
  }

  // Fragment f's pseudo-gradient now, and its transaction on worker_.
  void send(std::size_t f) {
    adapter_type& a = *adapter_;
    a.contribute(f, span<const tensor_ref>(weights_.data(), weights_.size()), 1.0f);
    job_.emplace();
    job_->fragment = f;
    job_->started = a.t_;
    try {
      worker_ = std::thread([this, f] { run(f); });
    } catch (...) {
      job_.reset();
      throw;
    }
  }

  // worker_'s body: fragment f's sync as a transaction (the adapter's launch, wait and outer
  // step, as its complete() without the mixing), retried from the backup after a loss.
  void run(std::size_t f) {
    try {
      adapter_type& a = *adapter_;
      const std::size_t lo = a.frag_first_[f], n = a.frag_first_[f + 1] - lo;
      std::vector<membership::buffer> backup;
      backup.emplace_back(a.contrib_.data() + lo, n * 4);
      backup.emplace_back(a.global_.data() + lo, n * 4);
      for (std::size_t k = 0; k < a.outer_.state_slots(); ++k)
        backup.emplace_back(a.state_.data() + k * a.total_ + lo, n * 4);
      backup.emplace_back(shared_);
      job_->report = m_->transact(
          [&] {
            const transport::deadline d(a.options_.timeout);
            a.launch(f, static_cast<double>(a.comm_->size()), d);
            a.frags_[f].exchange.wait(d);
            a.outer_step(f);
            shared_[s_fragment_steps] = a.fragment_steps_;
            shared_[shared_head + f] = a.frags_[f].steps;
            agree_stop(d);
          },
          span<const membership::buffer>(backup.data(), backup.size()), membership::on_loss::retry);
    } catch (...) {
      job_->error = std::current_exception();
    }
  }

  // The completion point (or finish()): joins worker_ and applies its outcome on this thread.
  membership::sync_report land() {
    worker_.join();
    const job done = std::move(*job_);
    job_.reset();
    adapter_type& a = *adapter_;
    const bool healed = deferred_healed_;
    if (deferred_) restart_schedule();
    deferred_ = deferred_healed_ = false;
    if (!done.error && (healed || done.report.outcome == membership::outcome::healed)) {
      take_global();  // received from a member that committed it
    } else if (!done.error && done.report.outcome == membership::outcome::committed) {
      a.mix(done.fragment, span<const tensor_ref>(weights_.data(), weights_.size()));
    }
    publish();
    if (done.error) std::rethrow_exception(done.error);
    return done.report;
  }

  // The quorum changed while worker_ runs a fragment's transaction (on worker_): the counters
  // every member shares as the backup or the donor left them, no exchange or residual; the
  // schedule and the local weights wait for land() (this rank's thread uses them meanwhile).
  void changed_in_flight(const membership::change& c) {
    adapter_type& a = *adapter_;
    load_shared();
    for (auto& fr : a.frags_) fr.exchange.drop();
    if (!a.residual_.empty()) std::fill(a.residual_.begin(), a.residual_.end(), 0.0f);
    deferred_ = true;
    deferred_healed_ = deferred_healed_ || c.healed;
  }

  // The quorum changed: the schedule for its size, nothing in flight, no residuals.
  void restart_schedule() {
    adapter_type& a = *adapter_;
    for (auto& fr : a.frags_) {
      fr.exchange.drop();
      fr.in_flight = false;
    }
    if (!a.residual_.empty()) std::fill(a.residual_.begin(), a.residual_.end(), 0.0f);
    a.schedule_ = adapter_type::make_schedule(m_->view(), a.options_);
    a.plan_ = a.schedule_.first_plan();
  }

  // After the first sync committed: the adapter's global weights and outer state become the
  // registered blocks (the member streams and backs up those very arrays from now on).
  void attach() {
    adapter_type& a = *adapter_;
    std::copy(a.global_.begin(), a.global_.end(), global_.begin());
    std::copy(a.state_.begin(), a.state_.end(), state_.begin());
    a.global_.swap(global_);
    a.state_.swap(state_);
    std::vector<float>().swap(global_);
    std::vector<float>().swap(state_);
    attached_ = true;
  }

  // Before attach(): the registered global weights into this rank's tensors.
  void global_into_tensors() {
    std::size_t at = 0;
    for (const tensor_ref& t : weights_) {
      if (t.count != 0) std::memcpy(t.data, global_.data() + at, t.count * 4);
      at += t.count;
    }
  }

  // A joiner, or a member healed during start(): the received state into a new adapter.
  void adopt() {
    global_into_tensors();
    adapter_.emplace(m_->view(), span<const tensor_ref>(weights_.data(), weights_.size()), outer_, options_,
                     diloco_start::adopt);
    adapter_type& a = *adapter_;
    std::vector<float> received_state = state_;
    attach();
    std::copy(received_state.begin(), received_state.end(), a.state_.begin());
    load(true);
    restart_schedule();
    publish();
  }

  void changed(const membership::change& c) {
    if (!adapter_ || !attached_) return;  // start() and join() set the adapter up themselves
    if (job_) {
      changed_in_flight(c);
      return;
    }
    load(c.healed);
    restart_schedule();
    publish();
  }

  membership::member<C>* m_;
  std::vector<tensor_ref> weights_;
  O outer_;
  diloco_options options_;
  std::size_t total_ = 0;
  std::optional<adapter_type> adapter_;
  bool attached_ = false;
  bool restored_ = false;  // restore() set global_, state_ and shared_ for start()
  // Before attach(): the registered blocks themselves; after it, the adapter owns them.
  std::vector<float> global_, state_;
  std::vector<std::uint64_t> shared_;
  std::vector<std::int64_t> local_;
  // Streaming: the fragment in flight (set and cleared on this rank's thread, around worker_;
  // worker_ writes its report or error), and a reconfiguration worker_ saw, for land().
  struct job {
    std::size_t fragment = 0;
    std::uint64_t started = 0;  // the step of its send point
    membership::sync_report report;
    std::exception_ptr error;
  };
  std::optional<job> job_;
  std::thread worker_;
  bool deferred_ = false, deferred_healed_ = false;
  // The stop this rank asked for (request_stop(): any thread).
  std::atomic<bool> requested_{false};
  // outer_steps() and stop_agreed() while a fragment is in flight (the counters belong to its
  // thread then): as they stood at its send point, after the fragment before it completed.
  struct {
    std::uint64_t outer_steps = 0;
    bool stop = false;
  } settled_;
};

/// @}
}  // namespace cadence::exchange
