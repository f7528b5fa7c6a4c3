// cadence/exchange/tensor_ref.hpp: a caller's tensor as the collective adapters take it, and the
// sync() forms the two averagers accept for it (tests/exchange/*_averager_test.cpp run them over
// ranks).
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/exchange/tensor_ref.hpp>
#include <cadence/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <type_traits>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;

TEST_CASE("a tensor_ref takes floats or doubles by pointer, span or vector, and never copies them") {
  std::vector<float> f(5, 1.0f);
  std::vector<double> d(3, 2.0);
  const tensor_ref from_vector_f = f, from_vector_d = d;
  CHECK(from_vector_f.data == f.data());
  CHECK(from_vector_f.count == 5);
  CHECK(from_vector_f.type == transport::dtype::f32);
  CHECK(from_vector_f.bytes() == 20);
  CHECK(from_vector_d.data == d.data());
  CHECK(from_vector_d.type == transport::dtype::f64);
  CHECK(from_vector_d.bytes() == 24);
  const tensor_ref from_span(span<double>(d.data() + 1, 2));
  CHECK(from_span.data == d.data() + 1);
  CHECK(from_span.count == 2);
  CHECK(from_span.type == transport::dtype::f64);
  const tensor_ref from_pointer(f.data() + 2, 3);
  CHECK(from_pointer.count == 3);
  CHECK(from_pointer.type == transport::dtype::f32);
  const tensor_ref empty;
  CHECK(empty.data == nullptr);
  CHECK(empty.bytes() == 0);
}

TEST_CASE("only float and double containers convert to a tensor_ref") {
  static_assert(std::is_convertible_v<std::vector<float>&, tensor_ref>);
  static_assert(std::is_convertible_v<span<double>, tensor_ref>);
  static_assert(!std::is_convertible_v<std::vector<int>&, tensor_ref>);
  static_assert(!std::is_convertible_v<const std::vector<float>&, tensor_ref>);  // it writes into them
  CHECK(true);
}

TEST_CASE("the averagers take tensors as a braced list, one by one, a span or none" * doctest::timeout(30)) {
  transport::inproc_world world(1);
  auto c = world.join(0);
  periodic_averager<transport::inproc_communicator> avg(c, 1);
  std::vector<float> a(2, 1.5f);
  std::vector<double> b(3, 2.5);
  avg.step_done();
  avg.sync(a, b);  // one by one
  avg.step_done();
  avg.sync({a, b});  // a braced list
  avg.step_done();
  const tensor_ref both[] = {a, b};
  avg.sync(span<const tensor_ref>(both, 2));
  avg.step_done();
  avg.sync();  // none
  CHECK(avg.barriers() == 4);
  CHECK(a == std::vector<float>(2, 1.5f));  // one rank: the average is the value
  CHECK(b == std::vector<double>(3, 2.5));
  elastic_averager<transport::inproc_communicator> elastic(c, "elastic:2");
  CHECK(elastic.step_done(100));
  elastic.sync(a);
  CHECK(elastic.barriers() == 1);
  // sync() before it is due is refused in every form, before anything is communicated.
  CHECK_THROWS_AS(avg.sync(a), invalid_parameter_error);
  CHECK_THROWS_AS(avg.sync({a}), invalid_parameter_error);
  CHECK_THROWS_AS(avg.sync(), invalid_parameter_error);
}
