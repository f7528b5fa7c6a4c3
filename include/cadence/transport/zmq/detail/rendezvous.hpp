// The ZeroMQ backend's rendezvous and membership: rank 0 binds a ROUTER where every process
// registers in its rank slot (hello), gets the slot's next incarnation and the table of the
// others (welcome), and every live rank hears of each registration (update); a process whose
// slot a newer one took is told it is cut off (replaced). A registration survives a broken
// connection: the process dials under a routing id of its own (its token), sends its hello again
// whenever the connection breaks before the welcome came, and rank 0 answers a repeated hello of
// the process that holds the slot with the same welcome (issue 36: a welcome lost with a
// connection that broke left a restarted rank waiting for its whole deadline).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/engine/latch.hpp>
#include <cadence/transport/zmq/detail/peers.hpp>
#include <cadence/transport/zmq/detail/sockets.hpp>
#include <cadence/transport/zmq/detail/wire.hpp>
#include <cadence/transport/zmq/options.hpp>

#include <zmq.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace cadence::transport::detail {

/// Owning thread only. Map of its state: rdv_ (rank 0: the ROUTER every process registers at;
/// elsewhere: a DEALER to it), endpoint_ (its address), slots_ (rank 0: per slot, incarnations
/// issued, the registered process's token and rendezvous id), token_ (elsewhere: this process's
/// token, its routing id at rank 0's ROUTER), welcomed_ / refused_ (this process's
/// registration), dirty_ (rdv_ must be read to EAGAIN before its descriptor is trusted).
class zmq_rendezvous {
public:
  zmq_rendezvous(int rank, int size, const zmq_options& o, zmq_sockets& sockets, zmq_peer_table& peers,
                 failure_latch& latch)
      : rank_(rank), size_(size), o_(&o), sockets_(&sockets), peers_(&peers), latch_(&latch) {}
  zmq_rendezvous(const zmq_rendezvous&) = delete;
  zmq_rendezvous& operator=(const zmq_rendezvous&) = delete;

  /// A process now holds slot p under incarnation `inc` (alive false: rank 0 reported it lost
  /// already): the engine's adopt().
  std::function<void(int, std::uint64_t, const std::string&, bool)> adopt;
  /// This process's welcome came: the engine replays what peers sent before it.
  std::function<void()> on_welcome;

  /// Rank 0 binds the rendezvous and is registered at once (incarnation 1); every other rank
  /// connects and registers with its data endpoint.
  void open(const call_info& c, const std::string& data_endpoint) {
    data_endpoint_ = data_endpoint;
    if (rank_ == 0) {
      rdv_ = sockets_->open(c, ZMQ_ROUTER);
      // A process that dials again after its connection broke comes back under its own routing
      // id: the new connection takes the id over from the old one, which rank 0 may not yet
      // know is dead, so that the answer to its hello goes where the process now listens.
      zmq_set_int(rdv_, ZMQ_ROUTER_HANDOVER, 1);
      // For its whole life: the connections whose handshake fails are counted (stats()).
      monitor_ = sockets_->monitor(c, rdv_, "inproc://cadence-rendezvous-monitor", zmq_handshake_failed);
      zmq_bind_endpoint(c, rdv_, o_->rendezvous, "the rendezvous");
      endpoint_ = zmq_last_endpoint(rdv_);
      peers_->set_incarnation(1);
      slots_.assign(static_cast<std::size_t>(size_), zmq_slot{});
      slots_[0].issued = 1;
      welcomed_ = true;
      if (o_->on_rendezvous_bound) o_->on_rendezvous_bound(endpoint_);
      return;
    }
    rdv_ = sockets_->open(c, ZMQ_DEALER);
    // Until the welcome: how the handshakes with rank 0 fail, for the error a wait ends with
    // (a process without the job secret is refused without a word, and retries).
    monitor_ = sockets_->monitor(c, rdv_, "inproc://cadence-rendezvous-monitor",
                                 zmq_handshake_failed | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED);
    endpoint_ = o_->rendezvous;
    token_ = zmq_new_token();
    const std::string id = zmq_rdv_routing_id(token_);
    zmq_setsockopt(rdv_, ZMQ_ROUTING_ID, id.data(), id.size());
    if (zmq_connect(rdv_, o_->rendezvous.c_str()) != 0)
      bad_argument(c, "cannot connect to the rendezvous \"" + o_->rendezvous + "\": " + zmq_reason());
    send_hello();
  }

  /// The routing id a registering process dials rank 0 under: derived from its token, so that
  /// rank 0 answers the process (whichever of its connections is the live one) rather than the
  /// connection a hello came over. Never starts with a zero byte (ZeroMQ reserves those).
  static std::string zmq_rdv_routing_id(std::uint64_t token) {
    std::string id(1 + sizeof token, 'R');
    std::memcpy(&id[1], &token, sizeof token);
    return id;
  }

  /// This process's token (ranks other than 0): its registration's identity at rank 0.
  std::uint64_t token() const noexcept { return token_; }

  /// Ranks other than 0, before the welcome: why this process's connection to rank 0 has not
  /// worked so far (empty: nothing went wrong that a socket could see). Reads the rendezvous
  /// socket's monitor, which nothing polls.
  std::string trouble() {
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    const std::string other = ": it uses another security mode or job secret, or is not a Cadence rendezvous";
    // The most telling so far: a refusal over a closed connection over no listener.
    auto note = [&](int level, std::string what) {
      if (level < trouble_level_) return;
      trouble_level_ = level;
      trouble_ = std::move(what);
    };
    while (rank_ != 0 && monitor_ != nullptr && zmq_read_event(monitor_, event, value)) {
      // A connection that broke (or never got through its handshake) may have taken the hello,
      // or rank 0's welcome, with it: the hello goes again, on the next connection. Rank 0
      // answers a repeated hello of the same process with the same welcome, so a duplicate
      // costs nothing; without this the process would wait out its whole deadline.
      if (!welcomed_ && (event == ZMQ_EVENT_DISCONNECTED || (event & zmq_handshake_failed) != 0)) {
        send_hello();
        ++hellos_resent_;
      }
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        note(3, "rank 0 refused this process's credentials (ZAP status " + std::to_string(value) +
                    "): it holds another job secret");
      else if ((event & zmq_handshake_failed) != 0)
        note(3, "the handshake with rank 0 failed" + other);
      else if (event == ZMQ_EVENT_DISCONNECTED)
        note(2, "rank 0 closed the connection before answering" + other);
      else if (event == ZMQ_EVENT_CONNECT_RETRIED)
        note(1, "nothing accepts connections at " + o_->rendezvous + " yet");
    }
    return trouble_;
  }

  /// Ranks other than 0: how often the hello went again after a broken connection.
  std::size_t hellos_resent() const noexcept { return hellos_resent_; }

  /// Ranks other than 0, after the welcome: the monitor is no longer read.
  void stop_watching() noexcept {
    if (rank_ == 0 || monitor_ == nullptr) return;
    zmq_socket_monitor(rdv_, nullptr, 0);
    sockets_->close(monitor_, 0);
  }

  /// Rank 0: the monitor of the rendezvous, polled with the other sockets, and what it counted.
  void* monitor() const noexcept { return rank_ == 0 ? monitor_ : nullptr; }
  void drain_monitor() {
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    while (rank_ == 0 && monitor_ != nullptr && zmq_read_event(monitor_, event, value))
      if ((event & zmq_handshake_failed) != 0) ++refused_connections_;
  }
  std::size_t refused_connections() const noexcept { return refused_connections_; }
  /// Rank 0: hellos answered again (a process whose connection broke before its welcome).
  std::size_t repeated_hellos() const noexcept { return repeated_hellos_; }

  void* socket() const noexcept { return rdv_; }
  bool dirty() const noexcept { return dirty_; }
  bool welcomed() const noexcept { return welcomed_; }
  const std::optional<std::string>& refused() const noexcept { return refused_; }
  const std::string& endpoint() const noexcept { return endpoint_; }
  void close(int linger) noexcept { sockets_->close(rdv_, linger); }

  /// Takes in every registration (rank 0) or answer and news from rank 0 (the others).
  void drain() {
    dirty_ = false;
    for (;;) {
      zmq_message first;
      if (zmq_msg_recv(first.get(), rdv_, ZMQ_DONTWAIT) < 0) return;
      std::string from;
      zmq_message body;
      if (rank_ == 0) {  // ROUTER: the sender's id first
        if (!first.more()) continue;
        from.assign(reinterpret_cast<const char*>(first.data()), first.size());
        if (zmq_msg_recv(body.get(), rdv_, ZMQ_DONTWAIT) < 0) return;
      } else {
        body = std::move(first);
      }
      while (body.more()) {
        zmq_message extra;
        if (zmq_msg_recv(extra.get(), rdv_, ZMQ_DONTWAIT) < 0) break;
        if (!extra.more()) break;
      }
      zmq_reader rd(body.data(), body.size());
      const auto kind = rd.kind();
      if (!kind) continue;
      if (rank_ == 0) {
        if (*kind == zmq_rdv_kind::hello) on_hello(from, rd);
      } else {
        on_news(*kind, rd);
      }
    }
  }

private:
  struct zmq_slot {
    std::uint64_t issued = 0;
    std::uint64_t token = 0;  // of the process registered last (0: none yet)
    std::string rdv_id;
  };

  // A token per process: its registration's identity. Random, so that a restarted process in
  // the same slot (same rank, perhaps the same pid in another namespace) is a different one.
  static std::uint64_t zmq_new_token() {
    std::random_device rd;
    std::uint64_t t = 0;
    while (t == 0) t = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    return t;
  }

  // Ranks other than 0: the registration, queued on the DEALER until a connection is up.
  void send_hello() {
    zmq_writer w(zmq_rdv_kind::hello);
    w.put(static_cast<std::int32_t>(rank_)).put(static_cast<std::int32_t>(size_)).put_string(data_endpoint_);
    w.put(token_);
    send({}, w);
  }

  // Rank 0: the welcome of the process registered in slot r: its incarnation and the table.
  void send_welcome(int r) {
    const zmq_slot& slot = slots_[static_cast<std::size_t>(r)];
    zmq_writer w(zmq_rdv_kind::welcome);
    w.put(slot.issued).put(static_cast<std::int32_t>(size_));
    for (int p = 0; p < size_; ++p) {
      const bool self = p == 0;
      w.put(self ? peers_->incarnation() : peers_->at(p).inc);
      w.put(static_cast<std::uint8_t>(self ? zmq_peer_state::alive : peers_->at(p).state));
      w.put_string(self ? data_endpoint_ : peers_->at(p).endpoint);
    }
    send(slot.rdv_id, w);
  }

  void send(const std::string& to, const zmq_writer& w) {
    if (rank_ == 0) {
      zmq_message id(to.size());
      std::memcpy(id.data(), to.data(), to.size());
      if (zmq_msg_send(id.get(), rdv_, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) return;
    }
    zmq_message m(w.bytes().size());
    std::memcpy(m.data(), w.bytes().data(), w.bytes().size());
    zmq_msg_send(m.get(), rdv_, ZMQ_DONTWAIT);
    dirty_ = true;  // a send may take the descriptor's signal of a message that came in
  }

  // Rank 0: a process registers in a rank slot. It gets the slot's next incarnation and the
  // table; every other live rank is told.
  // A hello repeated by the process registered last in its slot (its connection broke, or its
  // first hello is read after the repeat) is answered with the same welcome: no new incarnation,
  // no news to the others, nobody cut off. Answers go to the routing id the token names, which
  // the process's live connection holds (ZMQ_ROUTER_HANDOVER), not to `from`: a hello read late
  // from a connection already replaced comes with a stand-in id that reaches nobody.
  void on_hello(const std::string& from, zmq_reader& rd) {
    std::int32_t r = -1, n = -1;
    std::string endpoint;
    std::uint64_t token = 0;
    if (!rd.get(r) || !rd.get(n) || !rd.get_string(endpoint)) return;
    if (!rd.get(token) || token == 0) {  // not from this version's rendezvous client
      zmq_writer w(zmq_rdv_kind::refused);
      w.put_string("rank " + std::to_string(r) + "'s registration carries no process token (another Cadence "
                   "version than rank 0's?)");
      send(from, w);
      return;
    }
    const std::string to = zmq_rdv_routing_id(token);
    auto refuse = [&](const std::string& why) {
      zmq_writer w(zmq_rdv_kind::refused);
      w.put_string(why);
      send(to, w);
    };
    if (n != size_)
      return refuse("rank " + std::to_string(r) + " was constructed with size " + std::to_string(n) +
                    ", rank 0 with size " + std::to_string(size_) +
                    " (arguments differ across ranks in construction)");
    if (r <= 0 || r >= size_)
      return refuse("rank " + std::to_string(r) + " is out of range [1, " + std::to_string(size_) +
                    ") for a registration (rank 0 is the rendezvous itself)");
    zmq_slot& slot = slots_[static_cast<std::size_t>(r)];
    if (slot.issued != 0 && slot.token == token) {
      ++repeated_hellos_;
      return send_welcome(r);
    }
    const std::uint64_t inc = ++slot.issued;
    if (!slot.rdv_id.empty() && slot.rdv_id != to) {
      zmq_writer w(zmq_rdv_kind::replaced);
      w.put(inc);
      send(slot.rdv_id, w);
    }
    slot.rdv_id = to;
    slot.token = token;
    adopt(r, inc, endpoint, true);
    send_welcome(r);
    zmq_writer up(zmq_rdv_kind::update);
    up.put(static_cast<std::int32_t>(r)).put(inc).put_string(endpoint);
    for (int p = 1; p < size_; ++p)
      if (p != r && peers_->at(p).state == zmq_peer_state::alive) send(slots_[static_cast<std::size_t>(p)].rdv_id, up);
  }

  // Ranks other than 0: rank 0's answers and news.
  void on_news(zmq_rdv_kind kind, zmq_reader& rd) {
    switch (kind) {
      case zmq_rdv_kind::welcome: {
        if (welcomed_) return;
        std::uint64_t inc = 0;
        std::int32_t n = 0;
        if (!rd.get(inc) || !rd.get(n) || n != size_) return;
        std::vector<std::uint64_t> incs(static_cast<std::size_t>(n));
        std::vector<std::uint8_t> states(static_cast<std::size_t>(n));
        std::vector<std::string> endpoints(static_cast<std::size_t>(n));
        for (std::size_t p = 0; p < incs.size(); ++p)
          if (!rd.get(incs[p]) || !rd.get(states[p]) || !rd.get_string(endpoints[p])) return;
        peers_->set_incarnation(inc);
        welcomed_ = true;
        for (int p = 0; p < size_; ++p) {
          const auto i = static_cast<std::size_t>(p);
          if (incs[i] != 0 && static_cast<zmq_peer_state>(states[i]) != zmq_peer_state::absent)
            adopt(p, incs[i], endpoints[i], static_cast<zmq_peer_state>(states[i]) == zmq_peer_state::alive);
        }
        on_welcome();
        return;
      }
      case zmq_rdv_kind::refused: {
        std::string why;
        if (rd.get_string(why)) refused_ = why;
        return;
      }
      case zmq_rdv_kind::update: {
        std::int32_t r = -1;
        std::uint64_t inc = 0;
        std::string endpoint;
        if (welcomed_ && rd.get(r) && rd.get(inc) && rd.get_string(endpoint)) adopt(r, inc, endpoint, true);
        return;
      }
      case zmq_rdv_kind::replaced: {
        std::uint64_t inc = 0;
        if (!rd.get(inc)) return;
        latch_->record(transport_error("cadence::transport[zmq]: rank " + std::to_string(rank_) + " of " +
                                       std::to_string(size_) + ": a newer process registered in this rank slot "
                                       "(incarnation " + std::to_string(inc) + "); this one (incarnation " +
                                       std::to_string(peers_->incarnation()) + ") is cut off"));
        return;
      }
      case zmq_rdv_kind::hello: return;
    }
  }

  const int rank_;
  const int size_;
  const zmq_options* o_;
  zmq_sockets* sockets_;
  zmq_peer_table* peers_;
  failure_latch* latch_;
  void* rdv_ = nullptr;
  void* monitor_ = nullptr;  // rank 0: for its life; the others: until the welcome
  std::string trouble_;
  int trouble_level_ = 0;
  std::size_t refused_connections_ = 0;  // rank 0
  std::size_t repeated_hellos_ = 0;      // rank 0
  std::size_t hellos_resent_ = 0;        // the others
  std::uint64_t token_ = 0;              // the others
  std::string endpoint_;
  std::string data_endpoint_;
  std::vector<zmq_slot> slots_;  // rank 0
  bool welcomed_ = false;
  bool dirty_ = false;
  std::optional<std::string> refused_;
};

}  // namespace cadence::transport::detail
