// io/push_history.hpp: the published `id:t1,...,tk,` format reads and writes losslessly,
// accepts its variants (unequal rows, CRLF, no trailing comma) and names file and line of
// every malformed input.
#include <cadence/io/push_history.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace {

cadence::push_history<> parse(const std::string& text) {
  std::istringstream in(text);
  return cadence::read_push_history(in);
}

std::vector<std::int64_t> row_of(const cadence::push_history<>& h, std::size_t p) {
  const auto r = h.row(p);
  return std::vector<std::int64_t>(r.begin(), r.end());
}

}  // namespace

TEST_CASE("a published-format file is read with workers in ascending id order") {
  const auto h = cadence::read_push_history_file(CADENCE_TEST_DATA_DIR "/push_history_small.txt");
  REQUIRE(h.size() == 3);
  CHECK(h.ids() == std::vector<std::int64_t>{0, 1, 2});
  CHECK(row_of(h, 0) == std::vector<std::int64_t>{1000, 2000, 3000});
  CHECK(row_of(h, 1) == std::vector<std::int64_t>{100, 1300, 2500, 3700, 4900});
  CHECK(row_of(h, 2) == std::vector<std::int64_t>{1500, 2600});
  const auto rows = h.rows();
  CHECK(rows.size() == 3);
  CHECK(rows.row_size(1) == 5);
  CHECK(rows[2][1] == 2600);
}

TEST_CASE("CRLF line ends, blank lines, blanks around fields and a missing trailing comma are accepted") {
  const auto h = cadence::read_push_history_file(CADENCE_TEST_DATA_DIR "/push_history_crlf.txt");
  REQUIRE(h.size() == 2);
  CHECK(h.ids() == std::vector<std::int64_t>{1, 3});
  CHECK(row_of(h, 0) == std::vector<std::int64_t>{5, 1005, 2005});
  CHECK(row_of(h, 1) == std::vector<std::int64_t>{0, 1200, 2400});
}

TEST_CASE("writing then reading a history gives it back unchanged") {
  cadence::push_history<> h;
  const std::int64_t a[] = {-5, 0, 7}, b[] = {9007199254740993}, c[] = {1, 2, 3, 4, 5, 6};
  h.add(10, cadence::span<const std::int64_t>(a, 3));
  h.add(2, cadence::span<const std::int64_t>(b, 1));
  h.add(4, cadence::span<const std::int64_t>(c, 6));
  std::ostringstream out;
  cadence::write_push_history(out, h);
  CHECK(out.str() == "2:9007199254740993,\n4:1,2,3,4,5,6,\n10:-5,0,7,\n");
  CHECK(parse(out.str()) == h);
}

TEST_CASE("malformed lines are parse_errors naming the source, the line and the problem") {
  struct bad_case {
    const char* text;
    const char* message;
  };
  const bad_case cases[] = {
      {"0:1,2,\n1 2 3\n", "<stream>:2: expected 'id:t1,t2,...,' but found no ':'"},
      {"x:1,2,\n", "<stream>:1: worker id 'x' is not an integer"},
      {"0:1,2,\n\n7:\n", "<stream>:3: worker 7 has no timestamps"},
      {"0:1,,3,\n", "<stream>:1: worker 0: timestamp 2 is empty"},
      {"0:1,2.5,\n", "<stream>:1: worker 0: timestamp 2 '2.5' is not an integer"},
      {"0:1,99999999999999999999,\n", "timestamp 2 '99999999999999999999' is not an integer"},
      {"0:5,3,\n", "<stream>:1: worker 0: timestamp 2 (3) is earlier than the one before it"},
      {"4:1,\n5:2,\n4:3,\n", "<stream>:3: duplicate worker id 4 (first on line 1)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK_THROWS_WITH_AS(parse(c.text), doctest::Contains(c.message), cadence::parse_error);
  }
}

TEST_CASE("a file that cannot be opened is a parse_error naming it") {
  CHECK_THROWS_WITH_AS(cadence::read_push_history_file("/nonexistent/cadence/history.txt"),
                       doctest::Contains("cannot open '/nonexistent/cadence/history.txt'"),
                       cadence::parse_error);
}

TEST_CASE("errors in a file carry the file name") {
  std::istringstream in("0:1,\n1:a,\n");
  CHECK_THROWS_WITH_AS(cadence::read_push_history(in, "runs/h.txt"),
                       doctest::Contains("runs/h.txt:2: worker 1"), cadence::parse_error);
}

TEST_CASE("push_history rejects duplicate ids, empty rows and inconsistent storage") {
  cadence::push_history<> h;
  const std::int64_t a[] = {1, 2};
  h.add(3, cadence::span<const std::int64_t>(a, 2));
  CHECK_THROWS_AS(h.add(3, cadence::span<const std::int64_t>(a, 2)),
                  cadence::invalid_parameter_error);
  CHECK_THROWS_AS(h.add(4, cadence::span<const std::int64_t>()), cadence::invalid_parameter_error);
  CHECK_THROWS_AS(cadence::push_history<>({2, 1}, {1, 2}, {0, 1, 2}),
                  cadence::invalid_parameter_error);
  CHECK_THROWS_AS(cadence::push_history<>({1}, {1, 2}, {0, 1}), cadence::invalid_parameter_error);
}

TEST_CASE("narrow timestamp types reject values they cannot hold") {
  std::istringstream in("0:1,70000,\n");
  CHECK_THROWS_WITH_AS(cadence::read_push_history<std::int16_t>(in),
                       doctest::Contains("'70000' is not an integer that fits"),
                       cadence::parse_error);
}
