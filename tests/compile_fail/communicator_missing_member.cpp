// Must not compile: transport::barrier on a type that has every communicator member but
// broadcast() (requirement 3 of cadence/transport/communicator.hpp). It must stop at
// CADENCE_REQUIRE_COMMUNICATOR, whose message names the library and the concept, with the
// instantiation that names the type, even though barrier itself never calls broadcast().
// check.cmake matches the compiler's output against each "expected error" line (a regex).
//
// expected error: cadence: C does not model transport::communicator
// expected error: is_communicator_v<no_broadcast>
#include <cadence/transport/collectives.hpp>

#include <cstddef>

using namespace cadence::transport;

struct no_broadcast {
  int rank() const { return 0; }
  int size() const { return 1; }
  void allreduce(void*, std::size_t, dtype, reduce_op, deadline) {}
  void send(const void*, std::size_t, int, int, deadline) {}
  int recv(void*, std::size_t, int, int, deadline) { return 0; }
  void abort() noexcept {}
  bool failed() const { return false; }
  capability_flags capabilities() const { return {}; }
};

int main() {
  no_broadcast c;
  barrier(c);
}
