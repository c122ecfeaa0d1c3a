// Helpers shared by the compute backend tests.
#ifndef TANDEM_TESTS_UNIT_COMPUTE_COMPUTE_TESTING_H_
#define TANDEM_TESTS_UNIT_COMPUTE_COMPUTE_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "common/compute/backend.h"

namespace tandem::testing {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Written past the end of outputs (and into row-stride gaps); must survive.
inline constexpr float kGuard = -12345.0f;

// [max_position][head_dim / 2][cos, sin] of position * theta^(-2i/head_dim).
inline std::vector<float> CosSinTable(int max_position, int head_dim, double theta) {
  const int half = head_dim / 2;
  std::vector<float> table(size_t(max_position) * half * 2);
  for (int p = 0; p < max_position; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * std::pow(theta, -2.0 * i / head_dim);
      table[(size_t(p) * half + i) * 2] = static_cast<float>(std::cos(angle));
      table[(size_t(p) * half + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

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

// Naive float64 attention of one row at `position` over keys and values
// given as key(t, d) and value(t, d) for d in [0, n_kv_heads * head_dim).
inline std::vector<double> NaiveAttention(const float* q,
                                          const std::function<double(int, int)>& key,
                                          const std::function<double(int, int)>& value,
                                          int position, const AttentionShape& shape) {
  const int hd = shape.head_dim, group = shape.n_heads / shape.n_kv_heads, ctx = position + 1;
  std::vector<double> out(size_t(shape.n_heads) * hd, 0.0), scores(ctx);
  for (int h = 0; h < shape.n_heads; ++h) {
    const int off = (h / group) * hd;
    for (int t = 0; t < ctx; ++t) {
      double dot = 0.0;
      for (int i = 0; i < hd; ++i) dot += double{q[h * hd + i]} * key(t, off + i);
      scores[t] = dot / std::sqrt(double(hd));
    }
    const double max = *std::max_element(scores.begin(), scores.end());
    double sum = 0.0;
    for (double& x : scores) sum += (x = std::exp(x - max));
    for (int t = 0; t < ctx; ++t) {
      for (int i = 0; i < hd; ++i) out[h * hd + i] += scores[t] / sum * value(t, off + i);
    }
  }
  return out;
}

// max |got - exact| / max |exact| over a row; NaN when got holds a NaN.
inline double RelativeRowError(const float* got, const std::vector<double>& exact) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < exact.size(); ++i) {
    const double d = std::abs(got[i] - exact[i]);
    if (!(d <= diff)) diff = d;  // NaN wins
    scale = std::max(scale, std::abs(exact[i]));
  }
  return diff / scale;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_COMPUTE_COMPUTE_TESTING_H_
