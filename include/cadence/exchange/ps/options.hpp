/// \file
/// \ingroup exchange
/// What the parameter server's two ends agree on before any message: how the model is cut
/// into the servers' slices, the update rule, the options both ends take, and what a server
/// reports (events as they happen, statistics at the end). Include
/// `<cadence/exchange/parameter_server.hpp>`, which includes this.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/types.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

// ---- slices and the update rule ----

/// The part of a flat model that one server owns: `count` elements from `offset`.
struct ps_slice {
  std::size_t offset = 0;  ///< the slice's first element in the model
  std::size_t count = 0;   ///< elements in the slice
};

/// The slice of a flat model of `size` elements that server `s` of `servers` owns: contiguous,
/// the first `size % servers` servers one element longer. A pure function of its arguments, so
/// every rank computes the same cut without talking. Throws invalid_parameter_error when `s`
/// is not in [0, servers).
inline ps_slice ps_slice_of(std::size_t size, int servers, int s) {
  if (servers < 1 || s < 0 || s >= servers)
    throw invalid_parameter_error("cadence::exchange::ps_slice_of: server " + std::to_string(s) +
                                  " is out of range [0, " + std::to_string(servers) + ")");
  const auto n = static_cast<std::size_t>(servers);
  const auto i = static_cast<std::size_t>(s);
  const std::size_t base = size / n, extra = size % n;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

/// The shipped update rule: w -= learning_rate * g on the slice. An update rule is any
/// callable `void(T* weights, const T* gradient, std::size_t count, worker_id from)`; one that
/// also offers `void(T* out, const T* in, const T* gradient, std::size_t count, worker_id)`
/// saves the server a copy when it must write a new version (a reply still reads the old one).
template <class T>
struct sgd {
  T learning_rate = T(0.01);  ///< the step size

  /// In place: `w` (n elements) -= learning_rate * `g`, whichever worker pushed it.
  void operator()(T* w, const T* g, std::size_t n, worker_id) const {
    for (std::size_t i = 0; i < n; ++i) w[i] -= learning_rate * g[i];
  }
  /// Out of place: `out` = `in` - learning_rate * `g` (n elements each).
  void operator()(T* out, const T* in, const T* g, std::size_t n, worker_id) const {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] - learning_rate * g[i];
  }
};

// ---- options, and what a server reports ----

/// What happened to a worker, as a server saw it: passed to ps_options::observer as it happens,
/// so a trainer can log evictions live and a test can wait for the state it needs.
struct ps_event {
  /// Which change a ps_event reports.
  enum class kind : unsigned char {
    finished,  ///< the worker called finish()
    evicted,   ///< dropped: silent past evict_after, lost, replaced, or its replies not taken
    refused,   ///< a request was refused (evicted, finished, or a bad message; reason says)
    joined,    ///< a new worker id: a process that joined late, or one that came back
  };
  kind what = kind::finished;  ///< what happened
  worker_id worker = 0;        ///< to which worker id
  std::string reason;          ///< empty for finished; the rank for joined ("rank 3")
};

/// The options of a parameter-server job, the same on every rank (servers and workers).
/// Checked when a ps_worker or parameter_server is built: invalid_parameter_error names the
/// option and the rule it breaks.
struct ps_options {
  /// Ranks [0, servers) serve; the rest are workers.
  int servers = 1;
  /// Worker ranks [servers, servers + initial_workers) are members from the start, with ids
  /// 0 .. initial_workers - 1 (server 0's controller must be built for that many); any other
  /// worker rank joins when it first pulls, under the next id the controller issues. Unset:
  /// every worker rank is an initial member.
  std::optional<int> initial_workers;
  /// Server 0 evicts a worker it has not heard from for this long. A worker waiting for its
  /// reply sends a heartbeat every evict_after / 4, so a stopped or crashed worker is evicted
  /// whether it was computing or parked. Unset: never (no heartbeats either); a dead worker
  /// then blocks a BSP barrier until the workers' reply_timeout.
  std::optional<std::chrono::nanoseconds> evict_after;
  /// How long a worker waits for the servers' replies to one request. A parked worker
  /// legitimately waits for the slowest worker (or its eviction, then its reply's transfer), so
  /// with evict_after set it must exceed evict_after + transfer_timeout (checked).
  std::chrono::nanoseconds reply_timeout = std::chrono::seconds(300);
  /// How long a server other than 0 may hear nothing before it gives up (server 0 gone).
  std::chrono::nanoseconds server_idle_timeout = std::chrono::seconds(300);
  /// Bound on one transfer (a slice, a reply). A worker whose reply has not left within it is
  /// dropped; the server never waits for it meanwhile.
  std::chrono::nanoseconds transfer_timeout = std::chrono::seconds(60);
  /// Replies (and refusals) in flight to one worker at most; a worker that lets more pile up
  /// is dropped. Bounds the server's memory per worker.
  int max_outstanding = 4;
  /// Servers keep the order in which they applied pushes (ps_log_entry), for replay; server 0
  /// also keeps the staleness of every release (ps_stats::start_staleness). Both grow with the
  /// run; without keep_log a server keeps only counts and a bounded histogram.
  bool keep_log = false;
  /// The adapter's traffic uses tags [tag_base, tag_base + 3] on the communicator.
  int tag_base = transport::max_tag - 3;
  /// Called on the server's thread for each ps_event, after the server acted on it. Keep it
  /// short and non-throwing: an exception from it ends run().
  std::function<void(const ps_event&)> observer;
};

/// One applied push, in the order a server applied it.
struct ps_log_entry {
  worker_id worker = 0;        ///< whose push
  std::int64_t iteration = 0;  ///< 1-based: the worker's n-th push
};

/// A worker a server dropped: silent past evict_after (server 0), lost (sending to or receiving
/// from it failed on a backend that survives a lost peer, or its reply was not taken within
/// transfer_timeout), replaced by a new process on its rank, broken (it sent a message the
/// server could not take: another size, a request out of turn), or absent at the start
/// (parameter_server::drop_absent).
struct ps_eviction {
  worker_id worker = 0;       ///< the worker id dropped
  std::int64_t pushes = 0;    ///< pushes applied before the eviction
  double silent_seconds = 0;  ///< how long it had been silent (0 unless evicted for silence)
  std::string reason;         ///< "silent for ... s", "lost: <the transport error>", "replaced ...",
                              ///< "broke the protocol: ...", or drop_absent()'s reason
  int rank = -1;              ///< the rank it was on (a worker id says it only for initial members)
};

/// A worker id issued while the server ran: to a rank that was not a member yet (joined late),
/// or to a rank whose previous worker was evicted, lost or replaced (came back).
struct ps_join {
  worker_id worker = 0;    ///< the id issued
  int rank = 0;            ///< to the process on this rank
  bool returning = false;  ///< the rank had a worker before
};

/// What a server measured: per worker id, pushes applied and the largest staleness (the
/// controller's clock gap) with which it was allowed to start an iteration (server 0 only).
struct ps_stats {
  /// Per worker id: pushes applied to this server's slice.
  std::vector<std::int64_t> pushes;
  /// Server 0, per worker id: the largest staleness it was released with.
  std::vector<clock_value> max_start_staleness;
  /// Workers dropped, in order.
  std::vector<ps_eviction> evictions;
  /// Worker ids issued while the server ran (not the initial members'), in order.
  std::vector<ps_join> joins;
  /// With keep_log: every applied push, in the order this server applied them.
  std::vector<ps_log_entry> log;
  /// With keep_log, server 0: the controller's staleness of each worker it released, in
  /// release order (one entry per push_pull answered; pull() is not a release).
  std::vector<clock_value> start_staleness;
  /// Server 0: releases by staleness, [g] for a gap of g (the last entry counts every gap at
  /// or above it): bounded, so percentiles never need the log.
  std::vector<std::int64_t> staleness_histogram;
  std::int64_t parked = 0;   ///< pushes whose reply was deferred (server 0)
  std::int64_t refused = 0;  ///< requests refused
  /// Server 0, per worker id (zeros on the other servers): its pushes whose reply was deferred
  /// (their sum is `parked`), and the seconds they waited for their release, from the moment
  /// the controller said "wait" (after the update was applied) to release_all posting the
  /// reply. A push released at once adds 0; one still parked when its worker is dropped adds
  /// nothing (it was never released). This is what the policy cost each worker: what a worker
  /// blocked in push_pull beyond it is moving bytes and queueing at the servers.
  std::vector<std::int64_t> parked_pushes;
  /// Server 0, per worker id: the seconds its parked pushes waited (see parked_pushes).
  std::vector<double> parked_seconds;
};

/// Largest gap with a bucket of its own in ps_stats::staleness_histogram.
inline constexpr std::size_t ps_histogram_top = 1024;

/// The `p`-th percentile (0 < p <= 100) of the gaps a histogram `h` counts
/// (ps_stats::staleness_histogram); 0 when it is empty.
inline clock_value histogram_percentile(const std::vector<std::int64_t>& h, double p) {
  std::int64_t total = 0;
  for (auto v : h) total += v;
  if (total == 0) return 0;
  const auto rank = static_cast<std::int64_t>(std::ceil(p / 100.0 * static_cast<double>(total)));
  std::int64_t seen = 0;
  for (std::size_t g = 0; g < h.size(); ++g) {
    seen += h[g];
    if (seen >= std::max<std::int64_t>(rank, 1)) return static_cast<clock_value>(g);
  }
  return static_cast<clock_value>(h.size() - 1);
}

/// @}
}  // namespace cadence::exchange
