// cadence/transport/engine/signature.hpp: the collective agreement record and its summary: what
// travels (six words, trivially copyable), how a call is named in errors, and the summary's
// lowest and highest arguments, checked against a brute-force oracle over random merge orders.
#include <cadence/transport/engine/signature.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence_signature_test {

namespace cd = cadence::transport::detail;
using cadence::transport::dtype;
using cadence::transport::reduce_op;

cd::collective_signature random_signature(std::mt19937_64& rng, std::int64_t index) {
  // Few values per field, so equal arguments and every tie-break come up often.
  const auto pick = [&](int n) { return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n)); };
  return {index, 1 + pick(2), pick(3), pick(2), pick(2), pick(2)};
}

TEST_CASE(
    "a signature is six 64-bit words and a summary two signatures and two ranks, trivially copyable: they travel as "
    "they are") {
  static_assert(std::is_trivially_copyable_v<cd::collective_signature>, "sent as bytes");
  static_assert(std::is_trivially_copyable_v<cd::collective_summary>, "sent as bytes");
  static_assert(sizeof(cd::collective_signature) == 48, "six words");
  static_assert(sizeof(cd::collective_summary) == 112, "two signatures and two ranks");
  static_assert(cd::collective_head_bytes == 160, "a message's head");
  CHECK(static_cast<int>(cd::collective_kind::allreduce) == 1);  // the values travel on the wire
  CHECK(static_cast<int>(cd::collective_kind::broadcast) == 2);
  CHECK(static_cast<int>(cd::collective_kind::construction) == 3);
  CHECK(static_cast<int>(cd::collective_kind::shutdown) == 4);
  CHECK(static_cast<int>(cd::collective_kind::allreduce_average) == 5);
}

TEST_CASE("describe() names every kind of collective as the error messages do") {
  CHECK(cd::collective_signature::allreduce(3, 16, dtype::f32, reduce_op::sum, false).describe() ==
        "allreduce(count 16, f32, sum)");
  CHECK(cd::collective_signature::allreduce(3, 7, dtype::i64, reduce_op::max, false).describe() ==
        "allreduce(count 7, i64, max)");
  CHECK(cd::collective_signature::allreduce(3, 16, dtype::f64, reduce_op::sum, true).describe() ==
        "allreduce_average(count 16, f64)");
  CHECK(cd::collective_signature::broadcast(3, 64, 2).describe() == "broadcast(64 bytes, root 2)");
  const cd::collective_signature hello{0, static_cast<std::int64_t>(cd::collective_kind::construction), 4, 0, 0, 0};
  CHECK(hello.describe() == "construction(size 4)");
  const cd::collective_signature bye{5, static_cast<std::int64_t>(cd::collective_kind::shutdown), 0, 0, 0, 0};
  CHECK(bye.describe() == "shutdown (destroyed its communicator)");
  CHECK(bye.is(cd::collective_kind::shutdown));
  const cd::collective_signature garbage{1, 99, 0, 0, 0, 0};
  CHECK(garbage.describe() == "an unknown collective (kind 99)");
}

TEST_CASE("signatures are equal when index and arguments are; same_arguments ignores the index") {
  const auto a = cd::collective_signature::allreduce(4, 10, dtype::f32, reduce_op::sum, false);
  auto b = a;
  CHECK(a == b);
  b.index = 5;
  CHECK(a != b);
  CHECK(a.same_arguments(b));
  for (int field = 1; field < 6; ++field) {
    auto c = a;
    switch (field) {
      case 1: c.kind = static_cast<std::int64_t>(cd::collective_kind::broadcast); break;
      case 2: c.count += 1; break;
      case 3: c.type += 1; break;
      case 4: c.op += 1; break;
      default: c.root += 1; break;
    }
    INFO("field " << field);
    CHECK(a != c);
    CHECK_FALSE(a.same_arguments(c));
  }
  // The average is another kind: a rank averaging and one summing do not agree.
  CHECK_FALSE(a.same_arguments(cd::collective_signature::allreduce(4, 10, dtype::f32, reduce_op::sum, true)));
}

TEST_CASE("arguments_differ names both ranks and their calls, and the other collective's index when it is another") {
  const auto ours = cd::collective_signature::allreduce(7, 16, dtype::f32, reduce_op::sum, false);
  const auto theirs = cd::collective_signature::allreduce(7, 8, dtype::f32, reduce_op::sum, false);
  CHECK(cd::arguments_differ(ours, 1, theirs, 3) ==
        "arguments differ across ranks in collective #7: rank 3 called allreduce(count 8, f32, sum), rank 1 called "
        "allreduce(count 16, f32, sum)");
  const auto later = cd::collective_signature::broadcast(8, 4, 0);
  CHECK(cd::arguments_differ(ours, 1, later, 0) ==
        "arguments differ across ranks in collective #7: rank 0 called broadcast(4 bytes, root 0) as collective #8, "
        "rank 1 called allreduce(count 16, f32, sum)");
}

TEST_CASE("arguments_before is a strict order whose ties are exactly the equal arguments") {
  std::mt19937_64 rng(5);
  std::vector<cd::collective_signature> v;
  for (int i = 0; i < 60; ++i) v.push_back(random_signature(rng, i));
  for (const auto& a : v)
    for (const auto& b : v) {
      CHECK_FALSE((a.arguments_before(b) && b.arguments_before(a)));
      CHECK((!a.arguments_before(b) && !b.arguments_before(a)) == a.same_arguments(b));
      for (const auto& c : v)
        if (a.arguments_before(b) && b.arguments_before(c)) CHECK(a.arguments_before(c));
    }
}

TEST_CASE(
    "merged in any order, a summary holds the lowest and highest arguments of every rank, and agrees only when all are "
    "equal") {
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    std::mt19937_64 rng(seed);
    const int n = 1 + static_cast<int>(seed % 9);
    std::vector<cd::collective_signature> sig;
    const auto common = random_signature(rng, 1);
    for (int r = 0; r < n; ++r) sig.push_back(rng() % 4 == 0 ? random_signature(rng, 1) : common);
    // Brute force: the lowest and highest by arguments_before.
    int lo = 0, hi = 0;
    for (int r = 1; r < n; ++r) {
      if (sig[static_cast<std::size_t>(r)].arguments_before(sig[static_cast<std::size_t>(lo)])) lo = r;
      if (sig[static_cast<std::size_t>(hi)].arguments_before(sig[static_cast<std::size_t>(r)])) hi = r;
    }
    bool all_same = true;
    for (const auto& s : sig) all_same = all_same && s.same_arguments(sig[0]);
    // A random merge tree, as the recursive doubling's exchanges make one.
    std::vector<cd::collective_summary> parts;
    for (int r = 0; r < n; ++r) parts.push_back(cd::collective_summary::of(sig[static_cast<std::size_t>(r)], r));
    while (parts.size() > 1) {
      const std::size_t i = rng() % parts.size();
      std::size_t j = rng() % parts.size();
      if (i == j) continue;
      parts[i].merge(parts[j]);
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(j));
    }
    const auto& s = parts[0];
    INFO("seed " << seed << ", n " << n);
    CHECK(s.lo.same_arguments(sig[static_cast<std::size_t>(lo)]));
    CHECK(s.hi.same_arguments(sig[static_cast<std::size_t>(hi)]));
    CHECK(s.lo.same_arguments(sig[static_cast<std::size_t>(s.lo_rank)]));  // the rank named called it
    CHECK(s.hi.same_arguments(sig[static_cast<std::size_t>(s.hi_rank)]));
    CHECK(s.agree() == all_same);
    if (!all_same) {
      const std::string d = s.disagreement(1);
      CHECK(d == "arguments differ across ranks in collective #1: rank " + std::to_string(s.lo_rank) + " called " +
                     s.lo.describe() + ", rank " + std::to_string(s.hi_rank) + " called " + s.hi.describe());
    }
  }
}

}  // namespace cadence_signature_test
