// cadence._core: the compiled half of the cadence Python package. Each area binds itself from
// its own file; python/cadence/ re-exports the public names with typed wrappers.
#include "bindings.hpp"

#include <cadence/version.hpp>

NB_MODULE(_core, m) {
  namespace py = cadence::python;
  m.doc() = "Bindings over the Cadence C++ headers (controllers, predictors, ZipLine, simulator, "
            "elastic planner, local-SGD schedule). Import the public API from `cadence`, not from here.";
  m.attr("__version__") = CADENCE_VERSION_STRING;
  py::bind_errors(m);
  py::bind_controllers(m);
  py::bind_predict(m);
  py::bind_zipline(m);
  py::bind_sim(m);
  py::bind_planner(m);
  py::bind_local_sgd(m);
}
