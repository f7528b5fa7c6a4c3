// The benchmarks' raw gloo baseline (cadence-bench-transport, -exchange): gloo's own ring
// all-reduce (gloo/allreduce.h) on a communicator's gloo context. Not part of the library.
#pragma once

#include <gloo/allreduce.h>
#include <gloo/math.h>

#include <chrono>
#include <cstddef>

namespace cadence_bench {

/// Sums n floats at b over every rank of comm (a cadence gloo_communicator) with
/// gloo::allreduce on comm's context, tag 1 (the communicator's own traffic uses others).
template <class Comm>
void raw_gloo_allreduce(Comm& comm, float* b, std::size_t n) {
  ::gloo::AllreduceOptions opts(comm.context());
  opts.setOutput(b, n);
  opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&::gloo::sum<float>));
  opts.setTag(1);
  opts.setTimeout(std::chrono::seconds(60));
  ::gloo::allreduce(opts);
}

}  // namespace cadence_bench
