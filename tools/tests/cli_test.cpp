// io/cli.hpp: command-line numbers are parsed strictly and every error names the flag.
#include "cli.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

TEST_CASE("flag integers parse within range and name the flag when they do not") {
  CHECK(cadence::tools::parse_flag_integer<int>("--lookahead", "15", 1, 100) == 15);
  CHECK_THROWS_WITH_AS(cadence::tools::parse_flag_integer<int>("--lookahead", "0", 1, 100),
                       "--lookahead: 0 is out of range [1, 100]", cadence::parse_error);
  CHECK_THROWS_WITH_AS(cadence::tools::parse_flag_integer<int>("--repeat", "3x", 1, 100),
                       "--repeat: '3x' is not an integer", cadence::parse_error);
  CHECK_THROWS_AS(cadence::tools::parse_flag_integer<int>("--repeat", "", 1, 100), cadence::parse_error);
  CHECK_THROWS_AS(cadence::tools::parse_flag_integer<int>("--repeat", "-1", 1, 100), cadence::parse_error);
  CHECK_THROWS_WITH_AS(
      cadence::tools::parse_flag_integer<std::uint64_t>("--seed", "99999999999999999999", 0, 10),
      doctest::Contains("--seed: 99999999999999999999 is out of range"), cadence::parse_error);
  CHECK(cadence::tools::parse_flag_integer<std::uint64_t>("--seed", "18446744073709551615", 0,
                                                   UINT64_MAX) == UINT64_MAX);
}

TEST_CASE("flag pairs need a comma and two valid integers") {
  CHECK(cadence::tools::parse_flag_pair<long>("--generate", "100,15", 1, 1000) == std::pair<long, long>{100, 15});
  CHECK_THROWS_WITH_AS(cadence::tools::parse_flag_pair<long>("--generate", "100", 1, 1000),
                       "--generate: expected two integers 'A,B', got '100'", cadence::parse_error);
  CHECK_THROWS_WITH_AS(cadence::tools::parse_flag_pair<long>("--interval", "5,x", 1, 1000),
                       "--interval: 'x' is not an integer", cadence::parse_error);
  CHECK_THROWS_AS(cadence::tools::parse_flag_pair<long>("--interval", "1,2,3", 1, 1000), cadence::parse_error);
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

TEST_CASE("real flag values must be finite and positive, or non-negative when zero is allowed") {
  CHECK(cadence::tools::parse_flag_real("--lr", "0.005") == 0.005);
  CHECK_THROWS_WITH_AS(cadence::tools::parse_flag_real("--lr", "0"), "--lr: expected a number > 0, got '0'",
                       cadence::parse_error);
  CHECK(cadence::tools::parse_flag_real("--push-cost", "0", true) == 0.0);
  CHECK_THROWS_WITH(cadence::tools::parse_flag_real("--push-cost", "-1", true),
                    "--push-cost: expected a number >= 0, got '-1'");
  CHECK_THROWS(cadence::tools::parse_flag_real("--lr", "nan"));
  CHECK_THROWS(cadence::tools::parse_flag_real("--lr", "inf"));
  CHECK_THROWS(cadence::tools::parse_flag_real("--lr", "1x"));
  CHECK_THROWS(cadence::tools::parse_flag_real("--lr", ""));
}
