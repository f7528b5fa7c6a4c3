// cadence/exchange/local_sgd/outer_optimizer.hpp: each outer optimizer's step against its
// formula written out by hand, the trait, and the config strings.
#include <cadence/exchange/local_sgd/outer_optimizer.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;

namespace outer_optimizer_test {
// Runs `steps` outer steps of o on x with pseudo-gradients g(k) = (k + 1) * base, k from 0.
template <class O>
std::vector<float> run_outer(const O& o, std::vector<float> x, const std::vector<float>& base, int steps) {
  std::vector<float> state(o.state_slots() * x.size(), 0.0f);
  std::vector<float*> slots(o.state_slots());
  for (std::size_t k = 0; k < slots.size(); ++k) slots[k] = state.data() + k * x.size();
  for (int k = 0; k < steps; ++k) {
    std::vector<float> g(base);
    for (auto& v : g) v *= static_cast<float>(k + 1);
    o.step(span<float>(x.data(), x.size()), span<const float>(g.data(), g.size()), slots.data(),
           static_cast<std::uint64_t>(k + 1));
  }
  return x;
}
}  // namespace outer_optimizer_test
using namespace outer_optimizer_test;

TEST_CASE("outer sgd with lr 1 moves the global weights by the whole pseudo-gradient") {
  const auto x = run_outer(outer_sgd{1.0f}, {10.0f, -2.0f}, {0.5f, -0.25f}, 1);
  CHECK(x == std::vector<float>{9.5f, -1.75f});
  const auto y = run_outer(outer_sgd{0.5f}, {10.0f}, {2.0f}, 2);  // 10 - 0.5*2 - 0.5*4
  CHECK(y[0] == 7.0f);
}

TEST_CASE("outer nesterov follows torch's form: m = mu m + g, x -= lr (g + mu m)") {
  const outer_nesterov o{0.7f, 0.9f};
  float x = 1.0f, m = 0.0f;
  for (int k = 0; k < 5; ++k) {
    const float g = 0.1f * static_cast<float>(k + 1);
    m = 0.9f * m + g;
    x -= 0.7f * (g + 0.9f * m);
  }
  const auto got = run_outer(o, {1.0f}, {0.1f}, 5);
  CHECK(got[0] == doctest::Approx(x).epsilon(1e-6));
  CHECK(o.state_slots() == 1);
}

TEST_CASE("outer adam's first step moves each element by about lr, whatever the gradient's scale") {
  const outer_adam o{0.01f, 0.9f, 0.999f, 1e-8f};
  const auto x = run_outer(o, {1.0f, 1.0f, 1.0f}, {1e-3f, 5.0f, -20.0f}, 1);
  CHECK(x[0] == doctest::Approx(0.99f).epsilon(1e-4));
  CHECK(x[1] == doctest::Approx(0.99f).epsilon(1e-4));
  CHECK(x[2] == doctest::Approx(1.01f).epsilon(1e-4));
  CHECK(o.state_slots() == 2);
}

TEST_CASE("any_outer_optimizer runs the optimizer it holds, DiLoCo's by default") {
  const any_outer_optimizer d;
  CHECK(d.name() == "nesterov:0.7:0.9");
  const any_outer_optimizer s = outer_sgd{0.5f};
  CHECK(s.name() == "sgd:0.5");
  CHECK(run_outer(s, {4.0f}, {2.0f}, 1)[0] == 3.0f);
  static_assert(is_outer_optimizer_v<any_outer_optimizer>);
  static_assert(!is_outer_optimizer_v<int>);
}

TEST_CASE("make_outer_optimizer reads every kind with defaults and names what is wrong") {
  CHECK(make_outer_optimizer("sgd").name() == "sgd:1");
  CHECK(make_outer_optimizer("nesterov").name() == "nesterov:0.7:0.9");
  CHECK(make_outer_optimizer("nesterov:0.5").name() == "nesterov:0.5:0.9");
  CHECK(make_outer_optimizer("adam:0.002:0.8").name() == "adam:0.002:0.8:0.999:1e-08");
  CHECK(make_outer_optimizer("nesterov:0.7:0.9").name() == "nesterov:0.7:0.9");
  auto bad = [](const char* spec, const char* part) {
    try {
      (void)make_outer_optimizer(spec);
      FAIL("no error for " << spec);
    } catch (const parse_error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
      CHECK_MESSAGE(std::string(e.what()).find(spec) != std::string::npos, e.what());
    }
  };
  bad("momentum", "unknown kind 'momentum'");
  bad("sgd:0", "lr 0 is not in (0, 1e+06]");
  bad("nesterov:0.7:1", "momentum 1 is not in [0, 1)");
  bad("sgd:x", "lr 'x' is not a number");
  bad("sgd:1:2", "at most a learning rate");
  bad("adam:1:0.9:0.9:0:5", "at most lr, beta1, beta2 and eps");
}
