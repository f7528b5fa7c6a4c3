/// \file
/// \ingroup exchange
/// The parameter-exchange adapter: a parameter server and its workers over any communicator,
/// so BSP, ASP, SSP, DSSP and ElasticBSP govern real processes through one controller. A worker
/// that dies, stops or loses its link at any moment costs the job that worker only; workers can
/// join a running job and evicted ones can come back under a new id.
///
/// The header to include. Its parts, one file each under `exchange/ps/`:
/// - `ps/options.hpp`: the slices of the model, the update rule (sgd), ps_options, and what a
///   server reports (ps_event, ps_stats).
/// - `ps/worker.hpp`: ps_worker, the worker's end.
/// - `ps/server.hpp`: parameter_server, the server's end.
/// - `ps/detail/`: the wire protocol both ends speak, and the server's machinery (its
///   per-worker tables, its transfers in flight, the versions of its slice).
///
/// Guide: `docs/parameter_server.md`.
#pragma once

#include <cadence/exchange/ps/options.hpp>
#include <cadence/exchange/ps/server.hpp>
#include <cadence/exchange/ps/worker.hpp>
