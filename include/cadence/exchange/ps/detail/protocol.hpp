// The parameter server's wire protocol, shared by both ends: message kinds, the fixed-size
// header and what its words mean, the four tags, and the checks both ends make of their
// options, communicators and template arguments.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/types.hpp>
#include <cadence/transport/communicator.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

// What ps_worker and parameter_server (`who`, a string literal) require of their template
// arguments: communicators, try_recv on the control one (`why` it needs it), float or double.
#define CADENCE_DETAIL_PS_REQUIRE(who, why, Comm, Bulk, T)                                       \
  CADENCE_REQUIRE_COMMUNICATOR(Comm);                                                            \
  CADENCE_REQUIRE_COMMUNICATOR(Bulk);                                                            \
  static_assert(::cadence::transport::has_try_recv_v<Comm>,                                      \
                "cadence::exchange::" who ": the control communicator must offer try_recv (" why \
                ")");                                                                            \
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,                           \
                "cadence::exchange::" who ": T must be float or double")

namespace cadence::exchange::detail {

// "2.500000 s" style: the seconds a timeout or deadline stands for, in messages.
inline std::string ps_seconds(std::chrono::nanoseconds d) {
  return std::to_string(std::chrono::duration<double>(d).count());
}

// Workers send push, pull, finish and heartbeat; servers answer with reply (weights, or a
// refusal's text); server 0 tells the other servers release, evicted, joined and, when it is
// done, shutdown (so none leaves while server 0 may still tell it something).
enum class ps_kind : std::int64_t { push = 1, pull, finish, reply, release, evicted, heartbeat, joined, shutdown };
enum class ps_status : std::int64_t { ok = 0, evicted, error };

inline bool known_kind(std::int64_t k) {
  return k >= static_cast<std::int64_t>(ps_kind::push) && k <= static_cast<std::int64_t>(ps_kind::shutdown);
}

// The kinds a worker sends.
inline bool worker_kind(std::int64_t k) {
  const auto kind = static_cast<ps_kind>(k);
  return known_kind(k) && (kind == ps_kind::push || kind == ps_kind::pull || kind == ps_kind::finish ||
                           kind == ps_kind::heartbeat);
}

// Every control message is this fixed-size header; a payload, when any, follows on the
// matching data tag from the same rank.
//   worker:    the worker's id; -1 in the first pull of a new process (the reply carries the id
//              server 0 gave it); in release / evicted / joined notices, the worker concerned
//   iteration: a push's number (1-based); a reply's applied count
//   count:     payload elements (bytes for a refusal's text; ranks for a joined notice)
//   request:   the worker's request number (1-based), echoed in the reply, so a worker can
//              tell a stale answer (a refusal queued before it rejoined) from the current one
struct ps_header {
  std::int64_t kind = 0;
  std::int64_t worker = 0;
  std::int64_t iteration = 0;
  std::int64_t count = 0;
  std::int64_t status = 0;
  std::int64_t request = 0;
};

// The longest text a refusal may carry (a reason is a sentence or two): a worker refuses a
// reply that claims more before it allocates anything for it.
inline constexpr std::int64_t ps_max_text = std::int64_t{1} << 16;

inline ps_header make_header(ps_kind kind, std::int64_t worker, std::int64_t iteration = 0, std::int64_t count = 0,
                             std::int64_t request = 0, ps_status status = ps_status::ok) {
  return {static_cast<std::int64_t>(kind), worker, iteration, count, static_cast<std::int64_t>(status), request};
}

// A release notice as a server other than 0 holds it: worker w may start from its weights once
// this server has applied every push `need` lists (per worker id; -1: none), answering its
// request with `iteration` (server 0's applied count for w).
struct ps_release {
  worker_id worker;
  std::int64_t iteration;
  std::int64_t request;
  std::vector<std::int64_t> need;
};

struct ps_tags {
  int control, data, reply, reply_data;
  explicit ps_tags(int base) : control(base), data(base + 1), reply(base + 2), reply_data(base + 3) {}
};

template <class Options>
void check_options(const char* who, const Options& o, int size) {
  const std::string w = std::string("cadence::exchange::") + who + ": ";
  if (o.servers < 1 || o.servers >= size)
    throw invalid_parameter_error(w + "servers = " + std::to_string(o.servers) +
                                  " leaves no worker in a world of " + std::to_string(size) +
                                  " ranks (need 1 <= servers < size)");
  if (o.initial_workers && (*o.initial_workers < 0 || *o.initial_workers > size - o.servers))
    throw invalid_parameter_error(w + "initial_workers = " + std::to_string(*o.initial_workers) +
                                  " is not in [0, " + std::to_string(size - o.servers) +
                                  "] (the worker ranks of a world of " + std::to_string(size) + ")");
  if (o.evict_after && *o.evict_after <= std::chrono::nanoseconds::zero())
    throw invalid_parameter_error(w + "evict_after must be > 0");
  if (o.reply_timeout <= std::chrono::nanoseconds::zero() ||
      o.server_idle_timeout <= std::chrono::nanoseconds::zero() ||
      o.transfer_timeout <= std::chrono::nanoseconds::zero())
    throw invalid_parameter_error(w + "timeouts must be > 0");
  // A parked worker legitimately waits for its straggler's eviction, then for its reply's
  // transfer: a shorter reply_timeout would make it give up on a server that is about to
  // answer (and name the server, not the straggler).
  if (o.evict_after && o.reply_timeout <= *o.evict_after + o.transfer_timeout)
    throw invalid_parameter_error(
        w + "reply_timeout (" + ps_seconds(o.reply_timeout) + " s) must exceed evict_after + transfer_timeout (" +
        ps_seconds(*o.evict_after + o.transfer_timeout) +
        " s): a parked worker may wait that long for a straggler's eviction and its reply");
  if (o.max_outstanding < 1)
    throw invalid_parameter_error(w + "max_outstanding must be >= 1");
  if (o.tag_base < 0 || o.tag_base > transport::max_tag - 3)
    throw invalid_parameter_error(w + "tag_base " + std::to_string(o.tag_base) +
                                  " leaves no room for 4 tags below max_tag");
}

// Ranks [0, servers) serve, the others work: `who` on `rank` must be the role it plays.
inline void check_role(const char* who, int rank, int servers, bool serving) {
  if ((rank < servers) != serving)
    throw invalid_parameter_error(std::string("cadence::exchange::") + who + ": rank " + std::to_string(rank) +
                                  " is a " + (serving ? "worker" : "server") + " (ranks [0, " +
                                  std::to_string(servers) + ") serve)");
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
                                  "(NCCL cannot; use MPI, gloo, ZeroMQ or inproc for control)");
  if (control.capabilities().device_buffers)
    throw invalid_parameter_error(std::string("cadence::exchange::") + who +
                                  ": the control communicator takes device buffers; headers live "
                                  "in host memory");
}

}  // namespace cadence::exchange::detail
