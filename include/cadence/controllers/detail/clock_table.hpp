// Incremental bookkeeping of active workers' clocks: the minimum and maximum clock in O(1)
// amortised per push, the workers waiting at each clock, and (for policies that ask) the
// order in which workers reached each clock.
#pragma once

#include <cadence/core/detail/aligned_allocator.hpp>
#include <cadence/core/detail/bits.hpp>
#include <cadence/core/types.hpp>

#include <cstddef>
#include <vector>

namespace cadence::detail {

/// A ring of per-clock counts over the clock values [min, max] currently held by active
/// workers, each worker's clock, and a flat list of waiting workers with their clocks.
///
/// Laid out for 10^6 workers: a push by a random worker touches its own 8-byte clock and two
/// counts in the ring (a few cache lines for the whole cluster); releasing waiters reads the
/// flat waiter list front to back. Nothing is linked through other workers' state, so neither
/// costs a cache miss per neighbour.
///
/// Ordered tables (DSSP's, which needs "the slowest worker, ties to the oldest latest push")
/// also keep each bucket's workers in an intrusive doubly-linked list in the order they
/// reached it, each worker's links beside its clock in one 16-byte node; a push then also
/// touches its two neighbours' nodes.
///
/// Memory: 8 bytes per worker id for the clock (16 when ordered), 12 for the waiter list,
/// plus the ring. Nothing is allocated per push once the ring covers the largest clock gap
/// seen.
class clock_table {
public:
  static constexpr worker_id none = static_cast<worker_id>(-1);

  explicit clock_table(bool ordered = false) : ordered_(ordered) {}

  bool ordered() const noexcept { return ordered_; }
  bool empty() const noexcept { return active_ == 0; }
  std::size_t active() const noexcept { return active_; }
  clock_value min() const noexcept { return min_; }
  clock_value max() const noexcept { return max_; }
  clock_value clock(worker_id p) const noexcept {
    return ordered_ ? node_[p].clock : clock_[p];
  }
  /// Number of active workers whose clock is c.
  std::size_t count(clock_value c) const noexcept {
    return in_range(c) ? buckets_[slot(c)].count : 0;
  }
  /// Bytes held (capacities).
  std::size_t bytes_reserved() const noexcept {
    return buckets_.capacity() * sizeof(bucket) + clock_.capacity() * sizeof(clock_value) +
           node_.capacity() * sizeof(node) + wait_who_.capacity() * sizeof(worker_id) +
           wait_clock_.capacity() * sizeof(clock_value);
  }

  /// The smallest clock once p has advanced: it rises (by one) only when p alone held it.
  clock_value min_after_advance(worker_id p) const noexcept {
    return clock(p) == min_ && buckets_[slot(min_)].count == 1 ? min_ + 1 : min_;
  }
  /// Ordered tables only: the first worker to reach the smallest clock, once p has advanced
  /// (p leaves its bucket). Only for a p that is not alone at the smallest clock, so the
  /// smallest clock stays where it is.
  worker_id head_of_min_after_advance(worker_id p) const noexcept {
    const worker_id h = buckets_[slot(min_)].head;
    return h == p ? node_[p].next : h;
  }

  /// Starts loading worker p's clock (its node when ordered) into the cache; ids without
  /// room are ignored. An ordered table also loads, for the worker hinted `lag` calls ago
  /// (its node is in the cache by now), its two neighbours' nodes, which its push unlinks
  /// from: so hints pay off fully from `lag` pushes ahead. Like push, not safe to call
  /// concurrently with any other member.
  void prefetch(worker_id p) const noexcept {
    if (p >= ids_) return;
    if (!ordered_) {
      prefetch_for_write(&clock_[p]);
      return;
    }
    prefetch_for_write(&node_[p]);
    const worker_id q = hinted_[hinted_next_];
    hinted_[hinted_next_] = p;
    hinted_next_ = (hinted_next_ + 1) % lag;
    if (q >= ids_) return;
    const node& x = node_[q];
    if (x.prev != none) prefetch_for_write(&node_[x.prev]);
    if (x.next != none) prefetch_for_write(&node_[x.next]);
  }

  /// Grows the ring so that advance(p) cannot allocate, hence cannot throw: callers reserve
  /// first, then change their own state. Growing keeps every bucket, so it changes nothing
  /// observable if the caller then throws.
  void reserve_advance(worker_id p) {
    const clock_value c = clock(p);
    if (c + 1 > max_) ensure_ring(static_cast<std::size_t>(c + 1 - min_) + 1);
  }
  /// Makes room so that insert_front(p, c) cannot throw.
  void reserve_insert(worker_id p) {
    reserve_workers(std::size_t{p} + 1);
    ensure_ring(1);
  }

  /// Makes room for worker ids below `capacity` (their clocks, links and waiter entries:
  /// each id waits at most once at a time, so the waiter list never outgrows the ids).
  void reserve_workers(std::size_t capacity) {
    if (ids_ >= capacity) return;
    grow(wait_who_, capacity);
    grow(wait_clock_, capacity);
    if (ordered_) node_.resize(capacity); else clock_.resize(capacity);
    ids_ = capacity;
  }

  /// Inserts worker p at clock c, at the front of its bucket (it has not pushed at c).
  /// c must be min() when the table is not empty.
  void insert_front(worker_id p, clock_value c) {
    reserve_workers(std::size_t{p} + 1);
    if (active_ == 0) {
      min_ = max_ = c;
      ensure_ring(1);
    }
    bucket& b = buckets_[slot(c)];
    if (ordered_) {
      node& x = node_[p];
      x.clock = c;
      x.prev = none;
      x.next = b.head;
      if (b.head != none) node_[b.head].prev = p; else b.tail = p;
      b.head = p;
    } else {
      clock_[p] = c;
    }
    ++b.count;
    ++active_;
  }

  /// Moves p from its clock c to c + 1 (at the back of the new bucket when ordered). Call
  /// reserve_advance(p) first (after any other change to the table), so that this cannot
  /// allocate or throw.
  void advance(worker_id p) noexcept {
    const clock_value c = clock(p);
    if (c + 1 > max_) max_ = c + 1;
    --buckets_[slot(c)].count;
    bucket& b = buckets_[slot(c + 1)];
    if (ordered_) {
      unlink(p, c);
      node& x = node_[p];
      x.clock = c + 1;
      x.prev = b.tail;
      x.next = none;
      if (b.tail != none) node_[b.tail].next = p; else b.head = p;
      b.tail = p;
    } else {
      clock_[p] = c + 1;
    }
    ++b.count;
    if (c == min_) settle_min();
  }

  /// Removes p from the table. A waiter entry p may have stays; the caller's release
  /// callback drops it (p no longer waits).
  void erase(worker_id p) noexcept {
    const clock_value c = clock(p);
    if (ordered_) unlink(p, c);
    --buckets_[slot(c)].count;
    --active_;
    if (active_ == 0) {
      max_ = min_ = c;
      buckets_[slot(c)].waiters = 0;
      return;
    }
    if (c == min_) settle_min();
    if (c == max_) settle_max();
  }

  /// Records that p waits at its current clock. Room is reserved with the ids, so this
  /// cannot allocate or throw.
  void add_waiter(worker_id p) noexcept {
    const clock_value c = clock(p);
    // The list grows at one end; with 10^6 workers it is megabytes, so each new cache line
    // would be a store miss that stalls the pushes behind it. Load the lines 32 entries on.
    const std::size_t k = wait_who_.size() + 32;
    if (k < wait_who_.capacity()) {
      prefetch_for_write(wait_who_.data() + k);
      prefetch_for_write(wait_clock_.data() + k);
    }
    wait_who_.push_back(p);
    wait_clock_.push_back(c);
    ++buckets_[slot(c)].waiters;
  }

  /// Visits the waiter entries at clocks lo..hi, clock by clock and in the order they were
  /// added within a clock, calling release(q) for each (it returns nothing; it decides
  /// whether q still waits), and drops them from the list, with the entries below the
  /// smallest clock (removed workers'). Other entries keep their order. lo..hi must lie in
  /// [min(), max()]. Each clock with waiters costs one pass over the list, so a waiter is
  /// passed over at most once per clock between the smallest and its own: O(1) per wait
  /// under SSP (every waiter waits at c_min + s + 1), O(s_U - s_L) under DSSP.
  template <class Release>
  void release_waiters(clock_value lo, clock_value hi, Release&& release) noexcept {
    for (clock_value c = lo; c <= hi && !wait_who_.empty(); ++c) {
      bucket& b = buckets_[slot(c)];
      if (b.waiters == 0) continue;
      b.waiters = 0;
      std::size_t kept = 0;
      const std::size_t n = wait_who_.size();
      for (std::size_t i = 0; i < n; ++i) {
        const clock_value wc = wait_clock_[i];
        const worker_id q = wait_who_[i];
        if (wc == c) {
          release(q);
        } else if (wc >= min_) {
          wait_who_[kept] = q;
          wait_clock_[kept] = wc;
          ++kept;
        }
      }
      wait_who_.resize(kept);
      wait_clock_.resize(kept);
    }
  }

private:
  struct bucket {
    std::size_t count = 0;
    std::size_t waiters = 0;  // waiter entries at this clock (removed workers' included)
    worker_id head = none;    // ordered tables only
    worker_id tail = none;
  };
  // An ordered table's per-worker node: the clock and the links in its bucket's list, in one
  // 16-byte node so that a push touches one cache line of its own, not two.
  struct node {
    clock_value clock = 0;
    worker_id prev = none;
    worker_id next = none;
  };
  static_assert(sizeof(node) == 16, "cadence::detail::clock_table: a node must stay 16 bytes");

  template <class T, class A>
  static void grow(std::vector<T, A>& v, std::size_t n) {
    if (v.capacity() < n) v.reserve(n > 2 * v.capacity() ? n : 2 * v.capacity());
  }

  bool in_range(clock_value c) const noexcept { return active_ && c >= min_ && c <= max_; }
  std::size_t slot(clock_value c) const noexcept {
    return static_cast<std::size_t>(c) & (buckets_.size() - 1);
  }

  void unlink(worker_id p, clock_value c) noexcept {
    node& x = node_[p];
    bucket& b = buckets_[slot(c)];
    if (x.prev != none) node_[x.prev].next = x.next; else b.head = x.next;
    if (x.next != none) node_[x.next].prev = x.prev; else b.tail = x.prev;
    x.prev = x.next = none;
  }

  // A bucket leaving [min_, max_] forgets its waiter count: its entries (removed workers')
  // no longer match any clock in range, and the next pass over the list drops them.
  void settle_min() noexcept {
    while (min_ < max_ && buckets_[slot(min_)].count == 0) buckets_[slot(min_++)].waiters = 0;
  }
  void settle_max() noexcept {
    while (max_ > min_ && buckets_[slot(max_)].count == 0) buckets_[slot(max_--)].waiters = 0;
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

  bool ordered_;
  // The ordered table's last `lag` hinted workers, for the second stage of prefetch().
  static constexpr std::size_t lag = 8;
  mutable worker_id hinted_[lag] = {none, none, none, none, none, none, none, none};
  mutable std::size_t hinted_next_ = 0;
  std::vector<bucket> buckets_;
  std::size_t ids_ = 0;              // worker ids with room: clock_ or node_ holds them
  std::vector<clock_value, aligned_allocator<clock_value>> clock_;  // unordered tables
  std::vector<node, aligned_allocator<node>> node_;  // ordered tables: clock and links
  std::vector<worker_id> wait_who_;  // waiting workers (and removed ones not dropped yet)...
  std::vector<clock_value> wait_clock_;  // ...and the clock each waits at
  std::size_t active_ = 0;
  clock_value min_ = 0, max_ = 0;
};

}  // namespace cadence::detail
