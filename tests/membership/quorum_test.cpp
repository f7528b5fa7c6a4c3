// cadence::membership::quorum and its rules, checked exhaustively over small quorums: who
// leads, who may succeed a quorum (never two disjoint groups from the same one), positions.
#include <cadence/membership/quorum.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

namespace cadence_membership_quorum_test {
namespace {

namespace mb = cadence::membership;

mb::quorum make(std::vector<int> ranks) {
  mb::quorum q;
  q.id = 5;
  q.ranks = std::move(ranks);
  q.nonces.assign(q.ranks.size(), 0);
  return q;
}

// The ranks r < n whose bit r is set in `mask`, ascending.
std::vector<int> ranks_in(int n, unsigned mask) {
  std::vector<int> out;
  for (int r = 0; r < n; ++r)
    if ((mask >> r) & 1u) out.push_back(r);
  return out;
}

TEST_CASE("membership::quorum: positions, leader, holds, describe") {
  mb::quorum q = make({1, 4, 6});
  q.nonces = {11, 44, 66};
  CHECK(q.size() == 3);
  CHECK(q.leader() == 1);
  CHECK(q.index_of(4) == 1);
  CHECK(q.index_of(5) == -1);
  CHECK(q.contains(6));
  CHECK_FALSE(q.contains(0));
  CHECK(q.holds(4, 44));
  CHECK_FALSE(q.holds(4, 45));  // another process in rank 4's slot
  CHECK_FALSE(q.holds(2, 44));
  CHECK(make({0, 1}).holds(1, 123));  // nonce 0: the first formation matches any process
  CHECK(q.describe() == "quorum 5 {1, 4, 6}");
  CHECK(mb::quorum{}.leader() == -1);
}

TEST_CASE("membership::may_succeed: of two disjoint groups of survivors at most one may go on") {
  for (int n = 1; n <= 7; ++n) {
    const mb::quorum q = make(ranks_in(n, ~0u));
    // Every split of the members into two disjoint groups (a partition; non-members ignored).
    for (unsigned mask = 0; mask < (1u << n); ++mask) {
      std::vector<int> a = ranks_in(n, mask);
      const std::vector<int> b = ranks_in(n, ~mask);
      a.push_back(100);  // a newcomer does not count
      CAPTURE(n);
      CAPTURE(mask);
      CHECK_FALSE((mb::may_succeed(q, a) && mb::may_succeed(q, b)));
      // The group with more than half always may.
      if (2 * (a.size() - 1) > static_cast<std::size_t>(n)) CHECK(mb::may_succeed(q, a));
    }
  }
  CHECK(mb::may_succeed(make({0, 1, 2, 3}), {0, 1}));      // half with the leader
  CHECK_FALSE(mb::may_succeed(make({0, 1, 2, 3}), {2, 3}));  // half without it
  CHECK(mb::may_succeed(make({0, 1, 2}), {1, 2}));         // rank 0 lost: the rest go on
  CHECK_FALSE(mb::may_succeed(make({0, 1, 2}), {2}));
  CHECK_FALSE(mb::may_succeed(make({}), {}));
}

// The split brain of the chaos soak (seed 1, trial 18): rank 0, the leader of {0, 1, 2, 3},
// stopped; {1, 2, 3} went on; resumed, rank 0 read rank 3's old request and adopted {0, 3}
// (half with the leader), then, rank 3 gone, {0} (half of {0, 3} with its leader) and committed
// alone. Measured against the quorum of the last commit too, no group that adopted anything
// since then goes on beside another disjoint one.
TEST_CASE("membership::may_succeed: against the quorum of the last commit, never two groups whatever they adopted since") {
  CHECK(mb::may_succeed(make({0, 3}), {0}));                                // alone: by {0, 3}'s measure
  CHECK_FALSE(mb::may_succeed(make({0, 3}), make({0, 1, 2, 3}), {0}));      // not by the last commit's
  CHECK(mb::may_succeed(make({1, 2, 3}), make({0, 1, 2, 3}), {1, 2, 3}));   // the majority goes on
  CHECK(mb::may_succeed(make({0, 1, 2}), make({0, 1, 2, 3}), {0, 1}));      // two losses, half with the leader
  for (int n = 1; n <= 6; ++n) {
    const mb::quorum confirmed = make(ranks_in(n, ~0u));
    // Each group adopted a quorum of its own since the commit (any subset of the members,
    // each holding the group: what it announced), then lost the rest of it.
    for (unsigned split = 0; split < (1u << n); ++split) {
      const std::vector<int> a = ranks_in(n, split), b = ranks_in(n, ~split);
      for (unsigned pa = 0; pa < (1u << n); pa += 1 + (n > 4)) {
        const std::vector<int> qa = ranks_in(n, pa | split);
        for (unsigned pb = 0; pb < (1u << n); pb += 1 + (n > 4)) {
          const std::vector<int> qb = ranks_in(n, pb | ~split);
          CAPTURE(n);
          CAPTURE(split);
          CHECK_FALSE((mb::may_succeed(make(qa), confirmed, a) && mb::may_succeed(make(qb), confirmed, b)));
        }
      }
    }
  }
}

TEST_CASE("membership::candidate_leader: the lowest member not reported lost, self always alive") {
  const mb::quorum q = make({0, 2, 3, 5});
  CHECK(mb::candidate_leader(q, 3, [](int) { return false; }) == 0);
  CHECK(mb::candidate_leader(q, 3, [](int r) { return r < 3; }) == 3);
  CHECK(mb::candidate_leader(q, 5, [](int r) { return r == 0; }) == 2);
  CHECK(mb::candidate_leader(q, 9, [](int) { return true; }) == -1);
}

}  // namespace
}  // namespace cadence_membership_quorum_test
