// The parameter-exchange adapter: a parameter server and its workers over any communicator,
// so BSP, ASP, SSP, DSSP and ElasticBSP govern real processes through one controller. A worker
// that dies, stops or loses its link at any moment costs the job that worker only; workers can
// join a running job and evicted ones can come back under a new id.
#pragma once

#include <cadence/controllers/controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/core/types.hpp>
#include <cadence/exchange/ps/detail/protocol.hpp>
#include <cadence/exchange/ps/detail/transfer.hpp>
#include <cadence/runtime/liveness.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::exchange {

// ---- slices and the update rule ----

/// The part of a flat model of `size` elements that server `s` of `servers` owns: contiguous,
/// the first `size % servers` servers one element longer. A pure function of its arguments, so
/// every rank computes the same cut without talking.
struct ps_slice {
  std::size_t offset = 0;
  std::size_t count = 0;
};

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
  T learning_rate = T(0.01);
  void operator()(T* w, const T* g, std::size_t n, worker_id) const {
    for (std::size_t i = 0; i < n; ++i) w[i] -= learning_rate * g[i];
  }
  void operator()(T* out, const T* in, const T* g, std::size_t n, worker_id) const {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] - learning_rate * g[i];
  }
};

// ---- options, and what a server reports ----

/// What happened to a worker, as a server saw it: passed to ps_options::observer as it happens,
/// so a trainer can log evictions live and a test can wait for the state it needs.
struct ps_event {
  enum class kind : unsigned char {
    finished,  ///< the worker called finish()
    evicted,   ///< dropped: silent past evict_after, lost, replaced, or its replies not taken
    refused,   ///< a request was refused (evicted, finished, or a bad message; reason says)
    joined,    ///< a new worker id: a process that joined late, or one that came back
  };
  kind what = kind::finished;
  worker_id worker = 0;
  std::string reason;  ///< empty for finished; the rank for joined ("rank 3")
};

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
  worker_id worker = 0;
  std::int64_t iteration = 0;  ///< 1-based: the worker's n-th push
};

/// A worker a server dropped: silent past evict_after (server 0), lost (sending to or receiving
/// from it failed on a backend that survives a lost peer, or its reply was not taken within
/// transfer_timeout), or replaced by a new process on its rank.
struct ps_eviction {
  worker_id worker = 0;
  std::int64_t pushes = 0;  ///< pushes applied before the eviction
  double silent_seconds = 0;
  std::string reason;       ///< "silent for ... s", "lost: <the transport error>", "replaced ..."
};

/// A worker id issued while the server ran: to a rank that was not a member yet (joined late),
/// or to a rank whose previous worker was evicted, lost or replaced (came back).
struct ps_join {
  worker_id worker = 0;
  int rank = 0;
  bool returning = false;  ///< the rank had a worker before
};

/// What a server measured: per worker id, pushes applied and the largest staleness (the
/// controller's clock gap) with which it was allowed to start an iteration (server 0 only).
struct ps_stats {
  std::vector<std::int64_t> pushes;
  std::vector<clock_value> max_start_staleness;
  std::vector<ps_eviction> evictions;
  std::vector<ps_join> joins;
  std::vector<ps_log_entry> log;  ///< with keep_log
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
  std::vector<double> parked_seconds;
};

/// Largest gap with a bucket of its own in ps_stats::staleness_histogram.
inline constexpr std::size_t ps_histogram_top = 1024;

/// The p-th percentile (0 < p <= 100) of the gaps a histogram counts (ps_stats); 0 when empty.
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

// ---- ps_worker ----

/// A worker's end: push a gradient, get back the weights the policy allows it to start from.
/// `Comm` models transport::communicator with any_source and try_recv (the worker takes the
/// servers' replies in arrival order, and sends heartbeats while it waits). With a second
/// communicator `Bulk` (NCCL), headers travel on `Comm` and gradients and weights on `Bulk`,
/// whose buffers may be device memory; the ranks of both must be the same.
template <class Comm, class T = float, class Bulk = Comm>
class ps_worker {
  CADENCE_REQUIRE_COMMUNICATOR(Comm);
  CADENCE_REQUIRE_COMMUNICATOR(Bulk);
  static_assert(transport::has_try_recv_v<Comm>,
                "cadence::exchange::ps_worker: the control communicator must offer try_recv "
                "(a worker waiting for its reply sends heartbeats between waits)");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "cadence::exchange::ps_worker: T must be float or double");

public:
  ps_worker(Comm& comm, std::size_t model_size, ps_options options = {})
      : ps_worker(comm, comm, model_size, options) {}

  /// Headers on `control`, gradients and weights on `bulk` (which may be `control` itself).
  ps_worker(Comm& control, Bulk& bulk, std::size_t model_size, ps_options options = {})
      : comm_(control), bulk_(bulk), size_(model_size), options_(options), tags_(options.tag_base) {
    detail::check_options("ps_worker", options_, comm_.size());
    detail::check_same_ranks("ps_worker", comm_, bulk_);
    if (comm_.rank() < options_.servers)
      throw invalid_parameter_error("cadence::exchange::ps_worker: rank " +
                                    std::to_string(comm_.rank()) + " is a server (ranks [0, " +
                                    std::to_string(options_.servers) + ") serve)");
  }

  /// The id server 0 gave this worker at its first pull(). Before that, the id an initial
  /// member of this rank has (rank - servers); a rank that joins late learns its id at pull().
  worker_id id() const noexcept {
    return static_cast<worker_id>(id_ >= 0 ? id_ : comm_.rank() - options_.servers);
  }
  /// Pushes made under the current id.
  std::int64_t iteration() const noexcept { return iteration_; }

  /// The current weights, at once (no policy applies): the starting point of training, and
  /// the moment this worker becomes a member (server 0 gives it its id). The servers check the
  /// model size here. Over a bulk communicator with device buffers call it first: a gradient of
  /// the wrong size cannot be caught there once it is on its way.
  void pull(T* weights) {
    check_usable("pull");
    check_buffer("pull", weights, "weights");
    request("pull", weights);
    pulled_ = true;
  }

  /// Sends `gradient` (model_size elements), then blocks until the policy lets this worker
  /// start its next iteration and every server's fresh slice is in `weights`.
  /// Throws worker_error when a server refused it (evicted: call rejoin() to come back), and
  /// transport_error naming the servers it still waited for when they are gone.
  void push_pull(const T* gradient, T* weights) {
    check_usable("push_pull");
    check_buffer("push_pull", gradient, "gradient");
    check_buffer("push_pull", weights, "weights");
    if (!pulled_ && bulk_.capabilities().device_buffers)
      throw invalid_parameter_error(who() + ": push_pull before pull(): over device buffers the "
                                            "first pull() checks the model size with the servers");
    if (id_ < 0) pull(weights);  // a new process becomes a member first
    const std::int64_t k = iteration_ + 1;
    ++request_;
    for (int s = 0; s < options_.servers; ++s) {
      const ps_slice sl = ps_slice_of(size_, options_.servers, s);
      const detail::ps_header h = header(detail::ps_kind::push, k, static_cast<std::int64_t>(sl.count));
      to_server("push_pull", s, [&] {
        comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout);
        bulk_.send(gradient + sl.offset, sl.count * sizeof(T), s, tags_.data, options_.transfer_timeout);
      });
    }
    iteration_ = k;
    collect("push_pull", weights, 0, options_.servers);
  }

  /// After an eviction (push_pull threw worker_error saying so), joins the job again: server 0
  /// gives this worker a new id, the current weights land in `weights`, and iteration() starts
  /// over. The controller places it at the slowest clock, so every policy's bound holds.
  void rejoin(T* weights) {
    if (finished_) throw worker_error(who() + ": rejoin after finish()");
    check_buffer("rejoin", weights, "weights");
    refusal_.clear();
    id_ = -1;
    iteration_ = 0;
    pull(weights);
  }

  /// Leaves: the servers stop counting this worker (releasing whoever waited for it). Later
  /// calls throw. An evicted worker leaves without telling the servers (they dropped it).
  void finish() {
    if (finished_) throw worker_error(who() + ": finish() called twice");
    finished_ = true;
    if (!refusal_.empty()) return;
    detail::ps_header h = header(detail::ps_kind::finish, iteration_, 0);
    if (id_ < 0) {
      // Never pulled: an initial member still holds its reserved id, which the servers count
      // on; a rank that would have joined is nobody's to tell.
      const int mine = comm_.rank() - options_.servers;
      if (mine >= options_.initial_workers.value_or(comm_.size() - options_.servers)) return;
      h.worker = mine;
    }
    for (int s = 0; s < options_.servers; ++s)
      to_server("finish", s, [&] { comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout); });
  }

private:
  // Map of this class: one thread uses a worker. comm_ carries the headers (to every server),
  // the heartbeats (to server 0, while a reply is awaited) and the replies' headers and refusal
  // texts (collect() takes them in arrival order, dropping stale ones by request number); bulk_
  // carries the gradient slices out and the weight slices back. id_ is what server 0 assigned
  // (-1 until the first pull and after rejoin() starts); request_ numbers every request;
  // iteration_ counts pushes under the current id; refusal_ is sticky once evicted.

  std::string who() const {
    return "cadence::exchange::ps_worker (" +
           (id_ >= 0 ? "worker " + std::to_string(id_) : std::string("joining")) + ", rank " +
           std::to_string(comm_.rank()) + ")";
  }

  detail::ps_header header(detail::ps_kind kind, std::int64_t iteration, std::int64_t count) const {
    detail::ps_header h;
    h.kind = static_cast<std::int64_t>(kind);
    h.worker = id_;
    h.iteration = iteration;
    h.count = count;
    h.request = request_;
    return h;
  }

  // A pull: server 0 first (a new process learns its id there), then the others with that id.
  void request(const char* op, T* weights) {
    ++request_;
    detail::ps_header h = header(detail::ps_kind::pull, iteration_, static_cast<std::int64_t>(size_));
    to_server(op, 0, [&] { comm_.send(&h, sizeof h, 0, tags_.control, options_.transfer_timeout); });
    collect(op, weights, 0, 1);
    if (options_.servers == 1) return;
    h.worker = id_;
    for (int s = 1; s < options_.servers; ++s)
      to_server(op, s, [&] { comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout); });
    collect(op, weights, 1, options_.servers);
  }

  // Sends to server s, naming it when that fails (a dead server is fail-stop for workers).
  template <class F>
  void to_server(const char* op, int s, F&& f) {
    try {
      f();
    } catch (const transport_error& e) {
      throw transport_error(who() + ": " + op + " after " + std::to_string(iteration_) +
                            " iterations: sending to server rank " + std::to_string(s) +
                            " failed: " + e.what());
    }
  }

  void check_usable(const char* op) const {
    if (finished_) throw worker_error(who() + ": " + op + " after finish()");
    if (!refusal_.empty()) throw worker_error(refusal_);
  }
  void check_buffer(const char* op, const T* p, const char* what) const {
    if (p == nullptr && size_ != 0)
      throw invalid_parameter_error(who() + ": " + op + ": null " + what + " for a model of " +
                                    std::to_string(size_) + " elements");
  }

  // One reply per server in [first, last), taken in arrival order; replies to an earlier
  // request are dropped. While it waits, a heartbeat to server 0 every evict_after / 4.
  void collect(const char* op, T* weights, int first, int last) {
    std::vector<char> pending(static_cast<std::size_t>(options_.servers), 0);
    for (int s = first; s < last; ++s) pending[static_cast<std::size_t>(s)] = 1;
    int left = last - first;
    const auto give_up = transport::deadline(options_.reply_timeout);
    const auto beat = options_.evict_after ? std::optional<std::chrono::nanoseconds>(*options_.evict_after / 4)
                                           : std::nullopt;
    std::string refusal;
    bool evicted = false;
    while (left > 0) {
      detail::ps_header h;
      std::optional<int> got;
      try {
        auto until = give_up.time_point();
        if (beat) until = std::min(until, transport::deadline::clock::now() + *beat);
        got = comm_.try_recv(&h, sizeof h, transport::any_source, tags_.reply, transport::deadline::at(until));
      } catch (const transport_error& e) {
        throw transport_error(who() + ": " + op + " iteration " + std::to_string(iteration_) +
                              ": no reply from server rank(s) " + missing(pending) + ": " + e.what());
      }
      if (!got) {
        if (give_up.passed())
          throw transport_error(who() + ": " + op + " iteration " + std::to_string(iteration_) +
                                ": no reply from server rank(s) " + missing(pending) + " within " +
                                std::to_string(std::chrono::duration<double>(options_.reply_timeout).count()) +
                                " s (reply_timeout)");
        const detail::ps_header hb = header(detail::ps_kind::heartbeat, iteration_, 0);
        to_server("heartbeat", 0, [&] { comm_.send(&hb, sizeof hb, 0, tags_.control, options_.transfer_timeout); });
        continue;
      }
      const int s = *got;
      if (s < 0 || s >= options_.servers)
        throw transport_error(who() + ": unexpected reply from rank " + std::to_string(s));
      const auto status = static_cast<detail::ps_status>(h.status);
      std::string text;
      if (status != detail::ps_status::ok) {
        text.assign(static_cast<std::size_t>(std::max<std::int64_t>(h.count, 0)), '\0');
        comm_.recv(text.data(), text.size(), s, tags_.reply_data, options_.transfer_timeout);
      }
      if (h.request != request_ || !pending[static_cast<std::size_t>(s)]) {
        if (status == detail::ps_status::ok)  // a stale weights reply: the protocol is broken
          throw transport_error(who() + ": server rank " + std::to_string(s) + " answered request " +
                                std::to_string(h.request) + " with weights while request " +
                                std::to_string(request_) + " was pending");
        continue;  // a refusal of an earlier request (before a rejoin): its answer was given
      }
      pending[static_cast<std::size_t>(s)] = 0;
      --left;
      if (status != detail::ps_status::ok) {
        if (refusal.empty()) refusal = who() + ": " + op + " refused by server rank " + std::to_string(s) + ": " + text;
        evicted = evicted || status == detail::ps_status::evicted;
        continue;
      }
      if (s == 0 && id_ < 0) id_ = h.worker;  // server 0 gave this process its id
      const ps_slice sl = ps_slice_of(size_, options_.servers, s);
      if (static_cast<std::size_t>(h.count) != sl.count)
        throw transport_error(who() + ": server rank " + std::to_string(s) + " sent " +
                              std::to_string(h.count) + " weights; its slice has " +
                              std::to_string(sl.count) + " (do all ranks use one model size?)");
      bulk_.recv(weights + sl.offset, sl.count * sizeof(T), s, tags_.reply_data, options_.transfer_timeout);
    }
    if (!refusal.empty()) {
      if (evicted) refusal_ = refusal;  // an evicted worker stays evicted until rejoin()
      throw worker_error(refusal);
    }
  }

  static std::string missing(const std::vector<char>& pending) {
    std::string names;
    for (std::size_t i = 0; i < pending.size(); ++i)
      if (pending[i]) names += (names.empty() ? "" : ", ") + std::to_string(i);
    return names;
  }

  Comm& comm_;
  Bulk& bulk_;
  std::size_t size_;
  ps_options options_;
  detail::ps_tags tags_;
  std::int64_t id_ = -1;
  std::int64_t request_ = 0;
  std::int64_t iteration_ = 0;
  bool finished_ = false;
  bool pulled_ = false;
  std::string refusal_;  // sticky: an evicted worker stays evicted until rejoin()
};

// ---- parameter_server ----

/// A server's end: owns one slice of the model, applies pushes with `Update` on arrival, and
/// answers each worker when the policy allows. Server 0 (rank 0) coordinates: it alone drives
/// `Controller`, stamping each push with its own steady clock on arrival, decides membership
/// (joins, evictions), and tells the other servers whom it released and which pushes (per
/// worker, how many) the released worker's weights must contain; they answer once those are
/// applied. Others ignore the controller.
///
/// Nothing a worker does blocks the server: replies and refusals are posted without waiting
/// (over a communicator with the asynchronous operations) and a gradient's payload is received
/// the same way, so server 0 serves everyone else while one worker is stopped mid-transfer; a
/// worker whose transfer does not finish within transfer_timeout is dropped. Requests that
/// make no sense (a wrong size, an iteration out of order, a retried push, an unknown kind) are
/// refused with the reason, and the server goes on.
template <class Comm, class Controller, class T = float, class Update = sgd<T>, class Bulk = Comm>
class parameter_server {
  CADENCE_REQUIRE_COMMUNICATOR(Comm);
  CADENCE_REQUIRE_COMMUNICATOR(Bulk);
  static_assert(transport::has_try_recv_v<Comm>,
                "cadence::exchange::parameter_server: the communicator must offer try_recv "
                "(the server waits for the next message or the next liveness deadline)");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "cadence::exchange::parameter_server: T must be float or double");

public:
  using clock = std::chrono::steady_clock;

  /// `initial` is the whole model (model_size elements) on every server; each keeps its slice.
  /// On server 0, `controller` must have been built for the initial workers (every worker rank,
  /// or ps_options::initial_workers).
  parameter_server(Comm& comm, std::size_t model_size, const T* initial, Controller controller,
                   Update update = Update{}, ps_options options = {})
      : comm_(comm), bulk_(comm), size_(model_size), controller_(std::move(controller)),
        update_(std::move(update)), options_(options), tags_(options.tag_base) {
    setup();
    detail::check_same_ranks("parameter_server", comm_, comm_);
    if (initial == nullptr && model_size != 0)
      throw invalid_parameter_error("cadence::exchange::parameter_server: null initial weights");
    weights_.emplace(initial + slice_.offset, slice_.count);
  }

  /// Headers on `control`, gradients and weights on `bulk` (NCCL: device memory). The buffers
  /// are the caller's: `weights` holds this server's slice (ps_slice_of(model_size, servers,
  /// rank).count elements, the initial values in it) and `scratch` as many elements, where each
  /// incoming gradient lands before `update(weights, scratch, count, worker)` applies it; both
  /// must outlive the server. Over device buffers the update rule runs on the device (yours),
  /// and there is one version of the slice: an update waits until the replies reading it have
  /// left (at most transfer_timeout; a worker whose reply did not leave by then is dropped).
  parameter_server(Comm& control, Bulk& bulk, std::size_t model_size, T* weights, T* scratch,
                   Controller controller, Update update = Update{}, ps_options options = {})
      : comm_(control), bulk_(bulk), size_(model_size), controller_(std::move(controller)),
        update_(std::move(update)), options_(options), tags_(options.tag_base) {
    setup();
    detail::check_same_ranks("parameter_server", comm_, bulk_);
    if ((weights == nullptr || scratch == nullptr) && slice_.count != 0)
      throw invalid_parameter_error("cadence::exchange::parameter_server: null weights or scratch "
                                    "buffer for a slice of " + std::to_string(slice_.count) + " elements");
    weights_.emplace(weights, slice_.count);
    external_scratch_ = scratch;
  }

  parameter_server(const parameter_server&) = delete;
  parameter_server& operator=(const parameter_server&) = delete;

  /// Serves until every member finished or was evicted. Throws transport_error when the
  /// communicator fails (or, on a server other than 0, after server_idle_timeout of silence).
  void run() {
    start_ = clock::now();
    last_heard_ = start_;
    if (coordinator() && options_.evict_after) {
      liveness_.emplace(*options_.evict_after);
      for (std::size_t w = 0; w < state_.size(); ++w) liveness_->heard(static_cast<worker_id>(w), start_);
    }
    for (;;) {
      const std::size_t before = in_flight();
      progress_transfers();
      if (in_flight() != before) last_activity_ = clock::now();
      // Every server hears every member's finish() (or server 0's eviction notice). Server 0
      // ends once nobody is left and its replies are delivered, telling the other servers;
      // they end when both hold (server 0 may still have notices for them until then).
      if (done() && in_flight() == 0 && (coordinator() || shutdown_)) {
        if (coordinator()) shutdown_servers();
        return;
      }
      detail::ps_header h;
      std::optional<int> src;
      try {
        src = comm_.try_recv(&h, sizeof h, transport::any_source, tags_.control,
                             transport::deadline::at(next_wake()));
      } catch (const transport_error& e) {
        // Every rank that could still send is lost (the communicator survives lost peers, so
        // it is still usable): whoever has not finished never will.
        if (comm_.failed()) throw;
        for (std::size_t w = 0; w < state_.size(); ++w)
          drop(static_cast<worker_id>(w), std::string("lost: ") + e.what());
        if (in_flight() == 0) return;
        continue;
      }
      const auto now = clock::now();
      if (src) {
        last_heard_ = now;
        last_activity_ = now;
        dispatch(*src, h);
        continue;  // drain what is queued before judging anyone silent
      }
      if (coordinator()) {
        drop_lost(now);
        evict_silent(now);
      } else if (now - last_heard_ >= options_.server_idle_timeout) {
        throw transport_error(who() + ": heard nothing for " +
                              std::to_string(std::chrono::duration<double>(options_.server_idle_timeout).count()) +
                              " s (server_idle_timeout); is server rank 0 gone?");
      }
    }
  }

  /// This server's slice of the weights (the current version; device memory over NCCL), and
  /// where it sits in the model.
  span<const T> weights() const noexcept { return span<const T>(weights_->current(), slice_.count); }
  ps_slice slice() const noexcept { return slice_; }
  const ps_stats& stats() const noexcept { return stats_; }
  const Controller& controller() const noexcept { return controller_; }
  bool coordinator() const noexcept { return comm_.rank() == 0; }
  /// Buffers holding versions of the slice (1 over the caller's storage): how much the server
  /// copied on write because replies were still in flight.
  std::size_t weight_buffers() const noexcept { return weights_->buffers(); }

private:
  // Map of this class. Everything runs on the thread that calls run().
  //  - Membership: member_[rank] is the worker id a worker rank currently holds (-1: none);
  //    claimed_[rank] whether that id's process has pulled yet (initial members hold reserved
  //    ids from the start). Per worker id: state_, applied_ (pushes applied to this slice),
  //    rank_of_, request_ (its last request seen) and answered_ (the last one answered: a request
  //    is answered once), and on server 0 parked_since_ (when the controller parked its last
  //    push; apply() sets it, release_all() turns it into ps_stats::parked_seconds). Server 0
  //    alone issues ids (controller_.add_worker()) and tells the other servers (joined
  //    notices); they park messages from ids they do not know yet in deferred_ until the
  //    notice comes.
  //  - In flight: out_[rank] holds the replies and refusals posted to that rank, each with the
  //    version of the weights it pins and its deadline; in_[rank] the gradient payload being
  //    received from it, into a buffer of scratch_. progress_transfers() finishes both and drops
  //    a worker whose transfer failed or missed its deadline.
  //  - The slice: weights_ (copy-on-write versions); pending_ (servers other than 0): releases
  //    waiting until the pushes they need are applied.
  //  - Server 0's liveness_: heard on every message from a member (heartbeats included).

  enum class worker_state : unsigned char { active, finished, evicted };

  struct outbound {
    detail::ps_header header;  // the bytes the control send reads: kept here until it is done
    std::string text;          // a refusal's text
    detail::ps_transfer<Comm> control;
    detail::ps_transfer<Comm> control_text;  // a refusal's text follows its header
    detail::ps_transfer<Bulk> bulk;          // a reply's weights
    typename detail::ps_versions<T>::pin_id pin = detail::ps_versions<T>::no_pin;
    clock::time_point deadline;
    std::int64_t worker = -1;  // whose (the rank's id when posted)
  };
  struct inbound {
    detail::ps_header header;
    detail::ps_transfer<Bulk> transfer;
    T* buffer = nullptr;
    std::size_t scratch = 0;  // index into scratch_ (owned storage)
    clock::time_point deadline;
  };

  std::string who() const { return "cadence::exchange::parameter_server (server rank " + std::to_string(comm_.rank()) + ")"; }

  void setup() {
    detail::check_options("parameter_server", options_, comm_.size());
    if (comm_.rank() >= options_.servers)
      throw invalid_parameter_error("cadence::exchange::parameter_server: rank " +
                                    std::to_string(comm_.rank()) + " is a worker (ranks [0, " +
                                    std::to_string(options_.servers) + ") serve)");
    const int worker_ranks = comm_.size() - options_.servers;
    const int initial = options_.initial_workers.value_or(worker_ranks);
    if (coordinator() && controller_.worker_capacity() != static_cast<std::size_t>(initial))
      throw invalid_parameter_error(
          "cadence::exchange::parameter_server: the controller has " +
          std::to_string(controller_.worker_capacity()) + " workers but the world has " +
          std::to_string(initial) + " initial ones (" + std::to_string(comm_.size()) + " ranks, " +
          std::to_string(options_.servers) + " servers" +
          (options_.initial_workers ? ", initial_workers = " + std::to_string(initial) : std::string()) + ")");
    slice_ = ps_slice_of(size_, options_.servers, comm_.rank());
    const auto n = static_cast<std::size_t>(comm_.size());
    member_.assign(n, -1);
    claimed_.assign(n, 0);
    out_.resize(n);
    in_.resize(n);
    deferred_.resize(n);
    for (int w = 0; w < initial; ++w) add_member(static_cast<worker_id>(w), options_.servers + w);
  }

  void add_member(worker_id w, int rank) {
    const auto wi = static_cast<std::size_t>(w);
    if (state_.size() <= wi) {
      state_.resize(wi + 1, worker_state::evicted);  // ids skipped here were never ours
      applied_.resize(wi + 1, 0);
      rank_of_.resize(wi + 1, -1);
      request_.resize(wi + 1, 0);
      answered_.resize(wi + 1, 0);
      stats_.pushes.resize(wi + 1, 0);
      stats_.max_start_staleness.resize(wi + 1, 0);
      stats_.parked_pushes.resize(wi + 1, 0);
      stats_.parked_seconds.resize(wi + 1, 0.0);
      parked_since_.resize(wi + 1, not_parked);
    }
    state_[wi] = worker_state::active;
    rank_of_[wi] = rank;
    member_[static_cast<std::size_t>(rank)] = static_cast<std::int64_t>(w);
  }

  bool done() const {
    return std::none_of(state_.begin(), state_.end(), [](worker_state s) { return s == worker_state::active; });
  }

  std::size_t in_flight() const {
    std::size_t n = 0;
    for (const auto& q : out_) n += q.size();
    for (const auto& p : in_) n += p ? 1 : 0;
    return n;
  }

  clock::time_point next_wake() const {
    const auto now = clock::now();
    // With transfers in flight, look again soon: a completed one frees its buffer, an expired
    // one drops its worker, a payload that arrived is applied.
    // The gap grows with the time since anything last moved (a sixteenth of it, at most 200 us),
    // so a payload or reply that completes microseconds after its post is seen microseconds
    // later, not after a fixed wait (the receive below does not report completed transfers),
    // and a transfer stuck on a stopped worker costs a poll every 200 us.
    auto wake = now + std::chrono::seconds(1);
    if (in_flight() != 0)
      wake = now + std::min<clock::duration>(std::chrono::microseconds(200), (now - last_activity_) / 16);
    if (coordinator() && liveness_) {
      if (const auto t = liveness_->next_deadline()) wake = std::min(wake, *t);
    }
    if (!coordinator()) wake = std::min(wake, last_heard_ + options_.server_idle_timeout);
    if constexpr (transport::has_peer_lost_v<Comm>)
      if (coordinator()) wake = std::min(wake, now + lost_poll);  // see drop_lost()
    return std::max(wake, now);
  }

  // ---- messages in ----

  void dispatch(int src, const detail::ps_header& h) {
    if (src < options_.servers) {  // from server 0
      if (src != 0 || coordinator())
        throw transport_error(who() + ": control message from server rank " + std::to_string(src) +
                              " (only server 0 coordinates)");
      switch (static_cast<detail::ps_kind>(h.kind)) {
        case detail::ps_kind::release: on_release(h); return;
        case detail::ps_kind::evicted: on_evicted_notice(h); return;
        case detail::ps_kind::joined: on_joined_notice(h); return;
        case detail::ps_kind::shutdown: shutdown_ = true; return;
        default:
          throw transport_error(who() + ": unexpected message kind " + std::to_string(h.kind) + " from server 0");
      }
    }
    handle_worker(src, h);
  }

  void handle_worker(int src, const detail::ps_header& h) {
    const auto r = static_cast<std::size_t>(src);
    const auto kind = static_cast<detail::ps_kind>(h.kind);
    if (!detail::known_kind(h.kind) || kind == detail::ps_kind::reply || kind == detail::ps_kind::release ||
        kind == detail::ps_kind::evicted || kind == detail::ps_kind::joined || kind == detail::ps_kind::shutdown) {
      // Nothing follows a message we do not know, so the stream stays in step: refuse it.
      refuse_rank(src, h, "unknown message kind " + std::to_string(h.kind) + " from rank " + std::to_string(src));
      return;
    }
    if (kind == detail::ps_kind::pull && h.worker < 0) {
      if (coordinator()) {
        admit(src, h);
      } else {
        refuse_rank(src, h, "a new process must pull from server rank 0 first (it issues worker ids)");
      }
      return;
    }
    // Anything else names the id it holds: it must be this rank's current one.
    if (h.worker < 0 || member_[r] != h.worker) {
      if (!coordinator() && h.worker >= 0 && !known(static_cast<worker_id>(h.worker))) {
        deferred_[r].push_back(h);  // server 0's joined notice is still on its way
        if (kind == detail::ps_kind::push) receive_payload_into_junk(src, h);
        return;
      }
      if (kind == detail::ps_kind::push) receive_payload_into_junk(src, h);
      if (kind == detail::ps_kind::heartbeat || kind == detail::ps_kind::finish) return;  // nothing to answer
      const bool was_ours = h.worker >= 0 && known(static_cast<worker_id>(h.worker)) &&
                            rank_of_[static_cast<std::size_t>(h.worker)] == src;
      if (was_ours) {
        refuse(static_cast<worker_id>(h.worker), h.request, state_text(static_cast<worker_id>(h.worker)));
      } else {
        refuse_rank(src, h, "rank " + std::to_string(src) + " claims worker id " + std::to_string(h.worker) +
                                " but holds " + (member_[r] < 0 ? std::string("none") : std::to_string(member_[r])));
      }
      return;
    }
    const auto w = static_cast<worker_id>(h.worker);
    const auto wi = static_cast<std::size_t>(w);
    const bool request = kind == detail::ps_kind::pull || kind == detail::ps_kind::push;
    if (request && state_[wi] == worker_state::active && request_[wi] > answered_[wi] && h.request != request_[wi]) {
      // A new request while the last is unanswered: no worker of ours does that, so its state
      // cannot be trusted. It is dropped (the refusal says why); everyone else goes on.
      if (kind == detail::ps_kind::push) receive_payload_into_junk(src, h);
      request_[wi] = h.request;
      drop(w, "broke the protocol: request " + std::to_string(h.request) + " came before request " +
                  std::to_string(answered_[wi] + 1) + " was answered");
      return;
    }
    if (request) request_[wi] = std::max(request_[wi], h.request);
    if (state_[wi] != worker_state::active) {
      if (kind == detail::ps_kind::push) receive_payload_into_junk(src, h);
      if (kind == detail::ps_kind::pull || kind == detail::ps_kind::push) refuse(w, h.request, state_text(w));
      return;
    }
    heard(w);
    switch (kind) {
      case detail::ps_kind::heartbeat: return;
      case detail::ps_kind::pull:
        if (h.count != static_cast<std::int64_t>(size_)) {
          refuse(w, h.request, size_text(h.count));
          return;
        }
        claimed_[r] = 1;
        reply(w, h.request, applied_[wi]);
        return;
      case detail::ps_kind::push: on_push(src, w, h); return;
      case detail::ps_kind::finish: on_finish(w); return;
      default: return;
    }
  }

  bool known(worker_id w) const {
    return static_cast<std::size_t>(w) < state_.size() && rank_of_[static_cast<std::size_t>(w)] >= 0;
  }

  std::string state_text(worker_id w) const {
    return state_[static_cast<std::size_t>(w)] == worker_state::evicted
               ? "worker " + std::to_string(w) + " was evicted (" + eviction_reason(w) + ")"
               : "worker " + std::to_string(w) + " already called finish()";
  }
  std::string eviction_reason(worker_id w) const {
    for (auto it = stats_.evictions.rbegin(); it != stats_.evictions.rend(); ++it)
      if (it->worker == w) return it->reason;
    return "dropped";
  }
  std::string size_text(std::int64_t count) const {
    return "a model of " + std::to_string(count) + " elements, but server rank " + std::to_string(comm_.rank()) +
           " serves one of " + std::to_string(size_) + " (do all ranks use one model size?)";
  }

  // Server 0: a new process on rank src pulls. An initial member claims its reserved id; a rank
  // whose member already pulled gets a new id (the old process was replaced: it is dropped
  // first); anyone else joins under the next id.
  void admit(int src, const detail::ps_header& h) {
    const auto r = static_cast<std::size_t>(src);
    if (h.count != static_cast<std::int64_t>(size_)) {
      refuse_rank(src, h, size_text(h.count));
      return;
    }
    std::int64_t w = member_[r];
    if (w >= 0 && state_[static_cast<std::size_t>(w)] == worker_state::active && !claimed_[r]) {
      claimed_[r] = 1;
      heard(static_cast<worker_id>(w));
      reply(static_cast<worker_id>(w), h.request, applied_[static_cast<std::size_t>(w)]);
      return;
    }
    const bool returning = w >= 0;
    if (w >= 0 && state_[static_cast<std::size_t>(w)] == worker_state::active)
      drop(static_cast<worker_id>(w), "replaced: a new process pulled on rank " + std::to_string(src));
    worker_id fresh = 0;
    try {
      fresh = controller_.add_worker();
    } catch (const error& e) {
      refuse_rank(src, h, std::string("cannot join: ") + e.what());
      return;
    }
    add_member(fresh, src);
    claimed_[r] = 1;
    stats_.joins.push_back({fresh, src, returning});
    request_[static_cast<std::size_t>(fresh)] = h.request;
    // The other servers learn the id before the worker can name it to them (it pulls from
    // them only after this reply).
    detail::ps_header n;
    n.kind = static_cast<std::int64_t>(detail::ps_kind::joined);
    n.worker = fresh;
    n.count = src;
    for (int s = 1; s < options_.servers; ++s) to_server(s, n);
    if (liveness_) liveness_->heard(fresh, clock::now());
    notify(ps_event::kind::joined, fresh, "rank " + std::to_string(src));
    reply(fresh, h.request, 0);
  }

  void on_joined_notice(const detail::ps_header& n) {
    if (n.worker < 0 || n.count < options_.servers || n.count >= comm_.size())
      throw transport_error(who() + ": malformed joined notice from server 0");
    const auto w = static_cast<worker_id>(n.worker);
    const int rank = static_cast<int>(n.count);
    const std::int64_t old = member_[static_cast<std::size_t>(rank)];
    if (old >= 0 && state_[static_cast<std::size_t>(old)] == worker_state::active)
      drop(static_cast<worker_id>(old), "replaced: a new process pulled on rank " + std::to_string(rank));
    add_member(w, rank);
    claimed_[static_cast<std::size_t>(rank)] = 1;
    stats_.joins.push_back({w, rank, old >= 0});
    auto parked = std::move(deferred_[static_cast<std::size_t>(rank)]);
    deferred_[static_cast<std::size_t>(rank)].clear();
    for (const auto& h : parked) handle_worker(rank, h);
  }

  void on_push(int src, worker_id w, const detail::ps_header& h) {
    const auto r = static_cast<std::size_t>(src);
    if (h.count < 0 || static_cast<std::size_t>(h.count) != slice_.count) {
      receive_payload_into_junk(src, h);
      refuse(w, h.request, "worker " + std::to_string(w) + " pushed a gradient slice of " + std::to_string(h.count) +
                               " elements, but server rank " + std::to_string(comm_.rank()) + " owns " +
                               std::to_string(slice_.count) + " (do all ranks use one model size?)");
      return;
    }
    if (in_[r]) {  // a second push before the first was answered: it cannot be in step
      receive_payload_into_junk(src, h);
      refuse(w, h.request, "worker " + std::to_string(w) + " pushed again before its push " +
                               std::to_string(in_[r]->header.iteration) + " was answered");
      return;
    }
    if (weights_->external()) settle_external_payload();
    inbound in;
    in.header = h;
    in.deadline = clock::now() + options_.transfer_timeout;
    if (weights_->external()) {
      in.buffer = external_scratch_;
    } else {
      in.scratch = take_scratch();
      in.buffer = scratch_[in.scratch]->data();
    }
    try {
      in.transfer = detail::ps_transfer<Bulk>::recv(bulk_, in.buffer, slice_.count * sizeof(T), src, tags_.data,
                                                    options_.transfer_timeout);
    } catch (const transport_error& e) {
      release_scratch(in);
      lost(w, e);
      return;
    }
    in_[r] = std::move(in);
    // The payload usually follows its header at once: finish it here when it has.
    finish_payload(src);
  }

  // A payload is in flight whatever we think of its header: take it so the stream stays in
  // step (bounded: a count beyond any slice drops the worker instead).
  void receive_payload_into_junk(int src, const detail::ps_header& h) {
    if (static_cast<detail::ps_kind>(h.kind) != detail::ps_kind::push || h.count <= 0) return;
    const auto w = member_[static_cast<std::size_t>(src)];
    if (bulk_.capabilities().device_buffers || static_cast<std::size_t>(h.count) > std::max<std::size_t>(slice_.count, 1) * 4) {
      if (w >= 0) drop(static_cast<worker_id>(w), "its push announced " + std::to_string(h.count) +
                                                      " elements, which this server cannot take");
      return;
    }
    std::vector<T> junk(static_cast<std::size_t>(h.count));
    try {
      bulk_.recv(junk.data(), junk.size() * sizeof(T), src, tags_.data, options_.transfer_timeout);
    } catch (const transport_error& e) {
      if (comm_.failed() || bulk_.failed()) throw;
      if (w >= 0) lost(static_cast<worker_id>(w), e);
    }
  }

  // Applies rank src's payload once it is in.
  void finish_payload(int src) {
    const auto r = static_cast<std::size_t>(src);
    auto& slot = in_[r];
    if (!slot) return;
    const std::int64_t held = member_[r];
    bool complete = false;
    try {
      complete = slot->transfer.test();
    } catch (const transport_error& e) {
      if (comm_.failed() || bulk_.failed()) throw;
      release_scratch(*slot);
      slot.reset();
      if (held >= 0) lost(static_cast<worker_id>(held), e);
      return;
    }
    if (!complete) {
      if (clock::now() >= slot->deadline) {
        const bool freed = slot->transfer.cancel();
        if (freed) release_scratch(*slot);  // else the buffer stays the transport's
        slot.reset();
        if (held >= 0)
          drop(static_cast<worker_id>(held), "lost: its gradient did not arrive within transfer_timeout");
      }
      return;
    }
    inbound in = std::move(*slot);
    slot.reset();
    const detail::ps_header& h = in.header;
    if (held != h.worker || state_[static_cast<std::size_t>(h.worker)] != worker_state::active) {
      release_scratch(in);
      return;  // dropped while its payload was on the way
    }
    apply(static_cast<worker_id>(h.worker), h, in.buffer);
    release_scratch(in);
  }

  void apply(worker_id w, const detail::ps_header& h, const T* gradient) {
    const auto wi = static_cast<std::size_t>(w);
    if (h.iteration != applied_[wi] + 1) {
      refuse(w, h.request, "worker " + std::to_string(w) + " pushed iteration " + std::to_string(h.iteration) +
                               " after " + std::to_string(applied_[wi]) +
                               (h.iteration <= applied_[wi] ? " (a retried push?)" : " (a push went missing?)"));
      return;
    }
    if (weights_->external()) drain_pins();  // one version only: replies reading it leave first
    // A reply that completed since the last look unpins the current version here, so the update
    // writes in place instead of copying the slice into a fresh version (a ping-pong's push
    // usually arrives in the same receive that saw its previous reply complete).
    if (weights_->current_pinned()) progress_outbound();
    weights_->apply(update_, gradient, w);
    applied_[wi] = h.iteration;
    ++stats_.pushes[wi];
    if (options_.keep_log) stats_.log.push_back({w, h.iteration});
    if (coordinator()) {
      const auto now = clock::now();
      const decision d = controller_.push(w, std::chrono::duration<double>(now - start_).count());
      std::vector<worker_id> released(d.released.begin(), d.released.end());
      if (d.proceed) {
        released.insert(released.begin(), w);
      } else {
        ++stats_.parked;
        ++stats_.parked_pushes[wi];
        parked_since_[wi] = now;
      }
      release_all(released);
    } else {
      serve_pending();
    }
  }

  void on_finish(worker_id w) {
    const auto wi = static_cast<std::size_t>(w);
    state_[wi] = worker_state::finished;
    if (coordinator()) {
      if (liveness_) liveness_->forget(w);
      auto released = controller_.remove_worker(w);
      release_all(std::vector<worker_id>(released.begin(), released.end()));
    }
    notify(ps_event::kind::finished, w, {});
  }

  // ---- releases (server 0) and what the other servers do with them ----

  // Server 0: w may start its next iteration. The other servers learn whom and what its
  // weights must contain (server 0's applied counts) before w hears anything.
  void release_all(const std::vector<worker_id>& released) {
    std::optional<clock::time_point> now;  // read once, and only when a parked push goes
    for (worker_id w : released) {
      const auto wi = static_cast<std::size_t>(w);
      if (state_[wi] != worker_state::active) continue;
      if (parked_since_[wi] != not_parked) {
        if (!now) now = clock::now();
        stats_.parked_seconds[wi] += std::chrono::duration<double>(*now - parked_since_[wi]).count();
        parked_since_[wi] = not_parked;
      }
      const clock_value gap = controller_.staleness(w);
      stats_.max_start_staleness[wi] = std::max(stats_.max_start_staleness[wi], gap);
      if (options_.keep_log) stats_.start_staleness.push_back(gap);
      if (stats_.staleness_histogram.empty()) stats_.staleness_histogram.assign(ps_histogram_top + 1, 0);
      ++stats_.staleness_histogram[std::min<std::size_t>(static_cast<std::size_t>(std::max<clock_value>(gap, 0)), ps_histogram_top)];
      if (options_.servers > 1) {
        std::vector<std::int64_t> need(applied_);
        for (std::size_t v = 0; v < need.size(); ++v)
          if (state_[v] == worker_state::evicted) need[v] = -1;
        detail::ps_header h;
        h.kind = static_cast<std::int64_t>(detail::ps_kind::release);
        h.worker = w;
        h.iteration = applied_[wi];
        h.count = static_cast<std::int64_t>(need.size());
        h.request = request_[wi];
        for (int s = 1; s < options_.servers; ++s) to_server(s, h, &need);
      }
      reply(w, request_[wi], applied_[wi]);
      heard(w);  // its silence counts from its release
    }
  }

  struct pending_release {
    worker_id worker;
    std::int64_t iteration;
    std::int64_t request;
    std::vector<std::int64_t> need;
  };

  void on_release(const detail::ps_header& h) {
    if (h.count < 0 || h.worker < 0 || static_cast<std::size_t>(h.count) > max_workers)
      throw transport_error(who() + ": malformed release notice from server 0");
    pending_release r{static_cast<worker_id>(h.worker), h.iteration, h.request,
                      std::vector<std::int64_t>(static_cast<std::size_t>(h.count))};
    comm_.recv(r.need.data(), r.need.size() * sizeof(std::int64_t), 0, tags_.data, options_.transfer_timeout);
    if (!known(r.worker) || state_[static_cast<std::size_t>(r.worker)] != worker_state::active) return;  // dropped here
    pending_.push_back(std::move(r));
    serve_pending();
  }

  void on_evicted_notice(const detail::ps_header& h) {
    if (h.worker < 0 || !known(static_cast<worker_id>(h.worker)))
      throw transport_error(who() + ": malformed eviction notice from server 0");
    drop(static_cast<worker_id>(h.worker), "evicted by server 0");
  }

  // Servers other than 0: answer every release whose required pushes are all applied here.
  void serve_pending() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool ready = true;
      for (std::size_t v = 0; v < it->need.size() && ready; ++v)
        ready = it->need[v] < 0 || v >= state_.size() || state_[v] == worker_state::evicted ||
                applied_[v] >= it->need[v];
      if (!ready) {
        ++it;
        continue;
      }
      const worker_id w = it->worker;
      const std::int64_t k = it->iteration, req = it->request;
      it = pending_.erase(it);
      if (state_[static_cast<std::size_t>(w)] == worker_state::active) reply(w, req, k);
    }
  }

  // ---- messages out ----

  // Server 0 tells server s something; a server that is gone is fail-stop for everyone.
  void to_server(int s, const detail::ps_header& h, const std::vector<std::int64_t>* data = nullptr) {
    try {
      comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout);
      if (data) comm_.send(data->data(), data->size() * sizeof(std::int64_t), s, tags_.data, options_.transfer_timeout);
    } catch (const transport_error& e) {
      throw transport_error(who() + ": server rank " + std::to_string(s) + " is gone: " + e.what());
    }
  }

  // Server 0, at the end: the other servers may go. One that is gone already changes nothing.
  void shutdown_servers() {
    detail::ps_header h;
    h.kind = static_cast<std::int64_t>(detail::ps_kind::shutdown);
    for (int s = 1; s < options_.servers; ++s) {
      try {
        comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout);
      } catch (const transport_error&) {
        if (comm_.failed()) throw;
      }
    }
  }

  // The weights to worker w, answering its request: posted, never waited for.
  void reply(worker_id w, std::int64_t request, std::int64_t iteration) {
    const auto wi = static_cast<std::size_t>(w);
    if (answered_[wi] >= request && request > 0) return;  // one answer per request
    answered_[wi] = request;
    outbound o;
    o.header.kind = static_cast<std::int64_t>(detail::ps_kind::reply);
    o.header.worker = w;
    o.header.iteration = iteration;
    o.header.count = static_cast<std::int64_t>(slice_.count);
    o.header.request = request;
    o.pin = weights_->pin();
    post(rank_of_[wi], w, std::move(o), weights_->current(), slice_.count * sizeof(T));
  }

  // A refusal of worker w's request (reason in the text); counted and reported.
  void refuse(worker_id w, std::int64_t request, const std::string& text) {
    const auto wi = static_cast<std::size_t>(w);
    ++stats_.refused;
    notify(ps_event::kind::refused, w, text);
    if (answered_[wi] >= request && request > 0) return;  // its answer was given (an eviction notice)
    answered_[wi] = std::max(answered_[wi], request);
    post_refusal(rank_of_[wi], w, request,
                 state_[wi] == worker_state::evicted ? detail::ps_status::evicted : detail::ps_status::error, text);
  }

  // A refusal to a rank that holds no id we can name (a bad first message, an id it does not
  // hold): answered on its own, nothing recorded against a worker.
  void refuse_rank(int src, const detail::ps_header& h, const std::string& text) {
    ++stats_.refused;
    const auto w = member_[static_cast<std::size_t>(src)];
    if (w >= 0) notify(ps_event::kind::refused, static_cast<worker_id>(w), text);
    post_refusal(src, w, h.request, detail::ps_status::error, text);
  }

  void post_refusal(int rank, std::int64_t w, std::int64_t request, detail::ps_status status, const std::string& text) {
    outbound o;
    o.header.kind = static_cast<std::int64_t>(detail::ps_kind::reply);
    o.header.worker = w;
    o.header.status = static_cast<std::int64_t>(status);
    o.header.count = static_cast<std::int64_t>(text.size());
    o.header.request = request;
    o.text = text;
    post(rank, w, std::move(o), nullptr, 0);
  }

  // Posts a reply (payload: the pinned weights) or a refusal (payload: its text) to `rank`.
  void post(int rank, std::int64_t w, outbound o, const T* payload, std::size_t bytes) {
    auto& q = out_[static_cast<std::size_t>(rank)];
    if (static_cast<int>(q.size()) >= options_.max_outstanding) {
      weights_->unpin(o.pin);
      if (w >= 0 && static_cast<std::size_t>(w) < state_.size() && state_[static_cast<std::size_t>(w)] == worker_state::active)
        drop(static_cast<worker_id>(w), "lost: " + std::to_string(q.size()) +
                                           " replies in flight that it does not take (max_outstanding)");
      return;
    }
    o.worker = w;
    o.deadline = clock::now() + options_.transfer_timeout;
    q.push_back(std::move(o));
    outbound& e = q.back();
    try {
      e.control = detail::ps_transfer<Comm>::send(comm_, &e.header, sizeof e.header, rank, tags_.reply,
                                                  options_.transfer_timeout);
      if (payload != nullptr)
        e.bulk = detail::ps_transfer<Bulk>::send(bulk_, payload, bytes, rank, tags_.reply_data, options_.transfer_timeout);
      else
        e.bulk = detail::ps_transfer<Bulk>();  // the text goes on the control communicator
      if (payload == nullptr)
        e.control_text = detail::ps_transfer<Comm>::send(comm_, e.text.data(), e.text.size(), rank, tags_.reply_data,
                                                         options_.transfer_timeout);
    } catch (const transport_error& err) {
      if (comm_.failed() || bulk_.failed()) throw;
      settle(rank, err);
    }
  }

  // ---- transfers in flight ----

  void progress_transfers() {
    progress_outbound();
    for (std::size_t r = 0; r < in_.size(); ++r)
      if (in_[r]) finish_payload(static_cast<int>(r));
  }

  // The replies and refusals in flight: completed ones unpin their version of the weights.
  void progress_outbound() {
    for (std::size_t r = 0; r < out_.size(); ++r) {
      auto& q = out_[r];
      while (!q.empty()) {
        outbound& o = q.front();
        bool complete = false;
        try {
          complete = o.control.test() && o.control_text.test() && o.bulk.test();
        } catch (const transport_error& err) {
          if (comm_.failed() || bulk_.failed()) throw;
          settle(static_cast<int>(r), err);
          break;
        }
        if (complete) {
          weights_->unpin(o.pin);
          q.pop_front();
          continue;
        }
        if (clock::now() >= o.deadline) expire(static_cast<int>(r));
        break;  // later ones are behind it
      }
    }
  }

  // A transfer to `rank` failed (its peer lost): withdraw what is queued for it, drop its worker.
  void settle(int rank, const transport_error& err) {
    const std::int64_t w = abandon(rank);
    if (w >= 0) lost(static_cast<worker_id>(w), err);
  }

  // The oldest transfer to `rank` missed its deadline: the worker is not taking its replies.
  void expire(int rank) {
    const std::int64_t w = abandon(rank);
    if (w >= 0)
      drop(static_cast<worker_id>(w), "lost: its reply was not taken within transfer_timeout");
  }

  // Cancels everything queued for `rank`; returns the worker it was for (-1: none active).
  std::int64_t abandon(int rank) {
    auto& q = out_[static_cast<std::size_t>(rank)];
    std::int64_t w = -1;
    for (auto& o : q) {
      const bool freed = o.control.cancel() && o.control_text.cancel() && o.bulk.cancel();
      if (freed) weights_->unpin(o.pin);  // else the transport may still read that version
      if (o.worker >= 0) w = o.worker;
    }
    q.clear();
    if (w >= 0 && (static_cast<std::size_t>(w) >= state_.size() || state_[static_cast<std::size_t>(w)] != worker_state::active))
      w = -1;
    return w;
  }

  // Over the caller's single buffer: wait (bounded by each transfer's deadline) until no reply
  // reads the weights, so the update does not tear them.
  void drain_pins() {
    while (weights_->current_pinned()) {
      progress_transfers();
      if (!weights_->current_pinned()) return;
      std::this_thread::yield();
    }
  }

  // Over the caller's single scratch buffer one payload lands at a time: the one in flight is
  // finished (applied, or its worker dropped at its deadline) before the next receive is posted
  // into the same memory. Bounded: its header came first, so its sender has posted the payload.
  void settle_external_payload() {
    for (std::size_t r = 0; r < in_.size(); ++r)
      while (in_[r]) {
        finish_payload(static_cast<int>(r));
        if (in_[r]) std::this_thread::yield();
      }
  }

  std::size_t take_scratch() {
    if (!free_scratch_.empty()) {
      const std::size_t i = free_scratch_.back();
      free_scratch_.pop_back();
      return i;
    }
    scratch_.push_back(std::make_unique<std::vector<T>>(slice_.count));
    return scratch_.size() - 1;
  }
  void release_scratch(const inbound& in) {
    if (!weights_->external()) free_scratch_.push_back(in.scratch);
  }

  // ---- liveness, evictions ----

  void heard(worker_id w) {
    if (liveness_ && state_[static_cast<std::size_t>(w)] == worker_state::active) liveness_->heard(w, clock::now());
  }

  // Server 0: evicts every worker silent past evict_after, releasing whoever waited for it.
  void evict_silent(clock::time_point now) {
    if (!liveness_) return;
    for (worker_id w : liveness_->silent(now)) {
      const auto last = liveness_->last_heard(w);
      const double silent = last ? std::chrono::duration<double>(now - *last).count() : 0.0;
      drop(w, "silent for " + std::to_string(silent) + " s (evict_after)", silent);
    }
  }

  // Server 0, over a communicator that knows when a peer is gone (has_peer_lost_v): drops the
  // worker of every lost rank at once, instead of at its liveness deadline, so the others
  // (parked under BSP, say) do not wait evict_after for a crashed worker. Runs only when the
  // receive found nothing queued, so whatever the rank sent before it was lost (its finish()
  // included) has been handled; a rank whose slot has a new process is alive again.
  void drop_lost(clock::time_point now) {
    if constexpr (transport::has_peer_lost_v<Comm>) {
      if (now < next_lost_check_) return;
      next_lost_check_ = now + lost_poll;
      for (std::size_t r = static_cast<std::size_t>(options_.servers); r < member_.size(); ++r) {
        const std::int64_t w = member_[r];
        if (w < 0 || state_[static_cast<std::size_t>(w)] != worker_state::active) continue;
        // Two looks, each after a receive that found nothing queued: a rank seen lost between
        // the first receive and the look may have sent its finish() just before leaving, and
        // that message is queued by the second look, which then finds the worker finished.
        if (lost_suspect_.size() < member_.size()) lost_suspect_.resize(member_.size(), 0);
        if (!comm_.peer_lost(static_cast<int>(r))) {
          lost_suspect_[r] = 0;
        } else if (!lost_suspect_[r]) {
          lost_suspect_[r] = 1;
        } else {
          lost_suspect_[r] = 0;
          drop(static_cast<worker_id>(w), "lost: the transport reports rank " + std::to_string(r) +
                                              " gone (its connection closed or its heartbeats stopped)");
        }
      }
    } else {
      (void)now;
    }
  }

  void lost(worker_id w, const transport_error& e) { drop(w, std::string("lost: ") + e.what()); }

  // Removes worker w for good. Server 0 removes it from the controller (releasing whoever
  // waited only for it) and tells the other servers; a request of w's still unanswered gets an
  // "evicted" refusal, so a worker dropped mid-request learns why instead of timing out.
  void drop(worker_id w, const std::string& reason, double silent = 0) {
    const auto wi = static_cast<std::size_t>(w);
    if (wi >= state_.size() || state_[wi] != worker_state::active) return;
    if (liveness_) liveness_->forget(w);
    state_[wi] = worker_state::evicted;
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](const pending_release& r) { return r.worker == w; }),
                   pending_.end());
    stats_.evictions.push_back({w, applied_[wi], silent, reason});
    const int rank = rank_of_[wi];
    const bool reachable = reason.rfind("lost", 0) != 0;
    if (reachable && request_[wi] > answered_[wi]) {
      answered_[wi] = request_[wi];
      post_refusal(rank, w, request_[wi], detail::ps_status::evicted,
                   "worker " + std::to_string(w) + " was evicted (" + reason + ")");
    }
    if (coordinator()) {
      detail::ps_header h;
      h.kind = static_cast<std::int64_t>(detail::ps_kind::evicted);
      h.worker = w;
      h.iteration = applied_[wi];
      for (int s = 1; s < options_.servers; ++s) to_server(s, h);
      auto released = controller_.remove_worker(w);
      release_all(std::vector<worker_id>(released.begin(), released.end()));
    } else {
      serve_pending();
    }
    notify(ps_event::kind::evicted, w, reason);
  }

  void notify(ps_event::kind what, worker_id w, std::string reason) const {
    if (options_.observer) options_.observer(ps_event{what, w, std::move(reason)});
  }

  // ---- state (the map above says who touches what) ----

  Comm& comm_;
  Bulk& bulk_;
  std::size_t size_;
  Controller controller_;
  Update update_;
  ps_options options_;
  detail::ps_tags tags_;
  ps_slice slice_;
  std::optional<detail::ps_versions<T>> weights_;
  // How often server 0 asks the communicator for lost peers while idle (has_peer_lost_v).
  static constexpr std::chrono::milliseconds lost_poll{10};
  clock::time_point next_lost_check_{};
  std::vector<char> lost_suspect_;  // per rank: seen lost once (drop_lost)
  clock::time_point last_activity_{};  // a message in, or a transfer finished (next_wake)
  T* external_scratch_ = nullptr;
  std::vector<std::unique_ptr<std::vector<T>>> scratch_;
  std::vector<std::size_t> free_scratch_;
  std::vector<std::int64_t> member_;  // per rank
  std::vector<char> claimed_;         // per rank
  std::vector<worker_state> state_;   // per worker id, and below
  std::vector<std::int64_t> applied_;
  std::vector<int> rank_of_;
  std::vector<std::int64_t> request_;
  std::vector<std::int64_t> answered_;
  // Server 0: when the controller parked the worker's last push (not_parked: it is not).
  static constexpr clock::time_point not_parked = clock::time_point::min();
  std::vector<clock::time_point> parked_since_;
  std::vector<std::deque<outbound>> out_;            // per rank
  std::vector<std::optional<inbound>> in_;           // per rank
  std::vector<std::vector<detail::ps_header>> deferred_;  // per rank (servers other than 0)
  std::vector<pending_release> pending_;
  std::optional<liveness_tracker<clock::time_point>> liveness_;
  clock::time_point start_{}, last_heard_{};
  bool shutdown_ = false;  // servers other than 0: server 0 said it is done
  ps_stats stats_;
};

}  // namespace cadence::exchange
