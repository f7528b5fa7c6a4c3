// Incremental bookkeeping of active workers' clocks: the minimum and maximum clock in O(1)
// amortised per push, and, per clock value, its workers in the order they reached it.
#pragma once

#include <cadence/core/types.hpp>

#include <cstddef>
#include <vector>

namespace cadence::detail {

/// A ring of buckets over the clock values [min, max] currently held by active workers.
/// Each bucket keeps an intrusive doubly-linked list of its workers: appended when a worker
/// pushes into the bucket, so the head is the worker whose latest push is the oldest.
/// Memory is O(workers + (max - min)); nothing is allocated per push once the ring covers
/// the largest clock gap seen.
class clock_table {
public:
  static constexpr worker_id none = static_cast<worker_id>(-1);

  bool empty() const noexcept { return active_ == 0; }
  std::size_t active() const noexcept { return active_; }
  clock_value min() const noexcept { return min_; }
  clock_value max() const noexcept { return max_; }
  clock_value clock(worker_id p) const noexcept { return node_[p].clock; }
  /// Number of active workers whose clock is c.
  std::size_t count(clock_value c) const noexcept {
    return in_range(c) ? buckets_[slot(c)].count : 0;
  }
  /// First worker at clock c (the one that reached it earliest), or none.
  worker_id head(clock_value c) const noexcept {
    return in_range(c) ? buckets_[slot(c)].head : none;
  }
  worker_id next(worker_id p) const noexcept { return node_[p].next; }
  /// Bytes held (capacities): 16 per worker id plus the bucket ring.
  std::size_t bytes_reserved() const noexcept {
    return buckets_.capacity() * sizeof(bucket) + node_.capacity() * sizeof(node);
  }

  /// The smallest clock once p has advanced: it rises (by one) only when p alone held it.
  clock_value min_after_advance(worker_id p) const noexcept {
    return node_[p].clock == min_ && buckets_[slot(min_)].count == 1 ? min_ + 1 : min_;
  }
  /// First worker at the smallest clock once p has advanced (p leaves its bucket). Only for a
  /// p that is not alone at the smallest clock, so the smallest clock stays where it is.
  worker_id head_of_min_after_advance(worker_id p) const noexcept {
    const worker_id h = buckets_[slot(min_)].head;
    return h == p ? node_[p].next : h;
  }

  /// Grows the ring so that advance(p) cannot allocate, hence cannot throw: callers reserve
  /// first, then change their own state. Growing keeps every bucket, so it changes nothing
  /// observable if the caller then throws.
  void reserve_advance(worker_id p) {
    const clock_value c = node_[p].clock;
    if (c + 1 > max_) ensure_ring(static_cast<std::size_t>(c + 1 - min_) + 1);
  }
  /// Makes room so that insert_front(p, c) cannot throw.
  void reserve_insert(worker_id p) {
    reserve_workers(std::size_t{p} + 1);
    ensure_ring(1);
  }

  /// Makes room for worker ids below `capacity`.
  void reserve_workers(std::size_t capacity) {
    if (node_.size() < capacity) node_.resize(capacity);
  }

  /// Inserts worker p at clock c, at the front of its bucket (it has not pushed at c).
  /// c must be min() when the table is not empty.
  void insert_front(worker_id p, clock_value c) {
    reserve_workers(std::size_t{p} + 1);
    if (active_ == 0) {
      min_ = max_ = c;
      ensure_ring(1);
    }
    node& x = node_[p];
    x.clock = c;
    bucket& b = buckets_[slot(c)];
    x.prev = none;
    x.next = b.head;
    if (b.head != none) node_[b.head].prev = p; else b.tail = p;
    b.head = p;
    ++b.count;
    ++active_;
  }

  /// Moves p from its clock c to c + 1, at the back of the new bucket. Call reserve_advance(p)
  /// first (after any other change to the table), so that this cannot allocate or throw.
  void advance(worker_id p) noexcept {
    node& x = node_[p];
    const clock_value c = x.clock;
    if (c + 1 > max_) max_ = c + 1;
    unlink(p);
    x.clock = c + 1;
    bucket& b = buckets_[slot(c + 1)];
    x.prev = b.tail;
    x.next = none;
    if (b.tail != none) node_[b.tail].next = p; else b.head = p;
    b.tail = p;
    ++b.count;
    if (c == min_) settle_min();
  }

  /// Removes p from the table.
  void erase(worker_id p) noexcept {
    const clock_value c = node_[p].clock;
    unlink(p);
    --active_;
    if (active_ == 0) {
      max_ = min_ = c;
      return;
    }
    if (c == min_) settle_min();
    if (c == max_) settle_max();
  }

private:
  struct bucket {
    std::size_t count = 0;
    worker_id head = none;
    worker_id tail = none;
  };

  bool in_range(clock_value c) const noexcept { return active_ && c >= min_ && c <= max_; }
  std::size_t slot(clock_value c) const noexcept {
    return static_cast<std::size_t>(c) & (buckets_.size() - 1);
  }

  void unlink(worker_id p) noexcept {
    node& x = node_[p];
    bucket& b = buckets_[slot(x.clock)];
    if (x.prev != none) node_[x.prev].next = x.next; else b.head = x.next;
    if (x.next != none) node_[x.next].prev = x.prev; else b.tail = x.prev;
    x.prev = x.next = none;
    --b.count;
  }

  void settle_min() noexcept {
    while (min_ < max_ && buckets_[slot(min_)].count == 0) ++min_;
  }
  void settle_max() noexcept {
    while (max_ > min_ && buckets_[slot(max_)].count == 0) --max_;
  }

  // Grows the ring (a power of two) to hold `span` consecutive clock values from min_.
  void ensure_ring(std::size_t span) {
    if (span <= buckets_.size()) return;
    std::size_t size = buckets_.empty() ? 16 : buckets_.size();
    while (size < span) size *= 2;
    std::vector<bucket> grown(size);
    if (active_ > 0) {
      for (clock_value c = min_; c <= max_; ++c)
        grown[static_cast<std::size_t>(c) & (size - 1)] = buckets_[slot(c)];
    }
    buckets_.swap(grown);
  }

  // One 16-byte node per worker id (its clock and its links in its bucket's list), so a push
  // touches one cache line of its own at 10^6 workers, not three.
  struct node {
    clock_value clock = 0;
    worker_id prev = none;
    worker_id next = none;
  };
  static_assert(sizeof(node) == 16, "cadence::detail::clock_table: a node must stay 16 bytes");

  std::vector<bucket> buckets_;
  std::vector<node> node_;
  std::size_t active_ = 0;
  clock_value min_ = 0, max_ = 0;
};

}  // namespace cadence::detail
