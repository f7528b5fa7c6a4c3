/// \file
/// \ingroup exchange
/// What a local-SGD adapter (exchange::diloco) is told besides its communicator and outer
/// optimizer: the sync schedule, fragments (streaming), the overlap delay and mixing factor,
/// the wire codec, the weighting and the deadline; and one config string that carries all of
/// them with the outer optimizer ("fixed:50,outer=nesterov:0.7:0.9,fragments=4,codec=int4"),
/// for command lines, the simulator and the Python package.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/exchange/local_sgd/codec.hpp>
#include <cadence/exchange/local_sgd/outer_optimizer.hpp>
#include <cadence/exchange/local_sgd/schedule.hpp>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// How a diloco adapter syncs. The defaults are DiLoCo as published (fixed H, the whole model,
/// f32), with H = 50.
struct diloco_options {
  /// The sync schedule (outer_schedule's config): "fixed:<H>", "elastic:<R>...",
  /// "lag:<H>:<s>...", "quorum:<K>:<H>...".
  std::string schedule = "fixed:50";
  /// Fragments the model is cut into (contiguous element ranges, in the tensors' order):
  /// fragment f syncs every H steps, (f + 1) H / F steps after the start (Streaming DiLoCo,
  /// arXiv 2501.18512). More than 1 needs the fixed schedule and at most H fragments.
  std::size_t fragments = 1;
  /// Inner steps a fragment's exchange overlaps before its outer step is applied (0: at once,
  /// blocking; the fixed schedule only; less than H).
  std::size_t delay = 0;
  /// Mixing factor in [0, 1): after an outer step the local weights become alpha x local +
  /// (1 - alpha) x global (0: the global weights, DiLoCo's).
  float alpha = 0.0f;
  /// How pseudo-gradients travel (codec.hpp).
  outer_codec codec = outer_codec::f32;
  /// Keep what quantising this rank's contribution lost and add it to the next one (lossy
  /// codecs only).
  bool error_feedback = true;
  /// Weight each contribution by the inner steps behind it (else each contributing rank
  /// alike); a carried contribution is divided by 1 + its staleness either way
  /// (docs/contract.md).
  bool weight_by_steps = true;
  /// Step durations each rank keeps and sends (timed schedules), in [2, 1024].
  std::size_t history = 16;
  /// Deadline of one sync, all of its collectives together.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// First point-to-point tag of the coded ring (lossy codecs); fragment f uses tag + f.
  int tag = 32000;
};

/// A parsed local-SGD config string: the options and the outer optimizer's spec.
struct diloco_config {
  diloco_options options;             ///< everything but the outer optimizer
  std::string outer = "nesterov:0.7:0.9";  ///< make_outer_optimizer's spec
};

namespace detail {
[[noreturn]] inline void bad_diloco(std::string_view config, const std::string& why) {
  throw parse_error("cadence: local-SGD config '" + std::string(config) + "': " + why +
                    " (expected <schedule>[,outer=<optimizer>][,fragments=F][,delay=D][,alpha=A]"
                    "[,codec=f32|bf16|fp16|int8|int4][,feedback=0|1][,weights=steps|uniform])");
}
inline std::size_t diloco_count(std::string_view config, std::string_view key, std::string_view v) {
  std::size_t out = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size())
    bad_diloco(config, std::string(key) + " '" + std::string(v) + "' is not an integer >= 0");
  return out;
}
}  // namespace detail

/// Parses "<schedule>[,key=value...]": the schedule is outer_schedule's config; the keys are
/// outer (make_outer_optimizer's spec; default nesterov:0.7:0.9), fragments, delay, alpha,
/// codec, feedback (0 or 1) and weights (steps or uniform). Checks the shape and the outer
/// optimizer; the schedule and the combination are checked by what builds them (the adapter,
/// the simulator), which know the rank count. Throws parse_error naming the string.
inline diloco_config parse_diloco_config(std::string_view config) {
  diloco_config out;
  const std::size_t comma = config.find(',');
  out.options.schedule = std::string(config.substr(0, comma));
  if (out.options.schedule.empty()) detail::bad_diloco(config, "no schedule");
  std::string_view rest = comma == std::string_view::npos ? std::string_view() : config.substr(comma + 1);
  while (!rest.empty() || comma != std::string_view::npos) {
    const std::size_t next = rest.find(',');
    const std::string_view item = rest.substr(0, next);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) detail::bad_diloco(config, "'" + std::string(item) + "' is not key=value");
    const std::string_view key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "outer") {
      try {
        (void)make_outer_optimizer(v);  // checked now, named with the config
      } catch (const parse_error& e) {
        detail::bad_diloco(config, e.what());
      }
      out.outer = std::string(v);
    } else if (key == "fragments") {
      out.options.fragments = detail::diloco_count(config, key, v);
    } else if (key == "delay") {
      out.options.delay = detail::diloco_count(config, key, v);
    } else if (key == "alpha") {
      double a = 0;
      const auto r = std::from_chars(v.data(), v.data() + v.size(), a);
      if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || !(a >= 0 && a < 1))
        detail::bad_diloco(config, "alpha '" + std::string(v) + "' is not a number in [0, 1)");
      out.options.alpha = static_cast<float>(a);
    } else if (key == "codec") {
      try {
        out.options.codec = parse_outer_codec(v);
      } catch (const parse_error& e) {
        detail::bad_diloco(config, e.what());
      }
    } else if (key == "feedback") {
      if (v != "0" && v != "1") detail::bad_diloco(config, "feedback must be 0 or 1");
      out.options.error_feedback = v == "1";
    } else if (key == "weights") {
      if (v != "steps" && v != "uniform") detail::bad_diloco(config, "weights must be steps or uniform");
      out.options.weight_by_steps = v == "steps";
    } else {
      detail::bad_diloco(config, "unknown key '" + std::string(key) + "'");
    }
    if (next == std::string_view::npos) break;
    rest = rest.substr(next + 1);
  }
  return out;
}

/// Checks that `o` fits schedule `s` (built from o.schedule): fragments in [1, H] and a delay
/// below H only with the fixed schedule, alpha in [0, 1), history in [2, 1024], a timeout > 0
/// and tags in range. Throws invalid_parameter_error naming the option, its value and the
/// bound; `where` starts the message.
inline void check_diloco_options(const diloco_options& o, const outer_schedule& s, const std::string& where) {
  auto fail = [&](const std::string& why) { throw invalid_parameter_error(where + why); };
  if (o.fragments < 1) fail("fragments must be >= 1, got 0");
  if (s.kind() != schedule_kind::fixed && (o.fragments != 1 || o.delay != 0))
    fail("fragments and delay need the fixed schedule (got fragments " + std::to_string(o.fragments) + ", delay " +
         std::to_string(o.delay) + " with '" + o.schedule + "'): a timed schedule syncs the whole model at once");
  if (o.fragments > s.period())
    fail("fragments " + std::to_string(o.fragments) + " exceed H = " + std::to_string(s.period()) +
         " (each fragment needs a step of its own)");
  if (s.kind() == schedule_kind::fixed && o.delay >= s.period())
    fail("delay " + std::to_string(o.delay) + " must be less than H = " + std::to_string(s.period()) +
         " (a fragment's exchange ends before its next one starts)");
  if (!(o.alpha >= 0.0f && o.alpha < 1.0f)) fail("alpha must be in [0, 1), got " + detail::number_text(o.alpha));
  if (o.history < 2 || o.history > 1024) fail("history must be in [2, 1024], got " + std::to_string(o.history));
  if (o.timeout <= std::chrono::milliseconds::zero())
    fail("timeout must be > 0, got " + std::to_string(o.timeout.count()) + " ms");
  if (o.tag < 0 || static_cast<std::size_t>(o.tag) + o.fragments > 32768)
    fail("tags " + std::to_string(o.tag) + " to " + std::to_string(static_cast<std::size_t>(o.tag) + o.fragments - 1) +
         " are not all in [0, 32767]");
}

/// The canonical config string of `o` and outer optimizer `outer`: the schedule, then every
/// option that differs from its default, in the order parse_diloco_config lists them.
inline std::string diloco_config_string(const diloco_options& o, const std::string& outer) {
  std::string s = o.schedule;
  if (outer != "nesterov:0.7:0.9") s += ",outer=" + outer;
  if (o.fragments != 1) s += ",fragments=" + std::to_string(o.fragments);
  if (o.delay != 0) s += ",delay=" + std::to_string(o.delay);
  if (o.alpha != 0.0f) s += ",alpha=" + detail::number_text(o.alpha);
  if (o.codec != outer_codec::f32) s += std::string(",codec=") + outer_codec_name(o.codec);
  if (!o.error_feedback) s += ",feedback=0";
  if (!o.weight_by_steps) s += ",weights=uniform";
  return s;
}

/// @}
}  // namespace cadence::exchange
