// A link broken between two members while the leader still sees both (docs/collective.md,
// "Chaos soak", the livelock of trial 20): over ZeroMQ a peer counted lost stays lost for its
// incarnation, so after a short partition of rank 1, while a new process of rank 3 was being
// admitted, ranks 1 and 3 counted each other lost for good and rank 0, the leader, counted
// neither. Every sync then failed at once on ranks 1 and 3 (a message to a lost peer cannot be
// posted), and the leader re-formed the same four members from their requests, about once a
// millisecond, until the guard stopped every rank after 64 re-formations without a commit. Now
// each request names the members its sender counts lost, and the leader leaves one end of such
// a link out of the next quorum (it is refused, and may come back as a new process).
//
// `sight` (membership/sight.hpp) decides who counts whom lost; the communicator here also
// refuses to post to or from a peer its rank counts lost, as the ZeroMQ backend does.
#include <cadence/core/error.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/transport/inproc.hpp>

#include "membership/membership_ranks.hpp"
#include "membership/sight.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace cadence_membership_test {
namespace broken_link_test {
namespace {

/// seeing_communicator whose point-to-point calls to or from a peer its rank counts lost fail at
/// once, as over ZeroMQ (where such a peer's messages are dropped and its socket is closed).
class cutting_communicator : public seeing_communicator {
public:
  cutting_communicator(inproc_communicator&& c, sight& s) : seeing_communicator(std::move(c), s), sight_(&s) {}
  cadence::transport::inproc_work isend(const void* buf, std::size_t bytes, int dst, int tag) {
    refuse("isend to", dst);
    return seeing_communicator::isend(buf, bytes, dst, tag);
  }
  cadence::transport::inproc_work irecv(void* buf, std::size_t bytes, int src, int tag) {
    if (src != cadence::transport::any_source) refuse("irecv from", src);
    return seeing_communicator::irecv(buf, bytes, src, tag);
  }

private:
  void refuse(const char* what, int peer) const {
    if (sight_->hides(rank(), peer))
      throw cadence::transport_error("cutting_communicator: " + std::string(what) + " rank " + std::to_string(peer) +
                                     " on rank " + std::to_string(rank()) + ": lost (the link is cut)");
  }
  sight* sight_;
};

using cut_member = cadence::membership::member<cutting_communicator>;

// Four members commit 3 syncs; then rank 1 cuts its link to rank 3 (each counts the other lost;
// ranks 0 and 2 see both) and every member syncs on. Sync 4 fails on rank 1 at once and on the
// others through its abort. The leader, rank 0, reads in the requests that ranks 1 and 3 cannot
// reach each other and leaves rank 3 out (the higher of the two). Before the fix it re-formed
// {0, 1, 2, 3} after every failed attempt and every rank stopped with "64 reconfigurations in a
// row ... the quorum cannot complete a sync".
TEST_CASE("membership: members that count each other lost are not re-formed together, sync after sync") {
  inproc_world world(4);
  sight s;
  ledger book;
  std::mutex mu;
  constexpr std::uint64_t target = 8;
  const auto res = run_joined<rank_result>(
      4, [&world, &s](int r) { return cutting_communicator(world.join(r), s); },
      [&](int rank, cutting_communicator& c, rank_result& out) {
        cut_member m(c, race_options(out, mu));
        replica r(40);
        m.add_state(r.params);
        m.start();
        run_syncs(m, r, book, 3, rank);
        if (rank == 1) s.cut(1, 3);  // before rank 1's sync 4: nobody can complete it with rank 3
        run_syncs(m, r, book, target, rank);
        finish(m, out);
      });
  // Rank 3 is refused by the leader (it would come back as a new process: rejoin.hpp).
  CHECK_MESSAGE(res[3].error.find("refused this member") != std::string::npos, res[3].error, "\n",
                events_of(res[3], mu));
  CHECK_MESSAGE(any_event(res[0], mu, "left rank 3 out of the next quorum: a link between it and rank 1 is broken"),
                events_of(res[0], mu));
  for (int r : {0, 1, 2}) {
    const auto& x = res[static_cast<std::size_t>(r)];
    CAPTURE(r);
    CHECK_MESSAGE(x.error == "", x.error, "\n", events_of(x, mu));
    CHECK(x.committed == target);
    CHECK(x.hash == res[0].hash);
    CHECK(x.last_quorum == std::vector<int>{0, 1, 2});
    // The first quorum and the one without rank 3 (one more if a request was sent before its
    // sender had seen the cut): before the fix, 64 re-formations of the same members.
    CHECK_MESSAGE(x.stats.reconfigurations <= 3, x.stats.reconfigurations, " reconfigurations\n", events_of(x, mu));
  }
  CHECK_MESSAGE(book.divergent().empty(), book.describe_divergent());
}

}  // namespace
}  // namespace broken_link_test
}  // namespace cadence_membership_test
