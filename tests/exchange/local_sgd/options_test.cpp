// cadence/exchange/local_sgd/options.hpp: the local-SGD config string (every key, its default,
// the canonical form read back) and check_diloco_options (each combination it refuses, with the
// option, its value and the bound in the message).
#include <cadence/exchange/local_sgd/options.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <string>

using namespace cadence;
using namespace cadence::exchange;

namespace {

// What a parsed config must hold besides its schedule, key by key.
struct expected_config {
  const char* outer;
  decltype(diloco_options::fragments) fragments;
  decltype(diloco_options::delay) delay;
  float alpha;
  outer_codec codec;
  bool error_feedback;
  bool weight_by_steps;
};

void check_config(const diloco_config& c, const expected_config& e) {
  CHECK(c.outer == e.outer);
  const diloco_options& o = c.options;
  CHECK(o.fragments == e.fragments);
  CHECK(o.delay == e.delay);
  CHECK(o.alpha == e.alpha);
  CHECK(o.codec == e.codec);
  CHECK(o.error_feedback == e.error_feedback);
  CHECK(o.weight_by_steps == e.weight_by_steps);
}

}  // namespace

TEST_CASE("a bare schedule is DiLoCo as published: nesterov 0.7/0.9, one fragment, f32, steps weights") {
  const diloco_config c = parse_diloco_config("fixed:50");
  CHECK(c.options.schedule == "fixed:50");
  check_config(c, {"nesterov:0.7:0.9", 1, 0, 0.0f, outer_codec::f32, true, true});
  CHECK(diloco_config_string(c.options, c.outer) == "fixed:50");
}

TEST_CASE("every key parses, and the canonical string reads back to the same options") {
  const diloco_config c = parse_diloco_config(
      "fixed:40,outer=adam:0.01,fragments=4,delay=2,alpha=0.5,codec=int4,feedback=0,weights=uniform");
  check_config(c, {"adam:0.01", 4, 2, 0.5f, outer_codec::int4, false, false});
  const std::string s = diloco_config_string(c.options, c.outer);
  CHECK(s == "fixed:40,outer=adam:0.01,fragments=4,delay=2,alpha=0.5,codec=int4,feedback=0,weights=uniform");
  const diloco_config back = parse_diloco_config(s);
  CHECK(diloco_config_string(back.options, back.outer) == s);
  // A timed schedule's own colons stay with the schedule.
  CHECK(parse_diloco_config("quorum:3:20:0.25:2:last,codec=bf16").options.schedule == "quorum:3:20:0.25:2:last");
}

TEST_CASE("a bad config string is refused naming the string and the key") {
  auto refused = [](const char* config, const char* part) {
    try {
      (void)parse_diloco_config(config);
    } catch (const parse_error& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find(config) != std::string::npos, what);
      CHECK_MESSAGE(what.find(part) != std::string::npos, what);
      return;
    }
    FAIL("accepted: " << config);
  };
  refused(",codec=int8", "no schedule");
  refused("fixed:10,fragments", "is not key=value");
  refused("fixed:10,fragments=-1", "fragments '-1'");
  refused("fixed:10,delay=x", "delay 'x'");
  refused("fixed:10,alpha=1", "alpha '1'");
  refused("fixed:10,codec=int2", "unknown codec 'int2'");
  refused("fixed:10,feedback=yes", "feedback must be 0 or 1");
  refused("fixed:10,weights=rank", "weights must be steps or uniform");
  refused("fixed:10,outer=momentum", "unknown kind 'momentum'");
  refused("fixed:10,colour=red", "unknown key 'colour'");
  refused("fixed:10,", "'' is not key=value");
}

TEST_CASE("check_diloco_options refuses combinations the schedule cannot run, naming the option and the bound") {
  diloco_options o;
  o.schedule = "fixed:8";
  o.fragments = 4;
  o.delay = 3;
  CHECK_NOTHROW(check_diloco_options(o, outer_schedule(o.schedule, 4), ""));
  // o with one change made by `change`, on 4 ranks, must be refused with `part` in the message.
  auto refused = [&o](void (*change)(diloco_options&), const char* part) {
    diloco_options b = o;
    change(b);
    const outer_schedule s(b.schedule, 4, 16);
    try {
      check_diloco_options(b, s, "here: ");
    } catch (const invalid_parameter_error& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.rfind("here: ", 0) == 0, what);
      CHECK_MESSAGE(what.find(part) != std::string::npos, what);
      return;
    }
    FAIL("accepted: " << diloco_config_string(b, "sgd:1"));
  };
  refused([](diloco_options& b) { b.fragments = 0; }, "fragments must be >= 1");
  refused([](diloco_options& b) { b.fragments = 9; }, "fragments 9 exceed H = 8");
  refused([](diloco_options& b) { b.delay = 8; }, "delay 8 must be less than H = 8");
  refused([](diloco_options& b) { b.schedule = "quorum:3:8"; }, "need the fixed schedule");
  refused([](diloco_options& b) { b.alpha = 1.5f; }, "alpha must be in [0, 1), got 1.5");
  refused([](diloco_options& b) { b.history = 1; }, "history must be in [2, 1024], got 1");
  refused([](diloco_options& b) { b.timeout = std::chrono::milliseconds(0); }, "timeout must be > 0");
  refused([](diloco_options& b) { b.tag = 32766; }, "are not all in [0, 32767]");
}
