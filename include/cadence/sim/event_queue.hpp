/// \file
/// \ingroup sim
/// The simulator's future-event list: a binary min-heap ordered by (time, insertion order), a
/// total order, so the pop sequence and hence every run is the same under any standard library.
#pragma once

#include <cadence/core/types.hpp>

#include <cstdint>
#include <vector>

namespace cadence::sim {
/// \addtogroup sim
/// @{

/// What happens at an event.
enum class event_kind : std::uint8_t {
  push_arrives,    ///< a worker's push reaches the server
  worker_dies,     ///< a worker stops (it will push no more)
  worker_removed,  ///< the server notices the death and removes the worker from the controller
};

/// One scheduled event.
struct event {
  double time;        ///< when it happens, in simulated seconds
  std::uint64_t seq;  ///< insertion order: equal times are handled first-in, first-out
  worker_id worker;   ///< whom it happens to
  event_kind kind;    ///< what happens
};

/// Min-heap of events. O(log size) per push and pop; nothing allocated once warmed up.
class event_queue {
public:
  /// Room for n events, so a run of at most n pending events never allocates.
  void reserve(std::size_t n) { heap_.reserve(n); }
  /// True when no event is pending.
  bool empty() const noexcept { return heap_.empty(); }
  /// Events pending.
  std::size_t size() const noexcept { return heap_.size(); }
  /// The earliest pending event (the first pushed among equal times); the queue must not be
  /// empty.
  const event& top() const noexcept { return heap_.front(); }

  /// Schedules event k of worker w at time.
  void push(double time, worker_id w, event_kind k) {
    heap_.push_back(event{time, next_seq_++, w, k});
    std::size_t i = heap_.size() - 1;
    const event e = heap_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!less(e, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }

  /// Removes and returns top(); the queue must not be empty.
  event pop() {
    const event out = heap_.front();
    const event last = heap_.back();
    heap_.pop_back();
    const std::size_t n = heap_.size();
    if (n > 0) {
      std::size_t i = 0;
      while (true) {
        std::size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && less(heap_[child + 1], heap_[child])) ++child;
        if (!less(heap_[child], last)) break;
        heap_[i] = heap_[child];
        i = child;
      }
      heap_[i] = last;
    }
    return out;
  }

private:
  static bool less(const event& a, const event& b) noexcept {
    return a.time < b.time || (a.time == b.time && a.seq < b.seq);
  }

  std::vector<event> heap_;
  std::uint64_t next_seq_ = 0;
};

/// @}
}  // namespace cadence::sim
