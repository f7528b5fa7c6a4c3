#include <cadence/transport/communicator.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>

using namespace cadence::transport;
using namespace std::chrono_literals;

namespace {

// Requirement 6 missing: adapters could not ask whether any_source works.
struct no_capabilities {
  int rank() const { return 0; }
  int size() const { return 1; }
  void allreduce(void*, std::size_t, dtype, reduce_op, deadline) {}
  void broadcast(void*, std::size_t, int, deadline) {}
  void send(const void*, std::size_t, int, int, deadline) {}
  int recv(void*, std::size_t, int, int, deadline) { return 0; }
  void abort() noexcept {}
  bool failed() const { return false; }
};

// The smallest type that models the concept: every numbered requirement, nothing more (the
// type above and the member it lacks).
struct minimal : no_capabilities {
  capability_flags capabilities() const { return {}; }
};

// Requirement 5 broken: an abort() that may throw cannot be called from a failure handler.
struct throwing_abort : minimal {
  void abort() {}
};

// Requirement 4 broken: recv must say who sent the message (any_source needs it).
struct recv_returns_nothing : minimal {
  void recv(void*, std::size_t, int, int, deadline) {}
};

// Requirement 2 broken: an all-reduce without a deadline could hang forever.
struct allreduce_without_deadline : minimal {
  void allreduce(void*, std::size_t, dtype, reduce_op) {}
};

}  // namespace

TEST_CASE("the concept accepts the minimal communicator and rejects each broken requirement") {
  static_assert(is_communicator_v<minimal>);
  static_assert(!is_communicator_v<throwing_abort>);
  static_assert(!is_communicator_v<recv_returns_nothing>);
  static_assert(!is_communicator_v<no_capabilities>);
  static_assert(!is_communicator_v<allreduce_without_deadline>);
  static_assert(!is_communicator_v<int>);
#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
  static_assert(communicator<minimal>);
  static_assert(!communicator<throwing_abort>);
#endif
  CADENCE_REQUIRE_COMMUNICATOR(minimal);
}

TEST_CASE("dtype sizes and names match the element types") {
  static_assert(dtype_size(dtype_of_v<float>) == sizeof(float));
  static_assert(dtype_size(dtype_of_v<double>) == sizeof(double));
  static_assert(dtype_size(dtype_of_v<std::int32_t>) == 4);
  static_assert(dtype_size(dtype_of_v<std::int64_t>) == 8);
  static_assert(dtype_size(dtype_of_v<std::uint8_t>) == 1);
  static_assert(dtype_size(dtype::f16) == 2 && dtype_size(dtype::bf16) == 2);
  CHECK(std::string(dtype_name(dtype::bf16)) == "bf16");
  CHECK(std::string(dtype_name(dtype::i64)) == "i64");
  CHECK(std::string(reduce_op_name(reduce_op::max)) == "max");
}

TEST_CASE("a default deadline is finite: sixty seconds from its creation") {
  const auto before = deadline::clock::now();
  const deadline d;
  const auto after = deadline::clock::now();
  CHECK(d.time_point() >= before + 60s);
  CHECK(d.time_point() <= after + 60s);
  CHECK_FALSE(d.passed());
}

TEST_CASE("a duration converts to a deadline that far from now; remaining() counts down to zero") {
  const deadline soon = 50ms;
  CHECK(soon.remaining() <= 50ms);
  CHECK(soon.remaining() > 0ms);
  const deadline past = deadline::at(deadline::clock::now() - 1s);
  CHECK(past.passed());
  CHECK(past.remaining() == deadline::clock::duration::zero());
  const deadline zero = 0s;
  CHECK(zero.passed());
}

TEST_CASE("a deadline practically forever away saturates instead of overflowing into the past") {
  const deadline never = std::chrono::hours::max();
  CHECK(never.time_point() == deadline::clock::time_point::max());
  CHECK_FALSE(never.passed());
  const deadline far = std::chrono::hours(24 * 365);
  CHECK(far.time_point() > deadline::clock::now() + std::chrono::hours(24 * 364));
}

TEST_CASE("capabilities default to the weakest backend: nothing promised") {
  const capability_flags c;
  CHECK_FALSE(c.any_source);
  CHECK_FALSE(c.detects_lost_peer);
  CHECK_FALSE(c.survives_lost_peer);
  CHECK_FALSE(c.device_buffers);
}

TEST_CASE("transport_error is a cadence::error, so one catch clause handles every failure") {
  static_assert(std::is_base_of_v<cadence::error, cadence::transport_error>);
  try {
    throw cadence::transport_error("allreduce #3 on rank 1 of 4: lost rank 2");
  } catch (const cadence::error& e) {
    CHECK(std::string(e.what()) == "allreduce #3 on rank 1 of 4: lost rank 2");
  }
}
