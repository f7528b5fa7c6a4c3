// cadence.ElasticPlanner: the deterministic plan of ElasticBSP over collectives
// (exchange::elastic_planner). Every rank feeds it the same gathered timing records and gets
// the same steps and hash, bit for bit; cadence.torch's averager is built on it.
#include "bindings.hpp"

#include <cadence/controllers/elastic_planner.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace cadence::python {

namespace {

using exchange::elastic_planner;
using exchange::elastic_round;

std::size_t non_negative(std::int64_t v, const char* what) {
  if (v < 0)
    throw invalid_parameter_error(std::string("cadence.ElasticPlanner: ") + what +
                                  " must be >= 0, got " + std::to_string(v));
  return static_cast<std::size_t>(v);
}

}  // namespace

void bind_planner(nb::module_& m) {
  nb::class_<elastic_round>(m, "ElasticRound",
                            "The plan every rank follows until the next barrier (identical on "
                            "every rank).")
      .def_ro("barrier", &elastic_round::barrier,
              "Barriers completed before this plan was made (0: the plan for the first).")
      .def_ro("warmup", &elastic_round::warmup,
              "True during warm-up and after a fallback: one step per rank (BSP).")
      .def_ro("steps", &elastic_round::steps,
              "Per rank: local steps to run before the next barrier, each in [1, R].")
      .def_ro("predicted_barrier_us", &elastic_round::predicted_barrier_us,
              "ZipLine's predicted barrier, microseconds after the last barrier (0 in warm-up).")
      .def_ro("predicted_spread_us", &elastic_round::predicted_spread_us,
              "ZipLine's predicted spread of the arrivals, microseconds (0 in warm-up).")
      .def_ro("hash", &elastic_round::hash,
              "FNV-1a hash of the configuration and the plan; ranks compare it to detect "
              "divergence.")
      .def("__repr__", [](const elastic_round& r) {
        std::string s = "ElasticRound(barrier=" + std::to_string(r.barrier) +
                        ", warmup=" + (r.warmup ? "True" : "False") + ", steps=[";
        for (std::size_t i = 0; i < r.steps.size(); ++i)
          s += (i ? ", " : "") + std::to_string(r.steps[i]);
        return s + "], hash=" + std::to_string(r.hash) + ")";
      });

  nb::class_<elastic_planner>(
      m, "ElasticPlanner",
      "ElasticBSP's planning step over collectives: from every rank's timing record, the local "
      "steps each rank runs before the next barrier. Deterministic (integer microseconds), so "
      "every rank computes the same plan.\n\n"
      "Record of one rank (record_words int64 values): [local steps since the last barrier, "
      "number of durations that follow (at most history), the latest step durations in "
      "microseconds, oldest first, zero-padded]. make_record() builds one.")
      .def(
          "__init__",
          [](elastic_planner* self, const std::string& config, std::int64_t ranks,
             std::int64_t history, std::int64_t warmup_steps) {
            new (self) elastic_planner(config, non_negative(ranks, "ranks"),
                                       non_negative(history, "history"),
                                       non_negative(warmup_steps, "warmup_steps"));
          },
          nb::arg("config"), nb::arg("ranks"), nb::arg("history") = 16, nb::arg("warmup_steps") = 0,
          "`config` is 'elastic:<R>[:<predictor>][:<variant>]'; `ranks` >= 1; `history` in "
          "[2, 1024] durations per record; `warmup_steps` BSP steps before the first plan (0: "
          "what the predictor needs). Raises ParseError or InvalidParameterError naming the "
          "config.")
      .def_prop_ro("record_words", &elastic_planner::record_words,
                   "int64 values in one rank's record: history + 2.")
      .def_prop_ro("ranks", &elastic_planner::ranks, "Number of ranks.")
      .def_prop_ro("history", &elastic_planner::history, "Durations a record holds at most.")
      .def_prop_ro("lookahead", &elastic_planner::lookahead, "R: predicted steps per rank.")
      .def_prop_ro("warmup_steps", &elastic_planner::warmup_steps,
                   "BSP steps before the first plan.")
      .def_prop_ro("fallbacks", &elastic_planner::fallbacks,
                   "Plans that fell back to BSP because prediction or search failed.")
      .def_prop_ro("config", &elastic_planner::config,
                   "The canonical config 'elastic:<R>:<predictor>:<variant>'.")
      .def("bsp_round", &elastic_planner::bsp_round, nb::arg("barrier"), nb::arg("salt") = 0,
           "The warm-up plan (one step per rank) for `barrier`, hashed with `salt`.")
      .def(
          "plan",
          [](elastic_planner& self, nb::handle records, std::uint64_t barrier, std::uint64_t salt) {
            const array_ref a = as_array(records, 0, "cadence.ElasticPlanner.plan: records");
            if (a.type != elem::i64)
              throw array_type_error("cadence.ElasticPlanner.plan: records must be int64, got float64");
            const std::size_t total = a.rows * a.cols;
            if (a.ndim == 2 && (a.rows != self.ranks() || a.cols != self.record_words()))
              throw invalid_parameter_error(
                  "cadence.ElasticPlanner.plan: records has shape (" + std::to_string(a.rows) + ", " +
                  std::to_string(a.cols) + "), expected (" + std::to_string(self.ranks()) + ", " +
                  std::to_string(self.record_words()) + ") = (ranks, record_words)");
            // The GIL stays held: plan() updates the planner (its workspace, its fallback
            // count), so two threads must not run it on one planner at once. It is fast: one
            // prediction per rank and one ZipLine search over ranks x R points.
            return self.plan(span<const std::int64_t>(static_cast<const std::int64_t*>(a.data), total),
                             barrier, salt);
          },
          nb::arg("records").none(), nb::arg("barrier"), nb::arg("salt") = 0,
          nb::sig("def plan(self, records: numpy.ndarray, barrier: int, salt: int = 0) -> ElasticRound"),
          "The plan for barrier `barrier` + 1 from the ranks' records: an int64 array of shape "
          "(ranks, record_words) or (ranks * record_words,), C-contiguous (what an all-gather of "
          "make_record() yields). `salt` enters the hash.")
      .def("__repr__", [](const elastic_planner& p) {
        return "cadence.ElasticPlanner('" + p.config() + "', " + std::to_string(p.ranks()) +
               ", history=" + std::to_string(p.history()) + ", warmup_steps=" +
               std::to_string(p.warmup_steps()) + ")";
      });
}

}  // namespace cadence::python
