// io/trace.hpp: iteration traces read and write losslessly, accept interleaved workers,
// comments and both headers, and name file and line of every malformed input.
#include <cadence/io/trace.hpp>

#include <doctest/doctest.h>

#include <sstream>
#include <string>

namespace {

cadence::iteration_trace parse(const std::string& text, const cadence::trace_read_options& o = {}) {
  std::istringstream in(text);
  return cadence::read_iteration_trace(in, "t.csv", o);
}

std::string error_of(const std::string& text, const cadence::trace_read_options& o = {}) {
  try {
    (void)parse(text, o);
  } catch (const cadence::parse_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("a trace file is read per worker in the order each worker ran its iterations") {
  const auto tr = cadence::read_iteration_trace_file(CADENCE_TEST_DATA_DIR "/trace_bsp.csv");
  REQUIRE(tr.size() == 2);
  CHECK_FALSE(tr.has_costs);
  CHECK(tr.iterations() == 6);
  REQUIRE(tr.workers[1].size() == 3);
  CHECK(tr.workers[1][1].start == 2);
  CHECK(tr.workers[1][1].compute == 3);
  CHECK(tr.workers[1][1].push == 0);
  const auto costs = cadence::read_iteration_trace_file(CADENCE_TEST_DATA_DIR "/trace_costs.csv");
  CHECK(costs.has_costs);
  CHECK(costs.workers[0][2].start == 3.5);
  CHECK(costs.workers[0][2].pull == 0.25);
}

TEST_CASE("writing a trace and reading it back gives the same trace") {
  cadence::iteration_trace tr;
  tr.has_costs = true;
  tr.workers = {{{0, 0.1, 0.0001, 0.0002}, {0.1003, 0.0999999999999, 1e-5, 2e-5}},
                {{0, 0.17, 0.0003, 0.0004}}};
  std::ostringstream out;
  cadence::write_iteration_trace(out, tr);
  CHECK(out.str().rfind("worker,start,compute,push,pull\n0,0,0.1,", 0) == 0);
  const auto back = parse(out.str());
  REQUIRE(back.size() == 2);
  CHECK(back.has_costs);
  for (std::size_t p = 0; p < 2; ++p) {
    REQUIRE(back.workers[p].size() == tr.workers[p].size());
    for (std::size_t k = 0; k < tr.workers[p].size(); ++k) {
      CHECK(back.workers[p][k].start == tr.workers[p][k].start);
      CHECK(back.workers[p][k].compute == tr.workers[p][k].compute);
      CHECK(back.workers[p][k].push == tr.workers[p][k].push);
      CHECK(back.workers[p][k].pull == tr.workers[p][k].pull);
    }
  }
}

TEST_CASE("comments, blank lines, blanks and CRLF line ends are accepted") {
  const auto tr = parse("# recorded on node 7\r\n\r\n worker , start , compute \r\n# more\r\n0, 0, 0.5\r\n1,0,+0.25");
  REQUIRE(tr.size() == 2);
  CHECK(tr.workers[0][0].compute == 0.5);
  CHECK(tr.workers[1][0].compute == 0.25);
}

TEST_CASE("every malformed trace is a parse_error naming the file and the line") {
  CHECK(error_of("") == "cadence::read_iteration_trace: t.csv: no header line: expected "
                        "'worker,start,compute,push,pull' or 'worker,start,compute'");
  CHECK(error_of("worker,start\n0,0\n") ==
        "cadence::read_iteration_trace: t.csv:1: expected the header 'worker,start,compute' or "
        "'worker,start,compute,push,pull', got 'worker,start'");
  CHECK(error_of("worker,start,compute\n") == "cadence::read_iteration_trace: t.csv: no iterations after the header");
  CHECK(error_of("worker,start,compute\n0,0,1,2\n") ==
        "cadence::read_iteration_trace: t.csv:2: expected 3 fields (worker,start,compute), got 4");
  CHECK(error_of("worker,start,compute\n0,,1\n") == "cadence::read_iteration_trace: t.csv:2: field 2 (start) is empty");
  CHECK(error_of("worker,start,compute\n,,\n") == "cadence::read_iteration_trace: t.csv:2: field 1 (worker) is empty");
  CHECK(error_of("worker,start,compute\nw0,0,1\n") == "cadence::read_iteration_trace: t.csv:2: worker 'w0' is not an integer");
  CHECK(error_of("worker,start,compute\n0,0,1\n-1,0,1\n") ==
        "cadence::read_iteration_trace: t.csv:3: unknown worker -1: ids are 0..999999 (the reader's max_workers)");
  CHECK(error_of("worker,start,compute\n0,0,nan\n") == "cadence::read_iteration_trace: t.csv:2: compute 'nan' is not a finite number");
  CHECK(error_of("worker,start,compute\n0,inf,1\n") == "cadence::read_iteration_trace: t.csv:2: start 'inf' is not a finite number");
  CHECK(error_of("worker,start,compute\n0,0,1e999\n") == "cadence::read_iteration_trace: t.csv:2: compute '1e999' is not a finite number");
  CHECK(error_of("worker,start,compute\n0,0,0.1x\n") == "cadence::read_iteration_trace: t.csv:2: compute '0.1x' is not a number");
  CHECK(error_of("worker,start,compute,push,pull\n0,0,1,-0.5,0\n") ==
        "cadence::read_iteration_trace: t.csv:2: push must be >= 0 seconds, got -0.5");
  CHECK(error_of("worker,start,compute\n0,1,0.5\n0,0.75,1\n") ==
        "cadence::read_iteration_trace: t.csv:3: worker 0: start 0.75 is earlier than its previous iteration's "
        "start 1 (line 2); times must not go backwards (a worker's rows in the order it ran them)");
  CHECK(error_of("worker,start,compute\n0,1,0.5\n0,1.25,1\n") ==
        "cadence::read_iteration_trace: t.csv:3: worker 0: start 1.25 is before its previous iteration's compute "
        "ended at 1.5 (line 2)");
  CHECK(error_of("worker,start,compute\n0,0,1\n2,0,1\n") ==
        "cadence::read_iteration_trace: t.csv: worker 1 has no iterations; workers must be numbered 0..2 with at "
        "least one row each");
  CHECK(error_of(std::string("worker,start,compute\n0,0,1\0\n", 28)) ==
        "cadence::read_iteration_trace: t.csv:2: NUL byte: a trace is text");
  cadence::trace_read_options small;
  small.max_line_length = 20;
  CHECK(error_of("worker,start,compute\n0,0,0.100000000000000000001\n", small) ==
        "cadence::read_iteration_trace: t.csv:2: line is longer than 20 bytes (the reader's max_line_length)");
  small.max_line_length = 4096;
  small.max_iterations = 1;
  CHECK(error_of("worker,start,compute\n0,0,1\n0,1,1\n", small) ==
        "cadence::read_iteration_trace: t.csv:3: more than 1 rows (the reader's max_iterations)");
  CHECK_THROWS_WITH_AS(cadence::read_iteration_trace_file("/nonexistent/t.csv"),
                       "cadence::read_iteration_trace: cannot open '/nonexistent/t.csv'", cadence::parse_error);
}

TEST_CASE("the data files with bad traces fail on the line that is wrong") {
  CHECK_THROWS_WITH_AS(cadence::read_iteration_trace_file(CADENCE_TEST_DATA_DIR "/trace_backwards.csv"),
                       doctest::Contains("trace_backwards.csv:5: worker 0: start 0.15 is earlier"), cadence::parse_error);
  CHECK_THROWS_WITH_AS(cadence::read_iteration_trace_file(CADENCE_TEST_DATA_DIR "/trace_nan.csv"),
                       doctest::Contains("trace_nan.csv:3: compute 'nan' is not a finite number"), cadence::parse_error);
  CHECK_THROWS_WITH_AS(cadence::read_iteration_trace_file(CADENCE_TEST_DATA_DIR "/trace_missing_worker.csv"),
                       doctest::Contains("trace_missing_worker.csv: worker 1 has no iterations"), cadence::parse_error);
}

TEST_CASE("a trace's push times are start + compute + push, in seconds, waits included") {
  const auto tr = cadence::read_iteration_trace_file(CADENCE_TEST_DATA_DIR "/trace_costs.csv");
  const auto h = cadence::trace_push_times(tr);
  REQUIRE(h.size() == 2);
  CHECK(h.ids()[1] == 1);
  const auto r0 = h.row(0), r1 = h.row(1);
  REQUIRE(r0.size() == 3);
  CHECK(r0[0] == 1.5);
  CHECK(r0[1] == 3.25);
  CHECK(r0[2] == 5.0);
  CHECK(r1[2] == 8.0);
  cadence::iteration_trace bad;
  bad.has_costs = true;
  bad.workers = {{{0, 1, 5, 0}, {1, 1, 0, 0}}};
  CHECK_THROWS_WITH_AS(cadence::trace_push_times(bad),
                       "cadence::trace_push_times: worker 0: push 2 at 2 s arrives before push 1 at 6 s",
                       cadence::time_error);
}
