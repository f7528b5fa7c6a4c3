/// \file
/// \ingroup membership
/// The errors of the membership layer: a sync that lost a member (recoverable: the quorum
/// re-forms), a member that was left out of the quorum (it must come back as a new process),
/// and a quorum that cannot re-form.
#pragma once

#include <cadence/core/error.hpp>

#include <cstdint>
#include <string>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// A collective of a sync failed because the quorum changed under it: a member was lost,
/// stopped past the op timeout, or abandoned the sync (it told the others). Recoverable:
/// member::transact() catches it, re-forms the quorum and retries or discards the sync; every
/// call on the quorum's view throws it until then. Thrown to the caller only from a view used
/// outside transact().
class sync_failed : public transport_error {
public:
  /// `what` names the view, the call and the fault; `quorum_id` the quorum it happened in.
  sync_failed(const std::string& what, std::uint64_t quorum_id) : transport_error(what), quorum_id_(quorum_id) {}
  /// The id of the quorum whose sync failed.
  std::uint64_t quorum_id() const noexcept { return quorum_id_; }

private:
  std::uint64_t quorum_id_;
};

/// This member is no longer in the quorum: the others re-formed without it (it was stopped or
/// cut off past the timeouts, its reconfiguration report came too late, or it found itself on
/// the minority side). Its state may differ from the quorum's, so it must not go on: destroy
/// the member and its communicator and come back as a new process (a new communicator, then a
/// member that joins), which receives the quorum's state.
class evicted_error : public error {
public:
  using error::error;
};

/// The quorum cannot re-form: more than half of its members (or half with the leader) are
/// gone, fewer than the minimum size remain, or no member at the committed step survives to
/// hand its state on. The job stops here with this error on every survivor rather than go on
/// as two groups or from a state nobody can vouch for.
class quorum_error : public error {
public:
  using error::error;
};

/// @}
}  // namespace cadence::membership
