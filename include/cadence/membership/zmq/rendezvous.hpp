/// \file
/// \ingroup membership
/// A ZeroMQ job's rendezvous held by a process of its own, outside every quorum: rank 0 of the
/// communicator only answers registrations, and the members are ranks 1..N-1
/// (member_options::eligible), so any member can be lost, the first one included, and a
/// replacement can still register in its slot and join. Without it rank 0 is both a member and
/// the rendezvous: its loss is survived, but no process can register afterwards.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace cadence::membership {
/// \addtogroup membership
/// @{

/// How hold_rendezvous() runs.
struct rendezvous_options {
  /// Return once every member slot has registered at least once and none has been alive for
  /// this long (the job is over: its members said goodbye or died). Zero: never; only the
  /// caller's stop() ends the hold. Leave room for a restart: a slot lost and taken again
  /// within this time keeps the hold going.
  std::chrono::milliseconds exit_when_empty{0};
  /// The longest one wait for traffic lasts before stop() is asked again (a registration is
  /// answered at once, whatever this is).
  std::chrono::milliseconds tick{100};
  /// Called with a line for every change of a member slot seen: "rendezvous: slot 2 registered
  /// (incarnation 3)", "rendezvous: slot 2 lost (incarnation 3)".
  std::function<void(const std::string&)> on_event;
};

/// What a hold saw.
struct rendezvous_report {
  /// Processes that registered in a member slot (first starts, late joiners and restarts).
  std::uint64_t registrations = 0;
  /// Member processes lost or gone (a goodbye counts too).
  std::uint64_t losses = 0;
  /// The members alive when it returned.
  std::size_t alive = 0;
  /// Whether exit_when_empty ended it (false: stop() did).
  bool emptied = false;
  /// How long it held the rendezvous.
  double seconds = 0.0;
};

/// member_options::eligible for a job whose rank 0 holds the rendezvous: ranks 1..size-1.
/// Throws invalid_parameter_error for a size below 2 (no member would be left).
inline std::vector<int> members_besides_rendezvous(int size) {
  if (size < 2)
    throw invalid_parameter_error("cadence::membership::members_besides_rendezvous: size " + std::to_string(size) +
                                  " leaves no member besides the rendezvous (rank 0); the job needs at least 2 ranks");
  std::vector<int> ranks;
  for (int r = 1; r < size; ++r) ranks.push_back(r);
  return ranks;
}

/// Holds `comm`'s rendezvous (comm is rank 0, constructed with zmq_wait_for::self so that it
/// returns before the members arrive) until `stop()` returns true or, with
/// options.exit_when_empty, until the job is over; answers every registration meanwhile, and
/// reports each slot's registrations and losses through options.on_event. Asks stop() at least
/// every options.tick. The members run membership::member with eligible =
/// members_besides_rendezvous(size) and never send to rank 0; they call start() together
/// (one that has not come an op timeout later is left out of the first quorum, the leader
/// included, if a majority came: timeouts.hpp) and any may come later with join(). A message sent to rank 0 anyway is dropped and
/// reported through on_event. Throws invalid_parameter_error when `comm` is not rank 0, has
/// no other rank, or tick is not positive, and the communicator's errors (after abort(), for
/// example).
template <class Stop>
rendezvous_report hold_rendezvous(transport::zmq_communicator& comm, Stop&& stop, const rendezvous_options& options = {}) {
  const std::string here = "cadence::membership::hold_rendezvous: ";
  if (comm.rank() != 0)
    throw invalid_parameter_error(here + "rank " + std::to_string(comm.rank()) +
                                  " does not hold the rendezvous; only rank 0 binds it");
  if (comm.size() < 2)
    throw invalid_parameter_error(here + "a communicator of " + std::to_string(comm.size()) +
                                  " rank leaves no member besides the rendezvous (rank 0); the job needs at least 2 ranks");
  if (options.tick.count() <= 0) throw invalid_parameter_error(here + "tick must be positive");
  using clock = std::chrono::steady_clock;
  const clock::time_point began = clock::now();
  const auto n = static_cast<std::size_t>(comm.size());
  // Per slot: the incarnations counted as registered and as lost so far.
  std::vector<std::uint64_t> registered_upto(n, 0), lost_upto(n, 0);
  rendezvous_report rep;
  constexpr clock::time_point never = clock::time_point::max();
  clock::time_point empty_since = never;  // since when no member has been alive (never: one is)
  const auto say = [&](const std::string& line) {
    if (options.on_event) options.on_event(line);
  };
  unsigned char sink = 0;
  for (;;) {
    if (rep.alive > 0) {
      // A wait that answers registrations as they come (the engine serves rank 0's ROUTER in
      // every call); nobody sends to rank 0, so it ends at its deadline, or early with an error
      // when every member is lost meanwhile (which only that call sees: the loop goes on). A
      // stray message on this tag is taken and dropped, whatever its size (one of another
      // size fails this receive alone, consumed, so it cannot fail every later wait).
      try {
        if (const auto from = comm.try_recv(&sink, sizeof sink, transport::any_source, transport::max_tag,
                                            transport::deadline(options.tick)))
          say("rendezvous: ignored a message of 1 byte from rank " + std::to_string(*from) +
              " (no member sends to rank 0)");
      } catch (const peer_error& e) {
        say(std::string("rendezvous: ignored a message to rank 0 (no member sends to it): ") + e.what());
      } catch (const transport_error&) {
        if (comm.failed()) throw;
      }
    } else {
      // With no member alive a receive from any of them fails at once: look and nap instead.
      comm.poll();
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(options.tick, std::chrono::milliseconds(10)));
    }
    // Counted by incarnations, not by sampling states: a process that registered and was lost
    // between two looks (a short-lived replacement) still counts once each way.
    std::size_t live = 0, registered = 0;
    for (std::size_t r = 1; r < n; ++r) {
      const int peer = static_cast<int>(r);
      const std::uint64_t inc = comm.incarnation(peer);
      const bool now_alive = comm.peer_state(peer) == transport::zmq_peer_state::alive;
      for (; registered_upto[r] < inc; ++rep.registrations)
        say("rendezvous: slot " + std::to_string(r) + " registered (incarnation " + std::to_string(++registered_upto[r]) +
            ")");
      // Every incarnation before the current one is gone; the current one too unless alive.
      const std::uint64_t gone = now_alive ? inc - 1 : inc;
      for (; lost_upto[r] < gone; ++rep.losses)
        say("rendezvous: slot " + std::to_string(r) + " lost (incarnation " + std::to_string(++lost_upto[r]) + ")");
      live += now_alive ? 1 : 0;
      registered += inc > 0 ? 1 : 0;
    }
    rep.alive = live;
    if (live > 0 || registered < n - 1)
      empty_since = never;
    else if (empty_since == never)
      empty_since = clock::now();
    if (stop()) break;
    if (options.exit_when_empty.count() > 0 && empty_since != never &&
        clock::now() - empty_since >= options.exit_when_empty) {
      rep.emptied = true;
      break;
    }
  }
  rep.seconds = std::chrono::duration<double>(clock::now() - began).count();
  return rep;
}

/// @}
}  // namespace cadence::membership
