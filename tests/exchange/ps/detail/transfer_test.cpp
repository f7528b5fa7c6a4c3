// cadence/exchange/ps/detail/transfer.hpp: the copy-on-write versions of a server's slice (an
// update never writes into a version a reply still reads) and a transfer posted without waiting.
#include <cadence/exchange/ps/detail/transfer.hpp>
#include <cadence/exchange/ps/options.hpp>
#include <cadence/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

using namespace cadence;
using cadence::exchange::detail::ps_transfer;
using cadence::exchange::detail::ps_versions;

namespace ps_transfer_test {

// An in-place rule only: the versions copy the slice before applying it to a fresh version.
struct add_in_place {
  int* calls;
  void operator()(float* w, const float* g, std::size_t n, worker_id) const {
    ++*calls;
    for (std::size_t i = 0; i < n; ++i) w[i] += g[i];
  }
};

}  // namespace ps_transfer_test

TEST_CASE("an update writes in place unless a reply pins the version, then into a free buffer") {
  const std::vector<float> initial{1, 2, 3};
  ps_versions<float> v(initial.data(), initial.size());
  exchange::sgd<float> rule{1.0f};
  const std::vector<float> g{1, 1, 1};
  v.apply(rule, g.data(), 0);
  CHECK(std::vector<float>(v.current(), v.current() + 3) == std::vector<float>{0, 1, 2});
  CHECK(v.buffers() == 1);

  const auto pin = v.pin();  // a reply reads this version
  const float* pinned = v.current();
  v.apply(rule, g.data(), 1);
  CHECK(v.buffers() == 2);
  CHECK(v.current() != pinned);
  CHECK(std::vector<float>(pinned, pinned + 3) == std::vector<float>{0, 1, 2});  // the reply's bytes
  CHECK(std::vector<float>(v.current(), v.current() + 3) == std::vector<float>{-1, 0, 1});
  CHECK_FALSE(v.current_pinned());

  v.unpin(pin);
  const auto again = v.pin();
  v.apply(rule, g.data(), 2);  // the old buffer is free again: no third one
  CHECK(v.buffers() == 2);
  CHECK(std::vector<float>(v.current(), v.current() + 3) == std::vector<float>{-2, -1, 0});
  v.unpin(again);
  v.unpin(ps_versions<float>::no_pin);  // a refusal pins nothing
  v.apply(rule, g.data(), 3);
  CHECK(v.buffers() == 2);
  CHECK(v.current()[0] == -3);
}

TEST_CASE("a rule without an out-of-place form gets a copy of the pinned version to update") {
  const std::vector<float> initial{1, 2};
  ps_versions<float> v(initial.data(), initial.size());
  int calls = 0;
  ps_transfer_test::add_in_place rule{&calls};
  const std::vector<float> g{10, 20};
  const auto pin = v.pin();
  v.apply(rule, g.data(), 0);
  CHECK(calls == 1);
  CHECK(std::vector<float>(v.current(), v.current() + 2) == std::vector<float>{11, 22});
  v.unpin(pin);
}

TEST_CASE("over the caller's storage there is one version, updated in place") {
  std::vector<double> mine{4, 5};
  ps_versions<double> v(mine.data(), mine.size());
  CHECK(v.external());
  exchange::sgd<double> rule{0.5};
  const std::vector<double> g{2, 2};
  const auto pin = v.pin();
  CHECK(v.current_pinned());
  v.unpin(pin);  // the server drains the pins before it updates external storage
  CHECK_FALSE(v.current_pinned());
  v.apply(rule, g.data(), 0);
  CHECK(mine == std::vector<double>{3, 4});
  CHECK(v.current() == mine.data());
  CHECK(v.buffers() == 1);
}

TEST_CASE("a transfer over an asynchronous communicator is posted at once and finished by test()" *
          doctest::timeout(30)) {
  transport::inproc_world world(2);
  auto a = world.join(0);
  auto b = world.join(1);
  int in = 0;
  const int out = 42;
  auto recv = ps_transfer<transport::inproc_communicator>::recv(b, &in, sizeof in, 0, 7, transport::deadline());
  CHECK_FALSE(recv.test());  // nothing sent yet: posted, not waited for
  auto send = ps_transfer<transport::inproc_communicator>::send(a, &out, sizeof out, 1, 7, transport::deadline());
  while (!recv.test()) {
  }
  while (!send.test()) {
  }
  CHECK(in == 42);
  CHECK(ps_transfer<transport::inproc_communicator>().test());  // an empty one is complete
}
