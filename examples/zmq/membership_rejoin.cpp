// A member the quorum drops while its process lives comes back by itself, over ZeroMQ
// (membership::rejoining_member, include/cadence/membership/rejoin.hpp): four ranks (threads of
// this process, each with its own ZeroMQ communicator over 127.0.0.1) average their parameters
// every 2 local steps with periodic_averager on the membership's view. After 5 merges rank 1's
// incarnation is lost while the thread lives (its communicator is aborted here, the stand-in for
// a link cut that the others outlast: they see it lost at once and go on without it); its next
// sync fails with evicted_error, and the helper makes a new communicator in slot 1, registers
// the same state with a new member and joins, which brings the quorum's state. The averager,
// built on the old incarnation's view, is built again. Prints the rejoin and each rank's end,
// and fails (exit 1) when the ranks' state hashes differ or rank 1 did not come back.
//
// With --diloco, the ranks train with DiLoCo instead (exchange::diloco_member, an outer sync
// every 2 inner steps, Nesterov outer steps), whose sync() calls member::transact() inside: the
// register function builds a diloco_member on every incarnation's member, rejoin_options'
// start, join and teardown start it, join it (the global weights, outer state and counters
// adopted) and end it before its member, and each sync runs through rejoining_member::guard(),
// which answers the drop that surfaces from dm->sync(). Fails also when the ranks' global
// weights or outer steps differ.
//
//   build-*/bin/cadence-example-zmq_membership_rejoin [state_mib] [--diloco]   (default 4 MiB)
#include <cadence/exchange/local_sgd/membership.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/membership/rejoin.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include "../membership_job.hpp"  // the rendezvous handed from rank 0, say(), record()

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace mb = cadence::membership;
namespace ex = cadence::exchange;
using cadence::transport::zmq_communicator;
using namespace membership_job;
using namespace std::chrono_literals;

namespace {

std::atomic<bool> went_on{false};  // a survivor committed a merge without rank 1
std::atomic<int> rejoined{0};      // rank 1's rejoins
std::vector<std::uint64_t> outer_steps(ranks, 0), global_hash(ranks, 0);  // --diloco: each rank's end

// How every rank comes back (both runs): 3 attempts, none for rank 0, each one said.
mb::rejoin_options rejoin_options_for(int rank, shared& s) {
  mb::rejoin_options ro;
  ro.max_attempts = 3;
  ro.may_rejoin = rank != 0;  // rank 0 hosts the rendezvous: a new communicator cannot take it over
  ro.on_rejoin = [&s, rank](const mb::rejoin_attempt& a) {
    say(s, "rank " + std::to_string(rank) + ": dropped (" + mb::drop_reason_name(a.reason) + "), rejoin attempt " +
               std::to_string(a.attempt));
  };
  return ro;
}

// Every incarnation's communicator: a new one in this rank's slot.
std::function<std::unique_ptr<zmq_communicator>(int)> connect_for(int rank, const member_setup& set) {
  return [rank, &set](int attempt) {
    const std::chrono::milliseconds limit = attempt == 0 ? 30s : set.member.timeouts.quorum;  // a rejoin: one quorum timeout
    return std::make_unique<zmq_communicator>(rank, ranks, set.zmq, cadence::transport::deadline(limit));
  };
}

// Rank 1's drop: its incarnation is lost (its communicator aborted; the thread goes on), then
// the wait until a survivor committed without it.
void drop(mb::rejoining_member<zmq_communicator>& m) {
  m.communicator().abort();
  const auto until = std::chrono::steady_clock::now() + 30s;  // bound: the others see it at once
  while (!went_on && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
}

void run(int rank, shared& s, std::size_t elements) {
  member_setup set = setup_for(rank, false, s);
  set.zmq.wait_for = cadence::transport::zmq_wait_for::self;  // a rejoin registers while the others run
  std::vector<double> params(elements, 1.0);

  mb::rejoining_member<zmq_communicator> m(
      connect_for(rank, set), set.member,
      [&](mb::member<zmq_communicator>& mm) { mm.add_state(params); },  // the same state, every incarnation
      rejoin_options_for(rank, s));
  m.start();
  using view_t = mb::quorum_view<zmq_communicator>;
  std::optional<cadence::exchange::periodic_averager<view_t>> avg(std::in_place, m.view(), 2);
  bool dropped = false;
  // At least `merges` merges, and on until rank 1 is back (every rank then stops at the same
  // merge: the one after which the quorum admitted it).
  while (m.incarnation().committed() < merges || m.incarnation().current().size() < ranks) {
    for (std::size_t i = 0; i < params.size(); i += 97) params[i] += 0.01 * (rank + 1);  // a local step
    if (!avg->step_done()) continue;
    if (rank == victim && !dropped && m.incarnation().committed() == 5) {
      dropped = true;
      drop(m);
    }
    const mb::rejoin_report r =
        m.transact([&] { avg->sync({cadence::exchange::tensor_ref(params.data(), params.size())}); }, {params});
    if (r.rejoined) {  // a new incarnation with the quorum's state: a new view, so a new averager
      say(s, "rank " + std::to_string(rank) + ": back at merge " + std::to_string(r.committed) + ", " +
                 std::to_string(static_cast<int>(r.rejoin_seconds * 1000)) + " ms after the drop");
      avg.emplace(m.view(), 2);
      ++rejoined;
      continue;
    }
    if (r.outcome != mb::outcome::committed) avg->restart_period();
    if (rank != victim && !m.incarnation().current().contains(victim)) went_on = true;
  }
  m.finish();  // the closing sync: a last merge committed here but failed elsewhere reaches the others
  const mb::member<zmq_communicator>& last = m.incarnation();
  say(s, "rank " + std::to_string(rank) + ": " + std::to_string(last.committed()) + " merges, " +
             std::to_string(m.rejoins()) + " rejoin(s), hash " + std::to_string(last.state_hash()));
  record(s, rank, last.state_hash(), last.committed());
}

// --diloco: the same job with DiLoCo, whose sync transacts inside (see the file's comment).
void run_diloco(int rank, shared& s, std::size_t elements) {
  member_setup set = setup_for(rank, false, s);
  set.zmq.wait_for = cadence::transport::zmq_wait_for::self;
  std::vector<float> w(elements, 1.0f);
  const std::vector<ex::tensor_ref> tensors{ex::tensor_ref(w.data(), w.size())};
  std::optional<ex::diloco_member<zmq_communicator>> dm;  // declared before the helper, which ends it first

  mb::rejoin_options ro = rejoin_options_for(rank, s);
  ro.start = [&] { dm->start(); };    // not member::start(): the adapter is built in the first sync
  ro.join = [&] { dm->join(); };      // member::join(), then the global weights into w
  ro.teardown = [&] { dm.reset(); };  // before its member is destroyed (it holds it)
  mb::rejoining_member<zmq_communicator> m(
      connect_for(rank, set), set.member,
      [&](mb::member<zmq_communicator>& mm) {  // every incarnation: a diloco_member on its member
        dm.emplace(mm, tensors, ex::make_outer_optimizer("nesterov:0.7:0.9"), ex::parse_diloco_config("fixed:2").options);
      },
      ro);
  m.start();
  bool dropped = false;
  while (m.incarnation().committed() < merges || m.incarnation().current().size() < ranks) {
    for (std::size_t i = 0; i < w.size(); i += 97) w[i] += 0.01f * static_cast<float>(rank + 1);  // an inner step
    if (!dm->step_done(1000)) continue;
    if (rank == victim && !dropped && m.incarnation().committed() == 5) {
      dropped = true;
      drop(m);
    }
    // The drop surfaces from dm->sync() (its member::transact()): guard() answers it.
    const mb::rejoin_report r = m.guard([&] { return dm->sync(); });
    if (r.rejoined) {  // a new diloco_member, joined: w holds the global weights, the outer steps are the quorum's
      say(s, "rank " + std::to_string(rank) + ": back at sync " + std::to_string(r.committed) + " with " +
                 std::to_string(dm->outer_steps()) + " outer steps, " +
                 std::to_string(static_cast<int>(r.rejoin_seconds * 1000)) + " ms after the drop");
      ++rejoined;
      continue;
    }
    if (rank != victim && !m.incarnation().current().contains(victim)) went_on = true;
  }
  dm->finish();  // the closing sync
  const mb::member<zmq_communicator>& last = m.incarnation();
  say(s, "rank " + std::to_string(rank) + ": " + std::to_string(last.committed()) + " syncs, " +
             std::to_string(dm->outer_steps()) + " outer steps, " + std::to_string(m.rejoins()) +
             " rejoin(s), global hash " + std::to_string(dm->global_hash()));
  {
    std::lock_guard<std::mutex> lock(s.m);
    outer_steps[static_cast<std::size_t>(rank)] = dm->outer_steps();
    global_hash[static_cast<std::size_t>(rank)] = dm->global_hash();
  }
  record(s, rank, last.state_hash(), last.committed());
}

}  // namespace

int main(int argc, char** argv) {
  double mib = 4.0;
  bool diloco = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--diloco") diloco = true;
    else mib = std::atof(argv[i]);
  }
  const auto elements = static_cast<std::size_t>(mib * 1024 * 1024 / (diloco ? sizeof(float) : sizeof(double)));
  shared s;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&s, r, elements, diloco] {
      try {
        diloco ? run_diloco(r, s, elements) : run(r, s, elements);
      } catch (const std::exception& e) {
        say(s, "rank " + std::to_string(r) + " failed: " + e.what());
        std::lock_guard<std::mutex> lock(s.m);
        s.failed = true;
      }
    });
  for (auto& t : threads) t.join();
  bool ok = !s.failed && rejoined == 1;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (s.committed[r] < merges || s.committed[r] != s.committed[0] || s.hash[r] != s.hash[0]) ok = false;
    if (outer_steps[r] != outer_steps[0] || global_hash[r] != global_hash[0]) ok = false;  // 0 without --diloco
  }
  std::printf("%s\n", ok ? "ok: rank 1 rejoined and every rank finished with the same state" : "FAILED");
  return ok ? 0 : 1;
}
