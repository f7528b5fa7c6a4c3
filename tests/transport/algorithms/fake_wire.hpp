// A scripted fake of the wire (include/cadence/transport/algorithms/wire.hpp) for n ranks in one
// thread, and a simulation that drives the collective algorithms over it: the test, not a
// network, decides when each message moves. Every send, receive and completion is an event a
// seeded scheduler fires in a random order (FIFO per sender, receiver and stream, as the wire
// promises); a test may hold events back, stop a rank, keep a rank from ever starting, or
// tamper with what travels (a signature that differs, a message longer than posted).
//
// The fake keeps the wire's requirements and checks the algorithms keep theirs (a violation is
// a `wire_misuse`, which fails the test): a send's memory is not changed before the send is
// seen to complete; no receive is posted over a pending send (posts_over_delivered_sends false)
// and none lands in memory an undelivered send still reads (true); the caller's buffer is not
// touched by the wire before expose(); a message is taken once and released before the next;
// pieces stay inside their regions. Three flavours cover the two real wires and a mix:
// mpi_like (notices kept by index on a stream of their own, data receives posted on demand,
// sizes known), gloo_like (one stream per peer, one receive always posted, sizes unknown), and
// hybrid (notices by index, receives always posted, sizes unknown).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/algorithms/broadcast.hpp>
#include <cadence/transport/algorithms/doubling.hpp>
#include <cadence/transport/algorithms/ring.hpp>
#include <cadence/transport/algorithms/wire.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/engine/engine.hpp>
#include <cadence/transport/engine/operation.hpp>
#include <cadence/transport/engine/signature.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence_fake_wire {

namespace cd = cadence::transport::detail;
using cadence::transport::dtype;
using cadence::transport::reduce_op;

/// An algorithm broke a requirement of the wire (not a transport failure): the test fails.
struct wire_misuse : std::logic_error {
  using std::logic_error::logic_error;
};

/// What a fake wire is like. The defaults are MPI's wire.
struct wire_options {
  /// Notices travel on a stream of their own and are kept by collective index (MPI's persistent
  /// notice receives); false: notices and data share one stream per peer (gloo).
  bool notices_by_index = true;
  /// One data receive at a time, posted on demand by expect() or take() (MPI); false: one
  /// always posted per peer, reposted by release() (gloo). Needs notices_by_index.
  bool posts_on_demand = true;
  /// An on-demand receive takes the larger of the capacity asked and the inline capacity (so a
  /// differing peer's message is read whole, as MPI's wire does); false: exactly the capacity.
  bool posts_inline = true;
  std::size_t inline_bytes = 64;  // inline_capacity() is max(this, 8 * size)
  /// Received sizes are reported; false: coll_message::unknown (gloo).
  bool knows_sizes = true;
  /// A message longer than its receive still hands over its head (false: MPI's truncation
  /// error hides it: the algorithm gets too_long and a blank signature).
  bool head_of_too_long = false;
  std::size_t piece = 24;         // piece_bytes(e) is the largest multiple of e up to this
  std::size_t eager_bytes = 200;  // a send up to this many bytes may complete before it is received
  /// reads_caller_early() (wire.hpp, 8): MPI's wire says yes, gloo's no.
  bool reads_caller_early = true;
};

inline wire_options mpi_like() { return {}; }
inline wire_options gloo_like() {
  wire_options o;
  o.notices_by_index = false;
  o.posts_on_demand = false;
  o.knows_sizes = false;
  o.eager_bytes = 0;  // a gloo send completes once written into the peer's posted receive
  o.reads_caller_early = false;
  return o;
}
inline wire_options hybrid() {
  wire_options o;
  o.posts_on_demand = false;
  o.knows_sizes = false;
  o.reads_caller_early = false;
  return o;
}
/// One of the three, by number (for seeded choices).
inline wire_options flavour(int i) {
  switch (i % 3) {
    case 0: return mpi_like();
    case 1: return gloo_like();
    default: return hybrid();
  }
}
inline std::string flavour_name(int i) {
  switch (i % 3) {
    case 0: return "mpi_like";
    case 1: return "gloo_like";
    default: return "hybrid";
  }
}

/// Calls f(n, wire, rng) for first_n to last_n ranks and each flavour, in an INFO naming both, with
/// rng seeded n * stride + wire.
template <class F>
void for_each_world(int first_n, int last_n, std::uint64_t stride, F&& f) {
  for (int n = first_n; n <= last_n; ++n)
    for (int wire = 0; wire < 3; ++wire) {
      INFO("n " << n << ", " << flavour_name(wire));
      std::mt19937_64 rng(static_cast<std::uint64_t>(n) * stride + static_cast<std::uint64_t>(wire));
      f(n, wire, rng);
    }
}

/// The streams between two ranks: notices (when kept apart), collective data (and, on a
/// one-stream wire, notices too), bulk pieces.
enum class lane : std::uint8_t { notice, data, bulk };

/// One send in flight.
struct message {
  std::uint64_t id = 0;
  int from = 0, to = 0;
  lane on = lane::data;
  bool notice = false;     // a notice (no data)
  std::int64_t index = 0;  // the collective it belongs to (the sender's, for a bulk piece)
  std::string where;       // what it reads from, for messages
  const unsigned char* src = nullptr;
  std::size_t len = 0;
  std::vector<unsigned char> own;      // a notice's own words (the MPI wire keeps them apart)
  std::vector<unsigned char> posted;   // the bytes when it was posted
  std::vector<unsigned char> payload;  // what travels, read when it is captured
  bool eager = false;                  // may complete before it is received
  bool captured = false;               // its bytes have been read
  bool delivered = false;              // they are in the receiver's memory
  bool completed = false;              // the sender's wire would say so when asked
  bool reported = false;               // the sender's wire has said so
};

/// The kinds of events the scheduler fires.
enum class step_kind : std::uint8_t { deliver, capture, complete };

class wire_core;

/// The messages in flight between the ranks' wires, and the events that move them.
class network {
public:
  explicit network(int n, bool over_delivered)
      : n_(n), over_(over_delivered), channels_(3 * static_cast<std::size_t>(n) * static_cast<std::size_t>(n)) {}
  network(const network&) = delete;
  network& operator=(const network&) = delete;

  int size() const noexcept { return n_; }
  bool over_delivered() const noexcept { return over_; }

  /// Held events do not happen (until the predicate says otherwise).
  std::function<bool(const message&, step_kind)> hold;
  /// Called once per message, when its bytes are read: it may change what travels.
  std::function<void(message&)> tamper;
  /// Requirements the algorithms broke, found outside a wire call.
  std::vector<std::string> misuse;
  /// Grows whenever something changes: the scheduler's test for "nothing can move".
  std::uint64_t activity = 0;

  void attach(std::vector<wire_core*> wires) { wires_ = std::move(wires); }
  wire_core& wire(int r) { return *wires_[static_cast<std::size_t>(r)]; }

  message& post(int from, int to, lane on, bool notice, std::int64_t index, const unsigned char* src, std::size_t len,
                std::string where, std::size_t eager_bytes) {
    auto m = std::make_unique<message>();
    m->id = ++ids_;
    m->from = from;
    m->to = to;
    m->on = on;
    m->notice = notice;
    m->index = index;
    m->where = std::move(where);
    m->src = src;
    m->len = len;
    if (src != nullptr && len != 0) m->posted.assign(src, src + len);
    m->eager = len <= eager_bytes;
    message& ref = *m;
    auto& q = channels_[channel(from, to, on)];
    if (q.empty()) busy_.push_back(channel(from, to, on));
    q.push_back(&ref);
    live_.push_back(&ref);
    all_.push_back(std::move(m));
    ++activity;
    return ref;
  }

  /// A notice with its own words (the words are copied into the message).
  message& post_own(int from, int to, lane on, std::int64_t index, std::vector<unsigned char> words,
                    std::size_t eager_bytes) {
    message& m = post(from, to, on, true, index, nullptr, 0, "a notice of its own", eager_bytes);
    m.own = std::move(words);
    m.src = m.own.data();
    m.len = m.own.size();
    m.posted = m.own;
    m.eager = m.len <= eager_bytes;
    return m;
  }

  struct event {
    step_kind kind;
    message* m;
  };

  /// What may happen next, in a fixed order (the scheduler picks among them); valid until
  /// the next call.
  const std::vector<event>& enabled();
  void fire(const event& e);

  /// Whether every message sent has completed and been received (nothing left in flight).
  bool quiet() const {
    if (!busy_.empty()) return false;
    for (const message* m : live_)
      if (!m->completed) return false;
    return true;
  }

  /// Every message ever sent (oldest first), for tests that count or inspect them.
  std::vector<const message*> sent() const {
    std::vector<const message*> v;
    for (const auto& m : all_) v.push_back(m.get());
    return v;
  }

  void capture(message& m);

private:
  bool held(const message& m, step_kind k) const { return hold && hold(m, k); }
  std::size_t channel(int from, int to, lane on) const noexcept {
    return (static_cast<std::size_t>(from) * static_cast<std::size_t>(n_) + static_cast<std::size_t>(to)) * 3 +
           static_cast<std::size_t>(on);
  }

  int n_;
  bool over_;
  std::uint64_t ids_ = 0;
  std::vector<wire_core*> wires_;
  std::vector<std::deque<message*>> channels_;  // per sender, receiver and lane: undelivered, in send order
  std::vector<std::size_t> busy_;               // the channels that hold a message
  std::vector<message*> live_;                  // not completed yet
  std::vector<std::unique_ptr<message>> all_;
  std::vector<event> enabled_;
};

inline bool overlaps(const unsigned char* a, std::size_t alen, const unsigned char* b, std::size_t blen) {
  if (alen == 0 || blen == 0 || a == nullptr || b == nullptr) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + blen && y < x + alen;
}

inline const char* region_name(cd::bulk_region r) {
  switch (r) {
    case cd::bulk_region::scratch0: return "scratch0";
    case cd::bulk_region::scratch1: return "scratch1";
    case cd::bulk_region::staging: return "staging";
    case cd::bulk_region::caller: return "caller";
  }
  return "?";
}

/// One rank's wire. Every member of the concept, with the checks described at the top.
class wire_core {
public:
  static constexpr std::size_t head = cd::collective_head_bytes;
  static constexpr unsigned char poison = 0xA5;

  wire_core(network& net, int rank, wire_options o)
      : net_(&net), rank_(rank), size_(net.size()), o_(o), tokens_(6 * static_cast<std::size_t>(net.size() + 1)) {
    if (!o_.notices_by_index && o_.posts_on_demand)
      throw std::invalid_argument("fake wire: a wire with one stream per peer keeps one receive posted per peer");
    const auto n = static_cast<std::size_t>(size_);
    notices_.resize(n);
    in_.resize(n);
    recvs_.resize(n);
    sends_.resize(n);
    out_.assign(head + inline_capacity(), poison);
    notice_out_.assign(head, poison);
    // A receive per peer is posted before anything is sent, as gloo's set-up does.
    if (!o_.posts_on_demand)
      for (int p = 0; p < size_; ++p)
        if (p != rank_) repost(in_[static_cast<std::size_t>(p)], p, inline_capacity());
  }
  wire_core(const wire_core&) = delete;
  wire_core& operator=(const wire_core&) = delete;

  // ---- 1, 2: who, how much ----

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::size_t inline_capacity() const noexcept {
    return std::max(o_.inline_bytes, std::size_t{8} * static_cast<std::size_t>(size_));
  }
  std::size_t piece_bytes(std::size_t esize) const noexcept { return cd::element_limit(o_.piece, esize); }

  // ---- 3: outgoing messages ----

  unsigned char* out_data(std::size_t n) {
    if (out_.size() < head + n) {
      if (!out_sends_.empty())
        misuse("out_data(" + std::to_string(n) + ") grows the outgoing message while its sends are in flight");
      out_.resize(head + n, poison);
    }
    return out_.data() + head;
  }

  void send_out(const cd::call_info&, const std::vector<int>& to, const cd::collective_signature& sig,
                const cd::collective_summary& summary, std::size_t n) {
    if (n > inline_capacity())
      misuse("send_out of " + std::to_string(n) + " data bytes, beyond the inline capacity " +
             std::to_string(inline_capacity()));
    if (head + n > out_.size()) misuse("send_out of more bytes than out_data gave");
    std::memcpy(out_.data(), &sig, sizeof sig);
    std::memcpy(out_.data() + sizeof sig, &summary, sizeof summary);
    for (int p : to) {
      check_peer(p, "send_out");
      out_sends_.push_back(&net_->post(rank_, p, lane::data, false, sig.index, out_.data(), head + n,
                                       "the outgoing message", o_.eager_bytes));
    }
  }

  bool out_sent(const cd::call_info&) { return reap(out_sends_); }
  std::vector<int> out_pending() const { return peers_of(out_sends_); }

  void send_notices(const cd::call_info&, const std::vector<int>& to, const cd::collective_signature& sig) {
    cd::collective_summary only = cd::collective_summary::of(sig, rank_);
    only.lo_rank = -1;
    std::vector<unsigned char> words(head);
    std::memcpy(words.data(), &sig, sizeof sig);
    std::memcpy(words.data() + sizeof sig, &only, sizeof only);
    if (o_.notices_by_index) {
      for (int p : to) {
        check_peer(p, "send_notices");
        notice_sends_.push_back(&net_->post_own(rank_, p, lane::notice, sig.index, words, o_.eager_bytes));
      }
      return;
    }
    // One buffer for every notice, as gloo's: a notice sent while the last is in flight changes it.
    std::memcpy(notice_out_.data(), words.data(), head);
    for (int p : to) {
      check_peer(p, "send_notices");
      notice_sends_.push_back(&net_->post(rank_, p, lane::data, true, sig.index, notice_out_.data(), head,
                                          "the notice buffer", o_.eager_bytes));
    }
  }
  bool notices_sent(const cd::call_info&) { return reap(notice_sends_); }
  std::vector<int> notices_pending() const { return peers_of(notice_sends_); }

  // ---- 4: incoming messages ----

  bool take(const cd::call_info& c, int p, cd::coll_stream stream, std::int64_t index, std::size_t capacity,
            cd::coll_message& m) {
    check_peer(p, "take");
    if (o_.notices_by_index && stream == cd::coll_stream::notice) {
      auto& q = notices_[static_cast<std::size_t>(p)];
      while (!q.empty() && q.front().sig.index < index) q.pop_front();
      if (q.empty() || q.front().sig.index != index) return false;
      m = cd::coll_message{};
      m.sig = q.front().sig;
      m.summary = q.front().summary;
      m.bytes = 0;
      count_take(stream);
      return true;
    }
    coll_in* in = nullptr;
    if (o_.posts_on_demand) {
      expect(c, p, capacity);
      in = &demand_;
      if (in->from != p)
        misuse("take from rank " + std::to_string(p) + " while the receive posted is from rank " +
               std::to_string(in->from));
    } else {
      in = &in_[static_cast<std::size_t>(p)];
      if (in->taken) misuse("take from rank " + std::to_string(p) + " before its last message was released");
    }
    if (!in->posted || !in->filled) return false;
    m = cd::coll_message{};
    if (in->truncated) {
      m.too_long = true;
      if (o_.head_of_too_long) read_head(*in, m);
    } else {
      read_head(*in, m);
      m.data = in->buf.data() + head;
      if (o_.knows_sizes) m.bytes = in->len - head;
    }
    in->posted = false;
    in->taken = true;
    count_take(stream);
    ++net_->activity;
    return true;
  }

  void release(const cd::call_info&, int p, cd::coll_stream stream) {
    check_peer(p, "release");
    if (o_.notices_by_index && stream == cd::coll_stream::notice) return;  // kept by index
    coll_in& in = o_.posts_on_demand ? demand_ : in_[static_cast<std::size_t>(p)];
    if (!in.taken || in.from != p) misuse("release of rank " + std::to_string(p) + "'s message, which was not taken");
    in.taken = false;
    std::fill(in.buf.begin(), in.buf.end(), poison);  // whoever reads it after this reads poison
    if (!o_.posts_on_demand) repost(in, p, inline_capacity());
    ++net_->activity;
  }

  void expect(const cd::call_info&, int p, std::size_t capacity) {
    check_peer(p, "expect");
    if (!o_.posts_on_demand) return;
    if (demand_.posted) return;  // one at a time
    if (demand_.taken) misuse("a receive posted while the message taken before it is not released");
    repost(demand_, p, o_.posts_inline ? std::max(capacity, inline_capacity()) : capacity);
  }

  // ---- 5: bulk pieces ----

  void bulk_begin(const cd::call_info&, void* buf, std::size_t bytes, std::size_t scratch) {
    if (bulk_pending()) misuse("bulk_begin with pieces of the last collective in flight");
    caller_ = static_cast<unsigned char*>(buf);
    caller_bytes_ = bytes;
    exposed_ = false;
    early_ = false;
    for (auto& s : scratch_) {
      if (s.size() < scratch) s.resize(scratch);
      std::fill(s.begin(), s.end(), poison);
    }
    staging_.assign(piece_bytes(1), poison);
    ++net_->activity;
  }

  unsigned char* bulk_base(cd::bulk_region r) noexcept { return region(r).first; }

  void bulk_recv(const cd::call_info&, int p, cd::bulk_region r, std::size_t offset, std::size_t capacity) {
    check_peer(p, "bulk_recv");
    check_region(r, offset, capacity, "bulk_recv");
    if (r == cd::bulk_region::caller && !exposed_) misuse("a receive posted on the caller's buffer before expose()");
    fresh_counts();
    if (r == cd::bulk_region::caller && early_ && notices_taken_ < static_cast<std::size_t>(size_ - 1))
      misuse("a receive posted on the caller's buffer, exposed early for reading, before every rank's notice was "
             "taken");
    unsigned char* at = bulk_base(r) + offset;
    if (!net_->over_delivered())
      for (const auto& q : sends_)
        for (const message* s : q)
          if (overlaps(at, capacity, s->src, s->len))
            misuse("a receive posted over " + s->where + ", which a send to rank " + std::to_string(s->to) +
                   " still reads (posts_over_delivered_sends is false)");
    recvs_[static_cast<std::size_t>(p)].push_back({r, offset, at, capacity});
    ++net_->activity;
  }

  void bulk_send(const cd::call_info&, int p, cd::bulk_region r, std::size_t offset, std::size_t n) {
    check_peer(p, "bulk_send");
    check_region(r, offset, n, "bulk_send");
    if (r == cd::bulk_region::caller && !exposed_) misuse("a send from the caller's buffer before expose()");
    sends_[static_cast<std::size_t>(p)].push_back(
        &net_->post(rank_, p, lane::bulk, false, current_index, bulk_base(r) + offset, n,
                    std::string(region_name(r)) + "+" + std::to_string(offset), o_.eager_bytes));
  }

  bool bulk_recv_done(const cd::call_info& c, int p, std::size_t& got) {
    check_peer(p, "bulk_recv_done");
    auto& q = recvs_[static_cast<std::size_t>(p)];
    if (q.empty()) misuse("bulk_recv_done with no piece posted from rank " + std::to_string(p));
    if (!q.front().filled) return false;
    const piece_recv x = q.front();
    q.pop_front();
    ++net_->activity;
    if (x.got > x.capacity)
      throw cadence::transport_error(cd::describe(c) + ": rank " + std::to_string(p) + " sent a piece of " +
                                     std::to_string(x.got) + " bytes into a receive of " + std::to_string(x.capacity) +
                                     " (fake wire)");
    got = o_.knows_sizes ? x.got : cd::coll_message::unknown;
    return true;
  }

  bool bulk_send_done(const cd::call_info&, int p) {
    check_peer(p, "bulk_send_done");
    auto& q = sends_[static_cast<std::size_t>(p)];
    if (q.empty()) misuse("bulk_send_done with no piece posted to rank " + std::to_string(p));
    if (!q.front()->completed) return false;
    report(*q.front());
    q.pop_front();
    ++net_->activity;
    return true;
  }

  void expose() noexcept {
    fresh_counts();
    early_ = taken_ == 0;  // before anything of this collective was taken: for reading only
    exposed_ = true;
    exposed_ever_ = true;
    ++net_->activity;
  }

  void bulk_end(const cd::call_info&) {
    if (bulk_pending()) misuse("bulk_end with pieces in flight");
    caller_ = nullptr;
    caller_bytes_ = 0;
    exposed_ = false;
    ++net_->activity;
  }

  // ---- 7: what a blocked wait would block on: a token per point and peer ----

  const void* native(cd::wire_point point, int p) const noexcept {
    return &tokens_[static_cast<std::size_t>(point) * static_cast<std::size_t>(size_ + 1) +
                    static_cast<std::size_t>(p + 1)];
  }

  // ---- for the network and the tests ----

  const wire_options& options() const noexcept { return o_; }
  /// The collective the rank runs (bulk pieces carry it, for hold predicates).
  std::int64_t current_index = 0;
  /// Whether expose() was called since the simulation last cleared it (a new collective).
  bool exposed_ever() const noexcept { return exposed_ever_; }
  bool reads_caller_early() const noexcept { return o_.reads_caller_early; }
  void clear_exposed_ever() noexcept { exposed_ever_ = false; }

  /// The rank failed: its receives are withdrawn (nothing lands in its memory any more); its
  /// sends are left to complete on their own, as MPI's wire leaves them.
  void abandon() {
    for (auto& q : recvs_) q.clear();
    demand_.posted = false;
    for (auto& in : in_) in.posted = false;
    abandoned_ = true;
  }

  bool accepts(const message& m) const {
    if (abandoned_) return false;
    switch (m.on) {
      case lane::notice: return true;
      case lane::data: {
        const coll_in& in = o_.posts_on_demand ? demand_ : in_[static_cast<std::size_t>(m.from)];
        return in.posted && !in.filled && in.from == m.from;
      }
      case lane::bulk:
        for (const auto& r : recvs_[static_cast<std::size_t>(m.from)])
          if (!r.filled) return true;
        return false;
    }
    return false;
  }

  void accept(message& m) {
    switch (m.on) {
      case lane::notice: {
        stored s;
        std::memcpy(&s.sig, m.payload.data(), sizeof s.sig);
        std::memcpy(&s.summary, m.payload.data() + sizeof s.sig, sizeof s.summary);
        auto& q = notices_[static_cast<std::size_t>(m.from)];
        auto it = q.end();
        while (it != q.begin() && std::prev(it)->sig.index > s.sig.index) --it;
        if (it == q.begin() || std::prev(it)->sig.index != s.sig.index) q.insert(it, s);
        return;
      }
      case lane::data: {
        coll_in& in = o_.posts_on_demand ? demand_ : in_[static_cast<std::size_t>(m.from)];
        in.len = m.payload.size();
        in.truncated = in.len > in.buf.size();
        std::memcpy(in.buf.data(), m.payload.data(), std::min(in.len, in.buf.size()));
        in.filled = true;
        return;
      }
      case lane::bulk: {
        for (auto& r : recvs_[static_cast<std::size_t>(m.from)]) {
          if (r.filled) continue;
          const std::size_t n = std::min(m.payload.size(), r.capacity);
          if (r.region == cd::bulk_region::caller && !exposed_)
            net_->misuse.push_back(who() + ": a piece landed in the caller's buffer before expose()");
          for (const auto& q : sends_)
            for (const message* s : q)
              if (!s->captured && overlaps(r.at, n, s->src, s->len))
                net_->misuse.push_back(who() + ": a piece from rank " + std::to_string(m.from) + " landed in " +
                                       s->where + ", which a send to rank " + std::to_string(s->to) +
                                       " has not read yet");
          if (n != 0) std::memcpy(r.at, m.payload.data(), n);
          r.got = m.payload.size();
          r.filled = true;
          return;
        }
        return;
      }
    }
  }

private:
  struct stored {
    cd::collective_signature sig;
    cd::collective_summary summary;
  };
  struct coll_in {
    bool posted = false, filled = false, taken = false, truncated = false;
    int from = -1;
    std::size_t len = 0;
    std::vector<unsigned char> buf;  // [head | data]
  };
  struct piece_recv {
    cd::bulk_region region;
    std::size_t offset;
    unsigned char* at;
    std::size_t capacity;
    bool filled = false;
    std::size_t got = 0;
  };

  std::string who() const { return "rank " + std::to_string(rank_); }
  [[noreturn]] void misuse(const std::string& what) const { throw wire_misuse(who() + ": " + what); }

  void check_peer(int p, const char* call) const {
    if (p < 0 || p >= size_ || p == rank_)
      misuse(std::string(call) + " names rank " + std::to_string(p) + " (of " + std::to_string(size_) + ")");
  }

  // A region's first byte and its size in bytes (the caller's buffer: as bulk_begin registered it).
  std::pair<unsigned char*, std::size_t> region(cd::bulk_region r) noexcept {
    switch (r) {
      case cd::bulk_region::scratch0: return {scratch_[0].data(), scratch_[0].size()};
      case cd::bulk_region::scratch1: return {scratch_[1].data(), scratch_[1].size()};
      case cd::bulk_region::staging: return {staging_.data(), staging_.size()};
      case cd::bulk_region::caller: break;
    }
    return {caller_, caller_bytes_};
  }
  void check_region(cd::bulk_region r, std::size_t offset, std::size_t n, const char* call) {
    if (r == cd::bulk_region::caller && caller_ == nullptr)
      misuse(std::string(call) + " on the caller's buffer outside bulk_begin/bulk_end");
    const std::size_t size = region(r).second;
    if (offset > size || n > size - offset)
      misuse(std::string(call) + " of " + std::to_string(n) + " bytes at " + std::to_string(offset) + " of " +
             region_name(r) + ", which holds " + std::to_string(size));
  }

  void repost(coll_in& in, int p, std::size_t capacity) {
    in.posted = true;
    in.filled = false;
    in.truncated = false;
    in.from = p;
    in.len = 0;
    in.buf.assign(head + capacity, poison);
  }

  static void read_head(const coll_in& in, cd::coll_message& m) {
    std::memcpy(&m.sig, in.buf.data(), sizeof m.sig);
    std::memcpy(&m.summary, in.buf.data() + sizeof m.sig, sizeof m.summary);
  }

  // The wire says a send completed: its memory must be as it was when posted (a receive may
  // have landed in it after it was delivered, on a wire that allows that).
  void report(message& m) {
    m.reported = true;
    if (net_->over_delivered() && m.delivered) return;
    if (m.len != 0 && std::memcmp(m.src, m.posted.data(), m.len) != 0)
      misuse(m.where + " changed while its send to rank " + std::to_string(m.to) + " was in flight");
  }

  bool reap(std::vector<message*>& q) {
    bool any = false;
    for (auto it = q.begin(); it != q.end();) {
      if ((*it)->completed) {
        report(**it);
        it = q.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    if (any) ++net_->activity;
    return q.empty();
  }
  static std::vector<int> peers_of(const std::vector<message*>& q) {
    std::vector<int> v;
    for (const message* m : q) v.push_back(m->to);
    return v;
  }

  bool bulk_pending() const {
    for (const auto& q : recvs_)
      if (!q.empty()) return true;
    for (const auto& q : sends_)
      if (!q.empty()) return true;
    return false;
  }

  network* net_;
  int rank_, size_;
  wire_options o_;
  std::vector<unsigned char> out_;         // [head | data]: the outgoing data message
  std::vector<message*> out_sends_;        // its sends not yet reported complete
  std::vector<unsigned char> notice_out_;  // the notice buffer (one-stream wires)
  std::vector<message*> notice_sends_;
  std::vector<std::deque<stored>> notices_;  // per peer, by index (notices_by_index)
  coll_in demand_;                           // the one data receive (posts_on_demand)
  std::vector<coll_in> in_;                  // per peer (!posts_on_demand)
  std::vector<unsigned char> scratch_[2], staging_;
  unsigned char* caller_ = nullptr;
  std::size_t caller_bytes_ = 0;
  bool exposed_ = false, exposed_ever_ = false, abandoned_ = false;
  bool early_ = false;  // exposed before anything of this collective was taken
  std::size_t taken_ = 0, notices_taken_ = 0;  // messages of collective counted_for_ taken
  std::int64_t counted_for_ = -1;

  void fresh_counts() noexcept {
    if (counted_for_ == current_index) return;
    counted_for_ = current_index;
    taken_ = notices_taken_ = 0;
  }
  void count_take(cd::coll_stream stream) noexcept {
    fresh_counts();
    ++taken_;
    if (stream == cd::coll_stream::notice) ++notices_taken_;
  }
  std::vector<std::deque<piece_recv>> recvs_;  // per peer, oldest first
  std::vector<std::deque<message*>> sends_;    // per peer, oldest first, until reported
  std::vector<char> tokens_;                   // native() handles
};

/// The wire type the algorithms are instantiated on: posts_over_delivered_sends both ways.
template <bool OverDelivered>
class fake_wire : public wire_core {
public:
  static constexpr bool posts_over_delivered_sends = OverDelivered;
  using wire_core::wire_core;
};

// ---- the network's events ----

inline const std::vector<network::event>& network::enabled() {
  std::vector<event>& v = enabled_;
  v.clear();
  for (std::size_t c : busy_) {
    message* m = channels_[c].front();
    if (!held(*m, step_kind::deliver) && wire(m->to).accepts(*m)) v.push_back({step_kind::deliver, m});
  }
  for (message* m : live_) {
    if (m->eager && !m->captured && !held(*m, step_kind::capture)) v.push_back({step_kind::capture, m});
    if (m->captured && !m->completed && (m->delivered || m->eager) && !held(*m, step_kind::complete))
      v.push_back({step_kind::complete, m});
  }
  return v;
}

inline void network::capture(message& m) {
  if (m.captured) return;
  m.payload.assign(m.src, m.src + m.len);
  if (m.payload != m.posted)
    misuse.push_back("rank " + std::to_string(m.from) + ": " + m.where + " changed before its send to rank " +
                     std::to_string(m.to) + " had read it");
  m.captured = true;
  if (tamper) tamper(m);
}

inline void network::fire(const event& e) {
  message& m = *e.m;
  switch (e.kind) {
    case step_kind::capture: capture(m); break;
    case step_kind::deliver: {
      capture(m);
      const std::size_t c = channel(m.from, m.to, m.on);
      auto& q = channels_[c];
      q.pop_front();
      if (q.empty()) busy_.erase(std::find(busy_.begin(), busy_.end(), c));
      wire(m.to).accept(m);
      m.delivered = true;
      break;
    }
    case step_kind::complete: {
      m.completed = true;
      live_.erase(std::find(live_.begin(), live_.end(), &m));
      break;
    }
  }
  ++activity;
}

// ---- the simulation: ranks calling collectives over the fake ----

enum class algorithm : std::uint8_t { doubling, ring, broadcast };

/// One collective as one rank calls it.
struct call {
  algorithm algo = algorithm::doubling;
  void* buf = nullptr;
  std::size_t count = 0;  // elements (all-reduce) or bytes (broadcast)
  dtype type = dtype::f32;
  reduce_op op = reduce_op::sum;
  bool average = false;
  int root = 0;
  std::int64_t index = 0;  // 0: the rank's next collective index
};

/// What one rank did in a run.
struct rank_report {
  int completed = 0;        // calls completed
  bool failed = false;      // a call threw transport_error
  std::string error;        // its message
  bool unfinished = false;  // a started call neither completed nor failed
  cd::waiting awaited;      // for an unfinished call: whom the algorithm says it waits for
};

struct outcome {
  bool stuck = false;     // nothing could move any more, with calls unfinished
  bool livelock = false;  // the step limit was reached
  std::size_t steps = 0;
  std::vector<rank_report> ranks;
  std::vector<std::string> misuse;

  bool all_completed(int calls) const {
    for (const auto& r : ranks)
      if (r.failed || r.unfinished || r.completed != calls) return false;
    return !stuck && !livelock && misuse.empty();
  }
  std::string describe() const {
    std::string s = "steps " + std::to_string(steps) + (stuck ? ", stuck" : "") + (livelock ? ", livelock" : "");
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const auto& x = ranks[r];
      s += "\n  rank " + std::to_string(r) + ": completed " + std::to_string(x.completed);
      if (x.failed) s += ", failed: " + x.error;
      if (x.unfinished)
        s += ", waits for " + (x.awaited.peers.empty() ? std::string("nobody") : cd::rank_list(x.awaited.peers)) +
             " (" + x.awaited.note + ")";
    }
    for (const auto& m : misuse) s += "\n  misuse: " + m;
    return s;
  }
};

/// n ranks over fake wires. Each rank runs its calls in order (the next starts once the last
/// completed); run() moves everything in a seeded random order until nothing can move.
template <bool OverDelivered>
class simulation {
public:
  using wire_type = fake_wire<OverDelivered>;

  explicit simulation(int n, wire_options o = {})
      : simulation(n, std::vector<wire_options>(static_cast<std::size_t>(n), o)) {}
  explicit simulation(int n, const std::vector<wire_options>& per_rank)
      : net_(n, OverDelivered), ranks_(static_cast<std::size_t>(n)) {
    std::vector<wire_core*> v;
    for (int r = 0; r < n; ++r) {
      wires_.push_back(std::make_unique<wire_type>(net_, r, per_rank[static_cast<std::size_t>(r)]));
      v.push_back(wires_.back().get());
    }
    net_.attach(std::move(v));
  }

  int size() const noexcept { return net_.size(); }
  network& net() noexcept { return net_; }
  wire_type& wire(int r) { return *wires_[static_cast<std::size_t>(r)]; }
  /// The rank's current (or last) call's operation.
  cd::operation& op(int r) { return ranks_[static_cast<std::size_t>(r)].op; }

  void add(int r, const call& c) { ranks_[static_cast<std::size_t>(r)].calls.push_back(c); }
  /// The rank stops (takes no step any more) once it has completed `calls` calls and taken
  /// `steps` steps of the next (start is its first): a hung or crashed process.
  void stop_after(int r, int calls, int steps) {
    auto& x = ranks_[static_cast<std::size_t>(r)];
    x.stop_calls = calls;
    x.stop_steps = steps;
  }
  void never_starts(int r) { stop_after(r, 0, 0); }
  /// Checks after every event that no rank's buffer changed before its wire was exposed or its
  /// call completed (the caller's buffer is written only after agreement).
  bool watch_buffers = false;

  outcome run(std::uint64_t seed, std::size_t max_steps = 2000000) {
    std::mt19937_64 rng(seed);
    const double p_rank = std::uniform_real_distribution<double>(0.15, 0.85)(rng);
    outcome out;
    std::size_t steps = 0;
    for (; steps < max_steps; ++steps) {
      std::vector<int>& movable = movable_;
      movable.clear();
      for (int r = 0; r < size(); ++r)
        if (can_act(r)) movable.push_back(r);
      if (!movable.empty() && std::bernoulli_distribution(p_rank)(rng)) {
        act(movable[std::uniform_int_distribution<std::size_t>(0, movable.size() - 1)(rng)]);
        watch();
        continue;
      }
      const auto& events = net_.enabled();  // until the next call
      if (events.empty() && movable.empty()) break;
      if (events.empty()) {
        // Only the ranks can move: one round over all of them tells whether anything still can.
        const std::uint64_t before = net_.activity;
        std::shuffle(movable.begin(), movable.end(), rng);
        for (int r : movable) act(r);
        watch();
        if (net_.activity == before && net_.enabled().empty()) break;
        continue;
      }
      net_.fire(events[std::uniform_int_distribution<std::size_t>(0, events.size() - 1)(rng)]);
      watch();
    }
    out.steps = steps;
    out.livelock = steps == max_steps;
    for (int r = 0; r < size(); ++r) {
      auto& x = ranks_[static_cast<std::size_t>(r)];
      rank_report rep;
      rep.completed = x.completed;
      rep.failed = x.failed;
      rep.error = x.error;
      rep.unfinished = x.active && !x.failed;
      if (rep.unfinished) {
        rep.awaited = awaited(r);
        out.stuck = !out.livelock;
      }
      if (!x.active && !x.failed && !x.calls.empty() && !out.livelock) out.stuck = true;  // never started them
      out.ranks.push_back(rep);
    }
    out.misuse = misuse_;
    out.misuse.insert(out.misuse.end(), net_.misuse.begin(), net_.misuse.end());
    return out;
  }

  cd::waiting awaited(int r) {
    auto& x = ranks_[static_cast<std::size_t>(r)];
    switch (x.algo) {
      case algorithm::doubling: return cd::small_allreduce<wire_type>::awaited(wire(r), x.op);
      case algorithm::ring: return cd::ring_allreduce<wire_type>::awaited(wire(r), x.op);
      case algorithm::broadcast: return cd::root_broadcast<wire_type>::awaited(wire(r), x.op);
    }
    return {};
  }

private:
  struct rank_state {
    std::deque<call> calls;  // not started yet
    bool active = false;     // op is a started call, unfinished
    algorithm algo = algorithm::doubling;
    cd::operation op;
    std::vector<unsigned char> before;  // the buffer when the call started
    std::int64_t next_index = 1;
    std::uint64_t seq = 0;
    bool failed = false;
    std::string error;
    int completed = 0;
    int stop_calls = -1, stop_steps = 0, steps_in_call = 0;
  };

  bool can_act(int r) const {
    const auto& x = ranks_[static_cast<std::size_t>(r)];
    if (x.failed) return false;
    if (x.stop_calls >= 0 && x.completed == x.stop_calls && x.steps_in_call >= x.stop_steps) return false;
    return x.active || !x.calls.empty();
  }

  static std::tuple<int, int, int, std::size_t, std::size_t, bool> state_of(const cd::operation& o) {
    return {o.phase, o.round, o.step, o.piece, o.sends_done, o.done};
  }

  void act(int r) {
    auto& x = ranks_[static_cast<std::size_t>(r)];
    wire_type& w = wire(r);
    ++x.steps_in_call;
    const auto before = state_of(x.op);
    try {
      if (!x.active) {
        begin(r, x);
        w.clear_exposed_ever();
        w.current_index = x.op.sig.index;
        switch (x.algo) {
          case algorithm::doubling: cd::small_allreduce<wire_type>::start(w, x.op); break;
          case algorithm::ring: cd::ring_allreduce<wire_type>::start(w, x.op); break;
          case algorithm::broadcast: cd::root_broadcast<wire_type>::start(w, x.op); break;
        }
        x.active = true;
        ++net_.activity;
      } else {
        switch (x.algo) {
          case algorithm::doubling: cd::small_allreduce<wire_type>::advance(w, x.op); break;
          case algorithm::ring: cd::ring_allreduce<wire_type>::advance(w, x.op); break;
          case algorithm::broadcast: cd::root_broadcast<wire_type>::advance(w, x.op); break;
        }
      }
      if (x.op.done) {
        x.active = false;
        ++x.completed;
        x.steps_in_call = 0;
        ++net_.activity;
      } else if (state_of(x.op) != before) {
        ++net_.activity;
      }
    } catch (const cadence::transport_error& e) {
      x.failed = true;
      x.error = e.what();
      w.abandon();
      ++net_.activity;
    } catch (const std::exception& e) {
      x.failed = true;
      x.error = std::string("not a transport_error: ") + e.what();
      misuse_.push_back(x.error);
      w.abandon();
      ++net_.activity;
    }
  }

  void begin(int r, rank_state& x) {
    const call c = x.calls.front();
    x.calls.pop_front();
    x.algo = c.algo;
    const std::int64_t index = c.index != 0 ? c.index : x.next_index;
    x.next_index = index + 1;
    cd::operation o;
    o.c = cd::call_info{"fake", "allreduce", ++x.seq, r, size(), cadence::transport::deadline::clock::now()};
    o.buf = c.buf;
    o.active = true;
    if (c.algo == algorithm::broadcast) {
      o.c.op = "broadcast";
      o.what = cd::op_kind::broadcast;
      o.bytes = c.count;
      o.peer = c.root;
      o.sig = cd::collective_signature::broadcast(index, c.count, c.root);
    } else {
      if (c.average) o.c.op = "allreduce_average";
      o.what = cd::op_kind::allreduce;
      o.count = c.count;
      o.bytes = c.count * cadence::transport::dtype_size(c.type);
      o.type = c.type;
      o.rop = c.op;
      o.average = c.average;
      o.ring = c.algo == algorithm::ring;
      o.sig = cd::collective_signature::allreduce(index, c.count, c.type, c.op, c.average);
    }
    x.op = std::move(o);
    const auto* p = static_cast<const unsigned char*>(c.buf);
    x.before.assign(p, p + (p != nullptr ? x.op.bytes : 0));
  }

  // A buffer may change only once its wire was exposed or its call completed (and a
  // broadcast's root's never).
  void watch() {
    if (!watch_buffers) return;
    for (int r = 0; r < size(); ++r) {
      auto& x = ranks_[static_cast<std::size_t>(r)];
      if (!(x.active || x.failed) || x.op.buf == nullptr || x.op.bytes == 0) continue;
      const bool root = x.algo == algorithm::broadcast && x.op.peer == r;
      if (!root && (wire(r).exposed_ever() || x.op.done)) continue;
      if (std::memcmp(x.op.buf, x.before.data(), x.op.bytes) != 0) {
        misuse_.push_back("rank " + std::to_string(r) + ": its buffer changed in collective #" +
                          std::to_string(x.op.sig.index) + (root ? " (the broadcast's root)" : " before agreement"));
        watch_buffers = false;  // once is enough
      }
    }
  }

  network net_;
  std::vector<std::unique_ptr<wire_type>> wires_;
  std::vector<rank_state> ranks_;
  std::vector<std::string> misuse_;
  std::vector<int> movable_;
};

// ---- data and oracles ----

/// Calls f(T{}) with T the element type of t (host types only).
template <class F>
void with_type(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: f(float{}); return;
    case dtype::f64: f(double{}); return;
    case dtype::i32: f(std::int32_t{}); return;
    case dtype::i64: f(std::int64_t{}); return;
    case dtype::u8: f(std::uint8_t{}); return;
    case dtype::f16:
    case dtype::bf16: break;
  }
  throw std::invalid_argument("fake wire: no host type for this dtype");
}

/// Per-rank buffers of `count` elements of a dtype, with values that make a float sum depend on
/// its order (magnitudes spread over 2^-10 .. 2^10) and integer sums wrap.
struct rank_data {
  dtype type = dtype::f32;
  std::size_t count = 0;
  std::vector<std::vector<std::uint64_t>> words;  // per rank (8-byte aligned storage)

  rank_data(int n, std::size_t count_, dtype t, std::mt19937_64& rng) : type(t), count(count_) {
    const std::size_t bytes = count * cadence::transport::dtype_size(t);
    words.assign(static_cast<std::size_t>(n), std::vector<std::uint64_t>((bytes + 7) / 8 + 1));
    for (int r = 0; r < n; ++r)
      with_type(t, [&](auto zero) {
        using T = decltype(zero);
        auto* at = reinterpret_cast<unsigned char*>(words[static_cast<std::size_t>(r)].data());
        for (std::size_t i = 0; i < count; ++i) {
          const T v = random_value<T>(rng);
          std::memcpy(at + i * sizeof(T), &v, sizeof v);
        }
      });
  }
  void* buf(int r) { return words[static_cast<std::size_t>(r)].data(); }
  const unsigned char* bytes_of(int r) const {
    return reinterpret_cast<const unsigned char*>(words[static_cast<std::size_t>(r)].data());
  }
  std::size_t bytes() const { return count * cadence::transport::dtype_size(type); }

  template <class T>
  static T random_value(std::mt19937_64& rng) {
    if constexpr (std::is_floating_point_v<T>) {
      const T mantissa = std::uniform_real_distribution<T>(T(-1), T(1))(rng);
      return std::ldexp(mantissa, std::uniform_int_distribution<int>(-10, 10)(rng));
    } else {
      return static_cast<T>(rng());
    }
  }
};

/// The recursive doubling's result for element i, in its own order: the ranks outside the
/// power of two hand their value to the odd rank above them, then log2(p) rounds combine each
/// value with its partner's (sum, min and max commute exactly, so both partners get the same
/// bits), then the average divides.
template <class T>
T doubling_oracle(const std::vector<T>& x, reduce_op op, bool average) {
  const int n = static_cast<int>(x.size());
  const cd::doubling g(n);
  std::vector<T> v(static_cast<std::size_t>(g.p));
  for (int in = 0; in < g.p; ++in) {
    const int r = g.outer(in);
    v[static_cast<std::size_t>(in)] =
        r < 2 * g.extra ? cd::combine(x[static_cast<std::size_t>(r)], x[static_cast<std::size_t>(r - 1)], op)
                        : x[static_cast<std::size_t>(r)];
  }
  for (int bit = 1; bit < g.p; bit *= 2) {
    std::vector<T> next(v.size());
    for (int in = 0; in < g.p; ++in)
      next[static_cast<std::size_t>(in)] =
          cd::combine(v[static_cast<std::size_t>(in)], v[static_cast<std::size_t>(in ^ bit)], op);
    v = next;
  }
  T s = v[0];
  if constexpr (std::is_floating_point_v<T>)
    if (average) s = s / static_cast<T>(n);
  return s;
}

/// The ring's result for element i of segment g, in its own order: segment g starts at rank g
/// and each rank after it adds its own value (g + 1, ..., g + n - 1); an average divides in the
/// last addition.
template <class T>
T ring_oracle(const std::vector<T>& x, int g, reduce_op op, bool average) {
  const int n = static_cast<int>(x.size());
  T s = x[static_cast<std::size_t>(g)];
  for (int k = 1; k < n; ++k) s = cd::combine(x[static_cast<std::size_t>((g + k) % n)], s, op);
  if constexpr (std::is_floating_point_v<T>)
    if (average && n > 1) s = s / static_cast<T>(n);
  return s;
}

/// The bytes every rank should hold after an all-reduce of `in`: oracle(values of every rank,
/// element index) for each element.
template <class F>
std::vector<unsigned char> expected_bytes(const rank_data& in, F&& oracle) {
  std::vector<unsigned char> out(in.bytes());
  with_type(in.type, [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> x(in.words.size());
    for (std::size_t i = 0; i < in.count; ++i) {
      for (std::size_t r = 0; r < x.size(); ++r)
        std::memcpy(&x[r], in.bytes_of(static_cast<int>(r)) + i * sizeof(T), sizeof(T));
      const T v = oracle(x, i);
      std::memcpy(out.data() + i * sizeof(T), &v, sizeof v);
    }
  });
  return out;
}

/// Every rank of `data` calls the all-reduce `algo` once over its own buffer (data's count and
/// type), reducing with `op`.
template <bool Over>
void add_allreduce(simulation<Over>& sim, algorithm algo, rank_data& data, reduce_op op = reduce_op::sum) {
  for (int r = 0; r < static_cast<int>(data.words.size()); ++r)
    sim.add(r, {algo, data.buf(r), data.count, data.type, op, false});
}

/// The first rank whose buffer differs from `want`, or -1.
inline int first_differing(const rank_data& got, const std::vector<unsigned char>& want) {
  for (std::size_t r = 0; r < got.words.size(); ++r)
    if (want.size() != 0 && std::memcmp(got.bytes_of(static_cast<int>(r)), want.data(), want.size()) != 0)
      return static_cast<int>(r);
  return -1;
}

/// The index of the first element of rank r's buffer that differs from `want`, for messages.
inline std::string first_difference(const rank_data& got, int r, const std::vector<unsigned char>& want) {
  const std::size_t e = cadence::transport::dtype_size(got.type);
  for (std::size_t i = 0; i < got.count; ++i)
    if (std::memcmp(got.bytes_of(r) + i * e, want.data() + i * e, e) != 0)
      return "rank " + std::to_string(r) + " differs first at element " + std::to_string(i);
  return "rank " + std::to_string(r) + " does not differ";
}

// ---- what the algorithm tests share ----

/// The dtypes and ops the reductions are tested with: every host dtype, every op.
inline const dtype all_dtypes[] = {dtype::f32, dtype::f64, dtype::i32, dtype::i64, dtype::u8};
inline const reduce_op all_ops[] = {reduce_op::sum, reduce_op::min, reduce_op::max};

/// Calls check(std::true_type{}) when `over` (a simulation whose wire posts receives over
/// delivered sends), else check(std::false_type{}): a seeded case picks one of the two.
template <class F>
void over_or_not(bool over, F&& check) {
  if (over)
    check(std::true_type{});
  else
    check(std::false_type{});
}

/// The part of a seeded case every check shares: ranks, wire flavour, calls in a row, small
/// all-reduces mixed in between (where a check has them), and the seed of its schedule.
struct seeded_case {
  int n = 2;
  int wire = 0;  // flavour()
  int calls = 2;
  bool mix = false;
  std::uint64_t seed = 1;

  /// The case's wire: its flavour with pieces of `piece` bytes (0: the flavour's), and on one
  /// seed in three no eager sends (every send waits for its receive, MPI's rendezvous).
  wire_options options(std::size_t piece = 0) const {
    wire_options o = flavour(wire);
    if (piece != 0) o.piece = piece;
    if (seed % 3 == 0) o.eager_bytes = 0;
    return o;
  }
  /// Seed `s` of a seeded sweep of `k` calls in a row: the wire drawn from rng, then, where the
  /// check can mix small all-reduces in (`mixable`), whether it does.
  void pick_schedule(std::mt19937_64& rng, std::uint64_t s, int k, bool mixable) {
    wire = static_cast<int>(rng() % 3);
    calls = k;
    if (mixable) mix = rng() % 2 == 0;
    seed = s;
  }
  /// Takes the next seed of a sweep from `counter` (incremented), its wire from the one before.
  void take_seed(std::uint64_t& counter) {
    wire = static_cast<int>(counter % 3);
    seed = ++counter;
  }
  /// ", <flavour>, <calls> calls[ with small all-reduces between][, no eager sends], seed <seed>".
  std::string describe_schedule() const {
    return ", " + flavour_name(wire) + ", " + std::to_string(calls) + " calls" +
           (mix ? " with small all-reduces between" : "") + (seed % 3 == 0 ? ", no eager sends" : "") + ", seed " +
           std::to_string(seed);
  }
};

/// What a seeded check runs on: the case's simulation, its buffers watched, and the rng of its
/// schedule, seeded with the case's seed (taken apart as `auto& [rng, sim] = run;`).
template <bool Over>
struct seeded_run {
  std::mt19937_64 rng;
  simulation<Over> sim;
  /// Pieces of `piece` bytes (0: the flavour's).
  explicit seeded_run(const seeded_case& c, std::size_t piece = 0) : rng(c.seed), sim(c.n, c.options(piece)) {
    sim.watch_buffers = true;
  }
};

/// A seeded all-reduce case: the schedule's part and the reduction's (type, op, averaging, the
/// count of elements).
struct reduction_case : seeded_case {
  dtype type = dtype::f32;
  reduce_op op = reduce_op::sum;
  bool average = false;
  std::size_t count = 4;

  /// Picks 2 to 9 ranks, the type, the op and whether to average from rng (in that order).
  void pick_reduction(std::mt19937_64& rng) {
    n = std::uniform_int_distribution<int>(2, 9)(rng);
    type = all_dtypes[rng() % 5];
    op = all_ops[rng() % 3];
    average = op == reduce_op::sum && cd::averageable(type) && rng() % 2 == 0;
  }
  /// "n <n>, <dtype>, <op>[ (average)], count <count>".
  std::string describe_reduction() const {
    return "n " + std::to_string(n) + ", " + cadence::transport::dtype_name(type) + ", " +
           cadence::transport::reduce_op_name(op) + (average ? " (average)" : "") + ", count " + std::to_string(count);
  }
};

/// Calls f(c) for first_n to last_n ranks, every dtype and op, and again averaging where an
/// average exists (a sum of a type that averages), with c's n, type, op and average set and the
/// rest as a default reduction_case has them.
template <class F>
void for_each_reduction(int first_n, int last_n, F&& f) {
  for (int n = first_n; n <= last_n; ++n)
    for (dtype t : all_dtypes)
      for (reduce_op op : all_ops)
        for (int avg = 0; avg < 2; ++avg) {
          if (avg && (op != reduce_op::sum || !cd::averageable(t))) continue;
          reduction_case c;
          c.n = n;
          c.type = t;
          c.op = op;
          c.average = avg != 0;
          f(c);
        }
}

/// Whether s contains part (error messages).
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Checks that a run kept the wire's requirements and that rank r failed with exactly `error`
/// (the caller's INFO says what ran).
inline void check_fails_with(const outcome& out, int r, const std::string& error) {
  CHECK(out.misuse.empty());
  REQUIRE(out.ranks[static_cast<std::size_t>(r)].failed);
  CHECK(out.ranks[static_cast<std::size_t>(r)].error == error);
}

/// The bytes every rank should hold after a recursive doubling of `in` (doubling_oracle).
inline std::vector<unsigned char> doubling_expected(const rank_data& in, reduce_op op = reduce_op::sum,
                                                    bool average = false) {
  return expected_bytes(in, [&](const auto& x, std::size_t) { return doubling_oracle(x, op, average); });
}

/// Checks that every rank of `got` holds `want` after call k of a sequence; the message names
/// the first element that differs.
inline void check_bits(const rank_data& got, const std::vector<unsigned char>& want, int k) {
  const int bad = first_differing(got, want);
  INFO("call " << k << ": " << (bad < 0 ? std::string() : first_difference(got, bad, want)));
  CHECK(bad == -1);
}

/// The signature an all-reduce call `c` sends as collective #index (what error messages name).
inline cd::collective_signature signature_of(const call& c, std::int64_t index = 1) {
  return cd::collective_signature::allreduce(index, c.count, c.type, c.op, c.average);
}

/// Runs every rank's calls of a seeded sequence (`calls` each) until nothing moves and checks
/// that all completed everywhere with nothing left on the wire; the caller checks the bits.
template <bool Over>
outcome run_to_completion(simulation<Over>& sim, int calls, std::uint64_t seed) {
  const outcome out = sim.run(seed);
  INFO(out.describe());
  REQUIRE(out.all_completed(calls));
  CHECK(sim.net().quiet());
  return out;
}

/// Every rank but `odd` calls the all-reduce `base` over its own buffer of `data`, `odd` calls
/// `other` (arguments that differ). Checks that every rank fails, naming both calls as collective
/// #1, with its buffer as it was; extra(r, error) adds an algorithm's own checks of rank r.
template <class Extra>
void check_arguments_differ(simulation<false>& sim, rank_data& data, const call& base, int odd, const call& other,
                            std::uint64_t seed, Extra&& extra) {
  const rank_data before = data;
  for (int r = 0; r < sim.size(); ++r) {
    call c = r == odd ? other : base;
    c.buf = data.buf(r);
    sim.add(r, c);
  }
  const outcome out = sim.run(seed);
  INFO(out.describe());
  CHECK(out.misuse.empty());
  for (int r = 0; r < sim.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(out.ranks[static_cast<std::size_t>(r)].failed);
    const std::string& e = out.ranks[static_cast<std::size_t>(r)].error;
    CHECK(contains(e, "arguments differ across ranks in collective #1"));
    CHECK(contains(e, "rank " + std::to_string(odd) + " called " + signature_of(other).describe()));
    CHECK(contains(e, " called " + signature_of(base).describe()));
    extra(r, e);
    CHECK(std::memcmp(data.bytes_of(r), before.bytes_of(r), data.bytes()) == 0);
  }
}

/// The runs of the tests in which one rank never starts: 2 to 9 ranks over every flavour of
/// wire call the all-reduce `algo` over count(n) elements of `type` (the buffers watched where
/// `watch`), and a rank drawn from the seed n * seed_step + wire never starts. Each run goes on
/// until nothing moves and must leave the others waiting, with no misuse; then
/// check(sim, out, absent).
template <class Count, class Check>
void for_each_absent_run(algorithm algo, int seed_step, dtype type, Count&& count, bool watch, Check&& check) {
  for (int n = 2; n <= 9; ++n)
    for (int wire = 0; wire < 3; ++wire) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(n * seed_step + wire));
      const int absent = std::uniform_int_distribution<int>(0, n - 1)(rng);
      INFO("n " << n << ", rank " << absent << " never starts, " << flavour_name(wire));
      simulation<true> sim(n, flavour(wire));
      sim.watch_buffers = watch;
      rank_data data(n, count(n), type, rng);
      add_allreduce(sim, algo, data);
      sim.never_starts(absent);
      const outcome out = sim.run(rng());
      INFO(out.describe());
      CHECK(out.misuse.empty());
      CHECK(out.stuck);
      check(sim, out, absent);
    }
}

/// Every rank of `data` calls the all-reduce `algo` while the network holds back what
/// hold(message, step) picks. Runs until nothing moves and checks that the ranks are left
/// waiting, with no misuse.
template <bool Over, class Hold>
outcome run_held(simulation<Over>& sim, algorithm algo, rank_data& data, Hold hold, std::uint64_t seed) {
  add_allreduce(sim, algo, data);
  sim.net().hold = hold;
  const outcome out = sim.run(seed);
  INFO(out.describe());
  CHECK(out.stuck);
  CHECK(out.misuse.empty());
  return out;
}

/// A seeded case of the tests in which one rank stops mid-collective (a hung or crashed
/// process): n ranks (2 to max_n), the rank that stops and after how many of its steps (1 to
/// max_steps), drawn from rng in that order; the wire's flavour from the seed.
struct stop_case {
  std::uint64_t seed;
  int n, stopped, steps, wire;

  stop_case(std::mt19937_64& rng, std::uint64_t seed_, int max_n, int max_steps)
      : seed(seed_),
        n(std::uniform_int_distribution<int>(2, max_n)(rng)),
        stopped(std::uniform_int_distribution<int>(0, n - 1)(rng)),
        steps(std::uniform_int_distribution<int>(1, max_steps)(rng)),
        wire(static_cast<int>(seed_ % 3)) {}
  std::string describe() const {
    return "n " + std::to_string(n) + ", rank " + std::to_string(stopped) + " stops after " + std::to_string(steps) +
           " steps, " + flavour_name(wire) + ", seed " + std::to_string(seed);
  }
  /// Every rank of `data` calls the all-reduce `algo` and `stopped` stops; runs until nothing
  /// moves and checks that no rank failed or misused the wire, and that every rank still
  /// waiting (but the one that stopped) names a peer, not itself.
  outcome run(simulation<false>& sim, algorithm algo, rank_data& data, std::uint64_t run_seed) const {
    add_allreduce(sim, algo, data);
    sim.stop_after(stopped, 0, steps);
    const outcome out = sim.run(run_seed);
    INFO(out.describe());
    CHECK(out.misuse.empty());
    for (int r = 0; r < n; ++r) {
      const auto& x = out.ranks[static_cast<std::size_t>(r)];
      CHECK_FALSE(x.failed);
      if (r == stopped || !x.unfinished) continue;
      CHECK_FALSE(x.awaited.peers.empty());
      for (int p : x.awaited.peers) CHECK(p != r);
    }
    return out;
  }
};

/// Lets what was held move and runs on: every rank completes its one call holding `want`.
template <bool Over>
void release_and_check(simulation<Over>& sim, const rank_data& data, const std::vector<unsigned char>& want,
                       std::uint64_t seed) {
  sim.net().hold = nullptr;
  const outcome out = sim.run(seed);
  INFO(out.describe());
  REQUIRE(out.all_completed(1));
  CHECK(first_differing(data, want) == -1);
}

}  // namespace cadence_fake_wire
