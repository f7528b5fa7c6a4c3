// cadence/transport/engine/work.hpp: the work handle of the engine's backends over the scripted
// backend (scripted_engine.hpp): the concept's requirements 1-5 for handles (complete when
// default-constructed or moved from, cancel on destruction, movable only), what cancel() says
// for a receive and for a send, and wait_until only where the engine offers it.
#include "scripted_engine.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <type_traits>
#include <utility>

namespace cadence_scripted_engine {
namespace work_tests {

using work = scripted::work_type;

// An engine whose handles cannot wait until a time (work_has_wait_until false).
struct no_timed_engine {
  static constexpr bool work_has_wait_until = false;
};
template <class W, class = void>
struct has_wait_until : std::false_type {};
template <class W>
struct has_wait_until<W, std::void_t<decltype(std::declval<W&>().wait_until(ct::deadline::clock::now()))>>
    : std::true_type {};

TEST_CASE("the engine's handle models the concept's work handle: movable, not copyable, with a noexcept cancel") {
  static_assert(ct::is_work_v<work>, "scripted::work_type is a work handle");
  static_assert(ct::has_async_v<scripted> && ct::has_try_recv_v<scripted> && ct::is_communicator_v<scripted>,
                "a backend on the engine is a communicator with the optional extensions");
  static_assert(!std::is_copy_constructible_v<work> && !std::is_copy_assignable_v<work>, "handles are not copyable");
  static_assert(std::is_nothrow_move_constructible_v<work> && std::is_nothrow_move_assignable_v<work>,
                "moves never throw");
  static_assert(has_wait_until<work>::value, "the engine offers wait_until");
  static_assert(!has_wait_until<ct::basic_work<no_timed_engine, scripted_op>>::value,
                "an engine without work_has_wait_until gives its handles no wait_until");
  CHECK(true);
}

TEST_CASE("a default-constructed handle is complete: test is true, wait returns, cancel is true, source is -1") {
  work w;
  CHECK(w.test());
  w.wait(std::chrono::milliseconds(1));
  CHECK(w.wait_until(ct::deadline::clock::now()));
  CHECK(w.cancel());
  CHECK(w.source() == -1);
}

TEST_CASE_FIXTURE(rank0_of_two, "a moved-from handle is complete and the handle moved to carries the operation") {
  work a = b.irecv(buf, 8, 1, 0);
  work c(std::move(a));
  CHECK(a.test());  // NOLINT(bugprone-use-after-move): the concept says it is complete
  CHECK_FALSE(c.test());
  scripted::release(*b.started[0]);
  CHECK(c.test());
  CHECK(c.source() == 1);
}

TEST_CASE_FIXTURE(
    rank0_of_two,
    "destroying an incomplete handle cancels it: a receive is withdrawn, a send goes on in the background") {
  { work r = b.irecv(buf, 8, 1, 0); }
  CHECK(b.started[0]->cancelled);
  CHECK(b.in_flight() == 0);
  { work s = b.isend(buf, 8, 1, 0); }
  CHECK_FALSE(b.started[1]->cancelled);
  CHECK(b.in_flight() == 1);  // the engine still drives it
  scripted::release(*b.started[1]);
  b.complete_on = 1;
  b.send(buf, 8, 1, 1);  // any call's progress completes the orphaned send
  CHECK(b.started[1]->done);
  CHECK_FALSE(b.failed());
}

TEST_CASE_FIXTURE(rank0_of_two, "move-assigning over an incomplete handle cancels the operation it held") {
  work w = b.irecv(buf, 8, 1, 0);
  w = b.irecv(buf, 8, 1, 1);
  CHECK(b.started[0]->cancelled);
  CHECK_FALSE(b.started[1]->cancelled);
  CHECK_FALSE(w.test());
}

TEST_CASE_FIXTURE(
    rank0_of_two,
    "cancel() withdraws a receive (true) but not a send or a collective (false); once complete it is true without "
    "asking") {
  work r = b.irecv(buf, 8, 1, 0);
  work s = b.isend(buf, 8, 1, 0);
  work a = b.iallreduce(buf, 2, ct::dtype::f32, ct::reduce_op::sum);
  CHECK(r.cancel());
  CHECK(r.test());  // a cancelled handle is complete
  CHECK_FALSE(s.cancel());
  CHECK_FALSE(a.cancel());
  scripted::release(*b.started[1]);
  scripted::release(*b.started[2]);
  CHECK(s.test());
  CHECK(a.test());
  CHECK(s.cancel());
  CHECK(a.cancel());
}

TEST_CASE("a handle's source is the sender of a completed any_source receive and the peer otherwise") {
  scripted b(0, 4);
  float buf[2] = {};
  work r = b.irecv(buf, 8, ct::any_source, 0);
  work s = b.isend(buf, 8, 2, 0);
  work c = b.ibroadcast(buf, 8, 1);
  CHECK(s.source() == 2);
  CHECK(c.source() == 1);
  scripted::release(*b.started[0]);
  CHECK(r.test());
  CHECK(r.source() == 3);
}

}  // namespace work_tests
}  // namespace cadence_scripted_engine
