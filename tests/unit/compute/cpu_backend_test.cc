// The CPU backend's operations against naive float64 loops on random inputs.
// Outputs are poisoned before each call (NaN, or known values where the
// operation adds to them) so that an element the backend fails to write, or
// writes twice, shows up.
#include "common/compute/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::CosSinTable;
using ::tandem::testing::kGuard;
using ::tandem::testing::kNaN;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::WorstError;

// Parameter: the backend's thread count; 0 is every core, 3 and 7 split the
// work unevenly (and oversubscribe small machines, which is harmless here).
class CpuBackendTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(backend_, CpuBackend::Create({.num_threads = GetParam()}));
  }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937_64 rng_{20240611};
};

// Error metric: |out - exact| / (|out_before| + sum_k |x_k * w_k|) per
// element, the componentwise bound a float dot product obeys (plain
// |out - exact| / |exact| is meaningless where terms cancel to near zero).
// `offset` shifts every pointer by one float so no 64-byte alignment holds.
void CheckMatMul(CpuBackend& backend, int m, int n, int k, bool accumulate, int offset,
                 std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k
                                    << " accumulate=" << accumulate << " offset=" << offset);
  const std::vector<float> x = RandomFloats(size_t(m) * k + offset, -1.0f, 1.0f, rng);
  const std::vector<float> w = RandomFloats(size_t(n) * k + offset, -1.0f, 1.0f, rng);
  const std::vector<float> before = RandomFloats(size_t(m) * n, -2.0f, 2.0f, rng);
  constexpr int kTail = 16;
  std::vector<float> out(offset + size_t(m) * n + kTail, kGuard);
  for (size_t i = 0; i < before.size(); ++i) out[offset + i] = accumulate ? before[i] : kNaN;

  backend.MatMul(x.data() + offset, w.data() + offset, out.data() + offset, m, n, k, accumulate);

  WorstError worst;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double exact = accumulate ? before[size_t(i) * n + j] : 0.0;
      double magnitude = std::abs(exact);
      for (int t = 0; t < k; ++t) {
        const double p = double{x[offset + size_t(i) * k + t]} * w[offset + size_t(j) * k + t];
        exact += p;
        magnitude += std::abs(p);
      }
      worst.Add(std::abs(out[offset + size_t(i) * n + j] - exact) / magnitude);
    }
  }
  EXPECT_LE(worst.value, 1e-5);
  for (int i = 0; i < offset; ++i) EXPECT_EQ(out[i], kGuard) << "written before out";
  for (int i = 0; i < kTail; ++i) EXPECT_EQ(out[out.size() - 1 - i], kGuard) << "written past out";
}

// m = 1 is the BLAS gemv path, 1 < m <= 32 the small-m kernel where the CPU
// has AVX-512 (cpu/small_matmul.h), larger m BLAS sgemm. n and k include
// values that are not multiples of the kernel's 4-wide tiles or 16 lanes.
// A worker creates its backend on one thread and steps it on another; the
// thread count asked for must hold there too (OpenBLAS reads it per thread).
TEST(CpuBackend, RefusesThreadCountsOutsideItsBound) {
  for (int threads : {-1, kMaxCpuThreads + 1, 65536}) {
    EXPECT_THAT(CpuBackend::Create({.num_threads = threads}),
                ::tandem::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                            ::testing::HasSubstr("give 0 (every core) to 1024")))
        << threads;
  }
  EXPECT_OK(CpuBackend::Create({.num_threads = 3}).status());
}

TEST(CpuBackend, KeepsItsThreadCountOnOtherThreads) {
  ASSERT_OK_AND_ASSIGN(auto backend, CpuBackend::Create(CpuBackendOptions{.num_threads = 1}));
  int threads_after = -1;
  std::thread other([&] {
    std::vector<float> x(64 * 64, 1.0f), w(64 * 64, 1.0f), out(64 * 64);
    backend->MatMul(x.data(), w.data(), out.data(), 64, 64, 64, false);
    threads_after = omp_get_max_threads();
  });
  other.join();
  EXPECT_EQ(threads_after, 1);
}

TEST_P(CpuBackendTest, MatMulMatchesNaiveProduct) {
  const int ms[] = {1, 2, 3, 4, 5, 17, 32, 33, 100};
  const struct {
    int n, k;
  } shapes[] = {{101, 172}, {1, 7}, {4, 16}, {7, 7}, {16, 1}, {33, 17}, {64, 515}, {250, 33}};
  for (int m : ms) {
    for (const auto& s : shapes) {
      for (bool accumulate : {false, true}) {
        for (int offset : {0, 1}) CheckMatMul(*backend_, m, s.n, s.k, accumulate, offset, rng_);
      }
    }
  }
}

TEST_P(CpuBackendTest, RmsNormMatchesNaive) {
  // Inputs of size 1e-3 make eps (1e-5) dominate the mean square.
  const struct {
    int rows, dim;
    float eps, x_scale;
  } cases[] = {{1, 1, 1e-5f, 2},    {3, 7, 1e-6f, 2},     {2, 64, 1e-5f, 2},
               {5, 4097, 1e-5f, 2}, {40, 1000, 1e-6f, 2}, {4, 33, 1e-5f, 1e-3f}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "rows=" << c.rows << " dim=" << c.dim << " x_scale=" << c.x_scale);
    const std::vector<float> x = RandomFloats(size_t(c.rows) * c.dim, -c.x_scale, c.x_scale, rng_);
    const std::vector<float> weight = RandomFloats(c.dim, -1.5f, 1.5f, rng_);
    std::vector<float> out(x.size() + 1, kNaN);
    out.back() = kGuard;
    backend_->RmsNorm(x.data(), weight.data(), out.data(), c.rows, c.dim, c.eps);

    // Metric: |out - exact| / |exact| per element (no input is zero, and the
    // operation is a scaling, so there is no cancellation).
    WorstError worst;
    for (int r = 0; r < c.rows; ++r) {
      const float* xr = x.data() + size_t(r) * c.dim;
      double ss = 0.0;
      for (int i = 0; i < c.dim; ++i) ss += double{xr[i]} * xr[i];
      const double scale = 1.0 / std::sqrt(ss / c.dim + c.eps);
      for (int i = 0; i < c.dim; ++i) {
        const double exact = xr[i] * scale * weight[i];
        worst.Add(std::abs(out[size_t(r) * c.dim + i] - exact) / std::abs(exact));
      }
    }
    EXPECT_LE(worst.value, 1e-5);
    EXPECT_EQ(out.back(), kGuard);
  }
}

// The q/k norms: groups of head_dim values inside rows of a wider stride,
// normalised in place; what lies between the rows' groups is untouched.
TEST_P(CpuBackendTest, RmsNormHeadsNormalisesEachGroupInPlace) {
  const struct {
    int rows, heads, head_dim, stride;
  } cases[] = {{1, 1, 8, 8}, {3, 4, 16, 80}, {7, 2, 128, 300}, {2, 1, 96, 96}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " heads=" << c.heads
                                      << " head_dim=" << c.head_dim << " stride=" << c.stride);
    const std::vector<float> x = RandomFloats(size_t(c.rows) * c.stride, -2, 2, rng_);
    const std::vector<float> weight = RandomFloats(c.head_dim, 0.5f, 1.5f, rng_);
    std::vector<float> y = x;
    backend_->RmsNormHeads(y.data(), c.stride, weight.data(), c.rows, c.heads, c.head_dim, 1e-6f);
    WorstError worst;
    for (int r = 0; r < c.rows; ++r) {
      for (int at = 0; at < c.stride; ++at) {
        const size_t i = size_t(r) * c.stride + at;
        if (at >= c.heads * c.head_dim) {
          EXPECT_EQ(y[i], x[i]) << "outside the groups, at " << at;
          continue;
        }
        const float* g = x.data() + size_t(r) * c.stride + at / c.head_dim * c.head_dim;
        double ss = 0.0;
        for (int j = 0; j < c.head_dim; ++j) ss += double{g[j]} * g[j];
        const double exact = x[i] / std::sqrt(ss / c.head_dim + 1e-6) * weight[at % c.head_dim];
        worst.Add(std::abs(y[i] - exact) / std::abs(exact));
      }
    }
    EXPECT_LE(worst.value, 1e-5);
  }
}

TEST_P(CpuBackendTest, SwiGluMatchesNaive) {
  const struct { int rows, hidden; } cases[] = {{1, 1}, {3, 7}, {2, 64}, {33, 1000}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " hidden=" << c.hidden);
    // Gates span silu's negative tail and its near-linear range.
    const std::vector<float> gate_up = RandomFloats(size_t(c.rows) * 2 * c.hidden, -30, 30, rng_);
    std::vector<float> out(size_t(c.rows) * c.hidden + 1, kNaN);
    out.back() = kGuard;
    backend_->SwiGlu(gate_up.data(), out.data(), c.rows, c.hidden);

    // Metric: |out - exact| / |exact| per element.
    WorstError worst;
    for (int r = 0; r < c.rows; ++r) {
      const float* gate = gate_up.data() + size_t(r) * 2 * c.hidden;
      const float* up = gate + c.hidden;
      for (int i = 0; i < c.hidden; ++i) {
        const double g = gate[i];
        const double exact = g / (1.0 + std::exp(-g)) * up[i];
        worst.Add(std::abs(out[size_t(r) * c.hidden + i] - exact) / std::abs(exact));
      }
    }
    EXPECT_LE(worst.value, 1e-5);
    EXPECT_EQ(out.back(), kGuard);
  }
}

// The table layout of backend.h: [max_position][head_dim / 2][cos, sin].
TEST_P(CpuBackendTest, RopeRotatesPairsByTablePosition) {
  const AttentionShape shapes[] = {{4, 2, 8}, {8, 1, 64}, {6, 6, 48}};
  constexpr int kMaxPosition = 300;
  for (const AttentionShape& shape : shapes) {
    SCOPED_TRACE(::testing::Message() << "heads=" << shape.n_heads << "/" << shape.n_kv_heads
                                      << " head_dim=" << shape.head_dim);
    const std::vector<float> table = CosSinTable(kMaxPosition, shape.head_dim, 10000.0);
    // Strides wider than the heads, as in a fused QKV buffer; the gaps hold
    // guards the rotation must not touch.
    const int q_width = shape.n_heads * shape.head_dim, q_stride = q_width + 5;
    const int k_width = shape.n_kv_heads * shape.head_dim, k_stride = k_width + 3;
    std::vector<int32_t> positions = {0, 1, kMaxPosition - 1, 17, 17, 250};
    for (int i = 0; i < 294; ++i) positions.push_back(static_cast<int32_t>(rng_() % kMaxPosition));
    const size_t rows = positions.size();
    std::vector<float> q = RandomFloats(rows * q_stride, -2, 2, rng_);
    std::vector<float> k = RandomFloats(rows * k_stride, -2, 2, rng_);
    for (size_t r = 0; r < rows; ++r) {
      for (int i = q_width; i < q_stride; ++i) q[r * q_stride + i] = kGuard;
      for (int i = k_width; i < k_stride; ++i) k[r * k_stride + i] = kGuard;
    }
    const std::vector<float> q0 = q, k0 = k;
    backend_->Rope(q.data(), q_stride, k.data(), k_stride, positions, shape, table.data());

    // Metric: |out - exact| / |(a, b)| per element of each rotated pair (a,
    // b): a rotation's output element can be near zero by cancellation.
    WorstError worst;
    auto check = [&](const std::vector<float>& before, const std::vector<float>& after, int stride,
                     int width) {
      for (size_t r = 0; r < rows; ++r) {
        const float* cs = table.data() + size_t(positions[r]) * shape.head_dim;
        for (int e = 0; e < width; e += 2) {
          const int i = (e % shape.head_dim) / 2;
          const double a = before[r * stride + e], b = before[r * stride + e + 1];
          const double c = cs[2 * i], s = cs[2 * i + 1];
          const double norm = std::hypot(a, b);
          worst.Add(std::abs(after[r * stride + e] - (a * c - b * s)) / norm);
          worst.Add(std::abs(after[r * stride + e + 1] - (a * s + b * c)) / norm);
        }
        for (int e = width; e < stride; ++e) ASSERT_EQ(after[r * stride + e], kGuard);
      }
    };
    check(q0, q, q_stride, q_width);
    check(k0, k, k_stride, k_width);
    EXPECT_LE(worst.value, 1e-6);
  }
}

TEST_P(CpuBackendTest, EmbedCopiesTableRows) {
  constexpr int kVocab = 50, kDim = 37;
  const std::vector<float> table = RandomFloats(kVocab * kDim, -1, 1, rng_);
  const std::vector<int32_t> ids = {0, kVocab - 1, 3, 3, 17};
  std::vector<float> out(ids.size() * kDim + 1, kNaN);
  out.back() = kGuard;
  backend_->Embed(table.data(), ids, kDim, out.data());
  for (size_t r = 0; r < ids.size(); ++r) {
    EXPECT_EQ(std::memcmp(out.data() + r * kDim, table.data() + size_t(ids[r]) * kDim,
                          kDim * sizeof(float)),
              0)
        << "row " << r;
  }
  EXPECT_EQ(out.back(), kGuard);

  // No ids: nothing is written.
  std::vector<float> untouched(4, kGuard);
  backend_->Embed(table.data(), {}, kDim, untouched.data());
  EXPECT_EQ(untouched, std::vector<float>(4, kGuard));
}

// WriteKv places each row's key and value where the documented layout
// cache[layer][block] = {K[kv_dim][block_size], V[block_size][kv_dim]} says,
// and writes nothing else.
TEST_P(CpuBackendTest, WriteKvFillsExactlyTheRowsSlots) {
  KvLayout layout;
  layout.n_layers = 2;
  layout.num_blocks = 12;
  layout.block_size = 4;
  layout.kv_dim = 12;
  const std::vector<int32_t> blocks_a = {7, 2, 9}, blocks_b = {0, 11, 5};
  const std::vector<AttentionRow> rows = {{0, blocks_a}, {5, blocks_a}, {11, blocks_a},
                                          {3, blocks_b}, {4, blocks_a}, {8, blocks_b},
                                          {6, blocks_b}};
  // K and V are columns of a fused [rows, q | k | v] buffer.
  const int q_dim = 20, stride = q_dim + 2 * layout.kv_dim;
  const std::vector<float> qkv = RandomFloats(rows.size() * stride, -1, 1, rng_);
  std::vector<float> cache(layout.total_elements(), kNaN);
  const int layer = 1;
  backend_->WriteKv(qkv.data() + q_dim, stride, qkv.data() + q_dim + layout.kv_dim, stride, rows,
                    layer, layout, cache.data());

  size_t written = 0;
  for (float f : cache) written += !std::isnan(f);
  EXPECT_EQ(written, rows.size() * 2 * layout.kv_dim);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int pos = rows[r].position;
    const size_t block = rows[r].blocks[pos / layout.block_size];
    const size_t slot = pos % layout.block_size;
    const size_t block_start =
        (layer * layout.num_blocks + block) * 2 * layout.block_size * layout.kv_dim;
    const float* key = qkv.data() + r * stride + q_dim;
    for (int d = 0; d < layout.kv_dim; ++d) {
      EXPECT_EQ(cache[block_start + d * layout.block_size + slot], key[d])
          << "row " << r << " key dim " << d;
    }
    const size_t value_at =
        block_start + (layout.block_size + slot) * static_cast<size_t>(layout.kv_dim);
    EXPECT_EQ(
        std::memcmp(cache.data() + value_at, key + layout.kv_dim, layout.kv_dim * sizeof(float)), 0)
        << "row " << r << " value";
  }
}

// The largest of each row, the lowest index among equals, a number before
// NaN, 0 for a row of NaN.
TEST_P(CpuBackendTest, ArgmaxPicksTheLowestIndexOfTheLargest) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {{1, 3, 3, 2},
                                                {kNaN, -1, kNaN, -0.5f},
                                                {-kInf, -kInf, -kInf, -kInf},
                                                {kNaN, kNaN, kNaN, kNaN},
                                                {0, -0.0f, 0, 5}};
  const std::vector<int32_t> expected = {1, 3, 0, 0, 3};
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  std::vector<int32_t> out(rows.size(), -1);
  backend_->Argmax(flat.data(), static_cast<int>(rows.size()), 4, out.data());
  EXPECT_EQ(out, expected);

  const std::vector<float> wide = RandomFloats(3 * 1001, -4, 4, rng_);
  backend_->Argmax(wide.data(), 3, 1001, out.data());
  for (int r = 0; r < 3; ++r) {
    const auto row = wide.begin() + r * 1001;
    EXPECT_EQ(out[r], std::max_element(row, row + 1001) - row);
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuBackendTest, ::testing::Values(0, 3, 7),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "threads" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace tandem
