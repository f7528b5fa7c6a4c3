// The parameter-exchange adapter: a parameter server and its workers over any communicator,
// so BSP, ASP, SSP, DSSP and ElasticBSP govern real processes through one controller.
#pragma once

#include <cadence/controllers/controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/core/types.hpp>
#include <cadence/runtime/liveness.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::exchange {

// ---- slices of the model and the update rule ----

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
/// callable `void(T* weights, const T* gradient, std::size_t count, worker_id from)`.
template <class T>
struct sgd {
  T learning_rate = T(0.01);
  void operator()(T* w, const T* g, std::size_t n, worker_id) const {
    for (std::size_t i = 0; i < n; ++i) w[i] -= learning_rate * g[i];
  }
};

// ---- options, and what a server reports ----

/// What happened to a worker, as a server saw it: passed to ps_options::observer as it happens,
/// so a trainer can log evictions live and a test can wait for the state it needs.
struct ps_event {
  enum class kind : unsigned char {
    finished,  ///< the worker called finish()
    evicted,   ///< dropped: silent past evict_after, or lost (reason says which)
    refused,   ///< a request was refused (evicted, finished, or a bad message; reason says)
  };
  kind what = kind::finished;
  worker_id worker = 0;
  std::string reason;  ///< empty for finished
};

struct ps_options {
  /// Ranks [0, servers) serve; the rest are workers (worker id = rank - servers).
  int servers = 1;
  /// Server 0 evicts a worker it has not heard from for this long while it was not waiting on
  /// the server (computing, or dead). Unset: never; a dead worker then blocks a BSP barrier
  /// until the workers' reply_timeout.
  std::optional<std::chrono::nanoseconds> evict_after;
  /// How long a worker waits for the servers' replies to one push. A parked worker legitimately
  /// waits for the slowest one, so this must exceed the longest straggle (or evict_after).
  std::chrono::nanoseconds reply_timeout = std::chrono::seconds(300);
  /// How long a server other than 0 may hear nothing before it gives up (server 0 gone).
  std::chrono::nanoseconds server_idle_timeout = std::chrono::seconds(300);
  /// Bound on one transfer (a send of a slice); a peer slower than this fails the call.
  std::chrono::nanoseconds transfer_timeout = std::chrono::seconds(60);
  /// Servers keep the order in which they applied pushes (ps_log_entry), for replay; server 0
  /// also keeps the staleness of every release (ps_stats::start_staleness).
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

/// A worker server 0 evicted for silence.
/// A worker a server dropped: silent past evict_after (server 0), or lost, when sending to or
/// receiving from it failed on a backend that survives a lost peer.
struct ps_eviction {
  worker_id worker = 0;
  std::int64_t pushes = 0;  ///< pushes applied before the eviction
  double silent_seconds = 0;
  std::string reason;       ///< "silent for ... s" or "lost: <the transport error>"
};

/// What a server measured: per worker, pushes applied and the largest staleness (the
/// controller's clock gap) with which it was allowed to start an iteration (server 0 only).
struct ps_stats {
  std::vector<std::int64_t> pushes;
  std::vector<clock_value> max_start_staleness;
  std::vector<ps_eviction> evictions;
  std::vector<ps_log_entry> log;  ///< with keep_log
  /// With keep_log, server 0: the controller's staleness of each worker it released, in
  /// release order (one entry per push_pull answered; the first pull() is not a release), so
  /// that callers can report percentiles, not only max_start_staleness.
  std::vector<clock_value> start_staleness;
  std::int64_t parked = 0;        ///< pushes whose reply was deferred (server 0)
};

// ---- detail: the messages (kinds, header, tags) and the argument checks ----

namespace detail {

enum class ps_kind : std::int64_t { push = 1, pull, finish, reply, release, evicted };
enum class ps_status : std::int64_t { ok = 0, evicted, error };

// Every control message is this fixed-size header; a payload, when any, follows on the
// matching data tag from the same rank.
struct ps_header {
  std::int64_t kind = 0;
  std::int64_t worker = 0;
  std::int64_t iteration = 0;
  std::int64_t count = 0;  // payload elements (bytes for an error text)
  std::int64_t status = 0;
  std::int64_t pad = 0;
};

inline void check_options(const char* who, const ps_options& o, int size) {
  const std::string w = std::string("cadence::exchange::") + who + ": ";
  if (o.servers < 1 || o.servers >= size)
    throw invalid_parameter_error(w + "servers = " + std::to_string(o.servers) +
                                  " leaves no worker in a world of " + std::to_string(size) +
                                  " ranks (need 1 <= servers < size)");
  if (o.evict_after && *o.evict_after <= std::chrono::nanoseconds::zero())
    throw invalid_parameter_error(w + "evict_after must be > 0");
  if (o.reply_timeout <= std::chrono::nanoseconds::zero() ||
      o.server_idle_timeout <= std::chrono::nanoseconds::zero() ||
      o.transfer_timeout <= std::chrono::nanoseconds::zero())
    throw invalid_parameter_error(w + "timeouts must be > 0");
  if (o.tag_base < 0 || o.tag_base > transport::max_tag - 3)
    throw invalid_parameter_error(w + "tag_base " + std::to_string(o.tag_base) +
                                  " leaves no room for 4 tags below max_tag");
}

template <class A, class B>
void check_same_ranks(const char* who, const A& control, const B& bulk) {
  if (control.rank() != bulk.rank() || control.size() != bulk.size())
    throw invalid_parameter_error(std::string("cadence::exchange::") + who +
                                  ": the control communicator is rank " + std::to_string(control.rank()) +
                                  " of " + std::to_string(control.size()) +
                                  " but the bulk communicator is rank " + std::to_string(bulk.rank()) +
                                  " of " + std::to_string(bulk.size()) + " (they must agree)");
  if (!control.capabilities().any_source)
    throw invalid_parameter_error(std::string("cadence::exchange::") + who +
                                  ": the control communicator cannot receive from any_source "
                                  "(NCCL cannot; use MPI, gloo or inproc for control)");
  if (control.capabilities().device_buffers)
    throw invalid_parameter_error(std::string("cadence::exchange::") + who +
                                  ": the control communicator takes device buffers; headers live "
                                  "in host memory");
}

struct ps_tags {
  int control, data, reply, reply_data;
  explicit ps_tags(int base) : control(base), data(base + 1), reply(base + 2), reply_data(base + 3) {}
};

}  // namespace detail

// ---- ps_worker ----

/// A worker's end: push a gradient, get back the weights the policy allows it to start from.
/// `Comm` models transport::communicator with any_source (the worker takes the servers'
/// replies in arrival order, so a server blocked on one reply never stalls another). With a
/// second communicator `Bulk` (NCCL), headers travel on `Comm` and gradients and weights on
/// `Bulk`, whose buffers may be device memory; the ranks of both must be the same.
template <class Comm, class T = float, class Bulk = Comm>
class ps_worker {
  CADENCE_REQUIRE_COMMUNICATOR(Comm);
  CADENCE_REQUIRE_COMMUNICATOR(Bulk);
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

  worker_id id() const noexcept { return static_cast<worker_id>(comm_.rank() - options_.servers); }
  std::int64_t iteration() const noexcept { return iteration_; }

  /// The current weights, at once (no policy applies): the starting point of training. The
  /// servers check the model size here. Over a bulk communicator with device buffers call it
  /// first: a gradient of the wrong size cannot be caught there once it is on its way.
  void pull(T* weights) {
    check_usable("pull");
    check_buffer("pull", weights, "weights");
    detail::ps_header h;
    h.kind = static_cast<std::int64_t>(detail::ps_kind::pull);
    h.worker = id();
    h.iteration = iteration_;
    h.count = static_cast<std::int64_t>(size_);
    for (int s = 0; s < options_.servers; ++s)
      to_server("pull", s, [&] { comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout); });
    collect("pull", weights);
    pulled_ = true;
  }

  /// Sends `gradient` (model_size elements), then blocks until the policy lets this worker
  /// start its next iteration and every server's fresh slice is in `weights`.
  /// Throws worker_error when the servers evicted this worker, and transport_error naming the
  /// servers it still waited for when they are gone.
  void push_pull(const T* gradient, T* weights) {
    check_usable("push_pull");
    check_buffer("push_pull", gradient, "gradient");
    check_buffer("push_pull", weights, "weights");
    if (!pulled_ && bulk_.capabilities().device_buffers)
      throw invalid_parameter_error(who() + ": push_pull before pull(): over device buffers the "
                                            "first pull() checks the model size with the servers");
    const std::int64_t k = iteration_ + 1;
    for (int s = 0; s < options_.servers; ++s) {
      const ps_slice sl = ps_slice_of(size_, options_.servers, s);
      detail::ps_header h;
      h.kind = static_cast<std::int64_t>(detail::ps_kind::push);
      h.worker = id();
      h.iteration = k;
      h.count = static_cast<std::int64_t>(sl.count);
      to_server("push_pull", s, [&] {
        comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout);
        bulk_.send(gradient + sl.offset, sl.count * sizeof(T), s, tags_.data, options_.transfer_timeout);
      });
    }
    iteration_ = k;
    collect("push_pull", weights);
  }

  /// Leaves: the servers stop counting this worker (releasing whoever waited for it). Later
  /// calls throw.
  void finish() {
    if (finished_) throw worker_error(who() + ": finish() called twice");
    detail::ps_header h;
    h.kind = static_cast<std::int64_t>(detail::ps_kind::finish);
    h.worker = id();
    h.iteration = iteration_;
    finished_ = true;
    for (int s = 0; s < options_.servers; ++s)
      to_server("finish", s, [&] { comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout); });
  }

private:
  // Map of this class: one thread uses a worker. comm_ carries the headers (to every server)
  // and the replies' headers and refusal texts (collect() takes them in arrival order); bulk_
  // carries the gradient slices out and the weight slices back. iteration_ counts the pushes
  // (push_pull() advances it; every header carries it); pulled_ is set by pull() (over device
  // buffers push_pull() needs it first); finished_ by finish(); refusal_ by collect() when a
  // server says this worker was evicted, after which check_usable() refuses every call.

  std::string who() const { return "cadence::exchange::ps_worker (worker " + std::to_string(id()) + ", rank " + std::to_string(comm_.rank()) + ")"; }

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

  // One reply per server, taken in arrival order.
  void collect(const char* op, T* weights) {
    std::vector<char> pending(static_cast<std::size_t>(options_.servers), 1);
    int left = options_.servers;
    const auto d = transport::deadline(options_.reply_timeout);
    std::string refusal;
    bool evicted = false;
    while (left > 0) {
      detail::ps_header h;
      int s = -1;
      try {
        s = comm_.recv(&h, sizeof h, transport::any_source, tags_.reply, d);
      } catch (const transport_error& e) {
        std::vector<int> missing;
        for (int i = 0; i < options_.servers; ++i)
          if (pending[static_cast<std::size_t>(i)]) missing.push_back(i);
        std::string names;
        for (int i : missing) names += (names.empty() ? "" : ", ") + std::to_string(i);
        throw transport_error(who() + ": " + op + " iteration " + std::to_string(iteration_) +
                              ": no reply from server rank(s) " + names + ": " + e.what());
      }
      if (s < 0 || s >= options_.servers || !pending[static_cast<std::size_t>(s)])
        throw transport_error(who() + ": unexpected reply from rank " + std::to_string(s));
      pending[static_cast<std::size_t>(s)] = 0;
      --left;
      const auto status = static_cast<detail::ps_status>(h.status);
      if (status != detail::ps_status::ok) {
        std::string text(static_cast<std::size_t>(std::max<std::int64_t>(h.count, 0)), '\0');
        comm_.recv(text.data(), text.size(), s, tags_.reply_data, options_.transfer_timeout);
        if (refusal.empty()) refusal = who() + ": " + op + " refused by server rank " + std::to_string(s) + ": " + text;
        evicted = evicted || status == detail::ps_status::evicted;
        continue;
      }
      const ps_slice sl = ps_slice_of(size_, options_.servers, s);
      if (static_cast<std::size_t>(h.count) != sl.count)
        throw transport_error(who() + ": server rank " + std::to_string(s) + " sent " +
                              std::to_string(h.count) + " weights; its slice has " +
                              std::to_string(sl.count) + " (do all ranks use one model size?)");
      bulk_.recv(weights + sl.offset, sl.count * sizeof(T), s, tags_.reply_data, options_.transfer_timeout);
    }
    if (!refusal.empty()) {
      if (evicted) refusal_ = refusal;  // an evicted worker stays evicted
      throw worker_error(refusal);
    }
  }

  Comm& comm_;
  Bulk& bulk_;
  std::size_t size_;
  ps_options options_;
  detail::ps_tags tags_;
  std::int64_t iteration_ = 0;
  bool finished_ = false;
  bool pulled_ = false;
  std::string refusal_;  // sticky: an evicted worker stays evicted
};

// ---- parameter_server ----

/// A server's end: owns one slice of the model, applies pushes with `Update` on arrival, and
/// answers each worker when the policy allows. Server 0 (rank 0) coordinates: it alone drives
/// `Controller`, stamping each push with its own steady clock on arrival, and tells the other
/// servers whom it released and which pushes (per worker, how many) the released worker's
/// weights must contain; they answer once those are applied. Others ignore the controller.
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
  /// On server 0, `controller` must have been built for exactly size() - servers workers.
  parameter_server(Comm& comm, std::size_t model_size, const T* initial, Controller controller,
                   Update update = Update{}, ps_options options = {})
      : comm_(comm), bulk_(comm), size_(model_size), controller_(std::move(controller)),
        update_(std::move(update)), options_(options), tags_(options.tag_base) {
    setup();
    detail::check_same_ranks("parameter_server", comm_, comm_);
    if (initial == nullptr && model_size != 0)
      throw invalid_parameter_error("cadence::exchange::parameter_server: null initial weights");
    owned_weights_.assign(initial + slice_.offset, initial + slice_.offset + slice_.count);
    owned_scratch_.resize(slice_.count);
    weights_ = owned_weights_.data();
    scratch_ = owned_scratch_.data();
  }

  /// Headers on `control`, gradients and weights on `bulk` (NCCL: device memory). The buffers
  /// are the caller's: `weights` holds this server's slice (ps_slice_of(model_size, servers,
  /// rank).count elements, the initial values in it) and `scratch` as many elements, where each
  /// incoming gradient lands before `update(weights, scratch, count, worker)` applies it; both
  /// must outlive the server. Over device buffers the update rule runs on the device (yours).
  parameter_server(Comm& control, Bulk& bulk, std::size_t model_size, T* weights, T* scratch,
                   Controller controller, Update update = Update{}, ps_options options = {})
      : comm_(control), bulk_(bulk), size_(model_size), controller_(std::move(controller)),
        update_(std::move(update)), options_(options), tags_(options.tag_base) {
    setup();
    detail::check_same_ranks("parameter_server", comm_, bulk_);
    if ((weights == nullptr || scratch == nullptr) && slice_.count != 0)
      throw invalid_parameter_error("cadence::exchange::parameter_server: null weights or scratch "
                                    "buffer for a slice of " + std::to_string(slice_.count) + " elements");
    weights_ = weights;
    scratch_ = scratch;
  }

private:
  void setup() {
    detail::check_options("parameter_server", options_, comm_.size());
    if (comm_.rank() >= options_.servers)
      throw invalid_parameter_error("cadence::exchange::parameter_server: rank " +
                                    std::to_string(comm_.rank()) + " is a worker (ranks [0, " +
                                    std::to_string(options_.servers) + ") serve)");
    workers_ = comm_.size() - options_.servers;
    if (coordinator() && controller_.worker_capacity() != static_cast<std::size_t>(workers_))
      throw invalid_parameter_error(
          "cadence::exchange::parameter_server: the controller has " +
          std::to_string(controller_.worker_capacity()) + " workers but the world has " +
          std::to_string(workers_) + " (" + std::to_string(comm_.size()) + " ranks, " +
          std::to_string(options_.servers) + " servers)");
    slice_ = ps_slice_of(size_, options_.servers, comm_.rank());
    const auto w = static_cast<std::size_t>(workers_);
    state_.assign(w, worker_state::active);
    applied_.assign(w, 0);
    stats_.pushes.assign(w, 0);
    stats_.max_start_staleness.assign(w, 0);
  }

public:
  /// Serves until every worker finished or was evicted. Throws transport_error when the
  /// communicator fails (or, on a server other than 0, after server_idle_timeout of silence).
  void run() {
    start_ = clock::now();
    if (coordinator() && options_.evict_after) {
      liveness_.emplace(*options_.evict_after);
      for (int p = 0; p < workers_; ++p) liveness_->heard(static_cast<worker_id>(p), start_);
    }
    for (;;) {
      // Every server hears every worker's finish() (or server 0's eviction notice), so each
      // ends on its own once nobody is left: none may end before a worker's last message.
      if (done()) return;
      detail::ps_header h;
      const auto wake = next_wake();
      std::optional<int> src;
      try {
        src = comm_.try_recv(&h, sizeof h, transport::any_source, tags_.control, transport::deadline::at(wake));
      } catch (const transport_error& e) {
        // Every rank that could still send is lost (the communicator survives lost peers,
        // so it is still usable): whoever has not finished never will.
        if (comm_.failed()) throw;
        for (int p = 0; p < workers_; ++p) drop(static_cast<worker_id>(p), std::string("lost: ") + e.what());
        continue;
      }
      if (!src) {
        if (coordinator()) {
          evict_silent(clock::now());
          continue;
        }
        throw transport_error("cadence::exchange::parameter_server (server rank " +
                              std::to_string(comm_.rank()) + "): heard nothing for " +
                              std::to_string(std::chrono::duration<double>(options_.server_idle_timeout).count()) +
                              " s (server_idle_timeout); is server rank 0 gone?");
      }
      handle(*src, h);
      if (coordinator()) evict_silent(clock::now());
    }
  }

  /// This server's slice of the weights (the caller's buffer, device memory over NCCL), and
  /// where it sits in the model.
  span<const T> weights() const noexcept { return span<const T>(weights_, slice_.count); }
  ps_slice slice() const noexcept { return slice_; }
  const ps_stats& stats() const noexcept { return stats_; }
  const Controller& controller() const noexcept { return controller_; }
  bool coordinator() const noexcept { return comm_.rank() == 0; }

private:
  // Map of this class: run() drives everything on one thread, one message at a time.
  //  - comm_: every header (workers' push, pull and finish; server 0's release and eviction
  //    notices to the others; replies and refusal texts); bulk_: the payloads (a push's
  //    gradient slice into scratch_, a reply's weight slice from weights_).
  //  - weights_ and scratch_: this server's slice, the caller's buffers (or owned_weights_ and
  //    owned_scratch_); on_push() receives into scratch_ and applies update_ to weights_,
  //    send_reply() sends weights_.
  //  - slice_, workers_: set by setup(), fixed after.
  //  - Per worker: state_ (active until handle() sees its finish or drop() evicts it; a
  //    worker not active is refused), applied_ (pushes applied here: on_push(); server 0
  //    sends it to the others as what a release needs; serve_pending() compares).
  //  - Server 0 only: controller_ (on_push() pushes, release_all() reads staleness, handle()
  //    and drop() remove workers), liveness_ (with evict_after, made by run(): heard on pull,
  //    push and release, excused while parked, forgotten on finish or eviction; next_wake()
  //    and evict_silent() read it), start_ (run(); on_push() stamps pushes against it).
  //  - Other servers only: pending_ (server 0's releases waiting for pushes not yet applied
  //    here: on_release() adds, serve_pending() answers, drop() removes).
  //  - stats_: pushes and log (on_push()), max_start_staleness and start_staleness
  //    (release_all()), parked (on_push()), evictions (drop()).
  // The functions below, in order: the message loop's helpers; messages from workers and
  // server 0; releases; talking to servers and workers; eviction.

  enum class worker_state : unsigned char { active, finished, evicted };

  std::string who() const { return "cadence::exchange::parameter_server (server rank " + std::to_string(comm_.rank()) + ")"; }
  int rank_of(worker_id w) const { return static_cast<int>(w) + options_.servers; }

  bool done() const {
    return std::none_of(state_.begin(), state_.end(), [](worker_state s) { return s == worker_state::active; });
  }

  clock::time_point next_wake() const {
    if (!coordinator()) return clock::now() + options_.server_idle_timeout;
    if (liveness_) {
      if (const auto t = liveness_->next_deadline()) return *t;
    }
    return clock::now() + options_.server_idle_timeout;  // nothing to watch: wake only to re-check
  }

  // ---- messages from workers and from server 0 ----

  void handle(int src, const detail::ps_header& h) {
    const auto kind = static_cast<detail::ps_kind>(h.kind);
    if (src < options_.servers) {  // from server 0
      if (src != 0 || coordinator())
        throw transport_error(who() + ": control message from server rank " + std::to_string(src) +
                              " (only server 0 coordinates)");
      switch (kind) {
        case detail::ps_kind::release: on_release(h); return;
        case detail::ps_kind::evicted: on_evicted_notice(h); return;
        default:
          throw transport_error(who() + ": unexpected message kind " + std::to_string(h.kind) + " from server 0");
      }
    }
    const auto w = static_cast<worker_id>(src - options_.servers);
    const auto wi = static_cast<std::size_t>(w);
    switch (kind) {
      case detail::ps_kind::push: on_push(w, h); break;
      case detail::ps_kind::pull:
        if (state_[wi] != worker_state::active) {
          refuse(w, state_[wi]);
        } else if (h.count != static_cast<std::int64_t>(size_)) {
          refuse_text(w, "worker " + std::to_string(w) + " has a model of " + std::to_string(h.count) +
                             " elements, server rank " + std::to_string(comm_.rank()) + " one of " +
                             std::to_string(size_) + " (do all ranks use one model size?)");
        } else {
          if (liveness_) liveness_->heard(w, clock::now());
          reply(w, h.iteration);
        }
        break;
      case detail::ps_kind::finish:
        if (state_[wi] != worker_state::active) break;  // already evicted: nothing to undo
        state_[wi] = worker_state::finished;
        if (coordinator()) {
          if (liveness_) liveness_->forget(w);
          auto released = controller_.remove_worker(w);
          release_all(std::vector<worker_id>(released.begin(), released.end()));
        }
        notify(ps_event::kind::finished, w, {});
        break;
      default:
        throw transport_error(who() + ": unexpected message kind " + std::to_string(h.kind) + " from rank " + std::to_string(src));
    }
  }

  void on_push(worker_id w, const detail::ps_header& h) {
    const auto wi = static_cast<std::size_t>(w);
    const int src = rank_of(w);
    const bool fits = h.count >= 0 && static_cast<std::size_t>(h.count) == slice_.count;
    // The payload is in flight whatever we think of it: take it (into scratch when it does
    // not fit, bounded by the slice or 64 Mi elements), so the stream stays in step.
    if (!fits) {
      if (bulk_.capabilities().device_buffers)  // pull() agreed on the size: a broken protocol
        throw transport_error(who() + ": worker " + std::to_string(w) + " announced a gradient slice of " +
                              std::to_string(h.count) + " elements; this server owns " +
                              std::to_string(slice_.count) + " (it skipped pull()?)");
      const auto n = static_cast<std::size_t>(std::clamp<std::int64_t>(h.count, 0, std::int64_t{1} << 26));
      std::vector<T> junk(n);
      if (!with_worker(w, [&] { bulk_.recv(junk.data(), n * sizeof(T), src, tags_.data, options_.transfer_timeout); }))
        return;
      refuse_text(w, "gradient slice of " + std::to_string(h.count) + " elements, but server rank " +
                         std::to_string(comm_.rank()) + " owns " + std::to_string(slice_.count) +
                         " (do all ranks use one model size?)");
      return;
    }
    if (!with_worker(w, [&] { bulk_.recv(scratch_, slice_.count * sizeof(T), src, tags_.data, options_.transfer_timeout); }))
      return;  // lost between header and payload: nothing applied
    if (state_[wi] != worker_state::active) {
      refuse(w, state_[wi]);
      return;
    }
    if (h.iteration != applied_[wi] + 1)
      throw transport_error(who() + ": worker " + std::to_string(w) + " pushed iteration " +
                            std::to_string(h.iteration) + " after " + std::to_string(applied_[wi]));
    update_(weights_, static_cast<const T*>(scratch_), slice_.count, w);
    applied_[wi] = h.iteration;
    ++stats_.pushes[wi];
    if (options_.keep_log) stats_.log.push_back({w, h.iteration});
    if (coordinator()) {
      const auto now = clock::now();
      if (liveness_) liveness_->heard(w, now);
      const decision d = controller_.push(w, std::chrono::duration<double>(now - start_).count());
      std::vector<worker_id> released(d.released.begin(), d.released.end());
      if (d.proceed) {
        released.insert(released.begin(), w);
      } else {
        ++stats_.parked;
        if (liveness_) liveness_->excuse(w);
      }
      release_all(released);
    } else {
      serve_pending();
    }
  }

  // ---- releases ----

  // Server 0: w may start its next iteration. The other servers learn whom and what its
  // weights must contain (server 0's applied counts) before w hears anything.
  void release_all(const std::vector<worker_id>& released) {
    for (worker_id w : released) {
      const auto wi = static_cast<std::size_t>(w);
      if (state_[wi] != worker_state::active) continue;
      const clock_value gap = controller_.staleness(w);
      stats_.max_start_staleness[wi] = std::max(stats_.max_start_staleness[wi], gap);
      if (options_.keep_log) stats_.start_staleness.push_back(gap);
      if (options_.servers > 1) {
        std::vector<std::int64_t> need(applied_);
        for (std::size_t v = 0; v < need.size(); ++v)
          if (state_[v] == worker_state::evicted) need[v] = -1;
        detail::ps_header h;
        h.kind = static_cast<std::int64_t>(detail::ps_kind::release);
        h.worker = w;
        h.iteration = applied_[wi];
        h.count = static_cast<std::int64_t>(need.size());
        for (int s = 1; s < options_.servers; ++s)
          to_server(s, [&] {
            comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout);
            comm_.send(need.data(), need.size() * sizeof(std::int64_t), s, tags_.data, options_.transfer_timeout);
          });
      }
      reply(w, applied_[wi]);
      // Its silence counts from its release (unless the reply found it gone).
      if (liveness_ && state_[wi] == worker_state::active) liveness_->heard(w, clock::now());
    }
  }

  struct pending_release {
    worker_id worker;
    std::int64_t iteration;
    std::vector<std::int64_t> need;
  };

  void on_release(const detail::ps_header& h) {
    pending_release r{static_cast<worker_id>(h.worker), h.iteration,
                      std::vector<std::int64_t>(static_cast<std::size_t>(workers_))};
    if (h.count != workers_ || h.worker < 0 || h.worker >= workers_)
      throw transport_error(who() + ": malformed release notice from server 0");
    comm_.recv(r.need.data(), r.need.size() * sizeof(std::int64_t), 0, tags_.data, options_.transfer_timeout);
    if (state_[static_cast<std::size_t>(r.worker)] != worker_state::active) return;  // dropped here
    pending_.push_back(std::move(r));
    serve_pending();
  }

  void on_evicted_notice(const detail::ps_header& h) {
    if (h.worker < 0 || h.worker >= workers_)
      throw transport_error(who() + ": malformed eviction notice from server 0");
    drop(static_cast<worker_id>(h.worker), "evicted by server 0");
  }

  // Servers other than 0: answer every release whose required pushes are all applied here.
  void serve_pending() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool ready = true;
      for (std::size_t v = 0; v < it->need.size() && ready; ++v)
        ready = it->need[v] < 0 || state_[v] == worker_state::evicted || applied_[v] >= it->need[v];
      if (!ready) {
        ++it;
        continue;
      }
      const worker_id w = it->worker;
      const std::int64_t k = it->iteration;
      it = pending_.erase(it);
      if (state_[static_cast<std::size_t>(w)] == worker_state::active) reply(w, k);
    }
  }

  // ---- talking to servers and workers ----

  // Server 0 tells server s something; a server that is gone is fail-stop for everyone.
  template <class F>
  void to_server(int s, F&& f) {
    try {
      f();
    } catch (const transport_error& e) {
      throw transport_error(who() + ": server rank " + std::to_string(s) + " is gone: " + e.what());
    }
  }

  // Talks to worker w; when its rank is lost (the communicator survives it), the worker is
  // dropped instead of failing the server. Returns false then.
  template <class F>
  bool with_worker(worker_id w, F&& f) {
    try {
      f();
      return true;
    } catch (const transport_error& e) {
      if (comm_.failed()) throw;  // the server's own communicator is gone: fail-stop
      drop(w, std::string("lost: ") + e.what());
      return false;
    }
  }

  void reply(worker_id w, std::int64_t iteration) {
    with_worker(w, [&] { send_reply(w, iteration); });
  }

  void send_reply(worker_id w, std::int64_t iteration) {
    detail::ps_header h;
    h.kind = static_cast<std::int64_t>(detail::ps_kind::reply);
    h.worker = w;
    h.iteration = iteration;
    h.count = static_cast<std::int64_t>(slice_.count);
    comm_.send(&h, sizeof h, rank_of(w), tags_.reply, options_.transfer_timeout);
    bulk_.send(weights_, slice_.count * sizeof(T), rank_of(w), tags_.reply_data, options_.transfer_timeout);
  }

  void refuse(worker_id w, worker_state s) {
    refuse_text(w, s == worker_state::evicted
                       ? "worker " + std::to_string(w) + " was evicted (silent for longer than evict_after)"
                       : "worker " + std::to_string(w) + " already called finish()");
  }

  void refuse_text(worker_id w, const std::string& text) {
    with_worker(w, [&] { send_refusal(w, text); });
    notify(ps_event::kind::refused, w, text);
  }

  void notify(ps_event::kind what, worker_id w, std::string reason) const {
    if (options_.observer) options_.observer(ps_event{what, w, std::move(reason)});
  }

  void send_refusal(worker_id w, const std::string& text) {
    detail::ps_header h;
    h.kind = static_cast<std::int64_t>(detail::ps_kind::reply);
    h.worker = w;
    h.status = static_cast<std::int64_t>(state_[static_cast<std::size_t>(w)] == worker_state::evicted
                                             ? detail::ps_status::evicted
                                             : detail::ps_status::error);
    h.count = static_cast<std::int64_t>(text.size());
    comm_.send(&h, sizeof h, rank_of(w), tags_.reply, options_.transfer_timeout);
    comm_.send(text.data(), text.size(), rank_of(w), tags_.reply_data, options_.transfer_timeout);
  }

  // ---- eviction ----

  // Server 0: evicts every worker silent past evict_after, releasing whoever waited for it.
  void evict_silent(clock::time_point now) {
    if (!liveness_) return;
    for (worker_id w : liveness_->silent(now)) {
      const auto last = liveness_->last_heard(w);
      const double silent = last ? std::chrono::duration<double>(now - *last).count() : 0.0;
      drop(w, "silent for " + std::to_string(silent) + " s (evict_after)", silent);
    }
  }

  // Removes worker w for good. Server 0 removes it from the controller (releasing whoever
  // waited only for it) and tells the other servers; another server stops waiting for its
  // pushes and leaves the controller to server 0, which evicts it when it falls silent.
  void drop(worker_id w, const std::string& reason, double silent = 0) {
    const auto wi = static_cast<std::size_t>(w);
    if (liveness_) liveness_->forget(w);
    if (state_[wi] != worker_state::active) return;
    state_[wi] = worker_state::evicted;
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](const pending_release& r) { return r.worker == w; }),
                   pending_.end());
    stats_.evictions.push_back({w, applied_[wi], silent, reason});
    if (!coordinator()) {
      serve_pending();
      notify(ps_event::kind::evicted, w, reason);
      return;
    }
    detail::ps_header h;
    h.kind = static_cast<std::int64_t>(detail::ps_kind::evicted);
    h.worker = w;
    h.iteration = applied_[wi];
    for (int s = 1; s < options_.servers; ++s)
      to_server(s, [&] { comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout); });
    auto released = controller_.remove_worker(w);
    release_all(std::vector<worker_id>(released.begin(), released.end()));
    notify(ps_event::kind::evicted, w, reason);
  }

  // ---- state (the map above says who touches what) ----

  Comm& comm_;
  Bulk& bulk_;
  std::size_t size_;
  Controller controller_;
  Update update_;
  ps_options options_;
  detail::ps_tags tags_;
  int workers_ = 0;
  ps_slice slice_;
  std::vector<T> owned_weights_, owned_scratch_;  // the host-buffer constructor's
  T* weights_ = nullptr;
  T* scratch_ = nullptr;
  std::vector<worker_state> state_;
  std::vector<std::int64_t> applied_;  // per worker: pushes applied to this slice
  std::vector<pending_release> pending_;
  std::optional<liveness_tracker<clock::time_point>> liveness_;
  clock::time_point start_{};
  ps_stats stats_;
};

}  // namespace cadence::exchange
