// Q8_0 weights repacked by the CPU backend (kQ8_0R16, cpu/quant_repack.h):
// each row reads back bit for bit as the Q8_0 row it was; the backend
// repacks only whole groups of 16 rows, and only Q8_0; products over the
// repacked matrix match f32 products of the widened weights within the
// activations' int8 rounding (few rows) or bf16's (many rows), for row
// counts that cross its passes of 8, 4 and 1 to 3 rows, into a wider
// output and accumulating; embedding rows come back exact.
#include "common/compute/cpu/quant_repack.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/base/quant_blocks.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cpu/quant_matmul.h"
#include "common/compute/cpu/small_matmul.h"
#include "gtest/gtest.h"
#include "tests/testing/quant_testing.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::RandomFloats;

class QuantRepackTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK_AND_ASSIGN(backend_, CpuBackend::Create({.num_threads = 2})); }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937_64 rng_{23};
};

TEST_F(QuantRepackTest, EveryRowReadsBackAsTheQ8_0RowItWas) {
  for (const int k : {32, 96, 2048}) {
    const int n = 48;
    const std::vector<uint8_t> original =
        testing::RandomQuantBlocks(DType::kQ8_0, int64_t{n} * k, 0.05f, rng_);
    std::vector<uint8_t> packed = original;
    ASSERT_TRUE(cpu::CanRepackQ8_0(n, k));
    cpu::RepackQ8_0(packed.data(), n, k, 2);
    EXPECT_NE(packed, original);
    std::vector<float> want(k), got(k);
    for (int j = 0; j < n; ++j) {
      DequantizeRow(DType::kQ8_0, original.data() + DTypeBytes(DType::kQ8_0, k) * j, want.data(),
                    k);
      cpu::DequantizeRepackedRow(packed.data(), k, j, got.data());
      ASSERT_EQ(got, want) << "k " << k << " row " << j;
    }
  }
}

TEST_F(QuantRepackTest, RepacksOnlyWholeGroupsOfQ8_0Rows) {
  EXPECT_FALSE(cpu::CanRepackQ8_0(20, 64));
  EXPECT_FALSE(cpu::CanRepackQ8_0(16, 48));
  EXPECT_FALSE(cpu::CanRepackQ8_0(0, 64));
  std::vector<uint8_t> q8 = testing::RandomQuantBlocks(DType::kQ8_0, 20 * 64, 0.05f, rng_);
  const std::vector<uint8_t> before = q8;
  EXPECT_EQ(backend_->PrepareWeights({q8.data(), DType::kQ8_0}, 20, 64).dtype, DType::kQ8_0);
  EXPECT_EQ(q8, before);
  std::vector<uint8_t> q4k = testing::RandomQuantBlocks(DType::kQ4_K, 16 * 256, 0.05f, rng_);
  EXPECT_EQ(backend_->PrepareWeights({q4k.data(), DType::kQ4_K}, 16, 256).dtype, DType::kQ4_K);
  if (!cpu::QuantMatMulSupported()) GTEST_SKIP() << "no AVX512-VNNI: Q8_0 stays as it is";
  const MatrixRef packed = backend_->PrepareWeights({q8.data(), DType::kQ8_0}, 16, 64);
  EXPECT_EQ(packed.dtype, DType::kQ8_0R16);
  EXPECT_EQ(packed.data, q8.data());
}

TEST_F(QuantRepackTest, ProductsMatchTheWidenedWeights) {
  if (!cpu::QuantMatMulSupported()) GTEST_SKIP() << "no AVX512-VNNI: Q8_0 is not repacked";
  // 48 rows: three groups, which two threads can split only at group 2.
  for (const auto& [k, n] : {std::pair{96, 48}, std::pair{2048, 64}}) {
    const int ldo = n + 6;
    std::vector<uint8_t> w = testing::RandomQuantBlocks(DType::kQ8_0, int64_t{n} * k, 0.05f, rng_);
    std::vector<float> wide(size_t(n) * k);
    DequantizeRow(DType::kQ8_0, w.data(), wide.data(), int64_t{n} * k);
    const MatrixRef packed = backend_->PrepareWeights({w.data(), DType::kQ8_0}, n, k);
    ASSERT_EQ(packed.dtype, DType::kQ8_0R16);
    for (const int m : {1, 2, 3, 4, 5, 8, 11, 15, 16, 32, 33, 40}) {
      std::vector<float> x = RandomFloats(size_t(m) * k, -2.0f, 2.0f, rng_);
      for (size_t i = 0; i < x.size(); i += 7) x[i] = 8 * x[i] * x[i] * x[i];  // heavy tails
      const std::vector<float> base = RandomFloats(size_t(m) * ldo, -1.0f, 1.0f, rng_);
      std::vector<float> out = base;
      backend_->MatMulColumns(x.data(), packed, out.data(), ldo, m, n, k, true);
      const bool bf16 = m > cpu::kQuantMatMulMaxRows && cpu::DotBf16Supported();
      for (int r = 0; r < m; ++r) {
        // Half a step of each 32 values' activation scale, per weight.
        std::vector<double> step(k / 32);
        for (int b = 0; b < k / 32; ++b) {
          double amax = 0;
          for (int i = 0; i < 32; ++i)
            amax = std::max(amax, std::fabs(double(x[r * k + 32 * b + i])));
          step[b] = amax / 127 / 2;
        }
        for (int j = 0; j < ldo; ++j) {
          if (j >= n) {
            ASSERT_EQ(out[r * ldo + j], base[r * ldo + j]) << "gap";
            continue;
          }
          double want = base[r * ldo + j], bound = 0, magnitude = 0;
          for (int i = 0; i < k; ++i) {
            const double wv = wide[size_t(j) * k + i];
            want += wv * x[r * k + i];
            bound += std::fabs(wv) * step[i / 32];
            magnitude += std::fabs(wv * x[r * k + i]);
          }
          if (bf16) bound = magnitude / 256;
          ASSERT_LE(std::fabs(out[r * ldo + j] - want), bound * 1.001 + 1e-5 * magnitude + 1e-6)
              << "k " << k << " m " << m << " row " << r << " column " << j;
        }
      }
    }
  }
}

// A product over the first rows of a repacked matrix, not a whole number
// of its groups, reads those rows only (the repacked kernel writes whole
// groups of 16 columns).
TEST_F(QuantRepackTest, FirstRowsOfARepackedMatrix) {
  if (!cpu::QuantMatMulSupported()) GTEST_SKIP() << "no AVX512-VNNI: Q8_0 is not repacked";
  const int n = 32, k = 64, m = 3, used = 20;
  std::vector<uint8_t> w = testing::RandomQuantBlocks(DType::kQ8_0, int64_t{n} * k, 0.05f, rng_);
  std::vector<float> wide(size_t(n) * k);
  DequantizeRow(DType::kQ8_0, w.data(), wide.data(), int64_t{n} * k);
  const MatrixRef packed = backend_->PrepareWeights({w.data(), DType::kQ8_0}, n, k);
  ASSERT_EQ(packed.dtype, DType::kQ8_0R16);
  const std::vector<float> x = RandomFloats(size_t(m) * k, -1.0f, 1.0f, rng_);
  std::vector<float> out(size_t(m) * used + 1, testing::kGuard);
  backend_->MatMul(x.data(), packed, out.data(), m, used, k, false);
  EXPECT_EQ(out.back(), testing::kGuard);
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < used; ++j) {
      double want = 0;
      for (int i = 0; i < k; ++i) want += double(wide[size_t(j) * k + i]) * x[r * k + i];
      EXPECT_NEAR(out[r * used + j], want, 1e-4) << "row " << r << " column " << j;
    }
  }
}

TEST_F(QuantRepackTest, EmbedsRowsOfTheRepackedTable) {
  if (!cpu::QuantMatMulSupported()) GTEST_SKIP() << "no AVX512-VNNI: Q8_0 is not repacked";
  const int n = 32, k = 128;
  std::vector<uint8_t> w = testing::RandomQuantBlocks(DType::kQ8_0, int64_t{n} * k, 0.05f, rng_);
  std::vector<float> wide(size_t(n) * k);
  DequantizeRow(DType::kQ8_0, w.data(), wide.data(), int64_t{n} * k);
  const MatrixRef packed = backend_->PrepareWeights({w.data(), DType::kQ8_0}, n, k);
  ASSERT_EQ(packed.dtype, DType::kQ8_0R16);
  const std::vector<int32_t> ids = {31, 0, 17, 16, 5};
  std::vector<float> out(ids.size() * k);
  backend_->Embed(packed, ids, k, out.data());
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int i = 0; i < k; ++i) ASSERT_EQ(out[r * k + i], wide[size_t(ids[r]) * k + i]);
  }
}

}  // namespace
}  // namespace tandem
