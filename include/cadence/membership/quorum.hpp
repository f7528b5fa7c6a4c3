/// \file
/// \ingroup membership
/// A quorum: the members a collective job runs on now, under an id that only grows, with the
/// rules that decide who leads it and which group may succeed it. Pure (no communication), so
/// every member applies the same rules to the same facts and the tests check them exhaustively.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// The members of one quorum: communicator ranks in ascending order, each with the nonce of
/// the process that holds it (a number each process draws at start, so a restarted process in
/// the same rank slot is a different member). `id` only grows: every reconfiguration makes a
/// quorum with a larger id, so a message names the quorum it belongs to and stale ones are
/// told apart.
struct quorum {
  /// Grows by at least one with every reconfiguration; 0 before the first quorum formed.
  std::uint64_t id = 0;
  /// Communicator ranks, ascending. The quorum's view communicator numbers them 0..size()-1.
  std::vector<int> ranks;
  /// Per member (same order): its process's nonce; 0 where not known yet (before formation).
  std::vector<std::uint64_t> nonces;
  /// The nonce of the leader that announced it (0 before the first formation). Two leaders can
  /// announce quorums with the same id in a race (a member's request counted by both, a stopped
  /// leader resumed); (id, stamp) names one quorum, and every frame and collective of the
  /// membership carries both, so a message of one is never taken for the other's.
  std::uint64_t stamp = 0;

  /// Members.
  std::size_t size() const noexcept { return ranks.size(); }
  /// Whether there are no members.
  bool empty() const noexcept { return ranks.empty(); }
  /// The lowest rank: the leader. No rank is fixed as coordinator, so losing any one rank
  /// (rank 0 included) leaves a leader among the rest.
  int leader() const noexcept { return ranks.empty() ? -1 : ranks.front(); }
  /// The position of communicator rank `rank` in the quorum (its rank in the view), or -1.
  int index_of(int rank) const noexcept {
    const auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
    return it != ranks.end() && *it == rank ? static_cast<int>(it - ranks.begin()) : -1;
  }
  /// Whether communicator rank `rank` is a member.
  bool contains(int rank) const noexcept { return index_of(rank) >= 0; }
  /// Whether the process with `nonce` holds rank `rank` here (a nonce of 0 in the quorum
  /// matches any process: the first formation, before nonces are known).
  bool holds(int rank, std::uint64_t nonce) const noexcept {
    const int i = index_of(rank);
    if (i < 0) return false;
    const std::uint64_t n = nonces.empty() ? 0 : nonces[static_cast<std::size_t>(i)];
    return n == 0 || n == nonce;
  }
  /// "quorum 7 {0, 2, 3}"
  std::string describe() const {
    std::string s = "quorum " + std::to_string(id) + " {";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s + "}";
  }
};

/// Whether the members of `previous` that reached a reconfiguration (`survivors`: ranks,
/// any order, newcomers may be among them and do not count) may form its successor: more
/// than half of `previous`, or exactly half including its leader. Two groups that cannot see
/// each other (a partition, or a stopped process that comes back and finds everyone gone)
/// therefore never both go on from the same quorum: at most one of two disjoint groups holds
/// more than half, and of two halves only one holds the old leader. The price: a job that
/// loses more than half of its members at once (or half without the leader) stops with
/// quorum_error instead of going on; losses one after another are fine, since each
/// reconfiguration counts against the quorum before it.
inline bool may_succeed(const quorum& previous, const std::vector<int>& survivors) {
  std::size_t kept = 0;
  bool leader_kept = false;
  for (int r : survivors) {
    if (!previous.contains(r)) continue;
    ++kept;
    if (r == previous.leader()) leader_kept = true;
  }
  const std::size_t n = previous.size();
  return 2 * kept > n || (2 * kept == n && leader_kept && n > 0);
}

/// may_succeed() against both the quorum adopted last (`previous`) and `confirmed`, the quorum
/// that last committed a sync, or completed the confirming collective that ends an admission
/// (every member took part in it, so each had adopted it). A quorum
/// that was announced but never confirmed can hold a member that went to another group: its
/// request for the next quorum reached a stopped leader before it saw that leader lost, and the
/// leader read it when it resumed. Measured against `previous` alone, shrinking that quorum
/// again would let the resumed leader go on by itself beside the group that holds the majority
/// (the chaos soak found it: docs/collective.md, "Chaos soak"). Measured against `confirmed`
/// too, two disjoint groups of `survivors` never both go on, whatever each adopted since the
/// last commit.
inline bool may_succeed(const quorum& previous, const quorum& confirmed, const std::vector<int>& survivors) {
  return may_succeed(previous, survivors) && may_succeed(confirmed, survivors);
}

/// The rank that leads the next reconfiguration as this member sees it: the lowest member of
/// `q` that `lost(rank)` does not report (this member itself included). -1 when every member
/// is lost (this member always counts itself alive, so that needs `self` outside `q`).
template <class Lost>
int candidate_leader(const quorum& q, int self, Lost&& lost) {
  for (int r : q.ranks)
    if (r == self || !lost(r)) return r;
  return -1;
}

/// @}
}  // namespace cadence::membership
