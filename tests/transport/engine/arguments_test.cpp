// cadence/transport/engine/arguments.hpp: the argument checks every backend runs at the start of
// an operation (communicator contract d): each message, word for word, and the documented order
// in which a call with several bad arguments is refused.
#include <cadence/transport/engine/arguments.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

namespace cadence_arguments_test {

namespace cd = cadence::transport::detail;
using cadence::transport::deadline;
using cadence::transport::dtype;
using cadence::transport::reduce_op;

cd::call_info a_call(const char* op, int size = 4) { return {"fake", op, 3, 1, size, deadline::clock::now()}; }

// The message of the invalid_parameter_error `f` throws, less the call's name ("" if none).
template <class F>
std::string refusal(const cd::call_info& c, F&& f) {
  try {
    f();
  } catch (const cadence::invalid_parameter_error& e) {
    const std::string head = cd::describe(c) + ": ";
    const std::string what = e.what();
    return what.compare(0, head.size(), head) == 0 ? what.substr(head.size()) : "(not naming the call) " + what;
  }
  return "";
}

const float some[4] = {};

TEST_CASE("check_allreduce refuses each bad argument in its own words and returns the size in bytes") {
  const auto c = a_call("allreduce");
  const deadline later = std::chrono::minutes(1);
  void* buf = const_cast<float*>(some);
  CHECK(cd::check_allreduce(c, buf, 4, dtype::f32, reduce_op::sum, false, &later) == 16);
  CHECK(cd::check_allreduce(c, nullptr, 0, dtype::f64, reduce_op::max, false, nullptr) == 0);  // nothing to point at
  const std::size_t huge = std::numeric_limits<std::size_t>::max() / 2 + 1;
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, huge, dtype::f32, reduce_op::sum, false, nullptr); }) ==
        "count " + std::to_string(huge) + " of f32 overflows size_t");
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 1, static_cast<dtype>(42), reduce_op::sum, false, nullptr); }) ==
        "unknown dtype 42");
  CHECK(refusal(c, [&] { cd::check_allreduce(c, nullptr, 4, dtype::f32, reduce_op::sum, false, nullptr); }) ==
        "null buffer with 16 bytes");
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 4, dtype::f32, static_cast<reduce_op>(7), false, nullptr); }) ==
        "unknown reduce_op 7");
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 4, dtype::bf16, reduce_op::sum, false, nullptr); }) ==
        "dtype bf16 has no host arithmetic (it is for device backends such as NCCL)");
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 4, dtype::u8, reduce_op::sum, true, nullptr); }) ==
        "dtype u8 is not f32 or f64 (an integer average would have to round)");
  const deadline past = deadline::at(c.started - std::chrono::milliseconds(1500));
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 4, dtype::f32, reduce_op::sum, false, &past); }) ==
        "its deadline had already passed when it was called (1.500000 s earlier)");
  CHECK(cd::check_allreduce(c, buf, 4, dtype::f32, reduce_op::sum, false, nullptr) ==
        16);  // no deadline: the async form
  // A device backend's dtypes pass without host arithmetic; its own check runs instead.
  cd::allreduce_rules device;
  device.host_arithmetic = false;
  CHECK(cd::check_allreduce(c, buf, 4, dtype::f16, reduce_op::sum, false, nullptr, device) == 8);
  device.native_type = [](const cd::call_info& call, dtype t) {
    if (t == dtype::i64) cd::bad_argument(call, "no native i64");
  };
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 2, dtype::i64, reduce_op::sum, false, nullptr, device); }) ==
        "no native i64");
}

TEST_CASE(
    "check_allreduce refuses in its documented order: size, buffer, op, native dtype, host arithmetic, average, "
    "deadline") {
  const auto c = a_call("allreduce");
  void* buf = const_cast<float*>(some);
  const deadline past = deadline::at(c.started - std::chrono::seconds(1));
  cd::allreduce_rules native;
  native.native_type = [](const cd::call_info& call, dtype) { cd::bad_argument(call, "native"); };
  const std::size_t huge = std::numeric_limits<std::size_t>::max() / 2 + 1;
  // Each line: the first bad argument wins over every later one.
  CHECK(refusal(c, [&] {
          cd::check_allreduce(c, nullptr, huge, dtype::bf16, static_cast<reduce_op>(9), true, &past, native);
        }) == "count " + std::to_string(huge) + " of bf16 overflows size_t");
  CHECK(refusal(c, [&] {
          cd::check_allreduce(c, nullptr, 4, dtype::bf16, static_cast<reduce_op>(9), true, &past, native);
        }) == "null buffer with 8 bytes");
  CHECK(refusal(c, [&] {
          cd::check_allreduce(c, buf, 4, dtype::bf16, static_cast<reduce_op>(9), true, &past, native);
        }) == "unknown reduce_op 9");
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 4, dtype::bf16, reduce_op::sum, true, &past, native); }) ==
        "native");
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 4, dtype::bf16, reduce_op::sum, true, &past); }) ==
        "dtype bf16 has no host arithmetic (it is for device backends such as NCCL)");
  CHECK(refusal(c, [&] { cd::check_allreduce(c, buf, 4, dtype::i32, reduce_op::sum, true, &past); }) ==
        "dtype i32 is not f32 or f64 (an integer average would have to round)");
}

TEST_CASE("check_broadcast refuses a null buffer, a root out of range and a passed deadline, in that order") {
  const auto c = a_call("broadcast");
  void* buf = const_cast<float*>(some);
  const deadline past = deadline::at(c.started - std::chrono::seconds(1));
  cd::check_broadcast(c, buf, 16, 3, nullptr);
  cd::check_broadcast(c, nullptr, 0, 0, nullptr);
  CHECK(refusal(c, [&] { cd::check_broadcast(c, nullptr, 16, 9, &past); }) == "null buffer with 16 bytes");
  CHECK(refusal(c, [&] { cd::check_broadcast(c, buf, 16, 4, &past); }) == "root rank 4 is out of range [0, 4)");
  CHECK(
      refusal(c, [&] { cd::check_broadcast(c, buf, 16, -1, nullptr); }) ==
      "root rank -1 is out of range [0, 4) (any_source is only for recv on a backend with capabilities().any_source)");
  CHECK(refusal(c, [&] { cd::check_broadcast(c, buf, 16, 0, &past); }) ==
        "its deadline had already passed when it was called (1.000000 s earlier)");
}

TEST_CASE(
    "check_send refuses buffer, destination, tag, deadline, then a send to itself where the backend has no loopback") {
  const auto c = a_call("send");
  const deadline past = deadline::at(c.started - std::chrono::seconds(1));
  cd::check_send(c, some, 16, 2, 0, nullptr);
  cd::check_send(c, some, 16, 3, cadence::transport::max_tag, nullptr);
  CHECK(refusal(c, [&] { cd::check_send(c, nullptr, 16, 9, -1, &past); }) == "null buffer with 16 bytes");
  CHECK(refusal(c, [&] { cd::check_send(c, some, 16, 9, -1, &past); }) == "destination rank 9 is out of range [0, 4)");
  CHECK(refusal(c, [&] { cd::check_send(c, some, 16, cadence::transport::any_source, 0, nullptr); }) ==
        "destination rank -1 is out of range [0, 4) (any_source is only for recv on a backend with "
        "capabilities().any_source)");
  CHECK(refusal(c, [&] { cd::check_send(c, some, 16, 1, -1, &past); }) == "tag -1 is outside [0, 32767]");
  CHECK(refusal(c, [&] { cd::check_send(c, some, 16, 1, 32768, nullptr); }) == "tag 32768 is outside [0, 32767]");
  CHECK(refusal(c, [&] { cd::check_send(c, some, 16, 1, 0, &past); }) ==
        "its deadline had already passed when it was called (1.000000 s earlier)");
  CHECK(refusal(c, [&] { cd::check_send(c, some, 16, 1, 0, nullptr); }) ==
        "a send to itself (rank 1) is not supported by the fake backend");
  cd::check_send(c, some, 16, 1, 0, nullptr, {/*self=*/true});
}

TEST_CASE(
    "check_recv takes any_source, and refuses buffer, source, tag, deadline, itself, then any_source on one rank") {
  const auto c = a_call("recv");
  float buf[4] = {};
  const deadline past = deadline::at(c.started - std::chrono::seconds(1));
  cd::check_recv(c, buf, 16, cadence::transport::any_source, 5, nullptr);
  CHECK(refusal(c, [&] { cd::check_recv(c, nullptr, 16, 7, 99999, &past); }) == "null buffer with 16 bytes");
  CHECK(refusal(c, [&] { cd::check_recv(c, buf, 16, 7, 99999, &past); }) == "source rank 7 is out of range [0, 4)");
  CHECK(refusal(c, [&] { cd::check_recv(c, buf, 16, 0, 99999, &past); }) == "tag 99999 is outside [0, 32767]");
  CHECK(refusal(c, [&] { cd::check_recv(c, buf, 16, 0, 1, &past); }) ==
        "its deadline had already passed when it was called (1.000000 s earlier)");
  CHECK(refusal(c, [&] { cd::check_recv(c, buf, 16, 1, 1, nullptr); }) ==
        "a recv from itself (rank 1) is not supported by the fake backend");
  const auto t = a_call("try_recv");
  CHECK(refusal(t, [&] { cd::check_recv(t, buf, 16, 1, 1, nullptr); }) ==
        "a try_recv from itself (rank 1) is not supported by the fake backend");
  cd::check_recv(c, buf, 16, 1, 1, nullptr, {/*self=*/true});
  const cd::call_info alone{"fake", "recv", 1, 0, 1, deadline::clock::now()};
  CHECK(refusal(alone, [&] { cd::check_recv(alone, buf, 16, cadence::transport::any_source, 0, nullptr); }) ==
        "any_source on a communicator of one rank would wait forever");
  cd::check_recv(alone, buf, 16, cadence::transport::any_source, 0, nullptr, {/*self=*/true});
}

}  // namespace cadence_arguments_test
