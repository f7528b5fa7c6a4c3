// cadence::membership::timeouts (the one hierarchy: heartbeat < op < quorum) and the checks of
// member_options: each bad value is refused with a message naming it.
#include <cadence/membership/options.hpp>
#include <cadence/membership/timeouts.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <string>

namespace cadence_membership_timeouts_test {
namespace {

namespace mb = cadence::membership;
using namespace std::chrono_literals;

std::string refusal(const mb::timeouts& t) {
  try {
    t.check();
  } catch (const cadence::invalid_parameter_error& e) {
    return e.what();
  }
  return "";
}

std::string refusal(const mb::member_options& o, int size = 4) {
  try {
    o.check(size);
  } catch (const cadence::invalid_parameter_error& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("membership::timeouts: the defaults and a scaled hierarchy hold; each broken tier is named") {
  CHECK(refusal(mb::timeouts{}) == "");
  const mb::timeouts s = mb::timeouts::scaled(500ms);
  CHECK(s.heartbeat_interval == 100ms);
  CHECK(s.heartbeat_timeout == 500ms);
  CHECK(s.op == 2000ms);
  CHECK(s.quorum == 4000ms);
  CHECK(refusal(s) == "");
  CHECK(refusal(mb::timeouts::scaled(10ms)) == "");

  mb::timeouts t;
  t.heartbeat_interval = 0ms;
  CHECK(refusal(t).find("heartbeat_interval must be > 0") != std::string::npos);
  t = {};
  t.heartbeat_timeout = t.heartbeat_interval;
  CHECK(refusal(t).find("heartbeat_timeout (1000 ms) must be longer than heartbeat_interval") != std::string::npos);
  t = {};
  t.op = t.heartbeat_timeout;
  CHECK(refusal(t).find("op (5000 ms) must be longer than heartbeat_timeout") != std::string::npos);
  t = {};
  t.quorum = 10ms;
  CHECK(refusal(t).find("quorum (10 ms) must be longer than op") != std::string::npos);
}

TEST_CASE("membership::member_options::check names the bad field") {
  mb::member_options o;
  CHECK(refusal(o) == "");
  o.min_size = 0;
  CHECK(refusal(o).find("min_size") != std::string::npos);
  o = {};
  o.eligible = {0, 4};
  CHECK(refusal(o).find("eligible rank 4 is out of range [0, 4)") != std::string::npos);
  o = {};
  o.tag_base = cadence::transport::max_tag;
  CHECK(refusal(o).find("tag_base") != std::string::npos);
  o = {};
  o.max_attempts = 0;
  CHECK(refusal(o).find("max_attempts") != std::string::npos);
  o = {};
  o.timeouts.op = 1ms;
  CHECK(refusal(o).find("op (1 ms)") != std::string::npos);
}

}  // namespace
}  // namespace cadence_membership_timeouts_test
