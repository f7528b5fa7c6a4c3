/// \file
/// \ingroup io
/// Push histories and iteration traces on disk, opt-in (not part of <cadence/cadence.hpp>): the
/// ElasticBSP authors' "id:t1,t2,...," format (reader and writer), their synthetic generator,
/// and the CSV iteration traces that cadence-train writes and cadence-sim --trace replays.
#pragma once

#include <cadence/io/generator.hpp>
#include <cadence/io/push_history.hpp>
#include <cadence/io/trace.hpp>
