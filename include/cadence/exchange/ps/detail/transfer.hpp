// The parameter server's two mechanisms under its traffic: a send or receive posted without
// waiting (the communicator's work handle where it has the asynchronous operations, else the
// blocking call done at once), and the copy-on-write versions of a server's slice that replies
// read.
#pragma once

#include <cadence/transport/communicator.hpp>
#include <cadence/transport/mpi/options.hpp>  // lend_t only (no MPI in it)

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::exchange::detail {

// ---- a posted transfer ----

template <class C, bool = transport::has_async_v<C>>
struct ps_work_of {
  using type = decltype(std::declval<C&>().isend(std::declval<const void*>(), std::size_t{}, int{}, int{}));
};
// Without the asynchronous operations a transfer is the blocking call, complete when posted.
template <class C>
struct ps_work_of<C, false> {
  struct type {
    bool test() { return true; }
    bool cancel() noexcept { return true; }
  };
};

// Whether C offers the lending sends (transport/mpi/options.hpp, lend_t): send(buf, n, dst,
// tag, lend, d) and isend(buf, n, dst, tag, lend), which never copy the caller's buffer because
// the caller keeps it for as long as the transport may read it, and bounces_sends() (whether
// the other sends are copied). The MPI communicator does; the backends that never copy a send
// need not.
template <class C, class = void>
struct ps_lends : std::false_type {};
template <class C>
struct ps_lends<C, std::void_t<decltype(std::declval<C&>().send(std::declval<const void*>(), std::size_t{}, int{}, int{},
                                                                 transport::lend, transport::deadline{})),
                               decltype(std::declval<C&>().isend(std::declval<const void*>(), std::size_t{}, int{},
                                                                 int{}, transport::lend)),
                               decltype(bool(std::declval<const C&>().bounces_sends()))>> : std::true_type {};
template <class C>
inline constexpr bool ps_lends_v = ps_lends<C>::value;

/// One send or receive of the server's, posted at once and finished by test(): over a
/// communicator with the asynchronous operations the server never waits on it; over one without,
/// post() is the blocking call with its deadline (as before that extension existed).
template <class C>
class ps_transfer {
public:
  static constexpr bool async = transport::has_async_v<C>;

  ps_transfer() = default;

  /// With `lent`, the caller keeps `buf` valid and unchanged until the transfer completed, or
  /// for good when it never does (cancel() said false): a transport that would copy it (MPI's
  /// bounce buffer) then does not.
  static ps_transfer send(C& c, const void* buf, std::size_t bytes, int dst, int tag, transport::deadline d,
                          bool lent = false) {
    if constexpr (ps_lends_v<C>) {
      if (lent)
        return post(c, [&](auto& cc) { return cc.isend(buf, bytes, dst, tag, transport::lend); },
                    [&](auto& cc) { cc.send(buf, bytes, dst, tag, transport::lend, d); });
    }
    return post(c, [&](auto& cc) { return cc.isend(buf, bytes, dst, tag); },
                [&](auto& cc) { cc.send(buf, bytes, dst, tag, d); });
  }
  static ps_transfer recv(C& c, void* buf, std::size_t bytes, int src, int tag, transport::deadline d) {
    return post(c, [&](auto& cc) { return cc.irecv(buf, bytes, src, tag); },
                [&](auto& cc) { cc.recv(buf, bytes, src, tag, d); });
  }

  /// True once complete; throws the transfer's transport_error once it failed.
  bool test() { return work_.test(); }
  /// True when nothing will touch the buffer any more (see communicator.hpp, requirement 4).
  bool cancel() noexcept { return work_.cancel(); }

private:
  // `start` posts the asynchronous form where C has it; else `block` is the blocking call with
  // its deadline, complete when it returns. Generic lambdas: the form C lacks is never compiled.
  template <class Start, class Block>
  static ps_transfer post(C& c, Start&& start, Block&& block) {
    ps_transfer t;
    if constexpr (async)
      t.work_ = start(c);
    else
      block(c);
    return t;
  }

  typename ps_work_of<C>::type work_{};
};

// ---- the versions of a server's slice ----

/// A server's slice of the weights, copy-on-write. A reply pins the version it sends from until
/// its transfer completed; an update applied while the current version is pinned writes the
/// next version into a free buffer instead, so a reply still on its way never sees a half-
/// applied update and an update never waits for a slow worker to take its reply. Buffers are
/// reused once unpinned; a version whose transfer could not be withdrawn (cancel() false) stays
/// pinned for good, and is leaked rather than freed with the server: that is what lets a reply
/// be lent to the transport instead of copied. Over the caller's own buffer (device memory)
/// there is one version only.
template <class T>
class ps_versions {
public:
  using pin_id = std::size_t;
  static constexpr pin_id no_pin = static_cast<pin_id>(-1);

  ps_versions(const T* initial, std::size_t count) : count_(count) {
    all_.push_back(std::make_unique<version>());
    all_.back()->data.assign(initial, initial + count);
  }
  /// One version in the caller's storage (count elements, holding the initial values).
  ps_versions(T* external, std::size_t count) : count_(count), external_(external) {}
  ps_versions(const ps_versions&) = delete;
  ps_versions& operator=(const ps_versions&) = delete;
  /// A version still pinned is one a reply's send may read after the server is gone (it failed
  /// or was abandoned, and MPI cannot withdraw a send): once replies have been lent to the
  /// transport (lent(), ps_transfer::send), such a buffer is leaked, never freed.
  ~ps_versions() {
    if (!lent_) return;
    for (auto& v : all_)
      if (v && v->pins > 0) (void)v.release();
  }
  /// Says that a reply's send reads a pinned version without a copy (lent to the transport).
  void lent() noexcept { lent_ = true; }

  bool external() const noexcept { return external_ != nullptr; }
  std::size_t count() const noexcept { return count_; }
  T* current() noexcept { return external_ ? external_ : all_[current_]->data.data(); }
  const T* current() const noexcept { return external_ ? external_ : all_[current_]->data.data(); }
  /// Buffers ever allocated (for tests and stats): stays small unless replies pile up.
  std::size_t buffers() const noexcept { return external_ ? 1 : all_.size(); }

  /// Pins the current version for a reply; unpin() with the id once its transfer completed.
  pin_id pin() {
    if (external_) {
      ++external_pins_;
      return 0;
    }
    ++all_[current_]->pins;
    return current_;
  }
  void unpin(pin_id id) noexcept {
    if (id == no_pin) return;
    if (external_) {
      if (external_pins_ > 0) --external_pins_;
      return;
    }
    if (all_[id]->pins > 0) --all_[id]->pins;
  }
  bool current_pinned() const noexcept { return external_ ? external_pins_ > 0 : all_[current_]->pins > 0; }

  /// Applies `update` (the server's rule: in place, or out of place when it offers
  /// update(out, in, g, n, w)) to the current version, into a fresh one when it is pinned.
  /// Over the caller's storage the caller must have drained the pins first.
  template <class Update, class W>
  void apply(Update& update, const T* gradient, W worker) {
    if (external_ || all_[current_]->pins == 0) {
      update(current(), gradient, count_, worker);
      return;
    }
    const std::size_t next = free_version();
    T* out = all_[next]->data.data();
    const T* in = all_[current_]->data.data();
    if constexpr (std::is_invocable_v<Update&, T*, const T*, const T*, std::size_t, W>) {
      update(out, in, gradient, count_, worker);
    } else {
      if (count_ != 0) std::memcpy(out, in, count_ * sizeof(T));
      update(out, gradient, count_, worker);
    }
    current_ = next;
  }

private:
  struct version {
    std::vector<T> data;
    int pins = 0;
  };

  std::size_t free_version() {
    for (std::size_t i = 0; i < all_.size(); ++i)
      if (i != current_ && all_[i]->pins == 0) return i;
    all_.push_back(std::make_unique<version>());
    all_.back()->data.resize(count_);
    return all_.size() - 1;
  }

  std::size_t count_ = 0;
  T* external_ = nullptr;
  int external_pins_ = 0;
  std::vector<std::unique_ptr<version>> all_;
  std::size_t current_ = 0;
  bool lent_ = false;  // a send reads a version without a copy: pinned ones outlive this
};

}  // namespace cadence::exchange::detail
