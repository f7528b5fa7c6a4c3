// The umbrella header: what a trainer needs in one include, and no heavy backend dragged in.
#include <cadence/cadence.hpp>

#include <doctest/doctest.h>

#if defined(THRUST_VERSION) || defined(__CUDACC__) || defined(CUDART_VERSION) || defined(NCCL_MAJOR) || \
    defined(OMPI_MAJOR_VERSION) || defined(MPI_VERSION)
#error "cadence/cadence.hpp must not include Thrust, CUDA, NCCL or MPI"
#endif

TEST_CASE("the umbrella header gives a trainer every policy, predictor, ZipLine variant and the runtime") {
  for (const char* config : {"bsp", "asp", "ssp:2", "dssp:1:5", "elastic:8:mean:3:opt-bs"}) {
    cadence::any_controller c = cadence::make_controller(config, 4);
    CHECK(c.active_workers() == 4);
  }
  const std::vector<double> rows{1, 5, 2, 6};
  const auto view = cadence::rows_view<double>::matrix(rows.data(), 2, 2);
  CHECK(cadence::zipline_solve(cadence::zipline_variant::fast, view) == cadence::zipline_brute_force(view));
  CHECK(cadence::make_predictor("median:3").name() == "median:3");
  cadence::blocking_controller<cadence::any_controller> blocking(cadence::make_controller("asp", 1));
  blocking.push(0);
  CHECK(CADENCE_VERSION_MAJOR >= 0);
}

// The simulator and the history files are opt-in: a trainer's build does not parse them.
// Each declaration below is ill-formed if the umbrella declared the name it reuses.
namespace cadence_test_opt_in {}
namespace cadence {
namespace sim = ::cadence_test_opt_in;  // <cadence/sim.hpp> declares namespace cadence::sim
struct push_history;                    // <cadence/io.hpp> declares a class template
}  // namespace cadence
