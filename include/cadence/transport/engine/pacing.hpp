// Pacing a polling wait: spin while the wait is young (a small operation completes in
// microseconds, and yielding would give the core away for a whole time slice on a busy
// machine), then sleep between polls so that a stalled job does not burn its cores.
#pragma once

#include <cadence/transport/communicator.hpp>

#include <chrono>
#include <thread>

namespace cadence::transport::detail {

struct polling_pace {
  std::chrono::microseconds spin_for{200000};
  std::chrono::microseconds sleep{50};
  /// Yield between polls while spinning (a wait on a device, whose work needs no host core).
  bool yield_while_spinning = false;

  /// Between two polls of a wait that began at `since`.
  void pause(deadline::clock::time_point since) const {
    if (deadline::clock::now() - since >= spin_for)
      std::this_thread::sleep_for(sleep);
    else if (yield_while_spinning)
      std::this_thread::yield();
  }
};

}  // namespace cadence::transport::detail
