/// \file
/// \ingroup membership
/// quorum_group over NCCL: an nccl_communicator made among each quorum's members, its unique id
/// made by the quorum's leader and broadcast over the membership's view, and aborted
/// (ncclCommAbort, never ncclCommDestroy of a communicator a lost peer may still hold an operation
/// on) whenever the quorum changes or the group fails.
///
/// This header needs no CUDA: it takes the NCCL function table (transport::nccl_api). Pass
/// transport::real_nccl_api() (cadence/transport/nccl/communicator.hpp, target cadence::nccl) for
/// the real NCCL; the tests pass a fake's.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/membership/quorum_group.hpp>
#include <cadence/transport/nccl/api.hpp>
#include <cadence/transport/nccl/protocol.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// The data communicator of nccl_quorum_group: an nccl_communicator (its calls, stream and
/// contract unchanged) that is aborted, not finalized, when the group lets it go.
///
/// The group lets a communicator go when its quorum changed (a member lost or admitted), when a
/// call on it failed, and when the group itself goes. A peer of the old quorum may be gone, and
/// NCCL gives no bound on ncclCommFinalize or ncclCommDestroy while a peer of the communicator
/// holds an operation that will never complete; ncclCommAbort returns without the peers. So the
/// destructor raises abort() first, and nccl_communicator's own destructor, on the owning
/// thread, then calls ncclCommAbort instead of finalizing. Every operation the group started on
/// it completed or failed before (the blocking calls poll to completion; a work handle of an
/// earlier communicator is refused by the group).
class nccl_group_communicator : public transport::nccl_communicator {
public:
  /// nccl_communicator's construction over `bootstrap` (the membership's view) with `api`, on
  /// `device`, with `options`, within `d`.
  template <class Bootstrap>
  nccl_group_communicator(const transport::nccl_api& api, Bootstrap& bootstrap, int device,
                          transport::nccl_options options, transport::deadline d)
      : transport::nccl_communicator(api, bootstrap, device, options, d) {}
  nccl_group_communicator(const nccl_group_communicator&) = delete;
  nccl_group_communicator& operator=(const nccl_group_communicator&) = delete;
  /// Aborts (ncclCommAbort, on the owning thread): see the class.
  ~nccl_group_communicator() { abort(); }
};

/// A quorum_group whose data communicator is NCCL's.
template <class C>
using nccl_quorum_group = quorum_group<C, nccl_group_communicator>;

/// The factory of nccl_quorum_group over member `m`: per quorum, an nccl_group_communicator on
/// CUDA device `device` (this process's GPU, the same for every quorum), built through `api`
/// with `options` over the quorum's view as its bootstrap communicator.
///
/// The view is the bootstrap: the quorum's leader (view rank 0) makes a fresh ncclUniqueId and
/// broadcasts it over the view, every member initialises NCCL with its view rank (non-blocking
/// init, polled until the group_spec's deadline, the op timeout), the members agree that all are
/// set up, and meet at a barrier on the view. A member lost during the build fails the view's
/// broadcast (the membership names it), a member that never initialises fails the init at the
/// deadline (NCCL cannot say which; the error names the members awaited): either way the build
/// fails the sync through quorum_group, and the retry on the re-formed quorum builds again with
/// a new unique id. The view carries host memory only (the id and one byte per member).
///
/// `options.shutdown_wait` does not matter here (the communicator is aborted, never finalized).
/// `options.stream`, when set, is the stream of every communicator the group builds.
template <class C>
std::function<std::unique_ptr<nccl_group_communicator>(const group_spec&)> nccl_group_factory(
    member<C>& m, transport::nccl_api api, int device, transport::nccl_options options = {}) {
  return [&m, api = std::move(api), device, options](const group_spec& s) {
    auto& view = m.view();
    if (view.rank() != s.rank || view.size() != s.size)
      throw transport_error("cadence::membership::nccl_group_factory: quorum " + std::to_string(s.quorum_id) +
                            "'s spec says rank " + std::to_string(s.rank) + " of " + std::to_string(s.size) +
                            " but the member's view is rank " + std::to_string(view.rank()) + " of " +
                            std::to_string(view.size()) + " (a factory of another member's group?)");
    return std::make_unique<nccl_group_communicator>(api, view, device, options, s.until);
  };
}

/// An nccl_quorum_group over member `m` (nccl_group_factory with `api`, `device`, `options`;
/// `base_prefix` starts each quorum's `group_spec::prefix`, unused by NCCL, which meets through the
/// leader's unique id).
/// With the real NCCL: `make_nccl_group(m, transport::real_nccl_api(), local_rank)`.
///
/// Buffers: the data calls take device buffers (capabilities().device_buffers, from the start),
/// as nccl_communicator's do, on its stream after
/// options.caller_stream. The membership's own buffers stay in host memory: the state a member
/// registers (add_state), the backup of transact() and what a joiner is sent are copied and
/// hashed by the CPU, so a GPU job registers a host copy of what it must keep identical.
template <class C>
std::unique_ptr<nccl_quorum_group<C>> make_nccl_group(member<C>& m, transport::nccl_api api, int device,
                                                      transport::nccl_options options = {},
                                                      std::string base_prefix = "cadence-data") {
  return std::make_unique<nccl_quorum_group<C>>(m, nccl_group_factory(m, std::move(api), device, options),
                                                std::move(base_prefix), buffer_memory::device);
}

/// @}
}  // namespace cadence::membership
