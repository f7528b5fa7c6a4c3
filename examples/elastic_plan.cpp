// ElasticBSP on a small heterogeneous cluster: watch it monitor, plan a barrier with ZipLine,
// and release everyone when the last worker reaches its planned iteration.
#include <cadence/cadence.hpp>

#include <cstdio>
#include <vector>

int main() {
  // Three workers with steady iteration times (seconds): one fast, one medium, one slow.
  const std::vector<double> iteration{1.0, 1.3, 2.1};
  std::vector<double> next{1.0, 1.3, 2.1};  // time of each worker's next push
  cadence::elastic_bsp sync(iteration.size(), /*R=*/6, cadence::make_predictor("median:3"));

  std::size_t shown_plans = 0;
  while (sync.barriers() < 2) {
    // The next push comes from the running worker whose iteration ends first.
    cadence::worker_id p = 0;
    for (cadence::worker_id q = 1; q < next.size(); ++q)
      if (!sync.is_waiting(q) && (sync.is_waiting(p) || next[q] < next[p])) p = q;
    const double t = next[p];
    const bool was_monitoring = sync.is_monitoring();
    const cadence::decision d = sync.push(p, t);
    next[p] = t + iteration[p];
    for (const cadence::worker_id q : d.released) next[q] = t + iteration[q];

    if (was_monitoring && !sync.is_monitoring() && shown_plans++ < 2) {
      const cadence::elastic_plan plan = sync.plan();
      std::printf("t=%.1f plan: barrier at t=%.1f, predicted spread %.2f s; iterations to run:", t,
                  plan.barrier, plan.spread);
      for (const auto r : plan.remaining) std::printf(" %lld", static_cast<long long>(r));
      std::printf("\n");
    }
    if (!d.proceed) std::printf("t=%.1f worker %u waits at the barrier\n", t, p);
    if (!d.released.empty())
      std::printf("t=%.1f worker %u arrives last: barrier %zu complete, %zu released\n", t, p,
                  sync.barriers(), d.released.size());
  }
  std::printf("iterations per worker in the last superstep:");
  for (const auto k : sync.last_superstep_iterations()) std::printf(" %zu", k);
  std::printf("\n");
  return 0;
}
