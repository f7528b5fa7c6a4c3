// cadence/exchange/local_sgd/schedule.hpp: each policy's plan against an oracle written from its
// rule (the `last` predictor, so rank p's k-th step after a sync is predicted to end at k times
// its last duration), hundreds of seeded records, the elastic form against elastic_planner, and
// the errors.
#include <cadence/exchange/local_sgd/schedule.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;

namespace schedule_test {
struct rank_state {
  std::int64_t steps = 0, carried = 0, contributes = 1;
  std::vector<std::int64_t> durations;
};

std::vector<std::int64_t> records_of(const outer_schedule& s, const std::vector<rank_state>& ranks,
                                     std::uint64_t hash = 0) {
  const std::size_t w = s.record_words();
  std::vector<std::int64_t> out(ranks.size() * w, 0);
  for (std::size_t p = 0; p < ranks.size(); ++p) {
    std::int64_t* r = out.data() + p * w;
    r[outer_record::steps] = ranks[p].steps;
    r[outer_record::carried] = ranks[p].carried;
    r[outer_record::contributes] = ranks[p].contributes;
    r[outer_record::hash] = static_cast<std::int64_t>(hash);
    r[outer_record::have] = static_cast<std::int64_t>(ranks[p].durations.size());
    std::copy(ranks[p].durations.begin(), ranks[p].durations.end(), r + outer_record::head);
  }
  return out;
}

// lag:H:s with `last`: the target is the slowest rank's H d; rank p runs H + r, r in [0, s] the
// first minimising |(H + r) d_p - target|.
std::vector<std::int64_t> lag_oracle(std::int64_t h, std::int64_t s, const std::vector<std::int64_t>& d) {
  std::int64_t target = 0;
  for (auto x : d) target = std::max(target, h * x);
  std::vector<std::int64_t> out;
  for (auto x : d) {
    std::int64_t best = 0, gap = INT64_MAX;
    for (std::int64_t r = 0; r <= s; ++r) {
      const std::int64_t g = std::llabs((h + r) * x - target);
      if (g < gap) {
        gap = g;
        best = r;
      }
    }
    out.push_back(h + best);
  }
  return out;
}

// quorum:K:H:grace:maxlag with `last`, by brute force over the ranks.
void quorum_oracle(std::int64_t k, std::int64_t h, std::int64_t grace_milli, std::int64_t max_lag,
                   const std::vector<rank_state>& ranks, std::vector<std::int64_t>& steps,
                   std::vector<std::uint8_t>& contributes) {
  const std::size_t n = ranks.size();
  std::vector<std::int64_t> rem(n), arr(n);
  std::int64_t forced = 0;
  for (std::size_t p = 0; p < n; ++p) {
    const std::int64_t progress = ranks[p].contributes ? 0 : ranks[p].steps;
    const std::int64_t carried = ranks[p].contributes ? 0 : ranks[p].carried + 1;
    rem[p] = std::max<std::int64_t>(1, h - progress);
    arr[p] = rem[p] * ranks[p].durations.back();
    if (carried >= max_lag) forced = std::max(forced, arr[p]);
  }
  auto sorted = arr;
  std::sort(sorted.begin(), sorted.end());
  std::int64_t close = std::max(sorted[static_cast<std::size_t>(std::min<std::int64_t>(k, static_cast<std::int64_t>(n))) - 1], forced);
  // close * (1 + grace), rounded down (long double holds these products exactly)
  const std::int64_t limit =
      close + static_cast<std::int64_t>(std::floor(static_cast<long double>(close) * grace_milli / 1000));
  for (auto a : arr)
    if (a <= limit) close = std::max(close, a);
  steps.assign(n, 0);
  contributes.assign(n, 1);
  for (std::size_t p = 0; p < n; ++p) {
    if (arr[p] <= close || rem[p] == 1) {
      steps[p] = rem[p];
      continue;
    }
    std::int64_t best = 1, gap = INT64_MAX;
    for (std::int64_t s = 1; s < rem[p]; ++s) {
      const std::int64_t g = std::llabs(s * ranks[p].durations.back() - close);
      if (g < gap) {
        gap = g;
        best = s;
      }
    }
    steps[p] = best;
    contributes[p] = 0;
  }
}
}  // namespace schedule_test
using namespace schedule_test;

TEST_CASE("fixed:H gives every rank H steps, all contributing, with no records needed") {
  outer_schedule s("fixed:20", 3);
  CHECK_FALSE(s.timed());
  const outer_plan p = s.first_plan();
  CHECK(p.steps == std::vector<std::int64_t>{20, 20, 20});
  CHECK(p.contributes == std::vector<std::uint8_t>{1, 1, 1});
  CHECK_FALSE(p.warmup);
  CHECK(s.config() == "fixed:20");
}

TEST_CASE("lag:H:s gives every rank at least H steps, a faster one up to H + s ending nearest the slowest" *
          doctest::timeout(60)) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng() % 6;
    const std::int64_t h = 1 + static_cast<std::int64_t>(rng() % 12), ext = static_cast<std::int64_t>(rng() % 10);
    outer_schedule s("lag:" + std::to_string(h) + ":" + std::to_string(ext), n);
    std::vector<rank_state> ranks(n);
    std::vector<std::int64_t> last;
    for (auto& r : ranks) {
      r.steps = h;
      r.durations = {static_cast<std::int64_t>(500 + rng() % 5000)};
      last.push_back(r.durations.back());
    }
    const outer_plan p = s.plan(records_of(s, ranks), 1);
    CHECK_FALSE(p.warmup);
    CHECK(p.steps == lag_oracle(h, ext, last));
    for (auto st : p.steps) CHECK((st >= h && st <= h + ext));
  }
}

TEST_CASE("quorum:K:H waits for the K earliest predicted arrivals and the grace window, and "
          "no rank carries its work more than max lag syncs" * doctest::timeout(60)) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t n = 1 + rng() % 6;
    const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % n), h = 2 + static_cast<std::int64_t>(rng() % 15);
    const std::int64_t grace = static_cast<std::int64_t>(rng() % 600), lag = static_cast<std::int64_t>(rng() % 4);
    const std::string g = std::to_string(grace / 1000) + "." + std::to_string(1000 + grace % 1000).substr(1);
    outer_schedule s("quorum:" + std::to_string(k) + ":" + std::to_string(h) + ":" + g + ":" + std::to_string(lag), n);
    CHECK(s.grace_milli() == grace);
    std::vector<rank_state> ranks(n);
    for (auto& r : ranks) {
      r.contributes = rng() % 3 == 0 ? 0 : 1;
      r.steps = r.contributes ? h : 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(h - 1));
      r.carried = r.contributes ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(std::max<std::int64_t>(lag, 1)));
      r.durations = {static_cast<std::int64_t>(1000 + rng() % 4000), static_cast<std::int64_t>(1000 + rng() % 4000)};
    }
    const outer_plan p = s.plan(records_of(s, ranks), 3);
    std::vector<std::int64_t> steps;
    std::vector<std::uint8_t> contributes;
    quorum_oracle(k, h, grace, lag, ranks, steps, contributes);
    CHECK(p.steps == steps);
    CHECK(p.contributes == contributes);
    std::size_t in = 0;
    for (std::size_t q = 0; q < n; ++q) {
      in += p.contributes[q];
      const std::int64_t carried = ranks[q].contributes ? 0 : ranks[q].carried + 1;
      if (carried >= lag) CHECK(p.contributes[q] == 1);  // max lag reached: waited for
      const std::int64_t progress = ranks[q].contributes ? 0 : ranks[q].steps;
      CHECK(progress + p.steps[q] <= h);                   // never more than H steps behind one contribution
    }
    CHECK(in >= static_cast<std::size_t>(k));
  }
}

TEST_CASE("a quorum of all ranks is a full sync every H steps") {
  outer_schedule s("quorum:3:10", 3);
  std::vector<rank_state> ranks(3);
  for (std::size_t p = 0; p < 3; ++p) {
    ranks[p].steps = 10;
    ranks[p].durations = {1000 * static_cast<std::int64_t>(p + 1)};
  }
  const outer_plan p = s.plan(records_of(s, ranks), 1);
  CHECK(p.steps == std::vector<std::int64_t>{10, 10, 10});
  CHECK(p.contributes == std::vector<std::uint8_t>{1, 1, 1});
}

TEST_CASE("a timed schedule warms up with its nominal steps until every rank has step times") {
  outer_schedule s("quorum:1:8:0:2:mean:3", 2);
  std::vector<rank_state> ranks(2);
  ranks[0].steps = ranks[1].steps = 8;
  ranks[0].durations = {100};
  const outer_plan p = s.plan(records_of(s, ranks), 1);
  CHECK(p.warmup);
  CHECK(p.steps == std::vector<std::int64_t>{8, 8});
  ranks[1].durations = {300, 300};
  ranks[0].durations = {100, 100};
  const outer_plan q = s.plan(records_of(s, ranks), 2);
  CHECK_FALSE(q.warmup);
  CHECK(q.steps == std::vector<std::int64_t>{8, 3});  // rank 1 late: nearest 800 us is 3 x 300
  CHECK(q.contributes == std::vector<std::uint8_t>{1, 0});
}

TEST_CASE("elastic:R plans exactly as elastic_planner on the same step times") {
  outer_schedule s("elastic:6", 3);
  elastic_planner e("elastic:6", 3);
  std::vector<rank_state> ranks(3);
  std::vector<std::int64_t> er(3 * e.record_words(), 0);
  for (std::size_t p = 0; p < 3; ++p) {
    ranks[p].steps = 1;
    ranks[p].durations = {1000 * static_cast<std::int64_t>(p + 1), 1100 * static_cast<std::int64_t>(p + 1)};
    er[p * e.record_words()] = 1;
    er[p * e.record_words() + 1] = 2;
    er[p * e.record_words() + 2] = ranks[p].durations[0];
    er[p * e.record_words() + 3] = ranks[p].durations[1];
  }
  const outer_plan p = s.plan(records_of(s, ranks), 4);
  const elastic_round r = e.plan(er, 4);
  CHECK(p.steps == r.steps);
  CHECK(p.predicted_us == r.predicted_barrier_us);
  CHECK(s.first_plan().steps == std::vector<std::int64_t>{1, 1, 1});
}

TEST_CASE("plans hash differently when anything in them or the config differs") {
  outer_schedule a("lag:4:2", 2), b("lag:4:3", 2);
  std::vector<rank_state> ranks(2);
  ranks[0].steps = ranks[1].steps = 4;
  ranks[0].durations = {100};
  ranks[1].durations = {300};
  const auto ra = records_of(a, ranks);
  CHECK(a.plan(ra, 1).hash != b.plan(ra, 1).hash);
  CHECK(a.plan(ra, 1).hash != a.plan(ra, 2).hash);
  CHECK(a.plan(ra, 1).hash == outer_schedule("lag:4:2", 2).plan(ra, 1).hash);
}

TEST_CASE("configs are canonical and bad ones are refused naming the config and the field") {
  CHECK(outer_schedule("quorum:3:20", 4).config() == "quorum:3:20:0.25:2:last");
  CHECK(outer_schedule("quorum:3:20:0.1:1:median:5", 4).config() == "quorum:3:20:0.1:1:median:5");
  CHECK(outer_schedule("lag:10:5", 4).config() == "lag:10:5:last");
  CHECK(outer_schedule("elastic:8", 4).config() == "elastic:8:last:fast");
  auto bad = [](const char* config, std::size_t n, const char* part) {
    try {
      (void)outer_schedule(config, n);
      FAIL("no error for " << config);
    } catch (const error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
      CHECK_MESSAGE(std::string(e.what()).find(config) != std::string::npos, e.what());
    }
  };
  bad("fixed:0", 2, "H must be >= 1");
  bad("fixed", 2, "expected fixed:<H>");
  bad("every:5", 2, "unknown schedule 'every'");
  bad("lag:5", 2, "expected lag:<H>:<s>");
  bad("quorum:0:5", 2, "K must be >= 1");
  bad("quorum:2:5:x", 2, "unknown predictor");
  bad("elastic:0", 2, "lookahead R must be >= 1");
  bad("fixed:5", 0, "needs at least one rank");
  outer_schedule s("lag:4:1", 2);
  CHECK_THROWS_AS(s.plan(std::vector<std::int64_t>(3, 0), 1), invalid_parameter_error);
}
