/// \file
/// \ingroup membership
/// What a fault-tolerant sync reports, what an adapter's contract asks of a sync that loses a
/// member, and what a member counts: the vocabulary shared by member.hpp and its users.
#pragma once

#include <cadence/membership/quorum.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// What transact() does with a sync whose quorum changed under it and that no survivor
/// completed (when one did, everyone ends up with its result: see outcome::healed).
enum class on_loss : std::uint8_t {
  /// Restore the backup and run the sync again on the new quorum (model averaging: the local
  /// steps since the last merge are worth keeping).
  retry,
  /// Give the step up on every survivor (BSP gradients: nobody applies an update, and the
  /// parameters stay identical; the next step starts from them).
  discard,
};

/// How a sync ended on this member. Every member of the quorum that formed after it ends in
/// the same state: committed and healed members hold the same committed result, discarded
/// ones all gave it up.
enum class outcome : std::uint8_t {
  /// The sync completed here; its result is in the tensors (apply it: the optimizer step).
  /// Where a newcomer may join, apply it inside the sync's body instead: a newcomer admitted
  /// at this sync receives the registered state as the body left it, before transact()
  /// returns, so an update applied after it would be missing from the newcomer's copy for
  /// good (the chaos soak found it: docs/collective.md, "Chaos soak").
  committed,
  /// The sync failed here but completed on another member, or this member was behind: this
  /// member received the state of a member that committed it (the parameters and the
  /// registered state, already updated). Do not apply the sync's result again.
  healed,
  /// No member completed the sync: it was given up everywhere (on_loss::discard, or retries
  /// exhausted). The backup, if any, was restored (with attempts 0 the sync never ran here:
  /// see sync_report::attempts).
  discarded,
};

/// The name of `o`: "committed", "healed" or "discarded".
constexpr const char* outcome_name(outcome o) noexcept {
  switch (o) {
    case outcome::committed: return "committed";
    case outcome::healed: return "healed";
    case outcome::discarded: return "discarded";
  }
  return "unknown";
}

/// What transact() returns.
struct sync_report {
  /// How the sync ended here.
  membership::outcome outcome = membership::outcome::committed;
  /// Syncs committed by the quorum so far (this one included when committed or healed).
  std::uint64_t committed = 0;
  /// Runs of the sync (1 without a fault; 0 when it was given up before it ran here: the
  /// members that healed this member at its previous sync had begun this one and gave it up).
  int attempts = 1;
  /// Reconfigurations this sync went through.
  int reconfigurations = 0;
};

/// A reconfiguration as every member sees it (member::on_change): the quorum before and after,
/// who was lost and who was admitted, and whether this member received the state.
struct change {
  /// The quorum before (empty for a newcomer).
  quorum before;
  /// The quorum after.
  quorum after;
  /// Ranks of `before` not in `after` (or back as another process).
  std::vector<int> lost;
  /// Ranks of `after` that were not in `before` as the same process.
  std::vector<int> admitted;
  /// Whether this member received the state (it was new, or behind).
  bool healed = false;
  /// Syncs committed by the quorum.
  std::uint64_t committed = 0;
};

/// What a member has counted since it started.
struct member_stats {
  std::uint64_t reconfigurations = 0;   ///< quorums adopted (the first included)
  std::uint64_t failed_syncs = 0;       ///< syncs whose quorum changed under them
  std::uint64_t retries = 0;            ///< syncs run again on a new quorum
  std::uint64_t discarded = 0;          ///< syncs given up
  std::uint64_t healed = 0;             ///< times this member received the state
  std::uint64_t state_sent_bytes = 0;   ///< state bytes this member streamed to others
  std::uint64_t state_received_bytes = 0;  ///< state bytes it received
  double state_receive_seconds = 0;     ///< time from posting its receives to its last state byte, summed
  std::uint64_t drained_messages = 0;   ///< stale messages of failed syncs taken and dropped
  double last_reconfiguration_seconds = 0;  ///< the latest reconfiguration, from its start
};

/// @}
}  // namespace cadence::membership
