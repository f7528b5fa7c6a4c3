// zipline_json.hpp: the tool's JSON object has exactly the documented keys and formats.
#include "zipline_json.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

TEST_CASE("a result is written as one JSON object with the documented keys in order") {
  cadence::zipline_result<std::int64_t> r;
  r.spread = 12;
  r.barrier = 3400;
  r.choice = {0, 2, 14};
  CHECK(cadence::tools::json_line(cadence::tools::zipline_result_json("fast", r, 0.00025)) ==
        R"({"variant": "fast", "n": 3, "spread": 12, "barrier": 3400, "choice": [0, 2, 14], "seconds": 0.00025})");
}

TEST_CASE("floating-point results use the shortest exact text and escape strings") {
  cadence::zipline_result<double> r;
  r.spread = 0.1;
  r.barrier = std::numeric_limits<double>::infinity();
  r.choice = {};
  CHECK(cadence::tools::json_line(cadence::tools::zipline_result_json("a\"b", r, 1.5)) ==
        R"({"variant": "a\"b", "n": 0, "spread": 0.1, "barrier": null, "choice": [], "seconds": 1.5})");
  // A decimal history's integral spread stays a double (a reader sees a float, as it was).
  r.spread = 2;
  r.barrier = 5.5;
  CHECK(cadence::tools::json_line(cadence::tools::zipline_result_json("fast", r, 1.5)) ==
        R"({"variant": "fast", "n": 0, "spread": 2.0, "barrier": 5.5, "choice": [], "seconds": 1.5})");
}

TEST_CASE("number_text prints timestamps for the text output: exact integers, shortest doubles") {
  CHECK(cadence::tools::number_text(std::int64_t{9007199254740993}) == "9007199254740993");
  CHECK(cadence::tools::number_text(0.1) == "0.1");
  CHECK(cadence::tools::number_text(5.5) == "5.5");
  CHECK(cadence::tools::number_text(1.0 / 3) == "0.3333333333333333");
}
