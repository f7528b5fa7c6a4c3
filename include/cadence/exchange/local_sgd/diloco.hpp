/// \file
/// \ingroup exchange
/// The local-SGD family over any communicator: DiLoCo's outer optimizer on pseudo-gradients
/// (global minus local weights), streaming fragments whose exchange overlaps inner steps,
/// compressed outer gradients with error feedback, and the sync schedule taken from a policy
/// (fixed H, ElasticBSP's barriers, DSSP's bounded lag, a K-of-M quorum with a grace window).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/exchange/detail/tensor.hpp>
#include <cadence/exchange/local_sgd/codec.hpp>
#include <cadence/exchange/local_sgd/detail/coded_allreduce.hpp>
#include <cadence/exchange/local_sgd/options.hpp>
#include <cadence/exchange/local_sgd/outer_optimizer.hpp>
#include <cadence/exchange/local_sgd/schedule.hpp>
#include <cadence/exchange/tensor_ref.hpp>
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// How a diloco adapter starts: with rank 0's weights (every rank of a new job), or as a rank
/// joining a running job, which takes the current global weights and outer state from the
/// others (who call rebind() at the same time).
enum class diloco_start : std::uint8_t {
  fresh,  ///< broadcast rank 0's weights into every rank's tensors and global copy
  join,   ///< take the global weights and outer state from the ranks already running
  /// No communication: this rank's weights are taken as the global weights as they are (the
  /// outer state starts at zero). The caller guarantees they are identical on every rank, as
  /// the membership layer's state transfer does (diloco_member, local_sgd/membership.hpp).
  adopt,
};

template <class C, class O>
class diloco_member;

/// DiLoCo over a communicator (arXiv 2311.08105), with Streaming DiLoCo's fragments, overlap
/// and mixing (2501.18512), compressed outer gradients, and the sync schedule as a policy.
///
/// Every rank keeps the global (outer) weights, identical on every rank, and the outer
/// optimizer's state; between syncs it runs inner steps on its own tensors without
/// communicating. At a sync the ranks sum their weighted pseudo-gradients (global minus local;
/// one all-reduce, or a coded ring for bf16/fp16/int8/int4), every rank applies the same outer
/// step to its global copy, and the contributing ranks take the result as their new local
/// weights. Use:
///
///     diloco<C> outer(comm, {weights}, outer_nesterov{0.7f, 0.9f}, options);  // collective
///     for (;;) {
///       inner_step(weights);                               // the inner optimizer's step
///       if (outer.step_done(measured_us)) outer.sync(weights);
///     }
///
/// **Fixed schedule** ("fixed:<H>"): every rank runs H inner steps per outer step; with F
/// fragments, fragment f starts its exchange at steps t = (f + 1) H / F (mod H) and, `delay`
/// steps later, its outer step is applied and mixed into the local weights with alpha; the
/// exchange runs meanwhile (asynchronous operations; step_done() and poll() move it on).
/// **Timed schedules** ("elastic:", "lag:", "quorum:"): each sync first all-gathers a small
/// record per rank (its steps, staleness, plan hash and latest step durations); every rank
/// computes the next plan from them (outer_schedule) and checks that all followed the same.
/// Under a quorum a late rank joins the sync without a pseudo-gradient and keeps its local work
/// for a later sync, where it counts with weight steps / (1 + staleness) (docs/contract.md).
///
/// Guarantees: every rank issues the same collectives in the same order on every sync (the
/// plan only changes how many inner steps come between them), so a rank that disagrees fails
/// the hash check (transport_error on every rank) instead of hanging; the global weights stay
/// identical on every rank (they are updated from identical bytes by the same code); a stalled
/// rank makes the others throw transport_error naming it within `timeout`.
///
/// **Error feedback** (lossy codecs, on by default) lives in the coded ring: every encoding a
/// rank makes (its own part, the partial sums it passes on, the segment it owns) adds what its
/// previous encoding at that place lost, so the outer steps' sum tracks the exact one.
///
/// **Membership** (the seam for a fault-tolerant layer): sync() changes nothing of the
/// adapter's state until its collectives have succeeded, except the error-feedback residual;
/// after a transport_error the surviving ranks form a new communicator and call rebind(), a
/// rank that joins constructs with diloco_start::join at the same time, and the ranks agree on
/// the most advanced global state: the lost rank's contribution to the failed sync is dropped,
/// a joiner starts from the current global weights and outer state. On the membership layer
/// (membership::member, a quorum that re-forms by itself) use diloco_member instead
/// (local_sgd/membership.hpp): each sync a transaction, the state carried by the member.
///
/// Tensors are f32 in host memory (the outer state and the wire are f32); every sync passes
/// the same tensors, in the same order and sizes, as the constructor.
template <class C, class O = any_outer_optimizer>
class diloco : public detail::tensor_sync<diloco<C, O>> {
  CADENCE_REQUIRE_COMMUNICATOR(C);
  static_assert(is_outer_optimizer_v<O>,
                "cadence::exchange::diloco<C, O>: O must model the outer optimizer concept (see "
                "cadence/exchange/local_sgd/outer_optimizer.hpp)");

public:
  /// Most microseconds one step may take (about 12.7 days), as elastic_averager.
  static constexpr std::int64_t max_duration_us = std::int64_t{1} << 40;

  /// An adapter over `comm` for the f32 `weights`, with outer optimizer `outer` and `options`,
  /// starting as `start` says. A collective: with diloco_start::fresh, rank 0's weights are broadcast into every rank's
  /// tensors and global copy; with diloco_start::join the ranks already running call rebind()
  /// meanwhile; diloco_start::adopt does not communicate. Throws parse_error or invalid_parameter_error for a bad schedule, option or
  /// tensor, naming this rank.
  diloco(C& comm, span<const tensor_ref> weights, O outer = O(), diloco_options options = {},
         diloco_start start = diloco_start::fresh)
      : comm_(&comm), options_(std::move(options)), outer_(std::move(outer)),
        schedule_(make_schedule(comm, options_)) {
    check_diloco_options(options_, schedule_, here());
    if (comm.capabilities().device_buffers)
      throw invalid_parameter_error(here() + "device communicators are not supported; the outer state lives in "
                                    "host memory");
    if constexpr (!transport::has_async_v<C>) {
      if (codec_is_lossy(options_.codec))
        throw invalid_parameter_error(here() + "codec " + outer_codec_name(options_.codec) +
                                      " needs a communicator with asynchronous operations (isend, irecv)");
    }
    for (std::size_t i = 0; i < weights.size(); ++i) {
      detail::check_tensor("diloco", comm.rank(), comm.size(), weights[i], i);
      if (weights[i].type != transport::dtype::f32)
        throw invalid_parameter_error(here() + "tensor " + std::to_string(i) + " is " +
                                      transport::dtype_name(weights[i].type) + "; the outer state is f32");
      counts_.push_back(weights[i].count);
      total_ += weights[i].count;
    }
    const std::size_t f = options_.fragments;
    for (std::size_t k = 0; k <= f; ++k) frag_first_.push_back(total_ * k / f);
    global_.assign(total_, 0.0f);
    state_.assign(outer_.state_slots() * total_, 0.0f);
    contrib_.assign(total_, 0.0f);
    if (codec_is_lossy(options_.codec)) {
      sum_.assign(total_, 0.0f);
      if (options_.error_feedback) residual_.assign(total_, 0.0f);
    }
    if (schedule_.kind() == schedule_kind::quorum) anchor_.assign(total_, 0.0f);
    frags_.resize(f);
    ring_.assign(options_.history, 0);
    plan_ = schedule_.first_plan();
    if (start == diloco_start::join) {
      rejoin(weights, true);
    } else if (start == diloco_start::adopt) {
      gather_into(weights, global_.data());
      if (!anchor_.empty()) anchor_ = global_;
    } else {
      const transport::deadline d(options_.timeout);
      for (std::size_t i = 0; i < weights.size(); ++i)
        if (weights[i].count != 0) comm.broadcast(weights[i].data, weights[i].bytes(), 0, d);
      gather_into(weights, global_.data());
      if (!anchor_.empty()) anchor_ = global_;
    }
  }
  /// The same (`comm`, `weights` as a braced list, `outer`, `options`, `start`).
  diloco(C& comm, std::initializer_list<tensor_ref> weights, O outer = O(), diloco_options options = {},
         diloco_start start = diloco_start::fresh)
      : diloco(comm, span<const tensor_ref>(weights.begin(), weights.size()), std::move(outer), std::move(options),
               start) {}

  /// This rank finished an inner step of `duration_us` microseconds (its own clock, compute
  /// only); moves exchanges in flight on. Returns true when sync() is due now. Throws
  /// invalid_parameter_error for a duration outside [1, max_duration_us] or when a sync() is
  /// already due.
  bool step_done(std::int64_t duration_us) {
    if (due())
      throw invalid_parameter_error(here() + "step_done() after the step that made sync() due: call sync() first (" +
                                    std::to_string(local_steps_) + " inner steps since the last sync)");
    if (duration_us <= 0 || duration_us > max_duration_us)
      throw invalid_parameter_error(here() + "step duration " + std::to_string(duration_us) + " us is not in [1, " +
                                    std::to_string(max_duration_us) + "]");
    ring_[recorded_ % ring_.size()] = duration_us;
    ++recorded_;
    ++local_steps_;
    ++progress_;
    ++t_;
    ++total_steps_;
    poll();
    return due();
  }
  /// step_done() with the step's duration `d` as a std::chrono duration (rounded up to whole
  /// microseconds, at least 1).
  template <class Rep, class Period>
  bool step_done(std::chrono::duration<Rep, Period> d) {
    const auto us = std::chrono::ceil<std::chrono::microseconds>(d).count();
    return step_done(static_cast<std::int64_t>(us < 1 ? 1 : us));
  }

  /// Whether this rank must call sync() now.
  bool due() const noexcept {
    if (schedule_.timed()) return local_steps_ >= planned();
    if (synced_at_ == t_ || t_ == 0) return false;
    for (std::size_t f = 0; f < frags_.size(); ++f)
      if (sends_at(f, t_) || (frags_[f].in_flight && frags_[f].started + options_.delay == t_)) return true;
    return false;
  }

  /// Moves exchanges in flight on without blocking (step_done() does it too; a trainer whose
  /// steps leave the host thread idle may call it meanwhile). Throws transport_error.
  void poll() {
    for (auto& fr : frags_)
      if (fr.in_flight) (void)fr.exchange.progress();
  }

  // sync({a, b}) and sync(a, b, ...) call the form below.
  using detail::tensor_sync<diloco>::sync;
  /// The outer sync due now, with this rank's current local weights `weights` (the tensors of
  /// the constructor): fixed schedule, the fragments whose exchange starts now or whose delay
  /// ends now; timed schedules, the record exchange, the whole model's exchange, the outer
  /// step and the next plan. Throws invalid_parameter_error, before communicating, when no sync
  /// is due or the tensors differ from the constructor's; transport_error when a peer fails,
  /// stalls or followed another plan.
  void sync(span<const tensor_ref> weights) {
    if (!due())
      throw invalid_parameter_error(here() + "sync() before it is due: " + std::to_string(local_steps_) + " of " +
                                    std::to_string(planned()) + " inner steps done");
    check_layout(weights);
    const transport::deadline d(options_.timeout);
    if (schedule_.timed())
      sync_timed(weights, d);
    else
      sync_fixed(weights, d);
    local_steps_ = 0;
  }

  /// Completes every fragment exchange in flight and applies its outer step (the end of
  /// training, so that the global weights hold everything sent). A collective: every rank calls
  /// it after the same inner step.
  void finish(span<const tensor_ref> weights) {
    check_layout(weights);
    const transport::deadline d(options_.timeout);
    for (std::size_t f = 0; f < frags_.size(); ++f)
      if (frags_[f].in_flight) complete(f, weights, d);
  }

  /// finish() with the tensors `weights` as a braced list.
  void finish(std::initializer_list<tensor_ref> weights) {
    finish(span<const tensor_ref>(weights.begin(), weights.size()));
  }

  /// The membership seam: after a failure, every member of the new communicator `comm` calls
  /// this (and a joiner constructs with diloco_start::join) at the same time. A collective:
  /// the ranks agree on the most advanced global weights and outer state (the lowest rank that
  /// committed the most syncs broadcasts them); a rank at that state keeps its local weights
  /// and the work behind them, any other rank (behind it, or `joiner`) takes the global
  /// weights. Exchanges in flight are dropped (their fragments start again at their next
  /// step), error-feedback residuals are cleared, and the schedule restarts for the new size
  /// (warm-up). `weights` are this rank's tensors, as always.
  void rebind(C& comm, span<const tensor_ref> weights) {
    comm_ = &comm;  // first: the old one may be gone
    check_layout(weights);
    schedule_ = make_schedule(comm, options_);
    check_diloco_options(options_, schedule_, here());
    rejoin(weights, false);
  }

  // ---- what it did ----

  /// The plan in force (timed schedules; fixed: H steps for every rank).
  const outer_plan& plan() const noexcept { return plan_; }
  /// Inner steps this rank runs before its next sync.
  std::int64_t planned() const noexcept {
    if (!schedule_.timed()) return static_cast<std::int64_t>(schedule_.period());
    return plan_.steps[static_cast<std::size_t>(comm_->rank())];
  }
  /// Inner steps since the last sync; since its local weights last took the global ones.
  std::int64_t local_steps() const noexcept { return local_steps_; }
  /// Inner steps behind this rank's next pseudo-gradient.
  std::int64_t progress() const noexcept { return progress_; }
  /// Inner steps since construction.
  std::uint64_t total_steps() const noexcept { return total_steps_; }
  /// Outer steps applied to the whole model (timed) or to every fragment (fixed: fragment
  /// steps / fragments, rounded down).
  std::uint64_t outer_steps() const noexcept {
    if (schedule_.timed()) return syncs_;
    return fragment_steps_ / frags_.size();
  }
  /// Outer steps applied to one fragment or more, counted per fragment.
  std::uint64_t fragment_steps() const noexcept { return fragment_steps_; }
  /// Bytes this rank sent in syncs: the pseudo-gradients (f32: a ring all-reduce's 2 (n - 1) / n
  /// of the bytes, whatever the backend's algorithm; coded: exactly what the ring sent) and the
  /// records (counted as a ring all-reduce of the n records).
  std::uint64_t bytes_sent() const noexcept {
    std::uint64_t b = record_bytes_;
    for (const auto& fr : frags_) b += fr.exchange.bytes_sent();
    return b;
  }
  /// Contributions that came with staleness > 0 (a quorum's late ranks), over all ranks.
  std::uint64_t stale_contributions() const noexcept { return stale_contributions_; }
  /// The largest staleness a contribution came with, over all ranks.
  std::int64_t max_staleness() const noexcept { return max_staleness_; }
  /// The global weights (the outer model), identical on every rank, flat in the tensors' order.
  span<const float> global_weights() const noexcept { return span<const float>(global_.data(), global_.size()); }
  /// The outer optimizer's state, state_slots() arrays of the global weights' length, end to
  /// end.
  span<const float> outer_state() const noexcept { return span<const float>(state_.data(), state_.size()); }
  /// The sync schedule.
  const outer_schedule& schedule() const noexcept { return schedule_; }
  /// The options in force.
  const diloco_options& options() const noexcept { return options_; }
  /// The outer optimizer.
  const O& outer_optimizer() const noexcept { return outer_; }
  /// The config string: parse_diloco_config(config()) gives these options back.
  std::string config() const {
    diloco_options o = options_;
    o.schedule = schedule_.config();
    return diloco_config_string(o, outer_.name());
  }

private:
  template <class, class>
  friend class diloco_member;  // the membership layer's glue: carries and restores the state below

  // ---- state ----
  // comm_, options_, outer_, schedule_: configuration (rebind() replaces comm_ and schedule_).
  // counts_, total_, frag_first_: the tensors' layout and the fragments' element ranges.
  // global_, state_: the outer model and optimizer state (identical on every rank).
  // anchor_ (quorum only): the global weights this rank's local work started from.
  // contrib_, sum_, residual_: the weighted pseudo-gradient sent, the sum received (coded
  //   codecs; f32 sums in place), the error-feedback residual of each element's encoding.
  // frags_: per fragment, its exchange, whether in flight, the step it started, its steps.
  // t_, synced_at_: inner steps since the start (fixed schedule), the step last synced.
  // plan_, local_steps_, progress_, carried_, ring_, recorded_, records_: the timed path.
  struct fragment {
    detail::coded_allreduce<C> exchange;
    bool in_flight = false;
    std::uint64_t started = 0;
    std::uint64_t steps = 0;  // outer steps applied to it
    double divisor = 1;       // the sum of the weights: the mean is the sum over it
  };

  std::string here() const { return detail::where("diloco", comm_->rank(), comm_->size()); }

  static outer_schedule make_schedule(const C& comm, const diloco_options& o) {
    try {
      return outer_schedule(o.schedule, static_cast<std::size_t>(comm.size()), o.history);
    } catch (const parse_error& e) {
      throw parse_error(detail::where("diloco", comm.rank(), comm.size()) + e.what());
    } catch (const invalid_parameter_error& e) {
      throw invalid_parameter_error(detail::where("diloco", comm.rank(), comm.size()) + e.what());
    }
  }

  void check_layout(span<const tensor_ref> weights) const {
    if (weights.size() != counts_.size())
      throw invalid_parameter_error(here() + "got " + std::to_string(weights.size()) + " tensors, the constructor " +
                                    std::to_string(counts_.size()));
    for (std::size_t i = 0; i < weights.size(); ++i) {
      detail::check_tensor("diloco", comm_->rank(), comm_->size(), weights[i], i);
      if (weights[i].type != transport::dtype::f32 || weights[i].count != counts_[i])
        throw invalid_parameter_error(here() + "tensor " + std::to_string(i) + " has " +
                                      std::to_string(weights[i].count) + " " + transport::dtype_name(weights[i].type) +
                                      " elements, the constructor's " + std::to_string(counts_[i]) + " f32");
    }
  }

  // Calls fn(p, at, n) for the pieces of the tensors covering flat elements [a, b): p the first
  // local element, at its flat index.
  template <class F>
  static void pieces(span<const tensor_ref> weights, std::size_t a, std::size_t b, F&& fn) {
    std::size_t base = 0;
    for (const tensor_ref& t : weights) {
      const std::size_t lo = std::max(a, base), hi = std::min(b, base + t.count);
      if (lo < hi) fn(static_cast<float*>(t.data) + (lo - base), lo, hi - lo);
      base += t.count;
      if (base >= b) break;
    }
  }
  void gather_into(span<const tensor_ref> weights, float* out) const {
    pieces(weights, 0, total_, [&](float* p, std::size_t at, std::size_t n) { std::memcpy(out + at, p, n * 4); });
  }

  bool sends_at(std::size_t f, std::uint64_t t) const noexcept {
    const std::uint64_t h = schedule_.period();
    const std::uint64_t off = (f + 1) * h / frags_.size() % h;
    return t % h == off;
  }

  // ---- the fixed schedule: fragments start and complete by step count ----

  void sync_fixed(span<const tensor_ref> weights, const transport::deadline& d) {
    for (std::size_t f = 0; f < frags_.size(); ++f)
      if (frags_[f].in_flight && frags_[f].started + options_.delay == t_) complete(f, weights, d);
    for (std::size_t f = 0; f < frags_.size(); ++f)
      if (sends_at(f, t_)) {
        if (frags_[f].in_flight) complete(f, weights, d);  // only after a rebind changed t_
        begin(f, weights, 1.0f, static_cast<double>(comm_->size()), d);
        if (options_.delay == 0) complete(f, weights, d);
      }
    synced_at_ = t_;
    progress_ = 0;
  }

  // Fragment f's contribution, its pseudo-gradient times `scale` (zero when scale is 0), and
  // its exchange; the sum will be divided by `divisor` (the sum of the weights), after the sum
  // as allreduce_average does, so a mean of representable values is exact.
  void begin(std::size_t f, span<const tensor_ref> weights, float scale, double divisor,
             const transport::deadline& d) {
    contribute(f, weights, scale);
    launch(f, divisor, d);
    fragment& fr = frags_[f];
    fr.in_flight = true;
    fr.started = t_;
  }

  // Waits for fragment f's exchange, applies the outer step to its global weights and, when
  // `adopt`, mixes them into this rank's local weights (and the anchor).
  void complete(std::size_t f, span<const tensor_ref> weights, const transport::deadline& d, bool adopt = true) {
    fragment& fr = frags_[f];
    fr.exchange.wait(d);
    fr.in_flight = false;
    outer_step(f);
    if (adopt) mix(f, weights);
  }

  // The parts of begin() and complete(); diloco_member runs launch(), the wait and outer_step()
  // of a streaming fragment on its own thread, so they touch neither the step clock nor
  // in_flight/started, and nothing outside fragment f but its counters.

  // contrib_ over fragment f: its pseudo-gradient (anchor, or global, minus local) times `scale`.
  void contribute(std::size_t f, span<const tensor_ref> weights, float scale) {
    const std::size_t a = frag_first_[f], b = frag_first_[f + 1];
    const float* anchor = anchor_.empty() ? global_.data() : anchor_.data();
    if (scale == 0.0f) {
      std::fill(contrib_.begin() + static_cast<std::ptrdiff_t>(a), contrib_.begin() + static_cast<std::ptrdiff_t>(b), 0.0f);
    } else {
      pieces(weights, a, b, [&](float* p, std::size_t at, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) contrib_[at + i] = scale * (anchor[at + i] - p[i]);
      });
    }
  }
  // Starts fragment f's exchange of contrib_ (its sum to be divided by `divisor`).
  void launch(std::size_t f, double divisor, const transport::deadline& d) {
    const std::size_t a = frag_first_[f], b = frag_first_[f + 1];
    fragment& fr = frags_[f];
    float* out = sum_.empty() ? contrib_.data() + a : sum_.data() + a;
    float* residual = residual_.empty() ? nullptr : residual_.data() + a;
    fr.exchange.start(*comm_, options_.codec, contrib_.data() + a, out, b - a, options_.tag + static_cast<int>(f), d,
                      residual);
    fr.divisor = divisor;
  }
  // Fragment f's exchange completed: its mean pseudo-gradient into the outer step of its global
  // weights and outer state, and the counters.
  void outer_step(std::size_t f) {
    fragment& fr = frags_[f];
    const std::size_t a = frag_first_[f], b = frag_first_[f + 1];
    float* g = sum_.empty() ? contrib_.data() + a : sum_.data() + a;
    if (fr.divisor != 1.0) detail::divide_into(g, g, b - a, fr.divisor);
    std::vector<float*> slots(outer_.state_slots());
    for (std::size_t k = 0; k < slots.size(); ++k) slots[k] = state_.data() + k * total_ + a;
    outer_.step(span<float>(global_.data() + a, b - a), span<const float>(g, b - a), slots.data(), ++fr.steps);
    ++fragment_steps_;
  }
  // Fragment f's global weights mixed into this rank's local weights with alpha (and into the
  // anchor).
  void mix(std::size_t f, span<const tensor_ref> weights) {
    const std::size_t a = frag_first_[f], b = frag_first_[f + 1];
    const float alpha = options_.alpha;
    pieces(weights, a, b, [&](float* p, std::size_t at, std::size_t n) {
      if (alpha == 0.0f) {
        std::memcpy(p, global_.data() + at, n * 4);
      } else {
        for (std::size_t i = 0; i < n; ++i) p[i] = alpha * p[i] + (1.0f - alpha) * global_[at + i];
      }
    });
    if (!anchor_.empty()) std::copy(global_.begin() + static_cast<std::ptrdiff_t>(a), global_.begin() + static_cast<std::ptrdiff_t>(b),
                                    anchor_.begin() + static_cast<std::ptrdiff_t>(a));
  }

  // ---- the timed schedules: records, the whole model, the next plan ----

  void sync_timed(span<const tensor_ref> weights, const transport::deadline& d) {
    const std::size_t n = static_cast<std::size_t>(comm_->size());
    const std::size_t me = static_cast<std::size_t>(comm_->rank());
    const std::size_t w = schedule_.record_words();
    std::vector<std::int64_t> mine(w, 0);
    const bool contributes = plan_.contributes[me] != 0;
    mine[outer_record::steps] = progress_;
    mine[outer_record::carried] = carried_;
    mine[outer_record::contributes] = contributes ? 1 : 0;
    mine[outer_record::hash] = static_cast<std::int64_t>(plan_.hash);
    const std::size_t have = std::min<std::size_t>(recorded_, ring_.size());
    mine[outer_record::have] = static_cast<std::int64_t>(have);
    for (std::size_t i = 0; i < have; ++i) mine[outer_record::head + i] = ring_[(recorded_ - have + i) % ring_.size()];
    records_.resize(n * w);
    transport::allgather(*comm_, mine.data(), records_.data(), w * sizeof(std::int64_t), d);
    record_bytes_ += detail::ring_bytes(n * w * sizeof(std::int64_t), n);
    for (std::size_t p = 0; p < n; ++p)
      if (records_[p * w + outer_record::hash] != mine[outer_record::hash])
        throw transport_error(here() + "rank " + std::to_string(p) + " followed another plan at sync " +
                              std::to_string(syncs_ + 1) + " (plan hash " +
                              std::to_string(records_[p * w + outer_record::hash]) + ", this rank's " +
                              std::to_string(mine[outer_record::hash]) + "): every rank must use the same schedule '" +
                              schedule_.config() + "' and history");
    // The weights: steps behind each contribution (or 1 each), a carried one divided by
    // 1 + its staleness; the sum is divided by the undiscounted total of this sync's
    // contributions.
    double total = 0;
    for (std::size_t p = 0; p < n; ++p) {
      const std::int64_t* r = records_.data() + p * w;
      if (r[outer_record::contributes] == 0) continue;
      total += options_.weight_by_steps ? static_cast<double>(r[outer_record::steps]) : 1.0;
      if (r[outer_record::carried] > 0) {
        ++stale_contributions_;
        max_staleness_ = std::max(max_staleness_, r[outer_record::carried]);
      }
    }
    float scale = 0.0f;
    if (contributes)
      scale = static_cast<float>((options_.weight_by_steps ? static_cast<double>(progress_) : 1.0) /
                                 (1.0 + static_cast<double>(carried_)));
    begin(0, weights, scale, total > 0 ? total : 1.0, d);
    complete(0, weights, d, contributes);
    ++syncs_;
    if (contributes) {
      progress_ = 0;
      carried_ = 0;
    } else {
      ++carried_;
    }
    plan_ = schedule_.plan(records_, syncs_);
  }

  // ---- membership ----

  // The collective part of rebind() and of a joiner's construction.
  void rejoin(span<const tensor_ref> weights, bool joiner) {
    for (auto& fr : frags_) {
      fr.exchange.drop();
      fr.in_flight = false;
    }
    const transport::deadline d(options_.timeout);
    // 1. The most syncs any rank committed, and the lowest rank that did.
    std::int64_t committed = joiner ? -1 : static_cast<std::int64_t>(syncs_ + fragment_steps_);
    std::int64_t best = committed;
    comm_->allreduce(&best, 1, transport::dtype::i64, transport::reduce_op::max, d);
    std::int64_t src = committed == best ? comm_->rank() : comm_->size();
    comm_->allreduce(&src, 1, transport::dtype::i64, transport::reduce_op::min, d);
    if (best < 0)
      throw invalid_parameter_error(here() + "rebind: every rank is a joiner; one that ran the job must take part");
    // 2. Its global weights, outer state and counters.
    const int root = static_cast<int>(src);
    if (total_ != 0) {
      comm_->broadcast(global_.data(), total_ * 4, root, d);
      if (!state_.empty()) comm_->broadcast(state_.data(), state_.size() * 4, root, d);
    }
    std::vector<std::uint64_t> counters{syncs_, fragment_steps_};
    for (const auto& fr : frags_) counters.push_back(fr.steps);
    comm_->broadcast(counters.data(), counters.size() * 8, root, d);
    syncs_ = counters[0];
    fragment_steps_ = counters[1];
    for (std::size_t f = 0; f < frags_.size(); ++f) frags_[f].steps = counters[2 + f];
    // 3. Behind it (or new): start from the global weights.
    if (committed != best) {
      pieces(weights, 0, total_, [&](float* p, std::size_t at, std::size_t n) { std::memcpy(p, global_.data() + at, n * 4); });
      if (!anchor_.empty()) anchor_ = global_;
      progress_ = 0;
      carried_ = 0;
    }
    if (!residual_.empty()) std::fill(residual_.begin(), residual_.end(), 0.0f);
    plan_ = schedule_.first_plan();
    local_steps_ = 0;
    t_ = 0;
    synced_at_ = 0;
  }

  C* comm_;
  diloco_options options_;
  O outer_;
  outer_schedule schedule_;
  std::vector<std::size_t> counts_;
  std::size_t total_ = 0;
  std::vector<std::size_t> frag_first_;
  std::vector<float> global_, state_, anchor_, contrib_, sum_, residual_;
  std::vector<fragment> frags_;
  std::uint64_t t_ = 0, synced_at_ = 0, total_steps_ = 0, syncs_ = 0, fragment_steps_ = 0;
  outer_plan plan_;
  std::int64_t local_steps_ = 0, progress_ = 0, carried_ = 0;
  std::vector<std::int64_t> ring_;
  std::uint64_t recorded_ = 0;
  std::vector<std::int64_t> records_;
  std::uint64_t record_bytes_ = 0, stale_contributions_ = 0;
  std::int64_t max_staleness_ = 0;
};

/// @}
}  // namespace cadence::exchange
