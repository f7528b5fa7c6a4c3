// cadence.OuterSchedule: the sync schedule of a local-SGD job (exchange::outer_schedule), the
// plan every rank computes from the records exchanged at each outer sync: fixed H, ElasticBSP's
// barriers, DSSP's bounded lag on inner steps, a K-of-M quorum with a grace window. Every rank
// feeds it the same gathered records and gets the same plan and hash, bit for bit, as the C++
// adapter (cadence::exchange::diloco); cadence.torch.DiLoCo is built on it.
#include "bindings.hpp"

#include <cadence/exchange/local_sgd/schedule.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace cadence::python {

namespace {

using exchange::outer_plan;
using exchange::outer_record;
using exchange::outer_schedule;
using exchange::schedule_kind;

std::size_t non_negative(std::int64_t v, const char* what) {
  if (v < 0)
    throw invalid_parameter_error(std::string("cadence.OuterSchedule: ") + what + " must be >= 0, got " +
                                  std::to_string(v));
  return static_cast<std::size_t>(v);
}

const char* kind_name(schedule_kind k) {
  switch (k) {
    case schedule_kind::fixed: return "fixed";
    case schedule_kind::elastic: return "elastic";
    case schedule_kind::lag: return "lag";
    case schedule_kind::quorum: return "quorum";
  }
  return "?";
}

std::vector<int> contributes_of(const outer_plan& p) {
  return std::vector<int>(p.contributes.begin(), p.contributes.end());
}

}  // namespace

void bind_local_sgd(nb::module_& m) {
  nb::class_<outer_plan>(m, "OuterPlan",
                         "The plan every rank of a local-SGD job follows until the next outer sync "
                         "(identical on every rank).")
      .def_ro("round", &outer_plan::round, "Outer syncs completed before this plan was made.")
      .def_ro("warmup", &outer_plan::warmup,
              "True while a timed schedule still lacks the step times it predicts from (and after a "
              "fallback): fixed steps (H, or ElasticBSP's one step).")
      .def_ro("steps", &outer_plan::steps, "Per rank: inner steps to run before it calls the next sync (>= 1).")
      .def_prop_ro("contributes", &contributes_of,
                   "Per rank: 1 when its pseudo-gradient goes into the next sync; 0 when it joins that "
                   "sync with nothing (a late rank under a quorum) and carries its local work on.")
      .def_ro("predicted_us", &outer_plan::predicted_us,
              "The predicted time of the next sync after this one, in microseconds (0 when not "
              "predicted).")
      .def_ro("hash", &outer_plan::hash, "The plan's hash, as checked across ranks (unsigned 64-bit).")
      .def("__repr__", [](const outer_plan& p) {
        std::string s = "OuterPlan(round=" + std::to_string(p.round) + ", warmup=" + (p.warmup ? "True" : "False") +
                        ", steps=[";
        for (std::size_t i = 0; i < p.steps.size(); ++i) s += (i ? ", " : "") + std::to_string(p.steps[i]);
        s += "], contributes=[";
        for (std::size_t i = 0; i < p.contributes.size(); ++i) s += (i ? ", " : "") + std::to_string(p.contributes[i]);
        return s + "], predicted_us=" + std::to_string(p.predicted_us) + ", hash=" + std::to_string(p.hash) + ")";
      });

  auto cls = nb::class_<outer_schedule>(
      m, "OuterSchedule",
      "When the ranks of a local-SGD job (DiLoCo) take an outer step, as a policy "
      "(cadence::exchange::outer_schedule). Configs:\n\n"
      "    fixed:<H>                                  every rank H inner steps\n"
      "    elastic:<R>[:<predictor>][:<variant>]      ElasticBSP's barriers, <= R steps per rank\n"
      "    lag:<H>:<s>[:<predictor>]                  every rank >= H steps, a faster one up to H + s\n"
      "    quorum:<K>:<H>[:<grace>[:<max lag>]][:<predictor>]  the outer step when K ranks finished H\n\n"
      "Pure planning on integers, so every rank computes the same plan from the same records. "
      "Record of one rank (record_words int64 values): [inner steps behind its pseudo-gradient, "
      "syncs its work has been carried, 1 if it contributes at this sync, the plan hash it "
      "followed (as a signed int64), the number of durations that follow (at most history), the "
      "latest step durations in microseconds, oldest first, zero-padded]; the RECORD_* class "
      "attributes are the words' indices.");
  cls.def(
         "__init__",
         [](outer_schedule* self, const std::string& config, std::int64_t ranks, std::int64_t history) {
           new (self) outer_schedule(config, non_negative(ranks, "ranks"), non_negative(history, "history"));
         },
         nb::arg("config"), nb::arg("ranks"), nb::arg("history") = 16,
         "The schedule `config` names for `ranks` ranks (>= 1), each record holding up to `history` "
         "durations (in [2, 1024]). Raises ParseError or InvalidParameterError naming the config.")
      .def_prop_ro("kind", [](const outer_schedule& s) { return std::string(kind_name(s.kind())); },
                   "The policy: 'fixed', 'elastic', 'lag' or 'quorum'.")
      .def_prop_ro("timed", &outer_schedule::timed,
                   "Whether a sync exchanges records (every schedule but fixed, whose plan is known).")
      .def_prop_ro("period", &outer_schedule::period, "H (R for elastic): the nominal inner steps per outer step.")
      .def_prop_ro("extra", &outer_schedule::extra, "s (lag only): the extra steps a faster rank may run.")
      .def_prop_ro("quorum", &outer_schedule::quorum,
                   "K (quorum only), as configured (more than the ranks means all of them).")
      .def_prop_ro("grace_milli", &outer_schedule::grace_milli,
                   "The grace window (quorum only), in thousandths of the K-th arrival time.")
      .def_prop_ro("max_lag", &outer_schedule::max_lag,
                   "Syncs a rank's work may be carried over before it must be waited for (quorum only).")
      .def_prop_ro("ranks", &outer_schedule::ranks, "Ranks planned for.")
      .def_prop_ro("history", &outer_schedule::history, "Durations a record holds at most.")
      .def_prop_ro("record_words", &outer_schedule::record_words,
                   "int64 values in one rank's record: RECORD_HEAD + history.")
      .def_prop_ro("most_steps", &outer_schedule::most_steps,
                   "The most inner steps a plan gives a rank before one sync.")
      .def_prop_ro("fallbacks", &outer_schedule::fallbacks,
                   "Timed plans that fell back to the warm-up plan because prediction failed.")
      .def_prop_ro("config", &outer_schedule::config,
                   "The canonical config string ('quorum:3:20:0.25:2:last', 'elastic:8:last:fast').")
      .def("first_plan", &outer_schedule::first_plan,
           "The plan before the first sync: warm-up steps for every rank, all contributing.")
      .def(
          "plan",
          [](outer_schedule& self, nb::handle records, std::uint64_t round) {
            const array_ref a = as_array(records, 0, "cadence.OuterSchedule.plan: records");
            if (a.type != elem::i64)
              throw array_type_error("cadence.OuterSchedule.plan: records must be int64, got float64");
            const std::size_t total = a.rows * a.cols;
            if (a.ndim == 2 && (a.rows != self.ranks() || a.cols != self.record_words()))
              throw invalid_parameter_error("cadence.OuterSchedule.plan: records has shape (" +
                                            std::to_string(a.rows) + ", " + std::to_string(a.cols) + "), expected (" +
                                            std::to_string(self.ranks()) + ", " + std::to_string(self.record_words()) +
                                            ") = (ranks, record_words)");
            // The GIL stays held: plan() updates the schedule (its workspace, its fallback count).
            return self.plan(span<const std::int64_t>(static_cast<const std::int64_t*>(a.data), total), round);
          },
          nb::arg("records").none(), nb::arg("round"),
          nb::sig("def plan(self, records: numpy.ndarray, round: int) -> OuterPlan"),
          "The plan after sync number `round` (1-based: the syncs completed, this one included) from "
          "the ranks' records: an int64 array of shape (ranks, record_words) or (ranks * "
          "record_words,), C-contiguous (what an all-gather of every rank's record yields). Raises "
          "InvalidParameterError for a wrong size or impossible values (naming the rank).")
      .def("__repr__", [](const outer_schedule& s) {
        return "cadence.OuterSchedule('" + s.config() + "', " + std::to_string(s.ranks()) +
               ", history=" + std::to_string(s.history()) + ")";
      });
  cls.attr("RECORD_STEPS") = outer_record::steps;
  cls.attr("RECORD_CARRIED") = outer_record::carried;
  cls.attr("RECORD_CONTRIBUTES") = outer_record::contributes;
  cls.attr("RECORD_HASH") = outer_record::hash;
  cls.attr("RECORD_HAVE") = outer_record::have;
  cls.attr("RECORD_HEAD") = outer_record::head;
}

}  // namespace cadence::python
