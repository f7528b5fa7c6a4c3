// ZipLine on NumPy rows: the CPU variants through zipline_solve, on the caller's memory (see
// rows.hpp), with the GIL released during the search and a workspace reused per thread.
// Also the native timing loops python/bench/bench_bindings.py compares the bindings against.
#include "bindings.hpp"
#include "rows.hpp"

#include <cadence/controllers/make_controller.hpp>
#include <cadence/zipline/variant.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace cadence::python {

namespace {

template <class T>
struct solver {
  std::vector<const T*> pointers;  // rows_view::separate's, for separate arrays
  zipline_workspace<T> ws;
  zipline_result<T> result;
};

template <class T>
solver<T>& thread_solver() {
  thread_local solver<T> s;  // one per thread: workspaces are not thread-safe
  return s;
}

template <class T>
nb::tuple solve(const py_rows& rows, zipline_variant v) {
  solver<T>& s = thread_solver<T>();
  {
    nb::gil_scoped_release unlocked;
    zipline_solve(v, view_rows<T>(rows, s.pointers), s.ws, s.result);
  }
  nb::list choice;
  for (const std::size_t c : s.result.choice) choice.append(c);
  return nb::make_tuple(s.result.spread, s.result.barrier, choice);
}

template <class T>
double native_zipline_seconds(const py_rows& rows, zipline_variant v, std::size_t repeat) {
  solver<T>& s = thread_solver<T>();
  nb::gil_scoped_release unlocked;
  const rows_view<T> view = view_rows<T>(rows, s.pointers);
  double best = 0;
  for (std::size_t k = 0; k < repeat; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    zipline_solve(v, view, s.ws, s.result);
    const auto t1 = std::chrono::steady_clock::now();
    const double sec = std::chrono::duration<double>(t1 - t0).count();
    best = k == 0 ? sec : std::min(best, sec);
  }
  return best;
}

}  // namespace

void bind_zipline(nb::module_& m) {
  m.def(
      "_zipline",
      [](nb::handle rows, const std::string& variant) {
        const zipline_variant v = parse_zipline_variant(variant);
        const py_rows r = read_rows(rows, "zipline");
        return r.type == elem::i64 ? solve<std::int64_t>(r, v) : solve<double>(r, v);
      },
      nb::arg("rows").none(), nb::arg("variant") = "fast",
      "ZipLine with a CPU variant; returns (spread, barrier, choice). Use cadence.zipline.");
  m.def(
      "_rows_layout",
      [](nb::handle rows) {
        const py_rows r = read_rows(rows, "zipline");
        const auto address = reinterpret_cast<std::uintptr_t>(r.arrays.empty() ? nullptr : r.arrays[0].data);
        return nb::make_tuple(std::string(r.layout()), address);
      },
      nb::arg("rows").none(),
      "How zipline() would read `rows`: ('matrix' | 'ragged' | 'separate', address of the first "
      "row's data). All three read the caller's memory in place (no copy).");
  m.def("_cpu_variants", [] {
    return std::vector<std::string>{"zipline", "opt", "opt-bs", "fast"};
  }, "The ZipLine variant names of the CPU (built into cadence._core).");

  // Native baselines for the benchmark: the same C++ calls without Python in the loop.
  m.def(
      "_native_zipline_seconds",
      [](nb::handle rows, const std::string& variant, std::int64_t repeat) {
        const zipline_variant v = parse_zipline_variant(variant);
        const py_rows r = read_rows(rows, "zipline");
        const auto k = static_cast<std::size_t>(std::max<std::int64_t>(repeat, 1));
        return r.type == elem::i64 ? native_zipline_seconds<std::int64_t>(r, v, k)
                                   : native_zipline_seconds<double>(r, v, k);
      },
      nb::arg("rows").none(), nb::arg("variant"), nb::arg("repeat"),
      "Best wall time in seconds of `repeat` zipline_solve calls from C++ on `rows` (reused "
      "workspace; benchmark baseline).");
  m.def(
      "_native_push_ns",
      [](const std::string& config, std::int64_t workers, std::int64_t rounds) {
        const auto n = static_cast<std::size_t>(workers);
        any_controller c = make_controller(config, n);
        nb::gil_scoped_release unlocked;
        // Round-robin pushes, every worker at one pace: no policy makes anyone wait.
        std::size_t pushes = 0;
        volatile bool sink = false;
        const auto t0 = std::chrono::steady_clock::now();
        for (std::int64_t k = 0; k < rounds; ++k)
          for (std::size_t p = 0; p < n; ++p, ++pushes)
            sink = c.push(static_cast<worker_id>(p), static_cast<double>(pushes)).proceed;
        const auto t1 = std::chrono::steady_clock::now();
        (void)sink;
        return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(pushes);
      },
      nb::arg("config"), nb::arg("workers"), nb::arg("rounds"),
      "Nanoseconds per any_controller::push from C++, round-robin over `workers` workers for "
      "`rounds` rounds (benchmark baseline).");
}

}  // namespace cadence::python
