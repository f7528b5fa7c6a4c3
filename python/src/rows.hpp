// ZipLine input from Python without copying: a 2-D C-contiguous array is a matrix view; a
// list of 1-D arrays that lie end to end in one buffer (list(matrix), numpy.split) is a ragged
// view of that buffer; any other list of 1-D arrays is a separate view (one pointer per row),
// so the search reads every row where it is.
#pragma once

#include "bindings.hpp"

#include <cadence/zipline/rows.hpp>

#include <string>
#include <vector>

namespace cadence::python {

/// Rows extracted from Python, ready for rows_view<T>. Holds the arrays it views.
struct py_rows {
  elem type = elem::f64;
  std::vector<array_ref> arrays;      // the views (one for a 2-D array)
  bool matrix = false;                // a 2-D array: arrays[0], rows x cols
  bool adjacent = false;              // 1-D rows end to end in one buffer
  bool uniform = false;               // ... and all of one length (a matrix after all)
  std::vector<std::size_t> offsets;   // ragged offsets (n + 1), in elements from the first row
  const char* layout() const { return matrix ? "matrix" : adjacent ? "ragged" : "separate"; }
};

/// Reads `rows` (a 2-D array or a list/tuple of 1-D arrays, int64 or float64, C-contiguous);
/// throws array_type_error or invalid_parameter_error naming the argument or the row.
inline py_rows read_rows(nb::handle rows, const char* who) {
  py_rows out;
  const std::string name = std::string("cadence.") + who;
  if (nb::isinstance<nb::list>(rows) || nb::isinstance<nb::tuple>(rows)) {
    const std::size_t n = nb::len(rows);
    out.arrays.reserve(n);
    out.offsets.resize(n + 1);
    out.offsets[0] = 0;
    bool adjacent = true, uniform = true;
    std::size_t p = 0;
    for (nb::handle item : rows) {
      as_array(item, 1, name.c_str(), static_cast<long>(p), out.arrays.emplace_back());
      const array_ref& a = out.arrays.back();
      if (p == 0) {
        out.type = a.type;
      } else if (a.type != out.type) {
        auto dname = [](elem e) { return e == elem::i64 ? "int64" : "float64"; };
        throw array_type_error(name + ": row " + std::to_string(p) + " is " + dname(a.type) +
                               " but row 0 is " + dname(out.type) + "; all rows need one dtype");
      }
      out.offsets[p + 1] = out.offsets[p] + a.rows;
      if (a.rows != out.arrays[0].rows) uniform = false;
      const std::size_t elem_size = 8;
      if (a.rows == 0 ||
          static_cast<const char*>(a.data) !=
              static_cast<const char*>(out.arrays[0].data) + out.offsets[p] * elem_size)
        adjacent = false;
      ++p;
    }
    out.adjacent = adjacent && n > 0;
    out.uniform = uniform;
    return out;
  }
  if (nb::hasattr(rows, "__array_interface__") || nb::hasattr(rows, "__dlpack__") ||
      nb::hasattr(rows, "__array__")) {
    out.arrays.push_back(as_array(rows, 2, (name + ": rows").c_str()));
    out.type = out.arrays[0].type;
    out.matrix = true;
    return out;
  }
  throw array_type_error(name + ": rows must be a list of 1-D NumPy arrays (one per worker) or "
                         "a 2-D NumPy array, got " + std::string(nb::type_name(rows.type()).c_str()));
}

/// The rows_view<T> of `r`, in place; for rows that are not adjacent, their pointers go to
/// `pointers` (reused between calls). Call without the GIL: it only reads memory the py_rows
/// keeps alive.
template <class T>
rows_view<T> view_rows(const py_rows& r, std::vector<const T*>& pointers) {
  if (r.matrix) {
    const array_ref& a = r.arrays[0];
    return rows_view<T>::matrix(static_cast<const T*>(a.data), a.rows, a.cols);
  }
  const std::size_t n = r.arrays.size();
  if (r.adjacent) {
    const auto* base = static_cast<const T*>(r.arrays[0].data);
    const std::size_t width = r.arrays[0].rows;
    if (r.uniform) return rows_view<T>::matrix(base, n, width);
    return rows_view<T>::ragged(base, r.offsets.data(), n);
  }
  pointers.resize(n);
  for (std::size_t p = 0; p < n; ++p) pointers[p] = static_cast<const T*>(r.arrays[p].data);
  return rows_view<T>::separate(pointers.data(), r.offsets.data(), n);
}

}  // namespace cadence::python
