/// \file
/// \ingroup core
/// Vocabulary types shared by every controller: worker ids, clocks, timestamps, and the
/// decision a controller returns after each event.
#pragma once

#include <cadence/core/span.hpp>

#include <cstdint>
#include <limits>

namespace cadence {
/// \addtogroup core
/// @{

/// Dense worker id: a controller built for n workers issues ids 0..n-1, add_worker() the next.
using worker_id = std::uint32_t;

/// A worker's clock: the number of pushes it has made (a joiner starts at the slowest clock).
using clock_value = std::int64_t;

/// A push timestamp supplied by the caller, in any unit (seconds by convention). Controllers
/// never read a clock, so every decision is reproducible from a recorded trace.
using timestamp = double;

/// A staleness bound that never binds (ASP is SSP with this bound).
inline constexpr clock_value unbounded_staleness = std::numeric_limits<clock_value>::max();

/// What a controller decided in answer to one event.
struct decision {
  /// The pushing worker may start its next iteration now (false: it waits to be released).
  bool proceed = false;
  /// Workers that were waiting and are released by this event, in release order. The view
  /// points into the controller and stays valid until its next non-const call.
  span<const worker_id> released;
};

/// @}
}  // namespace cadence
