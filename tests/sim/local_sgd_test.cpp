// cadence/sim/local_sgd.hpp: the bytes each local-SGD scheme moves (against the ring's formula
// and the codec's sizes), the cost of a blocking exchange and the overlap that hides it (by
// hand, on steady ranks), a quorum against a fixed H with a 3x straggler, and bad input.
#include <cadence/sim/local_sgd.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace cadence;
using namespace cadence::sim;

namespace local_sgd_sim_test {

// n ranks of 0.1 s steps (the last `slow` times slower), no jitter; `iterations` steps each
// when > 0, else 60 s.
scenario steady(std::size_t n, double slow = 1.0, std::uint64_t iterations = 0) {
  scenario s;
  s.name = "steady";
  worker_model w;
  w.iteration_seconds = 0.1;
  s.workers.assign(n, w);
  s.workers.back().iteration_seconds = 0.1 * slow;
  if (iterations > 0) {
    s.seconds = 0;
    s.iterations = iterations;
  } else {
    s.seconds = 60;
  }
  return s;
}

}  // namespace local_sgd_sim_test
using namespace local_sgd_sim_test;

TEST_CASE("fixed:H moves H times fewer bytes than an every-step exchange, each a ring of the model") {
  local_sgd_sim_options o;
  o.parameters = 1000;
  const auto every = simulate_local_sgd("fixed:1,outer=sgd:1", steady(4, 1.0, 100), o);
  const auto h20 = simulate_local_sgd("fixed:20", steady(4, 1.0, 100), o);
  CHECK(every.syncs == 100);
  CHECK(h20.syncs == 5);
  // A ring all-reduce of 4000 bytes over 4 ranks sends 2 (n - 1) / n of them: 6000.
  CHECK(every.bytes_per_worker == 100u * 6000u);
  CHECK(h20.bytes_per_worker == 5u * 6000u);
  CHECK(every.steps == 400);
  CHECK(h20.steps == 400);
  CHECK(h20.config == "fixed:20");
}

TEST_CASE("int4 outer gradients move about an eighth of f32's bytes, plus a scale per 128 elements") {
  local_sgd_sim_options o;
  o.parameters = 128 * 1000;
  const auto f32 = simulate_local_sgd("fixed:10", steady(4, 1.0, 50), o);
  const auto int4 = simulate_local_sgd("fixed:10,codec=int4", steady(4, 1.0, 50), o);
  const auto bf16 = simulate_local_sgd("fixed:10,codec=bf16", steady(4, 1.0, 50), o);
  CHECK(bf16.bytes_per_worker * 2 == f32.bytes_per_worker);
  const double r = static_cast<double>(int4.bytes_per_worker) / static_cast<double>(f32.bytes_per_worker);
  CHECK(r > 0.125);
  CHECK(r < 0.125 + 4.0 / (128 * 4) + 1e-3);
}

TEST_CASE("a blocking fragment exchange idles every rank for the ring's time; a delay of 2 steps hides it") {
  local_sgd_sim_options o;
  o.parameters = 4000000;
  o.bytes_per_second = 1e9;
  o.latency_seconds = 0;
  const auto blocking = simulate_local_sgd("fixed:20,fragments=4", steady(4, 1.0, 40), o);
  const auto overlapped = simulate_local_sgd("fixed:20,fragments=4,delay=2", steady(4, 1.0, 40), o);
  // A fragment of 1e6 floats: 6 ring steps of 1 MB at 1 GB/s = 6 ms, below two 0.1 s steps.
  const double cost = 6 * (4e6 / 4.0) / 1e9;
  CHECK(blocking.syncs == 8);
  CHECK(blocking.idle_seconds == doctest::Approx(8 * 4 * cost));
  CHECK(overlapped.syncs == 8);
  CHECK(overlapped.idle_seconds == 0.0);
  CHECK(overlapped.bytes_per_worker == blocking.bytes_per_worker);
}

TEST_CASE("with a 3x straggler a quorum of 3 of 4 runs more inner steps than fixed H, its late work counted later") {
  local_sgd_sim_options o;
  o.parameters = 1000;
  const auto fixed = simulate_local_sgd("fixed:20", steady(4, 3.0), o);
  const auto quorum = simulate_local_sgd("quorum:3:20", steady(4, 3.0), o);
  const auto elastic = simulate_local_sgd("elastic:20", steady(4, 3.0), o);
  CHECK(fixed.stale_contributions == 0);
  CHECK(quorum.stale_contributions > 0);
  CHECK(quorum.steps_per_second > 1.5 * fixed.steps_per_second);
  CHECK(quorum.idle_fraction < fixed.idle_fraction);
  CHECK(elastic.steps_per_second > fixed.steps_per_second);
  CHECK(quorum.config == "quorum:3:20:0.25:2:last");
}

TEST_CASE("a bad config or network is refused naming what is wrong") {
  CHECK_THROWS_WITH_AS(simulate_local_sgd("fixed:0", steady(2)), doctest::Contains("H must be >= 1"),
                       invalid_parameter_error);
  CHECK_THROWS_WITH_AS(simulate_local_sgd("quorum:2:10,fragments=2", steady(2)),
                       doctest::Contains("need the fixed schedule"), invalid_parameter_error);
  CHECK_THROWS_AS(simulate_local_sgd("sometimes", steady(2)), parse_error);
  local_sgd_sim_options o;
  o.link_scale = {1.0};
  CHECK_THROWS_WITH_AS(simulate_local_sgd("fixed:5", steady(2), o), doctest::Contains("one per worker (2)"),
                       invalid_parameter_error);
}
