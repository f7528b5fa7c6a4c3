/// \file
/// \ingroup membership
/// A data communicator re-created on every quorum (quorum_group): the membership runs over a
/// communicator that isolates a lost peer (in-process, ZeroMQ), and the bulk collectives of each
/// sync run over one that does not (gloo; NCCL later), made afresh among the quorum's members.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/membership/buffer.hpp>
#include <cadence/membership/errors.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/membership/quorum.hpp>
#include <cadence/membership/report.hpp>
#include <cadence/transport/communicator.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// What a quorum_group's factory builds a data communicator from: every member of the quorum
/// gets the same prefix, size and ranks, and its own rank.
struct group_spec {
  /// The quorum the communicator serves.
  std::uint64_t quorum_id = 0;
  /// The members' communicator ranks (the membership's), ascending: the data communicator's
  /// rank i is ranks[i].
  std::vector<int> ranks;
  /// This member's rank in the data communicator (its view rank).
  int rank = 0;
  /// Members of the quorum.
  int size = 0;
  /// A store prefix no earlier data communicator of the job used: base prefix, quorum id and the
  /// leader's nonce (a process's random name), so a quorum id that a restarted job reuses still
  /// gets fresh keys.
  std::string prefix;
  /// When the construction must give up: the membership's op timeout from the call (the
  /// members reach it within the skew of a sync point).
  transport::deadline until;
};

/// Where a quorum_group's data calls take their buffers: host memory (gloo) or the device's
/// (NCCL), fixed at construction so capabilities() says it before the first communicator is built.
enum class buffer_memory {
  host,   ///< host memory (gloo's communicators)
  device  ///< the GPU's memory (NCCL's communicators)
};

/// Counts of a quorum_group since its construction.
struct quorum_group_stats {
  /// Data communicators built (one per quorum that ran a data call).
  std::uint64_t builds = 0;
  /// Builds that failed (a rank that never arrived, a fault during the build).
  std::uint64_t build_failures = 0;
  /// Data calls (or builds) that failed and failed the sync with them.
  std::uint64_t data_failures = 0;
  /// The last successful build, in seconds (the re-creation time).
  double last_build_seconds = 0;
  /// The longest successful build, in seconds.
  double max_build_seconds = 0;
  /// The last failure's message (a build's names the ranks that never arrived), or empty.
  std::string last_error;
};

template <class C, class D>
class quorum_group;

/// A started operation of a quorum_group: D's work handle, whose failure fails the sync (as
/// quorum_work's does). A handle kept past the data communicator it ran on (the quorum re-formed)
/// throws sync_failed.
template <class C, class D>
class quorum_group_work {
  using inner = typename D::work_type;

public:
  /// A complete handle.
  quorum_group_work() = default;
  /// Moves the operation.
  quorum_group_work(quorum_group_work&& o) noexcept
      : group_(std::exchange(o.group_, nullptr)), w_(std::move(o.w_)), generation_(o.generation_),
        started_(o.started_) {}
  /// Moves the operation; an incomplete one held before is cancelled.
  quorum_group_work& operator=(quorum_group_work&& o) noexcept {
    if (this != &o) {
      cancel();
      group_ = std::exchange(o.group_, nullptr);
      w_ = std::move(o.w_);
      generation_ = o.generation_;
      started_ = o.started_;
    }
    return *this;
  }
  quorum_group_work(const quorum_group_work&) = delete;
  quorum_group_work& operator=(const quorum_group_work&) = delete;
  ~quorum_group_work() { cancel(); }

  /// Progresses without blocking; true once complete. Throws sync_failed on a fault.
  bool test() {
    if (group_ == nullptr) return true;
    group_->check_generation(generation_);
    return group_->guarded("a started operation", [&] { return w_.test(); });
  }
  /// Returns once complete; throws sync_failed when `d` or the op timeout (from the start)
  /// passed, or on a fault.
  void wait(transport::deadline d = {}) {
    if (group_ == nullptr) return;
    group_->check_generation(generation_);
    const transport::deadline until = group_->bounded(d, started_);
    group_->guarded("a started operation", [&] { w_.wait(until); });
  }
  /// The sender of a completed irecv; the peer otherwise.
  int source() const noexcept { return w_.source(); }
  /// D's cancel(): withdraws a receive where it can.
  bool cancel() noexcept { return group_ == nullptr || w_.cancel(); }

private:
  friend class quorum_group<C, D>;
  quorum_group_work(quorum_group<C, D>* g, inner&& w, std::uint64_t generation)
      : group_(g), w_(std::move(w)), generation_(generation), started_(transport::deadline::clock::now()) {}

  quorum_group<C, D>* group_ = nullptr;
  inner w_{};
  std::uint64_t generation_ = 0;
  transport::deadline::clock::time_point started_{};
};

/// Models transport::communicator over a data communicator D made among the members of the
/// current quorum, and re-made whenever the quorum changes: the way gloo (and, later, NCCL,
/// whose communicator is aborted and re-initialised the same way) survives a lost member, since
/// a gloo context that lost a peer cannot be used again. The exchange adapters run on it
/// unchanged, inside quorum_group::transact():
///
///     zmq_communicator control(rank, size, zmq_opts);        // the membership's: heartbeats, quorum
///     membership::member<zmq_communicator> m(control, opts);
///     m.add_state(params);
///     gloo_options g;  g.rendezvous = "10.0.0.1:29500";       // a store that outlives any rank
///     g.serve_rendezvous = false;
///     auto data = membership::make_gloo_group(m, g);          // membership/gloo/group.hpp
///     m.start();
///     exchange::periodic_averager<decltype(data)::element_type> avg(*data, 8);
///     for (;;) {
///       local_step(params);
///       if (avg.step_done()) data->transact([&] { avg.sync(params); }, {params});
///     }
///
/// **Building.** The first data call of a sync on a quorum the group has no communicator for
/// builds one through the factory: every member of the quorum calls it with the same
/// group_spec (a fresh store prefix, the members in view order), so they meet at the job's
/// rendezvous. The old communicator is destroyed first. A build that fails (a member that never
/// arrives, within the op timeout) fails the sync, with the factory's error (which names the
/// missing ranks) in the sync's message and in stats().last_error.
///
/// **Faults.** Every data call waits at most the op timeout (membership timeouts, the tier that
/// bounds one collective) besides its own deadline. When it fails (transport_error: a peer
/// closed its connections, stalled past the deadline, or left), the group destroys its data
/// communicator at once (so peers blocked on this member see it gone instead of waiting for
/// their deadline) and fails the sync through the quorum view (quorum_view::fail): the
/// membership then does what it does for a fault of its own collectives. transact() re-forms the
/// quorum, heals, retries or discards the sync (member::transact), and the retry builds the data
/// communicator on the new quorum.
///
/// **Commit.** transact() ends every sync with a one-element all-reduce on the quorum view
/// (the vote): the sync commits where it completes, under the membership's commit rule, so a
/// member that completed its data calls while another's failed does not commit alone, and the
/// vote carries the notices that admit a joiner. It costs one small all-reduce per sync.
///
/// Calls are valid inside transact() only, on the member's thread; abort() and failed() from
/// any thread. The group holds a reference to the member, which must outlive it.
template <class C, class D>
class quorum_group {
public:
  /// Builds the data communicator for one quorum: the same arguments on every member.
  using factory = std::function<std::unique_ptr<D>(const group_spec&)>;
  /// The work handle of the asynchronous operations.
  using work_type = quorum_group_work<C, D>;

  /// A group over member `m`'s quorums, building with `make`; store prefixes start with
  /// `base_prefix` (no '/'); the data calls take buffers in `memory` (what every communicator
  /// `make` builds takes: a build whose capabilities say otherwise fails). Builds nothing yet.
  quorum_group(member<C>& m, factory make, std::string base_prefix = "cadence-data",
               buffer_memory memory = buffer_memory::host)
      : m_(&m), make_(std::move(make)), base_(std::move(base_prefix)), memory_(memory) {
    CADENCE_REQUIRE_COMMUNICATOR(D);
    if (!make_) throw invalid_parameter_error("cadence::membership::quorum_group: an empty factory");
    if (base_.empty() || base_.find('/') != std::string::npos)
      throw invalid_parameter_error("cadence::membership::quorum_group: the base prefix must be a non-empty name "
                                    "without '/', not \"" + base_ + "\"");
  }
  quorum_group(const quorum_group&) = delete;
  quorum_group& operator=(const quorum_group&) = delete;

  // ---- syncs ----

  /// member::transact() of `body` (data calls on this group, view calls on the member's view)
  /// followed by the vote; `backup` and `policy` as there.
  template <class Body>
  sync_report transact(Body&& body, span<const buffer> backup = {}, on_loss policy = on_loss::retry) {
    struct scope {
      bool& flag;
      explicit scope(bool& f) : flag(f) { flag = true; }
      ~scope() { flag = false; }
    } in(in_txn_);
    return m_->transact(
        [&] {
          body();
          float vote = 0;
          m_->view().allreduce(&vote, 1, transport::dtype::f32, transport::reduce_op::max);
        },
        backup, policy);
  }
  /// transact() of `body` under `policy` with the `backup` as a braced list.
  template <class Body>
  sync_report transact(Body&& body, std::initializer_list<buffer> backup, on_loss policy = on_loss::retry) {
    return transact(std::forward<Body>(body), span<const buffer>(backup.begin(), backup.size()), policy);
  }

  // ---- the communicator concept ----

  /// This member's rank in the quorum (its view rank).
  int rank() const noexcept { return m_->view().rank(); }
  /// Members of the quorum.
  int size() const noexcept { return m_->view().size(); }
  /// Lost members detected and survived (by re-creation), not isolated: a lost member fails the
  /// sync, and transact() re-forms (quorum_capabilities). Device buffers as the constructor's
  /// `memory` declared, from the start: an adapter made before the first build reads them.
  transport::capability_flags capabilities() const noexcept {
    return quorum_capabilities(memory_ == buffer_memory::device);
  }

  /// D's all-reduce of `count` elements of `t` at `buf` with `op`, within `d` and the op timeout.
  void allreduce(void* buf, std::size_t count, transport::dtype t, transport::reduce_op op, transport::deadline d = {}) {
    D& c = data("allreduce");
    guarded("allreduce", [&] { c.allreduce(buf, count, t, op, bounded(d)); });
  }
  /// D's averaging all-reduce of `count` elements of `t` at `buf` (where D has one), within `d`
  /// and the op timeout.
  void allreduce_average(void* buf, std::size_t count, transport::dtype t, transport::deadline d = {}) {
    D& c = data("allreduce_average");
    guarded("allreduce_average", [&] { c.allreduce_average(buf, count, t, bounded(d)); });
  }
  /// D's broadcast of `bytes` at `buf` from member `root` (a view rank), within `d`.
  void broadcast(void* buf, std::size_t bytes, int root, transport::deadline d = {}) {
    D& c = data("broadcast");
    guarded("broadcast", [&] { c.broadcast(buf, bytes, root, bounded(d)); });
  }
  /// D's send of `bytes` at `buf` to member `dst` (a view rank) with `tag`, within `d`.
  void send(const void* buf, std::size_t bytes, int dst, int tag, transport::deadline d = {}) {
    D& c = data("send");
    guarded("send", [&] { c.send(buf, bytes, dst, tag, bounded(d)); });
  }
  /// D's receive of `bytes` into `buf` from member `src` (a view rank) with `tag`, within `d`;
  /// returns `src`.
  int recv(void* buf, std::size_t bytes, int src, int tag, transport::deadline d = {}) {
    D& c = data("recv");
    return guarded("recv", [&] { return c.recv(buf, bytes, src, tag, bounded(d)); });
  }

  /// allreduce() of `count` elements of `t` at `buf` with `op`, started.
  work_type iallreduce(void* buf, std::size_t count, transport::dtype t, transport::reduce_op op) {
    D& c = data("iallreduce");
    return {this, guarded("iallreduce", [&] { return c.iallreduce(buf, count, t, op); }), generation_};
  }
  /// allreduce_average() of `count` elements of `t` at `buf`, started.
  work_type iallreduce_average(void* buf, std::size_t count, transport::dtype t) {
    D& c = data("iallreduce_average");
    return {this, guarded("iallreduce_average", [&] { return c.iallreduce_average(buf, count, t); }), generation_};
  }
  /// broadcast() of `bytes` at `buf` from member `root`, started.
  work_type ibroadcast(void* buf, std::size_t bytes, int root) {
    D& c = data("ibroadcast");
    return {this, guarded("ibroadcast", [&] { return c.ibroadcast(buf, bytes, root); }), generation_};
  }
  /// send() of `bytes` at `buf` to member `dst` with `tag`, started.
  work_type isend(const void* buf, std::size_t bytes, int dst, int tag) {
    D& c = data("isend");
    return {this, guarded("isend", [&] { return c.isend(buf, bytes, dst, tag); }), generation_};
  }
  /// recv() of `bytes` into `buf` from member `src` with `tag`, started.
  work_type irecv(void* buf, std::size_t bytes, int src, int tag) {
    D& c = data("irecv");
    return {this, guarded("irecv", [&] { return c.irecv(buf, bytes, src, tag); }), generation_};
  }

  /// Fails every later call of this member (any thread): the view and the data communicator.
  void abort() noexcept {
    aborted_ = true;
    m_->view().abort();
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_) comm_->abort();
  }
  /// Whether the current sync failed or the group was aborted.
  bool failed() const noexcept { return aborted_ || m_->view().failed(); }

  // ---- what it knows ----

  /// The data communicator of the current quorum, or nullptr before its first data call.
  D* data_communicator() noexcept { return comm_.get(); }
  /// The id of the quorum the data communicator was built for (0: none yet).
  std::uint64_t built_for() const noexcept { return built_for_; }
  /// Builds, failures and the re-creation time.
  const quorum_group_stats& stats() const noexcept { return stats_; }

  /// Builds the data communicator for the current quorum now if it has none (a sync's first
  /// data call does this): inside transact(), so that a failure fails the sync.
  void ensure() { data("ensure"); }

private:
  template <class, class>
  friend class quorum_group_work;

  // Map: m_ (the member; its view fails syncs), make_ and base_ (how a quorum's communicator is
  // built), comm_ (the current one, built for quorum built_for_; swapped under mu_ so abort()
  // from another thread sees a live one), generation_ (counts the communicators, so a handle
  // kept past its own is refused), stats_.

  D& data(const char* what) {
    if (aborted_) throw transport_error(std::string("cadence::membership::quorum_group: ") + what + " on an aborted group");
    if (!in_txn_)
      throw invalid_parameter_error(std::string("cadence::membership::quorum_group: ") + what +
                                    " outside quorum_group::transact()");
    const quorum& q = m_->current();
    if (comm_ && built_for_ == q.id) return *comm_;
    drop();
    group_spec s;
    s.quorum_id = q.id;
    s.ranks = q.ranks;
    s.rank = m_->view().rank();
    s.size = static_cast<int>(q.size());
    char nonce[17];
    std::snprintf(nonce, sizeof nonce, "%016llx",
                  static_cast<unsigned long long>(q.nonces.empty() ? 0 : q.nonces.front()));
    s.prefix = base_ + "-q" + std::to_string(q.id) + "-" + nonce;
    s.until = std::chrono::duration_cast<std::chrono::milliseconds>(m_->options().timeouts.op);
    const auto t0 = transport::deadline::clock::now();
    std::unique_ptr<D> made;
    try {
      made = make_(s);
      if (!made) throw transport_error("the factory returned no communicator");
    } catch (const sync_failed&) {
      throw;
    } catch (const transport_error& e) {
      ++stats_.build_failures;
      std::string members;
      for (std::size_t i = 0; i < s.ranks.size(); ++i)
        members += (i == 0 ? "" : ", ") + std::to_string(i) + " = member " + std::to_string(s.ranks[i]);
      lose(std::string("building the data communicator of quorum ") + std::to_string(q.id) + " (prefix \"" +
           s.prefix + "\"; its ranks: " + members + ")", e);
    }
    const double took = std::chrono::duration<double>(transport::deadline::clock::now() - t0).count();
    ++stats_.builds;
    stats_.last_build_seconds = took;
    stats_.max_build_seconds = std::max(stats_.max_build_seconds, took);
    if (made->capabilities().device_buffers != (memory_ == buffer_memory::device))
      // A configuration error, the same on every member: the body throws, the member leaves.
      throw invalid_parameter_error(std::string("cadence::membership::quorum_group: the factory built quorum ") +
                                    std::to_string(q.id) + "'s data communicator for " +
                                    (made->capabilities().device_buffers ? "device" : "host") +
                                    " buffers, but the group was constructed for " +
                                    (memory_ == buffer_memory::device ? "device" : "host") +
                                    " buffers (quorum_group's buffer_memory argument)");
    {
      std::lock_guard<std::mutex> lock(mu_);
      comm_ = std::move(made);
      if (aborted_) comm_->abort();
    }
    built_for_ = q.id;
    ++generation_;
    return *comm_;
  }

  /// Runs `f` (a call on D); a transport_error from it fails the sync.
  template <class F>
  auto guarded(const char* what, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const sync_failed&) {
      throw;
    } catch (const transport_error& e) {
      lose(std::string("its ") + what, e);
    }
  }

  [[noreturn]] void lose(const std::string& what, const transport_error& e) {
    ++stats_.data_failures;
    stats_.last_error = "the data communicator: " + what + " failed: " + e.what();
    drop();
    m_->view().fail(stats_.last_error);
  }

  void drop() noexcept {
    std::unique_ptr<D> old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      old = std::move(comm_);
    }
    built_for_ = 0;
    old.reset();  // closes its connections: peers blocked on this member see it gone
  }

  void check_generation(std::uint64_t g) {
    if (g != generation_ || !comm_)
      m_->view().fail("a started operation of the data communicator belongs to an earlier quorum's communicator");
  }

  transport::deadline bounded(const transport::deadline& d,
                              transport::deadline::clock::time_point from = transport::deadline::clock::now()) const {
    return transport::deadline::at(std::min(d.time_point(), from + m_->options().timeouts.op));
  }

  member<C>* m_;
  factory make_;
  std::string base_;
  std::mutex mu_;
  std::unique_ptr<D> comm_;
  std::uint64_t built_for_ = 0, generation_ = 0;
  buffer_memory memory_;
  bool in_txn_ = false;
  std::atomic<bool> aborted_{false};
  quorum_group_stats stats_;
};

/// @}
}  // namespace cadence::membership
