// Push histories on disk, opt-in (not part of <cadence/cadence.hpp>): the ElasticBSP
// authors' "id:t1,t2,...," format (reader and writer) and their synthetic generator.
#pragma once

#include <cadence/io/generator.hpp>
#include <cadence/io/push_history.hpp>
