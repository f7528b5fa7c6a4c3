// The MPI backend's wire (transport/algorithms/wire.hpp): how the shared collective algorithms'
// notices, data messages and ring pieces travel as non-blocking MPI on a duplicate of the
// caller's communicator, and what is abandoned when one fails.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/wire.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/signature.hpp>
#include <cadence/transport/mpi/detail/layout.hpp>
#include <cadence/transport/mpi/options.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport::detail {

/// Owned by one mpi_communicator, on its owning thread. Map of its state:
///  - comm_: the duplicate that carries notices (notice_tag: a persistent receive per peer into
///    inbox_, drained into seen_ by collective index), the small all-reduce's data messages
///    (small_tag: one receive at a time into in_, from the partner of the moment) and the ring's
///    pieces (ring_tag: receives and sends per peer, in recvs_ and sends_, completed in order).
///  - out_: the outgoing data message [head | data] (the small all-reduce's accumulator), with
///    its sends in out_reqs_; notice_sends_: notices in flight with their own words.
///  - scratch_, caller_: the ring's regions (no staging: reads_caller_early()).
///  - dirty_: something was abandoned inside MPI (its buffers are then never freed).
class mpi_wire {
public:
  static constexpr bool posts_over_delivered_sends = false;
  static constexpr int notice_tag = 0;
  static constexpr int ring_tag = 1;
  static constexpr int small_tag = 2;

  explicit mpi_wire(const mpi_options& o) : o_(o) {}
  mpi_wire(const mpi_wire&) = delete;
  mpi_wire& operator=(const mpi_wire&) = delete;

  /// Takes the duplicate for the protocols and posts a notice receive from every peer.
  void open(MPI_Comm comm, int rank, int size) {
    comm_ = comm;
    rank_ = rank;
    size_ = size;
    const auto n = static_cast<std::size_t>(size);
    inbox_.resize(n);
    notice_reqs_.assign(n, MPI_REQUEST_NULL);
    seen_.resize(n);
    last_.assign(n, 0);
    recvs_.resize(n);
    sends_.resize(n);
    for (int p = 0; p < size; ++p)
      if (p != rank) post_notice_recv(p);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm comm() const noexcept { return comm_; }
  bool dirty() const noexcept { return dirty_; }

  std::size_t inline_capacity() const noexcept {
    const std::size_t below_ring = o_.ring_min_bytes == 0 ? 0 : o_.ring_min_bytes - 1;
    return std::max(below_ring, std::size_t{8} * static_cast<std::size_t>(size_));
  }
  /// The ring's step 0 leaves from the caller's buffer at once: a failed MPI send cannot be
  /// withdrawn in any case (the buffer stays the send's; docs/transports.md, mpi).
  bool reads_caller_early() const noexcept { return true; }

  std::size_t piece_bytes(std::size_t esize) const noexcept {
    return element_limit(std::min(o_.ring_piece_bytes, o_.max_message_bytes), esize);
  }

  // ---- outgoing messages ----

  unsigned char* out_data(std::size_t n) { return grow(out_, out_size_, collective_head_bytes + n) + collective_head_bytes; }

  void send_out(const call_info& c, const std::vector<int>& to, const collective_signature& sig,
                const collective_summary& summary, std::size_t n) {
    std::memcpy(out_.get(), &sig, sizeof sig);
    std::memcpy(out_.get() + sizeof sig, &summary, sizeof summary);
    for (int p : to) {
      out_reqs_.push_back({MPI_REQUEST_NULL, p});
      check_mpi(c, MPI_Isend(out_.get(), static_cast<int>(collective_head_bytes + n), MPI_BYTE, p, small_tag, comm_,
                             &out_reqs_.back().req));
    }
  }
  bool out_sent(const call_info& c) { return reap(c, out_reqs_); }
  std::vector<int> out_pending() const { return peers_of(out_reqs_); }

  void send_notices(const call_info& c, const std::vector<int>& to, const collective_signature& sig) {
    reap_notices();
    collective_summary only = collective_summary::of(sig, rank_);
    only.lo_rank = -1;  // a notice without data
    for (int p : to) {
      notice_sends_.push_back({MPI_REQUEST_NULL, p, std::make_unique<head_words>()});
      unsigned char* w = notice_sends_.back().words->data();
      std::memcpy(w, &sig, sizeof sig);
      std::memcpy(w + sizeof sig, &only, sizeof only);
      check_mpi(c, MPI_Isend(w, static_cast<int>(collective_head_bytes), MPI_BYTE, p, notice_tag, comm_,
                             &notice_sends_.back().req));
    }
  }
  bool notices_sent(const call_info&) {
    reap_notices();
    return notice_sends_.empty();
  }
  std::vector<int> notices_pending() const {
    std::vector<int> v;
    for (const auto& s : notice_sends_) v.push_back(s.peer);
    return v;
  }

  // ---- incoming messages ----

  bool take(const call_info& c, int p, coll_stream stream, std::int64_t index, std::size_t capacity, coll_message& m) {
    if (stream == coll_stream::notice) {
      const stored* n = notice_of(p, index);
      if (n == nullptr) return false;
      m.sig = n->sig;
      m.summary = n->summary;
      m.bytes = 0;
      return true;
    }
    expect(c, p, capacity);
    int done = 0;
    MPI_Status status;
    const int rc = MPI_Test(&data_req_, &done, &status);
    if (rc != MPI_SUCCESS) {
      data_req_ = MPI_REQUEST_NULL;
      if (!mpi_truncated(rc)) throw transport_error(describe(c) + ": " + mpi_error_string(rc));
      m.too_long = true;
      return true;
    }
    if (!done) return false;
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (static_cast<std::size_t>(got) < collective_head_bytes)
      throw transport_error(describe(c) + ": rank " + std::to_string(p) + " sent a " + std::to_string(got) +
                            "-byte message where a collective message of at least " +
                            std::to_string(collective_head_bytes) + " bytes was due");
    std::memcpy(&m.sig, in_.get(), sizeof m.sig);
    std::memcpy(&m.summary, in_.get() + sizeof m.sig, sizeof m.summary);
    m.data = in_.get() + collective_head_bytes;
    m.bytes = static_cast<std::size_t>(got) - collective_head_bytes;
    return true;
  }
  /// Posts the receive of p's next data message, unless it is posted: one at a time, into in_,
  /// taking the larger of `capacity` and what a differing peer might send (so its message is
  /// read whole and its head names the difference).
  void expect(const call_info& c, int p, std::size_t capacity) {
    if (data_req_ != MPI_REQUEST_NULL) return;
    data_cap_ = std::max(capacity, std::min(inline_capacity(), std::size_t{1} << 20));
    grow(in_, in_size_, collective_head_bytes + data_cap_);
    check_mpi(c, MPI_Irecv(in_.get(), static_cast<int>(collective_head_bytes + data_cap_), MPI_BYTE, p, small_tag,
                           comm_, &data_req_));
  }

  /// Notices are kept by index (dropped once a later one is asked for); a data receive is spent.
  void release(const call_info&, int, coll_stream) noexcept {}

  /// Peer p's notice of collective `index`, if it has come (without taking it), for a protocol
  /// of the backend's own (the broadcast).
  const collective_signature* peek_notice(int p, std::int64_t index) {
    const stored* n = notice_of(p, index);
    return n == nullptr ? nullptr : &n->sig;
  }

  // ---- bulk pieces ----

  void bulk_begin(const call_info&, void* buf, std::size_t, std::size_t scratch) {
    caller_ = static_cast<unsigned char*>(buf);
    if (scratch != 0) {
      grow(scratch_[0], scratch_size_[0], scratch);
      if (size_ > 2) grow(scratch_[1], scratch_size_[1], scratch);
    }
  }
  unsigned char* bulk_base(bulk_region r) noexcept {
    switch (r) {
      case bulk_region::scratch0: return scratch_[0].get();
      case bulk_region::scratch1: return scratch_[1].get();
      case bulk_region::staging: return nullptr;  // never used: reads_caller_early()
      case bulk_region::caller: break;
    }
    return caller_;
  }
  void bulk_recv(const call_info& c, int p, bulk_region r, std::size_t offset, std::size_t capacity) {
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(c, MPI_Irecv(bulk_base(r) + offset, static_cast<int>(capacity), MPI_BYTE, p, ring_tag, comm_, &req));
    recvs_[static_cast<std::size_t>(p)].push_back(req);
  }
  void bulk_send(const call_info& c, int p, bulk_region r, std::size_t offset, std::size_t n) {
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(c, MPI_Isend(bulk_base(r) + offset, static_cast<int>(n), MPI_BYTE, p, ring_tag, comm_, &req));
    sends_[static_cast<std::size_t>(p)].push_back(req);
  }
  bool bulk_recv_done(const call_info& c, int p, std::size_t& got) {
    auto& q = recvs_[static_cast<std::size_t>(p)];
    if (q.empty()) return false;
    int done = 0;
    MPI_Status status;
    const int rc = MPI_Test(&q.front(), &done, &status);
    if (rc != MPI_SUCCESS) {
      q.pop_front();
      throw transport_error(describe(c) + ": in the ring all-reduce, rank " + std::to_string(p) +
                            (mpi_truncated(rc) ? std::string(" sent a piece longer than a piece (the ranks' piece sizes differ)")
                                               : ": " + mpi_error_string(rc)));
    }
    if (!done) return false;
    int n = 0;
    MPI_Get_count(&status, MPI_BYTE, &n);
    got = static_cast<std::size_t>(n);
    q.pop_front();
    return true;
  }
  bool bulk_send_done(const call_info& c, int p) {
    auto& q = sends_[static_cast<std::size_t>(p)];
    if (q.empty()) return true;
    int done = 0;
    check_mpi(c, MPI_Test(&q.front(), &done, MPI_STATUS_IGNORE));
    if (!done) return false;
    q.pop_front();
    return true;
  }
  void expose() noexcept {}
  void bulk_end(const call_info&) noexcept { caller_ = nullptr; }
  const void* native(wire_point, int) const noexcept { return nullptr; }

  // ---- failures and shutdown ----

  /// A collective failed: receives are cancelled; sends, which Open MPI cannot cancel, are
  /// released to complete on their own (what they read is kept, never freed).
  void abandon() noexcept {
    dirty_ = true;  // the failed collective's messages may still arrive on the duplicate
    cancel_recv(data_req_);
    for (auto& q : recvs_) {
      for (auto& r : q) cancel_recv(r);
      q.clear();
    }
    for (auto& s : out_reqs_) release_send(s.req);
    out_reqs_.clear();
    for (auto& q : sends_) {
      for (auto& r : q) release_send(r);
      q.clear();
    }
  }

  /// A broadcast's notices from every peer are due (the root completes without them).
  void expect_notices(std::int64_t index) noexcept { expected_ = std::max(expected_, index); }

  /// Whether every peer's due notices have come (waiting up to options.shutdown_wait): the
  /// destructor frees the duplicate only then, since Open MPI gives a freed context id to the
  /// next communicator, which would receive the stragglers as its own. Never throws.
  bool drained() noexcept {
    const auto until = std::chrono::steady_clock::now() + o_.shutdown_wait;
    for (;;) {
      drain();
      bool complete = true;
      for (int p = 0; p < size_; ++p)
        if (p != rank_ && last_[static_cast<std::size_t>(p)] < expected_) complete = false;
      if (complete) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(o_.poll_sleep);
    }
  }

  /// The destructor's part: the notice receives cancelled; notices still in flight keep their
  /// words; with `clean` the duplicate is freed, else every buffer MPI may touch is leaked.
  void close(bool clean) noexcept {
    for (auto& r : notice_reqs_) cancel_recv(r);
    for (auto& s : notice_sends_) {
      int done = 0;
      if (MPI_Test(&s.req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) continue;
      if (s.req != MPI_REQUEST_NULL) MPI_Request_free(&s.req);
      s.words.release();
    }
    if (clean && !dirty_) {
      if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
      return;
    }
    out_.release();
    in_.release();
    scratch_[0].release();
    scratch_[1].release();
  }

  /// Takes in every notice that has arrived.
  void drain() noexcept {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      auto& req = notice_reqs_[static_cast<std::size_t>(p)];
      for (;;) {
        int done = 0;
        if (req == MPI_REQUEST_NULL || MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
        stored n;
        std::memcpy(&n.sig, inbox_[static_cast<std::size_t>(p)].data(), sizeof n.sig);
        std::memcpy(&n.summary, inbox_[static_cast<std::size_t>(p)].data() + sizeof n.sig, sizeof n.summary);
        remember(p, n);
        post_notice_recv(p);
      }
    }
  }

private:
  using head_words = std::array<unsigned char, collective_head_bytes>;
  struct stored {
    collective_signature sig;
    collective_summary summary;
  };
  struct notice_send {
    MPI_Request req;
    int peer;
    std::unique_ptr<head_words> words;  // stable while the send is posted
  };
  struct peer_request {
    MPI_Request req;
    int peer;
  };

  static unsigned char* grow(std::unique_ptr<unsigned char[]>& b, std::size_t& size, std::size_t bytes) {
    if (!b || size < bytes) {
      b.reset(new unsigned char[std::max<std::size_t>(bytes, 1)]);
      size = bytes;
    }
    return b.get();
  }

  void post_notice_recv(int p) {
    MPI_Irecv(inbox_[static_cast<std::size_t>(p)].data(), static_cast<int>(collective_head_bytes), MPI_BYTE, p,
              notice_tag, comm_, &notice_reqs_[static_cast<std::size_t>(p)]);
  }

  void remember(int p, const stored& n) {
    auto& q = seen_[static_cast<std::size_t>(p)];
    auto& last = last_[static_cast<std::size_t>(p)];
    last = std::max(last, n.sig.index);
    auto it = q.end();
    while (it != q.begin() && std::prev(it)->sig.index > n.sig.index) --it;
    if (it != q.begin() && std::prev(it)->sig.index == n.sig.index) return;
    q.insert(it, n);
  }

  // Peer p's notice of collective `index`, if it has come; older ones are dropped.
  const stored* notice_of(int p, std::int64_t index) {
    drain();
    auto& q = seen_[static_cast<std::size_t>(p)];
    while (!q.empty() && q.front().sig.index < index) q.pop_front();
    return !q.empty() && q.front().sig.index == index ? &q.front() : nullptr;
  }

  void reap_notices() noexcept {
    for (auto it = notice_sends_.begin(); it != notice_sends_.end();) {
      int done = 0;
      if (MPI_Test(&it->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)
        it = notice_sends_.erase(it);
      else
        ++it;
    }
  }

  static bool reap(const call_info& c, std::deque<peer_request>& q) {
    for (auto it = q.begin(); it != q.end();) {
      int done = 0;
      check_mpi(c, MPI_Test(&it->req, &done, MPI_STATUS_IGNORE));
      it = done ? q.erase(it) : std::next(it);
    }
    return q.empty();
  }
  static std::vector<int> peers_of(const std::deque<peer_request>& q) {
    std::vector<int> v;
    for (const auto& r : q) v.push_back(r.peer);
    return v;
  }

  // Receives only: MPI guarantees that the wait after cancelling a receive returns locally.
  static void cancel_recv(MPI_Request& req) noexcept {
    if (req == MPI_REQUEST_NULL) return;
    MPI_Cancel(&req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  // Open MPI's MPI_Cancel does not cancel a send, and a wait would last until the receiver
  // takes the message, perhaps forever: an unfinished send is released to complete on its own.
  void release_send(MPI_Request& req) noexcept {
    if (req == MPI_REQUEST_NULL) return;
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) return;
    MPI_Request_free(&req);
    dirty_ = true;
  }

  const mpi_options& o_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool dirty_ = false;
  std::vector<head_words> inbox_;                // per peer: its notice receive's buffer
  std::vector<MPI_Request> notice_reqs_;         // per peer: the posted notice receive
  std::vector<std::deque<stored>> seen_;         // per peer: notices by index
  std::vector<std::int64_t> last_;               // per peer: the latest index it announced
  std::int64_t expected_ = 0;                    // every peer owes notices up to this index
  std::deque<notice_send> notice_sends_;
  std::unique_ptr<unsigned char[]> out_;         // [head | data]: the outgoing data message
  std::size_t out_size_ = 0;
  std::deque<peer_request> out_reqs_;
  std::unique_ptr<unsigned char[]> in_;          // [head | data]: the incoming data message
  std::size_t in_size_ = 0;
  std::size_t data_cap_ = 0;
  MPI_Request data_req_ = MPI_REQUEST_NULL;
  std::unique_ptr<unsigned char[]> scratch_[2];  // the ring's incoming pieces, by step parity
  std::size_t scratch_size_[2] = {0, 0};
  unsigned char* caller_ = nullptr;
  std::vector<std::deque<MPI_Request>> recvs_;   // per peer: ring receives, oldest first
  std::vector<std::deque<MPI_Request>> sends_;   // per peer: ring sends, oldest first
};

}  // namespace cadence::transport::detail
