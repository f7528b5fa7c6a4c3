// Test support for ranks that sync over a membership::quorum_group (gloo's, NCCL's), beside
// membership_ranks.hpp: what such a rank ends with (its group's builds and failures, its data
// communicator), a sync of a replica over the group with a hook before and after its data call,
// the closing sync, and a member lost inside a sync as a process that dies.
#pragma once

#include <cadence/membership/member.hpp>
#include <cadence/membership/quorum_group.hpp>
#include <cadence/transport/inproc.hpp>

#include "membership/membership_ranks.hpp"

#include <cstdint>
#include <functional>

namespace cadence_membership_test {

/// What one rank's thread did, syncing over a quorum_group: rank_result, and how its group ended.
struct group_result : rank_result {
  cadence::membership::quorum_group_stats group;  // builds, failures, the last error
  int data_size = 0;            // members of the last data communicator (0: none built)
  bool device_buffers = false;  // the group's capabilities at the end
};

/// Called inside a sync's body: before its data call (false), and after it, before the vote
/// (true).
using sync_hook = std::function<void(bool after_data)>;

/// One sync of `rank`'s member `m` over its group `g`: a local step of `r`, then transact() of an
/// averaging all-reduce over the group with `inside` around it, retried on a fault; a commit
/// goes to `book`.
template <class C, class D>
cadence::membership::sync_report sync_once(cadence::membership::member<C>& m, cadence::membership::quorum_group<C, D>& g,
                                           replica& r, ledger& book, int rank, const sync_hook& inside = {}) {
  r.local_step(rank, m.committed());
  const cadence::membership::sync_report rep = g.transact(
      [&] {
        if (inside) inside(false);
        g.allreduce_average(r.params.data(), r.params.size(), cadence::transport::dtype::f64);
        if (inside) inside(true);
      },
      {r.params});
  if (rep.outcome == cadence::membership::outcome::committed) book.record(rank, m);
  return rep;
}

/// sync_once() over `g` until the member has committed `target`.
template <class C, class D>
void run_syncs(cadence::membership::member<C>& m, cadence::membership::quorum_group<C, D>& g, replica& r, ledger& book,
               std::uint64_t target, int rank, const sync_hook& inside = {}) {
  while (m.committed() < target) sync_once(m, g, r, book, rank, inside);
}

/// Member `rank` lost as a process that dies: its in-process rank killed, its group aborted (the
/// data communicator with it), and its body ended with `killed`.
template <class Group>
[[noreturn]] void lose(cadence::transport::inproc_world& world, int rank, Group& g) {
  world.kill(rank);
  g.abort();
  throw killed{};
}

/// finish() of the member, then how its group `g` ended, in `out`.
template <class C, class D>
void finish(cadence::membership::member<C>& m, cadence::membership::quorum_group<C, D>& g, group_result& out) {
  finish(m, static_cast<rank_result&>(out));
  out.group = g.stats();
  out.data_size = g.data_communicator() != nullptr ? g.data_communicator()->size() : 0;
  out.device_buffers = g.capabilities().device_buffers;
}

}  // namespace cadence_membership_test
