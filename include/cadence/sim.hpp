/// \file
/// \ingroup sim
/// The cluster simulator, opt-in (not part of <cadence/cadence.hpp>): scenarios, the
/// discrete-event simulator that drives the real controllers, its metrics and reports.
#pragma once

#include <cadence/sim/collective.hpp>
#include <cadence/sim/event_queue.hpp>
#include <cadence/sim/metrics.hpp>
#include <cadence/sim/random.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenario.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>
#include <cadence/sim/trace_replay.hpp>
#include <cadence/sim/worker_model.hpp>
