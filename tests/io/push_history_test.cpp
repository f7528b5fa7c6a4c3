// io/push_history.hpp: the published `id:t1,...,tk,` format reads and writes losslessly,
// accepts its variants (unequal rows, CRLF, no trailing comma, decimal timestamps), names
// file and line of every malformed input and stops at its bounds.
#include <cadence/io/push_history.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <streambuf>
#include <string>
#include <variant>
#include <vector>

namespace {

template <class T = std::int64_t>
cadence::push_history<T> parse(const std::string& text,
                               const cadence::push_history_read_options& options = {}) {
  std::istringstream in(text);
  return cadence::read_push_history<T>(in, "<stream>", options);
}

cadence::any_push_history parse_any(const std::string& text) {
  std::istringstream in(text);
  return cadence::read_any_push_history(in);
}

// An input that must not parse, and a piece of the parse_error's message.
struct malformed_history {
  const char* text;
  const char* message;
};

// Every case read as a push_history<T> is a parse_error whose message contains the case's.
template <class T>
void check_malformed(std::initializer_list<malformed_history> cases) {
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK_THROWS_WITH_AS(parse<T>(c.text), doctest::Contains(c.message), cadence::parse_error);
  }
}

template <class T>
std::vector<T> row_of(const cadence::push_history<T>& h, std::size_t p) {
  const auto r = h.row(p);
  return std::vector<T>(r.begin(), r.end());
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
  check_malformed<std::int64_t>({
      {"0:1,2,\n1 2 3\n", "<stream>:2: expected 'id:t1,t2,...,' but found no ':'"},
      {"x:1,2,\n", "<stream>:1: worker id 'x' is not an integer"},
      {"0:1,2,\n\n7:\n", "<stream>:3: worker 7 has no timestamps"},
      {"0:1,,3,\n", "<stream>:1: worker 0: timestamp 2 is empty"},
      {"0:1,2.5,\n", "<stream>:1: worker 0: timestamp 2 '2.5' is not an integer"},
      {"0:1,+-2,\n", "<stream>:1: worker 0: timestamp 2 '+-2' is not an integer"},
      {"0:1,99999999999999999999,\n",
       "<stream>:1: worker 0: timestamp 2 '99999999999999999999' does not fit a 64-bit signed integer"},
      {"0:1,2,\n1:5,3,\n",
       "<stream>:2: worker 1: timestamp 2 (3) is earlier than timestamp 1 (5); timestamps must "
       "not go backwards"},
      {"4:1,\n5:2,\n4:3,\n", "<stream>:3: duplicate worker id 4 (first on line 1)"},
  });
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
                       doctest::Contains("'70000' does not fit a 16-bit signed integer"),
                       cadence::parse_error);
}

TEST_CASE("equal timestamps are a valid history but not valid strictly increasing rows") {
  CHECK(row_of(parse("3:5,5,6,\n"), 0) == std::vector<std::int64_t>{5, 5, 6});
  cadence::push_history_read_options strict;
  strict.strictly_increasing = true;
  CHECK_THROWS_WITH_AS(parse("0:1,2,\n3:5,5,6,\n", strict),
                       "cadence::read_push_history: <stream>:2: worker 3: timestamp 2 (5) is not "
                       "later than timestamp 1 (5); timestamps must be strictly increasing",
                       cadence::parse_error);
}

TEST_CASE("a worker with fewer timestamps than min_timestamps is named with its line") {
  cadence::push_history_read_options o;
  o.min_timestamps = 2;
  CHECK(parse("0:1,2,\n", o).size() == 1);
  CHECK_THROWS_WITH_AS(parse("0:1,2,\n\n5:7,\n", o),
                       "cadence::read_push_history: <stream>:3: worker 5 has 1 timestamp; at least "
                       "2 are required",
                       cadence::parse_error);
}

TEST_CASE("floating-point histories read decimals and exponents exactly as written") {
  const auto h = parse<double>("1:1.25,2.5,3.75,\n0: 0.1 ,+2e-1,3E-1\n");
  REQUIRE(h.size() == 2);
  CHECK(h.ids() == std::vector<std::int64_t>{0, 1});
  CHECK(row_of(h, 0) == std::vector<double>{0.1, 0.2, 0.3});
  CHECK(row_of(h, 1) == std::vector<double>{1.25, 2.5, 3.75});
  const auto file = cadence::read_push_history_file<double>(CADENCE_TEST_DATA_DIR
                                                            "/push_history_decimal.txt");
  REQUIRE(file.size() == 3);
  CHECK(row_of(file, 2) == std::vector<double>{0.5, 1.75, 3.0});
}

TEST_CASE("malformed decimals are parse_errors naming the line, the timestamp and the rule") {
  check_malformed<double>({
      {"0:1.5,\n1:1.2.3,\n", "<stream>:2: worker 1: timestamp 1 '1.2.3' is not a number"},
      {"0:1,nan,\n", "<stream>:1: worker 0: timestamp 2 'nan' is not a finite number"},
      {"0:1,\n\n2:inf,\n", "<stream>:3: worker 2: timestamp 1 'inf' is not a finite number"},
      {"0:1,1e999,\n", "<stream>:1: worker 0: timestamp 2 '1e999' does not fit a double"},
      {"0:1.,2x,\n", "<stream>:1: worker 0: timestamp 2 '2x' is not a number"},
      {"0:2.5,1.25,\n",
       "<stream>:1: worker 0: timestamp 2 (1.25) is earlier than timestamp 1 (2.5); timestamps "
       "must not go backwards"},
  });
}

TEST_CASE("a floating-point history writes its shortest round-trip form and reads back unchanged") {
  const auto h = parse<double>("0:0.1,2.5,1e300,\n");
  std::ostringstream out;
  cadence::write_push_history(out, h);
  CHECK(out.str() == "0:0.1,2.5,1e+300,\n");
  CHECK(parse<double>(out.str()) == h);
}

TEST_CASE("read_any_push_history keeps integer files exact and reads files with a decimal as doubles") {
  const auto integers = parse_any("1:9007199254740993,\n0:5,7,\n");
  REQUIRE(std::holds_alternative<cadence::push_history<std::int64_t>>(integers));
  const auto& h = std::get<cadence::push_history<std::int64_t>>(integers);
  CHECK(row_of(h, 1) == std::vector<std::int64_t>{9007199254740993});

  SUBCASE("a '.' anywhere makes every timestamp a double, those before it too") {
    const auto any = parse_any("0:1,2,\n1:0.5,3,\n");
    REQUIRE(std::holds_alternative<cadence::push_history<double>>(any));
    const auto& d = std::get<cadence::push_history<double>>(any);
    CHECK(row_of(d, 0) == std::vector<double>{1, 2});
    CHECK(row_of(d, 1) == std::vector<double>{0.5, 3});
  }
  SUBCASE("an exponent does too") {
    CHECK(std::holds_alternative<cadence::push_history<double>>(parse_any("0:1,2e3,\n")));
    CHECK(std::holds_alternative<cadence::push_history<double>>(parse_any("0:1,2E3,\n")));
  }
  SUBCASE("an integer beyond 64 bits is read as a double in a decimal file") {
    const auto any = parse_any("0:1,99999999999999999999,\n1:0.5,\n");
    REQUIRE(std::holds_alternative<cadence::push_history<double>>(any));
    CHECK(std::get<cadence::push_history<double>>(any).row(0)[1] == 1e20);
  }
}

TEST_CASE("read_any_push_history names the line of an integer beyond 64 bits in an integer file") {
  CHECK_THROWS_WITH_AS(parse_any("0:1,\n1:2,99999999999999999999,\n2:3,\n"),
                       "cadence::read_push_history: <stream>:2: worker 1: timestamp 2 "
                       "'99999999999999999999' does not fit a 64-bit signed integer (integer "
                       "timestamps are read exactly)",
                       cadence::parse_error);
  CHECK_THROWS_WITH_AS(parse_any("0:1,nan,\n"), doctest::Contains(":1: worker 0: timestamp 2 'nan' is not a finite number"),
                       cadence::parse_error);
  CHECK_THROWS_WITH_AS(parse_any("0:1,x,\n"), doctest::Contains(":1: worker 0: timestamp 2 'x' is not a number"),
                       cadence::parse_error);
  CHECK_THROWS_WITH_AS(parse_any("0:1,2.5,\n1:3,2,\n"),
                       doctest::Contains(":2: worker 1: timestamp 2 (2) is earlier than timestamp 1 (3)"),
                       cadence::parse_error);
}

TEST_CASE("the reader stops at its bounds with the line and the bound") {
  cadence::push_history_read_options at_bound;
  at_bound.max_line_length = 8;
  CHECK(parse("0:1,2,3,\n", at_bound).size() == 1);  // 8 bytes: at the bound
  // Each case sets one bound of the default options; its text goes past it.
  struct past_bound {
    void (*bound)(cadence::push_history_read_options&);
    const char* text;
    const char* message;
  };
  const past_bound cases[] = {
      {[](cadence::push_history_read_options& o) { o.max_line_length = 8; }, "0:1,\n0:1,2,3,4,\n",
       "cadence::read_push_history: <stream>:2: line is longer than 8 bytes (the reader's "
       "max_line_length)"},
      {[](cadence::push_history_read_options& o) { o.max_workers = 2; }, "0:1,\n1:1,\n\n2:1,\n",
       "cadence::read_push_history: <stream>:4: more than 2 workers (the reader's max_workers)"},
      {[](cadence::push_history_read_options& o) { o.max_timestamps = 3; }, "0:1,2,\n1:1,2,\n",
       "cadence::read_push_history: <stream>:2: more than 3 timestamps in all (the reader's "
       "max_timestamps)"},
  };
  for (const auto& c : cases) {
    cadence::push_history_read_options o;
    c.bound(o);
    CHECK_THROWS_WITH_AS(parse(c.text, o), c.message, cadence::parse_error);
  }
}

TEST_CASE("one endless line fails at the default line-length bound, having read little more") {
  // A stream that never ends: reading it whole would never return.
  struct endless_buf : std::streambuf {
    char chunk[4096];
    std::size_t served = 0;
    endless_buf() { std::fill(chunk, chunk + sizeof chunk, '7'); }
    int_type underflow() override {
      served += sizeof chunk;
      setg(chunk, chunk, chunk + sizeof chunk);
      return traits_type::to_int_type(chunk[0]);
    }
  } buf;
  std::istream in(&buf);
  CHECK_THROWS_WITH_AS(cadence::read_push_history(in, "endless"),
                       "cadence::read_push_history: endless:1: line is longer than 67108864 bytes "
                       "(the reader's max_line_length)",
                       cadence::parse_error);
  CHECK(buf.served <= cadence::push_history_max_line_length + (std::size_t{1} << 17));
}

TEST_CASE("a NUL byte is rejected at once with its line and column") {
  const std::string zeros(1000, '\0');
  CHECK_THROWS_WITH_AS(parse(zeros), "cadence::read_push_history: <stream>:1: NUL byte at column 1: "
                                     "a push history is text",
                       cadence::parse_error);
  CHECK_THROWS_WITH_AS(parse("0:1,\n1:2" + std::string(1, '\0') + ",\n"),
                       doctest::Contains("<stream>:2: NUL byte at column 4"), cadence::parse_error);
}
