// cadence/controllers/elastic_planner.hpp: collective ElasticBSP's planning step on its own,
// on records written by hand (no transport). The averager that exchanges the records is
// tested in tests/exchange/elastic_averager_test.cpp.
#include <cadence/controllers/elastic_planner.hpp>
#include <cadence/zipline/brute_force.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using namespace cadence;

namespace {

// A rank's record: `since` steps since the barrier, then its durations (oldest first),
// 0-padded to `history`.
std::vector<std::int64_t> record(std::int64_t since, std::vector<std::int64_t> durations,
                                 std::size_t history) {
  std::vector<std::int64_t> r{since, static_cast<std::int64_t>(durations.size())};
  r.insert(r.end(), durations.begin(), durations.end());
  r.resize(history + 2, 0);
  return r;
}

std::vector<std::int64_t> records(const std::vector<std::vector<std::int64_t>>& per_rank) {
  std::vector<std::int64_t> all;
  for (const auto& r : per_rank) all.insert(all.end(), r.begin(), r.end());
  return all;
}

}  // namespace

// Code written when the planner lived in the exchange layer names it there.
static_assert(std::is_same_v<exchange::elastic_planner, elastic_planner>);
static_assert(std::is_same_v<exchange::elastic_round, elastic_round>);

TEST_CASE("the elastic planner gives a 3x faster rank 3 steps per step of the slow one") {
  elastic_planner planner("elastic:6", 2, 4);
  CHECK(planner.record_words() == 6);
  // Rank 0: 1 step since the barrier, durations 100 us; rank 1: 300 us.
  const std::vector<std::int64_t> records{1, 2, 100, 100, 0, 0, 1, 2, 300, 300, 0, 0};
  const elastic_round r = planner.plan(records, 5);
  CHECK_FALSE(r.warmup);
  CHECK(r.barrier == 5);
  CHECK(r.steps == std::vector<std::int64_t>{3, 1});  // both predicted to end at 300 us
  CHECK(r.predicted_barrier_us == 300);
  CHECK(r.predicted_spread_us == 0);
  // Identical inputs, identical plan and hash; any change changes the hash.
  elastic_planner other("elastic:6", 2, 4);
  CHECK(other.plan(records, 5).hash == r.hash);
  CHECK(other.plan(records, 6).hash != r.hash);
  elastic_planner longer("elastic:7", 2, 4);
  CHECK(longer.plan(records, 5).hash != r.hash);
  // Without history on one rank it stays BSP.
  const std::vector<std::int64_t> cold{1, 0, 0, 0, 0, 0, 1, 2, 300, 300, 0, 0};
  CHECK(planner.plan(cold, 1).warmup);
  CHECK_THROWS_AS(planner.plan(span<const std::int64_t>(records.data(), 5), 1), invalid_parameter_error);
}

TEST_CASE("the elastic planner's plan is ZipLine's answer on the predicted step ends") {
  // With the "last" predictor, rank p's k-th step after the barrier is predicted to end at
  // k times its latest duration: the oracle runs the brute-force ZipLine on those rows.
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 2 + rng() % 5, lookahead = 1 + rng() % 6, history = 4;
    elastic_planner planner("elastic:" + std::to_string(lookahead), n, history);
    std::vector<std::vector<std::int64_t>> per_rank;
    std::vector<std::int64_t> rows(n * lookahead);
    for (std::size_t p = 0; p < n; ++p) {
      const auto older = static_cast<std::int64_t>(1 + rng() % 1000);
      const auto latest = static_cast<std::int64_t>(1 + rng() % 1000);
      per_rank.push_back(record(1, {older, latest}, history));
      for (std::size_t k = 0; k < lookahead; ++k) rows[p * lookahead + k] = latest * static_cast<std::int64_t>(k + 1);
    }
    const elastic_round r = planner.plan(records(per_rank), 7);
    const zipline_result<std::int64_t> want =
        zipline_brute_force(rows_view<std::int64_t>::matrix(rows.data(), n, lookahead));
    REQUIRE_FALSE(r.warmup);
    CHECK(r.predicted_barrier_us == want.barrier);
    CHECK(r.predicted_spread_us == want.spread);
    for (std::size_t p = 0; p < n; ++p) {
      CHECK(r.steps[p] == static_cast<std::int64_t>(want.choice[p]) + 1);
      CHECK(r.steps[p] >= 1);
      CHECK(r.steps[p] <= static_cast<std::int64_t>(lookahead));
    }
  }
}

TEST_CASE("the elastic planner stays BSP until every rank recorded its warm-up steps") {
  elastic_planner planner("elastic:4:median:3", 2, 8, 5);
  CHECK(planner.warmup_steps() == 5);
  CHECK(planner.lookahead() == 4);
  CHECK(planner.history() == 8);
  CHECK(planner.ranks() == 2);
  const auto fast = record(1, {100, 100, 100, 100, 100}, 8);
  const auto short_history = record(1, {300, 300, 300, 300}, 8);
  const elastic_round cold = planner.plan(records({fast, short_history}), 3);
  CHECK(cold.warmup);
  CHECK(cold.steps == std::vector<std::int64_t>{1, 1});
  CHECK(cold.hash == planner.bsp_round(3).hash);
  const auto slow = record(1, {300, 300, 300, 300, 300}, 8);
  const elastic_round warm = planner.plan(records({fast, slow}), 4);
  CHECK_FALSE(warm.warmup);
  CHECK(warm.steps == std::vector<std::int64_t>{3, 1});
  // 0: what the predictor needs (every shipped one predicts from one duration), at least 1.
  CHECK(elastic_planner("elastic:4:median:3", 2).warmup_steps() == 1);
  CHECK(elastic_planner("elastic:4", 2, 16, 0).warmup_steps() == 1);
  CHECK(elastic_planner("elastic:4", 2, 16, 2).warmup_steps() == 2);
}

TEST_CASE("on one rank the elastic planner runs R local steps between barriers") {
  elastic_planner planner("elastic:5", 1, 2);
  const elastic_round r = planner.plan(record(1, {100, 120}, 2), 0);
  CHECK_FALSE(r.warmup);
  CHECK(r.steps == std::vector<std::int64_t>{5});
  CHECK(r.predicted_barrier_us == 600);  // five more steps of the latest 120 us
  CHECK(r.predicted_spread_us == 0);
}

TEST_CASE("records the predictor cannot read make the elastic planner fall back to BSP") {
  elastic_planner planner("elastic:3", 2, 2);
  // A negative duration sends rank 1's clock back in time: no prediction, one step each.
  const elastic_round r = planner.plan(records({record(1, {100, 100}, 2), record(1, {100, -50}, 2)}), 2);
  CHECK(r.warmup);
  CHECK(r.steps == std::vector<std::int64_t>{1, 1});
  CHECK(planner.fallbacks() == 1);
  CHECK(planner.plan(records({record(1, {100, 100}, 2), record(1, {100, 50}, 2)}), 3).steps ==
        std::vector<std::int64_t>{1, 2});
  CHECK(planner.fallbacks() == 1);
}

TEST_CASE("the elastic planner's hash takes the salt, and its config is canonical") {
  elastic_planner planner("elastic:6:ewma:0.5:opt", 3);
  CHECK(planner.config() == "elastic:6:ewma:0.5:opt");
  CHECK(elastic_planner("elastic:6", 3).config() == "elastic:6:last:fast");
  CHECK(planner.bsp_round(1, 0).hash != planner.bsp_round(1, 1).hash);
  CHECK(planner.bsp_round(1, 1).hash == planner.bsp_round(1, 1).hash);
  CHECK(planner.bsp_round(1).hash != planner.bsp_round(2).hash);
}

TEST_CASE("a bad config, rank count or history is refused, naming what was wrong") {
  const auto message = [](auto&& build) -> std::string {
    try {
      build();
    } catch (const error& e) {
      return e.what();
    }
    return "(no error)";
  };
  CHECK_THROWS_AS(elastic_planner("ssp:3", 2), parse_error);
  CHECK(message([] { elastic_planner("ssp:3", 2); }).find("'ssp:3'") != std::string::npos);
  CHECK_THROWS_AS(elastic_planner("elastic:0", 2), invalid_parameter_error);
  CHECK(message([] { elastic_planner("elastic:0", 2); }).find("lookahead R must be >= 1") != std::string::npos);
  CHECK(message([] { elastic_planner("elastic:4", 0); }).find("'elastic:4' for 0 workers") != std::string::npos);
  CHECK_THROWS_AS(elastic_planner("elastic:4:median:3:nope", 2), parse_error);
  CHECK(message([] { elastic_planner("elastic:4", 2, 1); }).find("history must be in [2, 1024], got 1") !=
        std::string::npos);
  CHECK_THROWS_AS(elastic_planner("elastic:4", 2, 1025), invalid_parameter_error);
  elastic_planner planner("elastic:2", 3, 2);
  const std::vector<std::int64_t> eleven(11, 1);
  CHECK(message([&] { planner.plan(eleven, 0); }).find("11 record words, expected 12") != std::string::npos);
}
