// The derived collectives against a scripted communicator that plays one rank and adds the
// other ranks' contributions itself; tests/transport/inproc_test.cpp runs them on real threads.
#include <cadence/transport/collectives.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

using namespace cadence;
using namespace cadence::transport;

namespace {

// Rank `rank_` of `size_`: allreduce combines the caller's buffer with `others_` (the other
// ranks' buffers, concatenated, one per other rank) and records the call.
struct scripted {
  int rank_ = 0;
  int size_ = 1;
  bool device_ = false;
  std::vector<std::vector<unsigned char>> others_;
  struct call {
    std::size_t count;
    dtype t;
    reduce_op op;
  };
  std::vector<call> calls_;

  scripted(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const { return rank_; }
  int size() const { return size_; }
  void allreduce(void* buf, std::size_t count, dtype t, reduce_op op, deadline) {
    calls_.push_back({count, t, op});
    for (const auto& other : others_) {
      REQUIRE(other.size() == count * dtype_size(t));
      detail::reduce_into(buf, other.data(), count, t, op);
    }
  }
  void broadcast(void*, std::size_t, int, deadline) {}
  void send(const void*, std::size_t, int, int, deadline) {}
  int recv(void*, std::size_t, int, int, deadline) { return 0; }
  void abort() noexcept {}
  bool failed() const { return false; }
  capability_flags capabilities() const {
    capability_flags c;
    c.device_buffers = device_;
    return c;
  }
};

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("barrier is one all-reduce of a single byte") {
  scripted c(0, 4);
  barrier(c);
  REQUIRE(c.calls_.size() == 1);
  CHECK(c.calls_[0].count == 1);
  CHECK(c.calls_[0].t == dtype::u8);
}

TEST_CASE("allgather places every rank's block at its offset, in place or not") {
  // Rank 1 of 3 gathers 3-byte blocks; the script supplies ranks 0 and 2's one-hot buffers.
  scripted c(1, 3);
  c.others_ = {{7, 8, 9, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 255, 0, 1}};
  const std::vector<unsigned char> expected{7, 8, 9, 4, 5, 6, 255, 0, 1};
  SUBCASE("separate send buffer; stale bytes in recv are overwritten") {
    const unsigned char mine[3] = {4, 5, 6};
    std::vector<unsigned char> out(9, 0xAB);
    allgather(c, mine, out.data(), 3);
    CHECK(out == expected);
  }
  SUBCASE("in place: send is the caller's own block of recv") {
    std::vector<unsigned char> out(9, 0xAB);
    out[3] = 4, out[4] = 5, out[5] = 6;
    allgather(c, out.data() + 3, out.data(), 3);
    CHECK(out == expected);
  }
  REQUIRE(c.calls_.size() == 1);
  CHECK(c.calls_[0].count == 9);
  CHECK(c.calls_[0].op == reduce_op::sum);
}

TEST_CASE("allgather of zero bytes still takes part in one collective") {
  scripted c(0, 2);
  allgather(c, nullptr, nullptr, 0);
  CHECK(c.calls_.size() == 1);
}

TEST_CASE("allgather rejects null buffers and sizes that overflow") {
  scripted c(0, 2);
  unsigned char buf[4] = {};
  CHECK_THROWS_WITH_AS(allgather(c, nullptr, buf, 2), doctest::Contains("allgather on rank 0"),
                       invalid_parameter_error);
  CHECK_THROWS_AS(allgather(c, buf, nullptr, 2), invalid_parameter_error);
  CHECK_THROWS_AS(allgather(c, buf, buf, std::size_t(-1) / 2 + 1), invalid_parameter_error);
  CHECK(c.calls_.empty());
}

TEST_CASE("allreduce_avg sums then divides by the number of ranks") {
  scripted c(0, 4);
  SUBCASE("f32") {
    c.others_ = {bytes_of(std::vector<float>{1, -8, 2}), bytes_of(std::vector<float>{2, 0, 2}),
                 bytes_of(std::vector<float>{3, 0, 2})};
    std::vector<float> v{2, 4, 1};
    allreduce_avg(c, v.data(), v.size(), dtype::f32);
    CHECK(v == std::vector<float>{2, -1, 1.75f});
  }
  SUBCASE("f64") {
    c.others_ = {bytes_of(std::vector<double>{1}), bytes_of(std::vector<double>{1}),
                 bytes_of(std::vector<double>{1})};
    std::vector<double> v{5};
    allreduce_avg(c, v.data(), v.size(), dtype::f64);
    CHECK(v[0] == 2.0);
  }
  REQUIRE(c.calls_.size() == 1);
  CHECK(c.calls_[0].op == reduce_op::sum);
}

TEST_CASE("allreduce_avg refuses integer dtypes, naming the rank") {
  scripted c(2, 3);
  std::int32_t v = 3;
  CHECK_THROWS_WITH_AS(allreduce_avg(c, &v, 1, dtype::i32),
                       doctest::Contains("allreduce_avg on rank 2: dtype i32"),
                       invalid_parameter_error);
  CHECK(c.calls_.empty());
}

TEST_CASE("the host helpers refuse a communicator with device buffers") {
  scripted c(0, 2);
  c.device_ = true;
  float v = 1;
  unsigned char b = 0, out[2] = {};
  CHECK_THROWS_WITH_AS(barrier(c), doctest::Contains("device buffers"), invalid_parameter_error);
  CHECK_THROWS_AS(allgather(c, &b, out, 1), invalid_parameter_error);
  CHECK_THROWS_AS(allreduce_avg(c, &v, 1, dtype::f32), invalid_parameter_error);
  CHECK(c.calls_.empty());
}
