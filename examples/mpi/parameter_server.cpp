// A parameter-server trainer to copy: linear regression on synthetic shards, any policy, run
// with `mpirun -np 4 cadence-example-parameter_server [policy] [servers]` (rank 0 coordinates;
// ranks [0, servers) serve, the rest train). What you write is the model and its gradient;
// Cadence moves the bytes and decides who waits.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/mpi/communicator.hpp>

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t dim = 64;  // the model: dim weights of y = w . x

// The true weights the workers' data come from, and one worker's shard of (x, y) pairs.
std::vector<float> truth() {
  std::vector<float> w(dim);
  for (std::size_t i = 0; i < dim; ++i) w[i] = std::sin(static_cast<float>(i));
  return w;
}

struct shard {
  std::vector<float> x, y;  // x: rows of dim
};

shard make_shard(unsigned worker, std::size_t rows) {
  std::mt19937 rng(1234 + worker);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<float> w = truth();
  shard s;
  s.x.resize(rows * dim);
  s.y.resize(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    float dot = 0;
    for (std::size_t i = 0; i < dim; ++i) dot += w[i] * (s.x[r * dim + i] = normal(rng));
    s.y[r] = dot + 0.01f * normal(rng);
  }
  return s;
}

// Mean-squared-error gradient of a minibatch; returns the loss.
float minibatch_gradient(const shard& s, std::size_t first, std::size_t rows,
                         const std::vector<float>& w, std::vector<float>& g) {
  std::fill(g.begin(), g.end(), 0.0f);
  float loss = 0;
  for (std::size_t r = first; r < first + rows; ++r) {
    float err = -s.y[r];
    for (std::size_t i = 0; i < dim; ++i) err += w[i] * s.x[r * dim + i];
    loss += err * err;
    for (std::size_t i = 0; i < dim; ++i) g[i] += 2 * err * s.x[r * dim + i] / static_cast<float>(rows);
  }
  return loss / static_cast<float>(rows);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  try {
    const std::string policy = argc > 1 ? argv[1] : "ssp:2";
    cadence::exchange::ps_options options;
    options.servers = argc > 2 ? std::stoi(argv[2]) : 1;
    options.evict_after = std::chrono::seconds(10);  // a worker silent this long is dropped
    cadence::transport::mpi_communicator comm(MPI_COMM_WORLD);
    const int workers = comm.size() - options.servers;
    if (comm.rank() < options.servers) {
      const std::vector<float> initial(dim, 0.0f);
      cadence::exchange::parameter_server<cadence::transport::mpi_communicator,
                                          cadence::any_controller>
          server(comm, dim, initial.data(),
                 cadence::make_controller(policy, static_cast<std::size_t>(workers)),
                 cadence::exchange::sgd<float>{0.05f}, options);
      server.run();
      if (server.coordinator()) {
        std::int64_t pushes = 0;
        for (auto p : server.stats().pushes) pushes += p;
        std::printf("policy %s: %lld pushes from %d workers, %lld deferred replies, %zu evictions\n",
                    server.controller().config().c_str(), static_cast<long long>(pushes), workers,
                    static_cast<long long>(server.stats().parked), server.stats().evictions.size());
      }
    } else {
      cadence::exchange::ps_worker<cadence::transport::mpi_communicator> worker(comm, dim, options);
      const shard data = make_shard(worker.id(), 512);
      std::vector<float> w(dim), g(dim);  // zeros: the model the servers start from
      // The starting model's loss on the whole shard. Not the pulled model's: a worker that
      // starts late (a loaded machine) pulls a model the others have already trained.
      const float before = minibatch_gradient(data, 0, 512, w, g);
      worker.pull(w.data());
      for (int step = 0; step < 200; ++step) {
        minibatch_gradient(data, static_cast<std::size_t>(step % 16) * 32, 32, w, g);
        // Workers of unequal speed: worker i takes i * 0.5 ms longer per step.
        std::this_thread::sleep_for(std::chrono::microseconds(500 * worker.id()));
        worker.push_pull(g.data(), w.data());
      }
      const float after = minibatch_gradient(data, 0, 512, w, g);
      std::printf("worker %u: %lld steps, shard loss %.4f -> %.5f\n", worker.id(),
                  static_cast<long long>(worker.iteration()), before, after);
      worker.finish();
      // The trainer must have learned the model: the loss on its whole shard is below 1% of
      // the starting model's. (A single minibatch's loss is noise, and a fast worker's last
      // weights under ElasticBSP can be several barriers behind the others'.)
      if (!(after < before / 100)) rc = 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
