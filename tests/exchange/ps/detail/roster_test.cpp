// cadence/exchange/ps/detail/roster.hpp: a server's per-worker tables, on their own (no ranks):
// membership, the release needs servers exchange, and the two looks before a lost rank counts.
#include <cadence/exchange/ps/detail/roster.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

using cadence::exchange::detail::ps_roster;
using cadence::exchange::detail::ps_worker_state;

TEST_CASE("the roster issues ids to ranks; ids it skipped were never its own") {
  ps_roster r;
  r.reset(5);  // rank 0 serves, ranks 1-4 work
  CHECK(r.done());
  r.add(0, 1);
  r.add(3, 4);  // ids 1 and 2 were issued elsewhere (another server's view, or a join later)
  CHECK(r.ids() == 4);
  CHECK(r.member == std::vector<std::int64_t>{-1, 0, -1, -1, 3});
  CHECK(r.known(0));
  CHECK_FALSE(r.known(1));
  CHECK_FALSE(r.known(4));
  CHECK(r.active(3));
  CHECK_FALSE(r.active(1));
  CHECK_FALSE(r.active(-1));
  CHECK_FALSE(r.active(9));
  CHECK(r.state[2] == ps_worker_state::evicted);
  CHECK_FALSE(r.done());
  r.state[0] = ps_worker_state::finished;
  r.state[3] = ps_worker_state::evicted;
  CHECK(r.done());
  r.add(5, 4);  // a new process on rank 4, under a new id
  CHECK(r.member[4] == 5);
  CHECK(r.rank_of[5] == 4);
  CHECK(r.rank_of[3] == 4);  // the old id still names the rank it was issued to
  CHECK_FALSE(r.done());
}

TEST_CASE("a release needs every push server 0 applied, except an evicted worker's") {
  ps_roster server0;
  server0.reset(4);
  for (cadence::worker_id w = 0; w < 3; ++w) server0.add(w, static_cast<int>(w) + 1);
  server0.applied = {5, 3, 7};
  server0.state[1] = ps_worker_state::evicted;
  const std::vector<std::int64_t> need = server0.needs();
  CHECK(need == std::vector<std::int64_t>{5, -1, 7});

  ps_roster other;
  other.reset(4);
  for (cadence::worker_id w = 0; w < 3; ++w) other.add(w, static_cast<int>(w) + 1);
  other.applied = {5, 0, 6};
  CHECK_FALSE(other.holds(need));  // worker 2's 7th push is not here yet
  other.applied[2] = 7;
  CHECK(other.holds(need));
  other.applied = {4, 0, 9};
  CHECK_FALSE(other.holds(need));
  other.state[0] = ps_worker_state::evicted;  // dropped here: its pushes are not waited for
  CHECK(other.holds(need));
  // An id this server has not heard of yet needs nothing of it.
  CHECK(other.holds({-1, -1, 0, 12}));
  CHECK_FALSE(other.holds({-1, -1, 10}));
}

TEST_CASE("a rank counts as lost on the second look in a row that reports it lost") {
  ps_roster r;
  r.reset(3);
  CHECK_FALSE(r.lost_twice(1, true));
  CHECK(r.lost_twice(1, true));
  CHECK_FALSE(r.lost_twice(1, true));  // counted: the next look starts over
  CHECK(r.lost_twice(1, true));
  CHECK_FALSE(r.lost_twice(2, true));
  CHECK_FALSE(r.lost_twice(2, false));  // back (a new process, or it was a blip)
  CHECK_FALSE(r.lost_twice(2, true));
  CHECK(r.lost_twice(2, true));
  CHECK_FALSE(r.lost_twice(1, false));
}
