// io/cli.hpp: command-line numbers are parsed strictly and every error names the flag.
#include <cadence/io/cli.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <utility>

TEST_CASE("flag integers parse within range and name the flag when they do not") {
  CHECK(cadence::parse_flag_integer<int>("--lookahead", "15", 1, 100) == 15);
  CHECK_THROWS_WITH_AS(cadence::parse_flag_integer<int>("--lookahead", "0", 1, 100),
                       "--lookahead: 0 is out of range [1, 100]", cadence::parse_error);
  CHECK_THROWS_WITH_AS(cadence::parse_flag_integer<int>("--repeat", "3x", 1, 100),
                       "--repeat: '3x' is not an integer", cadence::parse_error);
  CHECK_THROWS_AS(cadence::parse_flag_integer<int>("--repeat", "", 1, 100), cadence::parse_error);
  CHECK_THROWS_AS(cadence::parse_flag_integer<int>("--repeat", "-1", 1, 100), cadence::parse_error);
  CHECK_THROWS_WITH_AS(
      cadence::parse_flag_integer<std::uint64_t>("--seed", "99999999999999999999", 0, 10),
      doctest::Contains("--seed: 99999999999999999999 is out of range"), cadence::parse_error);
  CHECK(cadence::parse_flag_integer<std::uint64_t>("--seed", "18446744073709551615", 0,
                                                   UINT64_MAX) == UINT64_MAX);
}

TEST_CASE("flag pairs need a comma and two valid integers") {
  CHECK(cadence::parse_flag_pair<long>("--generate", "100,15", 1, 1000) == std::pair<long, long>{100, 15});
  CHECK_THROWS_WITH_AS(cadence::parse_flag_pair<long>("--generate", "100", 1, 1000),
                       "--generate: expected two integers 'A,B', got '100'", cadence::parse_error);
  CHECK_THROWS_WITH_AS(cadence::parse_flag_pair<long>("--interval", "5,x", 1, 1000),
                       "--interval: 'x' is not an integer", cadence::parse_error);
  CHECK_THROWS_AS(cadence::parse_flag_pair<long>("--interval", "1,2,3", 1, 1000), cadence::parse_error);
}
