// The CPU backend with 16-bit weights (bf16, f16): MatMul on its three
// paths, Embed, strided AddBias and RoPE; the KV caches are in
// half_precision_kv_test.cc. References are computed in float64 from the
// 16-bit values widened by the tests' own conversions (bit-level decoding,
// value-level round to nearest even), so that a kernel sharing a conversion
// bug with the backend cannot pass.
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
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cpu/small_matmul.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/compute_testing.h"
#include "tests/unit/compute/half_precision_fixture.h"

namespace tandem {
namespace {

using ::tandem::testing::CosSinTable;
using ::tandem::testing::kGuard;
using ::tandem::testing::kNaN;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::WorstError;

// --- Random 16-bit values. ---

// Bits of a value exactly representable in `dtype` (as RoundTo returns).
uint16_t ExactToBits(DType dtype, double v) {
  const float f = static_cast<float>(v);
  if (dtype == DType::kBF16) return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));  // exact: no rounding
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
// kernel for every m (k = 2100 makes m = 100 span two of its row blocks;
// m > 32 goes over panels of w);
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

// Many rows against a matrix of several weight panels (about 1M values
// each: 256 rows at k = 4096), the last one partial (300 = 256 + 44).
TEST_P(HalfPrecisionTest, ManyRowsCrossTheWeightPanels) {
  const bool dot_bf16 = cpu::DotBf16Supported();
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "accumulate=" << accumulate);
    const MatMulErrors e =
        CheckMatMul16(*backend_, DType::kBF16, 40, 300, 4096, accumulate, 1, rng_);
    EXPECT_LE(dot_bf16 ? e.rounded_input : e.exact, 1e-5);
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
// with it): each row of m = 2, 3, 4 and 32 batches (the skinny product's
// wide tiles and the 4x4 ones), bit for bit as alone.
TEST_P(HalfPrecisionTest, RowResultDoesNotDependOnBatch) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const auto& [n, k] : {std::pair{67, 200}, std::pair{5, 33}, std::pair{130, 17}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n << " k=" << k);
      const HalfValues w = RandomHalf(dtype, size_t(n) * k, -1.0, 1.0, rng_);
      const MatrixRef ref{w.bits.data(), dtype};
      for (int m : {2, 3, 4, cpu::kSmallMatMulMaxRows}) {
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

INSTANTIATE_TEST_SUITE_P(Threads, HalfPrecisionTest, ::testing::Values(0, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "threads" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace tandem
