/// \file
/// \ingroup membership
/// What a member of a fault-tolerant collective job is told: its timeouts, who may take part,
/// the smallest quorum worth going on with, the tags it may use on the communicator, and the
/// sizes its collectives and state transfers move in.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/membership/timeouts.hpp>
#include <cadence/transport/communicator.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// Tags the membership layer uses on the communicator, from tag_base: the control channel and
/// its bodies, the state transfer, the view's own point-to-point tags and the collectives'.
/// The application must not use [tag_base, tag_base + reserved_tags) on the same communicator.
inline constexpr int reserved_tags = 2400;

/// How a member takes part.
struct member_options {
  /// The timeout hierarchy (timeouts.hpp); checked at construction.
  membership::timeouts timeouts{};
  /// Communicator ranks that take part in quorums (empty: all). A rank outside it never joins a
  /// quorum (the ZeroMQ rendezvous held by a process of its own, for example).
  std::vector<int> eligible;
  /// The fewest members a quorum may have. A reconfiguration that would leave fewer fails with
  /// quorum_error. At least 1.
  std::size_t min_size = 1;
  /// First tag of the reserved range [tag_base, tag_base + reserved_tags) on the communicator.
  int tag_base = transport::max_tag + 1 - reserved_tags;
  /// All-reduces of at most this many bytes (and any with fewer elements than members) send
  /// every member's data to every member and reduce in member order; larger ones run the ring.
  std::size_t small_bytes = 64 * 1024;
  /// The ring's piece: each message of a ring all-reduce carries at most this many bytes (a
  /// multiple of the element size is used). Over ZeroMQ at most a quarter of credit_bytes, so a
  /// piece leaves at once from the caller's buffer.
  std::size_t piece_bytes = 512 * 1024;
  /// The state transfer to a newcomer or a member left behind moves the state tensors in
  /// messages of at most this many bytes, spread over every member that holds the committed
  /// state (so several stream in parallel).
  std::size_t transfer_bytes = 1024 * 1024;
  /// At most this many members at the committed count stream the state, each a share of the
  /// pieces. One (the default) sends a single replica's state, as it stood at that member's
  /// sync point; more are faster but mix replicas, so use them only where every member holds
  /// the same state at a sync point (BSP, with the optimizer step inside the sync), never for
  /// model averaging after a fault (members then differ by their local steps).
  std::size_t max_donors = 1;
  /// The first quorum streams the leader's state to every other member, so the replicas start
  /// identical even when they were not initialised alike.
  bool sync_initial_state = false;
  /// A newcomer (member::join) waits this long to be admitted: up to the quorum's next sync
  /// point, then the state transfer.
  std::chrono::milliseconds join_timeout{120000};
  /// How many times transact() runs a sync whose quorum changed under it (on_loss::retry),
  /// counting the first attempt, before it discards it.
  int max_attempts = 8;
  /// Called on the owning thread with a line for the application's log at every change of
  /// membership (a quorum formed, a member lost or admitted, a state transfer).
  std::function<void(const std::string&)> on_event;

  /// Throws invalid_parameter_error naming the first bad field (`size`: the communicator's).
  void check(int size) const {
    timeouts.check();
    const std::string here = "cadence::membership::member_options: ";
    if (min_size < 1) throw invalid_parameter_error(here + "min_size must be >= 1");
    if (tag_base < 0 || tag_base + reserved_tags - 1 > transport::max_tag)
      throw invalid_parameter_error(here + "tag_base " + std::to_string(tag_base) + " leaves no room for the " +
                                    std::to_string(reserved_tags) + " reserved tags below max_tag (" +
                                    std::to_string(transport::max_tag) + ")");
    if (piece_bytes < 8) throw invalid_parameter_error(here + "piece_bytes must be >= 8");
    if (transfer_bytes < 8) throw invalid_parameter_error(here + "transfer_bytes must be >= 8");
    if (max_attempts < 1) throw invalid_parameter_error(here + "max_attempts must be >= 1");
    if (max_donors < 1) throw invalid_parameter_error(here + "max_donors must be >= 1");
    for (int r : eligible)
      if (r < 0 || r >= size)
        throw invalid_parameter_error(here + "eligible rank " + std::to_string(r) + " is out of range [0, " +
                                      std::to_string(size) + ")");
  }
};

/// @}
}  // namespace cadence::membership
