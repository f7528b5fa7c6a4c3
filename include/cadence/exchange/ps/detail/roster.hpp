// A parameter server's per-worker state: which worker id each rank holds, and per worker id
// its state, the pushes applied to this server's slice, and the request numbers that make
// every request answered exactly once. Data only: the server decides who joins and who is
// dropped (ps/server.hpp).
#pragma once

#include <cadence/core/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cadence::exchange::detail {

enum class ps_worker_state : unsigned char { active, finished, evicted };

struct ps_roster {
  // Per rank.
  std::vector<std::int64_t> member;  // the worker id the rank holds now (-1: none)
  std::vector<char> claimed;         // whether that id's process has pulled (initial members
                                     // hold reserved ids from the start)
  std::vector<char> suspect;         // server 0: the transport said the rank was lost, once
  // Per worker id (ids this server never saw stay evicted, with rank_of -1).
  std::vector<ps_worker_state> state;
  std::vector<std::int64_t> applied;   // pushes applied to this server's slice
  std::vector<int> rank_of;            // the rank the id was issued to
  std::vector<std::int64_t> request;   // the last request number seen from it
  std::vector<std::int64_t> answered;  // the last one answered: a request is answered once

  // A world of `ranks` ranks, before any member is added.
  void reset(std::size_t ranks) {
    member.assign(ranks, -1);
    claimed.assign(ranks, 0);
    suspect.assign(ranks, 0);
  }

  // Worker w is the member on `rank` now, active; the per-id tables grow to hold w.
  void add(worker_id w, int rank) {
    const auto wi = static_cast<std::size_t>(w);
    if (state.size() <= wi) {
      state.resize(wi + 1, ps_worker_state::evicted);  // ids skipped here were never ours
      applied.resize(wi + 1, 0);
      rank_of.resize(wi + 1, -1);
      request.resize(wi + 1, 0);
      answered.resize(wi + 1, 0);
    }
    state[wi] = ps_worker_state::active;
    rank_of[wi] = rank;
    member[static_cast<std::size_t>(rank)] = static_cast<std::int64_t>(w);
  }

  // Worker ids this server has heard of (issued to a rank).
  std::size_t ids() const noexcept { return state.size(); }
  bool known(worker_id w) const {
    return static_cast<std::size_t>(w) < state.size() && rank_of[static_cast<std::size_t>(w)] >= 0;
  }
  bool active(std::int64_t w) const {
    return w >= 0 && static_cast<std::size_t>(w) < state.size() &&
           state[static_cast<std::size_t>(w)] == ps_worker_state::active;
  }
  // What a released worker's weights must contain: per worker id, the pushes applied here
  // (server 0's counts, sent with the release), -1 for an id that was evicted.
  std::vector<std::int64_t> needs() const {
    std::vector<std::int64_t> need(applied);
    for (std::size_t v = 0; v < need.size(); ++v)
      if (state[v] == ps_worker_state::evicted) need[v] = -1;
    return need;
  }
  // Whether this slice holds every push `need` asks for (an id evicted here needs none).
  bool holds(const std::vector<std::int64_t>& need) const {
    for (std::size_t v = 0; v < need.size(); ++v)
      if (!(need[v] < 0 || v >= state.size() || state[v] == ps_worker_state::evicted || applied[v] >= need[v]))
        return false;
    return true;
  }

  // Whether `rank`, reported `lost` at this look, was reported lost at the previous look too
  // (it counts as gone then, and the next look starts over).
  bool lost_twice(std::size_t rank, bool lost) {
    if (!lost) {
      suspect[rank] = 0;
      return false;
    }
    suspect[rank] = suspect[rank] ? 0 : 1;
    return suspect[rank] == 0;
  }

  // Nobody is active any more: every member finished or was dropped.
  bool done() const {
    return std::none_of(state.begin(), state.end(), [](ps_worker_state s) { return s == ps_worker_state::active; });
  }
};

}  // namespace cadence::exchange::detail
