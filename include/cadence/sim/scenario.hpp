/// \file
/// \ingroup sim
/// A simulated parameter-server cluster: its workers' iteration-time models, the cost of push
/// and pull, failure detection, how long to run, and the seed.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/sim/worker_model.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// Everything a run depends on except the policy. Physics of one iteration of worker p:
/// compute (its worker_model), push (push_seconds_of(s, p)) after which the server calls
/// controller.push(p, arrival time); if the worker may proceed it pulls (pull_seconds_of(s, p))
/// and computes again; otherwise it idles until an event releases it, then pulls and computes.
/// All workers start computing at t = 0 from the initial weights.
struct scenario {
  std::string name;         ///< what tools and reports call it
  std::string description;  ///< one line on what it models
  /// workers[p]: worker p's iteration-time model; the cluster's size is workers.size().
  std::vector<worker_model> workers;
  /// Time from the end of a worker's compute to the push's arrival at the server, for every
  /// worker without a link of its own (worker_model::push_seconds).
  double push_seconds = 0.0;
  /// Time from the server's go-ahead to the worker starting its next compute, for every
  /// worker without a link of its own (worker_model::pull_seconds).
  double pull_seconds = 0.0;
  /// Delay between a worker's death and the server removing it (heartbeat timeout).
  double failure_detection_seconds = 0.0;
  /// Run length: simulated seconds (events after this time are not processed) ...
  double seconds = 0.0;
  /// ... or, when seconds == 0, until the cluster has made iterations * workers pushes.
  std::uint64_t iterations = 0;
  /// Seeds every worker's random stream: the same scenario and seed give the same run.
  std::uint64_t seed = 1;
};

/// Worker p's push cost: its own link's when it has one, else the scenario's.
inline double push_seconds_of(const scenario& s, std::size_t p) {
  return s.workers[p].push_seconds.value_or(s.push_seconds);
}
/// Worker p's pull cost: its own link's when it has one, else the scenario's.
inline double pull_seconds_of(const scenario& s, std::size_t p) {
  return s.workers[p].pull_seconds.value_or(s.pull_seconds);
}

/// Throws invalid_parameter_error, naming the scenario and the field, when s cannot be run.
inline void validate(const scenario& s) {
  const std::string who = "cadence::sim: scenario '" + s.name + "': ";
  auto fail = [&](const std::string& what) { throw invalid_parameter_error(who + what); };
  if (s.workers.empty()) fail("needs at least one worker");
  if (s.workers.size() >= 0xFFFFFFFFu) fail("too many workers");
  if (!std::isfinite(s.push_seconds) || s.push_seconds < 0)
    fail("push_seconds must be finite and >= 0, got " + std::to_string(s.push_seconds));
  if (!std::isfinite(s.pull_seconds) || s.pull_seconds < 0)
    fail("pull_seconds must be finite and >= 0, got " + std::to_string(s.pull_seconds));
  if (!std::isfinite(s.failure_detection_seconds) || s.failure_detection_seconds < 0)
    fail("failure_detection_seconds must be finite and >= 0, got " +
         std::to_string(s.failure_detection_seconds));
  if (std::isnan(s.seconds) || s.seconds < 0 || std::isinf(s.seconds))
    fail("seconds must be finite and >= 0, got " + std::to_string(s.seconds));
  if (s.seconds == 0 && s.iterations == 0)
    fail("set a run length: seconds > 0 or iterations > 0");
  if (s.seconds == 0 && s.iterations > (std::uint64_t{1} << 40) / s.workers.size())
    fail("iterations * workers is too large (" + std::to_string(s.iterations) + " * " +
         std::to_string(s.workers.size()) + ")");
  bool survivor = false;
  for (std::size_t p = 0; p < s.workers.size(); ++p) {
    try {
      validate(s.workers[p], p);
    } catch (const invalid_parameter_error& e) {
      fail(std::string(e.what()).substr(std::string("cadence::sim: ").size()));
    }
    if (std::isinf(s.workers[p].fails_at)) survivor = true;
  }
  if (!survivor) fail("every worker fails; at least one must survive the run");
}

/// @}
}  // namespace cadence::sim
