// The CPU backend with 16-bit weights and KV caches (bf16, f16) against
// float64 references computed from the 16-bit values widened by this file's
// own conversions (bit-level decoding, value-level round to nearest even),
// so that a kernel sharing a conversion bug with the backend cannot pass.
//
// Tolerances, and why:
// - MatMul with f16 weights, and with any 16-bit weights on the paths that
//   widen to f32 (SmallMatMul16, MatMulWidened + sgemm): the products of
//   widened weights and f32 inputs are exact in double, so the only error is
//   f32 accumulation: 1e-5 of sum |w||x|, as for f32 weights.
// - MatMul with bf16 weights on the AVX512-BF16 path (m <= 32 where
//   DotBf16Supported()): the inputs are rounded to bf16 first, 8
//   significant bits, so each by at most 2^-8 relative; against the exact
//   product the error is at most 2^-8 of sum |w||x| (plus the f32
//   accumulation, 1e-5); a single term (k = 1) comes close (observed
//   3.7e-3 against 3.9e-3). Against the product of the bf16-rounded inputs it is again f32
//   accumulation alone, 1e-5.
// - Attention over a bf16 / f16 KV cache: against the same attention over
//   the rounded keys and values, f32 accuracy (1e-5 of the output's
//   largest element; observed below 1e-6); against unrounded keys and
//   values (or an f32 cache), K and V rounded by up to 2^-8 (bf16) or 2^-11
//   (f16) relative move the output by about that much (observed up to
//   3.4e-3 and 4.6e-4): 1e-2 for bf16, 1e-3 for f16.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cpu/small_matmul.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::kGuard;
using ::tandem::testing::kNaN;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::WorstError;

// --- Reference conversions, independent of common/compute/cpu/half.h. ---

// x rounded to the nearest value with `mantissa_bits` fraction bits and
// exponent at least `min_exp` (subnormals below it), ties to even. Finite,
// in-range inputs only.
double RoundToFormat(double x, int mantissa_bits, int min_exp) {
  if (x == 0.0) return x;
  int e2;
  std::frexp(x, &e2);  // |x| = m * 2^e2, m in [0.5, 1)
  const int exponent = std::max(e2 - 1, min_exp);
  const double quantum = std::ldexp(1.0, exponent - mantissa_bits);
  return std::nearbyint(x / quantum) * quantum;  // default mode: ties to even
}
double RoundToBf16(double x) { return RoundToFormat(x, 7, -126); }
double RoundToF16(double x) { return RoundToFormat(x, 10, -14); }
double RoundTo(DType dtype, double x) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<float>(x);
    case DType::kBF16:
      return RoundToBf16(x);
    case DType::kF16:
      return RoundToF16(x);
  }
  return kNaN;
}

float Bf16BitsToFloat(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

float F16BitsToFloat(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : kNaN;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
}

// Bits of a value exactly representable in `dtype` (as RoundTo returns).
uint16_t ExactToBits(DType dtype, double v) {
  const float f = static_cast<float>(v);
  if (dtype == DType::kBF16) return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));  // exact: no rounding
}

float BitsToFloat(DType dtype, uint16_t h) {
  return dtype == DType::kBF16 ? Bf16BitsToFloat(h) : F16BitsToFloat(h);
}

// `n` uniform draws in [lo, hi], rounded to `dtype`: the values as doubles
// and their encoding.
struct HalfValues {
  std::vector<double> values;
  std::vector<uint16_t> bits;
};
HalfValues RandomHalf(DType dtype, size_t n, double lo, double hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(lo, hi);
  HalfValues h;
  h.values.resize(n);
  h.bits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    h.values[i] = RoundTo(dtype, dist(rng));
    h.bits[i] = ExactToBits(dtype, h.values[i]);
  }
  return h;
}

class HalfPrecisionTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(backend_, CpuBackend::Create({.num_threads = GetParam()}));
  }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937_64 rng_{5150};
};

// ---------------------------------------------------------------- MatMul

struct MatMulErrors {
  double exact = 0.0;          // vs the product of the f32 inputs
  double rounded_input = 0.0;  // vs the product of the bf16-rounded inputs
};

// out[m, n] (+)= x w^T with w in `dtype`; returns the worst errors, each
// element's |out - exact| / (|out_before| + sum |x w|). `offset` shifts x,
// w and out by one element so no alignment holds.
MatMulErrors CheckMatMul16(CpuBackend& backend, DType dtype, int m, int n, int k, bool accumulate,
                           int offset, std::mt19937_64& rng) {
  const std::vector<float> x = RandomFloats(size_t(m) * k + offset, -1.0f, 1.0f, rng);
  const HalfValues w = RandomHalf(dtype, size_t(n) * k + offset, -1.0, 1.0, rng);
  const std::vector<float> before = RandomFloats(size_t(m) * n, -2.0f, 2.0f, rng);
  constexpr int kTail = 16;
  std::vector<float> out(offset + size_t(m) * n + kTail, kGuard);
  for (size_t i = 0; i < before.size(); ++i) out[offset + i] = accumulate ? before[i] : kNaN;

  backend.MatMul(x.data() + offset, MatrixRef{w.bits.data() + offset, dtype}, out.data() + offset,
                 m, n, k, accumulate);

  WorstError exact_error, rounded_error;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      const double start = accumulate ? before[size_t(i) * n + j] : 0.0;
      double exact = start, rounded = start, magnitude = std::abs(start);
      for (int t = 0; t < k; ++t) {
        const double xv = x[offset + size_t(i) * k + t];
        const double wv = w.values[offset + size_t(j) * k + t];
        exact += xv * wv;
        rounded += RoundToBf16(xv) * wv;
        magnitude += std::abs(xv * wv);
      }
      const double got = out[offset + size_t(i) * n + j];
      exact_error.Add(std::abs(got - exact) / magnitude);
      rounded_error.Add(std::abs(got - rounded) / magnitude);
    }
  }
  for (int i = 0; i < offset; ++i) EXPECT_EQ(out[i], kGuard) << "written before out";
  for (int i = 0; i < kTail; ++i) EXPECT_EQ(out[out.size() - 1 - i], kGuard) << "written past out";
  return {exact_error.value, rounded_error.value};
}

// m covers the three paths: bf16 on AVX512-BF16 CPUs the dot-product
// kernel for every m (k = 2100 makes m = 100 span two of its row blocks);
// otherwise m <= 32 weights widened in registers, m > 32 panels widened to
// f32 for sgemm. n and k have tails of the 4-wide tiles and the 16 /
// 32-element masked loads.
TEST_P(HalfPrecisionTest, MatMulMatchesWidenedReference) {
  const bool dot_bf16 = cpu::DotBf16Supported();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (int m : {1, 2, 3, 4, 5, 16, 31, 32, 33, 100}) {
      for (int n : {1, 3, 5, 67}) {
        for (int k : {1, 15, 16, 17, 31, 33, 64, 200, 2100}) {
          for (bool accumulate : {false, true}) {
            const int offset = (m + n + k) % 2;
            SCOPED_TRACE(::testing::Message()
                         << DTypeName(dtype) << " m=" << m << " n=" << n << " k=" << k
                         << " accumulate=" << accumulate << " offset=" << offset);
            const MatMulErrors e =
                CheckMatMul16(*backend_, dtype, m, n, k, accumulate, offset, rng_);
            if (dtype == DType::kBF16 && dot_bf16) {
              EXPECT_LE(e.exact, std::ldexp(1.0, -8) + 1e-5);
              EXPECT_LE(e.rounded_input, 1e-5);
            } else {
              EXPECT_LE(e.exact, 1e-5);
            }
          }
        }
      }
    }
  }
}

// The AVX512-BF16 path must really round the inputs to bf16 (to nearest
// even), not truncate them or leave them f32: inputs chosen halfway between
// two bf16 values make truncation, rounding and f32 give three different
// answers.
TEST_P(HalfPrecisionTest, DotBf16PathRoundsInputsToNearestEven) {
  if (!cpu::DotBf16Supported()) GTEST_SKIP() << "no AVX512-BF16: inputs stay f32";
  constexpr int kK = 40;
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (ties to 1); 1 + 3 * 2^-8
  // halfway between 1 + 2^-7 and 1 + 2^-6 (ties to the even 1 + 2^-6);
  // 1 + 2^-8 + 2^-16 is just above halfway (rounds up to 1 + 2^-7).
  const float inputs[3] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-16f};
  const double expected[3] = {1.0, 1.0 + 0x1p-6, 1.0 + 0x1p-7};
  std::vector<float> x(3 * kK);
  for (int i = 0; i < 3; ++i) std::fill_n(x.begin() + i * kK, kK, inputs[i]);
  const std::vector<uint16_t> w(kK, ExactToBits(DType::kBF16, 1.0));  // all ones
  std::vector<float> out(3, kNaN);
  backend_->MatMul(x.data(), MatrixRef{w.data(), DType::kBF16}, out.data(), 3, 1, kK, false);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], kK * expected[i]) << "input " << inputs[i];
}

// A row's result with 16-bit weights must not depend on the other rows of
// its batch (decode gives a sequence the same tokens whatever is batched
// with it): each row of m = 4 and m = 32 batches, bit for bit as alone.
TEST_P(HalfPrecisionTest, RowResultDoesNotDependOnBatch) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const auto& [n, k] : {std::pair{67, 200}, std::pair{5, 33}, std::pair{130, 17}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n << " k=" << k);
      const HalfValues w = RandomHalf(dtype, size_t(n) * k, -1.0, 1.0, rng_);
      const MatrixRef ref{w.bits.data(), dtype};
      for (int m : {4, cpu::kSmallMatMulMaxRows}) {
        const std::vector<float> x = RandomFloats(size_t(m) * k, -1.0f, 1.0f, rng_);
        std::vector<float> batch(size_t(m) * n, kNaN);
        backend_->MatMul(x.data(), ref, batch.data(), m, n, k, /*accumulate=*/false);
        for (int r = 0; r < m; ++r) {
          std::vector<float> alone(n, kNaN);
          backend_->MatMul(x.data() + size_t(r) * k, ref, alone.data(), 1, n, k, false);
          ASSERT_EQ(std::memcmp(alone.data(), batch.data() + size_t(r) * n, n * sizeof(float)), 0)
              << "row " << r << " of a batch of " << m;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- Embed

// Every 16-bit pattern (normals, subnormals, zeros of both signs,
// infinities, NaNs) widens exactly; rows are gathered by id.
TEST_P(HalfPrecisionTest, EmbedWidensEveryBitPattern) {
  constexpr int kDim = 256, kVocab = 256;
  std::vector<uint16_t> table(kDim * kVocab);
  std::iota(table.begin(), table.end(), uint16_t{0});
  std::vector<int32_t> ids(kVocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng_);
  ids.push_back(ids.front());  // a repeated id
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<float> out(ids.size() * kDim + 1, kNaN);
    out.back() = kGuard;
    backend_->Embed(MatrixRef{table.data(), dtype}, ids, kDim, out.data());
    int wrong = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      for (int i = 0; i < kDim; ++i) {
        const uint16_t h = table[size_t(ids[r]) * kDim + i];
        const float want = BitsToFloat(dtype, h), got = out[r * kDim + i];
        const bool same = std::isnan(want)
                              ? std::isnan(got)
                              : std::bit_cast<uint32_t>(want) == std::bit_cast<uint32_t>(got);
        if (!same && ++wrong <= 5) {
          ADD_FAILURE() << "bits 0x" << std::hex << h << std::dec << " widened to " << got
                        << ", expected " << want;
        }
      }
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(out.back(), kGuard) << "written past out";
  }
}

// An odd row width, so row offsets are not multiples of any vector.
TEST_P(HalfPrecisionTest, EmbedGathersRowsOfOddWidth) {
  constexpr int kDim = 37, kVocab = 50;
  const std::vector<int32_t> ids = {0, kVocab - 1, 3, 3, 17};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const HalfValues table = RandomHalf(dtype, size_t(kDim) * kVocab, -3.0, 3.0, rng_);
    std::vector<float> out(ids.size() * kDim + 1, kNaN);
    out.back() = kGuard;
    backend_->Embed(MatrixRef{table.bits.data(), dtype}, ids, kDim, out.data());
    for (size_t r = 0; r < ids.size(); ++r) {
      for (int i = 0; i < kDim; ++i) {
        ASSERT_EQ(out[r * kDim + i], table.values[size_t(ids[r]) * kDim + i])
            << "row " << r << " element " << i;
      }
    }
    EXPECT_EQ(out.back(), kGuard);
  }
}

// ---------------------------------------------------------------- AddBias

// Rows `stride` apart (a fused QKV buffer): only the first n of each row
// change, each by exactly its bias.
TEST_P(HalfPrecisionTest, AddBiasTouchesOnlyTheFirstNOfEachStridedRow) {
  for (const auto& [rows, n, stride] : {std::tuple{5, 37, 50}, std::tuple{1, 64, 64},
                                        std::tuple{17, 1, 3}, std::tuple{33, 100, 300}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << rows << " n=" << n << " stride=" << stride);
    const std::vector<float> x0 = RandomFloats(size_t(rows) * stride + 4, -2.0f, 2.0f, rng_);
    const std::vector<float> bias = RandomFloats(n, -1.0f, 1.0f, rng_);
    std::vector<float> x = x0;
    backend_->AddBias(x.data(), stride, bias.data(), rows, n);
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t r = i / stride, c = i % stride;
      const float want = r < size_t(rows) && c < size_t(n) ? x0[i] + bias[c] : x0[i];
      ASSERT_EQ(x[i], want) << "element " << c << " of row " << r;
    }
  }
}

// ---------------------------------------------------------------- Rope

// [max_position][head_dim / 2][cos, sin] of position * theta^(-2i/head_dim).
std::vector<float> CosSinTable(int max_position, int head_dim, double theta) {
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

const AttentionShape kRopeShapes[] = {{4, 2, 8, true}, {8, 1, 64, true}, {6, 6, 48, true}};

// Half-split RoPE rotates (v[i], v[i + half]) of each head by position *
// freq_i: checked element by element against the formula.
TEST_P(HalfPrecisionTest, HalfSplitRopeMatchesFormula) {
  constexpr int kMaxPosition = 200;
  for (const AttentionShape& shape : kRopeShapes) {
    SCOPED_TRACE(::testing::Message() << "heads=" << shape.n_heads << "/" << shape.n_kv_heads
                                      << " head_dim=" << shape.head_dim);
    const std::vector<float> table = CosSinTable(kMaxPosition, shape.head_dim, 500000.0);
    const int hd = shape.head_dim, half = hd / 2;
    const int q_width = shape.n_heads * hd, q_stride = q_width + 7;
    const int k_width = shape.n_kv_heads * hd, k_stride = k_width + 2;
    std::vector<int32_t> positions = {0, 1, kMaxPosition - 1, 5, 5};
    for (int i = 0; i < 40; ++i) positions.push_back(static_cast<int32_t>(rng_() % kMaxPosition));
    const size_t rows = positions.size();
    std::vector<float> q = RandomFloats(rows * q_stride, -2, 2, rng_);
    std::vector<float> k = RandomFloats(rows * k_stride, -2, 2, rng_);
    for (size_t r = 0; r < rows; ++r) {
      for (int i = q_width; i < q_stride; ++i) q[r * q_stride + i] = kGuard;
      for (int i = k_width; i < k_stride; ++i) k[r * k_stride + i] = kGuard;
    }
    const std::vector<float> q0 = q, k0 = k;
    backend_->Rope(q.data(), q_stride, k.data(), k_stride, positions, shape, table.data());

    WorstError worst;
    auto check = [&](const std::vector<float>& before, const std::vector<float>& after, int stride,
                     int width) {
      for (size_t r = 0; r < rows; ++r) {
        for (int head = 0; head < width / hd; ++head) {
          const size_t base = r * stride + size_t(head) * hd;
          for (int i = 0; i < half; ++i) {
            const double angle = positions[r] * std::pow(500000.0, -2.0 * i / hd);
            const double c = std::cos(angle), s = std::sin(angle);
            const double a = before[base + i], b = before[base + i + half];
            const double norm = std::hypot(a, b);
            worst.Add(std::abs(after[base + i] - (a * c - b * s)) / norm);
            worst.Add(std::abs(after[base + i + half] - (a * s + b * c)) / norm);
          }
        }
        for (int e = width; e < stride; ++e) ASSERT_EQ(after[r * stride + e], kGuard);
      }
    };
    check(q0, q, q_stride, q_width);
    check(k0, k, k_stride, k_width);
    // The table's cos and sin are rounded to float: 1e-6 of |(a, b)|.
    EXPECT_LE(worst.value, 1e-6);
  }
}

// Half-split RoPE of v is interleaved RoPE of P v read back through P,
// where P places v[i] at 2i and v[i + half] at 2i + 1: the relation by which
// hub checkpoints' permuted q/k rows give the same model.
TEST_P(HalfPrecisionTest, HalfSplitRopeIsInterleavedRopeOfPermutedVector) {
  constexpr int kMaxPosition = 100;
  for (AttentionShape shape : kRopeShapes) {
    SCOPED_TRACE(::testing::Message() << "head_dim=" << shape.head_dim);
    const int hd = shape.head_dim, half = hd / 2;
    const std::vector<float> table = CosSinTable(kMaxPosition, hd, 10000.0);
    const int q_width = shape.n_heads * hd, k_width = shape.n_kv_heads * hd;
    std::vector<int32_t> positions;
    for (int i = 0; i < 20; ++i) positions.push_back(static_cast<int32_t>(rng_() % kMaxPosition));
    const size_t rows = positions.size();
    std::vector<float> q_half = RandomFloats(rows * q_width, -2, 2, rng_);
    std::vector<float> k_half = RandomFloats(rows * k_width, -2, 2, rng_);
    // P applied to every head of every row.
    auto permute = [&](const std::vector<float>& v) {
      std::vector<float> u(v.size());
      for (size_t head = 0; head < v.size() / hd; ++head) {
        for (int i = 0; i < half; ++i) {
          u[head * hd + 2 * i] = v[head * hd + i];
          u[head * hd + 2 * i + 1] = v[head * hd + i + half];
        }
      }
      return u;
    };
    std::vector<float> q_inter = permute(q_half), k_inter = permute(k_half);

    shape.rope_half_split = true;
    backend_->Rope(q_half.data(), q_width, k_half.data(), k_width, positions, shape, table.data());
    shape.rope_half_split = false;
    backend_->Rope(q_inter.data(), q_width, k_inter.data(), k_width, positions, shape,
                   table.data());

    // Both compute a c - b s and a s + b c of the same floats; allow for a
    // fused multiply-add in one loop and not the other.
    const std::vector<float> q_back = permute(q_half), k_back = permute(k_half);
    for (size_t i = 0; i < q_back.size(); ++i) ASSERT_NEAR(q_back[i], q_inter[i], 1e-6) << i;
    for (size_t i = 0; i < k_back.size(); ++i) ASSERT_NEAR(k_back[i], k_inter[i], 1e-6) << i;
  }
}

// ------------------------------------------------- WriteKv, PagedAttention

constexpr int kLayer = 1;  // of two: offsets must include the layer

// A NaN (in `dtype`) whose payload varies with the element index: reading
// an unwritten slot poisons the output, and any stray write changes a byte.
void FillSentinel(DType dtype, std::vector<uint8_t>& cache) {
  const size_t n = cache.size() / DTypeSize(dtype);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      const uint32_t bits = 0x7f800000u | static_cast<uint32_t>(1 + i % 0x3fffff);
      std::memcpy(&cache[4 * i], &bits, 4);
    } else {
      const uint16_t bits = dtype == DType::kBF16 ? static_cast<uint16_t>(0x7f80 | (1 + i % 0x7f))
                                                  : static_cast<uint16_t>(0x7c00 | (1 + i % 0x3ff));
      std::memcpy(&cache[2 * i], &bits, 2);
    }
  }
}

double ElementAt(DType dtype, const std::vector<uint8_t>& cache, size_t index) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, &cache[4 * index], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &cache[2 * index], 2);
  return BitsToFloat(dtype, h);
}

struct KvSequence {
  int length;
  std::vector<float> keys, values;  // logical [length][kv_dim], f32
  std::vector<int32_t> blocks;
};

// Sequences with random K/V written through WriteKv into caches of every
// dtype, then attended through PagedAttention.
class KvCase {
 public:
  KvCase(const AttentionShape& shape, int block_size, const std::vector<int>& lengths,
         std::mt19937_64& rng)
      : shape_(shape), rng_(rng) {
    base_.n_layers = 2;
    base_.block_size = block_size;
    base_.kv_dim = shape.n_kv_heads * shape.head_dim;
    int needed = 0;
    for (int len : lengths) needed += (len + block_size - 1) / block_size;
    base_.num_blocks = needed + 3;  // a few never used
    std::vector<int32_t> ids(base_.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    size_t next = 0;
    for (int len : lengths) {
      KvSequence s;
      s.length = len;
      const int n_blocks = (len + block_size - 1) / block_size;
      s.blocks.assign(ids.begin() + next, ids.begin() + next + n_blocks);
      next += n_blocks;
      s.keys = RandomFloats(size_t(len) * base_.kv_dim, -1.0f, 1.0f, rng_);
      s.values = RandomFloats(size_t(len) * base_.kv_dim, -1.0f, 1.0f, rng_);
      seqs_.push_back(std::move(s));
    }
  }

  KvLayout Layout(DType dtype) const {
    KvLayout layout = base_;
    layout.dtype = dtype;
    return layout;
  }

  // A sentinel-filled cache of `dtype` with every position of every
  // sequence written by WriteKv: the rows interleave sequences and come in
  // two calls, K and V in a fused [k | gap | v | gap] buffer.
  std::vector<uint8_t> WriteCache(CpuBackend& backend, DType dtype) const {
    const KvLayout layout = Layout(dtype);
    std::vector<uint8_t> cache(layout.total_bytes());
    FillSentinel(dtype, cache);
    std::vector<std::pair<int, int>> order;  // (sequence, position)
    for (size_t s = 0; s < seqs_.size(); ++s) {
      for (int t = 0; t < seqs_[s].length; ++t) order.push_back({static_cast<int>(s), t});
    }
    std::mt19937_64 shuffle_rng(static_cast<uint64_t>(order.size()));
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    const int kv = base_.kv_dim, stride = 2 * kv + 5;
    const size_t split = order.size() / 3;
    for (auto [begin, end] : {std::pair{size_t{0}, split}, std::pair{split, order.size()}}) {
      std::vector<float> fused((end - begin) * stride, kGuard);
      std::vector<AttentionRow> rows;
      for (size_t r = begin; r < end; ++r) {
        const auto [s, t] = order[r];
        const KvSequence& seq = seqs_[s];
        float* row = fused.data() + (r - begin) * stride;
        std::copy_n(seq.keys.begin() + size_t(t) * kv, kv, row);
        std::copy_n(seq.values.begin() + size_t(t) * kv, kv, row + kv + 2);
        rows.push_back({t, seq.blocks});
      }
      backend.WriteKv(fused.data(), stride, fused.data() + kv + 2, stride, rows, kLayer, layout,
                      cache.data());
    }
    return cache;
  }

  // Checks that each written element is its f32 value rounded to `dtype`
  // (nearest, ties to even) and that every other byte kept its sentinel.
  void ExpectWrittenExactly(DType dtype, const std::vector<uint8_t>& cache) const {
    const KvLayout layout = Layout(dtype);
    std::vector<uint8_t> untouched(cache.size());
    FillSentinel(dtype, untouched);
    std::vector<bool> written(layout.total_elements(), false);
    int wrong = 0;
    for (const KvSequence& s : seqs_) {
      for (int t = 0; t < s.length; ++t) {
        const int32_t block = s.blocks[t / layout.block_size];
        const int slot = t % layout.block_size;
        for (int d = 0; d < layout.kv_dim; ++d) {
          const size_t key = layout.KeyOffset(kLayer, block, slot, d);
          const size_t value = layout.ValueOffset(kLayer, block, slot) + d;
          for (auto [index, want] : {std::pair{key, s.keys[size_t(t) * layout.kv_dim + d]},
                                     std::pair{value, s.values[size_t(t) * layout.kv_dim + d]}}) {
            written[index] = true;
            const double got = ElementAt(dtype, cache, index);
            if (got != RoundTo(dtype, want) && ++wrong <= 5) {
              ADD_FAILURE() << "position " << t << " dim " << d << ": stored " << got << " for "
                            << want << ", expected " << RoundTo(dtype, want);
            }
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "elements stored wrongly";
    const size_t element = layout.element_bytes();
    size_t stray = 0;
    for (size_t i = 0; i < written.size(); ++i) {
      if (!written[i] && std::memcmp(&cache[i * element], &untouched[i * element], element) != 0) {
        ++stray;
      }
    }
    EXPECT_EQ(stray, 0u) << "elements outside the written slots changed";
  }

  struct Errors {
    double vs_rounded = 0.0;  // vs exact attention over the rounded K/V
    double vs_exact = 0.0;    // vs exact attention over the f32 K/V
    std::vector<float> out;
  };

  // PagedAttention of `rows_of` ((sequence, first position, count) runs)
  // with the given queries over `cache`; errors per row as
  // max |out - exact| / max |exact|.
  Errors Attend(CpuBackend& backend, DType dtype, const std::vector<uint8_t>& cache,
                const std::vector<std::tuple<int, int, int>>& runs,
                const std::vector<float>& q) const {
    std::vector<AttentionRow> rows;
    std::vector<int> row_seq;
    for (const auto& [s, first, count] : runs) {
      for (int i = 0; i < count; ++i) {
        rows.push_back({first + i, seqs_[s].blocks});
        row_seq.push_back(s);
      }
    }
    const int q_width = shape_.n_heads * shape_.head_dim;
    EXPECT_EQ(q.size(), rows.size() * q_width) << "bad test case";
    Errors e;
    e.out.assign(rows.size() * q_width, kNaN);
    backend.PagedAttention(q.data(), q_width, rows, kLayer, Layout(dtype), cache.data(), shape_,
                           e.out.data());
    WorstError vs_rounded, vs_exact;
    for (size_t r = 0; r < rows.size(); ++r) {
      const KvSequence& s = seqs_[row_seq[r]];
      const float* qr = q.data() + r * q_width;
      const std::vector<double> rounded =
          Reference(qr, s, rows[r].position, [dtype](float v) { return RoundTo(dtype, v); });
      const std::vector<double> exact =
          Reference(qr, s, rows[r].position, [](float v) { return double{v}; });
      vs_rounded.Add(RowError(e.out.data() + r * q_width, rounded));
      vs_exact.Add(RowError(e.out.data() + r * q_width, exact));
    }
    e.vs_rounded = vs_rounded.value;
    e.vs_exact = vs_exact.value;
    return e;
  }

  std::vector<float> RandomQueries(size_t rows) const {
    return RandomFloats(rows * shape_.n_heads * shape_.head_dim, -2.0f, 2.0f, rng_);
  }

 private:
  // Naive float64 attention of one row over K/V mapped through `kv`.
  template <typename Convert>
  std::vector<double> Reference(const float* q, const KvSequence& s, int position,
                                Convert kv) const {
    const int hd = shape_.head_dim, group = shape_.n_heads / shape_.n_kv_heads;
    const int kv_dim = base_.kv_dim, ctx = position + 1;
    std::vector<double> out(size_t(shape_.n_heads) * hd, 0.0), scores(ctx);
    for (int h = 0; h < shape_.n_heads; ++h) {
      const size_t off = size_t(h / group) * hd;
      for (int t = 0; t < ctx; ++t) {
        double dot = 0.0;
        for (int i = 0; i < hd; ++i)
          dot += double{q[h * hd + i]} * kv(s.keys[t * kv_dim + off + i]);
        scores[t] = dot / std::sqrt(double(hd));
      }
      const double max = *std::max_element(scores.begin(), scores.end());
      double sum = 0.0;
      for (double& x : scores) sum += (x = std::exp(x - max));
      for (int t = 0; t < ctx; ++t) {
        for (int i = 0; i < hd; ++i) {
          out[h * hd + i] += scores[t] / sum * kv(s.values[t * kv_dim + off + i]);
        }
      }
    }
    return out;
  }

  static double RowError(const float* got, const std::vector<double>& exact) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < exact.size(); ++i) {
      const double d = std::abs(got[i] - exact[i]);
      if (!(d <= diff)) diff = d;  // NaN wins
      scale = std::max(scale, std::abs(exact[i]));
    }
    return diff / scale;
  }

  AttentionShape shape_;
  std::mt19937_64& rng_;
  KvLayout base_;
  std::vector<KvSequence> seqs_;
};

// GQA, MQA and MHA; head_dim 64 and 48 (WeightedValues<4> and <3>) and 40
// (the generic loop).
const AttentionShape kKvShapes[] = {{8, 2, 64}, {6, 3, 48}, {4, 1, 48}, {4, 4, 40}};

::testing::Message DescribeKv(const AttentionShape& s, int block_size) {
  return ::testing::Message() << "heads " << s.n_heads << "/" << s.n_kv_heads << " head_dim "
                              << s.head_dim << " block_size " << block_size;
}

// Relative error of 16-bit KV attention against f64 over unrounded K/V and
// against the f32 cache's output.
double Tolerance16(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 1e-3; }

// WriteKv into f32, bf16 and f16 caches, then PagedAttention for decode
// rows (the row kernel, AttendGroup) and prefill runs of >= 16 rows (the
// tile path, AttendTile), with block sizes 16 (full-block vector scores)
// and 7 (partial blocks everywhere).
TEST_P(HalfPrecisionTest, PagedAttentionOver16BitCacheMatchesF32) {
  const std::vector<int> lengths = {40, 17, 1, 100, 16};
  // (sequence, first position, count)
  const std::vector<std::tuple<int, int, int>> decode = {
      {0, 39, 1}, {1, 16, 1}, {2, 0, 1}, {3, 99, 1}, {4, 15, 1}, {3, 50, 1}, {0, 7, 1}};
  const std::vector<std::tuple<int, int, int>> prefill = {
      {0, 0, 40}, {3, 20, 80}, {4, 0, 16}, {1, 2, 15}};  // the last: 15 rows, row kernel
  for (const AttentionShape& shape : kKvShapes) {
    for (int block_size : {16, 7}) {
      SCOPED_TRACE(DescribeKv(shape, block_size));
      KvCase c(shape, block_size, lengths, rng_);
      std::vector<uint8_t> caches[3];
      const DType dtypes[3] = {DType::kF32, DType::kBF16, DType::kF16};
      for (int i = 0; i < 3; ++i) {
        SCOPED_TRACE(DTypeName(dtypes[i]));
        caches[i] = c.WriteCache(*backend_, dtypes[i]);
        c.ExpectWrittenExactly(dtypes[i], caches[i]);
      }
      for (const auto* runs : {&decode, &prefill}) {
        SCOPED_TRACE(runs == &decode ? "decode rows" : "prefill runs");
        size_t n_rows = 0;
        for (const auto& run : *runs) n_rows += std::get<2>(run);
        const std::vector<float> q = c.RandomQueries(n_rows);
        const KvCase::Errors f32 = c.Attend(*backend_, DType::kF32, caches[0], *runs, q);
        EXPECT_LE(f32.vs_exact, 1e-5);
        for (int i = 1; i < 3; ++i) {
          SCOPED_TRACE(DTypeName(dtypes[i]));
          const KvCase::Errors half = c.Attend(*backend_, dtypes[i], caches[i], *runs, q);
          EXPECT_LE(half.vs_rounded, 1e-5);
          EXPECT_LE(half.vs_exact, Tolerance16(dtypes[i]));
          double diff = 0.0, scale = 0.0;
          for (size_t j = 0; j < f32.out.size(); ++j) {
            const double d = std::abs(double{half.out[j]} - f32.out[j]);
            if (!(d <= diff)) diff = d;
            scale = std::max(scale, std::abs(double{f32.out[j]}));
          }
          EXPECT_LE(diff / scale, Tolerance16(dtypes[i])) << "vs the f32 cache";
        }
      }
    }
  }
}

// WriteKv rounds to nearest, ties to even: values exactly halfway between
// two representable numbers go to the one with an even last bit, values a
// hair above halfway go up (truncation would fail the first and third).
TEST_P(HalfPrecisionTest, WriteKvRoundsToNearestEven) {
  struct Case {
    DType dtype;
    float input;
    double stored;
  };
  const Case cases[] = {
      // bf16 keeps 7 fraction bits: 1 + 2^-8 is halfway between 1 and
      // 1 + 2^-7.
      {DType::kBF16, 1.0f + 0x1p-8f, 1.0},
      {DType::kBF16, 1.0f + 3 * 0x1p-8f, 1.0 + 0x1p-6},
      {DType::kBF16, 1.0f + 0x1p-8f + 0x1p-20f, 1.0 + 0x1p-7},
      {DType::kBF16, -(1.0f + 0x1p-8f), -1.0},
      {DType::kBF16, 0x1.ffp0f, 2.0},  // ties up into the next binade
      // f16 keeps 10: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
      {DType::kF16, 1.0f + 0x1p-11f, 1.0},
      {DType::kF16, 1.0f + 3 * 0x1p-11f, 1.0 + 0x1p-9},
      {DType::kF16, 1.0f + 0x1p-11f + 0x1p-20f, 1.0 + 0x1p-10},
      {DType::kF16, -(1.0f + 3 * 0x1p-11f), -(1.0 + 0x1p-9)},
      // Subnormals (ulp 2^-24): halfway between 0 and 1 ulp goes to 0,
      // halfway between 1 and 2 ulp to 2.
      {DType::kF16, 0x1p-25f, 0.0},
      {DType::kF16, 0x1.8p-24f, 0x1p-23},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << DTypeName(c.dtype) << " " << c.input);
    ASSERT_EQ(RoundTo(c.dtype, c.input), c.stored) << "bad test case";
    KvLayout layout{.n_layers = 2, .num_blocks = 3, .block_size = 4, .kv_dim = 2, .dtype = c.dtype};
    std::vector<uint8_t> cache(layout.total_bytes());
    FillSentinel(c.dtype, cache);
    const std::vector<uint8_t> untouched = cache;
    const std::vector<int32_t> blocks = {2, 0};
    const float k[2] = {c.input, 0.5f}, v[2] = {-0.25f, c.input};
    const AttentionRow row{5, blocks};  // block 0, slot 1
    backend_->WriteKv(k, 2, v, 2, std::span<const AttentionRow>(&row, 1), kLayer, layout,
                      cache.data());
    EXPECT_EQ(ElementAt(c.dtype, cache, layout.KeyOffset(kLayer, 0, 1, 0)), c.stored);
    EXPECT_EQ(ElementAt(c.dtype, cache, layout.KeyOffset(kLayer, 0, 1, 1)), 0.5);
    EXPECT_EQ(ElementAt(c.dtype, cache, layout.ValueOffset(kLayer, 0, 1)), -0.25);
    EXPECT_EQ(ElementAt(c.dtype, cache, layout.ValueOffset(kLayer, 0, 1) + 1), c.stored);
    const size_t changed[4] = {layout.KeyOffset(kLayer, 0, 1, 0), layout.KeyOffset(kLayer, 0, 1, 1),
                               layout.ValueOffset(kLayer, 0, 1),
                               layout.ValueOffset(kLayer, 0, 1) + 1};
    for (size_t i = 0; i < layout.total_elements(); ++i) {
      if (std::find(std::begin(changed), std::end(changed), i) != std::end(changed)) continue;
      ASSERT_EQ(std::memcmp(&cache[2 * i], &untouched[2 * i], 2), 0) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, HalfPrecisionTest, ::testing::Values(0, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "threads" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace tandem
