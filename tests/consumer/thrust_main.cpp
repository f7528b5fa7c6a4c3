// A trainer that plans barriers with the Thrust ZipLine through the exported cadence::thrust.
#include <cadence/thrust/zipline.hpp>
#include <cadence/zipline/brute_force.hpp>

#include <cstdio>
#include <vector>

int main() {
  const std::vector<double> rows{1, 4, 7, 2, 5, 8, 3, 6, 9};
  const auto view = cadence::rows_view<double>::matrix(rows.data(), 3, 3);
  if (cadence::zipline_thrust(view) != cadence::zipline_brute_force(view)) return 1;
  std::printf("consumer thrust ok (%s)\n", cadence::thrust_device_system_name());
  return 0;
}
