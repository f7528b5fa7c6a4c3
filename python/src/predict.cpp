// Push-time predictors: cadence.Predictor wraps any_predictor built by make_predictor, for
// float64 histories (seconds) and int64 ones (integer units, exact), and returns NumPy arrays.
#include "bindings.hpp"

#include <cadence/predict/any_predictor.hpp>

#include <nanobind/stl/string.h>

#include <cstring>
#include <string>

namespace cadence::python {

namespace {

struct py_predictor {
  any_predictor<double> f64;
  any_predictor<std::int64_t> i64;
};

template <class T>
nb::object predict_into(const any_predictor<T>& p, const array_ref& h, std::size_t r) {
  T* out = new T[r == 0 ? 1 : r];
  nb::capsule owner(out, [](void* v) noexcept { delete[] static_cast<T*>(v); });
  {
    nb::gil_scoped_release unlocked;
    p.predict(span<const T>(static_cast<const T*>(h.data), h.rows), r, out);
  }
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(out, {r}, owner));
}

}  // namespace

void bind_predict(nb::module_& m) {
  nb::class_<py_predictor>(
      m, "Predictor",
      "Predicts a worker's next push times from its latest ones. Specs: 'last' (the paper's: "
      "last interval repeated), 'mean:K' (mean of the last K intervals), 'median:K' (median, "
      "K <= 64), 'ewma:ALPHA' (exponentially weighted mean interval, 0 < ALPHA <= 1).")
      .def(
          "__init__",
          [](py_predictor* self, const std::string& spec) {
            new (self) py_predictor{make_predictor<double>(spec), make_predictor<std::int64_t>(spec)};
          },
          nb::arg("spec") = "last",
          "Builds the predictor named by `spec`. Raises ParseError for a malformed spec and "
          "InvalidParameterError for values out of range (mean:0, ewma:1.5).")
      .def_prop_ro(
          "name", [](const py_predictor& p) { return p.f64.name(); },
          "The spec make_predictor parses back into this predictor.")
      .def_prop_ro(
          "min_history", [](const py_predictor& p) { return p.f64.min_history(); },
          "The fewest push times predict() accepts.")
      .def(
          "predict",
          [](const py_predictor& p, nb::handle history, std::int64_t r) {
            if (r < 0)
              throw invalid_parameter_error("cadence.Predictor.predict: r must be >= 0, got " +
                                            std::to_string(r));
            const array_ref h = as_array(history, 1, "cadence.Predictor.predict: history");
            if (h.type == elem::i64) return predict_into(p.i64, h, static_cast<std::size_t>(r));
            return predict_into(p.f64, h, static_cast<std::size_t>(r));
          },
          nb::arg("history").none(), nb::arg("r"),
          nb::sig("def predict(self, history: numpy.ndarray, r: int) -> numpy.ndarray"),
          "The next `r` push times after `history` (a 1-D int64 or float64 NumPy array of a "
          "worker's latest push times, oldest first, non-decreasing), as a new array of the same "
          "dtype, strictly increasing and above history[-1]. int64 histories are predicted "
          "exactly. Raises InvalidParameterError for a history shorter than min_history and "
          "TimeError for a non-finite or decreasing one, or predictions that overflow.")
      .def("__repr__", [](const py_predictor& p) { return "cadence.Predictor('" + p.f64.name() + "')"; });
}

}  // namespace cadence::python
