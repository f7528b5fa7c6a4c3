#include <cadence/controllers/detail/clock_table.hpp>

#include <doctest/doctest.h>

#include <vector>

using cadence::clock_value;
using cadence::worker_id;
using cadence::detail::clock_table;

namespace {
// n workers inserted at clock 0, ids 0..n-1 (inserted in reverse, as controller_base does, so
// that each bucket's order is by id).
clock_table make(bool ordered, worker_id n) {
  clock_table t(ordered);
  t.reserve_workers(n);
  for (worker_id p = n; p-- > 0;) t.insert_front(p, 0);
  return t;
}
void advance(clock_table& t, worker_id p) {
  t.reserve_advance(p);
  t.advance(p);
}
}  // namespace

TEST_CASE("clock_table: clocks advance one by one; erase and a late insert keep min and max right") {
  for (const bool ordered : {false, true}) {
    CAPTURE(ordered);
    clock_table t = make(ordered, 4);
    for (int k = 0; k < 100; ++k) advance(t, 1);  // the ring grows past its first 16 clocks
    advance(t, 2);
    CHECK(t.clock(1) == 100);
    CHECK(t.clock(2) == 1);
    CHECK(t.min() == 0);
    CHECK(t.max() == 100);
    CHECK(t.count(0) == 2);
    CHECK(t.count(50) == 0);
    t.erase(1);  // the fastest leaves: max falls back to the next clock held
    CHECK(t.max() == 1);
    CHECK(t.active() == 3);
    t.erase(0);
    t.erase(3);  // the slowest leave: min rises
    CHECK(t.min() == 1);
    CHECK(t.max() == 1);
    // A worker inserted later starts at the slowest clock.
    t.reserve_insert(4);
    t.insert_front(4, t.min());
    CHECK(t.clock(4) == 1);
    CHECK(t.count(1) == 2);
  }
}

TEST_CASE("clock_table: min and max follow the clocks; the ordered table keeps arrival order") {
  for (const bool ordered : {false, true}) {
    CAPTURE(ordered);
    clock_table t = make(ordered, 3);
    CHECK(t.min_after_advance(0) == 0);
    advance(t, 2);
    advance(t, 0);
    CHECK(t.min() == 0);
    CHECK(t.min_after_advance(1) == 1);  // worker 1 is alone at the slowest clock
    advance(t, 1);
    CHECK(t.min() == 1);
    CHECK(t.count(1) == 3);
    if (ordered) {
      // Clock 1 was reached by 2, then 0, then 1: the head is 2, and 0 once 2 has moved on.
      CHECK(t.head_of_min_after_advance(1) == 2);
      CHECK(t.head_of_min_after_advance(2) == 0);
    }
  }
}

TEST_CASE("clock_table: waiters are released by clock, in the order they began to wait") {
  clock_table t = make(false, 4);
  advance(t, 1);
  advance(t, 2);
  advance(t, 2);
  t.add_waiter(2);  // at clock 2
  t.add_waiter(1);  // at clock 1
  std::vector<worker_id> released;
  t.release_waiters(1, 1, [&](worker_id q) { released.push_back(q); });
  CHECK(released == std::vector<worker_id>{1});
  t.release_waiters(2, 2, [&](worker_id q) { released.push_back(q); });
  CHECK(released == std::vector<worker_id>{1, 2});
}
