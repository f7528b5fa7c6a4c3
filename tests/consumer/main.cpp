// A trainer that uses Cadence through CMake: picks a policy from a string and runs it, and
// moves a value through the in-process transport.
#include <cadence/cadence.hpp>
#include <cadence/transport/inproc.hpp>

#include <cstdio>
#include <cstring>

int main() {
  cadence::any_controller sync = cadence::make_controller("ssp:1", 2);
  sync.push(0, 1.0);
  const cadence::decision d = sync.push(0, 2.0);  // two ahead of worker 1: waits
  if (d.proceed || sync.config() != "ssp:1") return 1;
  if (std::strcmp(CADENCE_VERSION_STRING, CONSUMER_EXPECTED_VERSION) != 0) {
    std::printf("header version %s, package version %s\n", CADENCE_VERSION_STRING,
                CONSUMER_EXPECTED_VERSION);
    return 1;
  }
  // The in-process transport is part of the core target.
  cadence::transport::inproc_world world(1);
  auto comm = world.join(0);
  double x = 3;
  comm.allreduce(&x, 1, cadence::transport::dtype::f64, cadence::transport::reduce_op::sum);
  if (x != 3) return 1;
  std::puts("consumer ok");
  return 0;
}
