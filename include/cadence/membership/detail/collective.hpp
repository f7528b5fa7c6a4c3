// One collective of a quorum, run over the communicator's point-to-point calls (isend, irecv,
// test) among the quorum's members only: the small all-reduce (every member's data to every
// member, reduced in member order), the ring (reduce-scatter, then allgather, in pieces,
// pipelined, on the caller's buffer), and the broadcast. It keeps every message it posted and
// took, peer by peer, so that after a failure the survivors drain exactly the messages still on
// their way (member core, "drain") and no stale message ever meets a later receive.
//
// Why not the shared algorithms of transport/algorithms/ over a wire of point-to-point calls:
// those post receives of a whole piece's capacity and let the data say how much came (MPI's and
// gloo's receives allow it); the communicator concept matches sizes exactly (a receive of
// another size fails), so every receive here is posted with the exact size the ring's schedule
// (ring_schedule, shared with them) gives.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/membership/detail/frames.hpp>
#include <cadence/transport/algorithms/ring.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/reduce.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::membership::detail {

using clock = std::chrono::steady_clock;

/// The communicator's work handle.
template <class C>
using work_t = decltype(std::declval<C&>().isend(std::declval<const void*>(), std::size_t{}, int{}, int{}));

template <class W, class = void>
struct has_wait_until : std::false_type {};
template <class W>
struct has_wait_until<W, std::void_t<decltype(std::declval<W&>().wait_until(std::declval<clock::time_point>()))>>
    : std::true_type {};

/// Waits on `w` until it completes (true) or `t` comes (false: no failure). Where the handle has
/// wait_until (ZeroMQ: asleep in zmq_poll until a message, a peer's fate or abort(); MPI and
/// gloo: their progress engine) the thread waits inside the backend; elsewhere (the in-process
/// and NCCL handles) it tests and sleeps 50 us, in a loop. Throws what the handle's test()
/// throws (a lost peer).
template <class W>
bool block_on(W& w, clock::time_point t) {
  if constexpr (has_wait_until<W>::value) {
    return w.wait_until(t);
  } else {
    if (w.test()) return true;
    const auto now = clock::now();
    if (now < t) std::this_thread::sleep_for(std::min<clock::duration>(t - now, std::chrono::microseconds(50)));
    return w.test();
  }
}

/// A buffer aligned for any element type (8 bytes), not moved once allocated.
class byte_buffer {
public:
  void resize(std::size_t bytes) {
    if (bytes <= size_) return;
    data_.reset(new double[(bytes + sizeof(double) - 1) / sizeof(double)]);
    size_ = bytes;
  }
  unsigned char* get() const noexcept { return reinterpret_cast<unsigned char*>(data_.get()); }
  std::size_t size() const noexcept { return size_; }

private:
  std::unique_ptr<double[]> data_;
  std::size_t size_ = 0;
};

/// The members disagree on a collective (another count, dtype, op or root; another sync): a
/// bug of the application, not a fault of the quorum, so it is not retried.
class op_mismatch : public transport_error {
public:
  using transport_error::transport_error;
};

/// One collective among the members `ranks` (communicator ranks; this member is `me`, an index
/// into them), on communicator tag `tag`. start() posts what it can, advance() progresses it
/// without blocking and says when it is complete; a lost peer surfaces as the transport_error
/// of the handle that needed it. The members' public state is the drain's record.
template <class C>
class p2p_collective {
public:
  using work = work_t<C>;

  struct params {
    op_kind kind = op_kind::allreduce;
    void* buf = nullptr;
    std::size_t count = 0;  // elements (all-reduce) or bytes (broadcast)
    transport::dtype type = transport::dtype::u8;
    transport::reduce_op rop = transport::reduce_op::sum;
    bool average = false;
    int root = 0;  // broadcast: view rank
    std::size_t small_bytes = 64 * 1024;
    std::size_t piece_bytes = 512 * 1024;
  };

  /// A message this member posted, to or from member `peer` (an index), of `bytes`.
  struct message {
    int peer = -1;
    std::size_t bytes = 0;
    work w;
    bool done = false;    // completed
    bool failed = false;  // its handle threw (the peer was lost)
  };

  p2p_collective(C& comm, std::vector<int> ranks, int me, int tag, std::uint64_t seq, const notice& mine,
                 const params& p)
      : comm_(&comm), ranks_(std::move(ranks)), me_(me), tag_(tag), seq_(seq), mine_(mine), p_(p) {}

  p2p_collective(const p2p_collective&) = delete;
  p2p_collective& operator=(const p2p_collective&) = delete;

  // ---- the drain's record ----
  /// Messages posted to members, and taken from them, in posting order.
  std::deque<message> outs, ins;
  /// This operation's number in its quorum and its tag.
  std::uint64_t seq() const noexcept { return seq_; }
  int tag() const noexcept { return tag_; }
  /// Whether the collective completed here.
  bool complete() const noexcept { return done_; }
  /// Whether some member's notice said it knows of a newcomer (valid once complete).
  bool joiner_seen() const noexcept { return joiner_seen_; }
  /// The collective's notice, for errors.
  const notice& call() const noexcept { return mine_; }

  void start() {
    const int n = size();
    const std::size_t bytes = total_bytes();
    if (mine_.flags & notice::joiner_flag) joiner_seen_ = true;
    if (n == 1) {  // the buffer is the result (the mean of one value is itself)
      done_ = true;
      return;
    }
    if (p_.kind == op_kind::allreduce) {
      if (bytes <= p_.small_bytes || p_.count < static_cast<std::size_t>(n))
        start_small();
      else
        start_ring();
    } else {
      start_broadcast(bytes <= p_.small_bytes);
    }
  }

  /// Progresses without blocking; true once complete. Throws transport_error from a handle (a
  /// lost peer) and op_mismatch when a member called another collective.
  bool advance() {
    if (done_) return true;
    switch (algo_) {
      case algo::small: done_ = advance_small(); break;
      case algo::ring: done_ = advance_ring(); break;
      case algo::bcast: done_ = advance_broadcast(); break;
    }
    return done_;
  }

  /// The handle this collective waits on now (the one its last advance() stopped at), or null.
  work* next_wait() {
    if (wanted_ != nullptr && !wanted_->done && !wanted_->failed) return &wanted_->w;
    for (message& m : ins)
      if (!m.done && !m.failed) return &m.w;
    for (message& m : outs)
      if (!m.done && !m.failed) return &m.w;
    return nullptr;
  }

  /// The members a deadline names: those whose messages have not all come.
  std::vector<int> awaited_ranks() const {
    std::vector<int> who;
    for (const message& m : ins)
      if (!m.done && std::find(who.begin(), who.end(), ranks_[static_cast<std::size_t>(m.peer)]) == who.end())
        who.push_back(ranks_[static_cast<std::size_t>(m.peer)]);
    if (who.empty())
      for (const message& m : outs)
        if (!m.done && std::find(who.begin(), who.end(), ranks_[static_cast<std::size_t>(m.peer)]) == who.end())
          who.push_back(ranks_[static_cast<std::size_t>(m.peer)]);
    std::sort(who.begin(), who.end());
    return who;
  }

private:
  enum class algo : std::uint8_t { small, ring, bcast };

  int size() const noexcept { return static_cast<int>(ranks_.size()); }
  std::size_t esize() const noexcept {
    return p_.kind == op_kind::allreduce ? transport::dtype_size(p_.type) : std::size_t{1};
  }
  std::size_t total_bytes() const noexcept { return p_.count * esize(); }

  void post_send(int peer, const void* data, std::size_t bytes) {
    message m;
    m.peer = peer;
    m.bytes = bytes;
    m.w = comm_->isend(data, bytes, ranks_[static_cast<std::size_t>(peer)], tag_);
    outs.push_back(std::move(m));
  }
  void post_recv(int peer, void* into, std::size_t bytes) {
    message m;
    m.peer = peer;
    m.bytes = bytes;
    m.w = comm_->irecv(into, bytes, ranks_[static_cast<std::size_t>(peer)], tag_);
    ins.push_back(std::move(m));
  }
  static bool test(message& m) {
    if (m.done) return true;
    try {
      if (m.w.test()) m.done = true;
    } catch (...) {
      m.failed = true;
      throw;
    }
    return m.done;
  }
  // Sends complete in posting order per peer, and one test progresses every handle, so the
  // scan stops at the first one still pending (each test of a pending handle is a progress pass).
  bool sends_done() {
    for (; sends_checked_ < outs.size(); ++sends_checked_)
      if (!test(outs[sends_checked_])) {
        wanted_ = &outs[sends_checked_];
        return false;
      }
    return true;
  }
  bool all_in(std::size_t from = 0) {
    for (std::size_t i = from; i < ins.size(); ++i)
      if (!test(ins[i])) {
        wanted_ = &ins[i];
        return false;
      }
    return true;
  }

  void check_notice(const notice& got, int peer) const {
    // Another quorum announced under the same id (two leaders in a race, quorum::stamp): a fault
    // of the membership, not of the application, so the sync fails instead of the member.
    if (got.magic == notice_magic && got.qid == mine_.qid && got.stamp != mine_.stamp)
      throw transport_error("cadence::membership: member " + std::to_string(me_) + " (rank " +
                            std::to_string(ranks_[static_cast<std::size_t>(me_)]) + ") received from rank " +
                            std::to_string(ranks_[static_cast<std::size_t>(peer)]) + " a message of another quorum " +
                            std::to_string(got.qid) + " than its own (another leader announced one under the same id)");
    if (got.magic != notice_magic || !got.same_call(mine_) || got.from != peer)
      throw op_mismatch("cadence::membership: members disagree on a collective: member " + std::to_string(me_) +
                        " (rank " + std::to_string(ranks_[static_cast<std::size_t>(me_)]) + ") called " +
                        mine_.describe() + ", member " + std::to_string(peer) + " (rank " +
                        std::to_string(ranks_[static_cast<std::size_t>(peer)]) + ") called " +
                        (got.magic == notice_magic ? got.describe() : std::string("something else")));
  }

  // ---- small all-reduce: [notice | data] to every member, reduced in member order ----

  void start_small() {
    algo_ = algo::small;
    const int n = size();
    const std::size_t bytes = total_bytes();
    msg_ = sizeof(notice) + bytes;
    staging_.resize(msg_);
    std::memcpy(staging_.get(), &mine_, sizeof(notice));
    if (bytes != 0) std::memcpy(staging_.get() + sizeof(notice), p_.buf, bytes);
    slots_.resize(msg_ * static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      if (i != me_) post_recv(i, slots_.get() + msg_ * static_cast<std::size_t>(i), msg_);
    for (int i = 0; i < n; ++i)
      if (i != me_) post_send(i, staging_.get(), msg_);
  }

  bool advance_small() {
    if (!all_in()) return false;
    if (!reduced_) {
      const int n = size();
      for (int i = 0; i < n; ++i) {
        if (i == me_) continue;
        notice got;
        std::memcpy(&got, slots_.get() + msg_ * static_cast<std::size_t>(i), sizeof(notice));
        check_notice(got, i);
        if (got.flags & notice::joiner_flag) joiner_seen_ = true;
      }
      // Every member reduces the same contributions in the same order: identical bits.
      auto data = [&](int i) -> const unsigned char* {
        return i == me_ ? staging_.get() + sizeof(notice) : slots_.get() + msg_ * static_cast<std::size_t>(i) + sizeof(notice);
      };
      const std::size_t bytes = total_bytes();
      if (bytes != 0) {
        std::memcpy(p_.buf, data(0), bytes);
        for (int i = 1; i < n; ++i) transport::detail::reduce_into(p_.buf, data(i), p_.count, p_.type, p_.rop);
        if (p_.average) transport::detail::divide_into(p_.buf, p_.buf, p_.count, p_.type, static_cast<double>(n));
      }
      reduced_ = true;
    }
    return sends_done();
  }

  // ---- the ring, on the caller's buffer ----

  transport::detail::ring_schedule schedule() const {
    const std::size_t es = esize();
    return {size(), me_, p_.count, es, transport::detail::element_limit(p_.piece_bytes, es)};
  }

  void start_ring() {
    algo_ = algo::ring;
    const auto g = schedule();
    const int n = size();
    notices_.resize(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      if (i != me_) post_recv(i, &notices_[static_cast<std::size_t>(i)], sizeof(notice));
    notice_ins_ = ins.size();
    for (int i = 0; i < n; ++i)
      if (i != me_) post_send(i, &mine_, sizeof(notice));
    scratch_[0].resize(g.scratch_bytes());
    scratch_[1].resize(g.scratch_bytes());
    step_sends_.assign(static_cast<std::size_t>(g.steps()), {});
    step_recv_first_.assign(static_cast<std::size_t>(g.steps()), 0);
    post_step(g, 0);
    post_step(g, 1);
    const int seg = g.seg_out(0);
    for (std::size_t k = 0; k < g.pieces(seg); ++k) ring_send(g, 0, seg, k);
  }

  void ring_send(const transport::detail::ring_schedule& g, int step, int seg, std::size_t k) {
    step_sends_[static_cast<std::size_t>(step)].push_back(outs.size());
    post_send(g.right(), static_cast<unsigned char*>(p_.buf) + g.offset(seg, k), g.piece_len(seg, k));
  }

  // Posts step t's receives, in step order, at most a step ahead; false while its memory is not
  // free: a reduce-scatter step reuses the scratch of step t - 2 (consumed by then); an
  // allgather step writes the segment that reduce-scatter step t - (n - 1) sent from, so those
  // sends must have completed first.
  bool post_step(const transport::detail::ring_schedule& g, int t) {
    if (t >= g.steps() || posted_step_ >= t) return true;
    if (posted_step_ != t - 1) return false;
    if (!g.reduces(t)) {
      for (int j = 0; j <= t - (g.n - 1); ++j)
        for (std::size_t i : step_sends_[static_cast<std::size_t>(j)])
          if (!test(outs[i])) return false;
    }
    step_recv_first_[static_cast<std::size_t>(t)] = ins.size();
    const int seg = g.seg_in(t);
    for (std::size_t k = 0; k < g.pieces(seg); ++k) {
      if (g.reduces(t))
        post_recv(g.left(), scratch_[t % 2].get() + k * g.piece, g.piece_len(seg, k));
      else
        post_recv(g.left(), static_cast<unsigned char*>(p_.buf) + g.offset(seg, k), g.piece_len(seg, k));
    }
    posted_step_ = t;
    return true;
  }

  bool advance_ring() {
    const auto g = schedule();
    // The notices: every one that has come is checked, whatever the ring waits for.
    for (; notices_checked_ < notice_ins_; ++notices_checked_) {
      message& m = ins[notices_checked_];
      if (!test(m)) break;
      check_notice(notices_[static_cast<std::size_t>(m.peer)], m.peer);
      if (notices_[static_cast<std::size_t>(m.peer)].flags & notice::joiner_flag) joiner_seen_ = true;
    }
    const bool notices_in = notices_checked_ == notice_ins_;
    while (step_ < g.steps()) {
      const int s = step_;
      if (!post_step(g, s)) return false;
      post_step(g, s + 1);
      const int seg = g.seg_in(s);
      while (piece_ < g.pieces(seg)) {
        message& in = ins[step_recv_first_[static_cast<std::size_t>(s)] + piece_];
        if (!test(in)) {
          wanted_ = &in;
          return false;
        }
        const std::size_t k = piece_, len = g.piece_len(seg, k);
        if (g.reduces(s)) {
          unsigned char* at = static_cast<unsigned char*>(p_.buf) + g.offset(seg, k);
          const unsigned char* from = scratch_[s % 2].get() + k * g.piece;
          if (p_.average && s == g.n - 2)
            transport::detail::reduce_divide_into(at, from, len / g.esize, p_.type, static_cast<double>(g.n));
          else
            transport::detail::reduce_into(at, from, len / g.esize, p_.type, p_.rop);
        }
        if (s + 1 < g.steps()) ring_send(g, s + 1, seg, k);  // segment seg_in(s) is seg_out(s + 1)
        ++piece_;
      }
      ++step_;
      piece_ = 0;
    }
    if (!notices_in) {
      wanted_ = &ins[notices_checked_];
      return false;
    }
    return sends_done();
  }

  // ---- broadcast: from the root to every member (small: [notice | data]; large: the notice,
  // then pieces of the root's buffer) ----

  void start_broadcast(bool small) {
    algo_ = algo::bcast;
    small_bcast_ = small;
    const int n = size();
    const std::size_t bytes = total_bytes();
    const std::size_t piece = std::max<std::size_t>(1, p_.piece_bytes);
    if (small) {
      msg_ = sizeof(notice) + bytes;
      if (me_ == p_.root) {
        staging_.resize(msg_);
        std::memcpy(staging_.get(), &mine_, sizeof(notice));
        if (bytes != 0) std::memcpy(staging_.get() + sizeof(notice), p_.buf, bytes);
        for (int i = 0; i < n; ++i)
          if (i != me_) post_send(i, staging_.get(), msg_);
      } else {
        slots_.resize(msg_);
        post_recv(p_.root, slots_.get(), msg_);
      }
      return;
    }
    if (me_ == p_.root) {
      for (int i = 0; i < n; ++i) {
        if (i == me_) continue;
        post_send(i, &mine_, sizeof(notice));
        for (std::size_t k = 0; k < transport::detail::chunk_count(bytes, piece); ++k)
          post_send(i, static_cast<unsigned char*>(p_.buf) + k * piece, transport::detail::chunk_length(bytes, piece, k));
      }
    } else {
      notices_.resize(1);
      post_recv(p_.root, notices_.data(), sizeof(notice));
      for (std::size_t k = 0; k < transport::detail::chunk_count(bytes, piece); ++k)
        post_recv(p_.root, static_cast<unsigned char*>(p_.buf) + k * piece, transport::detail::chunk_length(bytes, piece, k));
    }
  }

  bool advance_broadcast() {
    if (!all_in()) return false;
    if (me_ != p_.root && !reduced_) {
      notice got;
      std::memcpy(&got, small_bcast_ ? slots_.get() : reinterpret_cast<const unsigned char*>(notices_.data()), sizeof(notice));
      check_notice(got, p_.root);
      if (small_bcast_ && total_bytes() != 0) std::memcpy(p_.buf, slots_.get() + sizeof(notice), total_bytes());
      reduced_ = true;
    }
    return sends_done();
  }

  C* comm_;
  std::vector<int> ranks_;
  int me_;
  int tag_;
  std::uint64_t seq_;
  notice mine_;
  params p_;
  algo algo_ = algo::small;
  bool done_ = false, reduced_ = false, joiner_seen_ = false, small_bcast_ = false;
  std::size_t msg_ = 0;
  byte_buffer staging_, slots_;
  std::vector<notice> notices_;
  std::size_t notice_ins_ = 0, notices_checked_ = 0, sends_checked_ = 0;
  message* wanted_ = nullptr;
  byte_buffer scratch_[2];
  std::vector<std::vector<std::size_t>> step_sends_;
  std::vector<std::size_t> step_recv_first_;
  int posted_step_ = -1, step_ = 0;
  std::size_t piece_ = 0;
};

}  // namespace cadence::membership::detail
