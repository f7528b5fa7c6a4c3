// Controllers: cadence.Controller holds an any_controller (one virtual call per push, as in
// C++ make_controller), and BSP, ASP, SSP, DSSP and ElasticBSP are its subclasses, built from
// the concrete C++ policies, with each policy's own introspection. make_controller returns the
// subclass that matches the policy the config string names.
#include "bindings.hpp"

#include <cadence/controllers/make_controller.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence::python {

namespace {

using any_dssp = basic_dssp<any_predictor<timestamp>>;
using last_dssp = basic_dssp<last_interval>;

/// What push() returns: whether the pusher proceeds, and whom its push released.
struct py_decision {
  bool proceed = false;
  std::vector<worker_id> released;
};

struct py_controller {
  any_controller c;
};
struct py_bsp : py_controller {};
struct py_asp : py_controller {};
struct py_ssp : py_controller {};
struct py_dssp : py_controller {};
struct py_elastic : py_controller {};

std::size_t to_count(std::int64_t v, const char* who, const char* what) {
  if (v < 0)
    throw invalid_parameter_error(std::string("cadence.") + who + ": " + what +
                                  " must be >= 0, got " + std::to_string(v));
  return static_cast<std::size_t>(v);
}

template <class F>
auto visit_dssp(const any_controller& c, F&& f) -> decltype(f(std::declval<const last_dssp&>())) {
  if (const auto* d = c.target<last_dssp>()) return f(*d);
  if (const auto* d = c.target<any_dssp>()) return f(*d);
  throw error("cadence.DSSP: the controller does not hold a DSSP policy");
}

const elastic_bsp& as_elastic(const any_controller& c) {
  if (const auto* e = c.target<elastic_bsp>()) return *e;
  throw error("cadence.ElasticBSP: the controller does not hold an ElasticBSP policy");
}

/// The most specific Python class for a controller built from a config string.
nb::object wrap(any_controller c) {
  if (c.target<bsp>()) return nb::cast(py_bsp{{std::move(c)}});
  if (c.target<asp>()) return nb::cast(py_asp{{std::move(c)}});
  if (c.target<ssp>()) return nb::cast(py_ssp{{std::move(c)}});
  if (c.target<last_dssp>() || c.target<any_dssp>()) return nb::cast(py_dssp{{std::move(c)}});
  if (c.target<elastic_bsp>()) return nb::cast(py_elastic{{std::move(c)}});
  return nb::cast(py_controller{std::move(c)});
}

std::string kind_of(const any_controller& c) {
  const std::string config = c.config();
  return config.substr(0, config.find(':'));
}

}  // namespace

void bind_controllers(nb::module_& m) {
  nb::class_<py_decision>(m, "Decision",
                          "What a controller decided after one push.\n\n"
                          "Attributes:\n"
                          "    proceed: True if the pushing worker may start its next iteration "
                          "now; False if it waits until a later push or removal releases it.\n"
                          "    released: ids of the workers this push released, in release order.")
      .def_ro("proceed", &py_decision::proceed, "True if the pusher proceeds at once.")
      .def_ro("released", &py_decision::released, "Workers released by this push, in order.")
      .def("__repr__", [](const py_decision& d) {
        std::string s = std::string("Decision(proceed=") + (d.proceed ? "True" : "False") +
                        ", released=[";
        for (std::size_t i = 0; i < d.released.size(); ++i)
          s += (i ? ", " : "") + std::to_string(d.released[i]);
        return s + "])";
      });

  nb::class_<superstep_status>(m, "SuperstepStatus",
                               "Where a policy that synchronises in supersteps stands.")
      .def_ro("barriers", &superstep_status::barriers, "Barriers completed so far.")
      .def_ro("monitoring", &superstep_status::monitoring,
              "True while the current superstep is monitoring (no barrier planned yet).")
      .def("__repr__", [](const superstep_status& s) {
        return "SuperstepStatus(barriers=" + std::to_string(s.barriers) +
               ", monitoring=" + (s.monitoring ? "True" : "False") + ")";
      });

  nb::class_<elastic_plan>(m, "ElasticPlan", "The barrier plan an ElasticBSP controller follows.")
      .def_ro("planned", &elastic_plan::planned, "False during monitoring (no barrier planned).")
      .def_ro("barrier", &elastic_plan::barrier, "Predicted barrier time (latest chosen push).")
      .def_ro("spread", &elastic_plan::spread, "Predicted spread of the chosen pushes.")
      .def_ro("planned_at", &elastic_plan::planned_at, "Time at which the plan was made.")
      .def_ro("remaining", &elastic_plan::remaining,
              "Per worker id: pushes still to make before the barrier (0: already waits; -1: not "
              "part of this superstep).")
      .def("__repr__", [](const elastic_plan& p) {
        return std::string("ElasticPlan(planned=") + (p.planned ? "True" : "False") +
               ", barrier=" + std::to_string(p.barrier) + ", spread=" + std::to_string(p.spread) +
               ")";
      });

  auto ctl = nb::class_<py_controller>(
      m, "Controller",
      "A synchronization controller: decides, after each push of a worker, whether the worker "
      "proceeds and whom the push releases. Workers have dense ids 0..workers-1; "
      "add_worker() issues the next. Build one with cadence.make_controller(config, workers) or "
      "a policy class (BSP, ASP, SSP, DSSP, ElasticBSP). Every call holds the GIL, so Python "
      "threads sharing a controller are serialized.");
  ctl.def(
         "push",
         [](py_controller& self, std::int64_t worker, double time) {
           const decision d = self.c.push(to_worker(worker, "Controller.push"), time);
           return py_decision{d.proceed, std::vector<worker_id>(d.released.begin(), d.released.end())};
         },
         nb::arg("worker"), nb::arg("time"),
         "Worker `worker` finished an iteration; `time` is the push's timestamp (any unit, "
         "non-decreasing, finite).\n\nReturns a Decision (proceed, released). Raises WorkerError "
         "for an unknown, removed or waiting worker and TimeError for a non-finite time or one "
         "earlier than the last push; a push that raises changes nothing.")
      .def(
          "remove_worker",
          [](py_controller& self, std::int64_t worker) {
            const span<const worker_id> r = self.c.remove_worker(to_worker(worker, "Controller.remove_worker"));
            return std::vector<worker_id>(r.begin(), r.end());
          },
          nb::arg("worker"),
          "Removes a worker that left or died; returns the ids of the workers this released. "
          "Raises WorkerError, changing nothing, for an unknown or removed worker.")
      .def(
          "add_worker", [](py_controller& self) { return self.c.add_worker(); },
          "Adds a worker (at the slowest active clock) and returns its new id.")
      .def(
          "clock",
          [](const py_controller& self, std::int64_t w) { return self.c.clock(to_worker(w, "Controller.clock")); },
          nb::arg("worker"), "Pushes the worker has made (a joiner starts at the slowest clock).")
      .def(
          "is_active",
          [](const py_controller& self, std::int64_t w) {
            return w >= 0 && w <= std::numeric_limits<worker_id>::max() &&
                   self.c.is_active(static_cast<worker_id>(w));
          },
          nb::arg("worker"), "True if the id was issued and the worker has not been removed.")
      .def(
          "is_waiting",
          [](const py_controller& self, std::int64_t w) {
            return self.c.is_waiting(to_worker(w, "Controller.is_waiting"));
          },
          nb::arg("worker"), "True if the worker waits to be released.")
      .def(
          "staleness",
          [](const py_controller& self, std::int64_t w) {
            return self.c.staleness(to_worker(w, "Controller.staleness"));
          },
          nb::arg("worker"), "How many clocks the worker is ahead of the slowest active one.")
      .def(
          "waiting_for",
          [](const py_controller& self, std::int64_t w) {
            return self.c.waiting_for(to_worker(w, "Controller.waiting_for"));
          },
          nb::arg("worker"), "The active workers this (waiting) worker waits for.")
      .def_prop_ro(
          "config", [](const py_controller& self) { return self.c.config(); },
          "The config string make_controller() parses back into this policy.")
      .def_prop_ro(
          "name", [](const py_controller& self) { return kind_of(self.c); },
          "The policy's name: 'bsp', 'asp', 'ssp', 'dssp' or 'elastic'.")
      .def_prop_ro(
          "worker_capacity", [](const py_controller& self) { return self.c.worker_capacity(); },
          "Worker ids issued so far (active or removed).")
      .def_prop_ro(
          "active_workers", [](const py_controller& self) { return self.c.active_workers(); },
          "Number of active workers.")
      .def_prop_ro(
          "workers",
          [](const py_controller& self) {
            std::vector<worker_id> out;
            for (std::size_t p = 0; p < self.c.worker_capacity(); ++p)
              if (self.c.is_active(static_cast<worker_id>(p))) out.push_back(static_cast<worker_id>(p));
            return out;
          },
          "Ids of the active workers, ascending.")
      .def_prop_ro(
          "clocks",
          [](const py_controller& self) {
            std::vector<std::optional<clock_value>> out(self.c.worker_capacity());
            for (std::size_t p = 0; p < out.size(); ++p)
              if (self.c.is_active(static_cast<worker_id>(p))) out[p] = self.c.clock(static_cast<worker_id>(p));
            return out;
          },
          "Per worker id: its clock (iterations pushed), or None for a removed worker.")
      .def_prop_ro(
          "min_clock", [](const py_controller& self) { return self.c.min_clock(); },
          "Smallest clock among active workers (0 when none is active).")
      .def_prop_ro(
          "max_staleness", [](const py_controller& self) { return self.c.max_staleness(); },
          "Largest staleness over active workers right now.")
      .def_prop_ro(
          "staleness_bound",
          [](const py_controller& self) -> std::optional<clock_value> {
            const any_controller& c = self.c;
            if (const auto* s = c.target<ssp>()) return s->staleness_bound();
            if (const auto* s = c.target<bsp>()) return s->staleness_bound();
            if (c.target<asp>()) return std::nullopt;
            if (c.target<last_dssp>() || c.target<any_dssp>())
              return visit_dssp(c, [](const auto& d) { return d.staleness_bound(); });
            return std::nullopt;
          },
          "The largest clock gap the policy lets a worker start an iteration with (s for SSP, "
          "0 for BSP, s_U for DSSP); None when unbounded (ASP, ElasticBSP).")
      .def_prop_ro(
          "supersteps", [](const py_controller& self) { return self.c.supersteps(); },
          "SuperstepStatus for policies that synchronise in supersteps (ElasticBSP), else None.")
      .def("__repr__", [](const py_controller& self) {
        return "cadence.make_controller('" + self.c.config() + "', " +
               std::to_string(self.c.worker_capacity()) + ")";
      })
      .def("__copy__", [](const py_controller& self) { return wrap(self.c); },
           nb::sig("def __copy__(self) -> Controller"), "An independent copy (same class and state).")
      .def(
          "__deepcopy__", [](const py_controller& self, nb::handle) { return wrap(self.c); },
          nb::arg("memo"), nb::sig("def __deepcopy__(self, memo: object) -> Controller"),
          "An independent copy (same class and state).");

  nb::class_<py_bsp, py_controller>(m, "BSP",
                                    "Bulk Synchronous Parallel: a barrier after every iteration.")
      .def(
          "__init__",
          [](py_bsp* self, std::int64_t workers) {
            new (self) py_bsp{{bsp(to_count(workers, "BSP", "workers"))}};
          },
          nb::arg("workers"), "BSP for `workers` workers (ids 0..workers-1).");

  nb::class_<py_asp, py_controller>(m, "ASP", "Asynchronous Parallel: nobody ever waits.")
      .def(
          "__init__",
          [](py_asp* self, std::int64_t workers) {
            new (self) py_asp{{asp(to_count(workers, "ASP", "workers"))}};
          },
          nb::arg("workers"), "ASP for `workers` workers (ids 0..workers-1).");

  nb::class_<py_ssp, py_controller>(
      m, "SSP",
      "Stale Synchronous Parallel: a worker proceeds while it is at most s clocks ahead of the "
      "slowest.")
      .def(
          "__init__",
          [](py_ssp* self, std::int64_t workers, clock_value s) {
            new (self) py_ssp{{ssp(to_count(workers, "SSP", "workers"), s)}};
          },
          nb::arg("workers"), nb::arg("s"), "SSP(s) for `workers` workers; s >= 0.");

  nb::class_<py_dssp, py_controller>(
      m, "DSSP",
      "Dynamic SSP: SSP whose threshold adapts within [s_lower, s_upper] from predicted push "
      "times.")
      .def(
          "__init__",
          [](py_dssp* self, std::int64_t workers, clock_value s_lower, clock_value s_upper,
             const std::string& predictor, std::optional<std::int64_t> history) {
            const std::size_t n = to_count(workers, "DSSP", "workers");
            if (predictor == "last" && !history) {
              new (self) py_dssp{{last_dssp(n, s_lower, s_upper)}};
            } else {
              const std::size_t h = history ? to_count(*history, "DSSP", "history") : 16;
              new (self) py_dssp{{any_dssp(n, s_lower, s_upper,
                                           make_predictor<timestamp>(predictor), h)}};
            }
          },
          nb::arg("workers"), nb::arg("s_lower"), nb::arg("s_upper"), nb::arg("predictor") = "last",
          nb::arg("history") = nb::none(),
          "DSSP(s_lower, s_upper) for `workers` workers; `predictor` is a predictor spec "
          "('last', 'mean:K', 'median:K', 'ewma:ALPHA'); `history` how many push times per worker "
          "it sees (default 16; 2 for 'last').")
      .def_prop_ro(
          "lower_bound",
          [](const py_dssp& self) { return visit_dssp(self.c, [](const auto& d) { return d.lower_bound(); }); },
          "s_L: a worker at most this far ahead always proceeds.")
      .def_prop_ro(
          "upper_bound",
          [](const py_dssp& self) { return visit_dssp(self.c, [](const auto& d) { return d.upper_bound(); }); },
          "s_U: no worker starts an iteration more than this far ahead.")
      .def_prop_ro(
          "grants",
          [](const py_dssp& self) { return visit_dssp(self.c, [](const auto& d) { return d.grants(); }); },
          "How many times the synchronization controller granted extra iterations.")
      .def_prop_ro(
          "predictor",
          [](const py_dssp& self) {
            return visit_dssp(self.c, [](const auto& d) { return std::string(d.predictor().name()); });
          },
          "The predictor spec ('last', 'median:5', ...).")
      .def(
          "extra_iterations",
          [](const py_dssp& self, std::int64_t w) {
            const worker_id p = to_worker(w, "DSSP.extra_iterations");
            return visit_dssp(self.c, [p](const auto& d) { return d.extra_iterations(p); });
          },
          nb::arg("worker"), "Extra iterations the worker may still run past the s_L check.");

  nb::class_<py_elastic, py_controller>(
      m, "ElasticBSP",
      "ElasticBSP: workers run freely between barriers, each placed where ZipLine predicts the "
      "arrivals are closest.")
      .def(
          "__init__",
          [](py_elastic* self, std::int64_t workers, std::int64_t lookahead,
             const std::string& predictor, const std::string& variant, std::int64_t history) {
            new (self) py_elastic{{elastic_bsp(
                to_count(workers, "ElasticBSP", "workers"),
                to_count(lookahead, "ElasticBSP", "lookahead"), make_predictor<timestamp>(predictor),
                parse_zipline_variant(variant), to_count(history, "ElasticBSP", "history"))}};
          },
          nb::arg("workers"), nb::arg("lookahead"), nb::arg("predictor") = "last",
          nb::arg("variant") = "fast", nb::arg("history") = 16,
          "ElasticBSP for `workers` workers with lookahead R = `lookahead` predicted pushes per "
          "worker, a predictor spec and a ZipLine variant ('fast', 'opt-bs', 'opt', 'zipline').")
      .def("plan", [](const py_elastic& self) { return as_elastic(self.c).plan(); },
           "The plan in force (ElasticPlan; planned=False during monitoring).")
      .def_prop_ro(
          "barriers", [](const py_elastic& self) { return as_elastic(self.c).barriers(); },
          "Barriers completed so far.")
      .def_prop_ro(
          "fallbacks", [](const py_elastic& self) { return as_elastic(self.c).fallbacks(); },
          "Supersteps that ended without a barrier (fewer than two participants, or "
          "predictions the search rejected).")
      .def_prop_ro(
          "last_superstep_iterations",
          [](const py_elastic& self) { return as_elastic(self.c).last_superstep_iterations(); },
          "Per worker id: pushes made in the last completed superstep.")
      .def_prop_ro(
          "max_superstep_iterations",
          [](const py_elastic& self) { return as_elastic(self.c).max_superstep_iterations(); },
          "The largest per-superstep iteration count of any worker so far.")
      .def_prop_ro(
          "is_monitoring", [](const py_elastic& self) { return as_elastic(self.c).is_monitoring(); },
          "True while no barrier is planned.")
      .def_prop_ro(
          "lookahead", [](const py_elastic& self) { return as_elastic(self.c).lookahead(); },
          "R: predicted pushes per worker.")
      .def_prop_ro(
          "predictor",
          [](const py_elastic& self) { return as_elastic(self.c).predictor().name(); },
          "The predictor spec.")
      .def_prop_ro(
          "variant",
          [](const py_elastic& self) { return std::string(to_string(as_elastic(self.c).variant())); },
          "The ZipLine variant name.");

  m.def(
      "make_controller",
      [](const std::string& config, std::int64_t workers) {
        return wrap(make_controller(config, to_count(workers, "make_controller", "workers")));
      },
      nb::arg("config"), nb::arg("workers"),
      nb::sig("def make_controller(config: str, workers: int) -> Controller"),
      "Builds the policy named by `config` for `workers` workers (ids 0..workers-1):\n\n"
      "    bsp | asp | ssp:<s> | dssp:<s_L>:<s_U>[:<predictor>] |\n"
      "    elastic:<R>[:<predictor>][:<variant>]\n\n"
      "predictor: last (default), mean:<k>, median:<k>, ewma:<alpha>; variant: fast (default), "
      "opt-bs, opt, zipline. Returns an instance of the matching class (BSP, ASP, SSP, DSSP, "
      "ElasticBSP), all Controller subclasses. Raises ParseError for a malformed string and "
      "InvalidParameterError for values out of range, both naming the string.");
  m.def("policy_grammar", [] { return std::string(detail::policy_grammar()); },
        "The grammar of the config strings make_controller accepts.");
}

}  // namespace cadence::python
