/// \file
/// \ingroup transport
/// The in-process backend's options and its fault-injection step: how large a message is sent
/// eagerly, and where inproc_world::on_step injects a fault. Include
/// `<cadence/transport/inproc.hpp>`, which includes this.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace cadence::transport {
/// \addtogroup transport
/// @{

/// What an inproc_world is built with.
struct inproc_options {
  /// send() of up to this many bytes copies the message and returns at once (MPI's eager
  /// protocol); a larger one waits until the matching recv() has taken it (rendezvous), as MPI
  /// and gloo do for large messages. So a protocol that only works with buffered sends fails
  /// here, on its deadline, instead of hanging later on a cluster.
  std::size_t eager_limit = 64 * 1024;
};

class inproc_world;

/// A protocol step of one rank, where inproc_world::on_step injects a fault: the rank's next
/// call of `op` ("send", "recv", "try_recv", "allreduce", "allreduce_average", "broadcast";
/// empty: any call; the asynchronous forms count as their blocking names) with this peer
/// (send: destination, recv: source as passed, broadcast: root; unset: any) and tag (unset:
/// any), after `skip` such calls have gone by.
struct inproc_step {
  /// The call's name ("send", "recv", ...; empty: any call).
  std::string op;
  /// The call's peer (send: destination, recv: source as passed, broadcast: root; unset: any).
  std::optional<int> peer;
  /// The call's tag (unset: any).
  std::optional<int> tag;
  /// Matching calls to let go by before the trap fires (not negative).
  int skip = 0;
};

/// @}
}  // namespace cadence::transport
