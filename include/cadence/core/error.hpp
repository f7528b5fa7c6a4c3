/// \file
/// \ingroup core
/// Cadence's exception hierarchy: every error the library throws derives from cadence::error,
/// and each message carries the context a user needs to act (worker, clock, bound, file:line).
#pragma once

#include <stdexcept>
#include <string>

namespace cadence {
/// \addtogroup core
/// @{

/// Base of every exception Cadence throws.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A parameter is out of range (negative staleness, s_U < s_L, lookahead 0, ...).
class invalid_parameter_error : public error {
public:
  using error::error;
};

/// A worker id that is unknown, already removed, or used against the protocol
/// (for example a push from a worker that is still waiting to be released).
class worker_error : public error {
public:
  using error::error;
};

/// A timestamp that is NaN, infinite, or earlier than one already seen.
class time_error : public error {
public:
  using error::error;
};

/// Malformed text: a policy config string, a push-history file, a command-line value.
class parse_error : public error {
public:
  using error::error;
};

/// Input to a ZipLine search that violates its contract (empty row, unsorted row, n = 0, ...).
class zipline_input_error : public error {
public:
  using error::error;
};

/// A blocking wait ran past its deadline; the message names whom it waited for.
class timeout_error : public error {
public:
  using error::error;
};

/// Every active worker waits: no push can ever release them. Always a bug; never silent.
class deadlock_error : public error {
public:
  using error::error;
};

/// A failure reported by a device backend (CUDA); the message holds the backend's error name.
class device_error : public error {
public:
  using error::error;
};

/// A communication call failed: its deadline passed, a peer was lost, the ranks' arguments
/// disagreed, or the communicator had failed or been aborted before. The message names the
/// operation, its sequence number on the communicator, this rank and the peer(s) waited for.
class transport_error : public error {
public:
  using error::error;
};

/// A point-to-point call failed because of one peer alone (it sent a message of another size
/// than the receive, or one this rank refused), on a backend that isolates such faults: the
/// communicator stays usable and peer() names the rank, so a server can drop that one worker.
class peer_error : public transport_error {
public:
  /// `what` as every transport error words it; `peer` the rank at fault.
  peer_error(const std::string& what, int peer) : transport_error(what), peer_(peer) {}
  /// The rank whose message failed the call.
  int peer() const noexcept { return peer_; }

private:
  int peer_;
};

/// @}
}  // namespace cadence
