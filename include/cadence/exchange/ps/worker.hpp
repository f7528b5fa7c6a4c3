/// \file
/// \ingroup exchange
/// The parameter server's worker end, ps_worker: push a gradient, get back the weights the
/// policy lets the worker start from; pull, rejoin after an eviction, finish. Include
/// `<cadence/exchange/parameter_server.hpp>`, which includes this.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/types.hpp>
#include <cadence/exchange/ps/detail/protocol.hpp>
#include <cadence/exchange/ps/detail/transfer.hpp>
#include <cadence/exchange/ps/options.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// A worker's end: push a gradient, get back the weights the policy allows it to start from.
/// `Comm` models transport::communicator with any_source and try_recv (the worker takes the
/// servers' replies in arrival order, and sends heartbeats while it waits). With a second
/// communicator `Bulk` (NCCL), headers travel on `Comm` and gradients and weights on `Bulk`,
/// whose buffers may be device memory; the ranks of both must be the same. `T` (float or
/// double) is the element type of the model, the same on every rank.
///
/// Use (one thread per worker):
///
///     ps_worker<C> w(comm, model_size, options);
///     w.pull(weights);                       // the starting point; the worker's id
///     for (...) w.push_pull(gradient, weights);
///     w.finish();
///
/// Failures: a server that refuses a request (this worker was evicted, or the request made no
/// sense) makes the call throw worker_error with the server's reason; a server that is gone or
/// silent past reply_timeout makes it throw transport_error naming the servers it waited for.
/// Servers are fail-stop for workers; a worker's own failure costs the job that worker only.
template <class Comm, class T = float, class Bulk = Comm>
class ps_worker {
  CADENCE_DETAIL_PS_REQUIRE("ps_worker", "a worker waiting for its reply sends heartbeats between waits",
                            Comm, Bulk, T);

public:
  /// A worker on `comm` (headers, gradients and weights) for a model of `model_size` elements,
  /// with the job's `options` (the same on every rank). Throws invalid_parameter_error when the
  /// options are invalid or this rank is a server.
  ps_worker(Comm& comm, std::size_t model_size, ps_options options = {})
      : ps_worker(comm, comm, model_size, options) {}

  /// As above, with headers on `control` and gradients and weights on `bulk` (which may be
  /// `control` itself); `model_size` and `options` as above. Also throws
  /// invalid_parameter_error when the two communicators' ranks differ or `control` cannot serve
  /// as the control communicator (no any_source, or device buffers).
  ps_worker(Comm& control, Bulk& bulk, std::size_t model_size, ps_options options = {})
      : comm_(control), bulk_(bulk), size_(model_size), options_(options), tags_(options.tag_base) {
    detail::check_options("ps_worker", options_, comm_.size());
    detail::check_same_ranks("ps_worker", comm_, bulk_);
    detail::check_role("ps_worker", comm_.rank(), options_.servers, false);
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
    const T* from = outgoing(gradient);
    try {
      for (int s = 0; s < options_.servers; ++s) {
        const ps_slice sl = ps_slice_of(size_, options_.servers, s);
        const detail::ps_header h = header(detail::ps_kind::push, k, static_cast<std::int64_t>(sl.count));
        to_server("push_pull", s, [&] {
          comm_.send(&h, sizeof h, s, tags_.control, options_.transfer_timeout);
          send_gradient(from + sl.offset, sl.count * sizeof(T), s, from == staging_.get());
        });
      }
    } catch (...) {
      park_staging(from);
      throw;
    }
    iteration_ = k;
    collect("push_pull", weights, 0, options_.servers);
  }

  /// Host memory of model_size elements that this worker owns, for the caller to write its
  /// gradient into: push_pull(gradient_buffer(), weights) sends it without any copy. Any other
  /// gradient is copied into it first when the bulk communicator lends its sends (MPI), so
  /// that MPI never reads the caller's buffer after the call (the rule in
  /// docs/parameter_server.md). After a push_pull that failed this returns a new buffer: the
  /// old one may still be read by a send MPI could not withdraw, so it is leaked, never freed.
  /// Throws invalid_parameter_error over a bulk communicator with device buffers.
  T* gradient_buffer() {
    if (bulk_.capabilities().device_buffers)
      throw invalid_parameter_error(who() + ": gradient_buffer() is host memory; the bulk communicator "
                                            "carries device buffers");
    if (!staging_) staging_.reset(new T[std::max<std::size_t>(size_, 1)]());
    return staging_.get();
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
    return detail::make_header(kind, id_, iteration, count, request_);
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

  // ---- the gradient's buffer: lent to a transport that would otherwise copy it ----

  // Where push_pull sends the gradient from. Over a bulk communicator with the lending sends
  // that would otherwise copy it (MPI with bounce_buffers) it is the worker's own staging_,
  // which it can keep for as long as a failed send may read it: the caller's gradient is copied
  // there unless it is already there (one copy instead of the transport's, none at all for a
  // gradient written into gradient_buffer()). Elsewhere the caller's: the transport never reads
  // it after the call (it copies, or cancels), or the caller said it outlives any send
  // (bounce_buffers = false).
  const T* outgoing(const T* gradient) {
    if constexpr (!detail::ps_lends_v<Bulk>) {
      return gradient;
    } else {
      if (size_ == 0 || bulk_.capabilities().device_buffers || !bulk_.bounces_sends()) return gradient;
      T* own = gradient_buffer();
      if (gradient != own) std::copy(gradient, gradient + size_, own);
      return own;
    }
  }

  // The gradient slice to server s: lent when it is the worker's staging (kept past a failure
  // by park_staging), else an ordinary send.
  void send_gradient(const T* p, std::size_t bytes, int s, bool own) {
    if constexpr (detail::ps_lends_v<Bulk>) {
      if (own) {
        bulk_.send(p, bytes, s, tags_.data, transport::lend, options_.transfer_timeout);
        return;
      }
    }
    bulk_.send(p, bytes, s, tags_.data, options_.transfer_timeout);
  }

  // A push that failed may leave a lent send of the staging posted (MPI cannot withdraw a send,
  // and the server may take it late): that buffer is leaked, and the next push gets a new one.
  void park_staging(const T* from) noexcept {
    if (from != nullptr && from == staging_.get()) (void)staging_.release();
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
    // Two plain values, not an optional (g++ 12 warned -Wmaybe-uninitialized on one here).
    const bool beats = options_.evict_after.has_value();
    const std::chrono::nanoseconds beat = beats ? *options_.evict_after / 4 : std::chrono::nanoseconds::zero();
    std::string refusal;
    bool evicted = false;
    while (left > 0) {
      detail::ps_header h;
      std::optional<int> got;
      try {
        auto until = give_up.time_point();
        if (beats) until = std::min(until, transport::deadline::clock::now() + beat);
        got = comm_.try_recv(&h, sizeof h, transport::any_source, tags_.reply, transport::deadline::at(until));
      } catch (const transport_error& e) {
        throw transport_error(who() + ": " + op + " iteration " + std::to_string(iteration_) +
                              ": no reply from server rank(s) " + missing(pending) + ": " + e.what());
      }
      if (!got) {
        if (give_up.passed())
          throw transport_error(who() + ": " + op + " iteration " + std::to_string(iteration_) +
                                ": no reply from server rank(s) " + missing(pending) + " within " +
                                detail::ps_seconds(options_.reply_timeout) + " s (reply_timeout)");
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
        if (h.count < 0 || h.count > detail::ps_max_text)
          throw transport_error(who() + ": server rank " + std::to_string(s) + " sent a refusal with a text of " +
                                std::to_string(h.count) + " bytes (at most " + std::to_string(detail::ps_max_text) +
                                "): a malformed reply");
        text.assign(static_cast<std::size_t>(h.count), '\0');
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
  // The gradient's staging (gradient_buffer()); leaked, not freed, after a failed push, and at
  // destruction when a push has failed (a lent send may still read it: see park_staging).
  std::unique_ptr<T[]> staging_;
};

/// @}
}  // namespace cadence::exchange
