// A collective job over gloo that survives a lost rank (membership::quorum_group): the
// membership runs over ZeroMQ (heartbeats, quorum, state transfer), the averages over a gloo
// communicator re-made among each quorum's members through one TCP store that outlives every
// rank. Four ranks (threads of this process, on 127.0.0.1) average their parameters every 2
// local steps with periodic_averager on the group. Rank 1 drops out abruptly after 5 merges (its
// communicators close, as after kill -9): the others' gloo all-reduce fails, they re-form, and
// the next merge rebuilds gloo on three; a new process takes rank 1's slot, joins, receives the
// state, and gloo is rebuilt on four. Prints each rank's gloo builds and the last build's time,
// and fails (exit 1) when the ranks' state hashes differ or a rank did not finish.
//
//   build-*/bin/cadence-example-gloo_membership [state_mib] [--holder]   (default 4 MiB; --holder:
//   rank 0 only holds the rendezvous, as in zmq/membership.cpp)
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/membership/gloo/group.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/transport/tcp_store.hpp>
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

void run(int rank, bool replacement, shared& s, const std::string& store, std::size_t elements) {
  const member_setup set = setup_for(rank, replacement, s);
  zmq_communicator comm(rank, ranks, set.zmq, cadence::transport::deadline(30s));
  mb::member<zmq_communicator> m(comm, set.member);
  std::vector<double> params(elements, 1.0);
  m.add_state(params);
  cadence::transport::gloo_options go;
  go.rendezvous = store;  // gloo's rendezvous: the job's TCP store
  go.store.secret = s.secret;
  auto data = mb::make_gloo_group(m, go);  // gloo among each quorum's members, built at its first use
  if (replacement)
    m.join();
  else
    m.start();
  cadence::exchange::periodic_averager<mb::gloo_quorum_group<zmq_communicator>> avg(*data, 2);
  // At least `merges` merges, and on until the replacement is in (every rank then stops at
  // the same merge: the one after which the quorum admitted it).
  while (m.committed() < merges || m.current().size() < member_count(s)) {
    for (std::size_t i = 0; i < params.size(); i += 97) params[i] += 0.01 * (rank + 1);  // a local step
    if (!avg.step_done()) continue;
    const mb::sync_report r =
        data->transact([&] { avg.sync({cadence::exchange::tensor_ref(params.data(), params.size())}); }, {params});
    if (r.outcome != mb::outcome::committed) avg.restart_period();
    if (rank == victim && !replacement && m.committed() == 5)
      return;  // its communicators close here: the others see rank 1 lost at once
  }
  m.finish();  // the closing sync: a last merge committed here but failed elsewhere reaches the others
  const mb::member_stats st = m.stats();
  const mb::quorum_group_stats gs = data->stats();
  say(s, "rank " + std::to_string(rank) + (replacement ? " (replacement)" : "") + ": " +
             std::to_string(m.committed()) + " merges, " + std::to_string(st.reconfigurations) +
             " quorums, " + std::to_string(gs.builds) + " gloo builds (last " +
             std::to_string(static_cast<int>(gs.last_build_seconds * 1000)) + " ms, longest " +
             std::to_string(static_cast<int>(gs.max_build_seconds * 1000)) + " ms), " +
             std::to_string(gs.data_failures) + " gloo failures, state received " +
             std::to_string(st.state_received_bytes) + " bytes, hash " + std::to_string(m.state_hash()));
  record(s, rank, m.state_hash(), m.committed());
}

}  // namespace

int main(int argc, char** argv) {
  shared s;
  cadence::transport::tcp_store_options so;
  so.secret = s.secret;
  cadence::transport::tcp_store_server store("127.0.0.1:0", so);  // outlives every rank, as a launcher's
  const std::string address = store.address();
  return run_job(argc, argv, s, [&](int rank, bool replacement, shared& sh, std::size_t elements) {
    run(rank, replacement, sh, address, elements);
  });
}
