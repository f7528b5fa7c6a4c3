// json.hpp: documents keep their keys in the order they were added and print one object per
// line, with the separators the tools have always printed; numbers and strings as
// nlohmann/json writes them.
#include "json.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using cadence::tools::json;

TEST_CASE("an object prints on one line with its keys in insertion order") {
  const json j = {{"zeta", 1}, {"alpha", "a\"b"}, {"list", {1, 2}}, {"nested", {{"x", 0.5}}}, {"none", nullptr}};
  CHECK(cadence::tools::json_line(j) == R"({"zeta": 1, "alpha": "a\"b", "list": [1, 2], "nested": {"x": 0.5}, "none": null})");
}

TEST_CASE("an array of objects prints one object per line; an empty one as []") {
  json doc = json::array();
  CHECK(cadence::tools::json_document(doc) == "[]\n");
  doc.push_back({{"a", 1}});
  doc.push_back({{"a", 2}});
  CHECK(cadence::tools::json_document(doc) == "[\n {\"a\": 1},\n {\"a\": 2}\n]\n");
  CHECK(cadence::tools::json_document(json{{"a", 1}}) == "{\"a\": 1}\n");
}

TEST_CASE("numbers that are not finite print as null, doubles keep their type") {
  const json j = {{"nan", std::nan("")}, {"inf", std::numeric_limits<double>::infinity()}, {"two", 2.0}, {"i", 2}};
  CHECK(cadence::tools::json_line(j) == R"({"nan": null, "inf": null, "two": 2.0, "i": 2})");
}

TEST_CASE("significant and decimals round as printf would, and leave NaN alone") {
  CHECK(cadence::tools::significant(22.466666666, 6) == 22.4667);
  CHECK(cadence::tools::significant(0.00236273456, 6) == 0.00236273);
  CHECK(cadence::tools::decimals(6.0004, 3) == 6.0);
  CHECK(cadence::tools::decimals(12.34567, 3) == 12.346);
  CHECK(std::isnan(cadence::tools::significant(std::nan(""), 6)));
  CHECK(cadence::tools::json_line(json(cadence::tools::significant(22.466666666, 6))) == "22.4667");
}
