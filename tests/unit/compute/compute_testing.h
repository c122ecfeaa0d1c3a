// Helpers shared by the compute backend tests.
#ifndef TANDEM_TESTS_UNIT_COMPUTE_COMPUTE_TESTING_H_
#define TANDEM_TESTS_UNIT_COMPUTE_COMPUTE_TESTING_H_

#include <cstddef>
#include <limits>
#include <random>
#include <vector>

namespace tandem::testing {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Written past the end of outputs (and into row-stride gaps); must survive.
inline constexpr float kGuard = -12345.0f;

inline std::vector<float> RandomFloats(size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Records the largest error seen; a NaN error counts as the largest, which
// std::max would silently drop.
struct WorstError {
  double value = 0.0;
  void Add(double e) {
    if (!(e <= value)) value = e;
  }
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_COMPUTE_COMPUTE_TESTING_H_
