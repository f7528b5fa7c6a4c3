// flags.hpp: command-line numbers are parsed strictly, every error names the flag and says the
// rule it broke, a flag is given at most once unless it is repeatable, flags that exclude each
// other are rejected together, and --help has the tools' layout.
#include "flags.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

using cadence::tools::usage_error;

namespace {

// Reads `words` (the program's name first) into cli.
bool read(cadence::tools::command_line& cli, std::initializer_list<const char*> words) {
  const std::vector<const char*> argv(words);
  return cli.read(static_cast<int>(argv.size()), argv.data());
}

// A command line with the flags of the examples below.
struct example {
  int lookahead = 15;
  std::uint64_t seed = 1;
  double seconds = 0, cost = 0;
  std::string input, generate;
  bool json = false, csv = false;
  std::vector<std::string> policies;
  cadence::tools::command_line cli{"usage: tool [options]\n"};
  example() {
    cli.add_option("--lookahead", lookahead, "R")->check(cadence::tools::integer<int>(1, 100, "R"));
    cli.add_seed(seed, "N", "seed");
    cli.add_option("--seconds", seconds, "seconds")->check(cadence::tools::positive());
    cli.add_option("--push-cost", cost, "cost")->check(cadence::tools::non_negative());
    cli.add_option("--input", input, "a file");
    cli.add_option("--generate", generate, "N,T")->check(cadence::tools::integer_pair<long>(1, 1000, "N", "T"));
    cli.add_flag("--json", json, "JSON");
    cli.add_flag("--csv", csv, "CSV");
    cli.add_list("--policy", policies, "repeatable");
  }
};

}  // namespace

TEST_CASE("flag integers parse within bounds and otherwise say which bound they broke") {
  using cadence::tools::parse_integer;
  CHECK(parse_integer<int>("15", 1, 100) == 15);
  CHECK_THROWS_WITH_AS(parse_integer<int>("0", 1, 100), "must be at least 1, got 0", usage_error);
  CHECK_THROWS_WITH_AS(parse_integer<int>("0", 1, 100, "R"), "R must be at least 1, got 0", usage_error);
  CHECK_THROWS_WITH_AS(parse_integer<int>("101", 1, 100), "must be at most 100, got 101", usage_error);
  CHECK_THROWS_WITH_AS(parse_integer<int>("3x", 1, 100), "'3x' is not an integer", usage_error);
  CHECK_THROWS_WITH_AS(parse_integer<int>("", 1, 100), "'' is not an integer", usage_error);
  CHECK_THROWS_WITH_AS(parse_integer<int>("-1", 1, 100), "must be at least 1, got -1", usage_error);
  CHECK_THROWS_WITH_AS(parse_integer<int>("-99999999999999999999", 1, 100),
                       "must be at least 1, got -99999999999999999999", usage_error);
  CHECK_THROWS_WITH_AS(parse_integer<int>("+5", 1, 100), "'+5' is not an integer", usage_error);
  CHECK_THROWS_WITH_AS(parse_integer<int>("0x10", 1, 100), "'0x10' is not an integer", usage_error);
}

TEST_CASE("an integer flag's error names the flag and the value's name") {
  example e;
  CHECK_THROWS_WITH_AS(read(e.cli, {"tool", "--lookahead", "0"}), "--lookahead: R must be at least 1, got 0",
                       usage_error);
  example f;
  CHECK_THROWS_WITH_AS(read(f.cli, {"tool", "--seed", "3x"}), "--seed: '3x' is not an integer", usage_error);
  example g;
  REQUIRE(read(g.cli, {"tool", "--lookahead", "100"}));
  CHECK(g.lookahead == 100);
}

TEST_CASE("unsigned flag integers call a negative number too small, not malformed") {
  using cadence::tools::parse_integer;
  CHECK_THROWS_WITH_AS(parse_integer<std::uint64_t>("-1", 0, 10), "must be at least 0, got -1", usage_error);
  CHECK(parse_integer<std::uint64_t>("-0", 0, 10) == 0);
  CHECK_THROWS_WITH_AS(parse_integer<std::uint64_t>("99999999999999999999", 0, 10),
                       "must be at most 10, got 99999999999999999999", usage_error);
  CHECK(parse_integer<std::uint64_t>("18446744073709551615", 0, UINT64_MAX) == UINT64_MAX);
  CHECK_THROWS_WITH_AS(parse_integer<std::uint64_t>("-", 0, 10), "'-' is not an integer", usage_error);
  // Through CLI11: "-1" is a value, not an option, and "-0" reaches the variable as 0.
  example e;
  CHECK_THROWS_WITH_AS(read(e.cli, {"tool", "--seed", "-1"}), "--seed: must be at least 0, got -1", usage_error);
  example f;
  f.seed = 9;
  REQUIRE(read(f.cli, {"tool", "--seed", "-0"}));
  CHECK(f.seed == 0);
  example g;
  REQUIRE(read(g.cli, {"tool", "--seed=18446744073709551615"}));
  CHECK(g.seed == UINT64_MAX);
}

TEST_CASE("flag pairs need exactly one comma and name the part that is wrong") {
  using cadence::tools::parse_pair;
  CHECK(parse_pair<long>("100,15", 1, 1000) == std::pair<long, long>{100, 15});
  CHECK_THROWS_WITH_AS(parse_pair<long>("100", 1, 1000), "expected 'A,B' (two integers), got '100'", usage_error);
  CHECK_THROWS_WITH_AS(parse_pair<long>("1,2,3", 1, 1000, "LO", "HI"), "expected 'LO,HI' (two integers), got '1,2,3'",
                       usage_error);
  CHECK_THROWS_WITH_AS(parse_pair<long>("5,x", 1, 1000), "'x' is not an integer", usage_error);
  CHECK_THROWS_WITH_AS(parse_pair<long>("5,0", 1, 1000, "LO", "HI"), "HI must be at least 1, got 0", usage_error);
  const auto [n, t] = cadence::tools::split_pair("7,x", "N", "T");
  CHECK(n == "7");
  CHECK(t == "x");
  example e;
  CHECK_THROWS_WITH_AS(read(e.cli, {"tool", "--generate", "100"}),
                       "--generate: expected 'N,T' (two integers), got '100'", usage_error);
  example f;
  CHECK_THROWS_WITH_AS(read(f.cli, {"tool", "--generate=5,0"}), "--generate: T must be at least 1, got 0",
                       usage_error);
}

TEST_CASE("'--flag value' and '--flag=value' are read alike, and an unknown option is named") {
  example e;
  REQUIRE(read(e.cli, {"tool", "--seed", "7", "--seconds=2.5", "--json"}));
  CHECK(e.seed == 7);
  CHECK(e.seconds == 2.5);
  CHECK(e.json);
  CHECK(e.cli.given("--seed"));
  CHECK_FALSE(e.cli.given("--csv"));
  example f;
  CHECK_THROWS_WITH_AS(read(f.cli, {"tool", "--json", "--bogus"}), "unknown option '--bogus' (see --help)",
                       usage_error);
  example g;
  CHECK_THROWS_WITH_AS(read(g.cli, {"tool", "stray"}), "unknown option 'stray' (see --help)", usage_error);
}

TEST_CASE("a flag without a value takes none, and a flag with one needs it") {
  example e;
  CHECK_THROWS_WITH_AS(read(e.cli, {"tool", "--json=1"}), "--json: takes no value", usage_error);
  example f;
  CHECK_THROWS_WITH_AS(read(f.cli, {"tool", "--seed"}), "--seed: missing value", usage_error);
  // The next argument is the value, whatever it looks like (as "--input -" would be stdin).
  example g;
  REQUIRE(read(g.cli, {"tool", "--input", "--json"}));
  CHECK(g.input == "--json");
  CHECK_FALSE(g.json);
}

TEST_CASE("a flag may be given once, a repeatable one once per value") {
  example e;
  CHECK_THROWS_WITH_AS(read(e.cli, {"tool", "--seed=1", "--lookahead", "3", "--lookahead", "4"}),
                       "--lookahead: given twice", usage_error);
  example f;
  CHECK_THROWS_WITH_AS(read(f.cli, {"tool", "--json", "--json"}), "--json: given twice", usage_error);
  example g;
  REQUIRE(read(g.cli, {"tool", "--policy", "bsp", "--policy=asp"}));
  CHECK(g.policies == std::vector<std::string>{"bsp", "asp"});
  example h;
  CHECK_THROWS_WITH_AS(read(h.cli, {"tool", "--policy", "bsp", "asp"}), "unknown option 'asp' (see --help)",
                       usage_error);
}

TEST_CASE("flags of one at_most_one_of group are rejected together, naming both in order") {
  example e;
  e.cli.at_most_one_of({"--json", "--csv"});
  REQUIRE(read(e.cli, {"tool", "--json", "--seed=1"}));
  example f;
  f.cli.at_most_one_of({"--json", "--csv"});
  CHECK_THROWS_WITH_AS(read(f.cli, {"tool", "--json", "--seed=1", "--csv"}), "--csv: cannot be combined with --json",
                       usage_error);
  example g;
  g.cli.at_most_one_of({"--json", "--csv"});
  CHECK_THROWS_WITH_AS(read(g.cli, {"tool", "--csv", "--json"}), "--json: cannot be combined with --csv",
                       usage_error);
}

TEST_CASE("a group of three or more lists its flags") {
  example e;
  e.cli.at_most_one_of({"--input", "--generate", "--json"});
  CHECK_THROWS_WITH_AS(read(e.cli, {"tool", "--input=a", "--generate=2,2"}),
                       "--generate: cannot be combined with --input (give at most one of --input, --generate, --json)",
                       usage_error);
}

TEST_CASE("real flag values must be finite and positive, or non-negative when zero is allowed") {
  using cadence::tools::parse_real;
  CHECK(parse_real("0.005") == 0.005);
  CHECK_THROWS_WITH_AS(parse_real("0"), "expected a number > 0, got '0'", usage_error);
  CHECK(parse_real("0", true) == 0.0);
  CHECK_THROWS_WITH_AS(parse_real("-1", true), "expected a number >= 0, got '-1'", usage_error);
  CHECK_THROWS_WITH_AS(parse_real("nan"), "expected a finite number > 0, got 'nan'", usage_error);
  CHECK_THROWS_WITH_AS(parse_real("inf"), "expected a finite number > 0, got 'inf'", usage_error);
  CHECK_THROWS_WITH_AS(parse_real("1x"), "expected a number > 0, got '1x'", usage_error);
  CHECK_THROWS_AS(parse_real(""), usage_error);
  example e;
  CHECK_THROWS_WITH_AS(read(e.cli, {"tool", "--seconds", "0"}), "--seconds: expected a number > 0, got '0'",
                       usage_error);
  example f;
  REQUIRE(read(f.cli, {"tool", "--push-cost", "0"}));
  CHECK(f.cost == 0.0);
  example g;
  CHECK_THROWS_WITH_AS(read(g.cli, {"tool", "--push-cost=-0.5"}), "--push-cost: expected a number >= 0, got '-0.5'",
                       usage_error);
}

TEST_CASE("real flag values above their bound say the bound") {
  using cadence::tools::parse_real;
  CHECK(parse_real("1e12") == 1e12);
  CHECK_THROWS_WITH_AS(parse_real("2e12"), "must be at most 1e+12, got 2e12", usage_error);
  CHECK_THROWS_WITH_AS(parse_real("10", false, 2.5), "must be at most 2.5, got 10", usage_error);
  example e;
  CHECK_THROWS_WITH_AS(read(e.cli, {"tool", "--seconds", "2e12"}), "--seconds: must be at most 1e+12, got 2e12",
                       usage_error);
}

TEST_CASE("with_flag names the flag of a value read from elsewhere") {
  CHECK_THROWS_WITH_AS(cadence::tools::with_flag("--rank (from $RANK)",
                                                 [] { return cadence::tools::parse_integer<int>("x", 0, 9); }),
                       "--rank (from $RANK): 'x' is not an integer", usage_error);
  CHECK(cadence::tools::with_flag("--rank", [] { return cadence::tools::parse_integer<int>("3", 0, 9); }) == 3);
}

TEST_CASE("one_of and not_empty say what was expected") {
  std::string transport, data;
  cadence::tools::command_line cli("usage: tool\n");
  cli.add_option("--transport", transport, "")->check(cadence::tools::one_of({"mpi", "gloo", "zmq"}));
  cli.add_option("--data", data, "")->check(cadence::tools::not_empty("a directory"));
  CHECK_THROWS_WITH_AS(read(cli, {"tool", "--transport", "tcp"}), "--transport: expected mpi, gloo or zmq, got 'tcp'",
                       usage_error);
  cadence::tools::command_line other("usage: tool\n");
  other.add_option("--data", data, "")->check(cadence::tools::not_empty("a directory"));
  CHECK_THROWS_WITH_AS(read(other, {"tool", "--data", ""}), "--data: expected a directory, got ''", usage_error);
}

TEST_CASE("--help stops the reading, and the help lists each group's flags in the tools' layout") {
  std::string scenario;
  std::vector<std::string> links;
  bool json = false;
  cadence::tools::command_line cli("usage: tool [options]\n", "Does one thing.\n", 21);
  cli.footer("columns:\n  x  a column\n");
  cli.add_option("--scenario", scenario, "scenario to simulate\n(default hetero16)")->option_text("NAME");
  cli.add_list("--link", links, "worker W's own link")->option_text("W=PUSH[,PULL]");
  cli.option_defaults()->group("output");
  cli.add_flag("--json", json, "print JSON");
  CHECK_FALSE(read(cli, {"tool", "--json", "--help"}));
  CHECK(cli.help() ==
        "usage: tool [options]\n"
        "\n"
        "Does one thing.\n"
        "\n"
        "options:\n"
        "  --scenario NAME    scenario to simulate\n"
        "                     (default hetero16)\n"
        "  --link W=PUSH[,PULL]\n"
        "                     worker W's own link\n"
        "\n"
        "output:\n"
        "  --json             print JSON\n"
        "  --help             this text\n"
        "\n"
        "columns:\n"
        "  x  a column\n");
  cadence::tools::command_line again("usage: tool\n");
  CHECK_FALSE(read(again, {"tool", "-h"}));
}

namespace {
struct throwing_run {
  const char* what;
  int operator()(int, char**) const {
    if (what[0] == 'u') throw usage_error(what);
    throw cadence::parse_error(what);
  }
};
}  // namespace

TEST_CASE("guarded_main exits 2 for a bad command line and 1 for bad input data") {
  CHECK(cadence::tools::guarded_main("tool", [](int, char**) { return 0; }, 0, nullptr) == 0);
  CHECK(cadence::tools::guarded_main("tool", throwing_run{"usage"}, 0, nullptr) == 2);
  CHECK(cadence::tools::guarded_main("tool", throwing_run{"file.txt:3: bad"}, 0, nullptr) == 1);
}
