/// \file
/// \ingroup exchange
/// The parameter server's server end, parameter_server: owns a slice of the model, applies
/// pushes on arrival and answers each worker when the policy allows; server 0 also drives the
/// controller and decides membership. Include `<cadence/exchange/parameter_server.hpp>`, which
/// includes this.
///
/// The parts of this file, in order: the public face (construction, run(), what a server
/// reports); the map of its state; messages in (dispatch, admission, pushes, finish); releases
/// (server 0's, and how the other servers follow them); messages out (replies, refusals, notices
/// to the other servers); transfers in flight; liveness and evictions; the state. Beside it in
/// ps/detail/: the wire format (protocol.hpp), the per-worker tables (roster.hpp), the
/// transfers in flight (flights.hpp), the statistics (record.hpp). Over 800 lines: what is left
/// here is the server's one event loop and the state it mutates, which only read together.
#pragma once

#include <cadence/controllers/controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/core/types.hpp>
#include <cadence/exchange/ps/detail/flights.hpp>
#include <cadence/exchange/ps/detail/protocol.hpp>
#include <cadence/exchange/ps/detail/record.hpp>
#include <cadence/exchange/ps/detail/roster.hpp>
#include <cadence/exchange/ps/detail/transfer.hpp>
#include <cadence/exchange/ps/options.hpp>
#include <cadence/runtime/liveness.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

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
///
/// Template arguments: `Comm` models transport::communicator with any_source and try_recv (the
/// server waits for the next message or its next deadline); `Controller` models the controller
/// concept (cadence::any_controller for a policy chosen at run time); `T` is float or double;
/// `Update` is the update rule (see sgd); `Bulk` carries gradients and weights when they travel
/// apart from the headers (NCCL).
///
/// Use (one thread per server rank): build it, call run(), read stats() when it returns.
template <class Comm, class Controller, class T = float, class Update = sgd<T>, class Bulk = Comm>
class parameter_server {
  CADENCE_DETAIL_PS_REQUIRE("parameter_server",
                            "the server waits for the next message or the next liveness deadline", Comm,
                            Bulk, T);

public:
  /// The clock server 0 stamps pushes with (the controller's times are seconds since run()).
  using clock = std::chrono::steady_clock;

  /// A server on `comm` (headers, gradients and weights, in host memory). `initial` is the whole
  /// model (model_size elements) on every server; each keeps its slice. On server 0,
  /// `controller` must have been built for the initial workers (every worker rank, or
  /// ps_options::initial_workers); `update` applies each push; `options` are the job's, the same
  /// on every rank. Throws invalid_parameter_error when the options are invalid, this rank is a
  /// worker, the controller's worker count does not match, or `initial` is null.
  parameter_server(Comm& comm, std::size_t model_size, const T* initial, Controller controller,
                   Update update = Update{}, ps_options options = {})
      : comm_(comm), bulk_(comm), size_(model_size), controller_(std::move(controller)),
        update_(std::move(update)), options_(options), tags_(options.tag_base),
        flights_(comm, comm, tags_, options.transfer_timeout), record_(options.keep_log) {
    setup();
    detail::check_same_ranks("parameter_server", comm_, comm_);
    if (initial == nullptr && model_size != 0)
      throw invalid_parameter_error("cadence::exchange::parameter_server: null initial weights");
    weights_.emplace(initial + slice_.offset, slice_.count);
    flights_.start(static_cast<std::size_t>(comm_.size()), *weights_, nullptr, slice_.count);
  }

  /// Headers on `control`, gradients and weights on `bulk` (NCCL: device memory); `controller`,
  /// `update` and `options` as above. The buffers
  /// are the caller's: `weights` holds this server's slice (ps_slice_of(model_size, servers,
  /// rank).count elements, the initial values in it) and `scratch` as many elements, where each
  /// incoming gradient lands before `update(weights, scratch, count, worker)` applies it; both
  /// must outlive the server. Over device buffers the update rule runs on the device (yours),
  /// and there is one version of the slice: an update waits until the replies reading it have
  /// left (at most transfer_timeout; a worker whose reply did not leave by then is dropped).
  parameter_server(Comm& control, Bulk& bulk, std::size_t model_size, T* weights, T* scratch,
                   Controller controller, Update update = Update{}, ps_options options = {})
      : comm_(control), bulk_(bulk), size_(model_size), controller_(std::move(controller)),
        update_(std::move(update)), options_(options), tags_(options.tag_base),
        flights_(control, bulk, tags_, options.transfer_timeout), record_(options.keep_log) {
    setup();
    detail::check_same_ranks("parameter_server", comm_, bulk_);
    if ((weights == nullptr || scratch == nullptr) && slice_.count != 0)
      throw invalid_parameter_error("cadence::exchange::parameter_server: null weights or scratch "
                                    "buffer for a slice of " + std::to_string(slice_.count) + " elements");
    weights_.emplace(weights, slice_.count);
    flights_.start(static_cast<std::size_t>(comm_.size()), *weights_, scratch, slice_.count);
  }

  /// Not copyable: a server owns the transfers it has in flight.
  parameter_server(const parameter_server&) = delete;
  /// Not copyable.
  parameter_server& operator=(const parameter_server&) = delete;

  /// Server 0, before run(): initial member `w` will not take part. The job found its process
  /// absent or gone as the policy started (it never came, or it died while starting), so the
  /// server drops it now as an eviction with `reason` (stats().evictions, the observer; the
  /// other servers are told) and the policy starts without it: a BSP barrier does not wait for
  /// it, nobody waits evict_after for its silence. A process that comes later on its rank
  /// joins under a new id at its first pull, as a replacement does. Throws
  /// invalid_parameter_error on a server other than 0, once run() has started, or when `w` is
  /// not an active member.
  void drop_absent(worker_id w, const std::string& reason) {
    if (!coordinator() || running_)
      throw invalid_parameter_error(who() + ": drop_absent(" + std::to_string(w) + "): only server 0 drops an absent "
                                    "worker, and only before run()");
    if (!roster_.active(static_cast<std::int64_t>(w)))
      throw invalid_parameter_error(who() + ": drop_absent(" + std::to_string(w) + "): not an active member");
    drop(w, "absent at the start: " + reason);
  }

  /// Serves until every member finished or was evicted. Throws transport_error when the
  /// communicator fails (or, on a server other than 0, after server_idle_timeout of silence).
  void run() {
    start_ = clock::now();
    last_heard_ = start_;
    if (coordinator() && options_.evict_after) {
      liveness_.emplace(*options_.evict_after);
      for (std::size_t w = 0; w < roster_.state.size(); ++w)
        if (roster_.active(static_cast<std::int64_t>(w))) liveness_->heard(static_cast<worker_id>(w), start_);
    }
    running_ = true;
    for (;;) {
      const std::size_t before = flights_.count();
      progress_transfers();
      settle_lost();
      if (flights_.count() != before) last_activity_ = clock::now();
      // Every server hears every member's finish() (or server 0's eviction notice). Server 0
      // ends once nobody is left and its replies are delivered, telling the other servers;
      // they end when both hold (server 0 may still have notices for them until then).
      if (roster_.done() && flights_.count() == 0 && (coordinator() || shutdown_)) {
        if (coordinator()) shutdown_servers();
        return;
      }
      detail::ps_header h;
      std::optional<int> src;
      try {
        src = comm_.try_recv(&h, sizeof h, transport::any_source, tags_.control,
                             transport::deadline::at(next_wake()));
      } catch (const peer_error& e) {
        // One rank sent a message of another size than a header: its fault alone (the
        // communicator stays usable, and the message was taken, so its stream is in step).
        if (comm_.failed()) throw;
        bad_rank(e.peer(), e);
        continue;
      } catch (const transport_error& e) {
        // Every rank that could still send is lost (the communicator survives lost peers, so
        // it is still usable): whoever has not finished never will.
        if (comm_.failed()) throw;
        for (std::size_t w = 0; w < roster_.state.size(); ++w)
          drop(static_cast<worker_id>(w), std::string("lost: ") + e.what());
        if (flights_.count() == 0) return;
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
        throw transport_error(who() + ": heard nothing for " + detail::ps_seconds(options_.server_idle_timeout) +
                              " s (server_idle_timeout); is server rank 0 gone?");
      }
    }
  }

  /// This server's slice of the weights (the current version; device memory over NCCL).
  span<const T> weights() const noexcept { return span<const T>(weights_->current(), slice_.count); }
  /// Where this server's slice sits in the model.
  ps_slice slice() const noexcept { return slice_; }
  /// What this server measured (complete once run() returned).
  const ps_stats& stats() const noexcept { return record_.stats(); }
  /// The controller (server 0 drives it; the other servers leave it as built).
  const Controller& controller() const noexcept { return controller_; }
  /// Whether this is server 0, which drives the controller and decides membership.
  bool coordinator() const noexcept { return comm_.rank() == 0; }
  /// Buffers holding versions of the slice (1 over the caller's storage): how much the server
  /// copied on write because replies were still in flight.
  std::size_t weight_buffers() const noexcept { return weights_->buffers(); }

private:
  // Map of this class. Everything runs on the thread that calls run().
  //  - Membership (roster_, detail/roster.hpp): per rank the worker id it holds and whether
  //    that id's process has pulled; per worker id its state, the pushes applied to this
  //    slice, its rank, and its last request seen and answered (a request is answered once).
  //    What the server measures per worker (ps_stats) is in record_ (detail/record.hpp): apply()
  //    and release_all() tell it about pushes, parks and releases. Server 0 alone issues ids
  //    (controller_.add_worker()) and tells the other servers (joined notices); they park
  //    messages from ids they do not know yet in deferred_ until the notice comes.
  //  - In flight (flights_, detail/flights.hpp): per rank the replies and refusals posted to
  //    it, each with the version of the weights it pins and its deadline, and the gradient
  //    payload being received from it. progress_transfers() finishes both and drops a worker
  //    whose transfer failed or missed its deadline; one whose rank is lost goes to lost_
  //    first, and settle_lost() drops it once that rank's queued messages are read (settle()).
  //  - The slice: weights_ (copy-on-write versions); pending_ (servers other than 0): releases
  //    waiting until the pushes they need are applied.
  //  - Server 0's liveness_: heard on every message from a member (heartbeats included).

  using worker_state = detail::ps_worker_state;
  using flights = detail::ps_flights<Comm, Bulk, T>;
  using outbound = typename flights::outbound;
  using inbound = typename flights::inbound;

  std::string who() const { return "cadence::exchange::parameter_server (server rank " + std::to_string(comm_.rank()) + ")"; }

  void setup() {
    detail::check_options("parameter_server", options_, comm_.size());
    detail::check_role("parameter_server", comm_.rank(), options_.servers, true);
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
    roster_.reset(n);
    deferred_.resize(n);
    for (int w = 0; w < initial; ++w) add_member(static_cast<worker_id>(w), options_.servers + w);
  }

  // The roster's add, and the per-worker statistics beside it.
  void add_member(worker_id w, int rank) {
    roster_.add(w, rank);
    record_.grow(roster_.ids());
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
    if (flights_.count() != 0)
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
    if (!detail::worker_kind(h.kind)) {
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
    if (h.worker < 0 || roster_.member[r] != h.worker) {
      if (!coordinator() && h.worker >= 0 && !roster_.known(static_cast<worker_id>(h.worker))) {
        deferred_[r].push_back(h);  // server 0's joined notice is still on its way
        receive_payload_into_junk(src, h);
        return;
      }
      receive_payload_into_junk(src, h);
      if (kind == detail::ps_kind::heartbeat || kind == detail::ps_kind::finish) return;  // nothing to answer
      const bool was_ours = h.worker >= 0 && roster_.known(static_cast<worker_id>(h.worker)) &&
                            roster_.rank_of[static_cast<std::size_t>(h.worker)] == src;
      if (was_ours) {
        refuse(static_cast<worker_id>(h.worker), h.request, state_text(static_cast<worker_id>(h.worker)));
      } else {
        refuse_rank(src, h, "rank " + std::to_string(src) + " claims worker id " + std::to_string(h.worker) +
                                " but holds " + (roster_.member[r] < 0 ? std::string("none") : std::to_string(roster_.member[r])));
      }
      return;
    }
    const auto w = static_cast<worker_id>(h.worker);
    const auto wi = static_cast<std::size_t>(w);
    const bool request = kind == detail::ps_kind::pull || kind == detail::ps_kind::push;
    if (request && roster_.state[wi] == worker_state::active && roster_.request[wi] > roster_.answered[wi] && h.request != roster_.request[wi]) {
      // A new request while the last is unanswered: no worker of ours does that, so its state
      // cannot be trusted. It is dropped (the refusal says why); everyone else goes on.
      receive_payload_into_junk(src, h);
      roster_.request[wi] = h.request;
      drop(w, "broke the protocol: request " + std::to_string(h.request) + " came before request " +
                  std::to_string(roster_.answered[wi] + 1) + " was answered");
      return;
    }
    if (request) roster_.request[wi] = std::max(roster_.request[wi], h.request);
    if (roster_.state[wi] != worker_state::active) {
      receive_payload_into_junk(src, h);
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
        roster_.claimed[r] = 1;
        reply(w, h.request, roster_.applied[wi]);
        return;
      case detail::ps_kind::push: on_push(src, w, h); return;
      case detail::ps_kind::finish: on_finish(w); return;
      default: return;
    }
  }

  std::string state_text(worker_id w) const {
    return roster_.state[static_cast<std::size_t>(w)] == worker_state::evicted
               ? "worker " + std::to_string(w) + " was evicted (" + record_.eviction_reason(w) + ")"
               : "worker " + std::to_string(w) + " already called finish()";
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
    std::int64_t w = roster_.member[r];
    if (w >= 0 && roster_.state[static_cast<std::size_t>(w)] == worker_state::active && !roster_.claimed[r]) {
      roster_.claimed[r] = 1;
      heard(static_cast<worker_id>(w));
      reply(static_cast<worker_id>(w), h.request, roster_.applied[static_cast<std::size_t>(w)]);
      return;
    }
    const bool returning = w >= 0;
    if (w >= 0 && roster_.state[static_cast<std::size_t>(w)] == worker_state::active)
      drop(static_cast<worker_id>(w), "replaced: a new process pulled on rank " + std::to_string(src));
    worker_id fresh = 0;
    try {
      fresh = controller_.add_worker();
    } catch (const error& e) {
      refuse_rank(src, h, std::string("cannot join: ") + e.what());
      return;
    }
    add_member(fresh, src);
    roster_.claimed[r] = 1;
    record_.joined(fresh, src, returning);
    roster_.request[static_cast<std::size_t>(fresh)] = h.request;
    // The other servers learn the id before the worker can name it to them (it pulls from
    // them only after this reply).
    const auto n = detail::make_header(detail::ps_kind::joined, fresh, 0, src);
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
    const std::int64_t old = roster_.member[static_cast<std::size_t>(rank)];
    if (old >= 0 && roster_.state[static_cast<std::size_t>(old)] == worker_state::active)
      drop(static_cast<worker_id>(old), "replaced: a new process pulled on rank " + std::to_string(rank));
    add_member(w, rank);
    roster_.claimed[static_cast<std::size_t>(rank)] = 1;
    record_.joined(w, rank, old >= 0);
    auto parked = std::move(deferred_[static_cast<std::size_t>(rank)]);
    deferred_[static_cast<std::size_t>(rank)].clear();
    for (const auto& h : parked) handle_worker(rank, h);
  }

  void on_push(int src, worker_id w, const detail::ps_header& h) {
    if (h.count < 0 || static_cast<std::size_t>(h.count) != slice_.count) {
      receive_payload_into_junk(src, h);
      refuse(w, h.request, "worker " + std::to_string(w) + " pushed a gradient slice of " + std::to_string(h.count) +
                               " elements, but server rank " + std::to_string(comm_.rank()) + " owns " +
                               std::to_string(slice_.count) + " (do all ranks use one model size?)");
      return;
    }
    if (const auto& busy = flights_.in(src)) {  // a second push before the first was answered
      receive_payload_into_junk(src, h);
      refuse(w, h.request, "worker " + std::to_string(w) + " pushed again before its push " +
                               std::to_string(busy->header.iteration) + " was answered");
      return;
    }
    if (weights_->external()) settle_external_payload();
    try {
      flights_.receive(src, h);
    } catch (const transport_error& e) {
      if (comm_.failed() || bulk_.failed()) throw;
      fault(w, e);
      return;
    }
    // The payload usually follows its header at once: finish it here when it has.
    finish_payload(src);
  }

  // A payload is in flight whatever we think of its header: take it so the stream stays in
  // step (bounded: a count beyond any slice drops the worker instead).
  void receive_payload_into_junk(int src, const detail::ps_header& h) {
    if (static_cast<detail::ps_kind>(h.kind) != detail::ps_kind::push || h.count <= 0) return;
    const auto w = roster_.member[static_cast<std::size_t>(src)];
    bool taken = false;
    try {
      taken = flights_.discard(src, static_cast<std::size_t>(h.count), std::max<std::size_t>(slice_.count, 1) * 4);
    } catch (const transport_error& e) {
      if (comm_.failed() || bulk_.failed()) throw;
      if (w >= 0) fault(static_cast<worker_id>(w), e);
      return;
    }
    if (!taken && w >= 0)
      drop(static_cast<worker_id>(w), "its push announced " + std::to_string(h.count) +
                                          " elements, which this server cannot take");
  }

  // Applies rank src's payload once it is in.
  void finish_payload(int src) {
    const std::int64_t held = roster_.member[static_cast<std::size_t>(src)];
    const auto in = flights_.landed(src, [&](const transport_error* err) {
      if (held < 0) return;
      if (err != nullptr)
        fault(static_cast<worker_id>(held), *err);
      else
        drop(static_cast<worker_id>(held), "lost: its gradient did not arrive within transfer_timeout");
    });
    if (!in) return;
    const detail::ps_header& h = in->header;
    if (held == h.worker && roster_.active(h.worker))  // else dropped while its payload was on the way
      apply(static_cast<worker_id>(h.worker), h, in->buffer);
    flights_.release_scratch(*in);
  }

  void apply(worker_id w, const detail::ps_header& h, const T* gradient) {
    const auto wi = static_cast<std::size_t>(w);
    if (h.iteration != roster_.applied[wi] + 1) {
      refuse(w, h.request, "worker " + std::to_string(w) + " pushed iteration " + std::to_string(h.iteration) +
                               " after " + std::to_string(roster_.applied[wi]) +
                               (h.iteration <= roster_.applied[wi] ? " (a retried push?)" : " (a push went missing?)"));
      return;
    }
    if (weights_->external()) drain_pins();  // one version only: replies reading it leave first
    // A reply that completed since the last look unpins the current version here, so the update
    // writes in place instead of copying the slice into a fresh version (a ping-pong's push
    // usually arrives in the same receive that saw its previous reply complete).
    if (weights_->current_pinned()) progress_outbound();
    weights_->apply(update_, gradient, w);
    roster_.applied[wi] = h.iteration;
    record_.applied(w, h.iteration);
    if (coordinator()) {
      const auto now = clock::now();
      const decision d = controller_.push(w, std::chrono::duration<double>(now - start_).count());
      std::vector<worker_id> released(d.released.begin(), d.released.end());
      if (d.proceed) {
        released.insert(released.begin(), w);
      } else {
        record_.parked(w, now);
      }
      release_all(released);
    } else {
      serve_pending();
    }
  }

  void on_finish(worker_id w) {
    const auto wi = static_cast<std::size_t>(w);
    roster_.state[wi] = worker_state::finished;
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
      if (roster_.state[wi] != worker_state::active) continue;
      record_.released(w, controller_.staleness(w), now);
      if (options_.servers > 1) {
        const std::vector<std::int64_t> need = roster_.needs();
        const auto h = detail::make_header(detail::ps_kind::release, w, roster_.applied[wi],
                                           static_cast<std::int64_t>(need.size()), roster_.request[wi]);
        for (int s = 1; s < options_.servers; ++s) to_server(s, h, &need);
      }
      reply(w, roster_.request[wi], roster_.applied[wi]);
      heard(w);  // its silence counts from its release
    }
  }

  void on_release(const detail::ps_header& h) {
    if (h.count < 0 || h.worker < 0 || static_cast<std::size_t>(h.count) > max_workers)
      throw transport_error(who() + ": malformed release notice from server 0");
    detail::ps_release r{static_cast<worker_id>(h.worker), h.iteration, h.request,
                      std::vector<std::int64_t>(static_cast<std::size_t>(h.count))};
    comm_.recv(r.need.data(), r.need.size() * sizeof(std::int64_t), 0, tags_.data, options_.transfer_timeout);
    if (!roster_.known(r.worker) || roster_.state[static_cast<std::size_t>(r.worker)] != worker_state::active) return;  // dropped here
    pending_.push_back(std::move(r));
    serve_pending();
  }

  void on_evicted_notice(const detail::ps_header& h) {
    if (h.worker < 0 || !roster_.known(static_cast<worker_id>(h.worker)))
      throw transport_error(who() + ": malformed eviction notice from server 0");
    drop(static_cast<worker_id>(h.worker), "evicted by server 0");
  }

  // Servers other than 0: answer every release whose required pushes are all applied here.
  // Answering one can drop its worker (replies piled up: post()), and a drop edits pending_ and
  // serves it again: so one release is taken out at a time, the list is searched afresh after
  // each answer, and a call made while one is running only asks it to go round once more.
  void serve_pending() {
    if (serving_) {
      serve_again_ = true;
      return;
    }
    serving_ = true;
    struct done_serving {
      bool& flag;
      ~done_serving() { flag = false; }
    } guard{serving_};
    do {
      serve_again_ = false;
      for (;;) {
        const auto it = std::find_if(pending_.begin(), pending_.end(),
                                     [&](const detail::ps_release& r) { return roster_.holds(r.need); });
        if (it == pending_.end()) break;
        const worker_id w = it->worker;
        const std::int64_t k = it->iteration, req = it->request;
        pending_.erase(it);
        if (roster_.state[static_cast<std::size_t>(w)] == worker_state::active) reply(w, req, k);
      }
    } while (serve_again_);
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
    const auto h = detail::make_header(detail::ps_kind::shutdown, 0);
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
    if (roster_.answered[wi] >= request && request > 0) return;  // one answer per request
    roster_.answered[wi] = request;
    outbound o;
    o.header = detail::make_header(detail::ps_kind::reply, w, iteration, static_cast<std::int64_t>(slice_.count), request);
    o.pin = weights_->pin();
    post(roster_.rank_of[wi], w, std::move(o), weights_->current(), slice_.count * sizeof(T));
  }

  // A refusal of worker w's request (reason in the text); counted and reported.
  void refuse(worker_id w, std::int64_t request, const std::string& text) {
    const auto wi = static_cast<std::size_t>(w);
    record_.refused();
    notify(ps_event::kind::refused, w, text);
    if (roster_.answered[wi] >= request && request > 0) return;  // its answer was given (an eviction notice)
    roster_.answered[wi] = std::max(roster_.answered[wi], request);
    post_refusal(roster_.rank_of[wi], w, request,
                 roster_.state[wi] == worker_state::evicted ? detail::ps_status::evicted : detail::ps_status::error, text);
  }

  // A refusal to a rank that holds no id we can name (a bad first message, an id it does not
  // hold): answered on its own, nothing recorded against a worker.
  void refuse_rank(int src, const detail::ps_header& h, const std::string& text) {
    record_.refused();
    const auto w = roster_.member[static_cast<std::size_t>(src)];
    if (w >= 0) notify(ps_event::kind::refused, static_cast<worker_id>(w), text);
    post_refusal(src, w, h.request, detail::ps_status::error, text);
  }

  void post_refusal(int rank, std::int64_t w, std::int64_t request, detail::ps_status status, const std::string& text) {
    outbound o;
    o.header = detail::make_header(detail::ps_kind::reply, w, 0, static_cast<std::int64_t>(text.size()), request, status);
    o.text = text;
    post(rank, w, std::move(o), nullptr, 0);
  }

  // Posts a reply (payload: the pinned weights) or a refusal (payload: its text) to `rank`,
  // worker w's (-1: a rank that holds no id); a worker that lets max_outstanding pile up is
  // dropped instead.
  void post(int rank, std::int64_t w, outbound o, const T* payload, std::size_t bytes) {
    const std::size_t queued = flights_.out(rank).size();
    if (static_cast<int>(queued) >= options_.max_outstanding) {
      weights_->unpin(o.pin);
      if (roster_.active(w))
        drop(static_cast<worker_id>(w), "lost: " + std::to_string(queued) +
                                           " replies in flight that it does not take (max_outstanding)");
      return;
    }
    try {
      flights_.post(rank, w, std::move(o), payload, bytes);
    } catch (const transport_error& err) {
      if (comm_.failed() || bulk_.failed()) throw;
      settle(rank, err);
    }
  }

  // ---- transfers in flight ----

  void progress_transfers() {
    progress_outbound();
    for (std::size_t r = 0; r < flights_.ranks(); ++r)
      if (flights_.in(static_cast<int>(r))) finish_payload(static_cast<int>(r));
  }

  // The replies and refusals in flight: completed ones unpin their version of the weights; a
  // failed or late one costs its worker.
  void progress_outbound() {
    flights_.progress_outbound([this](int rank, const transport_error* err) {
      if (err != nullptr)
        settle(rank, *err);
      else
        expire(rank);
    });
  }

  // A transfer to `rank` failed: withdraw what is queued for it. A peer_error (its receive
  // refused our message: another size) is that worker's fault, and it is dropped now. A lost
  // peer may have called finish() before it left, and that message may wait here, unread,
  // behind the transfer that found it gone (a reply whose completion the server had not seen
  // yet: the end-of-policy race). So a lost worker is only noted here, and settle_lost() drops
  // it once everything its rank sent has been taken, unless it finished.
  void settle(int rank, const transport_error& err) {
    const std::int64_t w = flights_.abandon(rank);
    if (!roster_.active(w)) return;
    if (dynamic_cast<const peer_error*>(&err) != nullptr) {
      fault(static_cast<worker_id>(w), err);
      return;
    }
    lost_.push_back({rank, w, err.what()});
  }

  // The workers settle() found lost: each rank's control messages still queued here are taken
  // first (its finish() among them), then the worker is dropped if it still is a member. Called
  // from run()'s loop, never from inside a transfer's progress (dispatching from there would
  // edit the queues being walked).
  void settle_lost() {
    while (!lost_.empty()) {
      const lost_rank l = std::move(lost_.front());
      lost_.erase(lost_.begin());
      drain_rank(l.rank);
      if (roster_.active(l.worker) && roster_.member[static_cast<std::size_t>(l.rank)] == l.worker)
        drop(static_cast<worker_id>(l.worker), "lost: " + l.what);
    }
  }

  // Dispatches every control message from `rank` already here, in order (a passed deadline
  // polls once). A rank that is lost with nothing queued throws: nothing more will come.
  void drain_rank(int rank) {
    for (;;) {
      detail::ps_header h;
      std::optional<int> src;
      try {
        src = comm_.try_recv(&h, sizeof h, rank, tags_.control, transport::deadline::at(clock::now()));
      } catch (const peer_error& e) {
        if (comm_.failed()) throw;
        bad_rank(e.peer(), e);
        continue;
      } catch (const transport_error&) {
        if (comm_.failed()) throw;
        return;
      }
      if (!src) return;
      last_heard_ = clock::now();
      dispatch(*src, h);
    }
  }

  // Rank `rank` sent a message that a receive could not take (peer_error: another size): a
  // server rank is fail-stop; a worker rank's member is dropped, and nobody else.
  void bad_rank(int rank, const transport_error& e) {
    if (rank < options_.servers)
      throw transport_error(who() + ": server rank " + std::to_string(rank) + " sent a malformed message: " + e.what());
    const std::int64_t w = rank < static_cast<int>(roster_.member.size()) && rank >= 0
                               ? roster_.member[static_cast<std::size_t>(rank)]
                               : -1;
    if (roster_.active(w))
      fault(static_cast<worker_id>(w), e);
    else
      record_.refused();  // nobody to drop: a message from a rank with no member, counted
  }

  // The oldest transfer to `rank` missed its deadline: the worker is not taking its replies.
  void expire(int rank) {
    const std::int64_t w = flights_.abandon(rank);
    if (roster_.active(w))
      drop(static_cast<worker_id>(w), "lost: its reply was not taken within transfer_timeout");
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
    for (int r = 0; r < static_cast<int>(flights_.ranks()); ++r)
      while (flights_.in(r)) {
        finish_payload(r);
        if (flights_.in(r)) std::this_thread::yield();
      }
  }

  // ---- liveness, evictions ----

  void heard(worker_id w) {
    if (liveness_ && roster_.state[static_cast<std::size_t>(w)] == worker_state::active) liveness_->heard(w, clock::now());
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
      for (std::size_t r = static_cast<std::size_t>(options_.servers); r < roster_.member.size(); ++r) {
        const std::int64_t w = roster_.member[r];
        if (!roster_.active(w)) continue;
        // Two looks, each after a receive that found nothing queued: a rank seen lost between
        // the first receive and the look may have sent its finish() just before leaving, and
        // that message is queued by the second look, which then finds the worker finished.
        if (roster_.lost_twice(r, comm_.peer_lost(static_cast<int>(r))))
          drop(static_cast<worker_id>(w), "lost: the transport reports rank " + std::to_string(r) +
                                              " gone (its connection closed or its heartbeats stopped)");
      }
    } else {
      (void)now;
    }
  }

  void lost(worker_id w, const transport_error& e) { drop(w, std::string("lost: ") + e.what()); }

  // A transfer with worker w failed: its own fault when it sent or refused a message of another
  // size (peer_error: it broke the protocol, and it is told so), else its rank is lost.
  void fault(worker_id w, const transport_error& e) {
    if (dynamic_cast<const peer_error*>(&e) != nullptr) {
      record_.refused();  // its message, counted as refused
      drop(w, std::string("broke the protocol: ") + e.what());
    } else {
      lost(w, e);
    }
  }

  // Removes worker w for good. Server 0 removes it from the controller (releasing whoever
  // waited only for it) and tells the other servers; a request of w's still unanswered gets an
  // "evicted" refusal, so a worker dropped mid-request learns why instead of timing out.
  void drop(worker_id w, const std::string& reason, double silent = 0) {
    const auto wi = static_cast<std::size_t>(w);
    if (!roster_.active(static_cast<std::int64_t>(w))) return;
    if (liveness_) liveness_->forget(w);
    roster_.state[wi] = worker_state::evicted;
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](const detail::ps_release& r) { return r.worker == w; }),
                   pending_.end());
    const int rank = roster_.rank_of[wi];
    record_.evicted(w, roster_.applied[wi], silent, reason, rank);
    const bool reachable = reason.rfind("lost", 0) != 0;
    if (reachable && roster_.request[wi] > roster_.answered[wi]) {
      roster_.answered[wi] = roster_.request[wi];
      post_refusal(rank, w, roster_.request[wi], detail::ps_status::evicted,
                   "worker " + std::to_string(w) + " was evicted (" + reason + ")");
    }
    if (coordinator()) {
      const auto h = detail::make_header(detail::ps_kind::evicted, w, roster_.applied[wi]);
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
  flights flights_;             // per rank: replies, refusals and a payload in flight
  detail::ps_roster roster_;    // who holds which worker id, and each id's tables
  // How often server 0 asks the communicator for lost peers while idle (has_peer_lost_v).
  static constexpr std::chrono::milliseconds lost_poll{10};
  clock::time_point next_lost_check_{};
  clock::time_point last_activity_{};  // a message in, or a transfer finished (next_wake)
  std::vector<std::vector<detail::ps_header>> deferred_;  // per rank (servers other than 0)
  std::vector<detail::ps_release> pending_;
  bool serving_ = false, serve_again_ = false;  // serve_pending() is running / must go round again
  // Workers whose transfers found their rank lost, dropped by settle_lost() once that rank's
  // queued messages are taken.
  struct lost_rank {
    int rank;
    std::int64_t worker;
    std::string what;
  };
  std::vector<lost_rank> lost_;
  bool running_ = false;  // run() has started (drop_absent() comes before)
  std::optional<liveness_tracker<clock::time_point>> liveness_;
  clock::time_point start_{}, last_heard_{};
  bool shutdown_ = false;  // servers other than 0: server 0 said it is done
  detail::ps_record record_;
};

/// @}
}  // namespace cadence::exchange
