// Shared declarations of the cadence._core translation units: one bind_* function per area,
// and the helpers that turn Python arguments into checked C++ ones.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/types.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

namespace cadence::python {

namespace nb = nanobind;

/// An argument that is not an array of the required element type (a list where a NumPy
/// array is needed, int32 where int64 or float64 is needed, a GPU tensor): cadence.ArrayTypeError,
/// a TypeError. Wrong shapes and layouts are invalid_parameter_error (a ValueError).
class array_type_error : public error {
public:
  using error::error;
};

void bind_errors(nb::module_& m);
void bind_controllers(nb::module_& m);
void bind_predict(nb::module_& m);
void bind_zipline(nb::module_& m);
void bind_sim(nb::module_& m);
void bind_planner(nb::module_& m);
void bind_local_sgd(nb::module_& m);

/// A worker id from Python: any int, checked here so that -1 or 2**40 fails with the id in the
/// message (a worker_error, as the controllers throw for an unknown id) instead of nanobind's
/// generic "incompatible function arguments".
inline worker_id to_worker(std::int64_t p, const char* who) {
  if (p < 0 || p > static_cast<std::int64_t>(std::numeric_limits<worker_id>::max()))
    throw worker_error(std::string("cadence.") + who + ": worker id " + std::to_string(p) +
                       " is out of range (ids are 0 .. workers-1)");
  return static_cast<worker_id>(p);
}

/// Element types the bindings accept for timestamps.
enum class elem { i64, f64 };

/// A C-contiguous CPU array seen without copying: its data, its shape (rows x cols; cols = 1
/// for a 1-D array) and element type. `keep` holds the array while the view is used.
/// A Py_buffer held until this is destroyed (with the GIL held), movable.
class held_buffer {
public:
  // User-provided, and v_ is only read while held_: value-initialising an array_ref (one per
  // row of a list) would otherwise zero these 80 bytes twice, a tenth of reading the row.
  held_buffer() noexcept {}
  held_buffer(held_buffer&& o) noexcept : held_(o.held_) {
    if (held_) v_ = o.v_;
    o.held_ = false;
  }
  held_buffer& operator=(held_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      held_ = o.held_;
      if (held_) v_ = o.v_;
      o.held_ = false;
    }
    return *this;
  }
  ~held_buffer() { reset(); }
  /// Gets obj's buffer (strides and format); false, with no Python error set, if it has none.
  bool get(PyObject* obj) {
    reset();
    if (PyObject_GetBuffer(obj, &v_, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    return true;
  }
  void reset() noexcept {
    if (held_) PyBuffer_Release(&v_);
    held_ = false;
  }
  const Py_buffer& view() const noexcept { return v_; }

private:
  Py_buffer v_;  // valid while held_
  bool held_ = false;
};

struct array_ref {
  array_ref() noexcept {}  // user-provided: emplace_back() does not zero the whole struct first
  // A numpy.ndarray read directly (as_numpy_direct), kept alive while the view is used ...
  nb::object array;
  // ... or the buffer-protocol path's buffer, held until the view is dropped (with the GIL),
  // so that an exporter that can resize (array.array) refuses to while the search reads it
  // without the GIL ...
  held_buffer buffer;
  nb::ndarray<nb::ro> keep;  // ... or nanobind's view (DLPack, other arrays)
  const void* data = nullptr;
  std::size_t rows = 0, cols = 1, ndim = 1;
  elem type = elem::f64;
};

/// str(obj.dtype), or "an unknown dtype".
inline std::string dtype_name(nb::handle obj) {
  if (!nb::hasattr(obj, "dtype")) return "an unknown dtype";
  nb::object s = nb::steal(PyObject_Str(nb::object(obj.attr("dtype")).ptr()));
  if (!s.is_valid()) {
    PyErr_Clear();
    return "an unknown dtype";
  }
  return nb::borrow<nb::str>(s).c_str();
}

/// The first fields of a NumPy array object, as NumPy's C API declares them
/// (PyArrayObject_fields in numpy/ndarraytypes.h, the same from NumPy 1.7 to 2.x; npy_intp is
/// Py_ssize_t). Read only after numpy_direct() has checked them on an array of known shape.
struct numpy_array_head {
  PyObject_HEAD
  char* data;
  int nd;
  Py_ssize_t* dimensions;
  Py_ssize_t* strides;
  PyObject* base;
  PyObject* descr;
};

/// numpy.ndarray and its dtypes int64 and float64 (native byte order: builtin dtypes are
/// singletons, so `a.dtype is numpy.dtype("int64")` for every such array), found on first use
/// with the GIL held, and whether numpy_array_head matches this NumPy (checked on a 2 x 3
/// int64 array against its buffer). Not usable: every array takes the buffer protocol.
struct numpy_direct_state {
  bool tried = false, usable = false;
  PyTypeObject* ndarray = nullptr;
  PyObject* i64 = nullptr;
  PyObject* f64 = nullptr;
};

inline bool numpy_head_matches(PyObject* probe, const numpy_direct_state& np) {
  if (Py_TYPE(probe) != np.ndarray) return false;
  Py_buffer v;
  if (PyObject_GetBuffer(probe, &v, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  const auto* h = reinterpret_cast<const numpy_array_head*>(probe);
  const bool ok = h->data == v.buf && h->nd == 2 && v.ndim == 2 && h->dimensions[0] == 2 &&
                  h->dimensions[1] == 3 && h->strides[0] == 24 && h->strides[1] == 8 &&
                  h->descr == np.i64;
  PyBuffer_Release(&v);
  return ok;
}

/// Call with the GIL held. Constant-initialised, so no C++ static-initialisation guard: one
/// held across the import, which can release the GIL, could deadlock against a thread that
/// holds the GIL and waits for the guard; a thread that comes in meanwhile sees `tried` and
/// takes the buffer protocol.
inline const numpy_direct_state& numpy_direct() {
  static numpy_direct_state np;
  if (np.tried) return np;
  np.tried = true;
  nb::object numpy = nb::steal(PyImport_ImportModule("numpy"));
  if (!numpy.is_valid()) {
    PyErr_Clear();
    return np;
  }
  nb::object ndarray = nb::steal(PyObject_GetAttrString(numpy.ptr(), "ndarray"));
  nb::object empty = nb::steal(PyObject_GetAttrString(numpy.ptr(), "empty"));
  nb::object dtype = nb::steal(PyObject_GetAttrString(numpy.ptr(), "dtype"));
  if (!ndarray.is_valid() || !empty.is_valid() || !dtype.is_valid() || !PyType_Check(ndarray.ptr())) {
    PyErr_Clear();
    return np;
  }
  nb::object i64 = nb::steal(PyObject_CallFunction(dtype.ptr(), "s", "int64"));
  nb::object f64 = nb::steal(PyObject_CallFunction(dtype.ptr(), "s", "float64"));
  nb::object probe = nb::steal(PyObject_CallFunction(empty.ptr(), "((ii)s)", 2, 3, "int64"));
  if (!i64.is_valid() || !f64.is_valid() || !probe.is_valid()) {
    PyErr_Clear();
    return np;
  }
  np.ndarray = reinterpret_cast<PyTypeObject*>(ndarray.ptr());
  np.i64 = i64.ptr();
  np.f64 = f64.ptr();
  np.usable = numpy_head_matches(probe.ptr(), np);
  // Kept for the life of the process (the module objects they come from are never unloaded).
  ndarray.release();
  i64.release();
  f64.release();
  return np;
}

/// The commonest case, fastest: an exact numpy.ndarray of int64 or float64, 1 or 2 dimensions,
/// C-contiguous, read from the array object (a few loads where the buffer protocol costs about
/// 50 ns a row: NumPy builds and compares a format string on every export, which for a list
/// of 1000 rows was 70% of reading it). Returns false for anything else.
inline bool as_numpy_direct(nb::handle obj, int ndims, array_ref& out) {
  const numpy_direct_state& np = numpy_direct();
  if (!np.usable || Py_TYPE(obj.ptr()) != np.ndarray) return false;
  const auto* h = reinterpret_cast<const numpy_array_head*>(obj.ptr());
  if (h->descr == np.i64)
    out.type = elem::i64;
  else if (h->descr == np.f64)
    out.type = elem::f64;
  else
    return false;
  if (h->nd < 1 || h->nd > 2 || (ndims != 0 && h->nd != ndims)) return false;
  const std::size_t rows = static_cast<std::size_t>(h->dimensions[0]);
  const std::size_t cols = h->nd == 2 ? static_cast<std::size_t>(h->dimensions[1]) : 1;
  const bool contiguous =
      h->nd == 1 ? rows <= 1 || h->strides[0] == 8
                 : (cols <= 1 || h->strides[1] == 8) &&
                       (rows <= 1 || h->strides[0] == static_cast<Py_ssize_t>(8 * cols));
  if (!contiguous) return false;
  out.ndim = static_cast<std::size_t>(h->nd);
  out.rows = rows;
  out.cols = cols;
  out.data = h->data;
  out.array = nb::borrow(obj);
  return true;
}

/// The common case, fast: a NumPy array (or any buffer) of int64 or float64 that passes every
/// check, read through the buffer protocol (about half the cost of an nb::ndarray import,
/// which matters for a list of 1000 rows). Returns false, with no error set, for anything
/// else; as_array then takes nanobind's path, which also writes the error messages.
inline bool as_array_fast(nb::handle obj, int ndims, array_ref& out) {
  if (!PyObject_CheckBuffer(obj.ptr()) || !out.buffer.get(obj.ptr())) return false;
  const Py_buffer& v = out.buffer.view();
  bool ok = v.itemsize == 8 && v.format != nullptr && v.ndim >= 1 && v.ndim <= 2 &&
            (ndims == 0 || v.ndim == ndims);
  if (ok) {
    const char* f = v.format;
    if (*f == '@' || *f == '=' || *f == '<') ++f;  // native or little-endian (x86, ARM)
    if ((*f == 'q' || (*f == 'l' && sizeof(long) == 8)) && f[1] == '\0')
      out.type = elem::i64;
    else if (*f == 'd' && f[1] == '\0')
      out.type = elem::f64;
    else
      ok = false;
  }
  if (ok) {
    out.ndim = static_cast<std::size_t>(v.ndim);
    out.rows = static_cast<std::size_t>(v.shape[0]);
    out.cols = v.ndim == 2 ? static_cast<std::size_t>(v.shape[1]) : 1;
    if (v.ndim == 1)
      ok = out.rows <= 1 || v.strides[0] == 8;
    else
      ok = (out.cols <= 1 || v.strides[1] == 8) &&
           (out.rows <= 1 || v.strides[0] == static_cast<Py_ssize_t>(8 * out.cols));
    out.data = v.buf;
  }
  if (!ok) out.buffer.reset();
  return ok;
}

/// Sees `obj` as an int64 or float64 array of 1 or 2 dimensions (`ndims`: 1, 2, or 0 for
/// either), C-contiguous, on the CPU, without copying; otherwise throws array_type_error or
/// invalid_parameter_error whose message starts with `who` and, if row >= 0, "row <row>"
/// ("cadence.zipline: row 3").
/// This form fills `out` in place: an array_ref holds a Py_buffer (80 bytes), and moving one
/// per row of a list of 1000 rows cost about a tenth of reading them.
inline void as_array(nb::handle obj, int ndims, const char* who, long row, array_ref& out) {
  if (as_numpy_direct(obj, ndims, out) || as_array_fast(obj, ndims, out)) return;
  // Slow path: other array types (DLPack), and every error, whose message names `who` and
  // the row (built only here, so the fast path allocates nothing).
  const std::string what = std::string(who) + (row >= 0 ? ": row " + std::to_string(row) : "");
  if (!nb::try_cast(obj, out.keep, false)) {
    if (nb::hasattr(obj, "dtype") && nb::hasattr(obj, "shape"))  // an array of another kind
      throw array_type_error(what + ": dtype must be int64 or float64, got " + dtype_name(obj));
    throw array_type_error(what + ": expected a NumPy array of int64 or float64, got " +
                           std::string(nb::type_name(obj.type()).c_str()));
  }
  const auto& a = out.keep;
  if (a.device_type() != nb::device::cpu::value)
    throw array_type_error(what + ": the array is not in CPU memory (copy it to the CPU first)");
  if (a.dtype() == nb::dtype<std::int64_t>())
    out.type = elem::i64;
  else if (a.dtype() == nb::dtype<double>())
    out.type = elem::f64;
  else
    throw array_type_error(what + ": dtype must be int64 or float64, got " +
                           dtype_name(obj) +
                           " (convert with .astype(numpy.int64) or .astype(numpy.float64))");
  const std::size_t nd = a.ndim();
  if ((ndims != 0 && nd != static_cast<std::size_t>(ndims)) || nd < 1 || nd > 2)
    throw invalid_parameter_error(what + ": expected a " +
                                  (ndims == 0 ? std::string("1-D or 2-D") : std::to_string(ndims) + "-D") +
                                  " array, got " + std::to_string(nd) + "-D");
  out.ndim = nd;
  out.rows = a.shape(0);
  out.cols = nd == 2 ? a.shape(1) : 1;
  bool contiguous;
  if (nd == 1)
    contiguous = out.rows <= 1 || a.stride(0) == 1;
  else
    contiguous = (out.cols <= 1 || a.stride(1) == 1) &&
                 (out.rows <= 1 || a.stride(0) == static_cast<std::int64_t>(out.cols));
  if (!contiguous)
    throw invalid_parameter_error(what + ": the array is not C-contiguous (a strided view or a "
                                  "transpose); pass numpy.ascontiguousarray(...) of it");
  out.data = a.data();
}

inline array_ref as_array(nb::handle obj, int ndims, const char* who, long row = -1) {
  array_ref out;
  as_array(obj, ndims, who, row, out);
  return out;
}

}  // namespace cadence::python
