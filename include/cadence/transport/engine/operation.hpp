// One started operation as the progress engine tracks it: what every backend records about a
// send, a receive or a collective (its call, buffer, arguments, fate), and the state the shared
// collective algorithms (transport/algorithms/) keep in it between progress passes.
#pragma once

#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/signature.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cadence::transport::detail {

enum class op_kind : std::uint8_t { send, recv, allreduce, broadcast };

/// A backend's operation derives from it and adds its native handles (an MPI request, a gloo
/// buffer). The engine reads the common part only; the fields marked "algorithm" belong to
/// whichever collective algorithm runs the operation.
struct operation {
  op_kind what = op_kind::send;
  call_info c{};
  bool active = false;     // a collective started (the ones before it are done); p2p: posted
  bool done = false;
  bool cancelled = false;  // a receive withdrawn before it matched
  bool failed = false;     // the communicator failed while it was in flight
  bool orphan = false;     // its communicator was destroyed
  int source = -1;         // recv: the sender, once known; send: the destination
  int peer = -1;           // send: destination; recv: source as asked; broadcast: root
  int tag = 0;
  void* buf = nullptr;
  const void* cbuf = nullptr;
  std::size_t bytes = 0, count = 0;
  dtype type = dtype::u8;
  reduce_op rop = reduce_op::sum;
  bool average = false;
  collective_signature sig{};

  // ---- algorithm state ----
  bool ring = false;                 // the ring all-reduce (else the small one)
  int phase = 0;                     // the algorithm's state
  int round = 0;                     // doubling: the exchange round
  int step = 0;                      // ring: the step whose pieces come next
  int posted_step = -1;              // ring: the last step whose receives are posted
  std::size_t piece = 0;             // ring: the next piece of that step; broadcast: pieces left
  std::size_t root_piece = 0;        // broadcast: the root's piece size (its message says it)
  std::size_t sends_done = 0;        // ring: sends completed, in order
  std::vector<std::size_t> sent_by;  // ring: sends posted up to and including each step
  std::vector<char> awaiting;        // per rank: a notice still to come from it
  collective_summary summary{};      // doubling: the lowest and highest arguments seen
  bool staged = false;               // ring: the first piece went out from the staging copy

  bool finished() const noexcept { return done || cancelled || failed; }
  bool collective() const noexcept { return what == op_kind::allreduce || what == op_kind::broadcast; }
  /// For the work handle: the sender of a completed receive, the peer otherwise.
  int source_or_peer() const noexcept { return source >= 0 ? source : peer; }
};

}  // namespace cadence::transport::detail
