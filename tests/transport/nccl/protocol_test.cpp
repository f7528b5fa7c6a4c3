// nccl_communicator's protocol on CPU: the fake NCCL (fake_nccl.hpp) behind the function table,
// ranks as threads, the in-process communicator as bootstrap. No CUDA needed.
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/protocol.hpp>

#include "transport/conformance.hpp"
#include "fake_nccl.hpp"
#include "support/threads.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace cadence_conformance::test_names;
namespace fake = cadence_fake_nccl;

namespace {

// Runs body(rank, bootstrap) on one thread per rank; an exception escaping a rank fails the
// test, naming the rank. The bootstrap lives as long as the rank's thread, so a rank that
// finishes early is not seen as lost by the others' bootstrap collectives.
template <class Body>
void run_ranks(int n, Body body) {
  inproc_world boot(n);
  cadence_test::run_threads(n, [&](int r) {
    inproc_communicator b = boot.join(r);
    body(r, b);
  });
}

// run_ranks(n, ...) with world w's function table: body(r, api, b).
template <class Body>
void run_ranks_with(fake::world& w, int n, Body body) {
  const nccl_api api = w.api();
  run_ranks(n, [&](int r, inproc_communicator& b) { body(r, api, b); });
}

// The fake's "device" memory is host memory, so the host-side helpers (barrier, allgather,
// allreduce_avg) may run on it: the conformance harness hands the suite this view, which
// forwards every call and reports device_buffers = false. The contract is unchanged; only the
// harness knows the buffers are host memory.
class host_view {
public:
  explicit host_view(nccl_communicator& c) : c_(c) {}
  int rank() const noexcept { return c_.rank(); }
  int size() const noexcept { return c_.size(); }
  capability_flags capabilities() const noexcept {
    auto f = c_.capabilities();
    f.device_buffers = false;
    return f;
  }
  void allreduce(void* b, std::size_t n, dtype t, reduce_op op, deadline d = {}) { c_.allreduce(b, n, t, op, d); }
  void broadcast(void* b, std::size_t n, int root, deadline d = {}) { c_.broadcast(b, n, root, d); }
  void send(const void* b, std::size_t n, int dst, int tag, deadline d = {}) { c_.send(b, n, dst, tag, d); }
  int recv(void* b, std::size_t n, int src, int tag, deadline d = {}) { return c_.recv(b, n, src, tag, d); }
  void abort() noexcept { c_.abort(); }
  bool failed() const noexcept { return c_.failed(); }
  void allreduce_average(void* b, std::size_t n, dtype t, deadline d = {}) { c_.allreduce_average(b, n, t, d); }
  nccl_work iallreduce(void* b, std::size_t n, dtype t, reduce_op op) { return c_.iallreduce(b, n, t, op); }
  nccl_work iallreduce_average(void* b, std::size_t n, dtype t) { return c_.iallreduce_average(b, n, t); }
  nccl_work ibroadcast(void* b, std::size_t n, int root) { return c_.ibroadcast(b, n, root); }
  nccl_work isend(const void* b, std::size_t n, int dst, int tag) { return c_.isend(b, n, dst, tag); }
  nccl_work irecv(void* b, std::size_t n, int src, int tag) { return c_.irecv(b, n, src, tag); }

private:
  nccl_communicator& c_;
};

struct nccl_fake_harness {
  template <class Body>
  static void run(Body body) {
    const cadence_test::events ev;
    const cadence_test::scoped_events scope(ev);
    fake::world w;
    run_ranks_with(w, 4, [&](int r, const nccl_api& api, inproc_communicator& b) {
      nccl_communicator c(api, b, r, {}, 30s);
      host_view v(c);
      body(v);
    });
  }
};

bool aborted_on(const std::vector<fake::abort_record>& log, int rank, std::thread::id thread) {
  return std::any_of(log.begin(), log.end(),
                     [&](const fake::abort_record& a) { return a.rank == rank && a.thread == thread; });
}

// run_ranks(n, ...) with an NCCL communicator of world w on every rank (10 s to construct):
// body(r, c).
template <class Body>
void run_nccl_ranks(fake::world& w, int n, Body body) {
  const nccl_api api = w.api();
  run_ranks(n, [&](int r, inproc_communicator& b) {
    nccl_communicator c(api, b, r, {}, 10s);
    body(r, c);
  });
}

// run_ranks(n, body) over world w, then checks that every rank's NCCL communicator was aborted
// on the thread of that rank (the one that owns it).
template <class Body>
void run_ranks_aborted_by_owners(fake::world& w, int n, Body body) {
  std::vector<std::thread::id> owners(static_cast<std::size_t>(n));
  run_ranks(n, [&](int r, inproc_communicator& b) {
    owners[static_cast<std::size_t>(r)] = std::this_thread::get_id();
    body(r, b);
  });
  const auto log = w.abort_log();
  for (int r = 0; r < n; ++r) CHECK(aborted_on(log, r, owners[static_cast<std::size_t>(r)]));
}

}  // namespace

static_assert(is_communicator_v<nccl_communicator>);
static_assert(is_communicator_v<host_view>);
static_assert(has_async_v<nccl_communicator>);
static_assert(has_async_average_v<nccl_communicator>);
static_assert(is_work_v<nccl_work>);

// The suite where NCCL can meet it. Left out, because NCCL cannot: matching by tag and any
// order of sends before receives (point_to_point: NCCL matches in issue order per peer pair and
// a send completes only once its receive is posted), naming the one stalled rank of a
// collective (stalled_rank: NCCL cannot tell; the tests below check that every other rank is
// named), and seeing argument mismatches (mismatch, message_size: NCCL compares nothing).
TYPE_TO_STRING(nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_allreduce_dtypes, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_allreduce_sizes, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_broadcast, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_any_source, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_helpers, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_recv_deadline, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_send_deadline, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_bad_arguments, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_abort, nccl_fake_harness);
// ncclAvg on 4 ranks (x 1/4, then summed) is the exact mean of the suite's integer inputs. Left
// out of the asynchronous cases: async_p2p, whose receives are posted before the send that
// lets their messages go (NCCL runs one stream's operations in order, so that would wait).
TEST_CASE_TEMPLATE_INVOKE(conformance_average, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_mixed_sequence, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_async_collectives, nccl_fake_harness);
TEST_CASE_TEMPLATE_INVOKE(conformance_async_deadline, nccl_fake_harness);

TEST_CASE("rank 0's unique id reaches every rank over the bootstrap: one NCCL communicator" *
          doctest::timeout(30)) {
  fake::world w;
  run_nccl_ranks(w, 3, [&](int r, nccl_communicator& c) {
    CHECK(c.rank() == r);
    CHECK(c.size() == 3);
    CHECK(c.device() == r);
    CHECK(c.stream() != nullptr);
    const auto caps = c.capabilities();
    CHECK(caps.device_buffers);
    CHECK_FALSE(caps.any_source);
    CHECK_FALSE(caps.detects_lost_peer);
    CHECK_FALSE(caps.survives_lost_peer);
    std::int32_t x = r + 1;
    c.allreduce(&x, 1, dtype::i32, reduce_op::sum, 10s);
    CHECK(x == 6);
  });
  CHECK(w.group_count() == 1);  // one unique id: all three ranks joined the same communicator
  CHECK(w.abort_log().empty());
  CHECK(w.destroyed_count() == 3);  // healthy communicators are finalized and destroyed
}

TEST_CASE("f16 and bf16 all-reduce on the device dtypes" * doctest::timeout(30)) {
  fake::world w;
  run_nccl_ranks(w, 2, [&](int r, nccl_communicator& c) {
    for (dtype t : {dtype::f16, dtype::bf16}) {
      auto enc = [t](float v) { return t == dtype::f16 ? fake::float_to_half(v) : fake::float_to_bf16(v); };
      auto dec = [t](std::uint16_t v) { return t == dtype::f16 ? fake::half_to_float(v) : fake::bf16_to_float(v); };
      std::uint16_t buf[3] = {enc(static_cast<float>(r + 1)), enc(-2.0f * static_cast<float>(r)), enc(8.0f)};
      c.allreduce(buf, 3, t, reduce_op::sum, 10s);
      CHECK(dec(buf[0]) == 3.0f);
      CHECK(dec(buf[1]) == -2.0f);
      CHECK(dec(buf[2]) == 16.0f);
    }
  });
}

TEST_CASE("send and recv match in issue order per peer pair; recv refuses any_source" *
          doctest::timeout(30)) {
  fake::world w;
  run_nccl_ranks(w, 2, [&](int r, nccl_communicator& c) {
    if (r == 0) {
      const std::int64_t a = 11, z = 22;
      c.send(&a, sizeof a, 1, 5, 10s);
      c.send(&z, sizeof z, 1, 6, 10s);
      c.send(nullptr, 0, 1, 7, 10s);  // zero bytes: a local no-op, as in NCCL
    } else {
      std::int64_t got = 0;
      CHECK(c.recv(&got, sizeof got, 0, 5, 10s) == 0);
      CHECK(got == 11);
      CHECK(c.recv(&got, sizeof got, 0, 6, 10s) == 0);
      CHECK(got == 22);
      CHECK(c.recv(nullptr, 0, 0, 7, 10s) == 0);
      expect_throw<invalid_parameter_error>(1, [&] { c.recv(&got, sizeof got, any_source, 0, 10s); },
                                            {"recv #4 on rank 1", "source rank -1", "any_source"});
      CHECK_FALSE(c.failed());
    }
  });
}

TEST_CASE("an init that never completes times out: ncclCommAbort on the constructing thread, "
          "transport_error naming the other rank" * doctest::timeout(30)) {
  fake::faults f;
  f.init_never_completes = {1};
  fake::world w(f);
  const nccl_api api = w.api();
  run_ranks_aborted_by_owners(w, 2, [&](int r, inproc_communicator& b) {
    const auto t0 = steady::now();
    expect_throw<transport_error>(r, [&] { nccl_communicator c(api, b, r, {}, 500ms); },
                                  {"construction on rank " + std::to_string(r) + " of 2",
                                   "deadline passed", "rank " + std::to_string(1 - r),
                                   "NCCL init", "ncclCommAbort"});
    const double waited = seconds_since(t0);
    CHECK(waited >= 0.49);
    CHECK(waited < 5.0);
  });
  CHECK(w.abort_log().size() == 2);
}

TEST_CASE("a rank that never joins the bootstrap fails construction on its deadline, naming it" *
          doctest::timeout(30)) {
  fake::world w;
  const nccl_api api = w.api();
  const cadence_test::events ev;
  run_ranks(2, [&](int r, inproc_communicator& b) {
    if (r == 1) {
      // Alive until rank 0's deadline has passed (a departed rank would be reported as lost),
      // never constructing.
      CHECK(ev.wait("rank 0 timed out"));
      return;
    }
    expect_throw<transport_error>(0, [&] { nccl_communicator c(api, b, 0, {}, 300ms); },
                                  {"construction on rank 0 of 2", "bootstrap communicator failed",
                                   "unique id", "rank 1"});
    ev.post("rank 0 timed out");
  });
  CHECK(w.group_count() == 0);  // NCCL was never initialised
}

TEST_CASE("an asynchronous NCCL error aborts the communicator, names the error, and sticks" *
          doctest::timeout(30)) {
  fake::faults f;
  f.async_error_rank = 1;
  f.async_error_at_op = 2;
  fake::world w(f);
  const nccl_api api = w.api();
  run_ranks_aborted_by_owners(w, 2, [&](int r, inproc_communicator& b) {
    nccl_communicator c(api, b, r, {}, 10s);
    float x = 1;
    c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 10s);
    CHECK(x == 2.0f);
    if (r == 1) {
      const std::string original = expect_throw<transport_error>(
          1, [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 10s); },
          {"allreduce #2 on rank 1 of 2", "asynchronous error", "remote process exited",
           "ncclResult_t 6", "rank 0", "ncclCommAbort"});
      CHECK(c.failed());
      const auto t1 = steady::now();
      const std::string again = expect_throw<transport_error>(1, [&] { c.send(&x, sizeof x, 0, 0, 10s); }, {});
      CHECK(again == original);
      CHECK(seconds_since(t1) < 1.0);
    } else {
      // Rank 1's half never runs: rank 0 sees only its deadline, naming rank 1.
      expect_throw<transport_error>(0, [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 500ms); },
                                    {"allreduce #2 on rank 0 of 2", "deadline passed", "rank 1"});
    }
  });
  CHECK(w.destroyed_count() == 0);  // aborted communicators are not destroyed as well
}

TEST_CASE("a collective that never completes hits its deadline and names every other rank, "
          "since NCCL cannot say which one is missing" * doctest::timeout(30)) {
  fake::faults f;
  f.hang_rank = 2;  // its kernel never runs, so nobody's all-reduce completes
  fake::world w(f);
  const nccl_api api = w.api();
  run_ranks_aborted_by_owners(w, 3, [&](int r, inproc_communicator& b) {
    nccl_communicator c(api, b, r, {}, 10s);
    float x = 1;
    std::string others = r == 0 ? "ranks 1, 2" : r == 1 ? "ranks 0, 2" : "ranks 0, 1";
    const auto t0 = steady::now();
    expect_throw<transport_error>(r, [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 400ms); },
                                  {"allreduce #1 on rank " + std::to_string(r) + " of 3",
                                   "deadline passed", others, "NCCL cannot say which of them is missing",
                                   "ncclCommAbort"});
    CHECK(seconds_since(t0) >= 0.39);
    CHECK(c.failed());
  });
}

TEST_CASE("a rank that never calls leaves the others' collective to the deadline, naming it "
          "among the others" * doctest::timeout(30)) {
  fake::world w;
  const cadence_test::events ev;
  const cadence_test::scoped_events scope(ev);
  run_nccl_ranks(w, 3, [&](int r, nccl_communicator& c) {
    std::uint8_t x = 1;
    cadence_conformance::expect_deadline_without_last(c, [&] { c.broadcast(&x, 1, 2, 300ms); },
                                                      {"broadcast #1 on rank " + std::to_string(r), "rank 2"});
  });
}

TEST_CASE("abort() from another thread only raises a flag: the owning thread calls "
          "ncclCommAbort and throws" * doctest::timeout(30)) {
  fake::world w;
  std::thread::id owner, watchdog_id;
  std::atomic<bool> done{false};
  run_nccl_ranks(w, 2, [&](int r, nccl_communicator& c) {
    if (r == 1) {  // never joins the all-reduce; stays alive until rank 0 is done
      const auto until = steady::now() + 10s;
      while (!done.load() && steady::now() < until) std::this_thread::sleep_for(5ms);
      return;
    }
    owner = std::this_thread::get_id();
    std::thread watchdog([&] {
      watchdog_id = std::this_thread::get_id();
      std::this_thread::sleep_for(200ms);
      c.abort();
      c.abort();  // idempotent
    });
    float x = 1;
    const auto t0 = steady::now();
    expect_throw<transport_error>(0, [&] { c.allreduce(&x, 1, dtype::f32, reduce_op::sum, 20s); },
                                  {"allreduce #1 on rank 0", "aborted (abort())", "rank 1"});
    CHECK(seconds_since(t0) < 5.0);
    watchdog.join();
    CHECK(c.failed());
    done.store(true);
  });
  const auto log = w.abort_log();
  REQUIRE(log.size() == 1);
  CHECK(log[0].rank == 0);
  CHECK((log[0].thread == owner));
  CHECK((log[0].thread != watchdog_id));
}

TEST_CASE("setup failures: no device fails every rank at once; a device out of range is an "
          "argument error on its rank" * doctest::timeout(30)) {
  SUBCASE("no CUDA device") {
    fake::faults f;
    f.device_count_error = 100;
    fake::world w(f);
    run_ranks_with(w, 2, [&](int r, const nccl_api& api, inproc_communicator& b) {
      expect_throw<transport_error>(r, [&] { nccl_communicator c(api, b, 0, {}, 10s); },
                                    {"construction on rank " + std::to_string(r),
                                     "cudaGetDeviceCount failed", "no CUDA-capable device"});
    });
  }
  SUBCASE("device out of range on one rank") {
    fake::faults f;
    f.devices = 2;
    fake::world w(f);
    run_ranks_with(w, 2, [&](int r, const nccl_api& api, inproc_communicator& b) {
      const auto t0 = steady::now();
      if (r == 1)
        expect_throw<invalid_parameter_error>(1, [&] { nccl_communicator c(api, b, 5, {}, 10s); },
                                              {"construction on rank 1", "device 5 is out of range [0, 2)"});
      else
        expect_throw<transport_error>(0, [&] { nccl_communicator c(api, b, 0, {}, 10s); },
                                      {"construction on rank 0", "rank 1 could not set up"});
      CHECK(seconds_since(t0) < 5.0);  // at once, not at the deadline
    });
    CHECK(w.group_count() == 0);  // nobody initialised NCCL: the failure came first
  }
  SUBCASE("a bootstrap that takes device buffers") {
    fake::world w;
    run_ranks_with(w, 1, [&](int, const nccl_api& api, inproc_communicator& b) {
      nccl_communicator first(api, b, 0, {}, 10s);
      expect_throw<invalid_parameter_error>(0, [&] { nccl_communicator c(api, first, 0, {}, 10s); },
                                            {"construction on rank 0 of 1", "bootstrap", "device buffers"});
    });
  }
  SUBCASE("a table with a missing function") {
    fake::world w;
    nccl_api api = w.api();
    api.event_query = nullptr;
    inproc_world boot(1);
    auto b = boot.join(0);
    CHECK_THROWS_WITH_AS(nccl_communicator(api, b, 0, {}, 10s), doctest::Contains("null function"),
                         invalid_parameter_error);
  }
}

TEST_CASE("calls run on the caller's stream when one is passed" * doctest::timeout(30)) {
  fake::world w;
  run_ranks_with(w, 2, [&](int r, const nccl_api& api, inproc_communicator& b) {
    void* mine = nullptr;
    REQUIRE(api.stream_create(&mine) == 0);
    {
      nccl_options o;
      o.stream = mine;
      nccl_communicator c(api, b, r, o, 10s);
      CHECK(c.stream() == mine);
      void* other = nullptr;
      REQUIRE(api.stream_create(&other) == 0);
      double x = r;
      c.allreduce(&x, 1, dtype::f64, reduce_op::max, other, 10s);
      CHECK(x == 1.0);
      c.broadcast(&x, sizeof x, 0, other, 10s);
      api.stream_destroy(other);
    }
    api.stream_destroy(mine);  // the communicator did not destroy the caller's stream
  });
}
