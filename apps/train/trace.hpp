// cadence-train --trace: turns the push_pull timings a worker recorded into the iteration
// trace cadence-sim --trace replays (io/trace.hpp's format), and names one file per policy.
#pragma once

#include "train.hpp"

#include <cadence/io/trace.hpp>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace cadence::train {

/// Worker p's iteration k started when its previous push_pull returned (0 for the first),
/// computed until its push_pull k began (the profile's stretched time: real compute plus the
/// sleep), then blocked in push_pull. A worker cannot tell the transfer from the wait inside
/// one push_pull, so every row of worker p records p's own measured transfer, transfer[p]
/// (worker_transfer_seconds, filled_transfer_seconds: its link, slow or fast), as half push,
/// half pull; the rest of the blocked time is the recorded policy's wait, which the start
/// times keep and replays ignore. A worker without an entry in `transfer` records 0.
inline iteration_trace trace_from_timings(const std::vector<std::vector<exchange_timing>>& per_worker,
                                          const std::vector<double>& transfer) {
  iteration_trace tr;
  tr.has_costs = true;
  for (std::size_t p = 0; p < per_worker.size(); ++p) {
    const double half = p < transfer.size() ? transfer[p] / 2 : 0.0;
    tr.workers.emplace_back();
    double start = 0;
    for (const exchange_timing& t : per_worker[p]) {
      const double begun = std::max(t.start, start);  // clocks read microseconds apart
      tr.workers.back().push_back({start, begun - start, half, half});
      start = begun + t.seconds;
    }
  }
  return tr;
}

/// The trace file of one policy: `file` itself when the run has one policy; otherwise the
/// policy (':' and other characters a file name should not hold as '_') before the extension:
/// run.csv and dssp:3:15 give run-dssp_3_15.csv.
inline std::string trace_file_for(const std::string& file, const std::string& policy, std::size_t policies) {
  if (policies <= 1) return file;
  std::string tag;
  for (const char c : policy)
    tag += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
  const auto slash = file.find_last_of('/');
  const auto dot = file.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == 0 ||
      (slash != std::string::npos && dot == slash + 1))
    return file + "-" + tag;
  return file.substr(0, dot) + "-" + tag + file.substr(dot);
}

}  // namespace cadence::train
