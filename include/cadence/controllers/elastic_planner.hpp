/// \file
/// \ingroup controllers
/// ElasticBSP's planning step for collectives: from every rank's recent step times, the local
/// steps each rank runs before the next merge, computed by ZipLine on integers so that every
/// rank that runs it on the same records gets the same plan, bit for bit. Pure (no transport):
/// exchange::elastic_averager runs it on records it exchanged, cadence-sim on simulated step
/// times, and the Python binding on records gathered by torch.distributed.
#pragma once

#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/predict/any_predictor.hpp>
#include <cadence/zipline/variant.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace cadence {
/// \addtogroup controllers
/// @{

/// The plan every rank follows until the next barrier, identical on every rank.
struct elastic_round {
  /// Barriers completed before this plan was made (0: the plan for the first barrier).
  std::uint64_t barrier = 0;
  /// True during warm-up (and after a fallback): one step per rank, BSP.
  bool warmup = true;
  /// Per rank: local steps to run before the next barrier, each in [1, R].
  std::vector<std::int64_t> steps;
  /// ZipLine's predicted barrier time, in microseconds after the last barrier (0 during
  /// warm-up).
  std::int64_t predicted_barrier_us = 0;
  /// ZipLine's predicted spread of the ranks' arrivals at that barrier, in microseconds (0
  /// during warm-up and on one rank).
  std::int64_t predicted_spread_us = 0;
  /// The plan's hash, as checked across ranks.
  std::uint64_t hash = 0;
};

/// The deterministic planning step of collective ElasticBSP (exchange::elastic_averager),
/// usable on its own: from every rank's timing record, the local steps each rank runs before
/// the next barrier. Integer microseconds throughout, so every rank that runs it on the same
/// records gets the same plan, bit for bit (the ewma predictor computes its mean interval in
/// double from those integers: IEEE arithmetic without a platform-dependent step, and the
/// averager's hash check catches a build that contracts it differently).
///
/// Record of rank r (record_words() 64-bit integers): [local steps since the last barrier,
/// durations that follow (at most history), the latest step durations, oldest first, 0-padded].
///
/// When to use it directly: a trainer that exchanges the records itself (cadence.torch over
/// torch.distributed, a simulator); over a Cadence communicator, elastic_averager does the
/// exchange, the merge and the hash check around it.
class elastic_planner {
public:
  /// A planner for `ranks` ranks from `config` ("elastic:<R>[:<predictor>][:<variant>]", as
  /// make_controller parses it), each record holding up to `history` durations (in [2, 1024]),
  /// with `warmup_steps` BSP steps before the first plan (0: what the predictor needs,
  /// min_history() - 1 durations, and at least 1). Throws parse_error or
  /// invalid_parameter_error naming `config` (and `ranks`).
  elastic_planner(std::string_view config, std::size_t ranks, std::size_t history = 16,
                  std::size_t warmup_steps = 0)
      : ranks_(ranks), history_(history) {
    const detail::elastic_config e = detail::parse_elastic_config(config);
    detail::naming_config(config, ranks, [&] {
      if (ranks < 1) throw invalid_parameter_error("needs at least one rank");
      if (e.lookahead < 1) throw invalid_parameter_error("lookahead R must be >= 1, got 0");
      if (e.lookahead > (std::size_t{1} << 16))
        throw invalid_parameter_error("lookahead R must be <= 65536, got " +
                                      std::to_string(e.lookahead));
      if (ranks > (std::size_t{1} << 24) / e.lookahead)
        throw invalid_parameter_error("ranks x R must be <= 2^24");
      predictor_ = make_predictor<std::int64_t>(e.predictor);
      variant_ = parse_zipline_variant(e.variant);
      return 0;
    });
    lookahead_ = e.lookahead;
    if (history < 2 || history > 1024)
      throw invalid_parameter_error("cadence::elastic_planner: history must be in [2, 1024], got " +
                                    std::to_string(history));
    const std::size_t needed = std::max<std::size_t>(predictor_.min_history(), 2) - 1;
    warmup_ = std::max<std::size_t>(warmup_steps == 0 ? needed : warmup_steps, 1);
    rows_.assign(ranks * lookahead_, 0);
    times_.assign(history + 1, 0);
  }

  /// 64-bit words in one rank's record: history() + 2.
  std::size_t record_words() const noexcept { return history_ + 2; }
  /// Ranks the planner plans for.
  std::size_t ranks() const noexcept { return ranks_; }
  /// Durations a record holds at most.
  std::size_t history() const noexcept { return history_; }
  /// R: the predicted steps per rank, and the most local steps a plan gives a rank.
  std::size_t lookahead() const noexcept { return lookahead_; }
  /// Durations every rank must have recorded before the first plan that is not BSP.
  std::size_t warmup_steps() const noexcept { return warmup_; }
  /// Plans that fell back to BSP because prediction or ZipLine failed on the records.
  std::uint64_t fallbacks() const noexcept { return fallbacks_; }
  /// "elastic:<R>:<predictor>:<variant>", canonical.
  std::string config() const {
    return "elastic:" + std::to_string(lookahead_) + ":" + predictor_.name() + ":" +
           std::string(to_string(variant_));
  }

  /// The warm-up plan for barrier `barrier`: one step per rank, hashed with `salt`.
  elastic_round bsp_round(std::uint64_t barrier, std::uint64_t salt = 0) const {
    elastic_round out;
    out.barrier = barrier;
    out.steps.assign(ranks_, 1);
    out.hash = hash_round(out, salt);
    return out;
  }

  /// The plan for barrier `barrier` + 1 from ranks() `records` laid end to end. `salt` enters
  /// the hash (the averager mixes in its merge rule, so ranks that merge differently disagree).
  /// Throws invalid_parameter_error when the records are not ranks() x record_words() words.
  elastic_round plan(span<const std::int64_t> records, std::uint64_t barrier, std::uint64_t salt = 0) {
    const std::size_t n = ranks_;
    const std::size_t w = record_words();
    if (records.size() != n * w)
      throw invalid_parameter_error("cadence::elastic_planner: " + std::to_string(records.size()) +
                                    " record words, expected " + std::to_string(n * w));
    std::int64_t fewest = std::numeric_limits<std::int64_t>::max();
    for (std::size_t r = 0; r < n; ++r) fewest = std::min(fewest, records[r * w + 1]);
    const bool warm = fewest >= static_cast<std::int64_t>(warmup_) &&
                      fewest + 1 >= static_cast<std::int64_t>(predictor_.min_history());
    if (!warm) return bsp_round(barrier, salt);
    const std::size_t r_ = lookahead_;
    bool ok = true;
    for (std::size_t p = 0; p < n && ok; ++p) {
      // The rank's steps as push times on a clock that starts at 0 and never waits; the
      // predictions minus the last time are the predicted step ends after the barrier.
      const auto have = static_cast<std::size_t>(
          std::min<std::int64_t>(records[p * w + 1], static_cast<std::int64_t>(history_)));
      times_[0] = 0;
      for (std::size_t i = 0; i < have; ++i) times_[i + 1] = times_[i] + records[p * w + 2 + i];
      try {
        predictor_.predict(span<const std::int64_t>(times_.data(), have + 1), r_,
                           rows_.data() + p * r_);
      } catch (const time_error&) {
        ok = false;
        break;
      }
      for (std::size_t i = 0; i < r_; ++i) rows_[p * r_ + i] -= times_[have];
    }
    if (ok && n > 1) {
      try {
        zipline_solve(variant_, rows_view<std::int64_t>::matrix(rows_.data(), n, r_), ws_, result_);
      } catch (const zipline_input_error&) {
        ok = false;
      }
    }
    if (!ok) {
      ++fallbacks_;
      return bsp_round(barrier, salt);
    }
    elastic_round out;
    out.barrier = barrier;
    out.warmup = false;
    out.steps.assign(n, 1);
    if (n == 1) {
      out.steps[0] = static_cast<std::int64_t>(r_);  // nobody to wait for
      out.predicted_barrier_us = rows_[r_ - 1];
    } else {
      for (std::size_t p = 0; p < n; ++p)
        out.steps[p] = static_cast<std::int64_t>(result_.choice[p]) + 1;
      out.predicted_barrier_us = result_.barrier;
      out.predicted_spread_us = result_.spread;
    }
    out.hash = hash_round(out, salt);
    return out;
  }

private:
  // FNV-1a over the configuration and the plan, so a rank with another config string also
  // fails the check.
  std::uint64_t hash_round(const elastic_round& r, std::uint64_t salt) const {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xFF;
        h *= 1099511628211ull;
      }
    };
    for (char ch : config()) mix(static_cast<unsigned char>(ch));
    mix(history_);
    mix(warmup_);
    mix(salt);
    mix(r.barrier);
    mix(r.warmup ? 1 : 0);
    for (std::int64_t s : r.steps) mix(static_cast<std::uint64_t>(s));
    mix(static_cast<std::uint64_t>(r.predicted_barrier_us));
    mix(static_cast<std::uint64_t>(r.predicted_spread_us));
    return h;
  }

  std::size_t ranks_, history_;
  std::size_t lookahead_ = 1, warmup_ = 1;
  any_predictor<std::int64_t> predictor_;
  zipline_variant variant_ = zipline_variant::fast;
  std::uint64_t fallbacks_ = 0;
  std::vector<std::int64_t> rows_, times_;
  zipline_workspace<std::int64_t> ws_;
  zipline_result<std::int64_t> result_;
};

/// @}

namespace exchange {
// The planner lived in exchange/elastic_averager.hpp until it moved here (it needs no
// transport). These keep code that names exchange::elastic_planner or exchange::elastic_round
// compiling unchanged; new code names cadence::elastic_planner. Not a second type: the same one.
using cadence::elastic_planner;
using cadence::elastic_round;
}  // namespace exchange

}  // namespace cadence
