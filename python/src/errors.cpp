// cadence::error and its subclasses as Python exceptions. Each Python class derives from
// cadence.Error and from the built-in exception a Python user would catch for that mistake
// (ValueError for a bad config string or parameter, IndexError for an unknown worker, ...);
// the message is the C++ message unchanged.
#include "bindings.hpp"

#include <exception>
#include <new>

namespace cadence::python {

namespace {

// Owned by the module (attributes below); borrowed here for the translator.
struct error_types {
  PyObject* error = nullptr;
  PyObject* invalid_parameter = nullptr;
  PyObject* worker = nullptr;
  PyObject* time = nullptr;
  PyObject* parse = nullptr;
  PyObject* zipline_input = nullptr;
  PyObject* timeout = nullptr;
  PyObject* deadlock = nullptr;
  PyObject* device = nullptr;
  PyObject* transport = nullptr;
  PyObject* array_type = nullptr;
};
error_types types;

PyObject* make_type(nb::module_& m, const char* name, std::initializer_list<PyObject*> bases,
                    const char* doc) {
  nb::tuple b = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(bases.size())));
  Py_ssize_t i = 0;
  for (PyObject* base : bases) {
    Py_INCREF(base);
    PyTuple_SET_ITEM(b.ptr(), i++, base);
  }
  const std::string qualified = std::string("cadence.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, b.ptr(), nullptr);
  if (!t) throw nb::python_error();
  m.attr(name) = nb::steal(t);
  return t;
}

}  // namespace

void bind_errors(nb::module_& m) {
  types.error = make_type(m, "Error", {PyExc_RuntimeError},
                          "Base of every exception Cadence raises (C++ cadence::error).");
  types.invalid_parameter = make_type(
      m, "InvalidParameterError", {types.error, PyExc_ValueError},
      "A parameter is out of range (negative staleness, s_U < s_L, lookahead 0, ...).");
  types.worker = make_type(
      m, "WorkerError", {types.error, PyExc_IndexError},
      "A worker id that is out of range, unknown, already removed, or used against the protocol "
      "(for example a push from a worker that still waits to be released).");
  types.time = make_type(m, "TimeError", {types.error, PyExc_ValueError},
                         "A timestamp that is NaN, infinite, or earlier than one already seen.");
  types.parse = make_type(m, "ParseError", {types.error, PyExc_ValueError},
                          "Malformed text: a policy config string, a predictor spec, a ZipLine "
                          "variant name.");
  types.zipline_input = make_type(
      m, "ZiplineInputError", {types.error, PyExc_ValueError},
      "Input to a ZipLine search that violates its contract (no rows, empty row, row not "
      "strictly increasing, non-finite value).");
  types.timeout = make_type(m, "TimeoutError", {types.error, PyExc_TimeoutError},
                            "A blocking wait ran past its deadline.");
  types.deadlock = make_type(m, "DeadlockError", {types.error},
                             "Every active worker waits: no push can ever release them.");
  types.device = make_type(m, "DeviceError", {types.error},
                           "A failure reported by a device backend (CUDA, Thrust).");
  types.transport = make_type(m, "TransportError", {types.error},
                              "A communication call failed (deadline, lost peer, disagreement).");

  types.array_type = make_type(
      m, "ArrayTypeError", {types.error, PyExc_TypeError},
      "An argument that is not a NumPy array of the element type required (int64 or float64), "
      "or not in CPU memory.");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const invalid_parameter_error& e) {
      PyErr_SetString(types.invalid_parameter, e.what());
    } catch (const worker_error& e) {
      PyErr_SetString(types.worker, e.what());
    } catch (const time_error& e) {
      PyErr_SetString(types.time, e.what());
    } catch (const parse_error& e) {
      PyErr_SetString(types.parse, e.what());
    } catch (const zipline_input_error& e) {
      PyErr_SetString(types.zipline_input, e.what());
    } catch (const timeout_error& e) {
      PyErr_SetString(types.timeout, e.what());
    } catch (const deadlock_error& e) {
      PyErr_SetString(types.deadlock, e.what());
    } catch (const device_error& e) {
      PyErr_SetString(types.device, e.what());
    } catch (const transport_error& e) {
      PyErr_SetString(types.transport, e.what());
    } catch (const array_type_error& e) {
      PyErr_SetString(types.array_type, e.what());
    } catch (const error& e) {
      PyErr_SetString(types.error, e.what());
    }
  });
}

}  // namespace cadence::python
