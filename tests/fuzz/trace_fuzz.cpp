// Fuzzes the iteration-trace reader (cadence/io/trace.hpp: read_iteration_trace) on arbitrary
// text, with small bounds from the input so the bounds are exercised too. What must hold:
//   - every input is read or refused with cadence::parse_error (naming the source and line),
//     never another exception, a crash or an allocation beyond the bounds;
//   - what was read meets the format's promises (workers 0..n-1 each with a row, below
//     max_workers, at most max_iterations rows, every time finite and >= 0, a worker's starts
//     not going backwards) and round-trips: written with write_iteration_trace and read again
//     it is the same trace; trace_push_times then gives a history or a cadence::time_error.
// Input: byte 0's bit 0 picks small bounds; the rest is the file.
#include <cadence/io/trace.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "trace_fuzz: %s\n", what);
  std::abort();
}

bool same(const cadence::iteration_trace& a, const cadence::iteration_trace& b) {
  if (a.has_costs != b.has_costs || a.workers.size() != b.workers.size()) return false;
  for (std::size_t p = 0; p < a.workers.size(); ++p) {
    if (a.workers[p].size() != b.workers[p].size()) return false;
    for (std::size_t i = 0; i < a.workers[p].size(); ++i) {
      const auto &x = a.workers[p][i], &y = b.workers[p][i];
      if (x.start != y.start || x.compute != y.compute || x.push != y.push || x.pull != y.pull) return false;
    }
  }
  return true;
}

void check(const cadence::iteration_trace& tr, const cadence::trace_read_options& o) {
  if (tr.workers.empty()) fail("an empty trace was read");
  if (tr.workers.size() > o.max_workers) fail("more workers than max_workers");
  if (tr.iterations() > o.max_iterations) fail("more rows than max_iterations");
  for (const auto& w : tr.workers) {
    if (w.empty()) fail("a worker without a row");
    for (std::size_t i = 0; i < w.size(); ++i) {
      for (const double v : {w[i].start, w[i].compute, w[i].push, w[i].pull})
        if (!std::isfinite(v) || v < 0) fail("a time that is not finite and >= 0");
      if (i > 0 && w[i].start < w[i - 1].start) fail("a worker's start went backwards");
    }
  }
  std::stringstream text;
  cadence::write_iteration_trace(text, tr);
  cadence::trace_read_options again;  // written lines may be longer than the input's
  again.max_workers = o.max_workers;
  again.max_iterations = o.max_iterations;
  const auto back = cadence::read_iteration_trace(text, "<written>", again);
  if (!same(back, tr)) fail("a trace written and read back differs");
  try {
    const auto h = cadence::trace_push_times(tr);
    if (h.size() != tr.workers.size()) fail("trace_push_times lost a worker");
  } catch (const cadence::time_error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  cadence::trace_read_options o;
  if ((data[0] & 1) != 0) {
    o.max_line_length = 48;
    o.max_workers = 8;
    o.max_iterations = 32;
  }
  const std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    std::istringstream in(file);
    check(cadence::read_iteration_trace(in, "<fuzz>", o), o);
  } catch (const cadence::parse_error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trace_fuzz: unexpected exception: %s\n", e.what());
    fail("an exception that is not parse_error");
  }
  return 0;
}
