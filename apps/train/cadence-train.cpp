// cadence-train: trains a real model on Fashion-MNIST across processes, MPI (mpirun) or gloo
// or ZeroMQ (launch-gloo.sh) (rank 0 serves, the others compute real gradients on their shards)
// under each policy in turn, with per-worker speed profiles, and holds the simulator's
// prediction of the same run against what it measured. Its parts: options.hpp (the command
// line), roles.hpp (what each rank does under a policy), run.hpp (the run, phase by phase) and
// report.hpp (what rank 0 prints); here, the job each transport makes and main.
#include <cadence/transport/detail/posix.hpp>

#include "options.hpp"
#include "run.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

namespace {

using cadence::tools::usage_error;
namespace train = cadence::train;
using train::train_options;

// Checks what needs the job (its size), then runs.
template <class Job>
int checked_run(Job& job, const train_options& o, const std::optional<std::string>& parse_error) {
  if (parse_error) throw usage_error(*parse_error);
  if (!o.help.empty()) {
    if (job.rank() == 0) std::fputs(o.help.c_str(), stdout);
    return 0;
  }
  if (job.size() < 2)
    throw usage_error(std::string("needs at least 2 ") + (std::string(job.name()) == "mpi" ? "MPI " : "") +
                      "ranks (1 server + at least 1 worker), got " +
                      std::to_string(job.size()) + "; run it as: " +
                      (std::string(job.name()) == "mpi" ? std::string("mpirun -np 5 cadence-train ...")
                                                        : "launch-gloo.sh -n 5 cadence-train --transport " +
                                                              std::string(job.name()) + " ..."));
  return train::run(job, o);
}

// Every rank parses the same command line and reads the same files, so a usage error is the
// same everywhere: each rank stops before any communication, rank 0 alone says why. A failure
// of one rank mid-run (a lost server, a transfer past its deadline) ends the whole job, since
// the others may wait for it.
template <class Job>
int guarded_run(Job& job, const train_options& o, const std::optional<std::string>& parse_error) {
  try {
    return checked_run(job, o, parse_error);
  } catch (const usage_error& e) {
    if (job.rank() == 0) std::fprintf(stderr, "cadence-train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cadence-train (rank %d): error: %s\n", job.rank(), e.what());
    std::fflush(stderr);
    std::fflush(stdout);
    job.abort_all();
  }
}

// A process of a gloo or zmq job (Job: train::gloo_job, train::zmq_job) meeting the others at
// `meet`: its whole run.
template <class Job>
int launched_run(const train_options& o, train::meeting_point meet, train::job_security security,
                 const std::optional<std::string>& parse_error) {
  Job job(o.rank.value_or(0), o.size.value_or(1), std::move(meet), o.address, std::move(security));
  return guarded_run(job, o, parse_error);
}

// The run's security: the job secret from --secret-file or $CADENCE_JOB_SECRET (every process
// of the run the same), or none by name (--insecure). A run that needs one (zmq, or a TCP
// store) and has none is refused: the error says where to get it.
train::job_security security_of(const train_options& o, std::optional<std::string>& parse_error) {
  train::job_security s;
  if (o.insecure) {
    s.mode = cadence::transport::wire_security::open;
    s.force_open_on_network = o.insecure_network;
    if (o.rank.value_or(0) == 0)
      std::fprintf(stderr, "cadence-train: warning: --insecure: nothing is authenticated or encrypted; anyone who "
                           "reaches the run's ports can join it, read its keys or send it messages\n");
    return s;
  }
  try {
    s.secret = o.secret_file.empty() ? cadence::transport::job_secret::from_environment("CADENCE_JOB_SECRET")
                                     : cadence::transport::job_secret::from_file(o.secret_file);
  } catch (const cadence::error& e) {
    if (!parse_error) parse_error = std::string(o.secret_file.empty() ? "$CADENCE_JOB_SECRET" : "--secret-file") + ": " +
                                    e.what();
  }
  const bool needed = o.transport == "zmq" || !o.rendezvous.empty();
  if (needed && s.secret.empty() && !parse_error)
    parse_error = "no job secret: set $CADENCE_JOB_SECRET (the same hex on every process; launch-gloo.sh generates "
                  "one) or --secret-file, or run --insecure on one host";
  return s;
}

// --transport T where this build lacks its library: the error, exit status 2.
[[maybe_unused]] int lacking(const char* transport, const char* library, const char* package) {
  std::fprintf(stderr, "cadence-train: error: --transport %s: this build has no %s (install %s and rebuild)\n",
               transport, library, package);
  return 2;
}

// --transport gloo or zmq: rank, size and folder from the flags or the environment.
int main_launched(train_options o, std::optional<std::string> parse_error) {
  auto from_env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  auto env_int = [&](const char* name, const char* flag, int min) -> std::optional<int> {
    const std::string v = from_env(name);
    if (v.empty()) return std::nullopt;
    try {
      return cadence::tools::with_flag(std::string(flag) + " (from $" + name + ")",
                                       [&] { return cadence::tools::parse_integer<int>(v, min, 1 << 20); });
    } catch (const usage_error& e) {
      if (!parse_error) parse_error = e.what();
      return std::nullopt;
    }
  };
  if (!o.rank) o.rank = env_int("CADENCE_TRAIN_RANK", "--rank", 0);
  if (!o.size) o.size = env_int("CADENCE_TRAIN_SIZE", "--size", 1);
  if (o.store.empty() && o.rendezvous.empty()) {
    o.store = from_env("CADENCE_TRAIN_STORE");
    o.rendezvous = from_env("CADENCE_TRAIN_RENDEZVOUS");
    if (!o.store.empty() && !o.rendezvous.empty() && !parse_error)
      parse_error = "$CADENCE_TRAIN_STORE and $CADENCE_TRAIN_RENDEZVOUS are both set; give one (or --store or "
                    "--rendezvous)";
  }
  if (!parse_error && o.help.empty()) {
    if (!o.rank || !o.size || (o.store.empty() && o.rendezvous.empty()))
      parse_error = "--transport " + o.transport +
                    " needs --rank, --size and --store or --rendezvous (or $CADENCE_TRAIN_RANK, $CADENCE_TRAIN_SIZE, "
                    "$CADENCE_TRAIN_STORE or $CADENCE_TRAIN_RENDEZVOUS); launch-gloo.sh sets them";
    else if (*o.rank >= *o.size)
      parse_error = "--rank " + std::to_string(*o.rank) + " is out of range for --size " + std::to_string(*o.size) +
                    " (ranks 0.." + std::to_string(*o.size - 1) + ")";
  }
  if (parse_error && (!o.rank || !o.size || *o.rank >= *o.size)) {  // no rank 0 to speak: each says it
    std::fprintf(stderr, "cadence-train: error: %s\n", parse_error->c_str());
    return 2;
  }
  if (o.address.empty()) o.address = from_env("CADENCE_TRAIN_ADDR");
  if (o.address.empty()) o.address = "127.0.0.1";
  // A malformed --rendezvous is named before a missing secret (it is the likelier typo).
  if (!parse_error && !o.rendezvous.empty()) {
    try {
      cadence::transport::detail::parse_host_port(o.rendezvous, "cadence-train");
    } catch (const std::exception& e) {
      parse_error = "--rendezvous " + o.rendezvous + ": " + e.what();
    }
  }
  train::job_security security = security_of(o, parse_error);
  // Where the processes meet. Rank 0 serves the TCP store from here to its exit; a store it
  // cannot serve (the port is taken, the address is not its own) is its error to report.
  std::optional<train::meeting_point> meet;
  if (!parse_error) {
    try {
      meet = o.rendezvous.empty()
                 ? train::meeting_point::folder(o.store)
                 : train::meeting_point::tcp(o.rendezvous, o.rank.value_or(0) == 0 && !o.rejoin, security);
    } catch (const std::exception& e) {
      parse_error = "--rendezvous " + o.rendezvous + ": " + e.what();
    }
  }
  if (!meet) meet = train::meeting_point::folder(o.store);  // unused: the run reports parse_error
  if (o.transport == "zmq") {
#if CADENCE_TRAIN_HAS_ZMQ
    return launched_run<train::zmq_job>(o, std::move(*meet), std::move(security), parse_error);
#else
    return lacking("zmq", "ZeroMQ", "libzmq3-dev");
#endif
  }
#if CADENCE_TRAIN_HAS_GLOO
  return launched_run<train::gloo_job>(o, std::move(*meet), std::move(security), parse_error);
#else
  return lacking("gloo", "gloo", "libgloo-dev");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const bool gloo = train::launched(argc, argv);
  train::train_options o;
  std::optional<std::string> parse_error;
  try {
    o = train::parse_options(argc, argv);
  } catch (const usage_error& e) {
    parse_error = e.what();
  }
  if (gloo) return main_launched(std::move(o), std::move(parse_error));
#if CADENCE_TRAIN_HAS_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  bool gone = false;
  {
    train::mpi_job job;
    rc = guarded_run(job, o, parse_error);
    gone = job.gone();
  }  // its communicators go before MPI_Finalize
  if (gone) {  // a killed rank: MPI_Finalize could wait for it (mpi_job::note_gone)
    std::fflush(nullptr);
    std::_Exit(rc);
  }
  MPI_Finalize();
  return rc;
#else
  std::fprintf(stderr, "cadence-train: error: this build has no MPI; use --transport gloo or zmq\n");
  return 2;
#endif
}
