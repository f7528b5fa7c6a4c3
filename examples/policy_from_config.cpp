// Choosing a synchronization policy at run time and driving it from a parameter server's
// push handler. The controller is pure: the server passes each push's timestamp in, so the
// same trace always gives the same decisions.
#include <cadence/cadence.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const std::string policy = argc > 1 ? argv[1] : "dssp:1:4";
  const std::size_t workers = 3;
  cadence::any_controller sync = cadence::make_controller(policy, workers);

  // A recorded trace: (worker, push time in seconds). Worker 2 is a straggler.
  const struct { cadence::worker_id worker; double t; } trace[] = {
      {0, 1.0}, {1, 1.1}, {0, 2.0}, {1, 2.2}, {2, 2.5}, {0, 3.0}, {1, 3.3},
      {0, 4.0}, {1, 4.4}, {2, 5.0}, {0, 5.0}, {1, 5.5}, {2, 7.5},
  };
  std::printf("policy %s\n", sync.config().c_str());
  for (const auto& push : trace) {
    if (sync.is_waiting(push.worker)) continue;  // a waiting worker is not computing
    const cadence::decision d = sync.push(push.worker, push.t);
    std::printf("t=%.1f worker %u clock %lld: %s", push.t, push.worker,
                static_cast<long long>(sync.clock(push.worker)), d.proceed ? "proceeds" : "waits");
    for (const cadence::worker_id q : d.released) std::printf(", releases %u", q);
    std::printf(" (max staleness %lld)\n", static_cast<long long>(sync.max_staleness()));
  }
  // A worker that dies must be removed, or whoever waits for it waits forever.
  for (const cadence::worker_id q : sync.remove_worker(2)) std::printf("removing 2 releases %u\n", q);
  return 0;
}
