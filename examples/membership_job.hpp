// The job around the membership examples (zmq/membership.cpp and gloo/membership.cpp, which
// differ only in how a rank averages, and zmq/diloco.cpp, which trains with DiLoCo): four ranks
// as threads of this process, each with its own ZeroMQ communicator meeting at rank 0's
// rendezvous on 127.0.0.1; rank 1 leaves and a new thread takes its slot; at the end every rank
// must have made the same commits to the same state. With --holder, rank 0 only holds the
// rendezvous (membership::hold_rendezvous) and ranks 1..3 are the members, so the rank that
// leaves is the quorum's leader. Each example's run() is the part to read.
#pragma once

#include <cadence/membership/options.hpp>
#include <cadence/membership/timeouts.hpp>
#include <cadence/membership/zmq/rendezvous.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace membership_job {

constexpr int ranks = 4;
constexpr int victim = 1;           // the rank that drops out and is replaced
constexpr std::uint64_t merges = 12;  // every rank merges at least this often

// What the ranks (threads) share: rank 0's rendezvous address, the job secret and the results.
struct shared {
  std::mutex m;
  std::condition_variable cv;
  std::string address;
  cadence::transport::job_secret secret = cadence::transport::job_secret::generate();
  std::vector<std::uint64_t> hash = std::vector<std::uint64_t>(ranks, 0);
  std::vector<std::uint64_t> committed = std::vector<std::uint64_t>(ranks, 0);
  bool failed = false;
  bool holder = false;  // --holder: rank 0 holds the rendezvous and is no member
};

// The members' ranks (membership::member_options::eligible): every rank, or 1..3 with --holder.
inline std::vector<int> members(const shared& s) {
  return s.holder ? cadence::membership::members_besides_rendezvous(ranks) : std::vector<int>{};
}

// How many members the job has when none is missing.
inline std::size_t member_count(const shared& s) { return static_cast<std::size_t>(s.holder ? ranks - 1 : ranks); }

// Rank r's communicator options: the membership's heartbeats, and rank 0's rendezvous (rank 0
// binds it and publishes the address; the others wait for it).
inline cadence::transport::zmq_options options_for(int r, shared& s, const cadence::membership::timeouts& t) {
  cadence::transport::zmq_options o;
  o.secret = s.secret;
  o.heartbeat_interval = t.heartbeat_interval;
  o.heartbeat_timeout = t.heartbeat_timeout;
  if (r == 0) {
    o.rendezvous = "tcp://127.0.0.1:0";
    o.on_rendezvous_bound = [&s](const std::string& a) {
      std::lock_guard<std::mutex> lock(s.m);
      s.address = a;
      s.cv.notify_all();
    };
  } else {
    std::unique_lock<std::mutex> lock(s.m);
    s.cv.wait(lock, [&] { return !s.address.empty(); });
    o.rendezvous = s.address;
  }
  return o;
}

// One line on stdout, whole among the threads.
inline void say(shared& s, const std::string& line) {
  std::lock_guard<std::mutex> lock(s.m);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// A member rank's options: the examples' timeouts (heartbeat 1 s < op 4 s < quorum 8 s), its
// lines through say(), the members; and its communicator's (a replacement's construction waits
// for its own registration only: the world is running).
struct member_setup {
  cadence::membership::member_options member;
  cadence::transport::zmq_options zmq;
};
inline member_setup setup_for(int rank, bool replacement, shared& s) {
  member_setup m;
  m.member.timeouts = cadence::membership::timeouts::scaled(std::chrono::milliseconds(1000));
  m.member.on_event = [&s](const std::string& line) { say(s, "  " + line); };
  m.member.eligible = members(s);  // --holder: ranks 1..3 (rank 0 holds the rendezvous)
  m.zmq = options_for(rank, s, m.member.timeouts);
  if (replacement) m.zmq.wait_for = cadence::transport::zmq_wait_for::self;
  return m;
}

// What a rank ends with, for the check at the end.
inline void record(shared& s, int rank, std::uint64_t state_hash, std::uint64_t committed) {
  std::lock_guard<std::mutex> lock(s.m);
  s.hash[static_cast<std::size_t>(rank)] = state_hash;
  s.committed[static_cast<std::size_t>(rank)] = committed;
}

// Rank 0 with --holder: holds the rendezvous until every member has left, saying what it saw.
inline void hold(shared& s, const cadence::membership::timeouts& t) {
  cadence::transport::zmq_options o = options_for(0, s, t);
  o.wait_for = cadence::transport::zmq_wait_for::self;  // the members come after
  cadence::transport::zmq_communicator comm(0, ranks, o, cadence::transport::deadline(std::chrono::seconds(30)));
  cadence::membership::rendezvous_options ro;
  ro.exit_when_empty = std::chrono::milliseconds(500);
  ro.on_event = [&s](const std::string& line) { say(s, "  " + line); };
  const cadence::membership::rendezvous_report r = cadence::membership::hold_rendezvous(comm, [] { return false; }, ro);
  say(s, "rank 0 (rendezvous): " + std::to_string(r.registrations) + " registrations, " + std::to_string(r.losses) +
             " losses");
}

// The ranks: run(rank, replacement) for every member rank (hold() for rank 0 with --holder),
// then for a replacement in the victim's slot once the victim's thread has returned. Exit 0
// when every member finished with the same commits (at least `least`) and state hash, else 1.
template <class Run>
int run_ranks(shared& s, std::uint64_t least, Run run) {
  auto guarded = [&](int r, bool replacement) {
    try {
      if (s.holder && r == 0)
        hold(s, cadence::membership::timeouts::scaled(std::chrono::milliseconds(1000)));
      else
        run(r, replacement);
    } catch (const std::exception& e) {
      say(s, "rank " + std::to_string(r) + " failed: " + e.what());
      std::lock_guard<std::mutex> lock(s.m);
      s.failed = true;
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(guarded, r, false);
  threads[victim].join();
  threads[victim] = std::thread(guarded, victim, true);  // a new process in rank 1's slot
  for (auto& t : threads) t.join();
  bool ok = !s.failed;
  const std::size_t first = s.holder ? 1 : 0;  // the first member
  for (std::size_t r = first; r < ranks; ++r)
    if (s.committed[r] < least || s.committed[r] != s.committed[first] || s.hash[r] != s.hash[first]) ok = false;
  std::printf("%s\n", ok ? "ok: every rank finished with the same state" : "FAILED: the ranks differ");
  return ok ? 0 : 1;
}

// The job of the two membership examples: argv[1] MiB of parameters (default 4), argv[2]
// --holder or nothing; run(rank, replacement, s, elements) on every rank as run_ranks() has it,
// every member making at least `merges` merges.
template <class Run>
int run_job(int argc, char** argv, shared& s, Run run) {
  const double mib = argc > 1 ? std::atof(argv[1]) : 4.0;
  const auto elements = static_cast<std::size_t>(mib * 1024 * 1024 / sizeof(double));
  s.holder = argc > 2 && std::string(argv[2]) == "--holder";
  return run_ranks(s, merges, [&](int r, bool replacement) { run(r, replacement, s, elements); });
}

}  // namespace membership_job
