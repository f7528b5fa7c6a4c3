// cadence-train's command line: every flag once, with its help text and its value's rule
// (CLI11, through the tools' flags.hpp), the --help text, and the checks between flags that
// need no job. Every rank parses the same command line.
#pragma once

#include "flags.hpp"
#include "train.hpp"

#include <cadence/controllers/make_controller.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cadence::train {

inline constexpr const char* default_policies[] = {"bsp", "asp", "ssp:3", "dssp:3:15", "elastic:15"};

/// What the flags say; the defaults are the documented ones (docs/tools.md).
struct train_options {
  std::vector<std::string> policies;
  std::string profile{default_profile_name};
  double seconds = 30;
  std::uint64_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string model = "mlp";
  std::size_t hidden = 256;
  double lr = 0.05;
  std::size_t batch = 32;
  double eval_every = 1;
  std::size_t train_limit = 0;
  std::size_t test_limit = 1000;
  std::optional<double> evict_after;
  bool json = false, csv = false;
  std::string help;  // --help: the text rank 0 prints
  std::string curves;
  std::string trace;
  std::string push_log;
  std::optional<double> join_after;  // zmq: the last rank joins the first policy this late
  bool rejoin = false;               // zmq: this process replaces a killed worker
  double start_timeout = 60;         // zmq: the bound of each start-up step (docs/train.md, "Start-up")
  std::string transport = "mpi";
  std::optional<int> rank, size;  // gloo, zmq
  std::string store;              // gloo, zmq: a shared folder ...
  std::string rendezvous;         // ... or rank 0's TCP store
  std::string address;            // gloo, zmq
  std::string secret_file;        // gloo, zmq: the job secret's key file (else $CADENCE_JOB_SECRET)
  bool insecure = false;          // gloo, zmq: no authentication, loopback only ...
  bool insecure_network = false;  // ... unless this too
};

namespace detail {

inline constexpr const char* train_usage =
    "usage: mpirun -np N cadence-train [options]\n"
    "       launch-gloo.sh -n N cadence-train --transport gloo|zmq [options]\n";

inline constexpr const char* train_description =
    R"(Trains a real model on Fashion-MNIST across N processes (MPI ranks, or gloo or ZeroMQ
processes that launch-gloo.sh starts): rank 0 is the parameter server, ranks 1..N-1 are workers that
compute real gradients on their shard of the training set.
Each policy runs in turn, on fresh server and workers. Each worker's iterations are stretched
to its speed profile (sleeping until the profile's iteration time has passed), so a 2-core
machine can host a heterogeneous cluster. Afterwards rank 0 replays the same profile, policy
and measured push/pull cost in cadence's simulator and prints both.

  mpirun --allow-run-as-root --oversubscribe -np 5 cadence-train --json
  apps/train/launch-gloo.sh -n 5 cadence-train --transport gloo --json
  apps/train/launch-gloo.sh -n 5 --survive-workers cadence-train --transport zmq --json
)";

inline std::string train_footer() {
  std::string out = "profiles:\n";
  for (const auto& p : profile_catalog()) out += "  " + p.name + ": " + p.description + "\n";
  return out;
}

}  // namespace detail

/// Reads the command line (the result's help holds the help text when --help was given). Throws
/// tools::usage_error naming the flag for a bad value, a flag given twice, flags that exclude
/// each other, --join-after or --rejoin without zmq, a late join after the run's end, or too
/// many snapshots.
inline train_options parse_options(int argc, char** argv) {
  using namespace cadence::tools;
  train_options o;
  command_line cli(detail::train_usage, detail::train_description);
  cli.footer(detail::train_footer());
  cli.add_list("--policy", o.policies,
               "a make_controller config (bsp, asp, ssp:<s>, dssp:<s_L>:<s_U>,\n"
               "elastic:<R>) over the parameter server, or a collective mode over\n"
               "all-reduce among the workers (rank 0 only measures): periodic:<k>\n"
               "(average every k local steps) or elastic-avg:<R>[:...] (ElasticBSP over\n"
               "collectives, elastic_averager); repeat to compare several (default: bsp,\n"
               "asp, ssp:3, dssp:3:15, elastic:15)")
      ->option_text("CONFIG");
  cli.add_option("--profile", o.profile, "per-worker speed profile (default hetero16); see the list below")
      ->option_text("NAME");
  cli.add_option("--seconds", o.seconds, "wall-clock seconds of training per policy (default 30)")
      ->option_text("S")
      ->check(positive(86400));
  cli.add_seed(o.seed, "K",
               "seed of the profile's iteration times, the data order and the initial\n"
               "weights (default 1)");
  cli.add_option("--data", o.data,
                 "Fashion-MNIST directory (default /usr/share/datasets/fashion-mnist,\n"
                 "from the Debian package dataset-fashion-mnist)")
      ->option_text("DIR")
      ->check(not_empty("a directory"));
  cli.add_option("--model", o.model, "mlp (784-hidden-10, ReLU; default) or softmax (softmax regression, fast)")
      ->option_text("NAME")
      ->check(one_of({"mlp", "softmax"}));
  cli.add_option("--hidden", o.hidden, "hidden units of the mlp (default 256)")
      ->option_text("N")
      ->check(integer<std::size_t>(1, 65536));
  cli.add_option("--lr", o.lr, "SGD step the server applies per push (default 0.05)")
      ->option_text("X")
      ->check(positive(1e6));
  cli.add_option("--batch", o.batch, "examples per worker iteration (default 32)")
      ->option_text("N")
      ->check(integer<std::size_t>(1, 1u << 16));
  cli.add_option("--eval-every", o.eval_every,
                 "seconds between the snapshots of the server's weights whose test\n"
                 "accuracy makes the curve (default 1; evaluated after the run)")
      ->option_text("S")
      ->check(positive(86400));
  cli.add_option("--train-limit", o.train_limit, "train on the first N training images (default: all 60000)")
      ->option_text("N")
      ->check(integer<std::size_t>(1, SIZE_MAX));
  cli.add_option("--test-limit", o.test_limit,
                 "evaluate the curve on the first N test images (default 1000); the\n"
                 "final accuracy always uses the whole test set")
      ->option_text("N")
      ->check(integer<std::size_t>(1, SIZE_MAX));
  cli.add_option("--evict-after", o.evict_after,
                 "the server evicts a worker silent for S seconds (default: the run's\n"
                 "seconds + 60, so a killed worker cannot hold the run forever)")
      ->option_text("S")
      ->check(positive(86400));
  cli.add_flag("--json", o.json, "one JSON array on stdout (rank 0), one object per policy");
  cli.add_flag("--csv", o.csv, "one CSV row per policy (at most one of --json and --csv)");
  cli.add_option("--curves", o.curves, "also write the accuracy curves (policy,seconds,accuracy) to FILE")
      ->option_text("FILE");
  cli.add_option("--trace", o.trace,
                 "also write each parameter-server policy's iteration trace (per worker\n"
                 "and iteration: start, compute, push, pull) for cadence-sim --trace;\n"
                 "with several policies, one file each: FILE-<policy> (docs/trace.md)")
      ->option_text("FILE");
  cli.add_option("--join-after", o.join_after,
                 "zmq: the last rank is a worker that joins the first policy S seconds\n"
                 "after the others started it (S < --seconds; the first policy must be a\n"
                 "parameter-server one): the server starts with one worker fewer, and\n"
                 "the late one joins under the next worker id and trains until the\n"
                 "policy's end")
      ->option_text("S")
      ->check(non_negative(86400));
  cli.add_flag("--rejoin", o.rejoin,
               "zmq: this process replaces a killed worker in its rank slot (a wrapper\n"
               "restarts it with the same flags plus this one): it joins the policy\n"
               "now running under a new worker id, trains until its end and exits; it\n"
               "takes no part in the bookkeeping after the policy, so rank 0 counts the\n"
               "rank gone then and skips the remaining policies");
  cli.add_option("--start-timeout", o.start_timeout,
                 "zmq: how long each start-up step may take (default 60): rank 0 waits\n"
                 "this long for every worker to introduce itself and to be ready at the\n"
                 "start of each parameter-server policy, drops those that were not (lost\n"
                 "or absent) and goes on with the others; a worker waits this long for\n"
                 "rank 0 at each step, then ends with an error naming the step")
      ->option_text("S")
      ->check(positive(86400));
  cli.add_option("--push-log", o.push_log,
                 "for fault tests: each rank appends to FILE.rank<r>, one line\n"
                 "\"<policy index> <worker id> <iteration>\" per push: rank 0 the pushes its\n"
                 "server applied (after each parameter-server policy), a worker each push\n"
                 "acknowledged to it (push_pull returned; written at once)")
      ->option_text("FILE")
      ->check(not_empty("a file name"));
  cli.add_option("--transport", o.transport,
                 "mpi (default; the ranks mpirun started), gloo or zmq (processes that\n"
                 "talk over TCP and meet in a shared folder or at rank 0's TCP store;\n"
                 "launch-gloo.sh starts them and sets rank, size and store). zmq isolates\n"
                 "a lost peer: the server outlives a worker killed at any moment; over\n"
                 "gloo a worker that dies while the server talks to it fails the server's\n"
                 "communicator")
      ->option_text("T")
      ->check(one_of({"mpi", "gloo", "zmq"}));
  cli.add_option("--rank", o.rank, "gloo, zmq: this process's rank (default: $CADENCE_TRAIN_RANK)")
      ->option_text("R")
      ->check(integer<int>(0, 1 << 20));
  cli.add_option("--size", o.size, "gloo, zmq: the number of processes (default: $CADENCE_TRAIN_SIZE)")
      ->option_text("N")
      ->check(integer<int>(1, 1 << 20));
  cli.add_option("--store", o.store,
                 "gloo, zmq: the rendezvous folder, empty and shared by all the processes\n"
                 "of one run (default: $CADENCE_TRAIN_STORE)")
      ->option_text("DIR");
  cli.add_option("--rendezvous", o.rendezvous,
                 "gloo, zmq, instead of --store: rank 0 serves a TCP store at H:P (one\n"
                 "of its own addresses) for the whole run and the others reach it there,\n"
                 "so hosts need no shared folder (default: $CADENCE_TRAIN_RENDEZVOUS)")
      ->option_text("H:P")
      ->check(not_empty("HOST:PORT"));
  cli.add_option("--address", o.address,
                 "gloo, zmq: the address this process binds and the others reach it by\n"
                 "(default: $CADENCE_TRAIN_ADDR, else 127.0.0.1)")
      ->option_text("A");
  cli.add_option("--secret-file", o.secret_file,
                 "gloo, zmq: the job secret, a key file (mode 600) holding its hex; every\n"
                 "process of a run gives the same (default: $CADENCE_JOB_SECRET, which\n"
                 "launch-gloo.sh generates). zmq authenticates and encrypts every connection\n"
                 "with it, the TCP store (--rendezvous) every request")
      ->option_text("F");
  cli.add_flag("--insecure", o.insecure,
               "gloo, zmq: no job secret: nothing is authenticated or encrypted; on\n"
               "loopback addresses only, unless --insecure-network");
  cli.add_flag("--insecure-network", o.insecure_network,
               "with --insecure: allow it on network addresses too (anyone who reaches\n"
               "the ports can join, read keys or send messages)");
  cli.at_most_one_of({"--json", "--csv"}).at_most_one_of({"--store", "--rendezvous"}).at_most_one_of(
      {"--secret-file", "--insecure"});
  if (!cli.read(argc, argv)) {
    o.help = cli.help();
    return o;
  }
  const std::string fixed = o.transport == "mpi" ? "MPI job" : "gloo mesh, fixed at rendezvous";
  if (o.join_after && o.transport != "zmq")
    throw usage_error("--join-after: needs --transport zmq (a process cannot join a running " + fixed +
                      "), got --transport " + o.transport);
  if (o.rejoin && o.transport != "zmq")
    throw usage_error("--rejoin: needs --transport zmq (a process cannot join a running " + fixed +
                      "), got --transport " + o.transport);
  if (o.join_after && !(*o.join_after < o.seconds))
    throw usage_error("--join-after: " + tools::detail::number_text(*o.join_after) + " s must be less than --seconds " +
                      tools::detail::number_text(o.seconds) + " (the late worker joins the running policy)");
  if (o.insecure_network && !o.insecure)
    throw usage_error("--insecure-network: goes with --insecure (it only widens where an insecure run may listen)");
  if (o.seconds / o.eval_every > 10000)
    throw usage_error("--eval-every: " + std::to_string(o.eval_every) + " s over a " + std::to_string(o.seconds) +
                      " s run means more than 10000 snapshots; use --eval-every >= " +
                      std::to_string(o.seconds / 10000));
  if (o.policies.empty()) o.policies.assign(std::begin(default_policies), std::end(default_policies));
  return o;
}

/// Whether this command line runs over gloo or zmq (or names a transport that is not mpi,
/// which that path reports): decided before anything starts, since MPI_Init must not run in
/// gloo or zmq processes.
inline bool launched(int argc, char** argv) {
  bool gloo = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--transport" && i + 1 < argc) gloo = std::string_view(argv[i + 1]) != "mpi";
    if (a.rfind("--transport=", 0) == 0) gloo = a != "--transport=mpi";
  }
  return gloo;
}

}  // namespace cadence::train
