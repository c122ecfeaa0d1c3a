// The CPU backend's multi-head latent attention (DeepSeek V2/V3) against
// the test's own float64 attention written from the definition: each
// head's key [W_uk[h] c, rope key] and value W_uv[h] c expanded for every
// cached position, over the latents the cache holds (read back by the test
// from the offsets kv_layout.h documents). Both forms (absorbed and
// expanded) and the per-run choice between them, for a prefill chunk, a
// chunk after a cached prefix, decode rows of three sequences and a mixed
// batch, on every KV type; blocks out of order, query rows with gaps full of
// NaN, and guards past the output.
//
// Tolerance: the backend sums in f32 (BLAS) where the reference sums in
// float64; with values in [-1, 1] the outputs moved by under 1e-6 of their
// largest element (observed): 1e-5. The forms compare to each other at the
// same bound.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cpu/cpu_kernels.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::kGuard;
using ::tandem::testing::kNaN;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::RelativeRowError;

constexpr int kLatentLayer = 1;  // of two: offsets must include the layer
constexpr int kHeads = 4, kRank = 32, kNope = 16, kRope = 8, kV = 12;
constexpr int kLatentDim = kRank + kRope;
constexpr int kQWidth = kHeads * (kNope + kRope);
constexpr int kQStride = kQWidth + 5;  // a gap of NaN after each row

LatentShape LatentOf(LatentShape::Form form) {
  return LatentShape{.n_heads = kHeads,
                     .kv_rank = kRank,
                     .nope_dim = kNope,
                     .rope_dim = kRope,
                     .v_dim = kV,
                     .scale = 1.3f / std::sqrt(float{kNope + kRope}),
                     .form = form};
}

// Element d of the latent slot of position t as the cache holds it.
double CachedLatent(const std::vector<uint8_t>& cache, const KvLayout& layout,
                    std::span<const int32_t> blocks, int t, int d) {
  const int32_t block = blocks[t / layout.block_size];
  const int slot = t % layout.block_size;
  const uint8_t* at =
      cache.data() + layout.KeyOffset(kLatentLayer, block, slot, d) * layout.element_bytes();
  if (layout.dtype == DType::kI8) {
    float scale;
    std::memcpy(&scale,
                cache.data() + layout.KeyScaleOffset(kLatentLayer, block, 0) + slot * sizeof(float),
                sizeof(scale));
    return static_cast<int8_t>(*at) * double{scale};
  }
  float value;
  cpu::Widen(at, layout.dtype, &value, 1);
  return value;
}

// The float64 attention of one row, expanded from the definition.
std::vector<double> LatentReference(const float* q, const std::vector<float>& kv_b,
                                    const std::vector<uint8_t>& cache, const KvLayout& layout,
                                    const AttentionRow& row) {
  const LatentShape s = LatentOf(LatentShape::Form::kExpanded);
  const int ctx = row.position + 1, up = kNope + kV;
  std::vector<double> out(kHeads * kV, 0.0), scores(ctx);
  std::vector<std::vector<double>> c(ctx, std::vector<double>(kLatentDim));
  for (int t = 0; t < ctx; ++t) {
    for (int d = 0; d < kLatentDim; ++d) c[t][d] = CachedLatent(cache, layout, row.blocks, t, d);
  }
  auto up_row = [&](int h, int i, const std::vector<double>& latent) {
    double sum = 0.0;
    for (int j = 0; j < kRank; ++j)
      sum += double{kv_b[(size_t(h) * up + i) * kRank + j]} * latent[j];
    return sum;
  };
  for (int h = 0; h < kHeads; ++h) {
    const float* q_nope = q + h * kNope;
    const float* q_rope = q + kHeads * kNope + h * kRope;
    for (int t = 0; t < ctx; ++t) {
      double dot = 0.0;
      for (int i = 0; i < kNope; ++i) dot += q_nope[i] * up_row(h, i, c[t]);
      for (int i = 0; i < kRope; ++i) dot += q_rope[i] * c[t][kRank + i];
      scores[t] = dot * s.scale;
    }
    const double max = *std::max_element(scores.begin(), scores.end());
    double sum = 0.0;
    for (double& x : scores) sum += (x = std::exp(x - max));
    for (int t = 0; t < ctx; ++t) {
      for (int i = 0; i < kV; ++i) out[h * kV + i] += scores[t] / sum * up_row(h, kNope + i, c[t]);
    }
  }
  return out;
}

class LatentAttentionTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(backend_, CpuBackend::Create(CpuBackendOptions{.num_threads = 2}));
    layout_ = KvLayout{.n_layers = 2,
                       .num_blocks = 8,
                       .block_size = 16,
                       .kv_dim = kLatentDim,
                       .dtype = GetParam(),
                       .kv_heads = 1,
                       .latent = true};
    cache_.assign(layout_.total_bytes(), 0);
    std::mt19937_64 rng(17);
    kv_b_ = RandomFloats(size_t(kHeads) * (kNope + kV) * kRank, -0.5f, 0.5f, rng);
    // Three sequences, their blocks out of order: 45, 7 and 20 positions.
    lengths_ = {45, 7, 20};
    blocks_ = {{5, 0, 3}, {7}, {2, 6}};
    for (int s = 0; s < 3; ++s) {
      std::vector<AttentionRow> rows;
      for (int t = 0; t < lengths_[s]; ++t) rows.push_back({t, blocks_[s]});
      const std::vector<float> latents = RandomFloats(rows.size() * kLatentDim, -1.0f, 1.0f, rng);
      backend_->WriteKv(latents.data(), kLatentDim, nullptr, 0, rows, kLatentLayer, layout_,
                        cache_.data());
    }
  }

  // Attention of `rows` in each form: every one within tolerance of the
  // reference and of each other.
  void Check(const std::vector<AttentionRow>& rows) {
    std::mt19937_64 rng(rows.size() * 31 + rows[0].position);
    std::vector<float> q(rows.size() * kQStride, kNaN);
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<float> row = RandomFloats(kQWidth, -1.0f, 1.0f, rng);
      std::copy(row.begin(), row.end(), q.begin() + r * kQStride);
    }
    std::vector<std::vector<float>> outs;
    for (const auto form : {LatentShape::Form::kAbsorbed, LatentShape::Form::kExpanded,
                            LatentShape::Form::kCheaper}) {
      SCOPED_TRACE(static_cast<int>(form));
      std::vector<float> out(rows.size() * kHeads * kV + 8, kGuard);
      backend_->LatentAttention(q.data(), kQStride, rows, kLatentLayer, layout_, cache_.data(),
                                LatentOf(form), kv_b_.data(), out.data());
      for (size_t i = rows.size() * kHeads * kV; i < out.size(); ++i) ASSERT_EQ(out[i], kGuard);
      double worst = 0.0;
      for (size_t r = 0; r < rows.size(); ++r) {
        const std::vector<double> want =
            LatentReference(q.data() + r * kQStride, kv_b_, cache_, layout_, rows[r]);
        const double e = RelativeRowError(out.data() + r * kHeads * kV, want);
        if (!(e <= worst)) worst = e;
      }
      EXPECT_LT(worst, 1e-5);
      outs.push_back(std::move(out));
    }
    for (size_t i = 0; i < rows.size() * kHeads * kV; ++i) {
      ASSERT_NEAR(outs[0][i], outs[1][i], 1e-5) << "absorbed against expanded at " << i;
      ASSERT_NEAR(outs[0][i], outs[2][i], 1e-5) << "absorbed against the cheaper at " << i;
    }
  }

  std::vector<AttentionRow> Run(int s, int first, int end) const {
    std::vector<AttentionRow> rows;
    for (int t = first; t < end; ++t) rows.push_back({t, blocks_[s]});
    return rows;
  }

  std::unique_ptr<CpuBackend> backend_;
  KvLayout layout_;
  std::vector<uint8_t> cache_;
  std::vector<float> kv_b_;
  std::vector<int> lengths_;
  std::vector<std::vector<int32_t>> blocks_;
};

TEST_P(LatentAttentionTest, PrefillChunkFromTheStart) { Check(Run(0, 0, 45)); }

TEST_P(LatentAttentionTest, ChunkAfterACachedPrefix) { Check(Run(0, 30, 45)); }

TEST_P(LatentAttentionTest, DecodeRowsOfThreeSequences) {
  Check({{44, blocks_[0]}, {6, blocks_[1]}, {19, blocks_[2]}});
}

TEST_P(LatentAttentionTest, MixedBatch) {
  std::vector<AttentionRow> rows = Run(0, 40, 45);
  rows.push_back({6, blocks_[1]});
  for (const AttentionRow& row : Run(2, 0, 20)) rows.push_back(row);
  Check(rows);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, LatentAttentionTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kI8),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// A latent slot is one vector of kv_dim and, in int8, one scale: the
// latent's largest magnitude over 127, where kv_layout.h puts it; nothing
// is written past the block's keys and scales.
TEST(LatentKvWrite, Int8KeepsOneScaleASlotAndNoValues) {
  ASSERT_OK_AND_ASSIGN(auto backend, CpuBackend::Create(CpuBackendOptions{.num_threads = 1}));
  const KvLayout layout{.n_layers = 2,
                        .num_blocks = 3,
                        .block_size = 4,
                        .kv_dim = kLatentDim,
                        .dtype = DType::kI8,
                        .kv_heads = 1,
                        .latent = true};
  ASSERT_EQ(layout.block_bytes(), size_t{4} * kLatentDim + 4 * sizeof(float));
  std::vector<uint8_t> cache(layout.total_bytes(), 0xa5);
  std::vector<float> latent(kLatentDim);
  for (int d = 0; d < kLatentDim; ++d) latent[d] = (d % 7 - 3) * 0.25f;
  latent[kRank + 2] = -2.54f;  // the largest magnitude sits in the rope key
  const int32_t blocks[] = {2, 1};
  const AttentionRow row{5, blocks};  // slot 1 of block 1
  backend->WriteKv(latent.data(), kLatentDim, nullptr, 0, {&row, 1}, kLatentLayer, layout,
                   cache.data());
  float scale;
  std::memcpy(&scale, cache.data() + layout.KeyScaleOffset(kLatentLayer, 1, 0) + sizeof(float),
              sizeof(scale));
  EXPECT_FLOAT_EQ(scale, 0.02f);
  for (int d = 0; d < kLatentDim; ++d) {
    const auto byte = static_cast<int8_t>(cache[layout.KeyOffset(kLatentLayer, 1, 1, d)]);
    EXPECT_NEAR(byte * scale, latent[d], scale / 2 + 1e-6f) << d;
  }
  // Every byte but the slot's kv_dim keys and its scale is untouched.
  size_t changed = 0;
  for (uint8_t b : cache) changed += b != 0xa5;
  EXPECT_LE(changed, size_t{kLatentDim} + sizeof(float));
  EXPECT_GE(changed, size_t{kLatentDim} / 2);
}

}  // namespace
}  // namespace tandem
