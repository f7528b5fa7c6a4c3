// cadence/exchange/bucketed_allreducer.hpp over in-process ranks: the shared suite
// (exchange/collective_suite.hpp; the backends run it too) and how tensors are bucketed.
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/transport/inproc.hpp>

#include "exchange/inproc_suites.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace cadence::exchange;
using namespace std::chrono_literals;

CADENCE_INPROC_EXCHANGE_SUITE(CADENCE_BUCKETED_ALLREDUCER_SUITE);

TEST_CASE("the bucketed all-reducer fuses small tensors and leaves big ones alone" * doctest::timeout(30)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    bucketed_allreducer_options o;
    o.bucket_bytes = 100;
    bucketed_allreducer<inproc_communicator> red(c, o);
    std::vector<float> a(10), b(10), big(1000), d(5);
    std::vector<double> e(3);
    red.add(a);
    red.add(b);
    red.add(big);
    red.add(d);
    red.add(e);
    // a+b (80 bytes) fused; big alone; d (f32) and e (f64) split by dtype.
    CHECK(red.buckets() == 4);
  });
}

namespace {
// Polls until every launched bucket has completed; the limit only catches a hang.
template <class R>
bool poll_until_done(R& red) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!red.poll())
    if (std::chrono::steady_clock::now() > until) return false;
  return true;
}

// Options with buckets of `bucket_bytes`, and a timeout that only catches a hang.
bucketed_allreducer_options timed(std::size_t bucket_bytes) {
  bucketed_allreducer_options o;
  o.bucket_bytes = bucket_bytes;
  o.timeout = 30s;
  return o;
}

// Three float tensors of n values, registered with `red` as tensors 0, 1 and 2 (a, b, d). On rank
// r they hold 2r, 4r and 6r, so over two ranks their averages are 1, 2 and 3.
struct three_tensors {
  std::vector<float> a, b, d;

  template <class R>
  three_tensors(R& red, std::size_t n, int r)
      : a(n, static_cast<float>(2 * r)), b(n, static_cast<float>(4 * r)), d(n, static_cast<float>(6 * r)) {
    // Room past each tensor, so that no allocator places the next one where it ends (a
    // size-class allocator, ThreadSanitizer's, did: the three were then one adjacent bucket).
    for (std::vector<float>* v : {&a, &b, &d}) v->reserve(n + 16);
    red.add(a);
    red.add(b);
    red.add(d);
  }
  three_tensors(const three_tensors&) = delete;  // the reducer holds pointers to a, b and d
  three_tensors& operator=(const three_tensors&) = delete;

  // Every tensor holds the average over two ranks.
  void check_averaged() const {
    CHECK(a == std::vector<float>(a.size(), 1.0f));
    CHECK(b == std::vector<float>(b.size(), 2.0f));
    CHECK(d == std::vector<float>(d.size(), 3.0f));
  }
};
}  // namespace

TEST_CASE("buckets go in reverse registration order, as DDP's reducer: the last tensors first" *
          doctest::timeout(30)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    bucketed_allreducer_options o;
    o.bucket_bytes = 64;
    bucketed_allreducer<inproc_communicator> red(c, o);
    std::vector<float> a(16), b(8), e, d(8);
    red.add(a);  // 64 bytes: alone
    red.add(b);  // 32 bytes, with d (e is empty and joins no bucket)
    red.add(e);
    red.add(d);
    CHECK(red.buckets() == 2);
    CHECK(red.bucket_of(3) == 0);
    CHECK(red.bucket_of(1) == 0);
    CHECK(red.bucket_of(0) == 1);
    CHECK(red.bucket_of(2) == static_cast<std::size_t>(-1));
  });
}

TEST_CASE("a bucket's all-reduce runs while backward goes on: it completes on every rank before "
          "the earlier tensors are marked ready" * doctest::timeout(60)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    bucketed_allreducer<inproc_communicator> red(c, timed(64));  // 16 floats: one tensor per bucket
    const int r = c.rank();
    three_tensors t(red, 16, r);
    auto& [a, b, d] = t;
    REQUIRE(red.buckets() == 3);
    CHECK(red.launched() == 0);
    red.mark_ready(2);  // the last tensor: bucket 0 starts
    CHECK(red.launched() == 1);
    // Bucket 0 can only complete once every rank has launched it; a and b are still unmarked on
    // both ranks (each waits here before marking them), so its all-reduce overlapped the rest.
    CHECK(poll_until_done(red));
    CHECK(d == std::vector<float>(16, 3.0f));  // the mean of 0 and 6, in before a and b are ready
    CHECK(a == std::vector<float>(16, static_cast<float>(2 * r)));  // untouched so far
    red.mark_ready(1);
    CHECK(red.launched() == 2);
    red.mark_ready(0);
    red.finish();
    t.check_averaged();
    CHECK(red.launched() == 0);  // the step is over
  });
}

TEST_CASE("a ready bucket waits for the lower buckets, so every rank issues the all-reduces in "
          "the same order whatever order its gradients come in" * doctest::timeout(60)) {
  inproc_world world(3);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    bucketed_allreducer<inproc_communicator> red(c, timed(32));  // 8 doubles: one tensor per bucket
    std::vector<std::vector<double>> t(5, std::vector<double>(4));
    for (auto& v : t) red.add(v);
    for (int step = 0; step < 3; ++step) {
      for (std::size_t k = 0; k < t.size(); ++k)
        std::fill(t[k].begin(), t[k].end(), static_cast<double>(3 * (c.rank() + static_cast<int>(k) + step)));
      // Rank r marks in its own order; rank 0 starts with the first tensor (the last bucket).
      std::vector<std::size_t> order = {0, 4, 2, 3, 1};
      std::rotate(order.begin(), order.begin() + c.rank(), order.end());
      for (std::size_t i : order) red.mark_ready(i);
      CHECK(red.launched() == t.size());  // every bucket went once its lower ones had
      red.finish();
      for (std::size_t k = 0; k < t.size(); ++k)
        CHECK(t[k] == std::vector<double>(4, static_cast<double>(3 * (1 + static_cast<int>(k) + step))));
    }
  });
}

TEST_CASE("launched buckets are a prefix in bucket order" * doctest::timeout(30)) {
  inproc_world world(1);
  auto c = world.join(0);
  bucketed_allreducer_options o;
  o.bucket_bytes = 16;
  bucketed_allreducer<inproc_communicator> red(c, o);
  std::vector<float> t0(4), t1(4), t2(4);
  red.add(t0);
  red.add(t1);
  red.add(t2);
  red.mark_ready(0);  // bucket 2: waits for buckets 0 and 1
  CHECK(red.launched() == 0);
  red.mark_ready(2);  // bucket 0
  CHECK(red.launched() == 1);
  red.mark_ready(1);  // bucket 1, then bucket 2 behind it
  CHECK(red.launched() == 3);
  red.finish();
}

TEST_CASE("tensors that lie back to back are reduced in place, without a fusion copy" * doctest::timeout(30)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    // One float past the 100 registered, so that no other allocation (apart) can begin where
    // the registered part ends and be taken as adjacent.
    std::vector<float> flat(101);
    for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(2 * c.rank() + static_cast<int>(i));
    std::vector<float> apart(10, static_cast<float>(2 * c.rank()));
    bucketed_allreducer<inproc_communicator> red(c);
    red.add(flat.data(), 30);
    red.add(flat.data() + 30, 70);
    CHECK(red.in_place_buckets() == 1);
    red.add(apart);  // not adjacent to the others: their bucket now needs a fusion buffer
    CHECK(red.buckets() == 1);
    CHECK(red.in_place_buckets() == 0);
    bucketed_allreducer<inproc_communicator> flat_only(c);
    flat_only.add(flat.data(), 30);
    flat_only.add(flat.data() + 30, 70);
    flat_only.average();
    for (std::size_t i = 0; i < 100; ++i) CHECK(flat[i] == static_cast<float>(1 + static_cast<int>(i)));
    CHECK(flat[100] == static_cast<float>(2 * c.rank() + 100));  // not registered: untouched
    red.average();
    CHECK(apart == std::vector<float>(10, 1.0f));
  });
}

TEST_CASE("marking a tensor twice, or one that does not exist, is refused; so is add() during a step" *
          doctest::timeout(30)) {
  inproc_world world(1);
  auto c = world.join(0);
  bucketed_allreducer<inproc_communicator> red(c);
  std::vector<float> a(4), b(4);
  red.add(a);
  red.add(b);
  red.mark_ready(1);
  CHECK_THROWS_WITH_AS(red.mark_ready(1), doctest::Contains("already marked"), invalid_parameter_error);
  CHECK_THROWS_WITH_AS(red.mark_ready(2), doctest::Contains("mark_ready(2)"), invalid_parameter_error);
  CHECK_THROWS_WITH_AS(red.add(a), doctest::Contains("during a step"), invalid_parameter_error);
  red.finish();
  red.mark_ready(1);  // a new step
  red.finish();
  CHECK_FALSE(c.failed());
}

TEST_CASE("a copying bucket goes in parts: a part's all-reduce starts once the tensors that fill "
          "it are marked, and completes before the rest of its bucket is marked" * doctest::timeout(60)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    bucketed_allreducer_options o = timed(1024);
    o.part_bytes = 40;  // 10 floats
    bucketed_allreducer<inproc_communicator> red(c, o);
    const int r = c.rank();
    // 12 floats in three separate allocations: one bucket of 48 bytes, copied, cut into parts
    // [40, 48) (launched first) and [0, 40).
    three_tensors t(red, 4, r);
    auto& [a, b, d] = t;
    REQUIRE(red.buckets() == 1);
    REQUIRE(red.in_place_buckets() == 0);
    CHECK(red.allreduces() == 2);
    red.mark_ready(2);  // d fills bytes [32, 48): part [40, 48) is ready, [0, 40) waits for a and b
    CHECK(red.launched() == 0);  // a bucket counts once all its parts went
    CHECK(poll_until_done(red));
    // The last two floats of d are averaged (the part that went), the first two not yet.
    CHECK(d == std::vector<float>{static_cast<float>(6 * r), static_cast<float>(6 * r), 3.0f, 3.0f});
    CHECK(a == std::vector<float>(4, static_cast<float>(2 * r)));
    red.mark_ready(1);
    red.mark_ready(0);
    CHECK(red.launched() == 1);
    red.finish();
    t.check_averaged();
    // part_bytes 0: one all-reduce for the bucket; in place: one whatever part_bytes says.
    o.part_bytes = 0;
    bucketed_allreducer<inproc_communicator> whole(c, o);
    whole.add(a);
    whole.add(b);
    CHECK(whole.allreduces() == 1);
    o.part_bytes = 4;
    bucketed_allreducer<inproc_communicator> views(c, o);
    for (int k = 0; k < 3; ++k) (void)views.add_view<float>(5);
    CHECK(views.in_place_buckets() == 1);
    CHECK(views.allreduces() == 1);
  });
}

TEST_CASE("a copied tensor is read when it is marked ready: what is written to it afterwards is "
          "overwritten by the average of what it held then" * doctest::timeout(30)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    bucketed_allreducer_options o;
    o.timeout = 30s;
    bucketed_allreducer<inproc_communicator> red(c, o);
    std::vector<float> a(100, static_cast<float>(2 * c.rank())), b(7, static_cast<float>(4 * c.rank()));
    a.reserve(116);  // room past a: b cannot begin where a ends (three_tensors says why)
    red.add(a);
    red.add(b);
    REQUIRE(red.in_place_buckets() == 0);
    red.mark_ready(1);
    red.mark_ready(0);
    std::fill(b.begin(), b.end(), -1000.0f);  // a misuse: the gradient changes after mark_ready
    red.finish();
    CHECK(a == std::vector<float>(100, 1.0f));
    CHECK(b == std::vector<float>(7, 2.0f));
  });
}
