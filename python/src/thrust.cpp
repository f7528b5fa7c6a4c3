// cadence._thrust: ZipLine on the Thrust backend (OpenMP or serial C++ device system), built
// only when the CCCL headers are found. Its errors are raised as cadence._core's exception
// classes, looked up by name, so they are the same classes the rest of the package raises.
#include "rows.hpp"

#include <cadence/thrust/zipline.hpp>

#include <nanobind/stl/string.h>

#include <string>
#include <vector>

namespace cadence::python {

namespace {

template <class T>
struct thrust_solver {
  std::vector<const T*> pointers;  // rows_view::separate's, for separate arrays
  thrust_zipline_workspace ws;
  zipline_result<T> result;
};

template <class T>
nb::tuple solve(const py_rows& rows) {
  thread_local thrust_solver<T> s;  // workspaces are not thread-safe
  {
    nb::gil_scoped_release unlocked;
    zipline_thrust(view_rows<T>(rows, s.pointers), s.ws, s.result);
  }
  nb::list choice;
  for (const std::size_t c : s.result.choice) choice.append(c);
  return nb::make_tuple(s.result.spread, s.result.barrier, choice);
}

[[noreturn]] void raise(const char* type, const char* what) {
  nb::object cls = nb::module_::import_("cadence._core").attr(type);
  PyErr_SetString(cls.ptr(), what);
  throw nb::python_error();
}

}  // namespace

}  // namespace cadence::python

namespace nb = nanobind;

NB_MODULE(_thrust, m) {
  namespace py = cadence::python;
  m.doc() = "ZipLine on the Thrust backend; use cadence.zipline(rows, variant='thrust').";
  m.attr("device_system") = cadence::thrust_device_system_name();
  m.def(
      "_zipline",
      [](nb::handle rows) {
        try {
          const py::py_rows r = py::read_rows(rows, "zipline");
          return r.type == py::elem::i64 ? py::solve<std::int64_t>(r) : py::solve<double>(r);
        } catch (const cadence::zipline_input_error& e) {
          py::raise("ZiplineInputError", e.what());
        } catch (const cadence::invalid_parameter_error& e) {
          py::raise("InvalidParameterError", e.what());
        } catch (const py::array_type_error& e) {
          py::raise("ArrayTypeError", e.what());
        } catch (const cadence::device_error& e) {
          py::raise("DeviceError", e.what());
        } catch (const cadence::error& e) {
          py::raise("Error", e.what());
        }
      },
      nb::arg("rows").none(), "ZipLine with zipline_thrust; returns (spread, barrier, choice).");
}
