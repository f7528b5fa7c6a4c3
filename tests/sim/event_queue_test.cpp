#include <cadence/sim/event_queue.hpp>

#include <doctest/doctest.h>

#include <random>
#include <vector>

using namespace cadence;
using namespace cadence::sim;

TEST_CASE("the event queue pops in time order and first-in first-out among equal times") {
  event_queue q;
  std::mt19937_64 rng(3);
  std::vector<std::pair<double, worker_id>> pushed;
  for (worker_id w = 0; w < 2000; ++w) {
    const double t = static_cast<double>(rng() % 50);  // many equal times
    q.push(t, w, event_kind::push_arrives);
    pushed.emplace_back(t, w);
  }
  double last_t = -1;
  worker_id last_w = 0;
  std::size_t popped = 0;
  while (!q.empty()) {
    const event e = q.pop();
    REQUIRE(e.time >= last_t);
    if (e.time == last_t) REQUIRE(e.worker > last_w);  // pushed in increasing worker order
    last_t = e.time;
    last_w = e.worker;
    ++popped;
  }
  CHECK(popped == pushed.size());
}

TEST_CASE("the event queue keeps its order when pushes and pops interleave") {
  event_queue q;
  q.push(5.0, 1, event_kind::push_arrives);
  q.push(1.0, 2, event_kind::worker_dies);
  CHECK(q.pop().worker == 2);
  q.push(5.0, 3, event_kind::worker_removed);
  q.push(2.0, 4, event_kind::push_arrives);
  CHECK(q.pop().worker == 4);
  CHECK(q.pop().worker == 1);
  const event last = q.pop();
  CHECK(last.worker == 3);
  CHECK(last.kind == event_kind::worker_removed);
  CHECK(q.empty());
}
