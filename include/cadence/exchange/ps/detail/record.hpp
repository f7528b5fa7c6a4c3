// What a parameter server measures (ps_stats), kept in one place: the server says what
// happened; this keeps the counts, the logs (with keep_log) and, on server 0, how long parked
// pushes waited for their release and the staleness each release started with.
#pragma once

#include <cadence/core/types.hpp>
#include <cadence/exchange/ps/options.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence::exchange::detail {

class ps_record {
public:
  using clock = std::chrono::steady_clock;

  explicit ps_record(bool keep_log) : keep_log_(keep_log) {}

  const ps_stats& stats() const noexcept { return stats_; }

  // The per-worker tables hold `ids` worker ids.
  void grow(std::size_t ids) {
    stats_.pushes.resize(ids, 0);
    stats_.max_start_staleness.resize(ids, 0);
    stats_.parked_pushes.resize(ids, 0);
    stats_.parked_seconds.resize(ids, 0.0);
    parked_since_.resize(ids, not_parked);
  }

  void joined(worker_id w, int rank, bool returning) { stats_.joins.push_back({w, rank, returning}); }
  void refused() { ++stats_.refused; }
  void evicted(worker_id w, std::int64_t pushes, double silent, std::string reason, int rank) {
    stats_.evictions.push_back({w, pushes, silent, std::move(reason), rank});
  }
  // Why worker w was last dropped ("dropped" when nothing says).
  std::string eviction_reason(worker_id w) const {
    for (auto it = stats_.evictions.rbegin(); it != stats_.evictions.rend(); ++it)
      if (it->worker == w) return it->reason;
    return "dropped";
  }

  // Push `iteration` of worker w is applied to this server's slice.
  void applied(worker_id w, std::int64_t iteration) {
    ++stats_.pushes[static_cast<std::size_t>(w)];
    if (keep_log_) stats_.log.push_back({w, iteration});
  }

  // Server 0: the controller told worker w to wait, at `now` (after its update was applied).
  void parked(worker_id w, clock::time_point now) {
    const auto wi = static_cast<std::size_t>(w);
    ++stats_.parked;
    ++stats_.parked_pushes[wi];
    parked_since_[wi] = now;
  }

  // Server 0: worker w is released with staleness `gap`. A parked push adds the time it waited;
  // `now` is read once for a batch of releases, and only when a parked push goes.
  void released(worker_id w, clock_value gap, std::optional<clock::time_point>& now) {
    const auto wi = static_cast<std::size_t>(w);
    if (parked_since_[wi] != not_parked) {
      if (!now) now = clock::now();
      stats_.parked_seconds[wi] += std::chrono::duration<double>(*now - parked_since_[wi]).count();
      parked_since_[wi] = not_parked;
    }
    stats_.max_start_staleness[wi] = std::max(stats_.max_start_staleness[wi], gap);
    if (keep_log_) stats_.start_staleness.push_back(gap);
    if (stats_.staleness_histogram.empty()) stats_.staleness_histogram.assign(ps_histogram_top + 1, 0);
    ++stats_.staleness_histogram[std::min<std::size_t>(static_cast<std::size_t>(std::max<clock_value>(gap, 0)),
                                                       ps_histogram_top)];
  }

private:
  static constexpr clock::time_point not_parked = clock::time_point::min();

  bool keep_log_;
  ps_stats stats_;
  std::vector<clock::time_point> parked_since_;  // per worker id: its push parked since (server 0)
};

}  // namespace cadence::exchange::detail
