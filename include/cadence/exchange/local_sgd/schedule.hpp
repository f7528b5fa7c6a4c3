/// \file
/// \ingroup exchange
/// When the ranks of a local-SGD job (DiLoCo) take an outer step, as a policy: a fixed H,
/// ElasticBSP's predicted barriers, a bounded lag per rank (DSSP's rule on inner steps), or a
/// quorum of K ranks with a grace window. Pure planning, like elastic_planner: from every
/// rank's exchanged record, the inner steps each rank runs before the next outer sync and
/// whether its pseudo-gradient goes into it, computed on integers so every rank gets the same
/// plan, bit for bit.
#pragma once

#include <cadence/controllers/elastic_planner.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/predict/any_predictor.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// The sync-schedule policies of outer_schedule.
enum class schedule_kind : std::uint8_t {
  fixed,    ///< "fixed:<H>": every rank H inner steps per outer step (DiLoCo)
  elastic,  ///< "elastic:<R>[:<predictor>][:<variant>]": ElasticBSP's barriers (elastic_planner)
  lag,      ///< "lag:<H>:<s>[:<predictor>]": DSSP's rule on inner steps
  quorum,   ///< "quorum:<K>:<H>[:<grace>[:<max lag>]][:<predictor>]": K of M with a grace window
};

/// The plan every rank follows until the next outer sync, identical on every rank.
struct outer_plan {
  /// Outer syncs completed before this plan was made.
  std::uint64_t round = 0;
  /// True while the schedule still lacks the step times it predicts from (and after a
  /// fallback): fixed steps (H, or ElasticBSP's one step).
  bool warmup = true;
  /// Per rank: inner steps to run before it calls the next sync (>= 1).
  std::vector<std::int64_t> steps;
  /// Per rank: 1 when its pseudo-gradient goes into the next sync; 0 when it joins that sync
  /// with nothing (a late rank under a quorum) and carries its local work on to a later one.
  std::vector<std::uint8_t> contributes;
  /// The predicted time of the next sync after this one, in microseconds (0 when not
  /// predicted).
  std::int64_t predicted_us = 0;
  /// The plan's hash, as checked across ranks.
  std::uint64_t hash = 0;
};

/// The fields of one rank's record (record_words() 64-bit integers), exchanged at every sync of
/// a timed schedule. The durations follow the head, oldest first, zero-padded to history().
struct outer_record {
  /// Word 0: inner steps behind this rank's pseudo-gradient (since its local model last took
  /// the global weights).
  static constexpr std::size_t steps = 0;
  /// Word 1: outer syncs this rank's work has been carried over (its staleness if it
  /// contributes now).
  static constexpr std::size_t carried = 1;
  /// Word 2: 1 when it contributes at this sync (as the plan in force says), else 0.
  static constexpr std::size_t contributes = 2;
  /// Word 3: the hash of the plan it followed (every rank must have followed the same).
  static constexpr std::size_t hash = 3;
  /// Word 4: durations that follow (at most history()).
  static constexpr std::size_t have = 4;
  /// Words before the durations.
  static constexpr std::size_t head = 5;
};

/// The sync schedule of a local-SGD job. Configs:
///
///     fixed:<H>                                  every rank H inner steps (DiLoCo, arXiv 2311.08105)
///     elastic:<R>[:<predictor>][:<variant>]      ElasticBSP: ZipLine's barrier, <= R steps per rank
///     lag:<H>:<s>[:<predictor>]                  every rank >= H steps, a faster one up to H + s
///     quorum:<K>:<H>[:<grace>[:<max lag>]][:<predictor>]  the outer step when K ranks finished H
///
/// **lag** applies DSSP's synchronization controller (docs/contract.md, section 3) to inner
/// steps: the slowest rank's H-th step end is predicted, and every other rank p runs H + r*
/// steps, r* in [0, s] the extension whose predicted end is nearest it (ties: the smallest), so
/// fast ranks use the time they would wait and no rank lags the global model by more than
/// H + s steps. **quorum** predicts when each rank finishes its H steps (a rank carrying work
/// over finishes its remaining ones); the K-th earliest arrival T_K (and every rank that has
/// carried max lag syncs, default 2) sets the close, which the grace window extends to the
/// last predicted arrival within T_K (1 + grace) (grace 0.25 by default, in thousandths on the
/// integers). Ranks predicted to arrive by then contribute; the others run the steps whose
/// end is nearest the close, join the sync without a pseudo-gradient and carry their work to a
/// later sync, where it counts with its staleness weighted (docs/contract.md, the local-SGD
/// section). The predictor is make_predictor's ("last" by default). Warm-up (a timed schedule
/// before every rank has the step times it needs): H steps each, all contribute (elastic: one).
class outer_schedule {
public:
  /// The schedule `config` names for `ranks` ranks, each record holding up to `history`
  /// durations (in [2, 1024]). Throws parse_error or invalid_parameter_error naming `config`.
  outer_schedule(std::string_view config, std::size_t ranks, std::size_t history = 16)
      : config_(config), ranks_(ranks), history_(history) {
    if (ranks < 1) fail_param("needs at least one rank");
    if (history < 2 || history > 1024)
      fail_param("history must be in [2, 1024], got " + std::to_string(history));
    const auto f = cadence::detail::split_fields(config, ':');
    if (f[0] == "fixed") {
      kind_ = schedule_kind::fixed;
      if (f.size() != 2) fail_parse("expected fixed:<H>");
      period_ = count(f[1], "H", 1);
    } else if (f[0] == "elastic") {
      kind_ = schedule_kind::elastic;
      try {
        elastic_ = std::make_unique<elastic_planner>(config, ranks, history);
      } catch (const parse_error& e) {
        throw parse_error(here() + e.what());
      } catch (const invalid_parameter_error& e) {
        throw invalid_parameter_error(here() + e.what());
      }
      period_ = elastic_->lookahead();
    } else if (f[0] == "lag") {
      kind_ = schedule_kind::lag;
      if (f.size() < 3) fail_parse("expected lag:<H>:<s>[:<predictor>]");
      period_ = count(f[1], "H", 1);
      extra_ = count(f[2], "s", 0);
      predictor_from(f, 3);
    } else if (f[0] == "quorum") {
      kind_ = schedule_kind::quorum;
      if (f.size() < 3) fail_parse("expected quorum:<K>:<H>[:<grace>[:<max lag>]][:<predictor>]");
      quorum_ = count(f[1], "K", 1);
      period_ = count(f[2], "H", 1);
      std::size_t next = 3;
      if (next < f.size() && is_number(f[next])) grace_milli_ = fraction(f[next++], "grace");
      if (next < f.size() && is_number(f[next])) max_lag_ = count(f[next++], "max lag", 0);
      predictor_from(f, next);
    } else {
      fail_parse("unknown schedule '" + std::string(f[0]) + "'");
    }
    const std::size_t most = kind_ == schedule_kind::lag ? period_ + extra_ : period_;
    if (most > (std::size_t{1} << 20)) fail_param("at most 2^20 inner steps per outer step");
    if (ranks > (std::size_t{1} << 24) / most) fail_param("ranks x steps per sync must be <= 2^24");
    if (kind_ == schedule_kind::lag || kind_ == schedule_kind::quorum) {
      rows_.assign(ranks * most, 0);
      times_.assign(history + 1, 0);
    }
  }

  /// A copy of `o` (its ElasticBSP planner copied too).
  outer_schedule(const outer_schedule& o) { *this = o; }
  /// Becomes a copy of `o`.
  outer_schedule& operator=(const outer_schedule& o) {
    if (this != &o) {
      config_ = o.config_;
      ranks_ = o.ranks_;
      history_ = o.history_;
      kind_ = o.kind_;
      period_ = o.period_;
      extra_ = o.extra_;
      quorum_ = o.quorum_;
      grace_milli_ = o.grace_milli_;
      max_lag_ = o.max_lag_;
      predictor_ = o.predictor_;
      elastic_ = o.elastic_ ? std::make_unique<elastic_planner>(*o.elastic_) : nullptr;
      rows_ = o.rows_;
      times_ = o.times_;
      fallbacks_ = o.fallbacks_;
    }
    return *this;
  }
  /// Takes another schedule's state.
  outer_schedule(outer_schedule&&) noexcept = default;
  /// Takes another schedule's state.
  outer_schedule& operator=(outer_schedule&&) noexcept = default;
  /// Releases the planner.
  ~outer_schedule() = default;

  /// Which policy.
  schedule_kind kind() const noexcept { return kind_; }
  /// Whether a sync exchanges records (every schedule but fixed, whose plan is known).
  bool timed() const noexcept { return kind_ != schedule_kind::fixed; }
  /// H (R for elastic): the nominal inner steps per outer step.
  std::size_t period() const noexcept { return period_; }
  /// s (lag only): the extra steps a faster rank may run.
  std::size_t extra() const noexcept { return extra_; }
  /// K (quorum only), as configured (more than the ranks means all of them).
  std::size_t quorum() const noexcept { return quorum_; }
  /// The grace window (quorum only), in thousandths of the K-th arrival time.
  std::int64_t grace_milli() const noexcept { return grace_milli_; }
  /// Syncs a rank's work may be carried over before it must be waited for (quorum only).
  std::size_t max_lag() const noexcept { return max_lag_; }
  /// Ranks planned for.
  std::size_t ranks() const noexcept { return ranks_; }
  /// Durations a record holds at most.
  std::size_t history() const noexcept { return history_; }
  /// 64-bit words per rank's record: outer_record::head + history().
  std::size_t record_words() const noexcept { return outer_record::head + history_; }
  /// The most inner steps a plan gives a rank before one sync.
  std::size_t most_steps() const noexcept {
    return kind_ == schedule_kind::lag ? period_ + extra_ : period_;
  }
  /// Timed plans that fell back to the warm-up plan because prediction failed.
  std::uint64_t fallbacks() const noexcept { return fallbacks_ + (elastic_ ? elastic_->fallbacks() : 0); }
  /// The config string, canonical ("quorum:3:20:0.25:2:last", "elastic:8:last:fast").
  std::string config() const {
    switch (kind_) {
      case schedule_kind::fixed: return "fixed:" + std::to_string(period_);
      case schedule_kind::elastic: return elastic_->config();
      case schedule_kind::lag:
        return "lag:" + std::to_string(period_) + ":" + std::to_string(extra_) + ":" + predictor_.name();
      case schedule_kind::quorum: {
        std::string g = std::to_string(grace_milli_ / 1000) + "." + std::to_string(1000 + grace_milli_ % 1000).substr(1);
        while (g.back() == '0') g.pop_back();
        if (g.back() == '.') g.pop_back();
        return "quorum:" + std::to_string(quorum_) + ":" + std::to_string(period_) + ":" + g + ":" +
               std::to_string(max_lag_) + ":" + predictor_.name();
      }
    }
    return {};
  }

  /// The plan before the first sync: warm-up steps for every rank, all contributing.
  outer_plan first_plan() const { return warmup_plan(0, std::vector<std::int64_t>(ranks_, 0)); }

  /// The plan after sync number `round` (1-based: the syncs completed, this one included) from
  /// the ranks() records exchanged at it, laid end to end. Throws invalid_parameter_error when
  /// the records are not ranks() x record_words() words or hold impossible values.
  outer_plan plan(span<const std::int64_t> records, std::uint64_t round) {
    const std::size_t n = ranks_;
    const std::size_t w = record_words();
    if (records.size() != n * w)
      throw invalid_parameter_error(here() + std::to_string(records.size()) + " record words, expected " +
                                    std::to_string(n * w));
    // Where each rank stands after this sync: a contributor starts afresh; a rank that did not
    // contribute keeps its steps and has carried them one sync more.
    std::vector<std::int64_t> progress(n, 0);
    std::int64_t fewest = std::numeric_limits<std::int64_t>::max();
    for (std::size_t p = 0; p < n; ++p) {
      const std::int64_t* r = records.data() + p * w;
      if (r[outer_record::steps] < 0 || r[outer_record::carried] < 0 || r[outer_record::have] < 0 ||
          r[outer_record::have] > static_cast<std::int64_t>(history_))
        throw invalid_parameter_error(here() + "rank " + std::to_string(p) + "'s record is malformed");
      if (r[outer_record::contributes] == 0) progress[p] = r[outer_record::steps];
      fewest = std::min(fewest, r[outer_record::have]);
    }
    switch (kind_) {
      case schedule_kind::fixed: return warmup_plan(round, progress);
      case schedule_kind::elastic: return elastic_plan(records, round);
      case schedule_kind::lag:
      case schedule_kind::quorum: break;
    }
    const std::int64_t needed = static_cast<std::int64_t>(std::max<std::size_t>(predictor_.min_history(), 2) - 1);
    if (fewest < needed) return warmup_plan(round, progress);
    // The predicted step ends of every rank after this sync, rows_[p * most + i] for step i + 1.
    const std::size_t most = most_steps();
    for (std::size_t p = 0; p < n; ++p) {
      const std::int64_t* r = records.data() + p * w;
      const auto have = static_cast<std::size_t>(r[outer_record::have]);
      times_[0] = 0;
      for (std::size_t i = 0; i < have; ++i) {
        const std::int64_t d = r[outer_record::head + i];
        if (d <= 0) throw invalid_parameter_error(here() + "rank " + std::to_string(p) + " recorded a duration <= 0");
        times_[i + 1] = times_[i] + d;
      }
      try {
        predictor_.predict(span<const std::int64_t>(times_.data(), have + 1), most, rows_.data() + p * most);
      } catch (const time_error&) {
        ++fallbacks_;
        return warmup_plan(round, progress);
      }
      for (std::size_t i = 0; i < most; ++i) rows_[p * most + i] -= times_[have];
    }
    outer_plan out = kind_ == schedule_kind::lag ? lag_plan(round) : quorum_plan(records, round, progress);
    out.hash = hash_plan(out);
    return out;
  }

private:
  [[noreturn]] void fail_parse(const std::string& why) const { throw parse_error(here() + why); }
  [[noreturn]] void fail_param(const std::string& why) const { throw invalid_parameter_error(here() + why); }
  std::string here() const {
    return "cadence: sync schedule '" + config_ + "' for " + std::to_string(ranks_) + " ranks: ";
  }
  static bool is_number(std::string_view f) { return !f.empty() && (std::isdigit(static_cast<unsigned char>(f[0])) || f[0] == '.'); }
  std::size_t count(std::string_view f, const char* what, std::int64_t least) const {
    const clock_value v = cadence::detail::parse_count(config_, f, what);
    if (v < least) fail_param(std::string(what) + " must be >= " + std::to_string(least) + ", got " + std::string(f));
    return static_cast<std::size_t>(v);
  }
  // A fraction in [0, 1000] as integer thousandths (every rank rounds the same text the same).
  std::int64_t fraction(std::string_view f, const char* what) const {
    double v = 0;
    const auto r = std::from_chars(f.data(), f.data() + f.size(), v);
    if (r.ec != std::errc() || r.ptr != f.data() + f.size() || !(v >= 0) || !(v <= 1000))
      fail_parse(std::string("bad ") + what + " '" + std::string(f) + "': expected a number in [0, 1000]");
    return static_cast<std::int64_t>(std::llround(v * 1000));
  }
  void predictor_from(const std::vector<std::string_view>& f, std::size_t next) {
    if (next >= f.size()) return;
    std::string spec(f[next]);
    for (std::size_t i = next + 1; i < f.size(); ++i) spec += ":" + std::string(f[i]);
    try {
      predictor_ = make_predictor<std::int64_t>(spec);
    } catch (const parse_error& e) {
      throw parse_error(here() + e.what());
    }
  }

  // Warm-up (and fixed): every rank finishes its nominal steps (H less what it carries; one
  // step for elastic), all contribute.
  outer_plan warmup_plan(std::uint64_t round, const std::vector<std::int64_t>& progress) const {
    outer_plan out;
    out.round = round;
    out.warmup = kind_ != schedule_kind::fixed;
    out.contributes.assign(ranks_, 1);
    out.steps.assign(ranks_, 1);
    if (kind_ != schedule_kind::elastic)
      for (std::size_t p = 0; p < ranks_; ++p)
        out.steps[p] = std::max<std::int64_t>(1, static_cast<std::int64_t>(period_) - progress[p]);
    out.hash = hash_plan(out);
    return out;
  }

  outer_plan elastic_plan(span<const std::int64_t> records, std::uint64_t round) {
    const std::size_t n = ranks_, w = record_words(), ew = elastic_->record_words();
    std::vector<std::int64_t> er(n * ew, 0);
    for (std::size_t p = 0; p < n; ++p) {
      const std::int64_t* r = records.data() + p * w;
      er[p * ew] = r[outer_record::steps];
      er[p * ew + 1] = r[outer_record::have];
      std::copy(r + outer_record::head, r + outer_record::head + history_, er.begin() + static_cast<std::ptrdiff_t>(p * ew + 2));
    }
    const elastic_round e = elastic_->plan(er, round);
    outer_plan out;
    out.round = round;
    out.warmup = e.warmup;
    out.steps = e.steps;
    out.contributes.assign(n, 1);
    out.predicted_us = e.predicted_barrier_us;
    out.hash = hash_plan(out) ^ e.hash;
    return out;
  }

  // DSSP's controller on inner steps: the slowest rank's H-th predicted step end is the target;
  // rank p runs H + r, r in [0, s] the first whose predicted end is nearest it.
  outer_plan lag_plan(std::uint64_t round) const {
    const std::size_t n = ranks_, most = most_steps(), h = period_;
    outer_plan out;
    out.round = round;
    out.warmup = false;
    out.contributes.assign(n, 1);
    out.steps.assign(n, static_cast<std::int64_t>(h));
    std::int64_t target = 0;
    for (std::size_t p = 0; p < n; ++p) target = std::max(target, rows_[p * most + h - 1]);
    for (std::size_t p = 0; p < n; ++p) {
      std::size_t best = 0;
      std::int64_t best_gap = std::numeric_limits<std::int64_t>::max();
      for (std::size_t r = 0; r <= extra_; ++r) {
        const std::int64_t e = rows_[p * most + h - 1 + r];
        const std::int64_t gap = e > target ? e - target : target - e;
        if (gap < best_gap) {
          best_gap = gap;
          best = r;
        }
      }
      out.steps[p] = static_cast<std::int64_t>(h + best);
    }
    out.predicted_us = target;
    return out;
  }

  // K of M: the K-th earliest predicted arrival (and every rank carried max lag syncs) sets the
  // close; the grace window extends it to the last arrival within close x (1 + grace).
  outer_plan quorum_plan(span<const std::int64_t> records, std::uint64_t round,
                         const std::vector<std::int64_t>& progress) const {
    const std::size_t n = ranks_, most = most_steps(), w = record_words();
    std::vector<std::int64_t> remaining(n), arrival(n);
    std::int64_t forced = 0;
    for (std::size_t p = 0; p < n; ++p) {
      const std::int64_t* r = records.data() + p * w;
      remaining[p] = std::max<std::int64_t>(1, static_cast<std::int64_t>(period_) - progress[p]);
      arrival[p] = rows_[p * most + static_cast<std::size_t>(remaining[p]) - 1];
      const std::int64_t carried = r[outer_record::contributes] != 0 ? 0 : r[outer_record::carried] + 1;
      if (carried >= static_cast<std::int64_t>(max_lag_)) forced = std::max(forced, arrival[p]);
    }
    std::vector<std::int64_t> sorted = arrival;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t k = std::min(quorum_, n);
    std::int64_t close = std::max(sorted[k - 1], forced);
    // close x (1 + grace), rounded down, in integers (saturating: predictions are far smaller)
    const std::int64_t big = std::numeric_limits<std::int64_t>::max();
    const std::int64_t limit = close / 1000 > (big - close) / std::max<std::int64_t>(grace_milli_ + 1, 1)
                                   ? big
                                   : close + close / 1000 * grace_milli_ + close % 1000 * grace_milli_ / 1000;
    for (const std::int64_t a : sorted)
      if (a <= limit) close = std::max(close, a);
    outer_plan out;
    out.round = round;
    out.warmup = false;
    out.predicted_us = close;
    out.steps.assign(n, 1);
    out.contributes.assign(n, 1);
    for (std::size_t p = 0; p < n; ++p) {
      // On time, or late by less than its last step (it cannot stop earlier and still carry
      // less than H steps): it contributes.
      if (arrival[p] <= close || remaining[p] == 1) {
        out.steps[p] = remaining[p];
        continue;
      }
      // Late: the step count whose predicted end is nearest the close (fewer than remaining).
      std::int64_t best = 1, best_gap = std::numeric_limits<std::int64_t>::max();
      for (std::int64_t s = 1; s < remaining[p]; ++s) {
        const std::int64_t e = rows_[p * most + static_cast<std::size_t>(s) - 1];
        const std::int64_t gap = e > close ? e - close : close - e;
        if (gap < best_gap) {
          best_gap = gap;
          best = s;
        }
      }
      out.steps[p] = best;
      out.contributes[p] = 0;
    }
    return out;
  }

  // FNV-1a over the configuration and the plan.
  std::uint64_t hash_plan(const outer_plan& r) const {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xFF;
        h *= 1099511628211ull;
      }
    };
    for (char ch : config_) mix(static_cast<unsigned char>(ch));
    mix(ranks_);
    mix(history_);
    mix(r.round);
    mix(r.warmup ? 1 : 0);
    for (std::int64_t s : r.steps) mix(static_cast<std::uint64_t>(s));
    for (std::uint8_t c : r.contributes) mix(c);
    mix(static_cast<std::uint64_t>(r.predicted_us));
    return h;
  }

  std::string config_;
  std::size_t ranks_ = 1, history_ = 16;
  schedule_kind kind_ = schedule_kind::fixed;
  std::size_t period_ = 1, extra_ = 0, quorum_ = 1;
  std::int64_t grace_milli_ = 250;
  std::size_t max_lag_ = 2;
  any_predictor<std::int64_t> predictor_;
  std::unique_ptr<elastic_planner> elastic_;
  std::vector<std::int64_t> rows_, times_;
  std::uint64_t fallbacks_ = 0;
};

/// @}
}  // namespace cadence::exchange
