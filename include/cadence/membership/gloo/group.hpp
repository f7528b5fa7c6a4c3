/// \file
/// \ingroup membership
/// quorum_group over gloo (target cadence::gloo): a gloo_communicator made among each quorum's
/// members through the job's rendezvous, under a fresh prefix per quorum.
#pragma once

#include <cadence/membership/member.hpp>
#include <cadence/membership/quorum_group.hpp>
#include <cadence/transport/gloo/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// A quorum_group whose data communicator is gloo's.
template <class C>
using gloo_quorum_group = quorum_group<C, transport::gloo_communicator>;

/// The factory of gloo_quorum_group: a gloo_communicator with `options` (the job's
/// rendezvous: a store folder, or a tcp_store_server's address), its prefix the group's.
///
/// The rendezvous must outlive the loss of any rank: a store folder, or a tcp_store_server
/// the job serves for its whole life (serve_rendezvous is cleared: a communicator's rank 0
/// serving the store only while it constructs would make rank 0 of every quorum a store host).
/// A short shutdown_wait (at most 200 ms) keeps the old communicator's teardown off the
/// reconfiguration's path: its goodbye waits for a stalled peer no longer than that.
inline std::function<std::unique_ptr<transport::gloo_communicator>(const group_spec&)> gloo_group_factory(
    transport::gloo_options options) {
  options.serve_rendezvous = false;
  options.shutdown_wait = std::min(options.shutdown_wait, std::chrono::milliseconds(200));
  return [options = std::move(options)](const group_spec& s) {
    transport::gloo_options o = options;
    o.prefix = s.prefix;
    return std::make_unique<transport::gloo_communicator>(s.rank, s.size, std::move(o), s.until);
  };
}

/// A gloo_quorum_group over member `m` with gloo `options` (gloo_group_factory), its prefixes
/// starting with `base_prefix`.
template <class C>
std::unique_ptr<gloo_quorum_group<C>> make_gloo_group(member<C>& m, transport::gloo_options options,
                                                      std::string base_prefix = "cadence-data") {
  return std::make_unique<gloo_quorum_group<C>>(m, gloo_group_factory(std::move(options)), std::move(base_prefix));
}

/// @}
}  // namespace cadence::membership
