/// \file
/// \ingroup membership
/// The one timeout hierarchy of a fault-tolerant collective job: heartbeat < op < quorum. Each
/// tier catches what the one below cannot, so they are set together and checked together
/// instead of as independent knobs.
#pragma once

#include <cadence/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <string>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// How fast a member notices a fault, tier by tier. Every tier must be longer than the one
/// below it (check() enforces it), because each one is the fallback of the one below:
///
/// 1. **heartbeat** (`heartbeat_interval`, `heartbeat_timeout`): the transport's liveness. A
///    crashed process is lost at once (its connections close); a stopped process, a hung host
///    or a cut link once it has been silent for `heartbeat_timeout`. The membership layer reads
///    it through the communicator's `peer_lost()`; over ZeroMQ copy both values into
///    `zmq_options` (the same names), so ZeroMQ's I/O thread pings whether or not the
///    application calls in. A transport without heartbeats (in-process threads) leaves the
///    stalled-but-alive case to the next tier.
/// 2. **op**: the most one collective inside a sync may take, from its start, including the
///    wait for members that arrive later (the skew between members' arrivals at a sync point).
///    It catches a member that is alive to the transport but does not take part (an
///    application stuck in a loop, a member still computing far past the others). It is also
///    the start-up skew allowed: while the first quorum forms, a member's slot that no process
///    has taken an op timeout after start() counts as lost (over a communicator that tells,
///    `peer_absent()`: ZeroMQ), so a first member that never comes, the leader included, costs
///    that wait instead of evicting the others; it may still come later, with join().
/// 3. **quorum**: the most a reconfiguration may take: the leader's wait for every member it
///    believes alive to report, the announcement, the drain of a failed sync's messages and the
///    state transfer to a newcomer. It must exceed the op tier, since a member blocked in an op
///    first has to notice the fault (at worst at its op deadline) before it reports; and it
///    must exceed the longest time a member runs between two sync points (local SGD's k steps),
///    since a member only answers at a sync point. A follower waits twice this long for the
///    leader's announcement, then counts itself excluded (evicted_error).
///
/// Defaults suit a real cluster (a stopped node is lost in 6 s, a reconfiguration may take
/// 60 s); the tests and the chaos soak use a tenth of a second to a few seconds.
struct timeouts {
  /// How often the transport pings each peer (zmq_options::heartbeat_interval).
  std::chrono::milliseconds heartbeat_interval{1000};
  /// A peer silent this long after a ping is lost (zmq_options::heartbeat_timeout).
  std::chrono::milliseconds heartbeat_timeout{5000};
  /// The most one collective of a sync may take, from its start.
  std::chrono::milliseconds op{30000};
  /// The most a reconfiguration may take (a follower waits twice this for the announcement).
  std::chrono::milliseconds quorum{60000};

  /// Throws invalid_parameter_error naming the first tier that is not positive or not longer
  /// than the one below it (heartbeat_interval < heartbeat_timeout < op < quorum).
  void check() const {
    auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; };
    if (heartbeat_interval.count() <= 0)
      throw invalid_parameter_error("cadence::membership::timeouts: heartbeat_interval must be > 0, got " +
                                    ms(heartbeat_interval));
    if (heartbeat_timeout <= heartbeat_interval)
      throw invalid_parameter_error("cadence::membership::timeouts: heartbeat_timeout (" + ms(heartbeat_timeout) +
                                    ") must be longer than heartbeat_interval (" + ms(heartbeat_interval) +
                                    "): a peer must miss at least one ping to be lost");
    if (op <= heartbeat_timeout)
      throw invalid_parameter_error("cadence::membership::timeouts: op (" + ms(op) +
                                    ") must be longer than heartbeat_timeout (" + ms(heartbeat_timeout) +
                                    "): a lost member must be seen lost before the sync gives up on it");
    if (quorum <= op)
      throw invalid_parameter_error("cadence::membership::timeouts: quorum (" + ms(quorum) +
                                    ") must be longer than op (" + ms(op) +
                                    "): a member blocked in a sync must notice the fault before it reports");
  }

  /// A hierarchy scaled from one heartbeat timeout `hb`: interval hb/5, op 4 hb, quorum 8 hb.
  /// The tests and the chaos soak use it with hb of a few hundred milliseconds.
  static timeouts scaled(std::chrono::milliseconds hb) {
    timeouts t;
    t.heartbeat_timeout = hb;
    t.heartbeat_interval = std::max(std::chrono::milliseconds(1), hb / 5);
    t.op = 4 * hb;
    t.quorum = 8 * hb;
    return t;
  }
};

/// @}
}  // namespace cadence::membership
