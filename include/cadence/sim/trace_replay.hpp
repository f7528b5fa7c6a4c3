/// \file
/// \ingroup sim
/// Trace replay: simulated workers whose iteration costs come from a recorded iteration trace
/// (cadence-train --trace, or a user's own cluster logs), so every policy can run on them.
#pragma once

#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/io/trace.hpp>
#include <cadence/sim/scenario.hpp>
#include <cadence/sim/simulator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// How a replay uses the trace.
struct replay_options {
  /// false (default): the run ends when the first worker has used all its recorded
  /// iterations, at the moment it would start another. true: a worker that has used them all
  /// starts again from its first (the run then needs a length: seconds or iterations).
  bool wrap = false;
  ///@{
  /// Push and pull cost of every iteration when the trace records none (has_costs false),
  /// or, when >= 0, instead of the recorded ones. < 0: the trace's (0 if it has none).
  double push_seconds = -1;
  double pull_seconds = -1;
  ///@}
};

/// The worker model fed from a trace: worker p's k-th iteration computes for the trace's
/// compute[p][k] and pays its push[p][k] and pull[p][k] (or replay_options' costs). The
/// recorded start times, and so the waits of the recorded run's policy, are not used: the
/// replayed policy decides the waits. A source for simulate_with (see model_source); the
/// trace must outlive it.
class trace_source {
public:
  /// Replays trace tr as options o say; tr must outlive the source.
  trace_source(const iteration_trace& tr, const replay_options& o) : tr_(&tr), o_(o), next_(tr.size(), 0) {}

  /// Writes the costs of p's next recorded iteration into out; false when p has used them all
  /// and o.wrap is false, which ends the run.
  bool next(worker_id p, double /*now*/, iteration_costs& out) {
    const auto& rows = tr_->workers[p];
    std::size_t& k = next_[p];
    if (k == rows.size()) {
      if (!o_.wrap) return false;
      k = 0;
      ++wraps_;
    }
    const trace_iteration& it = rows[k++];
    out.compute = it.compute;
    out.push = o_.push_seconds >= 0 ? o_.push_seconds : it.push;
    out.pull = o_.pull_seconds >= 0 ? o_.pull_seconds : it.pull;
    return true;
  }
  /// Times a worker started its rows again (with wrap).
  std::uint64_t wraps() const noexcept { return wraps_; }

private:
  const iteration_trace* tr_;
  replay_options o_;
  std::vector<std::size_t> next_;
  std::uint64_t wraps_ = 0;
};

/// A scenario for replaying tr: one worker per trace worker, labelled "trace", whose
/// worker_model's iteration_seconds is its mean recorded compute time (what tools use to
/// bound the work of a run; the replay itself uses the recorded times). Run length: until the
/// first worker runs out (iterations = the longest worker's row count, which the run cannot
/// reach first); set seconds or iterations to cut it shorter (or, with wrap, longer). push
/// and pull seconds are the trace's mean costs, and each worker's own push_seconds and
/// pull_seconds its mean recorded ones (informational for a replay, which pays each row's own;
/// what simulate would use on this scenario, so a worker on a slow link stays slow there).
/// The scenario is called `name`. Throws invalid_parameter_error for an empty trace.
inline scenario trace_scenario(const iteration_trace& tr, std::string name = "trace") {
  if (tr.size() == 0) throw invalid_parameter_error("cadence::sim::trace_scenario: the trace has no workers");
  scenario s;
  s.name = std::move(name);
  s.description = "replay of " + std::to_string(tr.iterations()) + " recorded iterations of " +
                  std::to_string(tr.size()) + " workers";
  std::size_t longest = 0;
  double push = 0, pull = 0;
  for (const auto& rows : tr.workers) {
    if (rows.empty()) throw invalid_parameter_error("cadence::sim::trace_scenario: a worker has no iterations");
    double total = 0, own_push = 0, own_pull = 0;
    for (const trace_iteration& it : rows) {
      total += it.compute;
      own_push += it.push;
      own_pull += it.pull;
    }
    push += own_push;
    pull += own_pull;
    const auto count = static_cast<double>(rows.size());
    worker_model m;
    // A worker that recorded only zero compute times still needs a positive model time.
    m.iteration_seconds = std::max(total / count, 1e-9);
    m.push_seconds = own_push / count;
    m.pull_seconds = own_pull / count;
    m.label = "trace";
    s.workers.push_back(m);
    longest = std::max(longest, rows.size());
  }
  const auto all = static_cast<double>(tr.iterations());
  s.push_seconds = push / all;
  s.pull_seconds = pull / all;
  s.seconds = 0;
  s.iterations = longest;
  return s;
}

/// Runs controller c (freshly built for s.workers.size() workers) on scenario s with the
/// iteration costs replayed from tr as ro says (see trace_source), measured as opt says
/// (see simulate). s is usually
/// trace_scenario(tr) with its run length adjusted; the run ends at s's length or, without
/// wrap, when the first worker runs out, whichever comes first. Throws
/// invalid_parameter_error when tr and s have different worker counts, or as simulate does.
template <class Controller,
          std::enable_if_t<!std::is_convertible_v<Controller&, std::string_view>, int> = 0>
run_metrics simulate_trace(Controller& c, const scenario& s, const iteration_trace& tr,
                           const replay_options& ro = {}, const run_options& opt = {}) {
  if (tr.size() != s.workers.size())
    throw invalid_parameter_error("cadence::sim::simulate_trace: the trace has " + std::to_string(tr.size()) +
                                  " workers but scenario '" + s.name + "' has " + std::to_string(s.workers.size()));
  for (std::size_t p = 0; p < tr.size(); ++p)
    if (tr.workers[p].empty())
      throw invalid_parameter_error("cadence::sim::simulate_trace: worker " + std::to_string(p) +
                                    " has no iterations");
  trace_source source(tr, ro);
  return simulate_with(c, s, source, opt);
}

/// Builds the policy from its config string (see make_controller) and replays tr on s, with
/// ro and opt as for simulate_trace(c, s, tr, ro, opt).
inline run_metrics simulate_trace(std::string_view policy, const scenario& s, const iteration_trace& tr,
                                  const replay_options& ro = {}, const run_options& opt = {}) {
  validate(s);
  any_controller c = make_controller(policy, s.workers.size());
  return simulate_trace(c, s, tr, ro, opt);
}

/// @}
}  // namespace cadence::sim
