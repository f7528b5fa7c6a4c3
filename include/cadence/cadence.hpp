// Cadence: synchronization policies for distributed deep-learning training.
// The umbrella header: every CPU-side component. It includes no CUDA, Thrust, MPI or NCCL;
// the Thrust backend is opt-in through <cadence/thrust/zipline.hpp> and cadence::thrust.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/core/types.hpp>

#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/controller.hpp>
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>

#include <cadence/runtime/blocking_controller.hpp>

#include <cadence/io/generator.hpp>
#include <cadence/io/push_history.hpp>

#include <cadence/predict/any_predictor.hpp>
#include <cadence/predict/interval.hpp>
#include <cadence/predict/predictor.hpp>

#include <cadence/sim/metrics.hpp>
#include <cadence/sim/report.hpp>
#include <cadence/sim/scenarios.hpp>
#include <cadence/sim/simulator.hpp>

#include <cadence/zipline/brute_force.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/variant.hpp>
