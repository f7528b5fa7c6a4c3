// The command lines of the benchmarks that are programs of their own (cadence-bench-transport,
// -exchange, -ps), read with the tools' flag_reader (tools/cli.hpp), so a bad command line
// fails as it does for cadence-sim: "PROGRAM: error: FLAG: what was wrong" and exit status 2,
// and --help prints the usage and exits 0. Not part of the library.
#pragma once

#include "cli.hpp"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>

namespace cadence_bench {

/// What every such benchmark may take; a benchmark's config derives from it and sets the
/// defaults of its own.
struct common_config {
  std::string backend;
  bool json = false;
  int ranks = 2;              // ranks as threads (backends that run them so)
  bool ranks_given = false;   // --ranks was given (a backend may have a default of its own)
  std::size_t min_bytes = 0;  // the smallest and largest buffer measured
  std::size_t max_bytes = 0;
  int reps = 5;  // raw/ours pairs per size; the median pair is reported
  // Ranks as processes (backends over TCP that support it): this process is rank `rank` of
  // `ranks`, meeting the others at `rendezvous` (host:port; rank 0 binds it) and binding
  // `address` for its own connections. rank < 0: ranks as threads.
  int rank = -1;
  std::string rendezvous;
  std::string address = "127.0.0.1";
  bool processes() const noexcept { return !rendezvous.empty(); }
};

/// A flag without a value that sets a bool of the benchmark's config: {"--no-ring", &cfg.ring,
/// false}.
struct switch_flag {
  std::string_view flag;
  bool* target;
  bool value;
};

/// Reads argv into cfg: of the shared flags those named in `shared` (any of "--backend",
/// "--json", "--ranks", "--min-bytes", "--max-bytes", "--reps", "--rank", "--rendezvous",
/// "--address"; numbers at least 1, --rank at least 0), and the
/// benchmark's own `switches`. --help (or -h) prints `usage` on stdout and returns false: the
/// program then exits 0 without running. Throws flag_reader's usage_error naming the flag for
/// anything else.
inline bool read_flags(int argc, char** argv, common_config& cfg,
                       std::initializer_list<std::string_view> shared,
                       std::initializer_list<switch_flag> switches, const char* usage) {
  using cadence::tools::parse_flag_integer;
  cadence::tools::flag_reader args(argc, argv);
  while (args.next()) {
    const std::string_view flag = args.flag();
    const auto own = std::find_if(switches.begin(), switches.end(),
                                  [&](const switch_flag& s) { return s.flag == flag; });
    if (flag == "--help" || flag == "-h") {
      args.no_value();
      std::fputs(usage, stdout);
      return false;
    } else if (own != switches.end()) {
      args.no_value();
      *own->target = own->value;
    } else if (std::find(shared.begin(), shared.end(), flag) == shared.end()) {
      args.unknown();
    } else if (flag == "--backend") {
      cfg.backend = std::string(args.value());
    } else if (flag == "--json") {
      args.no_value();
      cfg.json = true;
    } else if (flag == "--ranks") {
      cfg.ranks = parse_flag_integer<int>(flag, args.value(), 1, INT_MAX);
      cfg.ranks_given = true;
    } else if (flag == "--min-bytes") {
      cfg.min_bytes = parse_flag_integer<std::size_t>(flag, args.value(), 1, SIZE_MAX);
    } else if (flag == "--max-bytes") {
      cfg.max_bytes = parse_flag_integer<std::size_t>(flag, args.value(), 1, SIZE_MAX);
    } else if (flag == "--reps") {
      cfg.reps = parse_flag_integer<int>(flag, args.value(), 1, INT_MAX);
    } else if (flag == "--rank") {
      cfg.rank = parse_flag_integer<int>(flag, args.value(), 0, INT_MAX);
    } else if (flag == "--rendezvous") {
      cfg.rendezvous = std::string(args.value());
    } else if (flag == "--address") {
      cfg.address = std::string(args.value());
    } else {
      args.unknown();  // a name in `shared` that no benchmark shares
    }
  }
  if (cfg.processes() != (cfg.rank >= 0))
    throw cadence::tools::usage_error("--rank and --rendezvous: give both (ranks as processes) or neither (ranks as threads)");
  if (cfg.processes() && !cfg.ranks_given)
    throw cadence::tools::usage_error("--rendezvous: give --ranks too (the number of processes)");
  if (cfg.processes() && cfg.rank >= cfg.ranks)
    throw cadence::tools::usage_error("--rank " + std::to_string(cfg.rank) + " is out of range for --ranks " +
                                      std::to_string(cfg.ranks));
  return true;
}

/// The error for a missing or unknown --backend; `choices` names the benchmark's backends
/// ("inproc or mpi").
inline cadence::tools::usage_error backend_error(const std::string& backend, const char* choices) {
  return cadence::tools::usage_error(backend.empty() ? std::string("--backend: required (") + choices + ")"
                                                     : "--backend: unknown backend '" + backend + "' (" + choices + ")");
}

/// The error for a backend this build lacks ("MPI", "cadence::mpi"): a bad command line too.
inline cadence::tools::usage_error backend_not_built(const char* backend, const char* target) {
  return cadence::tools::usage_error(std::string("--backend: this build has no ") + backend + " (" + target +
                                     " was not found at configure time)");
}

}  // namespace cadence_bench
