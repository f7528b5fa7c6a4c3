// A trainer that uses Cadence through CMake: picks a policy from a string and runs it.
#include <cadence/cadence.hpp>

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
  std::puts("consumer ok");
  return 0;
}
