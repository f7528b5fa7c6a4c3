// The ZeroMQ backend's collectives over its point-to-point engine, as state machines every
// progress pass advances (so several can be in flight): a small all-reduce that sends every
// rank's data to every other rank and reduces in rank order, a chunked ring for large ones, and
// a broadcast from the root to each rank. Every message carries the collective's arguments, so
// ranks whose arguments differ fail naming both sides instead of corrupting a buffer.
#pragma once

#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/algorithms/ring.hpp>
#include <cadence/transport/zmq/detail/colls.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cadence::transport::detail {

// Reductions read elements in place; ZeroMQ may hand over a small message at any byte offset of
// its receive buffer, so such data is copied to aligned scratch first.
inline const void* zmq_aligned(const unsigned char* p, std::size_t n, dtype t, std::vector<unsigned char>& scratch) {
  if (reinterpret_cast<std::uintptr_t>(p) % dtype_size(t) == 0) return p;
  scratch.assign(p, p + n);
  return scratch.data();
}

inline std::string zmq_never_started(const zmq_colls& e, const std::vector<int>& who) {
  bool absent = false;
  for (int p : who) absent = absent || e.state_of(p) == zmq_peer_state::absent;
  if (absent) return "some have not registered at the rendezvous; the others never started this collective";
  return who.size() == 1 ? "it never started this collective" : "they never started this collective";
}

// ---- small all-reduce ----

/// Up to max(eager_bytes, 8 * size) bytes (or fewer elements than ranks): every rank sends its
/// buffer to every other rank and all reduce the same contributions in rank order, so float
/// sums are bitwise identical everywhere. One message per peer; latency over bandwidth.
class zmq_allreduce_small final : public zmq_coll_op {
public:
  zmq_allreduce_small(const call_info& ci, void* buf, std::size_t count, dtype t, reduce_op op)
      : zmq_coll_op(kind::allreduce, ci), buf_(static_cast<unsigned char*>(buf)), count_(count), t_(t), op_(op),
        bytes_(count * dtype_size(t)) {}

  void start(zmq_colls& e) override {
    got_.resize(static_cast<std::size_t>(e.size()));
    missing_ = e.size() - 1;
    for (int p : e.others()) e.coll_send_copy(*this, p, e.coll_header(*this, p, 0, 0, bytes_), buf_, bytes_);
  }

  void advance(zmq_colls& e) override {
    for (int p = 0; p < e.size() && missing_ > 0; ++p) {
      auto& slot = got_[static_cast<std::size_t>(p)];
      if (p == e.rank() || slot.src >= 0) continue;
      auto& box = e.inbox(index, p);
      if (box.empty()) continue;
      zmq_incoming m = std::move(box.front());
      box.pop_front();
      if (!e.check_sig(*this, m)) return;
      slot = std::move(m);
      --missing_;
    }
    if (missing_ > 0 || bytes_ == 0 || reduced_) {
      done = missing_ == 0 && queued == 0;  // and its own contribution has left
      return;
    }
    // d_0 op d_1 op ... op d_{n-1}, the same on every rank.
    std::vector<unsigned char> scratch;
    auto data_of = [&](int p) -> const void* {
      if (p == e.rank()) return buf_;
      auto& m = got_[static_cast<std::size_t>(p)];
      return zmq_aligned(m.data(), bytes_, t_, scratch);
    };
    if (e.rank() == 0) {
      for (int p = 1; p < e.size(); ++p) reduce_into(buf_, data_of(p), count_, t_, op_);
    } else {
      std::vector<unsigned char> acc(bytes_);
      std::memcpy(acc.data(), data_of(0), bytes_);
      for (int p = 1; p < e.size(); ++p) reduce_into(acc.data(), data_of(p), count_, t_, op_);
      std::memcpy(buf_, acc.data(), bytes_);
    }
    got_.clear();
    got_.resize(static_cast<std::size_t>(e.size()));
    for (auto& g : got_) g.src = 0;  // every contribution is in
    reduced_ = true;
    done = queued == 0;
  }

  bool needs(int p) const override {
    return !done && p >= 0 && static_cast<std::size_t>(p) < got_.size() && got_[static_cast<std::size_t>(p)].src < 0;
  }

  void awaited(const zmq_colls& e, std::vector<int>& who, std::string& note) const override {
    for (int p : e.others())
      if (got_[static_cast<std::size_t>(p)].src < 0) who.push_back(p);
    if (who.empty()) {
      who = e.others();
      note = "this rank's contribution waits for a connection to come up";
      return;
    }
    note = zmq_never_started(e, who);
  }

private:
  unsigned char* buf_;
  std::size_t count_;
  dtype t_;
  reduce_op op_;
  std::size_t bytes_;
  std::vector<zmq_incoming> got_;  // per rank: its contribution (src >= 0 once it came)
  int missing_ = 0;
  bool reduced_ = false;
};

// ---- ring all-reduce ----

/// Larger all-reduces: reduce-scatter then allgather around the ring (rank r sends to r + 1,
/// receives from r - 1), each segment in chunks of chunk_bytes. A chunk goes on to the right as
/// soon as it is reduced (or, in the allgather, received), sent without a copy from the
/// caller's buffer; before the allgather overwrites a segment, ZeroMQ must have let go of what
/// the reduce-scatter sent from it (each segment's pieces are counted apart). Every rank also
/// sends a notice to every other rank, so arguments that differ are seen by every rank, and a
/// missing rank is named, not just the left neighbour that waits for it.
class zmq_ring_allreduce final : public zmq_coll_op {
public:
  zmq_ring_allreduce(const call_info& ci, void* buf, std::size_t count, dtype t, reduce_op op)
      : zmq_coll_op(kind::allreduce, ci), buf_(static_cast<unsigned char*>(buf)), count_(count), t_(t), op_(op),
        esize_(dtype_size(t)) {}

  void start(zmq_colls& e) override {
    g_ = {e.size(), e.rank(), count_, esize_, std::max<std::size_t>(e.options().chunk_bytes / 8 * 8, 8)};
    noticed_.assign(static_cast<std::size_t>(g_.n), false);
    noticed_[static_cast<std::size_t>(g_.r)] = true;
    for (int p : e.others()) e.coll_send_copy(*this, p, e.coll_header(*this, p, zmq_notice_step, 0, 0), nullptr, 0);
    for (std::size_t k = 0; k < g_.pieces(g_.seg_out(0)); ++k) send_chunk(e, 0, k);
  }

  void advance(zmq_colls& e) override {
    for (int p : e.others()) {
      auto& box = e.inbox(index, p);
      while (!box.empty()) {
        zmq_incoming& m = box.front();
        if (!e.check_sig(*this, m)) return;
        if (m.h.step == zmq_notice_step) {
          noticed_[static_cast<std::size_t>(p)] = true;
          box.pop_front();
          continue;
        }
        if (p != g_.left() || s_ >= g_.steps()) {  // only the left neighbour sends data
          box.pop_front();
          continue;
        }
        const int seg = g_.seg_in(s_);
        const std::size_t len = g_.piece_len(seg, k_);
        if (m.h.step != static_cast<std::uint32_t>(s_) || m.h.offset != k_ * g_.piece || m.size() != len) {
          e.mark_failed(transport_error(describe(c) + ": rank " + std::to_string(p) + " sent ring step " +
                                        std::to_string(m.h.step) + " offset " + std::to_string(m.h.offset) +
                                        " (" + std::to_string(m.size()) + " bytes) where step " +
                                        std::to_string(s_) + " offset " + std::to_string(k_ * g_.piece) + " (" +
                                        std::to_string(len) + " bytes) was due (the ranks' chunk_bytes differ?)"));
          return;
        }
        unsigned char* at = buf_ + g_.offset(seg, k_);
        if (g_.reduces(s_)) {
          reduce_into(at, zmq_aligned(m.data(), len, t_, scratch_), len / esize_, t_, op_);
        } else {
          // The reduce-scatter sent this segment's partial sums from here: ZeroMQ must be done.
          if (seg_pending(seg)) break;
          std::memcpy(at, m.data(), len);
        }
        box.pop_front();
        if (s_ + 1 < g_.steps()) send_chunk(e, s_ + 1, k_);  // seg_in(s) is seg_out(s + 1)
        if (++k_ == g_.pieces(seg)) {
          ++s_;
          k_ = 0;
        }
      }
    }
    if (s_ < g_.steps() || outstanding() != 0 || queued != 0) return;
    for (bool b : noticed_)
      if (!b) return;
    done = true;
  }

  // Only while something is still to come to this rank: pieces it sent to a rank that has since
  // gone are dropped (and released) with that rank's socket.
  bool needs(int) const override {
    if (done || s_ < g_.steps()) return !done;
    for (bool b : noticed_)
      if (!b) return true;
    return false;
  }

  void awaited(const zmq_colls& e, std::vector<int>& who, std::string& note) const override {
    for (int p : e.others())
      if (!noticed_[static_cast<std::size_t>(p)]) who.push_back(p);
    if (!who.empty()) {
      note = zmq_never_started(e, who);
      return;
    }
    if (s_ < g_.steps()) {
      who = {g_.left()};
      note = "in the ring all-reduce";
      return;
    }
    who = {g_.right()};
    note = "it has not taken the ring all-reduce's data";
  }

private:
  bool seg_pending(int seg) const {
    const auto i = static_cast<std::size_t>(seg);
    return i < rels.size() && rels[i].outstanding() != 0;
  }
  void send_chunk(zmq_colls& e, int s, std::size_t k) {
    const int seg = g_.seg_out(s);
    const std::size_t len = g_.piece_len(seg, k);
    e.coll_send_zero_copy(*this, static_cast<std::size_t>(seg), g_.right(),
                          e.coll_header(*this, g_.right(), static_cast<std::uint32_t>(s), k * g_.piece, len),
                          buf_ + g_.offset(seg, k), len);
  }

  unsigned char* buf_;
  std::size_t count_;
  dtype t_;
  reduce_op op_;
  std::size_t esize_;
  ring_schedule g_;
  std::vector<bool> noticed_;
  int s_ = 0;          // the step whose data comes next from the left
  std::size_t k_ = 0;  // its next chunk
  std::vector<unsigned char> scratch_;
};

// ---- broadcast ----

/// The root sends its buffer to every other rank: up to eager_bytes in one message copied at
/// once (the root is done then, as MPI_Bcast's root does not wait for its receivers), larger
/// ones in chunks read from the root's buffer without a copy (the root is done when ZeroMQ has
/// let go of every chunk). A receiver also watches for a message from a rank other than the
/// root: that rank believes it is the root, and the arguments differ.
class zmq_broadcast final : public zmq_coll_op {
public:
  zmq_broadcast(const call_info& ci, void* buf, std::size_t bytes, int root)
      : zmq_coll_op(kind::broadcast, ci), buf_(static_cast<unsigned char*>(buf)), bytes_(bytes) {
    peer = root;
  }

  void start(zmq_colls& e) override {
    root_ = e.rank() == peer;
    if (!root_) return;
    const std::size_t chunk = std::max<std::size_t>(e.options().chunk_bytes, 1);
    for (int p : e.others()) {
      if (bytes_ <= e.options().eager_bytes) {
        e.coll_send_copy(*this, p, e.coll_header(*this, p, 0, 0, bytes_), buf_, bytes_);
        continue;
      }
      for (std::size_t off = 0; off < bytes_; off += chunk) {
        const std::size_t len = std::min(chunk, bytes_ - off);
        e.coll_send_zero_copy(*this, 0, p, e.coll_header(*this, p, 0, off, len), buf_ + off, len);
      }
    }
  }

  void advance(zmq_colls& e) override {
    for (int p : e.others()) {
      if (p == peer) continue;
      auto& box = e.inbox(index, p);
      while (!box.empty()) {  // from a rank that believes it is the root: the signatures differ
        if (!e.check_sig(*this, box.front())) return;
        box.pop_front();
      }
    }
    if (e.rank() == peer) {
      done = outstanding() == 0 && queued == 0;  // ZeroMQ has (or has sent) every message
      return;
    }
    auto& box = e.inbox(index, peer);
    while (!box.empty()) {
      zmq_incoming& m = box.front();
      if (!e.check_sig(*this, m)) return;
      if (m.h.offset > bytes_ || bytes_ - m.h.offset < m.size()) {
        e.mark_failed(transport_error(describe(c) + ": rank " + std::to_string(peer) + " sent " +
                                      std::to_string(m.size()) + " bytes at offset " + std::to_string(m.h.offset) +
                                      " of a " + std::to_string(bytes_) + "-byte broadcast"));
        return;
      }
      if (m.size() != 0) std::memcpy(buf_ + m.h.offset, m.data(), m.size());
      got_ += m.size();
      ++messages_;
      box.pop_front();
    }
    done = messages_ > 0 && got_ >= bytes_;
  }

  // A receiver needs the root until its data is in; the root needs nobody (as MPI_Bcast's root:
  // what it sent to a rank that has since gone is dropped, and released, with that rank's socket).
  bool needs(int p) const override { return !done && p == peer && !root_; }

  void awaited(const zmq_colls& e, std::vector<int>& who, std::string& note) const override {
    if (e.rank() != peer) {
      who = {peer};
      note = e.state_of(peer) == zmq_peer_state::absent ? "it has not registered at the rendezvous"
             : messages_ == 0                           ? "it never started this broadcast"
                                                        : "the rest of the broadcast's data did not arrive";
      return;
    }
    who = rel_peers;
    note = "they have not taken the broadcast's data";
  }

private:
  unsigned char* buf_;
  std::size_t bytes_;
  std::size_t got_ = 0;
  std::size_t messages_ = 0;
  bool root_ = false;
};

}  // namespace cadence::transport::detail
