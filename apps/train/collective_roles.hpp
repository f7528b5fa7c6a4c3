// cadence-train's roles under a collective mode (periodic:k, elastic-avg:R, diloco:<config>):
// work_collective, a worker's local steps merged by the adapter over an all-reduce among the
// workers, and observe, rank 0 keeping worker 0's merged weights for the curve. The parameter
// server's roles and what both kinds share are in roles.hpp.
#pragma once

#include "roles.hpp"

#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/exchange/local_sgd/diloco.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/sim/collective.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cadence::train {

// ---- work_collective, observe ----

// Collective modes, on a worker rank: local SGD steps stretched to the profile, merged by the
// adapter over an all-reduce among the workers only. Every merge also all-reduces a stop vote,
// so all ranks leave after the same merge (the first one after any rank passed the run's end).
// Worker 0 keeps the merged weights at each --eval-every and sends them to rank 0.
template <class Job>
worker_summary work_collective(Job& job, std::size_t index, const train_options& o, const std::string& policy,
                               any_model& model, const train::dataset& shard, const cadence::sim::scenario& prof,
                               std::vector<train::exchange_timing>& timings, std::uint64_t& counted) {
  using comm_type = typename Job::comm_type;
  auto connection = job.connect_workers(index);
  worker_summary sum;
  {
    comm_type& comm = *connection;
    const auto id = static_cast<std::size_t>(comm.rank());
    const std::size_t params = model.parameter_count();
    const float lr = static_cast<float>(o.lr * static_cast<double>(comm.size()));
    const std::string mode = is_diloco_mode(policy) ? policy : collective_mode(policy);
    std::optional<cadence::exchange::periodic_averager<comm_type>> periodic;
    std::optional<cadence::exchange::elastic_averager<comm_type>> elastic;
    std::optional<cadence::exchange::diloco<comm_type>> dl;
    cadence::sim::iteration_sampler sampler(prof.workers[id], cadence::sim::mix_seed(o.seed, id));
    train::detail::shard_walk walk(0, static_cast<std::uint32_t>(shard.size()), o.batch,
                                   cadence::sim::mix_seed(o.seed + 1, id));
    std::vector<float> w(params), g(params), stop(1);
    model.initialize(w, o.seed);
    if (is_diloco_mode(policy)) {  // DiLoCo: rank 0 of the workers broadcasts its weights
      const auto c = cadence::exchange::parse_diloco_config(std::string_view(policy).substr(7));
      dl.emplace(comm, std::initializer_list<cadence::exchange::tensor_ref>{w},
                 cadence::exchange::make_outer_optimizer(c.outer), c.options);
    } else if (mode.rfind("periodic:", 0) == 0) {
      periodic.emplace(comm, static_cast<std::size_t>(std::stoull(mode.substr(9))));
    } else {
      elastic.emplace(comm, mode);
    }
    std::uint64_t merges = 0;
    std::vector<float> merged = w;  // the model of the last merge
    std::vector<double> snap_times;
    std::vector<float> snaps;
    auto snapshot_until = [&](double t) {
      for (;;) {
        const double next = static_cast<double>(snap_times.size()) * o.eval_every;
        if (next > t || next > o.seconds + 1e-9) return;
        snap_times.push_back(next);
        snaps.insert(snaps.end(), merged.begin(), merged.end());
      }
    };
    timings.clear();
    counted = 0;
    std::int64_t local = 0;
    cadence::transport::barrier(job.world(), train::connect_timeout);
    const auto start = clock_type::now();
    for (;;) {
      const auto t0 = clock_type::now();
      const double at = std::chrono::duration<double>(t0 - start).count();
      const double d = sampler.next(at);
      model.gradient(w, shard, walk.next(), g);
      const auto until = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(d));
      if (clock_type::now() > until) sum.overruns += 1;
      std::this_thread::sleep_until(until);
      // DiLoCo's inner optimizer is the same SGD, at the same rate, as the averagers' steps.
      for (std::size_t k = 0; k < params; ++k) w[k] -= lr * g[k];
      sum.iterations += 1;
      ++local;
      const bool due = periodic ? periodic->step_done()
                       : elastic ? elastic->step_done(clock_type::now() - t0)
                                 : dl->step_done(clock_type::now() - t0);
      if (!due) continue;
      const auto s0 = clock_type::now();
      const double s_at = std::chrono::duration<double>(s0 - start).count();
      stop[0] = s_at >= o.seconds ? 1.0f : 0.0f;
      ++merges;
      if (periodic) {
        periodic->sync(w, stop);
      } else if (elastic) {
        elastic->sync(w, stop);
      } else {
        // Every rank syncs at the same points (the plan is collective), so the stop vote follows.
        dl->sync(w);
        comm.allreduce(stop.data(), 1, cadence::transport::dtype::f32, cadence::transport::reduce_op::max,
                       cadence::transport::deadline(train::connect_timeout));
        if (stop[0] > 0) dl->finish({w});
      }
      const double end = since(start);
      timings.push_back({s_at, since(s0)});
      sum.max_local_steps = std::max(sum.max_local_steps, static_cast<double>(local));
      if (end <= o.seconds) counted += static_cast<std::uint64_t>(local);
      local = 0;
      if (id == 0) {
        snapshot_until(end);
        if (dl)
          merged.assign(dl->global_weights().begin(), dl->global_weights().end());
        else
          merged = w;
      }
      if (stop[0] > 0) break;
    }
    // What this worker sent in merges (DiLoCo: counted by the adapter; the averagers: a ring
    // all-reduce of the weights per merge, 2 (n - 1) / n of them), for docs/local-sgd.md.
    const std::uint64_t sent =
        dl ? dl->bytes_sent()
           : merges * cadence::exchange::detail::ring_bytes(params * sizeof(float), static_cast<std::size_t>(comm.size()));
    std::fprintf(stderr, "cadence-train: %s: worker %zu sent %llu bytes in %llu merges, %.0f inner steps\n",
                 policy.c_str(), id, static_cast<unsigned long long>(sent), static_cast<unsigned long long>(merges),
                 sum.iterations);
    if (id == 0) {
      snapshot_until(o.seconds);
      // The curve and the final model go to rank 0, which has the test set.
      auto& world = job.world();
      const cadence::transport::deadline d(train::connect_timeout);
      const std::uint64_t n = snap_times.size();
      world.send(&n, sizeof n, 0, tag_collect, d);
      if (n != 0) {
        world.send(snap_times.data(), n * sizeof(double), 0, tag_collect, d);
        world.send(snaps.data(), snaps.size() * sizeof(float), 0, tag_collect, d);
      }
      world.send(merged.data(), params * sizeof(float), 0, tag_collect, d);
    }
  }
  job.disconnect_workers(connection);
  sum.timings = static_cast<double>(timings.size());
  return sum;
}

// Collective modes, on rank 0: no server; it receives worker 0's snapshots and measures them.
template <class Job>
train::policy_report observe_collective(Job& job, std::size_t index, const train_options& o, const std::string& policy,
                                        any_model& model, const train::dataset& test, std::size_t workers) {
  auto none = job.connect_workers(index);  // collective under MPI; rank 0 takes no part
  auto& world = job.world();
  cadence::transport::barrier(world, train::connect_timeout);
  if (isatty(2) == 0) std::fprintf(stderr, "cadence-train: %s: running over all-reduce among the workers\n", policy.c_str());
  const std::size_t params = model.parameter_count();
  // Worker 0 (rank 1) sends when the run ends: wait as long as the run, and then some.
  const cadence::transport::deadline d(std::chrono::duration<double>(o.seconds) + train::connect_timeout);
  std::uint64_t n = 0;
  world.recv(&n, sizeof n, 1, tag_collect, d);
  std::vector<double> times(static_cast<std::size_t>(n));
  std::vector<float> snaps(static_cast<std::size_t>(n) * params), final_w(params);
  if (n != 0) {
    world.recv(times.data(), times.size() * sizeof(double), 1, tag_collect, d);
    world.recv(snaps.data(), snaps.size() * sizeof(float), 1, tag_collect, d);
  }
  world.recv(final_w.data(), params * sizeof(float), 1, tag_collect, d);
  job.disconnect_workers(none);
  train::policy_report r;
  r.policy = policy;
  r.transport = std::string(job.name()) + "-allreduce";
  r.workers = workers;
  r.seconds = o.seconds;
  for (std::size_t k = 0; k < times.size(); ++k) {
    const auto e = model.evaluate(cadence::span<const float>(snaps.data() + k * params, params), test, o.test_limit);
    r.curve.push_back({times[k], e.accuracy});
    r.best_accuracy = std::max(r.best_accuracy, e.accuracy);
  }
  r.final_accuracy = model.evaluate(final_w, test, 0).accuracy;
  r.time_to_70 = train::time_to(r.curve, 0.70);
  r.time_to_80 = train::time_to(r.curve, 0.80);
  return r;
}

}  // namespace cadence::train
