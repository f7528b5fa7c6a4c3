// Test support for the membership layer: ranks as threads of an in-process world, each a
// member with test-sized timeouts, and a ledger where every member writes the hash of its state
// after every sync it commits, so a test proves that no two members ever committed different
// states at the same count (and that the survivors of every fault agree).
#pragma once

#include <algorithm>
#include <cadence/membership/member.hpp>
#include <cadence/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence_membership_test {

using namespace std::chrono_literals;

/// Timeouts a loaded CI machine meets, short enough that a test with a dozen faults stays
/// within seconds: nothing here waits for them on the path without faults.
inline cadence::membership::member_options test_options() {
  cadence::membership::member_options o;
  o.timeouts = cadence::membership::timeouts::scaled(500ms);
  o.join_timeout = 30s;
  return o;
}

/// Every (committed count, state hash) any member reported: a count with two hashes is a
/// divergent commit.
class ledger {
public:
  void record(int rank, std::uint64_t committed, std::uint64_t hash) {
    std::lock_guard<std::mutex> lock(m_);
    seen_[committed].insert(hash);
    log_[committed].emplace_back(rank, hash);
    by_rank_[rank] = committed;
  }
  /// Counts with more than one hash.
  std::vector<std::uint64_t> divergent() const {
    std::lock_guard<std::mutex> lock(m_);
    std::vector<std::uint64_t> out;
    for (const auto& s : seen_)
      if (s.second.size() > 1) out.push_back(s.first);
    return out;
  }
  /// "count: rank=hash ..." for each divergent count, for a failure message.
  std::string describe_divergent() const {
    std::lock_guard<std::mutex> lock(m_);
    std::string out;
    for (const auto& s : log_)
      if (seen_.at(s.first).size() > 1) {
        out += std::to_string(s.first) + ":";
        for (const auto& e : s.second) out += " rank " + std::to_string(e.first) + "=" + std::to_string(e.second);
        out += "\n";
      }
    return out;
  }
  /// Forgets `rank`'s record of its last commit: for a member killed right after a sync it
  /// committed alone (the others had not completed it and, without it, run that sync again on
  /// the survivors), whose last commit is then the survivors' to decide, not a divergence.
  void forget_last(int rank) {
    std::lock_guard<std::mutex> lock(m_);
    const auto it = by_rank_.find(rank);
    if (it == by_rank_.end()) return;
    auto& entries = log_[it->second];
    entries.erase(std::remove_if(entries.begin(), entries.end(), [rank](const auto& e) { return e.first == rank; }),
                  entries.end());
    auto& hashes = seen_[it->second];
    hashes.clear();
    for (const auto& e : entries) hashes.insert(e.second);
  }
  std::size_t counts() const {
    std::lock_guard<std::mutex> lock(m_);
    return seen_.size();
  }
  std::uint64_t last(int rank) const {
    std::lock_guard<std::mutex> lock(m_);
    const auto it = by_rank_.find(rank);
    return it == by_rank_.end() ? 0 : it->second;
  }

private:
  mutable std::mutex m_;
  std::map<std::uint64_t, std::set<std::uint64_t>> seen_;
  std::map<int, std::uint64_t> by_rank_;
  std::map<std::uint64_t, std::vector<std::pair<int, std::uint64_t>>> log_;
};

/// Thrown from an inproc fault trap on the victim's own thread: it ends that rank's body.
struct killed {};

/// Runs fn() on a rank's thread; an exception escaping it is kept in `out.error` ("killed" for
/// a fault trap's), so the test checks it after the join.
template <class Result, class Fn>
void keep_error(Result& out, Fn&& fn) {
  try {
    fn();
  } catch (const killed&) {
    out.error = "killed";
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

/// body(rank, comm, result) on one thread per rank of `world`, each under keep_error. Result is
/// the test's own per-rank record.
template <class Result, class Body>
std::vector<Result> run_ranks(cadence::transport::inproc_world& world, int n, Body body) {
  std::vector<Result> out(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Result& mine = out[static_cast<std::size_t>(r)];
      keep_error(mine, [&] {
        cadence::transport::inproc_communicator c = world.join(r);
        body(r, c, mine);
      });
    });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace cadence_membership_test
