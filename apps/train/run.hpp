// cadence-train's run on one rank, phase by phase: the ranks introduce themselves, then each
// policy in turn (its roles, rank 0 gathering every worker's record, the verdict whether to go
// on, rank 0 adding the measured and simulated figures), then rank 0's report.
//
//   ---- before the first policy ----   introduce_ranks
//   ---- each policy ----               run_policy, gather_records, share_verdict,
//                                       add_measurements, add_simulated
//   ---- the whole run ----             run
#pragma once

#include "report.hpp"
#include "collective_roles.hpp"
#include "roles.hpp"
#include "trace.hpp"

#include <cadence/io/trace.hpp>
#include <cadence/sim/collective.hpp>
#include <cadence/sim/simulator.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace cadence::train {

// ---- before the first policy ----

// Every rank's pid to rank 0, which says who is who (to stop a worker by hand: see
// docs/train.md) and what the run is; makes the job's control communicator meanwhile. Over
// zmq (a start-up that survives a lost worker) rank 0 waits at most --start-timeout for the
// workers and returns the ranks that did not introduce themselves (lost or absent; their pid
// shows as 0): each policy starts without them. Elsewhere every rank must come.
template <class Job>
std::vector<int> introduce_ranks(Job& job, const train_options& o, const any_model& model, std::size_t n_train,
                                 std::size_t workers) {
  const int size = job.size();
  std::vector<int> absent;
  std::vector<std::vector<double>> pids;
  const std::vector<double> mine{static_cast<double>(getpid())};
  if constexpr (Job::joinable) {
    start_line(job, "introduce");
    // One word each, on a tag of its own: a worker that introduces itself too late leaves its
    // message unread there, never in the way of the records gathered after a policy.
    auto& world = job.world();
    pids.resize(static_cast<std::size_t>(size));
    pids[0] = mine;
    if (job.rank() != 0) {
      world.send(mine.data(), sizeof(double), 0, tag_introduce, transport::deadline(job.step_timeout()));
    } else {
      const transport::deadline d(job.start_timeout());  // one for all (a passed one polls once)
      for (int r = 1; r < size; ++r) {
        double pid = 0;
        try {
          if (world.try_recv(&pid, sizeof pid, r, tag_introduce, d)) {
            pids[static_cast<std::size_t>(r)] = {pid};
            continue;
          }
        } catch (const transport_error&) {
          if (world.failed()) throw;
        }
        absent.push_back(r);  // lost, or silent past the deadline
      }
    }
    auto& control = job.control();  // zmq: waits only for this rank's registration
    if (job.rank() == 0) {
      // The workers register at the control communicator now; rank 0 answers them here.
      for (const int r : job.await_registrations(control, absent))
        if (std::find(absent.begin(), absent.end(), r) == absent.end()) absent.push_back(r);
      std::sort(absent.begin(), absent.end());
    }
    std::string found;
    for (const int r : absent) found += (found.empty() ? "absent: rank " : ", rank ") + std::to_string(r);
    start_line(job, "introduce", found.empty() ? "done" : "done; " + found);
  } else {
    pids = train::gather_to_root(job.world(), mine, tag_collect, train::connect_timeout);
    (void)job.control();  // made now, while every rank is there
  }
  if (job.rank() != 0) return absent;
  std::string list;
  for (int r = 0; r < size; ++r) {
    const auto& p = pids[static_cast<std::size_t>(r)];
    list += (r ? " " : "") + std::to_string(p.empty() ? 0LL : static_cast<long long>(p[0]));
  }
  std::fprintf(stderr,
               "cadence-train: %s on Fashion-MNIST (%zu training images in %zu shards, batch %zu, lr %g); profile "
               "%s, %g s per policy, seed %llu\ncadence-train: rank pids: %s (rank 0 serves; rank r is worker r-1)\n",
               model.describe().c_str(), n_train, workers, o.batch, o.lr, o.profile.c_str(), o.seconds,
               static_cast<unsigned long long>(o.seed), list.c_str());
  for (const int r : absent)
    std::fprintf(stderr,
                 "cadence-train: rank %d did not introduce itself within --start-timeout %g s (lost or absent): its "
                 "worker is dropped as each policy starts, and the run ends after the first policy\n",
                 r, o.start_timeout);
  return absent;
}

// ---- each policy ----

// What one rank measured under one policy: rank 0 the report, a worker its summary, its
// push_pull timings and (collective modes) the iterations it counted within the run.
struct policy_part {
  train::policy_report report;
  worker_summary summary;
  std::vector<train::exchange_timing> timings;
  std::uint64_t counted = 0;
};

template <class Job>
policy_part run_policy(Job& job, std::size_t k, const train_options& o, any_model& model, const rank_data& data,
                       const cadence::sim::scenario& prof, std::size_t workers, push_log& log,
                       const std::vector<int>& absent = {}) {
  const std::string& policy = o.policies[k];
  const bool collective = is_collective_run(policy);
  policy_part part;
  if (job.rank() == 0)
    part.report = collective ? observe_collective(job, k, o, policy, model, data.test, workers)
                             : serve(job, o, policy, k, model, data.test, workers, log, absent);
  else
    part.summary = collective ? work_collective(job, k, o, policy, model, data.shard, prof, part.timings, part.counted)
                              : work(job, k, o, model, data.shard, prof, part.timings, log);
  return part;
}

// Rank 0 collects every worker's count, summary and push_pull timings, as one record:
// [counted, summary (summary_words, in worker_summary's order), then (start, seconds) per
// push_pull]. On rank 0 the records by rank, with `gone` set to the evicted workers' ranks that
// sent nothing in time.
template <class Job>
std::vector<std::vector<double>> gather_records(Job& job, const policy_part& part, std::vector<int>& gone) {
  const worker_summary& mine = part.summary;
  std::vector<double> record{static_cast<double>(part.counted), mine.iterations, mine.overruns, mine.evicted,
                             mine.timings, mine.max_local_steps, mine.id};
  for (const auto& t : part.timings) {
    record.push_back(t.start);
    record.push_back(t.seconds);
  }
  std::vector<int> may_be_gone;
  for (const int e : part.report.evicted) may_be_gone.push_back(e + 1);  // rank 0 only: its report
  return train::gather_to_root(job.world(), record, tag_collect, train::connect_timeout, may_be_gone, gone_grace,
                               gone);
}

// Rank 0 tells every worker still there whether to go on (no worker is gone); each worker
// learns it. Returns the verdict on every rank. Over a communicator that isolates a lost peer
// (zmq), a worker found lost now (killed after it sent its record) joins `gone` and the
// verdict on rank 0 becomes stop; the workers told to go on before are then left waiting for
// the next policy's rendezvous until train::connect_timeout (so a kill in this short window
// after a policy, with policies left, costs the survivors that long; never the server).
template <class Job>
bool share_verdict(Job& job, std::vector<int>& gone) {
  double go = 0;
  if (job.rank() != 0) {
    job.control().recv(&go, sizeof go, 0, tag_verdict, train::connect_timeout);
    return go != 0;
  }
  go = gone.empty() ? 1 : 0;
  auto& control = job.control();
  std::vector<int> lost;
  for (int q = 1; q < job.size(); ++q) {
    if (std::find(gone.begin(), gone.end(), q) != gone.end()) continue;
    try {
      control.send(&go, sizeof go, q, tag_verdict, train::connect_timeout);
    } catch (const cadence::transport_error&) {
      if (!control.capabilities().isolates_lost_peer || control.failed()) throw;
      lost.push_back(q);
    }
  }
  gone.insert(gone.end(), lost.begin(), lost.end());
  return go != 0 && lost.empty();
}

// Rank 0: fills r's measured part from the workers' records (a gone worker's counts as no
// iterations): the iterations of a collective mode, the transfer costs, the wait and overrun
// fractions; writes the policy's iteration trace with --trace. Parameter-server modes: each
// worker's own transfer cost is its blocked time beyond what server 0 parked its pushes
// (r.parked_seconds, found by the worker id in its record); collective modes: one merge cost.
inline void add_measurements(train::policy_report& r, std::vector<std::vector<double>>& records, const std::vector<int>& gone,
                      const train_options& o, const std::string& policy, std::size_t workers) {
  const bool collective = is_collective_run(policy);
  const auto size = static_cast<int>(workers + 1);
  constexpr std::size_t head = 1 + summary_words;
  for (const int q : gone) {  // no iterations known, no worker id
    records[static_cast<std::size_t>(q)].assign(head, 0.0);
    records[static_cast<std::size_t>(q)][head - 1] = -1;
  }
  double total_counted = 0;
  std::vector<worker_summary> sums(static_cast<std::size_t>(size));
  for (int q = 0; q < size; ++q) {
    const auto& rec = records[static_cast<std::size_t>(q)];
    if (rec.size() < head || (rec.size() - head) % 2 != 0)
      throw cadence::error("rank " + std::to_string(q) + " sent a malformed summary of " + std::to_string(rec.size()) +
                           " values");
    total_counted += rec[0];
    sums[static_cast<std::size_t>(q)] = {rec[1], rec[2], rec[3], rec[4], rec[5], rec[6]};
  }

  std::vector<std::vector<train::exchange_timing>> per_worker(workers);
  double iterations = 0, overruns = 0;
  for (std::size_t p = 0; p < workers; ++p) {
    const auto q = static_cast<std::size_t>(p + 1);
    const auto& rec = records[q];
    for (std::size_t i = head; i + 1 < rec.size(); i += 2) per_worker[p].push_back({rec[i], rec[i + 1]});
    iterations += sums[q].iterations;
    overruns += sums[q].overruns;
    if (collective)  // the most local steps between merges: a local model's lag
      r.max_staleness = std::max<std::int64_t>(r.max_staleness, static_cast<std::int64_t>(sums[q].max_local_steps));
  }
  if (collective) {
    r.iterations = static_cast<std::uint64_t>(total_counted);
    r.iterations_per_second = total_counted / o.seconds;
    r.p99_staleness = r.max_staleness;
  }
  if (collective) {
    r.transfer_seconds = train::transfer_seconds(per_worker);
    r.worker_transfer_seconds.assign(workers, r.transfer_seconds);
    r.wait_fraction = train::wait_fraction(per_worker, r.transfer_seconds, o.seconds);
  } else {
    std::vector<double> parked(workers, 0.0);
    for (std::size_t p = 0; p < workers; ++p) {
      const double id = sums[p + 1].id;
      if (id >= 0 && id < static_cast<double>(r.parked_seconds.size()))
        parked[p] = r.parked_seconds[static_cast<std::size_t>(id)];
    }
    r.worker_transfer_seconds = train::worker_transfer_seconds(per_worker, parked);
    r.transfer_seconds = train::median_transfer_seconds(r.worker_transfer_seconds);
    const std::vector<double> costs = train::filled_transfer_seconds(r.worker_transfer_seconds);
    if (!o.trace.empty())
      cadence::write_iteration_trace_file(train::trace_file_for(o.trace, policy, o.policies.size()),
                                          train::trace_from_timings(per_worker, costs));
    r.wait_fraction = train::wait_fraction(per_worker, costs, o.seconds);
  }
  r.overrun_fraction = iterations > 0 ? overruns / iterations : 0;
}

// Rank 0: the simulator on the same profile, policy and measured transfer costs: under a
// parameter-server policy each worker's own as its link (half push, half pull), so a worker on
// a slow link is slow in the simulator too; under a collective mode the one merge cost.
inline void add_simulated(train::policy_report& r, const cadence::sim::scenario& prof, const std::string& policy) {
  cadence::sim::scenario s = prof;
  if (is_diloco_mode(policy)) return;  // not modelled by the collective simulator
  if (is_collective_config(policy)) {
    cadence::sim::collective_options co;
    co.allreduce_seconds = r.transfer_seconds;
    const auto m = cadence::sim::simulate_collective(collective_mode(policy), s, co);
    r.simulated_iterations_per_second = m.steps_per_second;
    r.simulated_wait_fraction = m.wait_fraction;
  } else {
    s.push_seconds = s.pull_seconds = r.transfer_seconds / 2;
    const std::vector<double> costs = train::filled_transfer_seconds(r.worker_transfer_seconds);
    for (std::size_t p = 0; p < s.workers.size() && p < costs.size(); ++p)
      s.workers[p].push_seconds = s.workers[p].pull_seconds = costs[p] / 2;
    cadence::sim::run_options ro;
    ro.time_controller = false;
    const auto m = cadence::sim::simulate(policy, s, ro);
    r.simulated_iterations_per_second = m.iterations_per_second;
    r.simulated_wait_fraction = m.wait_fraction;
  }
}

// ---- the whole run ----

// A whole run on this rank: check the flags, load and split the data, then each policy in turn
// (run it, gather the workers' records on rank 0, agree whether to go on, and on rank 0 add
// the measured and simulated figures), and rank 0 prints the reports. A worker found gone
// after a policy ends the run there: its communicators are made over every rank.
template <class Job>
int run(Job& job, const train_options& o) {
  if constexpr (Job::joinable) {
    job.set_start_timeout(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(o.start_timeout)));
    if (o.rejoin) return replace_worker(job, o);
  }
  const int rank = job.rank();
  rank_setup setup(o, rank, job.size());
  const std::size_t workers = setup.workers;
  const std::vector<int> absent = introduce_ranks(job, o, setup.model, setup.n_train, workers);
  // Each rank keeps only what it needs; the rest is freed here.
  const rank_data own = keep_own_part(rank, std::move(setup.data), setup.n_train, workers);

  std::vector<train::policy_report> reports;
  for (std::size_t k = 0; k < o.policies.size(); ++k) {
    const std::string& policy = o.policies[k];
    policy_part part = run_policy(job, k, o, setup.model, own, setup.prof, workers, setup.log, absent);
    std::vector<int> gone;
    auto records = gather_records(job, part, gone);
    const bool go_on = share_verdict(job, gone);
    if (rank != 0) {
      if (!go_on) {  // a worker is gone: the remaining policies are skipped
        job.note_gone();
        break;
      }
      continue;
    }
    train::policy_report& r = part.report;
    add_measurements(r, records, gone, o, policy, workers);
    add_simulated(r, setup.prof, policy);
    print_policy_line(r);
    reports.push_back(std::move(r));
    if (!gone.empty()) {
      job.note_gone();
      print_gone(o, k, gone, gone_grace);
      break;
    }
  }
  if (rank != 0) return 0;
  print_reports(o, reports);
  return 0;
}

}  // namespace cadence::train
