// A collective job that survives a lost rank, over ZeroMQ (include/cadence/membership/): four
// ranks (threads of this process, each with its own ZeroMQ communicator over 127.0.0.1) average
// their parameters every 2 local steps with periodic_averager on a membership view. Rank 1
// drops out abruptly after 5 merges (its communicator closes: peers see it lost at once, as
// after kill -9); the others re-form and go on; a new communicator takes rank 1's slot, joins
// and receives the state. Prints each rank's reconfigurations and the time the first took, and
// fails (exit 1) when the survivors' state hashes differ or a rank did not finish.
//
// With --holder, rank 0 is no member: it only holds the rendezvous
// (membership/zmq/rendezvous.hpp), so the rank that drops out, rank 1, is the quorum's leader,
// and its replacement can still register (without a holder, losing rank 0 would leave no
// rendezvous for a replacement).
//
//   build-*/bin/cadence-example-zmq_membership [state_mib] [--holder]   (default 4 MiB)
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include "../membership_job.hpp"  // the four ranks as threads, the rendezvous, the final check

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace mb = cadence::membership;
using cadence::transport::zmq_communicator;
using namespace membership_job;
using namespace std::chrono_literals;

namespace {

void run(int rank, bool replacement, shared& s, std::size_t elements) {
  const member_setup set = setup_for(rank, replacement, s);
  zmq_communicator comm(rank, ranks, set.zmq, cadence::transport::deadline(30s));
  mb::member<zmq_communicator> m(comm, set.member);
  std::vector<double> params(elements, 1.0);
  m.add_state(params);
  if (replacement)
    m.join();
  else
    m.start();
  cadence::exchange::periodic_averager<mb::quorum_view<zmq_communicator>> avg(m.view(), 2);
  // At least `merges` merges, and on until the replacement is in (every rank then stops at
  // the same merge: the one after which the quorum admitted it).
  while (m.committed() < merges || m.current().size() < member_count(s)) {
    for (std::size_t i = 0; i < params.size(); i += 97) params[i] += 0.01 * (rank + 1);  // a local step
    if (!avg.step_done()) continue;
    const mb::sync_report r = m.transact([&] { avg.sync({cadence::exchange::tensor_ref(params.data(), params.size())}); },
                                         {params});
    if (r.outcome != mb::outcome::committed) avg.restart_period();
    if (rank == victim && !replacement && m.committed() == 5)
      return;  // the communicator closes here: the others see rank 1 lost at once
  }
  m.finish();  // the closing sync: a last merge committed here but failed elsewhere reaches the others
  const mb::member_stats st = m.stats();
  say(s, "rank " + std::to_string(rank) + (replacement ? " (replacement)" : "") + ": " +
             std::to_string(m.committed()) + " merges, " + std::to_string(st.reconfigurations) +
             " quorums, last reconfiguration " + std::to_string(static_cast<int>(st.last_reconfiguration_seconds * 1000)) +
             " ms, state received " + std::to_string(st.state_received_bytes) + " bytes in " +
             std::to_string(static_cast<int>(st.state_receive_seconds * 1000)) + " ms, hash " +
             std::to_string(m.state_hash()));
  record(s, rank, m.state_hash(), m.committed());
}

}  // namespace

int main(int argc, char** argv) {
  shared s;
  return run_job(argc, argv, s, run);
}
