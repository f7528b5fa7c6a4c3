// The simulator: one policy (or collective mode) on one named scenario, returned as the JSON
// object cadence-sim --json prints for it, so Python sees exactly the CLI's fields and numbers.
#include "bindings.hpp"

#include <cadence/controllers/make_controller.hpp>
#include <cadence/sim/collective.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace cadence::python {

namespace {

sim::scenario build_scenario(const std::string& name, std::int64_t workers, std::int64_t seed,
                             std::optional<double> seconds, std::optional<std::int64_t> iterations,
                             std::optional<double> push_cost, std::optional<double> pull_cost) {
  const char* who = "cadence.simulate: ";
  if (workers < 0)
    throw invalid_parameter_error(std::string(who) + "workers must be >= 0 (0: the scenario's own), got " +
                                  std::to_string(workers));
  if (seed < 0)
    throw invalid_parameter_error(std::string(who) + "seed must be >= 0, got " + std::to_string(seed));
  if (seconds && iterations)
    throw invalid_parameter_error(std::string(who) + "give seconds or iterations, not both");
  sim::scenario s = sim::make_scenario(name, static_cast<std::size_t>(workers),
                                       static_cast<std::uint64_t>(seed));
  if (seconds) {
    if (!(*seconds > 0) || !std::isfinite(*seconds))
      throw invalid_parameter_error(std::string(who) + "seconds must be finite and > 0, got " +
                                    std::to_string(*seconds));
    s.seconds = *seconds;
  }
  if (iterations) {
    if (*iterations < 1)
      throw invalid_parameter_error(std::string(who) + "iterations must be >= 1, got " +
                                    std::to_string(*iterations));
    s.seconds = 0;
    s.iterations = static_cast<std::uint64_t>(*iterations);
  }
  if (push_cost) s.push_seconds = *push_cost;
  if (pull_cost) s.pull_seconds = *pull_cost;
  sim::validate(s);
  return s;
}

}  // namespace

void bind_sim(nb::module_& m) {
  m.def(
      "_simulate",
      [](const std::string& policy, const std::string& scenario, std::int64_t workers,
         std::int64_t seed, std::optional<double> seconds, std::optional<std::int64_t> iterations,
         std::optional<double> push_cost, std::optional<double> pull_cost) {
        const sim::scenario s =
            build_scenario(scenario, workers, seed, seconds, iterations, push_cost, pull_cost);
        any_controller c = make_controller(policy, s.workers.size());
        sim::run_metrics r;
        {
          nb::gil_scoped_release unlocked;
          r = sim::simulate(c, s);
        }
        std::ostringstream os;
        sim::write_json(os, {r});
        return nb::make_tuple(os.str(), r.start_staleness_histogram, r.updates_behind_histogram);
      },
      nb::arg("policy"), nb::arg("scenario"), nb::arg("workers"), nb::arg("seed"),
      nb::arg("seconds").none(), nb::arg("iterations").none(), nb::arg("push_cost").none(),
      nb::arg("pull_cost").none(),
      "Runs one policy on a scenario; returns (cadence-sim JSON text, start-staleness "
      "histogram, updates-behind histogram). Use cadence.simulate.");
  m.def(
      "_simulate_collective",
      [](const std::string& mode, const std::string& scenario, std::int64_t workers,
         std::int64_t seed, std::optional<double> seconds, std::optional<std::int64_t> iterations,
         std::optional<double> push_cost, std::optional<double> pull_cost,
         std::optional<double> allreduce_cost) {
        const sim::scenario s =
            build_scenario(scenario, workers, seed, seconds, iterations, push_cost, pull_cost);
        sim::collective_options opt;
        if (allreduce_cost) opt.allreduce_seconds = *allreduce_cost;
        sim::collective_metrics r;
        {
          nb::gil_scoped_release unlocked;
          r = sim::simulate_collective(mode, s, opt);
        }
        std::ostringstream os;
        sim::write_collective_json(os, {r});
        return os.str();
      },
      nb::arg("mode"), nb::arg("scenario"), nb::arg("workers"), nb::arg("seed"),
      nb::arg("seconds").none(), nb::arg("iterations").none(), nb::arg("push_cost").none(),
      nb::arg("pull_cost").none(), nb::arg("allreduce_cost").none(),
      "Runs one collective mode on a scenario; returns cadence-sim --collective JSON text. Use "
      "cadence.simulate_collective.");
  m.def(
      "_scenarios",
      [] {
        nb::list out;
        for (const auto& info : sim::scenario_catalog()) {
          nb::dict d;
          d["name"] = info.name;
          d["default_workers"] = info.default_workers;
          d["seconds"] = sim::make_scenario(info.name).seconds;
          d["description"] = info.description;
          out.append(d);
        }
        return out;
      },
      "The named scenarios, as dicts (name, default_workers, seconds, description).");
}

}  // namespace cadence::python
