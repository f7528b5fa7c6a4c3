/// \file
/// \ingroup exchange
/// ElasticBSP over collectives: ranks run local steps between merge all-reduces placed where a
/// plan, computed identically on every rank by ZipLine from exchanged step times, says arrivals
/// are closest. The plan itself is cadence::elastic_planner (controllers/elastic_planner.hpp).
#pragma once

#include <cadence/controllers/elastic_planner.hpp>
#include <cadence/core/error.hpp>
#include <cadence/exchange/detail/device.hpp>
#include <cadence/exchange/detail/merge.hpp>
#include <cadence/exchange/detail/tensor.hpp>
#include <cadence/exchange/tensor_ref.hpp>
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// How a barrier merges the ranks' parameters.
enum class merge_rule : std::uint8_t {
  /// x = mean over ranks of x_r: local SGD's model averaging (the default).
  average,
  /// x = a + sum over ranks of (x_r - a), where a is the merged model of the previous barrier:
  /// every rank's progress counts in full, as in asynchronous SGD on a server. The first
  /// barrier averages (no common starting point is known before it).
  summed_deltas,
  /// x = sum of s_r x_r / sum of s_r, with s_r the local steps rank r ran since the previous
  /// barrier: a rank that did more work weighs more.
  step_weighted,
};

/// The name of merge rule `m`: "average", "summed_deltas" or "step_weighted".
constexpr const char* merge_rule_name(merge_rule m) noexcept {
  switch (m) {
    case merge_rule::average: return "average";
    case merge_rule::summed_deltas: return "summed_deltas";
    case merge_rule::step_weighted: return "step_weighted";
  }
  return "unknown merge_rule";
}

/// How an elastic_averager merges, what it records, and how long a barrier may take.
struct elastic_averager_options {
  /// How a barrier merges the ranks' parameters.
  merge_rule merge = merge_rule::average;
  /// Step durations each rank keeps and sends (the predictor sees the latest ones): the timing
  /// record is 8 * (history + 2) bytes per rank. In [2, 1024].
  std::size_t history = 16;
  /// Local steps of BSP (a barrier after every step) before the first plan; 0: what the
  /// predictor needs, min_history() - 1 durations (one for "last"), and at least 1.
  std::size_t warmup_steps = 0;
  /// Deadline of one sync(), all of its collectives together.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// Device tensors (a bulk communicator with device buffers, NCCL) only: the caller's
  /// cudaStream_t, whose earlier work the merge waits for (an event recorded on it; the merge
  /// runs on the bulk communicator's stream); null: the legacy default stream.
  void* stream = nullptr;
};

/// ElasticBSP over collectives (our adaptation: the paper places the barriers on a parameter
/// server). Between barriers each rank runs local SGD steps without communicating; at a barrier
/// every rank calls sync(), which merges the parameters with one all-reduce per dtype (in place
/// where the tensors of a dtype lie back to back, else through a fusion buffer). How many
/// local steps rank p runs before the next barrier comes from a plan that every rank computes
/// from identical inputs: each rank reports the durations of its own steps (integer
/// microseconds, its local clock only), sync() exchanges a fixed-size record of them, and every
/// rank runs the same predictor and ZipLine variant on integers, so the plans agree bit for bit;
/// a min/max all-reduce of the plan's hash turns any divergence into an error instead of a hang.
///
/// Use:
///
///     elastic_averager<C> avg(comm, "elastic:8");      // the controller's config strings
///     for (;;) {
///       local_sgd_step(params);
///       if (avg.step_done(measured_us)) avg.sync(params);  // barrier: merge, plan the next one
///     }
///
/// Guarantee: no rank runs more than max(R, 1) local steps between two barriers (exactly 1
/// during warm-up). Every rank issues the same collectives in the same order on every sync():
/// an all-gather of the records, the merge all-reduces, one hash all-reduce. A stalled rank
/// makes the others throw transport_error naming it within the timeout.
/// When to pick it: ranks of unequal or varying speed where BSP's per-step barrier makes the
/// fast ones wait, and the model tolerates local SGD between merges. With steady, equal ranks,
/// periodic_averager (or BSP) is as good and simpler.
///
/// NCCL form: elastic_averager<Control, nccl_communicator>(control, nccl, config, options). The
/// timing records and the hash check (small, host memory) travel on `control` (MPI, gloo or
/// inproc, the same ranks), the tensors are device pointers merged over the NCCL communicator
/// on its stream, after an event on options.stream (the caller's): average with ncclAvg, step_weighted with ncclRedOpCreatePreMulSum (each
/// rank's scalar is s_r / sum of s), summed_deltas with a sum and a second, scaled all-reduce
/// that subtracts (n - 1) times the anchor kept in device memory (NCCL has no elementwise
/// kernel; it costs one more all-reduce of the tensors). sync() returns when the merged values
/// are in the tensors. A stalled rank is named by the control communicator's all-gather, which
/// comes first in every sync().
///
/// sync() takes the tensors as a span, a braced list (`sync({a, b})`), one by one
/// (`sync(a, b)`), or none (`sync()`: the timing exchange and the plan still run).
template <class C, class Bulk = C>
class elastic_averager : public detail::tensor_sync<elastic_averager<C, Bulk>> {
  CADENCE_REQUIRE_COMMUNICATOR(C);
  CADENCE_REQUIRE_COMMUNICATOR(Bulk);

public:
  /// Most durations one step may take: about 12.7 days. Keeps every sum of a history in range.
  static constexpr std::int64_t max_duration_us = std::int64_t{1} << 40;

  /// An averager over `comm` (records, hash check and tensors). `config`:
  /// "elastic:<R>[:<predictor>][:<variant>]", as make_controller parses it; `options`: the
  /// merge rule, the history, the warm-up, the deadline. Throws parse_error or
  /// invalid_parameter_error naming the string.
  explicit elastic_averager(C& comm, std::string_view config = "elastic:15",
                            elastic_averager_options options = {})
      : elastic_averager(comm, bulk_of(comm), config, options) {}

  /// Records and hash check on `control` (host memory), tensors on `bulk` (device buffers when
  /// its capabilities say so); both of the same ranks. `config` and `options` as above. Throws
  /// invalid_parameter_error when control takes device buffers or the ranks differ.
  elastic_averager(C& control, Bulk& bulk, std::string_view config = "elastic:15",
                   elastic_averager_options options = {})
      : comm_(&control), bulk_(&bulk), options_(options), config_(config),
        planner_(make_planner(control, config, options)) {
    if (control.capabilities().device_buffers)
      throw invalid_parameter_error(here() + "the control communicator takes device buffers; the "
                                    "timing records and the plan hash live in host memory (pass "
                                    "MPI, gloo or inproc as control and NCCL as the bulk "
                                    "communicator)");
    if (control.rank() != bulk.rank() || control.size() != bulk.size())
      throw invalid_parameter_error(here() + "the bulk communicator is rank " +
                                    std::to_string(bulk.rank()) + " of " + std::to_string(bulk.size()) +
                                    " (the control and bulk communicators must have the same ranks)");
    device_ = detail::uses_device(bulk, "elastic_averager", options.stream);
    stream_ = options.stream;
    detail::check_timeout("elastic_averager", options.timeout);
    ring_.assign(options.history, 0);
    records_.assign(planner_.ranks() * planner_.record_words(), 0);
    round_ = planner_.bsp_round(0, salt());
  }

  /// This rank finished a local step that took `duration_us` microseconds (its own clock,
  /// compute only: not time spent in sync()). Returns true when this rank must call sync()
  /// now. Throws invalid_parameter_error for a duration <= 0 or above max_duration_us, or when
  /// a sync() is already due (the step would break the plan).
  bool step_done(std::int64_t duration_us) {
    if (due())
      throw invalid_parameter_error(here() + "step_done() after the step that made sync() due: "
                                    "call sync() first (barrier " +
                                    std::to_string(round_.barrier + 1) + " after " +
                                    std::to_string(local_steps_) + " local steps)");
    if (duration_us <= 0 || duration_us > max_duration_us)
      throw invalid_parameter_error(here() + "step duration " + std::to_string(duration_us) +
                                    " us is not in [1, " + std::to_string(max_duration_us) +
                                    "] (measure it with a steady clock; round up to 1 us)");
    ring_[recorded_ % ring_.size()] = duration_us;
    ++recorded_;
    ++local_steps_;
    ++total_steps_;
    return due();
  }
  /// step_done() with the step's duration `d` as a std::chrono duration (rounded up to whole
  /// microseconds).
  template <class Rep, class Period>
  bool step_done(std::chrono::duration<Rep, Period> d) {
    return step_done(static_cast<std::int64_t>(
        std::chrono::ceil<std::chrono::microseconds>(d).count()));
  }

  /// Whether the plan says this rank must sync now.
  bool due() const noexcept { return local_steps_ >= planned(); }

  // sync({a, b}), sync(a, b, ...) and sync() (a barrier without tensors: the timing exchange
  // and the plan still run) call the form below.
  using detail::tensor_sync<elastic_averager>::sync;
  /// The barrier: merges the `tensors` across ranks (merge rule of the options), exchanges the
  /// timing records and puts the next plan in force. Every rank passes the same tensors (count
  /// and dtype) in the same order. Throws invalid_parameter_error, before communicating, when
  /// the plan does not call for a barrier yet or a tensor is bad; transport_error when a peer
  /// fails or stalls, or when the ranks computed different plans. After a transport_error the
  /// communicator has failed: the job ends (collectives are fail-stop), except on a
  /// membership::quorum_view, where the member re-forms the quorum and retries the sync after
  /// restart_plan().
  void sync(span<const tensor_ref> tensors) {
    if (!due())
      throw invalid_parameter_error(here() + "sync() before the plan calls for it: " +
                                    std::to_string(local_steps_) + " of " +
                                    std::to_string(planned()) + " local steps done");
    for (std::size_t i = 0; i < tensors.size(); ++i)
      detail::check_tensor("elastic_averager", comm_->rank(), comm_->size(), tensors[i], i);
    if (options_.merge == merge_rule::summed_deltas && anchored_) {
      // The deltas are against the last merged tensors: the same tensors must come back.
      if (anchor_bytes_.size() != tensors.size())
        throw invalid_parameter_error(here() + "summed_deltas: sync() got " +
                                      std::to_string(tensors.size()) + " tensors, the last had " +
                                      std::to_string(anchor_bytes_.size()));
      for (std::size_t i = 0; i < tensors.size(); ++i)
        if (anchor_bytes_[i] != tensors[i].bytes())
          throw invalid_parameter_error(here() + "summed_deltas: tensor " + std::to_string(i) +
                                        " changed size since the last sync()");
    }
    const transport::deadline d = transport::deadline(options_.timeout);

    // 1. Every rank's record: [local steps, durations recorded, the latest durations...].
    const std::size_t w = record_words();
    std::vector<std::int64_t> mine(w, 0);
    mine[0] = local_steps_;
    const std::size_t have = std::min<std::size_t>(recorded_, ring_.size());
    mine[1] = static_cast<std::int64_t>(have);
    for (std::size_t i = 0; i < have; ++i)
      mine[2 + i] = ring_[(recorded_ - have + i) % ring_.size()];
    transport::allgather(*comm_, mine.data(), records_.data(), w * sizeof(std::int64_t), d);

    // 2. The merge.
    merge(tensors, d);

    // 3. The next plan, from the records alone, then the check that every rank made the same.
    elastic_round next = planner_.plan(records_, round_.barrier + 1, salt());
    std::int64_t h[2] = {static_cast<std::int64_t>(next.hash >> 2),
                         -static_cast<std::int64_t>(next.hash >> 2)};
    comm_->allreduce(h, 2, transport::dtype::i64, transport::reduce_op::max, d);
    if (h[0] != -h[1])
      throw transport_error(here() + "the ranks computed different plans for barrier " +
                            std::to_string(next.barrier + 1) + " (plan hash max " +
                            std::to_string(h[0]) + ", min " + std::to_string(-h[1]) + ", this rank " +
                            std::to_string(next.hash >> 2) + "): every rank must use the same "
                            "config string, history, warm-up and merge rule (this rank: " + config_ +
                            ", merge " + merge_rule_name(options_.merge) + ")");
    for (std::size_t r = 0; r < static_cast<std::size_t>(comm_->size()); ++r) {
      const std::int64_t s = records_[r * w];
      if (s > max_local_steps_) max_local_steps_ = s;
    }
    round_ = std::move(next);
    local_steps_ = 0;
  }

  /// The ranks behind the communicator changed (a membership::quorum_view re-formed after a loss
  /// or an admission: call it from member::on_change on every member): plans again for
  /// comm.size() ranks, starting from a BSP round at barrier 0, so every member holds the same
  /// plan whatever it had committed before. This rank's step history is kept (the next plan
  /// predicts from it), and so are its local steps since its last merge unless
  /// `local_steps_dropped` (the member was healed: its parameters are another member's merged
  /// ones, so its own steps are gone); a sync() retried on the new quorum is due at once. The
  /// summed-deltas anchor is dropped (the next merge averages). Throws invalid_parameter_error
  /// when the communicator's size is no longer one the planner takes.
  void restart_plan(bool local_steps_dropped = false) {
    planner_ = make_planner(*comm_, config_, options_);
    records_.assign(planner_.ranks() * planner_.record_words(), 0);
    round_ = planner_.bsp_round(0, salt());
    if (local_steps_dropped) local_steps_ = 0;
    anchored_ = false;
    anchor_bytes_.clear();
  }

  /// The plan in force (the same on every rank).
  const elastic_round& round() const noexcept { return round_; }
  /// Local steps this rank runs before its next barrier.
  std::int64_t planned() const noexcept {
    return round_.steps[static_cast<std::size_t>(comm_->rank())];
  }
  /// Local steps this rank has run since its last barrier.
  std::int64_t local_steps() const noexcept { return local_steps_; }
  /// Local steps this rank has run since it was built.
  std::uint64_t total_steps() const noexcept { return total_steps_; }
  /// Barriers completed since the averager was built or its plan last restarted.
  std::uint64_t barriers() const noexcept { return round_.barrier; }
  /// Plans that fell back to one step per rank because prediction failed.
  std::uint64_t fallbacks() const noexcept { return planner_.fallbacks(); }
  /// The most local steps any rank ran between two barriers so far (from the records).
  std::int64_t max_local_steps() const noexcept { return max_local_steps_; }
  /// R: the most local steps a plan gives a rank.
  std::size_t lookahead() const noexcept { return planner_.lookahead(); }
  /// BSP steps before the first plan (elastic_planner::warmup_steps).
  std::size_t warmup_steps() const noexcept { return planner_.warmup_steps(); }
  /// "elastic:<R>:<predictor>:<variant>", canonical.
  std::string config() const { return planner_.config(); }
  /// Whether the tensors are device buffers (the bulk communicator's capabilities say so).
  bool on_device() const noexcept { return device_; }

private:
  // The one-communicator form: Bulk is C, and the communicator is both.
  static Bulk& bulk_of(C& comm) {
    if constexpr (std::is_same_v<C, Bulk>) {
      return comm;
    } else {
      static_assert(std::is_same_v<C, Bulk>,
                    "cadence::exchange::elastic_averager<C, Bulk>: with two communicator types, "
                    "pass both (control, bulk)");
      return *static_cast<Bulk*>(nullptr);
    }
  }

  std::string here() const {
    return detail::where("elastic_averager", comm_->rank(), comm_->size());
  }
  std::size_t record_words() const noexcept { return planner_.record_words(); }
  std::uint64_t salt() const noexcept { return static_cast<std::uint64_t>(options_.merge); }

  // The planner, with errors that name this rank (the config string's are named by it).
  static elastic_planner make_planner(const C& comm, std::string_view config,
                                      const elastic_averager_options& o) {
    try {
      return elastic_planner(config, static_cast<std::size_t>(comm.size()), o.history, o.warmup_steps);
    } catch (const parse_error& e) {
      throw parse_error(detail::where("elastic_averager", comm.rank(), comm.size()) + e.what());
    } catch (const invalid_parameter_error& e) {
      throw invalid_parameter_error(detail::where("elastic_averager", comm.rank(), comm.size()) + e.what());
    }
  }

  // The merge: one fused all-reduce per dtype (two for summed deltas on a device), the rule's
  // arithmetic folded into the copies (detail/merge.hpp).
  void merge(span<const tensor_ref> tensors, const transport::deadline& d) {
    const int n = comm_->size();
    const std::size_t w = record_words();
    merge_rule rule = options_.merge;
    if (rule == merge_rule::summed_deltas && !anchored_) rule = merge_rule::average;
    std::int64_t total_steps = 0;
    for (int r = 0; r < n; ++r) total_steps += records_[static_cast<std::size_t>(r) * w];
    const std::int64_t my_steps = records_[static_cast<std::size_t>(comm_->rank()) * w];
    const detail::merge_kind kind = rule == merge_rule::average         ? detail::merge_kind::average
                                    : rule == merge_rule::step_weighted ? detail::merge_kind::step_weighted
                                                                        : detail::merge_kind::summed_deltas;
    merger_.merge(*bulk_, tensors, kind, static_cast<double>(my_steps), static_cast<double>(total_steps),
                  options_.merge == merge_rule::summed_deltas, d, device_, stream_);
    if (options_.merge == merge_rule::summed_deltas) {
      anchor_bytes_.resize(tensors.size());
      for (std::size_t i = 0; i < tensors.size(); ++i) anchor_bytes_[i] = tensors[i].bytes();
      anchored_ = true;
    }
  }

  C* comm_;      // control: records and the hash check (host memory)
  Bulk* bulk_;   // the tensors' merges (comm_ itself in the one-communicator form)
  elastic_averager_options options_;
  std::string config_;
  elastic_planner planner_;
  bool device_ = false;
  void* stream_ = nullptr;
  std::vector<std::int64_t> ring_;  // this rank's latest step durations
  std::uint64_t recorded_ = 0, total_steps_ = 0;
  std::int64_t local_steps_ = 0, max_local_steps_ = 0;
  elastic_round round_;
  detail::merger<Bulk> merger_;             // fusion buffers and the summed-deltas anchor
  std::vector<std::size_t> anchor_bytes_;   // the anchored tensors' sizes, for the checks
  bool anchored_ = false;
  std::vector<std::int64_t> records_;               // every rank's record, as exchanged
};

/// @}
}  // namespace cadence::exchange
