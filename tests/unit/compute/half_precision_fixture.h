// What the half-precision CPU backend tests share: the reference conversions
// to and from bf16 and f16, independent of common/compute/cpu/half.h, and the
// HalfPrecisionTest fixture (instantiated in half_precision_test.cc; its KV
// tests are in half_precision_kv_test.cc).
#ifndef TANDEM_TESTS_UNIT_COMPUTE_HALF_PRECISION_FIXTURE_H_
#define TANDEM_TESTS_UNIT_COMPUTE_HALF_PRECISION_FIXTURE_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>

#include "common/compute/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"

namespace tandem {

// --- Reference conversions, independent of common/compute/cpu/half.h. ---

// x rounded to the nearest value with `mantissa_bits` fraction bits and
// exponent at least `min_exp` (subnormals below it), ties to even. Finite,
// in-range inputs only.
inline double RoundToFormat(double x, int mantissa_bits, int min_exp) {
  if (x == 0.0) return x;
  int e2;
  std::frexp(x, &e2);  // |x| = m * 2^e2, m in [0.5, 1)
  const int exponent = std::max(e2 - 1, min_exp);
  const double quantum = std::ldexp(1.0, exponent - mantissa_bits);
  return std::nearbyint(x / quantum) * quantum;  // default mode: ties to even
}
inline double RoundToBf16(double x) { return RoundToFormat(x, 7, -126); }
inline double RoundToF16(double x) { return RoundToFormat(x, 10, -14); }
inline double RoundTo(DType dtype, double x) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<float>(x);
    case DType::kBF16:
      return RoundToBf16(x);
    case DType::kF16:
      return RoundToF16(x);
    default:
      break;
  }
  return ::tandem::testing::kNaN;
}

inline float Bf16BitsToFloat(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

inline float F16BitsToFloat(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f)
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : ::tandem::testing::kNaN;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
}

inline float BitsToFloat(DType dtype, uint16_t h) {
  return dtype == DType::kBF16 ? Bf16BitsToFloat(h) : F16BitsToFloat(h);
}

class HalfPrecisionTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(backend_, CpuBackend::Create({.num_threads = GetParam()}));
  }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937_64 rng_{5150};
};

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_COMPUTE_HALF_PRECISION_FIXTURE_H_
