// A parameter server's traffic in flight, per rank: the replies and refusals it posted without
// waiting (each pinning the version of the weights it reads, each with its deadline) and the
// gradient payload it is receiving, into a buffer of its scratch pool. The mechanism only: what
// a failed or late transfer costs its worker is the server's decision (ps/server.hpp), told
// through the callbacks and return values here.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/exchange/ps/detail/protocol.hpp>
#include <cadence/exchange/ps/detail/transfer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence::exchange::detail {

template <class Comm, class Bulk, class T>
class ps_flights {
public:
  using clock = std::chrono::steady_clock;

  // A reply (its payload: the pinned weights) or a refusal (its payload: the text) to a rank.
  struct outbound {
    ps_header header;  // the bytes the control send reads: kept here until it is done
    std::string text;  // a refusal's text
    ps_transfer<Comm> control;
    ps_transfer<Comm> control_text;  // a refusal's text follows its header
    ps_transfer<Bulk> bulk;          // a reply's weights
    typename ps_versions<T>::pin_id pin = ps_versions<T>::no_pin;
    clock::time_point deadline;
    std::int64_t worker = -1;  // whose (the rank's id when posted)
  };
  // A push's gradient payload on its way in.
  struct inbound {
    ps_header header;
    ps_transfer<Bulk> transfer;
    T* buffer = nullptr;
    std::size_t scratch = 0;  // index into scratch_ (owned storage)
    clock::time_point deadline;
  };

  ps_flights(Comm& control, Bulk& bulk, ps_tags tags, std::chrono::nanoseconds transfer_timeout)
      : comm_(control), bulk_(bulk), tags_(tags), timeout_(transfer_timeout) {}

  // Once the server's slice exists: a queue per rank of `ranks`, and where payloads land (the
  // caller's single `external` buffer, or a pool of buffers of `count` elements when null).
  void start(std::size_t ranks, ps_versions<T>& weights, T* external, std::size_t count) {
    out_.resize(ranks);
    in_.resize(ranks);
    weights_ = &weights;
    external_ = external;
    count_ = count;
  }

  std::size_t ranks() const noexcept { return out_.size(); }
  std::deque<outbound>& out(int rank) { return out_[static_cast<std::size_t>(rank)]; }
  std::optional<inbound>& in(int rank) { return in_[static_cast<std::size_t>(rank)]; }

  // Transfers not finished yet, both ways.
  std::size_t count() const {
    std::size_t n = 0;
    for (const auto& q : out_) n += q.size();
    for (const auto& p : in_) n += p ? 1 : 0;
    return n;
  }

  // Queues `o` for `rank` (worker w's, or -1) and posts its header, then its payload: `bytes`
  // of `payload` on the bulk communicator, or without a payload the refusal's text on the
  // control one. Throws the transport_error of a send that could not be posted (the entry
  // stays queued: abandon() withdraws it).
  void post(int rank, std::int64_t w, outbound o, const T* payload, std::size_t bytes) {
    auto& q = out(rank);
    o.worker = w;
    o.deadline = clock::now() + timeout_;
    q.push_back(std::move(o));
    outbound& e = q.back();
    e.control = ps_transfer<Comm>::send(comm_, &e.header, sizeof e.header, rank, tags_.reply, timeout_);
    if (payload != nullptr) {
      // Lent, not copied, where the transport would copy it (MPI): the payload is a pinned
      // version of the server's own, kept (leaked with the server, if need be) for as long as
      // the send may read it. The caller's single version (external) is not the server's to keep.
      const bool lend = ps_lends_v<Bulk> && !weights_->external();
      if (lend) weights_->lent();
      e.bulk = ps_transfer<Bulk>::send(bulk_, payload, bytes, rank, tags_.reply_data, timeout_, lend);
    } else {
      e.bulk = ps_transfer<Bulk>();  // the text goes on the control communicator
    }
    if (payload == nullptr)
      e.control_text = ps_transfer<Comm>::send(comm_, e.text.data(), e.text.size(), rank, tags_.reply_data, timeout_);
  }

  // The replies and refusals in flight: completed ones unpin their version of the weights. The
  // oldest transfer to a rank that failed (its peer lost: `on_fail(rank, &error)`) or missed its
  // deadline (`on_fail(rank, nullptr)`) is reported, and nothing behind it is looked at; the
  // error rethrows when a communicator itself has failed.
  template <class OnFail>
  void progress_outbound(OnFail&& on_fail) {
    for (std::size_t r = 0; r < out_.size(); ++r) {
      auto& q = out_[r];
      while (!q.empty()) {
        outbound& o = q.front();
        bool complete = false;
        try {
          complete = o.control.test() && o.control_text.test() && o.bulk.test();
        } catch (const transport_error& err) {
          if (comm_.failed() || bulk_.failed()) throw;
          on_fail(static_cast<int>(r), &err);
          break;
        }
        if (complete) {
          weights_->unpin(o.pin);
          q.pop_front();
          continue;
        }
        if (clock::now() >= o.deadline) on_fail(static_cast<int>(r), nullptr);
        break;  // later ones are behind it
      }
    }
  }

  // Cancels everything queued for `rank`; returns the worker the last of it was for (-1: none).
  std::int64_t abandon(int rank) {
    auto& q = out(rank);
    std::int64_t w = -1;
    for (auto& o : q) {
      const bool freed = o.control.cancel() && o.control_text.cancel() && o.bulk.cancel();
      if (freed) weights_->unpin(o.pin);  // else the transport may still read that version
      if (o.worker >= 0) w = o.worker;
    }
    q.clear();
    return w;
  }

  // Posts the receive of the payload that header `h` from `rank` announced, into a scratch
  // buffer. Throws the transport_error of a receive that could not be posted.
  void receive(int rank, const ps_header& h) {
    inbound in;
    in.header = h;
    in.deadline = clock::now() + timeout_;
    if (weights_->external()) {
      in.buffer = external_;
    } else {
      in.scratch = take_scratch();
      in.buffer = scratch_[in.scratch]->data();
    }
    try {
      in.transfer = ps_transfer<Bulk>::recv(bulk_, in.buffer, count_ * sizeof(T), rank, tags_.data, timeout_);
    } catch (const transport_error&) {
      release_scratch(in);
      throw;
    }
    this->in(rank) = std::move(in);
  }

  // The payload from `rank` once it is in (the slot is empty again; release_scratch() it after
  // use); nothing while it is on its way. A receive that failed (`on_fail(&error)`, rethrown
  // when a communicator itself has failed) or missed its deadline (`on_fail(nullptr)`; its
  // buffer stays the transport's unless the receive could be withdrawn) empties the slot.
  template <class OnFail>
  std::optional<inbound> landed(int rank, OnFail&& on_fail) {
    auto& slot = in(rank);
    if (!slot) return std::nullopt;
    bool complete = false;
    try {
      complete = slot->transfer.test();
    } catch (const transport_error& err) {
      if (comm_.failed() || bulk_.failed()) throw;
      release_scratch(*slot);
      slot.reset();
      on_fail(&err);
      return std::nullopt;
    }
    if (!complete) {
      if (clock::now() >= slot->deadline) {
        if (slot->transfer.cancel()) release_scratch(*slot);
        slot.reset();
        on_fail(nullptr);
      }
      return std::nullopt;
    }
    std::optional<inbound> out(std::move(*slot));
    slot.reset();
    return out;
  }

  // Takes a payload of `count` elements from `rank` that nothing will apply, so the stream stays
  // in step; false when it cannot (device buffers, or more than `limit` elements). Throws the
  // receive's transport_error.
  bool discard(int rank, std::size_t count, std::size_t limit) {
    if (bulk_.capabilities().device_buffers || count > limit) return false;
    std::vector<T> junk(count);
    bulk_.recv(junk.data(), junk.size() * sizeof(T), rank, tags_.data, timeout_);
    return true;
  }

  // A payload's buffer is free again (applied, or its transfer withdrawn).
  void release_scratch(const inbound& in) {
    if (!weights_->external()) free_scratch_.push_back(in.scratch);
  }

private:
  std::size_t take_scratch() {
    if (!free_scratch_.empty()) {
      const std::size_t i = free_scratch_.back();
      free_scratch_.pop_back();
      return i;
    }
    scratch_.push_back(std::make_unique<std::vector<T>>(count_));
    return scratch_.size() - 1;
  }

  Comm& comm_;
  Bulk& bulk_;
  ps_tags tags_;
  std::chrono::nanoseconds timeout_;
  ps_versions<T>* weights_ = nullptr;  // the server's
  T* external_ = nullptr;              // the caller's scratch buffer (device memory), or null
  std::size_t count_ = 0;              // elements of a payload (the slice)
  std::vector<std::deque<outbound>> out_;   // per rank
  std::vector<std::optional<inbound>> in_;  // per rank
  std::vector<std::unique_ptr<std::vector<T>>> scratch_;
  std::vector<std::size_t> free_scratch_;
};

}  // namespace cadence::exchange::detail
