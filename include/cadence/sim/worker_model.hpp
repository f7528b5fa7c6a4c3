/// \file
/// \ingroup sim
/// How long a simulated worker takes per iteration: a base time, optional jitter, transient
/// straggler episodes, gradual drift, its own link's push and pull cost and a failure time; and
/// the sampler that draws the iteration times.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/types.hpp>
#include <cadence/sim/random.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// Shape of the per-iteration noise around the base time.
enum class jitter_kind : unsigned char {
  none,       ///< every iteration takes exactly the (drifted, straggled) base time
  normal,     ///< base * (1 + cv * z), z standard normal, factor clamped to >= 0.1
  lognormal,  ///< log-normal with mean base and coefficient of variation cv (heavy right tail)
};

/// One worker's iteration-time model. All times are simulated seconds. An iteration that
/// starts at time t takes
///   iteration_seconds * exp(drift_per_second * t) * (straggle_factor if in an episode) * noise
/// where noise has mean 1 and coefficient of variation jitter_cv.
struct worker_model {
  /// Mean compute time of one iteration at t = 0 (a 1080 Ti at 0.10 s, a 1060 at 0.17 s, ...).
  double iteration_seconds = 0.1;
  /// The shape of the noise (none: every iteration takes the base time).
  jitter_kind jitter = jitter_kind::none;
  /// Standard deviation of the noise relative to the mean (0.05: 5 %).
  double jitter_cv = 0.0;
  /// Chance, at each iteration start outside an episode, that a straggler episode begins.
  double straggle_probability = 0.0;
  /// Iteration-time multiplier during an episode (>= 1: a straggler is slower).
  double straggle_factor = 1.0;
  /// Mean episode length in seconds (exponentially distributed).
  double straggle_seconds = 0.0;
  /// Gradual drift: iteration time scales by exp(drift_per_second * t) (thermal throttling,
  /// a noisy neighbour arriving; negative values speed up).
  double drift_per_second = 0.0;
  /// Simulated time at which the worker dies (infinity: never). A dead worker stops pushing;
  /// the server removes it from the controller after the scenario's failure-detection delay.
  double fails_at = HUGE_VAL;
  ///@{
  /// This worker's own link, when it differs from the cluster's: seconds for its push to reach
  /// the server and for its pull (a host on a slower link: a network straggler, which is slow
  /// without computing slowly). Unset: the scenario's push_seconds and pull_seconds. Each is
  /// used on its own, so a link slow in one direction sets only that one. The simulator adds
  /// them to every iteration of this worker; an all-reduce is paced by the slowest link
  /// (simulate_collective).
  std::optional<double> push_seconds;
  std::optional<double> pull_seconds;
  ///@}
  /// Free-form label for reports ("1080Ti", "1060", ...).
  std::string label;
};

namespace detail {
[[noreturn]] inline void bad_worker(std::size_t p, const std::string& what) {
  throw invalid_parameter_error("cadence::sim: worker " + std::to_string(p) + ": " + what);
}
}  // namespace detail

/// Throws invalid_parameter_error naming worker p and the field when m is out of range.
inline void validate(const worker_model& m, std::size_t p) {
  auto num = [](double v) { return std::to_string(v); };
  if (!std::isfinite(m.iteration_seconds) || m.iteration_seconds <= 0)
    detail::bad_worker(p, "iteration_seconds must be finite and > 0, got " + num(m.iteration_seconds));
  if (!std::isfinite(m.jitter_cv) || m.jitter_cv < 0)
    detail::bad_worker(p, "jitter_cv must be finite and >= 0, got " + num(m.jitter_cv));
  if (!(m.straggle_probability >= 0 && m.straggle_probability <= 1))
    detail::bad_worker(p, "straggle_probability must be in [0, 1], got " + num(m.straggle_probability));
  if (!std::isfinite(m.straggle_factor) || m.straggle_factor <= 0)
    detail::bad_worker(p, "straggle_factor must be finite and > 0, got " + num(m.straggle_factor));
  if (!std::isfinite(m.straggle_seconds) || m.straggle_seconds < 0)
    detail::bad_worker(p, "straggle_seconds must be finite and >= 0, got " + num(m.straggle_seconds));
  if (m.straggle_probability > 0 && m.straggle_seconds <= 0)
    detail::bad_worker(p, "straggle_seconds must be > 0 when straggle_probability > 0");
  if (!std::isfinite(m.drift_per_second) || std::fabs(m.drift_per_second) > 1.0)
    detail::bad_worker(p, "drift_per_second must be in [-1, 1] (relative change per simulated "
                          "second), got " + num(m.drift_per_second));
  if (std::isnan(m.fails_at) || m.fails_at < 0)
    detail::bad_worker(p, "fails_at must be >= 0 seconds (or infinity: never), got " + num(m.fails_at));
  if (m.push_seconds && (!std::isfinite(*m.push_seconds) || *m.push_seconds < 0))
    detail::bad_worker(p, "push_seconds (its own link) must be finite and >= 0, got " + num(*m.push_seconds));
  if (m.pull_seconds && (!std::isfinite(*m.pull_seconds) || *m.pull_seconds < 0))
    detail::bad_worker(p, "pull_seconds (its own link) must be finite and >= 0, got " + num(*m.pull_seconds));
}

/// Draws one worker's iteration times from its own random stream, so a worker's times do not
/// depend on the order in which the simulator handles other workers' events.
class iteration_sampler {
public:
  /// Iterations of model m, drawn from the stream of seed; m must outlive the sampler.
  iteration_sampler(const worker_model& m, std::uint64_t seed) : model_(&m), rng_(seed) {}

  /// Compute time of an iteration that starts at simulated time `now`.
  double next(double now) {
    const worker_model& m = *model_;
    double d = m.iteration_seconds;
    if (m.drift_per_second != 0.0) {
      // Clamp the exponent: a long run with drift must not overflow to inf.
      const double e = m.drift_per_second * now;
      d *= std::exp(e > 30.0 ? 30.0 : (e < -30.0 ? -30.0 : e));
    }
    if (m.straggle_probability > 0.0) {
      if (now >= straggle_until_ && rng_.bernoulli(m.straggle_probability))
        straggle_until_ = now + rng_.exponential(m.straggle_seconds);
      if (now < straggle_until_) d *= m.straggle_factor;
    }
    switch (m.jitter) {
      case jitter_kind::none: break;
      case jitter_kind::normal: {
        const double f = 1.0 + m.jitter_cv * rng_.normal();
        d *= f < 0.1 ? 0.1 : f;
        break;
      }
      case jitter_kind::lognormal: d = rng_.lognormal(d, m.jitter_cv); break;
    }
    return d;
  }

  /// Whether a straggler episode covers time `now`.
  bool straggling(double now) const noexcept { return now < straggle_until_; }

private:
  const worker_model* model_;
  random_stream rng_;
  double straggle_until_ = -HUGE_VAL;
};

/// @}
}  // namespace cadence::sim
