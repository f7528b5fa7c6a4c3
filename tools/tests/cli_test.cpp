// cli.hpp: command-line numbers are parsed strictly, every error names the flag and says the
// rule it broke, and flags that exclude each other are rejected together.
#include "cli.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

TEST_CASE("flag integers parse within bounds and otherwise say which bound they broke") {
  using cadence::tools::parse_flag_integer;
  using cadence::tools::usage_error;
  CHECK(parse_flag_integer<int>("--lookahead", "15", 1, 100) == 15);
  CHECK_THROWS_WITH_AS(parse_flag_integer<int>("--lookahead", "0", 1, 100),
                       "--lookahead: must be at least 1, got 0", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_integer<int>("--lookahead", "0", 1, 100, "R"),
                       "--lookahead: R must be at least 1, got 0", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_integer<int>("--repeat", "101", 1, 100),
                       "--repeat: must be at most 100, got 101", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_integer<int>("--repeat", "3x", 1, 100),
                       "--repeat: '3x' is not an integer", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_integer<int>("--repeat", "", 1, 100),
                       "--repeat: '' is not an integer", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_integer<int>("--repeat", "-1", 1, 100),
                       "--repeat: must be at least 1, got -1", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_integer<int>("--repeat", "-99999999999999999999", 1, 100),
                       "--repeat: must be at least 1, got -99999999999999999999", usage_error);
}

TEST_CASE("unsigned flag integers call a negative number too small, not malformed") {
  using cadence::tools::parse_flag_integer;
  CHECK_THROWS_WITH_AS(parse_flag_integer<std::uint64_t>("--seed", "-1", 0, 10),
                       "--seed: must be at least 0, got -1", cadence::tools::usage_error);
  CHECK(parse_flag_integer<std::uint64_t>("--seed", "-0", 0, 10) == 0);
  CHECK_THROWS_WITH_AS(parse_flag_integer<std::uint64_t>("--seed", "99999999999999999999", 0, 10),
                       "--seed: must be at most 10, got 99999999999999999999",
                       cadence::tools::usage_error);
  CHECK(parse_flag_integer<std::uint64_t>("--seed", "18446744073709551615", 0, UINT64_MAX) ==
        UINT64_MAX);
  CHECK_THROWS_WITH_AS(parse_flag_integer<std::uint64_t>("--seed", "-", 0, 10),
                       "--seed: '-' is not an integer", cadence::tools::usage_error);
}

TEST_CASE("flag pairs need exactly one comma and name the part that is wrong") {
  using cadence::tools::parse_flag_pair;
  using cadence::tools::usage_error;
  CHECK(parse_flag_pair<long>("--generate", "100,15", 1, 1000) == std::pair<long, long>{100, 15});
  CHECK_THROWS_WITH_AS(parse_flag_pair<long>("--generate", "100", 1, 1000),
                       "--generate: expected 'A,B' (two integers), got '100'", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_pair<long>("--generate", "100", 1, 1000, "N", "T"),
                       "--generate: expected 'N,T' (two integers), got '100'", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_pair<long>("--interval", "1,2,3", 1, 1000, "LO", "HI"),
                       "--interval: expected 'LO,HI' (two integers), got '1,2,3'", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_pair<long>("--interval", "5,x", 1, 1000),
                       "--interval: 'x' is not an integer", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_pair<long>("--interval", "5,0", 1, 1000, "LO", "HI"),
                       "--interval: HI must be at least 1, got 0", usage_error);
  const auto [n, t] = cadence::tools::split_flag_pair("--generate", "7,x", "N", "T");
  CHECK(n == "7");
  CHECK(t == "x");
}

namespace {
struct argv_builder {
  std::vector<std::string> words;
  std::vector<char*> ptrs;
  explicit argv_builder(std::initializer_list<const char*> w) : words(w.begin(), w.end()) {
    for (auto& s : words) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
};
}  // namespace

TEST_CASE("flag_reader takes '--flag value' and '--flag=value' and names the flag in errors") {
  argv_builder a{"tool", "--seed", "7", "--seconds=2.5", "--json", "--bogus"};
  cadence::tools::flag_reader args(a.argc(), a.argv());
  REQUIRE(args.next());
  CHECK(args.flag() == "--seed");
  CHECK(args.value() == "7");
  REQUIRE(args.next());
  CHECK(args.flag() == "--seconds");
  CHECK(cadence::tools::parse_flag_real(args.flag(), args.value()) == 2.5);
  REQUIRE(args.next());
  CHECK(args.flag() == "--json");
  CHECK_NOTHROW(args.no_value());
  REQUIRE(args.next());
  CHECK_THROWS_WITH_AS(args.unknown(), "unknown option '--bogus' (see --help)", cadence::tools::usage_error);
  CHECK_FALSE(args.next());

  argv_builder b{"tool", "--json=1", "--seed"};
  cadence::tools::flag_reader more(b.argc(), b.argv());
  REQUIRE(more.next());
  CHECK_THROWS_WITH(more.no_value(), "--json: takes no value");
  REQUIRE(more.next());
  CHECK_THROWS_WITH(more.value(), "--seed: missing value");
}

TEST_CASE("flag_reader returns the same value when asked twice instead of taking the next argument") {
  argv_builder a{"tool", "--interval", "5,3", "--generate", "2,2"};
  cadence::tools::flag_reader args(a.argc(), a.argv());
  REQUIRE(args.next());
  CHECK(args.value() == "5,3");
  CHECK(args.value() == "5,3");
  REQUIRE(args.next());
  CHECK(args.flag() == "--generate");
}

namespace {
// Reads every flag of `words` (values after '=') under the groups `setup` declares.
template <class Setup>
void read_all(std::initializer_list<const char*> words, Setup setup) {
  argv_builder a(words);
  cadence::tools::flag_reader args(a.argc(), a.argv());
  setup(args);
  while (args.next()) {
  }
}
}  // namespace

TEST_CASE("flags of one at_most_one_of group are rejected together, naming both in order") {
  const auto formats = [](cadence::tools::flag_reader& r) { r.at_most_one_of({"--json", "--csv"}); };
  CHECK_NOTHROW(read_all({"tool", "--json", "--seed=1"}, formats));
  CHECK_NOTHROW(read_all({"tool", "--csv"}, formats));
  CHECK_THROWS_WITH_AS(read_all({"tool", "--json", "--seed=1", "--csv"}, formats),
                       "--csv: cannot be combined with --json", cadence::tools::usage_error);
  CHECK_THROWS_WITH_AS(read_all({"tool", "--csv", "--json"}, formats),
                       "--json: cannot be combined with --csv", cadence::tools::usage_error);
  CHECK_THROWS_WITH_AS(read_all({"tool", "--json", "--json"}, formats), "--json: given twice",
                       cadence::tools::usage_error);
}

TEST_CASE("a group of three or more lists its flags, and at_most_once forbids repeats only") {
  const auto sources = [](cadence::tools::flag_reader& r) {
    r.at_most_one_of({"--input", "--predicted", "--generate"}).at_most_once({"--seed", "--repeat"});
  };
  CHECK_THROWS_WITH_AS(read_all({"tool", "--input=a", "--generate=2,2"}, sources),
                       "--generate: cannot be combined with --input (give at most one of --input, "
                       "--predicted, --generate)",
                       cadence::tools::usage_error);
  CHECK_NOTHROW(read_all({"tool", "--seed=1", "--repeat=2", "--input=a"}, sources));
  CHECK_THROWS_WITH_AS(read_all({"tool", "--repeat=1", "--seed=1", "--repeat=2"}, sources),
                       "--repeat: given twice", cadence::tools::usage_error);
}

TEST_CASE("flag_reader tells which flags were given") {
  argv_builder a{"tool", "--seed=3", "--json"};
  cadence::tools::flag_reader args(a.argc(), a.argv());
  CHECK_FALSE(args.given("--seed"));
  REQUIRE(args.next());
  CHECK(args.given("--seed"));
  CHECK_FALSE(args.given("--json"));
  REQUIRE(args.next());
  CHECK(args.given("--json"));
  CHECK_FALSE(args.given("3"));
}

TEST_CASE("real flag values must be finite and positive, or non-negative when zero is allowed") {
  using cadence::tools::parse_flag_real;
  using cadence::tools::usage_error;
  CHECK(parse_flag_real("--lr", "0.005") == 0.005);
  CHECK_THROWS_WITH_AS(parse_flag_real("--lr", "0"), "--lr: expected a number > 0, got '0'",
                       usage_error);
  CHECK(parse_flag_real("--push-cost", "0", true) == 0.0);
  CHECK_THROWS_WITH_AS(parse_flag_real("--push-cost", "-1", true),
                       "--push-cost: expected a number >= 0, got '-1'", usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_real("--lr", "nan"), "--lr: expected a finite number > 0, got 'nan'",
                       usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_real("--lr", "inf"), "--lr: expected a finite number > 0, got 'inf'",
                       usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_real("--lr", "1x"), "--lr: expected a number > 0, got '1x'",
                       usage_error);
  CHECK_THROWS_AS(parse_flag_real("--lr", ""), usage_error);
}

TEST_CASE("real flag values above their bound say the bound") {
  using cadence::tools::parse_flag_real;
  CHECK(parse_flag_real("--seconds", "1e12") == 1e12);
  CHECK_THROWS_WITH_AS(parse_flag_real("--seconds", "2e12"), "--seconds: must be at most 1e+12, got 2e12",
                       cadence::tools::usage_error);
  CHECK_THROWS_WITH_AS(parse_flag_real("--lr", "10", false, 2.5), "--lr: must be at most 2.5, got 10",
                       cadence::tools::usage_error);
}

namespace {
struct throwing_run {
  const char* what;
  int operator()(int, char**) const {
    if (what[0] == 'u') throw cadence::tools::usage_error(what);
    throw cadence::parse_error(what);
  }
};
}  // namespace

TEST_CASE("guarded_main exits 2 for a bad command line and 1 for bad input data") {
  CHECK(cadence::tools::guarded_main("tool", [](int, char**) { return 0; }, 0, nullptr) == 0);
  CHECK(cadence::tools::guarded_main("tool", throwing_run{"usage"}, 0, nullptr) == 2);
  CHECK(cadence::tools::guarded_main("tool", throwing_run{"file.txt:3: bad"}, 0, nullptr) == 1);
}
