// Test support for the membership's races (quorum_race_test.cpp, link_fault_test.cpp): each rank
// of an in-process world with its own sight of its peers. The in-process transport sees a rank
// lost only when it is killed; a stopped process, or one behind a cut link, is seen lost by its
// peers' heartbeats one peer at a time. `sight` gives each rank its own list of the peers it
// counts as lost (the communicator's peer_lost() extension) and a hook after every send, so a
// test decides who sees whom gone, and when. Also the ranks' threads over it, the options that
// keep a rank's event lines, and searches of them.
#pragma once

#include <cadence/membership/member.hpp>
#include <cadence/transport/inproc.hpp>

#include "membership/membership_ranks.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence_membership_test {

/// Which peers each rank counts as lost beyond the transport, and a hook after every send.
class sight {
public:
  void hide(int observer, int peer) {
    std::lock_guard<std::mutex> lock(m_);
    hidden_.insert({observer, peer});
  }
  void show(int observer, int peer) {
    std::lock_guard<std::mutex> lock(m_);
    hidden_.erase({observer, peer});
  }
  /// The link between `a` and `b` cut: each counts the other lost.
  void cut(int a, int b) {
    hide(a, b);
    hide(b, a);
  }
  bool hides(int observer, int peer) const {
    std::lock_guard<std::mutex> lock(m_);
    return hidden_.count({observer, peer}) != 0;
  }
  /// Called on the sender's thread after each send was posted: (from, buffer, bytes, to, tag).
  std::function<void(int, const void*, std::size_t, int, int)> after_send;

private:
  mutable std::mutex m_;
  std::set<std::pair<int, int>> hidden_;
};

/// The in-process communicator with a rank's own sight of its peers.
class seeing_communicator : public cadence::transport::inproc_communicator {
public:
  seeing_communicator(cadence::transport::inproc_communicator&& c, sight& s)
      : cadence::transport::inproc_communicator(std::move(c)), sight_(&s) {}
  bool peer_lost(int peer) const {
    return sight_->hides(rank(), peer) || cadence::transport::inproc_communicator::peer_lost(peer);
  }
  cadence::transport::inproc_work isend(const void* buf, std::size_t bytes, int dst, int tag) {
    cadence::transport::inproc_work w = cadence::transport::inproc_communicator::isend(buf, bytes, dst, tag);
    if (sight_->after_send) sight_->after_send(rank(), buf, bytes, dst, tag);
    return w;
  }

private:
  sight* sight_;
};

/// body(rank, seeing_communicator&, Result&) on one thread per rank of `world` (run_joined()),
/// each rank's communicator with its sight of its peers in `s`.
template <class Result = rank_result, class Body>
std::vector<Result> run_ranks(cadence::transport::inproc_world& world, int n, sight& s, Body body) {
  return run_joined<Result>(n, [&world, &s](int r) { return seeing_communicator(world.join(r), s); }, std::move(body));
}

/// A race's member, over its rank's own sight of its peers.
using member_t = cadence::membership::member<seeing_communicator>;

/// A race's rank up to its fault: replica `r`'s parameters (alone) registered with `m`, `m`
/// started, and syncs until it has committed `count`.
inline void start_syncing(member_t& m, replica& r, ledger& book, std::uint64_t count, int rank) {
  m.add_state(r.params);
  m.start();
  run_syncs(m, r, book, count, rank);
}

/// Test options (op 1 s, quorum 2 s) with the rank's events kept in `out` (under `mu`), and
/// `also` called with each.
inline cadence::membership::member_options race_options(rank_result& out, std::mutex& mu,
                                                        std::function<void(const std::string&)> also = {}) {
  auto o = short_options();
  o.on_event = [&out, &mu, also](const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(mu);
      out.events.push_back(line);
    }
    if (also) also(line);
  };
  return o;
}

inline bool any_event(const rank_result& r, std::mutex& mu, const std::string& part) {
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& e : r.events)
    if (e.find(part) != std::string::npos) return true;
  return false;
}

inline std::string events_of(const rank_result& r, std::mutex& mu) {
  std::lock_guard<std::mutex> lock(mu);
  std::string s;
  for (const auto& e : r.events) s += "  " + e + "\n";
  return s;
}

}  // namespace cadence_membership_test
