// Test support for the membership layer: ranks as threads of an in-process world, each a
// member with test-sized timeouts, and a ledger where every member writes the hash of its state
// (and its quorum) after every sync it commits, so a test proves that no two members ever
// committed different states at the same count (and that the survivors of every fault agree).
// Also what every membership test's rank does and ends with: a replica stepped per rank, a sync
// of it, syncs to a count, the closing sync and the record of the rank's end (rank_result);
// a fault trap at a rank's send; what the ranks must end with after a kill or a stall; a rank
// killed and restarted in its slot (restarted_rank). group_ranks.hpp adds the same for ranks
// that sync over a quorum_group; sight.hpp, ranks with their own sight of their peers.
#pragma once

#include <cadence/membership/member.hpp>
#include <cadence/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence_membership_test {

// The names every membership test uses.
namespace mb = cadence::membership;
using cadence::transport::dtype;
using cadence::transport::inproc_communicator;
using cadence::transport::inproc_world;
using namespace std::chrono_literals;

/// Timeouts a loaded CI machine meets, short enough that a test with a dozen faults stays
/// within seconds: nothing here waits for them on the path without faults.
inline cadence::membership::member_options test_options() {
  cadence::membership::member_options o;
  o.timeouts = cadence::membership::timeouts::scaled(500ms);
  o.join_timeout = 30s;
  return o;
}

/// test_options() with the op tier at 1 s and the quorum tier at 2 s: for a test that waits for
/// a stalled member to be left out, or for a race's reconfigurations.
inline cadence::membership::member_options short_options() {
  auto o = test_options();
  o.timeouts = cadence::membership::timeouts::scaled(250ms);
  return o;
}

/// An on_event hook that sets `flag` once an event line contains `part`.
inline std::function<void(const std::string&)> flag_on(std::atomic<bool>& flag, std::string part) {
  return [&flag, part](const std::string& line) {
    if (line.find(part) != std::string::npos) flag = true;
  };
}

/// Every (committed count, state hash) any member reported, with the quorum it committed in: a
/// count with two hashes is a divergent commit.
class ledger {
public:
  /// `rank` committed sync `committed` with state hash `hash`, in `quorum` (empty: not said).
  void record(int rank, std::uint64_t committed, std::uint64_t hash, std::vector<int> quorum = {}) {
    std::lock_guard<std::mutex> lock(m_);
    seen_[committed].insert(hash);
    log_[committed].push_back(entry{rank, hash, std::move(quorum)});
    by_rank_[rank] = committed;
  }
  /// record() of member `m`'s last commit, by `rank`: its count, state hash and quorum.
  template <class Member>
  void record(int rank, const Member& m) {
    record(rank, m.committed(), m.state_hash(), m.current().ranks);
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
        for (const auto& e : s.second) out += " rank " + std::to_string(e.rank) + "=" + std::to_string(e.hash);
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
    entries.erase(std::remove_if(entries.begin(), entries.end(), [rank](const entry& e) { return e.rank == rank; }),
                  entries.end());
    auto& hashes = seen_[it->second];
    hashes.clear();
    for (const auto& e : entries) hashes.insert(e.hash);
  }
  /// Whether `rank` recorded a commit of sync `count`.
  bool committed_at(int rank, std::uint64_t count) const {
    return find(rank, count, nullptr);
  }
  /// Whether `rank` recorded a commit of sync `count` in `quorum`.
  bool committed_in(int rank, std::uint64_t count, const std::vector<int>& quorum) const {
    return find(rank, count, &quorum);
  }
  /// Counts committed by anyone.
  std::size_t counts() const {
    std::lock_guard<std::mutex> lock(m_);
    return seen_.size();
  }
  /// `rank`'s last recorded count (0: none).
  std::uint64_t last(int rank) const {
    std::lock_guard<std::mutex> lock(m_);
    const auto it = by_rank_.find(rank);
    return it == by_rank_.end() ? 0 : it->second;
  }

private:
  struct entry {
    int rank;
    std::uint64_t hash;
    std::vector<int> quorum;
  };
  bool find(int rank, std::uint64_t count, const std::vector<int>* quorum) const {
    std::lock_guard<std::mutex> lock(m_);
    const auto it = log_.find(count);
    if (it == log_.end()) return false;
    for (const auto& e : it->second)
      if (e.rank == rank && (quorum == nullptr || e.quorum == *quorum)) return true;
    return false;
  }

  mutable std::mutex m_;
  std::map<std::uint64_t, std::set<std::uint64_t>> seen_;
  std::map<int, std::uint64_t> by_rank_;
  std::map<std::uint64_t, std::vector<entry>> log_;
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

/// What one rank's thread did: its error (keep_error), and what its member ended with (finish()).
struct rank_result {
  std::string error;  // what escaped the rank's body ("killed" for a fault trap's), if anything
  std::uint64_t committed = 0;  // syncs committed, the closing sync left out
  std::uint64_t hash = 0;       // the state hash at the end
  cadence::membership::member_stats stats;
  std::vector<int> last_quorum;
  std::vector<std::string> events;  // the member's event lines, where the test keeps them
};

/// body(rank, comm, result) on one thread per rank 0..n-1, each under keep_error, with the
/// communicator join(rank) returns. Result is the test's own per-rank record.
template <class Result, class Join, class Body>
std::vector<Result> run_joined(int n, Join join, Body body) {
  std::vector<Result> out(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Result& mine = out[static_cast<std::size_t>(r)];
      keep_error(mine, [&] {
        auto c = join(r);
        body(r, c, mine);
      });
    });
  for (auto& t : threads) t.join();
  return out;
}

/// run_joined() over the ranks of `world` (body(rank, inproc_communicator&, Result&)).
template <class Result = rank_result, class Body>
std::vector<Result> run_ranks(cadence::transport::inproc_world& world, int n, Body body) {
  return run_joined<Result>(n, [&world](int r) { return world.join(r); }, std::move(body));
}

/// Waits until `done()` or `limit` passes (a hang's bound, not a timing assumption).
template <class F>
bool wait_for(F&& done, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// wait_for() on a rank's thread, throwing std::runtime_error naming `what` if `limit` passes:
/// the rank's body ends with that error (keep_error) instead of going on past a state that never
/// came.
template <class F>
void await(F&& done, const char* what, std::chrono::seconds limit = std::chrono::seconds(60)) {
  if (!wait_for(std::forward<F>(done), limit))
    throw std::runtime_error(std::string("timed out after ") + std::to_string(limit.count()) + " s waiting for " + what);
}

/// Arms a fault trap in `world`: `action(world)` runs on rank `rank`'s thread as it enters its
/// send after the first `skip` (part of its messages out, the rest not).
template <class Action>
void on_send(inproc_world& world, int rank, int skip, Action action) {
  cadence::transport::inproc_step at;
  at.op = "send";
  at.skip = skip;
  world.on_step(rank, at, std::move(action));
}

/// on_send() that kills the rank: it dies part-way into its messages.
inline void kill_at_send(inproc_world& world, int rank, int skip) {
  on_send(world, rank, skip, [rank](inproc_world& w) { w.kill(rank); });
}

// ---- a rank's replica and its syncs ----

/// One replica: a parameter vector, averaged at every sync after a local step that depends on
/// the rank and on the count (so a sync that did not happen, or happened twice, shows in the
/// hash), and a small state beside it.
struct replica {
  std::vector<double> params;
  std::uint64_t steps = 0;  // the local steps taken, a counter an adapter would keep
  explicit replica(std::size_t n) : params(n, 1.0) {}
  /// A local step of `rank` after `salt` commits.
  void local_step(int rank, std::uint64_t salt) {
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i] += 0.001 * static_cast<double>((rank + 1) * static_cast<int>(i % 7 + 1)) + 1e-6 * static_cast<double>(salt);
    ++steps;
  }
};

/// Registers `r` with `m`: its parameters, and its step counter as a blob.
template <class C>
void register_state(cadence::membership::member<C>& m, replica& r) {
  m.add_state(r.params);
  m.add_state(
      "steps",
      [&r] {
        std::vector<unsigned char> out(sizeof r.steps);
        std::memcpy(out.data(), &r.steps, sizeof r.steps);
        return out;
      },
      [&r](const std::vector<unsigned char>& in) {
        REQUIRE(in.size() == sizeof r.steps);
        std::memcpy(&r.steps, in.data(), sizeof r.steps);
      });
}

/// One sync of `rank`'s member `m`: a local step of `r`, then an averaging all-reduce of it over
/// the member's view under `policy`; a commit goes to `book`.
template <class C>
cadence::membership::sync_report sync_once(cadence::membership::member<C>& m, replica& r, ledger& book, int rank,
                                           cadence::membership::on_loss policy = cadence::membership::on_loss::retry) {
  r.local_step(rank, m.committed());
  const cadence::membership::sync_report rep = m.transact(
      [&] { m.view().allreduce_average(r.params.data(), r.params.size(), cadence::transport::dtype::f64); },
      {r.params}, policy);
  // A healed member holds a donor's state as it stood at the donor's sync point (its local
  // steps since the commit included): equal to the others' only after the next commit.
  if (rep.outcome == cadence::membership::outcome::committed) book.record(rank, m);
  return rep;
}

/// sync_once() until the member has committed `target` (a failed sync is retried).
template <class C>
void run_syncs(cadence::membership::member<C>& m, replica& r, ledger& book, std::uint64_t target, int rank) {
  while (m.committed() < target) sync_once(m, r, book, rank);
}

/// After a member's last sync: the closing sync (member::finish()), then what it ended with in
/// `out`; the count leaves the closing sync out.
template <class C>
void finish(cadence::membership::member<C>& m, rank_result& out) {
  m.finish();
  out.committed = m.committed() - 1;
  out.hash = m.state_hash();
  out.stats = m.stats();
  out.last_quorum = m.current().ranks;
}

/// The body of a rank that only syncs: a member over `c` with options `o`, a replica of
/// `elements` parameters registered with it, started, syncs until it has committed `target`,
/// then finish() into `out`.
template <class C>
void sync_rank(C& c, const cadence::membership::member_options& o, std::size_t elements, ledger& book,
               std::uint64_t target, int rank, rank_result& out) {
  cadence::membership::member<C> m(c, o);
  replica r(elements);
  register_state(m, r);
  m.start();
  run_syncs(m, r, book, target, rank);
  finish(m, out);
}

/// Ranks 0..n-1 but those in `lost`, ascending: the quorum a fault's survivors end in.
inline std::vector<int> all_but(int n, std::initializer_list<int> lost) {
  std::vector<int> out;
  for (int r = 0; r < n; ++r)
    if (std::find(lost.begin(), lost.end(), r) == lost.end()) out.push_back(r);
  return out;
}

/// What every rank of `survivors` ended with after a fault: no error, `committed` syncs (the
/// closing one left out), the state hash of the first of them, and the quorum `survivors`.
template <class Result>
void check_survivors(const std::vector<Result>& res, const std::vector<int>& survivors, std::uint64_t committed) {
  for (int r : survivors) {
    CAPTURE(r);
    const Result& x = res[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(x.error == "", x.error);
    CHECK(x.committed == committed);
    CHECK(x.hash == res[static_cast<std::size_t>(survivors.front())].hash);
    CHECK(x.last_quorum == survivors);
  }
}

/// After member `stalled` of 0..3 stopped taking part (stalled, alive to the transport) and was
/// resumed once the others had re-formed without it, every one syncing to `committed`:
/// - it ended as the others (its request to come back reached them in time for a sync: admitted
///   with the state), or stopped with whichever refusal it met first (the announcement without
///   it, the leader's refusal, or, the others already gone, the rule that a minority must not go
///   on alone);
/// - the others ended with no error, `committed` syncs and one state, in the quorum without it,
///   or with it when its request, sent as it resumed, reached them in their closing sync (which
///   then admitted it: a newcomer gone by the next sync is lost there as any other).
template <class Result>
void check_stalled(const std::vector<Result>& res, int stalled, std::uint64_t committed) {
  const std::vector<int> all = {0, 1, 2, 3}, others = all_but(4, {stalled});
  const Result& back = res[static_cast<std::size_t>(stalled)];
  const std::string& e = back.error;
  if (e.empty()) {
    CHECK(back.committed == committed);
    CHECK(back.hash == res[0].hash);
    CHECK(back.last_quorum == all);
  } else {
    CHECK_MESSAGE((e.find("without this member") != std::string::npos || e.find("refused this member") != std::string::npos ||
                   e.find("must not go on alone") != std::string::npos),
                  e);
  }
  for (int r : others) {
    const Result& x = res[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(x.error == "", "rank ", r, ": ", x.error);
    CHECK(x.committed == committed);
    CHECK(x.hash == res[0].hash);
    std::string q;
    for (int m : x.last_quorum) q += std::to_string(m) + " ";
    CHECK_MESSAGE((x.last_quorum == others || x.last_quorum == all), "rank ", r, " ended in quorum ", q);
  }
}

/// After `victim` was killed (a fault trap ended its body): its error says so, and every other
/// rank of `res` ended as check_survivors() says. Returns those survivors.
template <class Result>
std::vector<int> check_killed(const std::vector<Result>& res, int victim, std::uint64_t committed) {
  CHECK(res[static_cast<std::size_t>(victim)].error == "killed");
  std::vector<int> survivors = all_but(static_cast<int>(res.size()), {victim});
  check_survivors(res, survivors, committed);
  return survivors;
}

// ---- a rank killed and restarted ----

/// A rank killed after some syncs and restarted in its slot as a new process: the threads'
/// choreography, and the states its survivors and its replacement wait for (none a time).
class restarted_rank {
public:
  /// `victim` of ranks 0..n-1 is the one killed and restarted.
  restarted_rank(int n, int victim) : n_(n), victim_(victim) {}
  /// The rank killed and restarted.
  int victim() const { return victim_; }
  /// Whether the victim's replacement has been started (in its body: whether it is the
  /// replacement).
  bool restarted() const { return restarted_; }

  /// body(rank, result) under keep_error on a thread per rank; once the victim's first body
  /// ended (killed, which is checked), its result is reset, restarted() turns true and
  /// body(victim, result) runs again in its slot: the replacement.
  template <class Result, class Body>
  std::vector<Result> run(Body body) {
    std::vector<Result> res(static_cast<std::size_t>(n_));
    std::vector<std::thread> threads;
    auto one = [&](int rank) {
      Result& out = res[static_cast<std::size_t>(rank)];
      keep_error(out, [&] { body(rank, out); });
    };
    const auto v = static_cast<std::size_t>(victim_);
    for (int r = 0; r < n_; ++r) threads.emplace_back(one, r);
    threads[v].join();
    CHECK(res[v].error == "killed");
    res[v] = Result{};
    restarted_ = true;
    threads[v] = std::thread(one, victim_);
    for (auto& t : threads) t.join();
    return res;
  }

  /// Rank `rank`'s part in the job over `world`: a member with options `o` syncing replica `r`
  /// (its commits to `book`), ended by finish() into `out`.
  /// - At first every rank starts and commits `before` syncs; then the victim dies.
  /// - A survivor goes on with `survive(m)` (admit() in it, or the replacement is never let in).
  /// - The replacement (restarted()) joins with its state overwritten, so that only the quorum's
  ///   can show; `joined(m)`; it is admitted with `after` syncs to go.
  /// Survivors and replacement then sync until target().
  template <class Joined, class Survive>
  void live(inproc_world& world, int rank, const cadence::membership::member_options& o, replica& r, ledger& book,
            std::uint64_t before, std::uint64_t after, rank_result& out, Joined&& joined, Survive&& survive) {
    auto to_the_end = [&](cadence::membership::member<inproc_communicator>& m) {
      run_syncs(m, r, book, target(), rank);
      finish(m, out);
    };
    if (rank == victim_ && restarted_) {
      inproc_communicator c = world.restart(victim_);
      cadence::membership::member<inproc_communicator> m(c, o);
      register_state(m, r);
      r.params.assign(r.params.size(), -7.0);
      asking();
      m.join();
      joined(m);
      admitted(m.committed() + after);
      to_the_end(m);
      return;
    }
    inproc_communicator c = world.join(rank);
    cadence::membership::member<inproc_communicator> m(c, o);
    register_state(m, r);
    m.start();
    run_syncs(m, r, book, before, rank);
    if (rank == victim_) {
      dying(m.nonce());
      world.kill(victim_);
      throw killed{};
    }
    survive(m);
    to_the_end(m);
  }

  /// The victim's first process, about to die: its member's `nonce`, by which the survivors
  /// tell its replacement apart.
  void dying(std::uint64_t nonce) { first_nonce_ = nonce; }
  /// The replacement, about to ask to join: the survivors' syncs may wait for its request.
  void asking() { asked_ = true; }
  /// The replacement, admitted: every member syncs until it has committed `target`.
  void admitted(std::uint64_t target) { target_ = target; }

  /// A survivor's syncs, `sync()` each, until its member `m`'s quorum holds the replacement (the
  /// loss and the admission may be one reconfiguration or two).
  template <class Member, class Sync>
  void admit(const Member& m, Sync&& sync) const {
    // nonces is in the quorum's order: the victim's entry is at its index, not at its rank.
    auto replaced = [&] {
      const int i = m.current().index_of(victim_);
      return restarted_ && i >= 0 && m.current().nonces[static_cast<std::size_t>(i)] != first_nonce_;
    };
    while (!replaced()) {
      // Once the victim is out, the next syncs wait for its replacement to ask (so the test
      // does not depend on how fast the thread starts), then admit it at a sync point.
      // (A quorum of one commits a sync without exchanging anything, so it may commit many
      // before the request arrives; the bound only catches a member that never admits it.)
      if (!m.current().contains(victim_)) await([this] { return asked_.load(); }, "the replacement's request to join");
      REQUIRE(m.committed() < 1000000);
      sync();
    }
  }
  /// The count admitted() set, once it did (throws, naming the wait, if it never does).
  std::uint64_t target() const {
    await([this] { return target_ != 0; }, "the replacement's admission");
    return target_;
  }

private:
  int n_;
  int victim_;
  std::atomic<bool> restarted_{false}, asked_{false};
  std::atomic<std::uint64_t> first_nonce_{0}, target_{0};
};

}  // namespace cadence_membership_test
