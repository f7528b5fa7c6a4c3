/// \file
/// \ingroup zipline
/// Choosing a ZipLine variant by name at run time (tools, configs, benchmarks) and one
/// dispatcher, zipline_solve, that ElasticBSP calls to plan each barrier without allocating.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/zipline/fast.hpp>
#include <cadence/zipline/paper.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/workspace.hpp>

#include <string>
#include <string_view>

namespace cadence {
/// \addtogroup zipline
/// @{

/// The CPU ZipLine variants. All return identical results; they differ only in speed. The
/// run-time names (to_string, parse_zipline_variant) are the ones configs and command lines
/// have always used, so "zipline" names the paper's Algorithm 2, not cadence::zipline.
enum class zipline_variant {
  paper,         ///< "zipline": zipline_paper, Algorithm 2, O(R n^2); the reference for ratios
  paper_opt,     ///< "opt": zipline_paper_opt, Algorithm 2 with the leftmost-row pruning
  paper_opt_bs,  ///< "opt-bs": zipline_paper_opt_bs, binary search, O(R n log n)
  fast           ///< "fast": zipline_fast, what cadence::zipline runs; the default
};

/// The name parse_zipline_variant accepts for v: "zipline", "opt", "opt-bs" or "fast".
constexpr std::string_view to_string(zipline_variant v) noexcept {
  switch (v) {
    case zipline_variant::paper: return "zipline";
    case zipline_variant::paper_opt: return "opt";
    case zipline_variant::paper_opt_bs: return "opt-bs";
    case zipline_variant::fast: return "fast";
  }
  return "unknown";
}

/// The variant that name spells: "zipline", "opt", "opt-bs" or "fast" (exact,
/// case-sensitive); throws parse_error
/// listing the valid names otherwise.
inline zipline_variant parse_zipline_variant(std::string_view name) {
  for (const auto v : {zipline_variant::paper, zipline_variant::paper_opt,
                       zipline_variant::paper_opt_bs, zipline_variant::fast})
    if (name == to_string(v)) return v;
  throw parse_error("cadence: unknown ZipLine variant '" + std::string(name) +
                    "' (valid: zipline, opt, opt-bs, fast)");
}

/// Runs variant v on rows into out, reusing ws. Allocation-free once ws and out have served
/// an input at least as large (rows and points). Throws zipline_input_error on bad input.
template <class T>
void zipline_solve(zipline_variant v, rows_view<T> rows, zipline_workspace<T>& ws,
                   zipline_result<T>& out) {
  switch (v) {
    case zipline_variant::paper: zipline_paper(rows, ws, out); return;
    case zipline_variant::paper_opt: zipline_paper_opt(rows, ws, out); return;
    case zipline_variant::paper_opt_bs: zipline_paper_opt_bs(rows, ws, out); return;
    case zipline_variant::fast: zipline_fast(rows, ws, out); return;
  }
  throw invalid_parameter_error("cadence::zipline_solve: invalid zipline_variant value");
}

/// Convenience overload: runs variant v on rows with a workspace and a result it allocates.
template <class T>
zipline_result<T> zipline_solve(zipline_variant v, rows_view<T> rows) {
  zipline_workspace<T> ws;
  zipline_result<T> out;
  zipline_solve(v, rows, ws, out);
  return out;
}

/// @}
}  // namespace cadence
