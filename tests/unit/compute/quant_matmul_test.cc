// Products with GGUF quantized weights against f32 products of the same
// weights widened, on random blocks: within the error the int8 rounding of
// the activations allows (half a step of the scale of each 32 values for
// Q8_0 and Q4_0, of each 256 for the K types, per value) on the int8 path
// (few rows); on widened panels (many rows), within bf16's rounding of
// both operands (2^-8 of the sum of |w x|) where the CPU has AVX512-BF16,
// else f32's.
#include "common/compute/cpu/quant_matmul.h"

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "common/base/quant_blocks.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cpu/small_matmul.h"
#include "gtest/gtest.h"
#include "tests/testing/quant_testing.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::kGuard;
using ::tandem::testing::RandomFloats;

struct Case {
  DType dtype;
  int k;
};

class QuantMatMulTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { ASSERT_OK_AND_ASSIGN(backend_, CpuBackend::Create({.num_threads = 2})); }

  // Checks out (rows ldo apart, columns [0, n)) against the widened weights,
  // plus `base` where accumulating.
  void Check(const std::vector<float>& x, const std::vector<float>& wide, const float* out,
             const std::vector<float>& base, int ldo, int m, int n, int k) {
    const bool bf16_panels = m > cpu::kQuantMatMulMaxRows && cpu::DotBf16Supported();
    for (int r = 0; r < m; ++r) {
      // Half a step of each group's activation scale, per weight.
      const int group = DTypeBlockElements(GetParam().dtype) == 32 ? 32 : 256;
      std::vector<double> step(k / group);
      for (int b = 0; b < k / group; ++b) {
        double amax = 0;
        for (int i = 0; i < group; ++i) {
          amax = std::max(amax, std::fabs(double(x[r * k + group * b + i])));
        }
        step[b] = amax / 127 / 2;
      }
      for (int j = 0; j < n; ++j) {
        double want = base.empty() ? 0 : base[r * ldo + j], bound = 0, magnitude = 0;
        for (int i = 0; i < k; ++i) {
          const double w = wide[size_t(j) * k + i];
          want += w * x[r * k + i];
          bound += std::fabs(w) * step[i / group];
          magnitude += std::fabs(w * x[r * k + i]);
        }
        if (bf16_panels) bound = magnitude * (1.0 / 256);
        const double got = out[r * ldo + j];
        ASSERT_LE(std::fabs(got - want), bound * 1.001 + 1e-5 * magnitude + 1e-6)
            << DTypeName(GetParam().dtype) << " m=" << m << " row " << r << " column " << j;
      }
    }
  }

  // m rows of products with n random weight rows of k into columns [0, n)
  // of an output `ldo` wide, accumulating: the columns past n untouched.
  void CheckWiderOutput(DType dtype, int m, int n, int k, int ldo) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k);
    const std::vector<uint8_t> w = testing::RandomQuantBlocks(dtype, int64_t{n} * k, 0.05f, rng_);
    std::vector<float> wide(size_t(n) * k);
    DequantizeRow(dtype, w.data(), wide.data(), int64_t{n} * k);
    const std::vector<float> x = RandomFloats(size_t(m) * k, -1.0f, 1.0f, rng_);
    const std::vector<float> base = RandomFloats(size_t(m) * ldo, -1.0f, 1.0f, rng_);
    std::vector<float> out = base;
    backend_->MatMulColumns(x.data(), MatrixRef{w.data(), dtype}, out.data(), ldo, m, n, k, true);
    Check(x, wide, out.data(), base, ldo, m, n, k);
    for (int r = 0; r < m; ++r) {
      for (int j = n; j < ldo; ++j) ASSERT_EQ(out[r * ldo + j], base[r * ldo + j]) << "gap";
    }
  }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937_64 rng_{11};
};

TEST_P(QuantMatMulTest, MatchesTheWidenedWeightsForAnyRowCount) {
  const auto [dtype, k] = GetParam();
  const int n = 37;
  const std::vector<uint8_t> w = testing::RandomQuantBlocks(dtype, int64_t{n} * k, 0.05f, rng_);
  std::vector<float> wide(size_t(n) * k);
  DequantizeRow(dtype, w.data(), wide.data(), int64_t{n} * k);
  // Passes take 8 rows, then 4, then 1 to 3 (15 = 8 + 4 + 3); 33 and more
  // go to widened panels.
  for (int m : {1, 2, 3, 4, 5, 8, 9, 12, 15, 16, 32, 33, 40}) {
    std::vector<float> x = RandomFloats(size_t(m) * k, -2.0f, 2.0f, rng_);
    // Heavy tails, as SwiGLU's products have: every 7th value cubed and scaled.
    for (size_t i = 0; i < x.size(); i += 7) x[i] = 8 * x[i] * x[i] * x[i];
    std::vector<float> out(size_t(m) * n + 1, kGuard);
    backend_->MatMul(x.data(), MatrixRef{w.data(), dtype}, out.data(), m, n, k, false);
    Check(x, wide, out.data(), {}, n, m, n, k);
    EXPECT_EQ(out.back(), kGuard);
  }
}

TEST_P(QuantMatMulTest, WritesColumnsOfAWiderOutputAndAccumulates) {
  for (int m : {1, 6, 40}) CheckWiderOutput(GetParam().dtype, m, 20, GetParam().k, 29);
}

// Many rows over weights of several panels (256 rows of k = 4096 each):
// 261 columns end in a panel of 5, written into a wider output.
TEST_P(QuantMatMulTest, ManyRowsCrossThePanels) {
  CheckWiderOutput(GetParam().dtype, 36, 261, 4096, 263);
}

TEST_P(QuantMatMulTest, EmbedsWidenedRows) {
  const auto [dtype, k] = GetParam();
  const int n = 9;
  const std::vector<uint8_t> w = testing::RandomQuantBlocks(dtype, int64_t{n} * k, 0.05f, rng_);
  std::vector<float> wide(size_t(n) * k);
  DequantizeRow(dtype, w.data(), wide.data(), int64_t{n} * k);
  const std::vector<int32_t> ids = {8, 0, 3};
  std::vector<float> out(ids.size() * k);
  backend_->Embed(MatrixRef{w.data(), dtype}, ids, k, out.data());
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int i = 0; i < k; ++i) ASSERT_EQ(out[r * k + i], wide[size_t(ids[r]) * k + i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantMatMulTest,
                         ::testing::Values(Case{DType::kQ8_0, 96}, Case{DType::kQ8_0, 512},
                                           Case{DType::kQ4_0, 160}, Case{DType::kQ5_0, 1408},
                                           Case{DType::kQ5_1, 160}, Case{DType::kQ4_K, 512},
                                           Case{DType::kQ5_K, 768}, Case{DType::kQ6_K, 512}),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param.dtype)) + "_k" +
                                  std::to_string(info.param.k);
                         });

TEST(QuantizeRows, RoundsEach32ValuesToTheirLargestForSmallBlocks) {
  std::vector<float> x(64, 0.0f);
  x[0] = -2.54f;
  x[1] = 1.0f;
  x[40] = 0.5f;
  cpu::QuantizedRows rows;
  cpu::QuantizeRows(x.data(), 1, 64, DType::kQ8_0, &rows);
  EXPECT_EQ(rows.q[0], -127);
  EXPECT_EQ(rows.q[1], 50);  // 1 / 0.02
  EXPECT_EQ(rows.q[40], 127);
  EXPECT_FLOAT_EQ(rows.lane_scale[0], 0.02f);
  EXPECT_FLOAT_EQ(rows.lane_scale[15], 0.5f / 127);
  EXPECT_EQ(rows.neg_sums[1][0], (127 - 50) * 128);
  EXPECT_EQ(rows.neg_sums[0][0], (127 - 50) * 8);
}

TEST(QuantizeRows, RoundsEach256ValuesToTheirLargestForKTypesInTheNibblesOrder) {
  std::vector<float> x(256, 0.0f);
  x[0] = -2.54f;
  x[33] = 1.0f;  // stored after values 64-95 for Q4_K
  x[70] = 0.5f;
  cpu::QuantizedRows rows;
  cpu::QuantizeRows(x.data(), 1, 256, DType::kQ4_K, &rows);
  EXPECT_FLOAT_EQ(rows.block_scale[0], 0.02f);
  EXPECT_EQ(rows.q[0], -127);
  EXPECT_EQ(rows.q[64 + 1], 50);
  EXPECT_EQ(rows.q[32 + 6], 25);
  EXPECT_FLOAT_EQ(rows.block_sum[0], 0.02f * -127);
  EXPECT_FLOAT_EQ(rows.block_sum[1], 0.02f * 50);
  EXPECT_FLOAT_EQ(rows.sum16[4], 0.02f * 25);
  cpu::QuantizeRows(x.data(), 1, 256, DType::kQ6_K, &rows);
  EXPECT_EQ(rows.q[33], 50);  // Q6_K keeps the values' order
}

}  // namespace
}  // namespace tandem
