// The batch-independence contract of cpu/small_matmul.h: a row's result does
// not depend on the other rows of its batch, nor on how callers split the
// output columns among threads. Decode relies on it to give a sequence the
// same tokens whatever else is batched with it.
#include "common/compute/cpu/small_matmul.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool SameBits(const float* a, const float* b, int n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

class SmallMatMulTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::SmallMatMulSupported()) GTEST_SKIP() << "no AVX-512F: the small-m path is off";
  }
  std::mt19937_64 rng_{77};
};

// Each of 32 rows, computed again in batches of 2 to 31 rows (the others
// random, the row at a random place), must come out bit for bit as in the
// batch of 32. The batch of 32 is big enough to be split among threads, the
// small ones mostly not; 3 threads split the columns differently from all
// cores.
TEST_F(SmallMatMulTest, RowResultDoesNotDependOnBatch) {
  constexpr int kFull = cpu::kSmallMatMulMaxRows;
  for (int threads : {0, 3}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuBackend> backend,
                         CpuBackend::Create({.num_threads = threads}));
    for (const auto& [n, k] : {std::pair{101, 172}, std::pair{64, 515}, std::pair{7, 16}}) {
      SCOPED_TRACE(::testing::Message() << "threads=" << threads << " n=" << n << " k=" << k);
      const std::vector<float> x = RandomFloats(size_t(kFull) * k, rng_);
      const std::vector<float> w = RandomFloats(size_t(n) * k, rng_);
      std::vector<float> full(size_t(kFull) * n);
      backend->MatMul(x.data(), w.data(), full.data(), kFull, n, k, /*accumulate=*/false);

      for (int m : {2, 3, 5, 17, 31}) {
        for (int row = 0; row < kFull; ++row) {
          std::vector<float> batch = RandomFloats(size_t(m) * k, rng_);
          const int at = static_cast<int>(rng_() % m);
          std::memcpy(batch.data() + size_t(at) * k, x.data() + size_t(row) * k, k * sizeof(float));
          std::vector<float> out(size_t(m) * n);
          backend->MatMul(batch.data(), w.data(), out.data(), m, n, k, /*accumulate=*/false);
          ASSERT_TRUE(SameBits(out.data() + size_t(at) * n, full.data() + size_t(row) * n, n))
              << "row " << row << " at " << at << " of a batch of " << m;
        }
      }
    }
  }
}

// Column ranges computed separately, split anywhere, equal one call over all
// columns, and each call writes only its own columns.
TEST_F(SmallMatMulTest, ColumnSplitsAreExactAndDisjoint) {
  constexpr int m = 6, n = 23, k = 37;
  const std::vector<float> x = RandomFloats(size_t(m) * k, rng_);
  const std::vector<float> w = RandomFloats(size_t(n) * k, rng_);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Floats past the last row, which no call may touch.
  constexpr int kTail = 4;
  const size_t size = size_t(m) * n;
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "accumulate=" << accumulate);
    const std::vector<float> before = RandomFloats(size + kTail, rng_);
    std::vector<float> whole = before;
    cpu::SmallMatMul(x.data(), w.data(), whole.data(), m, n, k, accumulate, 0, n);
    ASSERT_TRUE(SameBits(&whole[size], &before[size], kTail)) << "written past the output";
    for (int split : {1, 4, 5, 8, 22}) {
      std::vector<float> left = before;
      if (!accumulate) std::fill_n(left.begin(), size, nan);
      const std::vector<float> left_before = left;
      cpu::SmallMatMul(x.data(), w.data(), left.data(), m, n, k, accumulate, 0, split);
      for (int i = 0; i < m; ++i) {
        const size_t row = size_t(i) * n;
        ASSERT_TRUE(SameBits(&left[row + split], &left_before[row + split], n - split))
            << "row " << i << ": a column outside [0, " << split << ") was written";
      }
      ASSERT_TRUE(SameBits(&left[size], &left_before[size], kTail)) << "written past the output";
      std::vector<float> pieces = before;
      cpu::SmallMatMul(x.data(), w.data(), pieces.data(), m, n, k, accumulate, 0, split);
      cpu::SmallMatMul(x.data(), w.data(), pieces.data(), m, n, k, accumulate, split, n);
      EXPECT_TRUE(SameBits(pieces.data(), whole.data(), size + kTail)) << "split at " << split;
    }
  }
}

}  // namespace
}  // namespace tandem
