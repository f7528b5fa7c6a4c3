/// \file
/// \ingroup core
/// Cadence: synchronization policies for distributed deep-learning training.
/// The umbrella header: what a trainer needs (controllers, the blocking runtime, predictors,
/// ZipLine). It includes no CUDA, Thrust, MPI or NCCL. Opt-in: <cadence/sim.hpp> (the cluster
/// simulator), <cadence/io.hpp> (push-history files), <cadence/thrust/zipline.hpp>
/// (cadence::thrust).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/core/types.hpp>
#include <cadence/version.hpp>

#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/controller.hpp>
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>

#include <cadence/runtime/blocking_controller.hpp>

#include <cadence/predict/any_predictor.hpp>
#include <cadence/predict/interval.hpp>
#include <cadence/predict/predictor.hpp>

#include <cadence/zipline/brute_force.hpp>
#include <cadence/zipline/result.hpp>
#include <cadence/zipline/rows.hpp>
#include <cadence/zipline/variant.hpp>
