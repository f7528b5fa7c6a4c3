// The command lines of the benchmarks that are programs of their own (cadence-bench-transport,
// -exchange, -ps), read with the tools' CLI11 support (tools/flags.hpp), so a bad command line
// fails as it does for cadence-sim: "PROGRAM: error: FLAG: what was wrong" and exit status 2,
// and --help prints the usage and exits 0. The flags they share are declared here once, each
// benchmark giving its own help text. Not part of the library.
#pragma once

#include "flags.hpp"  // tools/flags.hpp (the include path names tools/)

#include <cadence/transport/secret.hpp>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cadence_bench {

/// What every such benchmark may take; a benchmark's config derives from it and sets the
/// defaults of its own (the buffer sizes it measures through the constructor).
struct common_config {
  common_config() = default;
  common_config(std::size_t min, std::size_t max) : min_bytes(min), max_bytes(max) {}

  std::string backend;
  bool json = false;
  bool csv = false;
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

/// A shared flag a benchmark takes and its help text there: {"--ranks", "threads for ..."}.
struct shared_flag {
  std::string name;
  std::string help;
};

/// Declares the shared flags a benchmark takes, in its order: any of "--backend", "--ranks",
/// "--rank", "--rendezvous", "--address", "--min-bytes", "--max-bytes", "--reps" (numbers at
/// least 1, --rank at least 0), "--json" and "--csv" (at most one of the two).
inline void add_common_flags(cadence::tools::command_line& cli, common_config& cfg,
                             std::initializer_list<shared_flag> flags) {
  using cadence::tools::integer;
  for (const shared_flag& f : flags) {
    if (f.name == "--backend")
      cli.add_option("--backend", cfg.backend, f.help)->option_text("B");
    else if (f.name == "--ranks")
      cli.add_option("--ranks", cfg.ranks, f.help)->option_text("N")->check(integer<int>(1, INT_MAX));
    else if (f.name == "--rank")
      cli.add_option("--rank", cfg.rank, f.help)->option_text("R")->check(integer<int>(0, INT_MAX));
    else if (f.name == "--rendezvous")
      cli.add_option("--rendezvous", cfg.rendezvous, f.help)->option_text("H:P");
    else if (f.name == "--address")
      cli.add_option("--address", cfg.address, f.help)->option_text("A");
    else if (f.name == "--min-bytes")
      cli.add_option("--min-bytes", cfg.min_bytes, f.help)->option_text("B")->check(integer<std::size_t>(1, SIZE_MAX));
    else if (f.name == "--max-bytes")
      cli.add_option("--max-bytes", cfg.max_bytes, f.help)->option_text("B")->check(integer<std::size_t>(1, SIZE_MAX));
    else if (f.name == "--reps")
      cli.add_option("--reps", cfg.reps, f.help)->option_text("R")->check(integer<int>(1, INT_MAX));
    else if (f.name == "--json")
      cli.add_flag("--json", cfg.json, f.help);
    else if (f.name == "--csv")
      cli.add_flag("--csv", cfg.csv, f.help);
    else
      throw std::logic_error("cadence_bench::add_common_flags: no shared flag " + f.name);
  }
  cli.at_most_one_of({"--json", "--csv"});
}

/// The job secret of ranks as processes (--rendezvous): every process of one run holds the
/// same, from CADENCE_JOB_SECRET (the launcher's). Throws usage_error saying how to set it.
inline cadence::transport::job_secret process_secret() {
  auto secret = cadence::transport::job_secret::from_environment();
  if (secret.empty())
    throw cadence::tools::usage_error(
        "--rendezvous: set CADENCE_JOB_SECRET to the same hexadecimal secret in every process (e.g. "
        "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'))");
  return secret;
}

/// Reads argv with cli (the shared flags and the benchmark's own). Returns false when --help
/// was given, after printing the usage on stdout: the program then exits 0 without running.
/// Throws usage_error naming the flag, as the tools do, also when --rank and --rendezvous are
/// not given together (with --ranks) or --rank is out of range.
inline bool read_flags(cadence::tools::command_line& cli, common_config& cfg, int argc, char** argv) {
  using cadence::tools::usage_error;
  if (!cli.read(argc, argv)) {
    std::fputs(cli.help().c_str(), stdout);
    return false;
  }
  cfg.ranks_given = cli.given("--ranks");
  if (cfg.processes() != (cfg.rank >= 0))
    throw usage_error("--rank and --rendezvous: give both (ranks as processes) or neither (ranks as threads)");
  if (cfg.processes() && !cfg.ranks_given)
    throw usage_error("--rendezvous: give --ranks too (the number of processes)");
  if (cfg.processes() && cfg.rank >= cfg.ranks)
    throw usage_error("--rank " + std::to_string(cfg.rank) + " is out of range for --ranks " +
                      std::to_string(cfg.ranks));
  return true;
}

/// The checks cadence-bench-ps and -transport make of the flags they share, after read_flags:
/// --max-bytes a multiple of 4 and at least the smallest size (min_bytes, not a flag there);
/// --security-cost (`security_cost`) only over zmq; ranks as processes (--rendezvous) only over
/// `processes_backend`. Throws usage_error naming the flag.
inline void check_sizes_and_backend(const common_config& cfg, bool security_cost,
                                    const std::string& processes_backend) {
  using cadence::tools::usage_error;
  if (cfg.max_bytes < cfg.min_bytes || cfg.max_bytes % sizeof(float) != 0)
    throw usage_error("--max-bytes: must be a multiple of 4, at least " + std::to_string(cfg.min_bytes) + ", got " +
                      std::to_string(cfg.max_bytes));
  if (security_cost && cfg.backend != "zmq")
    throw usage_error("--security-cost: only for --backend zmq (the others have no wire security)");
  if (cfg.processes() && cfg.backend != processes_backend)
    throw usage_error("--rendezvous: ranks as processes are for --backend " + processes_backend +
                      " (mpi: mpirun starts them)");
}

/// Whether this process measures the roofline's copy bandwidth before the ranks start: the one
/// that prints the rows (mpi: rank 0 measures it in its run_mpi instead).
inline bool measures_copy_first(const common_config& cfg) {
  return cfg.backend != "mpi" && (!cfg.processes() || cfg.rank == 0);
}

// ---- --backend ----

/// A backend a benchmark runs: its name and what runs it (returning main's status); or, for
/// one this build lacks, `run` empty and `lacking` its name in messages and its target
/// ("gloo", "cadence::gloo").
struct backend {
  std::string name;
  std::function<int()> run;
  std::pair<std::string, std::string> lacking;
};

/// The entry for a backend this build lacks: --backend NAME says so.
inline backend not_built(std::string name, std::string what, std::string target) {
  return {std::move(name), {}, {std::move(what), std::move(target)}};
}

/// Runs the backend named `chosen`. Throws usage_error (a bad command line, so exit status 2)
/// "--backend: required (a, b or c)", "--backend: unknown backend 'x' (a, b or c)" or
/// "--backend: this build has no gloo (cadence::gloo was not found at configure time)".
inline int run_backend(const std::string& chosen, const std::vector<backend>& backends) {
  std::string names;
  for (std::size_t k = 0; k < backends.size(); ++k)
    names += (k == 0 ? "" : k + 1 == backends.size() ? " or " : ", ") + backends[k].name;
  for (const backend& b : backends) {
    if (b.name != chosen) continue;
    if (!b.run)
      throw cadence::tools::usage_error("--backend: this build has no " + b.lacking.first + " (" + b.lacking.second +
                                        " was not found at configure time)");
    return b.run();
  }
  throw cadence::tools::usage_error(chosen.empty() ? "--backend: required (" + names + ")"
                                                   : "--backend: unknown backend '" + chosen + "' (" + names + ")");
}

}  // namespace cadence_bench

// One entry of a run_backend table for each backend a benchmark may be built without: with the
// runner given where this build has the backend (CADENCE_BENCH_WITH_<NAME>, which
// bench/CMakeLists.txt sets), else the entry that says it lacks it. The runner is not compiled
// where the backend is missing, so it may call what exists only with it:
//   cadence_bench::run_backend(cfg.backend, {{"inproc", [&] { ... }, {}},
//                                            CADENCE_BENCH_MPI([&] { return run_mpi(cfg); })});
#if defined(CADENCE_BENCH_WITH_MPI)
#define CADENCE_BENCH_MPI(...) ::cadence_bench::backend{"mpi", __VA_ARGS__, {}}
#else
#define CADENCE_BENCH_MPI(...) ::cadence_bench::not_built("mpi", "MPI", "cadence::mpi")
#endif
#if defined(CADENCE_BENCH_WITH_GLOO)
#define CADENCE_BENCH_GLOO(...) ::cadence_bench::backend{"gloo", __VA_ARGS__, {}}
#else
#define CADENCE_BENCH_GLOO(...) ::cadence_bench::not_built("gloo", "gloo", "cadence::gloo")
#endif
#if defined(CADENCE_BENCH_WITH_NCCL)
#define CADENCE_BENCH_NCCL(...) ::cadence_bench::backend{"nccl", __VA_ARGS__, {}}
#else
#define CADENCE_BENCH_NCCL(...) ::cadence_bench::not_built("nccl", "NCCL", "cadence::nccl")
#endif
#if defined(CADENCE_BENCH_WITH_ZMQ)
#define CADENCE_BENCH_ZMQ(...) ::cadence_bench::backend{"zmq", __VA_ARGS__, {}}
#else
#define CADENCE_BENCH_ZMQ(...) ::cadence_bench::not_built("zmq", "ZeroMQ", "cadence::zmq")
#endif
