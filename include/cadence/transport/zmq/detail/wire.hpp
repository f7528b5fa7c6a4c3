// What the ZeroMQ backend puts on the wire and how it holds ZeroMQ's objects: message headers,
// the routing ids that name a rank's incarnation, the rendezvous messages, owned messages and
// sockets, and the release count of pieces sent without a copy.
#pragma once

#include <zmq.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cadence::transport[zmq] sends its headers in host byte order and supports little-endian hosts only"
#endif

namespace cadence::transport::detail {

inline std::string zmq_reason(int err = errno) { return zmq_strerror(err); }

// ---- owned ZeroMQ messages ----

/// A zmq_msg_t with an owner: closed on destruction, moved with zmq_msg_move. Never memcpy a
/// zmq_msg_t: a very small message keeps its bytes inside the struct, so data() must be asked
/// again after a move.
class zmq_message {
public:
  zmq_message() noexcept { zmq_msg_init(&m_); }
  explicit zmq_message(std::size_t bytes) {
    if (zmq_msg_init_size(&m_, bytes) != 0) throw std::bad_alloc();
  }
  zmq_message(zmq_message&& o) noexcept {
    zmq_msg_init(&m_);
    zmq_msg_move(&m_, &o.m_);
  }
  zmq_message& operator=(zmq_message&& o) noexcept {
    if (this != &o) zmq_msg_move(&m_, &o.m_);  // closes what m_ held
    return *this;
  }
  zmq_message(const zmq_message&) = delete;
  zmq_message& operator=(const zmq_message&) = delete;
  ~zmq_message() { zmq_msg_close(&m_); }

  unsigned char* data() noexcept { return static_cast<unsigned char*>(zmq_msg_data(&m_)); }
  std::size_t size() const noexcept { return zmq_msg_size(&m_); }
  bool more() const noexcept { return zmq_msg_more(&m_) != 0; }
  zmq_msg_t* get() noexcept { return &m_; }

private:
  mutable zmq_msg_t m_;
};

// ---- pieces sent without a copy ----

#if defined(__SANITIZE_THREAD__)
#define CADENCE_ZMQ_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CADENCE_ZMQ_TSAN 1
#endif
#endif

#if defined(CADENCE_ZMQ_TSAN)
// ZeroMQ hands a piece to its I/O thread through its own queues, which ThreadSanitizer cannot
// see (libzmq is not instrumented): it would take the callback's first touch of a zc_release
// for a race with its allocation. Under TSan only, every handover also passes this atomic.
inline std::atomic<std::uint64_t>& zc_tsan_handover() noexcept {
  static std::atomic<std::uint64_t> handover{0};
  return handover;
}
#endif

/// Counts the pieces of one operation that ZeroMQ still holds (zmq_msg_init_data with a free
/// callback): the caller's buffer is the operation's until it reaches zero. ZeroMQ calls the
/// callback on its I/O thread once it has written the piece to the kernel or dropped it; the
/// callback wakes the owning thread through the communicator's event fd (which lives until the
/// context has terminated, after which no callback runs). Reference-counted by hand: the
/// callback gets a plain pointer.
class zc_release {
public:
  static zc_release* make(int wake_fd) { return new zc_release(wake_fd); }
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  std::size_t outstanding() const noexcept { return outstanding_.load(std::memory_order_acquire); }

  /// A message of `bytes` at `data`, owned by ZeroMQ once sent; counts as outstanding until freed.
  zmq_message piece(const void* data, std::size_t bytes) {
    zmq_message m;
#if defined(CADENCE_ZMQ_TSAN)
    zc_tsan_handover().fetch_add(1, std::memory_order_release);
#endif
    retain();
    outstanding_.fetch_add(1, std::memory_order_acq_rel);
    // ZeroMQ takes a non-const pointer but only reads what it sends.
    if (zmq_msg_init_data(m.get(), const_cast<void*>(data), bytes, &zc_release::freed, this) != 0) {
      outstanding_.fetch_sub(1, std::memory_order_acq_rel);
      release();
      throw std::bad_alloc();
    }
    return m;
  }

private:
  explicit zc_release(int wake_fd) noexcept : wake_fd_(wake_fd) {}
  static void freed(void*, void* hint) noexcept {
#if defined(CADENCE_ZMQ_TSAN)
    (void)zc_tsan_handover().load(std::memory_order_acquire);
#endif
    auto* self = static_cast<zc_release*>(hint);
    self->outstanding_.fetch_sub(1, std::memory_order_acq_rel);
    if (self->wake_fd_ >= 0) {
      const std::uint64_t one = 1;
      [[maybe_unused]] const auto n = ::write(self->wake_fd_, &one, sizeof one);
    }
    self->release();
  }
  std::atomic<std::size_t> refs_{1};
  std::atomic<std::size_t> outstanding_{0};
  int wake_fd_;
};

/// An owning reference to a zc_release (the operation's).
class zc_ref {
public:
  zc_ref() = default;
  explicit zc_ref(zc_release* r) noexcept : r_(r) {}
  zc_ref(zc_ref&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  zc_ref& operator=(zc_ref&& o) noexcept {
    if (this != &o) {
      if (r_) r_->release();
      r_ = std::exchange(o.r_, nullptr);
    }
    return *this;
  }
  zc_ref(const zc_ref&) = delete;
  zc_ref& operator=(const zc_ref&) = delete;
  ~zc_ref() {
    if (r_) r_->release();
  }
  zc_release* get() const noexcept { return r_; }
  std::size_t outstanding() const noexcept { return r_ ? r_->outstanding() : 0; }

private:
  zc_release* r_ = nullptr;
};

// ---- the data path's messages ----

enum class zmq_kind : std::uint8_t {
  eager = 1,      // a point-to-point message with its data after the header
  announce = 2,   // a large message: size, tag and id; the data follows a clear
  clear = 3,      // the receiver posted a matching receive for announced message `id`
  refuse = 4,     // the receiver refuses announced message `id` (its size); text follows
  piece = 5,      // bytes [offset, offset + length) of large message `id`
  credit = 6,     // the receiver took `offset` more bytes of the sender's window
  coll = 7,       // a collective's notice (step == zmq_notice_step) or data
  coll_fail = 8,  // the sender saw collective `id` fail: arguments differ (text follows)
  bye = 9,        // the sender destroyed (offset 0) or aborted (zmq_bye_aborted) its communicator
  withdraw = 10,  // the sender cancelled announced message `id` before it was cleared
  hello = 11,     // the first message on a new connection: tells the receiver which socket is whose
  stream = 12,    // a message within a quarter of the credit window: its pieces follow at once
};

inline constexpr std::uint32_t zmq_notice_step = 0xFFFFFFFFu;

/// A goodbye's `offset` when the sender aborted its communicator (abort()) instead of destroying
/// it; 0 otherwise. An older peer reads either as a goodbye.
inline constexpr std::uint64_t zmq_bye_aborted = 1;

/// Every data-path message starts with this (host byte order; little-endian hosts only).
struct zmq_header {
  std::uint8_t kind = 0;
  std::uint8_t coll = 0;  // collective: 1 allreduce, 2 broadcast
  std::uint8_t type = 0;  // collective: dtype
  std::uint8_t op = 0;    // collective: reduce_op
  std::int32_t tag = 0;   // point to point: tag; broadcast: root
  std::int32_t src = 0;
  std::int32_t dst = 0;
  std::uint64_t src_incarnation = 0;
  std::uint64_t dst_incarnation = 0;  // messages for another incarnation of dst are dropped
  std::uint64_t id = 0;               // large message id; collective index (1-based); bye:
                                      // the collectives the sender completed, all of 1..id
  std::uint64_t bytes = 0;            // message bytes; collective: count (allreduce) or bytes
  std::uint64_t offset = 0;           // piece or chunk offset; credit: bytes returned
  std::uint32_t step = 0;             // ring step, or zmq_notice_step
  std::uint32_t length = 0;           // bytes of data carried by this message
};
static_assert(sizeof(zmq_header) == 64, "cadence: zmq_header must be 64 bytes on the wire");
static_assert(std::is_trivially_copyable_v<zmq_header>, "cadence: zmq_header is copied as bytes");

inline constexpr std::size_t zmq_dst_incarnation_offset = offsetof(zmq_header, dst_incarnation);

/// The routing id of a data socket: 'C', the rank (4 bytes), its incarnation (8 bytes). ZeroMQ
/// reserves ids that start with a zero byte.
inline std::string zmq_identity(int rank, std::uint64_t incarnation) {
  std::string id(13, 'C');
  const std::int32_t r = rank;
  std::memcpy(&id[1], &r, 4);
  std::memcpy(&id[5], &incarnation, 8);
  return id;
}
inline bool zmq_parse_identity(const unsigned char* p, std::size_t n, int& rank, std::uint64_t& incarnation) {
  if (n != 13 || p[0] != 'C') return false;
  std::int32_t r = 0;
  std::memcpy(&r, p + 1, 4);
  std::memcpy(&incarnation, p + 5, 8);
  rank = r;
  return true;
}

/// Longest text a refuse or coll_fail message may carry.
inline constexpr std::size_t zmq_max_text = 4096;

/// One data-path message as it came off our ROUTER: who sent it (the routing id), its header,
/// and where its data starts in which frame; `why` says what is malformed (empty: nothing).
struct zmq_parsed {
  int src = -1;
  std::uint64_t inc = 0;
  zmq_header h{};
  bool in_second = false;  // the data is the second frame (a piece sent without a copy)
  std::size_t data_len = 0;
  std::string why;
};

/// Checks a message against itself before anything acts on it: the routing id, a whole header,
/// a known kind, a sender and destination in range, data exactly as long as the header says,
/// and per kind what its fields allow. `second_len` is the second frame's size (null: one
/// frame). Pure, so that a fuzz target drives it (tests/fuzz/zmq_message_fuzz.cpp).
inline zmq_parsed zmq_parse(const unsigned char* id, std::size_t id_len, const unsigned char* first,
                            std::size_t first_len, const std::size_t* second_len, int rank, int size) {
  zmq_parsed m;
  if (!zmq_parse_identity(id, id_len, m.src, m.inc)) {
    m.src = -1;
    m.why = "a routing id that names no rank (" + std::to_string(id_len) + " bytes)";
    return m;
  }
  if (first_len < sizeof(zmq_header)) {
    m.why = "a " + std::to_string(first_len) + "-byte frame, shorter than a header";
    return m;
  }
  std::memcpy(&m.h, first, sizeof m.h);
  m.in_second = second_len != nullptr;
  m.data_len = m.in_second ? *second_len : first_len - sizeof(zmq_header);
  if (m.in_second && first_len != sizeof(zmq_header)) {
    m.why = "a header frame of " + std::to_string(first_len) + " bytes before a data frame";
    return m;
  }
  const auto& h = m.h;
  if (m.src < 0 || m.src >= size || m.src == rank || h.src != m.src) {
    m.why = "a sender of rank " + std::to_string(h.src) + " on the connection of rank " + std::to_string(m.src);
    return m;
  }
  if (h.dst != rank) {
    m.why = "a message for rank " + std::to_string(h.dst);
    return m;
  }
  if (h.length != m.data_len) {
    m.why = "a header that claims " + std::to_string(h.length) + " bytes of data where " + std::to_string(m.data_len) +
            " came";
    return m;
  }
  const auto no_data = [&](const char* kind) {
    if (m.data_len != 0) m.why = std::string("a ") + kind + " message with " + std::to_string(m.data_len) + " bytes of data";
  };
  switch (static_cast<zmq_kind>(h.kind)) {
    case zmq_kind::eager:
      if (h.bytes != m.data_len)
        m.why = "an eager message of " + std::to_string(h.bytes) + " bytes carrying " + std::to_string(m.data_len);
      else if (h.tag < 0 || h.tag > 32767)
        m.why = "tag " + std::to_string(h.tag);
      return m;
    case zmq_kind::announce:
    case zmq_kind::stream:
      no_data(h.kind == static_cast<std::uint8_t>(zmq_kind::announce) ? "announce" : "stream");
      if (m.why.empty() && (h.tag < 0 || h.tag > 32767)) m.why = "tag " + std::to_string(h.tag);
      return m;
    case zmq_kind::piece:
      if (m.data_len == 0) m.why = "an empty piece";
      else if (h.offset > ~std::uint64_t{0} - m.data_len) m.why = "a piece whose offset overflows";
      return m;
    case zmq_kind::credit:
      no_data("credit");
      if (m.why.empty() && h.offset == 0) m.why = "a credit of 0 bytes";
      return m;
    case zmq_kind::refuse:
    case zmq_kind::coll_fail:
      if (m.data_len > zmq_max_text) m.why = "a text of " + std::to_string(m.data_len) + " bytes";
      return m;
    case zmq_kind::coll:
      if (h.step == zmq_notice_step) no_data("collective notice");
      if (m.why.empty() && h.id == 0) m.why = "a collective of index 0";
      if (m.why.empty() && (h.coll < 1 || h.coll > 2)) m.why = "a collective of kind " + std::to_string(h.coll);
      return m;
    case zmq_kind::clear: no_data("clear"); return m;
    case zmq_kind::bye: no_data("bye"); return m;
    case zmq_kind::withdraw: no_data("withdraw"); return m;
    case zmq_kind::hello: no_data("hello"); return m;
  }
  m.why = "a message of unknown kind " + std::to_string(h.kind);
  return m;
}

// ---- rendezvous messages ----

enum class zmq_rdv_kind : std::uint8_t {
  hello = 1,     // rank, size, endpoint: register (or register again) in a rank slot
  welcome = 2,   // your incarnation, then every slot: incarnation, state, endpoint
  refused = 3,   // text: why this registration was refused
  update = 4,    // rank, incarnation, endpoint: a process registered in that slot
  replaced = 5,  // incarnation: a newer process took your slot
};

inline constexpr char zmq_rdv_magic[4] = {'C', 'D', 'Z', '1'};

/// Appends fixed-size values and length-prefixed strings; the reader takes them back, refusing
/// a truncated message instead of reading past its end.
class zmq_writer {
public:
  explicit zmq_writer(zmq_rdv_kind k) {
    bytes_.insert(bytes_.end(), zmq_rdv_magic, zmq_rdv_magic + 4);
    put(static_cast<std::uint8_t>(k));
  }
  template <class T>
  zmq_writer& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>, "cadence: plain values only");
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof v);
    return *this;
  }
  zmq_writer& put_string(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  const std::vector<char>& bytes() const noexcept { return bytes_; }

private:
  std::vector<char> bytes_;
};

class zmq_reader {
public:
  zmq_reader(const unsigned char* p, std::size_t n) : p_(p), n_(n) {}
  /// The message's kind, or nullopt for a message that is not ours.
  std::optional<zmq_rdv_kind> kind() {
    if (n_ < 5 || std::memcmp(p_, zmq_rdv_magic, 4) != 0) return std::nullopt;
    pos_ = 5;
    return static_cast<zmq_rdv_kind>(p_[4]);
  }
  template <class T>
  bool get(T& v) {
    if (n_ - pos_ < sizeof v) return false;
    std::memcpy(&v, p_ + pos_, sizeof v);
    pos_ += sizeof v;
    return true;
  }
  /// A length-prefixed string of at most `limit` bytes (a longer claim is refused unread).
  bool get_string(std::string& s, std::uint32_t limit = 4096) {
    std::uint32_t len = 0;
    if (!get(len) || len > limit || n_ - pos_ < len) return false;
    s.assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return true;
  }

private:
  const unsigned char* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

}  // namespace cadence::transport::detail
