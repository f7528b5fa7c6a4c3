/// \file
/// \ingroup io
/// Iteration traces: per-worker, per-iteration compute times (and optionally push and pull
/// costs) recorded on a real cluster, as CSV; the reader, the writer, and the push times they imply.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/io/push_history.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <istream>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace cadence {
/// \addtogroup io
/// @{

/// One iteration of one worker, in seconds. The gap
/// start[k+1] - (start[k] + compute[k] + push[k] + pull[k]) is the wait the policy of the
/// recorded run imposed: replays ignore it and let the replayed policy decide the waits.
struct trace_iteration {
  /// When the worker began computing it (since the run began, on that worker's clock).
  double start = 0;
  /// How long computing took, without any waiting.
  double compute = 0;
  /// From the end of compute to the push's arrival at the server.
  double push = 0;
  /// From the server's go-ahead to the worker starting its next compute.
  double pull = 0;
};

/// What a cluster's workers did per iteration.
struct iteration_trace {
  /// workers[p]: worker p's iterations in the order it ran them (at least one), for workers
  /// 0..n-1.
  std::vector<std::vector<trace_iteration>> workers;
  /// The trace records push and pull per iteration (otherwise they are 0 here and a replay
  /// takes them from elsewhere).
  bool has_costs = false;

  /// Number of workers.
  std::size_t size() const noexcept { return workers.size(); }
  /// Iterations of all workers together.
  std::size_t iterations() const noexcept {
    std::size_t k = 0;
    for (const auto& w : workers) k += w.size();
    return k;
  }
};

/// Bounds of read_iteration_trace; a violation is a parse_error naming source and line.
struct trace_read_options {
  std::size_t max_line_length = 4096;     ///< bytes per line, line end excluded
  std::size_t max_workers = 1'000'000;    ///< worker ids must be below this
  std::size_t max_iterations = 100'000'000;  ///< rows of all workers together
};

/// The header line of a trace without push and pull costs; the reader accepts it and
/// trace_header_with_costs.
inline constexpr std::string_view trace_header = "worker,start,compute";
/// The header line of a trace with costs, which the writer writes when has_costs.
inline constexpr std::string_view trace_header_with_costs = "worker,start,compute,push,pull";

namespace detail {

[[noreturn]] inline void trace_fail(std::string_view source, std::size_t line, const std::string& what) {
  throw parse_error("cadence::read_iteration_trace: " + std::string(source) +
                    (line ? ":" + std::to_string(line) : std::string()) + ": " + what);
}

inline std::string trace_number(double v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

}  // namespace detail

/// Reads an iteration trace. Format (CSV, times in seconds as decimal numbers):
///
///     # comments and blank lines are skipped anywhere
///     worker,start,compute,push,pull      <- the header; or worker,start,compute
///     0,0,0.1012,0.0004,0.0003
///     1,0,0.1705,0.0004,0.0003
///     0,0.1031,0.0998,0.0004,0.0003
///
/// One row per iteration; rows of different workers may interleave in any order, but each
/// worker's rows are in the order it ran them. Worker ids are 0..n-1, each with at least one
/// row. Every time is finite and >= 0; a worker's start times must not go backwards, and an
/// iteration must not start before the previous one's compute ended (1 ns of slack for
/// rounding). Blanks around fields and CRLF line ends are accepted. Throws parse_error
/// "cadence::read_iteration_trace: SOURCE:LINE: what was wrong" for every violation, and
/// "SOURCE: ..." for a missing worker or an empty trace, where SOURCE is `source`; `options`
/// bound the input.
inline iteration_trace read_iteration_trace(std::istream& in, std::string_view source = "<stream>",
                                            const trace_read_options& options = {}) {
  iteration_trace tr;
  std::vector<std::size_t> last_line;  // per worker: line of its previous row
  // Lines are read into a bounded buffer, so an endless line (/dev/zero) fails at once.
  std::vector<char> buf(options.max_line_length + 2);
  std::size_t lineno = 0, rows = 0;
  bool header = false;
  static constexpr const char* names[5] = {"worker", "start", "compute", "push", "pull"};
  for (;;) {
    in.getline(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    if (got == 0 && in.eof()) break;
    ++lineno;
    if (in.fail() && !in.eof())
      detail::trace_fail(source, lineno,
                         "line is longer than " + std::to_string(options.max_line_length) +
                             " bytes (the reader's max_line_length)");
    const std::string_view line(buf.data(), std::strlen(buf.data()));
    if (line.size() + (in.eof() ? 0 : 1) < got) detail::trace_fail(source, lineno, "NUL byte: a trace is text");
    const std::string_view text = detail::trim_blanks(line);
    if (text.empty() || text.front() == '#') continue;
    if (!header) {
      std::string compact;
      for (const char c : text)
        if (c != ' ' && c != '\t') compact.push_back(c);
      if (compact == trace_header_with_costs) {
        tr.has_costs = true;
      } else if (compact != trace_header) {
        detail::trace_fail(source, lineno,
                           "expected the header '" + std::string(trace_header) + "' or '" +
                               std::string(trace_header_with_costs) + "', got '" + std::string(text) + "'");
      }
      header = true;
      continue;
    }
    const std::size_t want = tr.has_costs ? 5 : 3;
    std::string_view field[5];
    std::size_t count = 0;
    std::string_view rest = text;
    for (;;) {
      const auto comma = rest.find(',');
      if (count < 5) field[count] = detail::trim_blanks(rest.substr(0, comma));
      ++count;
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    if (count != want)
      detail::trace_fail(source, lineno,
                         "expected " + std::to_string(want) + " fields (" +
                             std::string(tr.has_costs ? trace_header_with_costs : trace_header) +
                             "), got " + std::to_string(count));
    for (std::size_t f = 0; f < want; ++f)
      if (field[f].empty())
        detail::trace_fail(source, lineno, "field " + std::to_string(f + 1) + " (" + names[f] + ") is empty");
    std::int64_t id = 0;
    if (!detail::parse_integer(field[0], id))
      detail::trace_fail(source, lineno, "worker '" + std::string(field[0]) + "' is not an integer");
    if (id < 0 || static_cast<std::uint64_t>(id) >= options.max_workers)
      detail::trace_fail(source, lineno,
                         "unknown worker " + std::to_string(id) + ": ids are 0.." +
                             std::to_string(options.max_workers - 1) + " (the reader's max_workers)");
    double v[5] = {0, 0, 0, 0, 0};
    for (std::size_t f = 1; f < want; ++f) {
      const std::string_view s = detail::strip_plus(field[f]);
      const auto res = std::from_chars(s.data(), s.data() + s.size(), v[f]);
      if (res.ptr != s.data() + s.size() || res.ec == std::errc::invalid_argument)
        detail::trace_fail(source, lineno, std::string(names[f]) + " '" + std::string(field[f]) + "' is not a number");
      if (res.ec == std::errc::result_out_of_range || !std::isfinite(v[f]))
        detail::trace_fail(source, lineno,
                           std::string(names[f]) + " '" + std::string(field[f]) + "' is not a finite number");
      if (v[f] < 0)
        detail::trace_fail(source, lineno, std::string(names[f]) + " must be >= 0 seconds, got " + std::string(field[f]));
    }
    if (rows == options.max_iterations)
      detail::trace_fail(source, lineno,
                         "more than " + std::to_string(options.max_iterations) +
                             " rows (the reader's max_iterations)");
    ++rows;
    const auto p = static_cast<std::size_t>(id);
    if (p >= tr.workers.size()) {
      tr.workers.resize(p + 1);
      last_line.resize(p + 1, 0);
    }
    auto& w = tr.workers[p];
    const trace_iteration it{v[1], v[2], v[3], v[4]};
    if (!w.empty()) {
      const trace_iteration& prev = w.back();
      const std::string where = " (line " + std::to_string(last_line[p]) + ")";
      if (it.start < prev.start)
        detail::trace_fail(source, lineno,
                           "worker " + std::to_string(id) + ": start " + std::string(field[1]) +
                               " is earlier than its previous iteration's start " +
                               detail::trace_number(prev.start) + where +
                               "; times must not go backwards (a worker's rows in the order it ran them)");
      const double ended = prev.start + prev.compute;
      if (it.start + 1e-9 < ended)
        detail::trace_fail(source, lineno,
                           "worker " + std::to_string(id) + ": start " + std::string(field[1]) +
                               " is before its previous iteration's compute ended at " +
                               detail::trace_number(ended) + where);
    }
    w.push_back(it);
    last_line[p] = lineno;
    if (in.eof()) break;
  }
  if (in.bad()) detail::trace_fail(source, lineno, "read error");
  if (!header) detail::trace_fail(source, 0, "no header line: expected '" + std::string(trace_header_with_costs) + "' or '" + std::string(trace_header) + "'");
  if (rows == 0) detail::trace_fail(source, 0, "no iterations after the header");
  for (std::size_t p = 0; p < tr.workers.size(); ++p)
    if (tr.workers[p].empty())
      detail::trace_fail(source, 0,
                         "worker " + std::to_string(p) + " has no iterations; workers must be numbered 0.." +
                             std::to_string(tr.workers.size() - 1) + " with at least one row each");
  return tr;
}

/// Reads a trace from the file at path, within options' bounds; messages name the file.
/// Throws parse_error when it cannot be opened.
inline iteration_trace read_iteration_trace_file(const std::string& path, const trace_read_options& options = {}) {
  std::ifstream in(path);
  if (!in) throw parse_error("cadence::read_iteration_trace: cannot open '" + path + "'");
  return read_iteration_trace(in, path, options);
}

/// Writes tr to out in the format read_iteration_trace reads (header, then each worker's rows in
/// order, worker 0 first), every time in its shortest round-trip form, so it reads back
/// unchanged.
inline void write_iteration_trace(std::ostream& out, const iteration_trace& tr) {
  std::string text(tr.has_costs ? trace_header_with_costs : trace_header);
  text += '\n';
  char buf[32];
  auto put = [&](double v) {
    text += ',';
    const auto res = std::to_chars(buf, buf + sizeof buf, v);
    text.append(buf, res.ptr);
  };
  for (std::size_t p = 0; p < tr.workers.size(); ++p)
    for (const trace_iteration& it : tr.workers[p]) {
      text += std::to_string(p);
      put(it.start);
      put(it.compute);
      if (tr.has_costs) {
        put(it.push);
        put(it.pull);
      }
      text += '\n';
      if (text.size() > (std::size_t{1} << 16)) {
        out << text;
        text.clear();
      }
    }
  out << text;
}

/// Writes tr to the file at path (replacing it); throws parse_error when the file cannot be
/// written.
inline void write_iteration_trace_file(const std::string& path, const iteration_trace& tr) {
  std::ofstream out(path);
  if (!out) throw parse_error("cadence::write_iteration_trace: cannot open '" + path + "'");
  write_iteration_trace(out, tr);
  if (!out) throw parse_error("cadence::write_iteration_trace: error writing '" + path + "'");
}

/// The push times trace tr records, as a push history in seconds (worker ids 0..n-1): each
/// iteration's push arrives at start + compute + push. They include the waits of the policy
/// the recorded run used, as any push history from a real run does. Throws time_error if a
/// worker's push times would decrease (a push cost longer than the next iteration's start
/// allows).
inline push_history<double> trace_push_times(const iteration_trace& tr) {
  push_history<double> h;
  std::vector<double> row;
  for (std::size_t p = 0; p < tr.workers.size(); ++p) {
    row.clear();
    for (const trace_iteration& it : tr.workers[p]) {
      const double t = it.start + it.compute + it.push;
      if (!row.empty() && t < row.back())
        throw time_error("cadence::trace_push_times: worker " + std::to_string(p) + ": push " +
                         std::to_string(row.size() + 1) + " at " + detail::trace_number(t) +
                         " s arrives before push " + std::to_string(row.size()) + " at " +
                         detail::trace_number(row.back()) + " s");
      row.push_back(t);
    }
    h.add(static_cast<std::int64_t>(p), span<const double>(row.data(), row.size()));
  }
  return h;
}

/// @}
}  // namespace cadence
