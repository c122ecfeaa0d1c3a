// The CPU backend with an int8 KV cache: QuantizeInt8 on hand-worked
// values, WriteKv's bytes and scales where kv_layout.h documents them, and
// PagedAttention against the test's own float64 attention over the values
// the cache holds (each byte times its token's and head's scale, read back
// by the test from the documented offsets), so that a kernel that applies
// a scale to the wrong slot, head or block cannot pass.
//
// Tolerances, and why:
// - Against attention over the dequantized values: f32 accuracy, 1e-5 of
//   the output's largest element (as for the 16-bit caches).
// - Against the unrounded keys and values: each value moves by at most half
//   a step, 1/254 of its head's largest magnitude; with keys and values in
//   [-1, 1] and queries in [-2, 2] the output moved by up to 8.1e-3
//   (observed) of its largest element: 2e-2.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <tuple>
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

constexpr int kLayer = 1;  // of two: offsets must include the layer
constexpr uint8_t kSentinel = 0xa5;

TEST(QuantizeInt8, RoundsToNearestEvenStepsOfTheLargestMagnitude) {
  // Largest magnitude 1.27: scale 0.01. -0.635 is -63.5 steps (ties to even:
  // -64), 0.005 half a step (0), 0.015 one and a half (2), 0.3 thirty.
  const float src[6] = {1.27f, -0.635f, 0.005f, 0.015f, 0.3f, 0.0f};
  int8_t dst[12];
  std::memset(dst, 0x11, sizeof(dst));
  float scale = 0.0f;
  cpu::QuantizeInt8(src, 6, dst, 2, &scale);
  EXPECT_FLOAT_EQ(scale, 0.01f);
  const int8_t want[6] = {127, -64, 0, 2, 30, 0};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(dst[2 * i], want[i]) << "value " << i;
    EXPECT_EQ(dst[2 * i + 1], 0x11) << "the stride's gap " << i << " was written";
  }
  // The largest magnitude may be negative, and maps to -127.
  const float negative[2] = {-2.54f, 1.0f};
  cpu::QuantizeInt8(negative, 2, dst, 1, &scale);
  EXPECT_FLOAT_EQ(scale, 0.02f);
  EXPECT_EQ(dst[0], -127);
  EXPECT_EQ(dst[1], 50);
}

TEST(QuantizeInt8, ZerosKeepAZeroScaleAndNonFiniteValuesReadNaN) {
  const float zeros[4] = {0.0f, -0.0f, 0.0f, 0.0f};
  int8_t dst[4] = {1, 1, 1, 1};
  float scale = 1.0f;
  cpu::QuantizeInt8(zeros, 4, dst, 1, &scale);
  EXPECT_EQ(scale, 0.0f);
  for (int8_t b : dst) EXPECT_EQ(b, 0);
  const float poisoned[3] = {1.0f, kNaN, 2.0f};
  cpu::QuantizeInt8(poisoned, 3, dst, 1, &scale);
  EXPECT_TRUE(std::isnan(scale));
  const float infinite[2] = {1.0f, -INFINITY};
  cpu::QuantizeInt8(infinite, 2, dst, 1, &scale);
  EXPECT_TRUE(std::isnan(scale));
  // Largest magnitude below 127 / FLT_MAX: an infinite inverse, zeros stay
  // 0 (not 0 times infinity) and the rest saturate.
  const float tiny[4] = {1e-38f, 0.0f, -1e-38f, 5e-39f};
  cpu::QuantizeInt8(tiny, 4, dst, 1, &scale);
  EXPECT_EQ(scale, 1e-38f / 127.0f);
  EXPECT_EQ(dst[0], 127);
  EXPECT_EQ(dst[1], 0);
  EXPECT_EQ(dst[2], -127);
  EXPECT_EQ(dst[3], 127);
}

TEST(Int8KvLayout, BlocksCarryAByteAValueAndAScalePerTokenAndHead) {
  KvLayout layout{.n_layers = 2,
                  .num_blocks = 3,
                  .block_size = 16,
                  .kv_dim = 512,
                  .dtype = DType::kI8,
                  .kv_heads = 8};
  // 2 * 16 * 512 bytes, then 2 * 8 * 16 scales of 4 bytes.
  EXPECT_EQ(layout.block_bytes(), 16384u + 1024u);
  EXPECT_EQ(layout.total_bytes(), 2u * 3 * (16384 + 1024));
  KvLayout bf16 = layout;
  bf16.dtype = DType::kBF16;
  // Head dim 64: 68 bytes a token and head against bf16's 128.
  EXPECT_EQ(layout.block_bytes() * 128, bf16.block_bytes() * 68);
  EXPECT_EQ(layout.KeyScaleOffset(1, 2, 3), 5 * layout.block_bytes() + 16384 + 3 * 64);
  EXPECT_EQ(layout.ValueScaleOffset(1, 2, 3), 5 * layout.block_bytes() + 16384 + 512 + 3 * 64);
}

class Int8KvTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(backend_, CpuBackend::Create({.num_threads = GetParam()}));
  }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937_64 rng_{2718};
};

float ScaleAt(const std::vector<uint8_t>& cache, size_t offset) {
  float f;
  std::memcpy(&f, &cache[offset], sizeof(f));
  return f;
}

// One row written into slot 1 of block 0 (the table's second block): its
// bytes and four scales land where the layout says, nothing else changes.
TEST_P(Int8KvTest, WriteKvStoresBytesAndScalesWhereTheLayoutSays) {
  const KvLayout layout{.n_layers = 2,
                        .num_blocks = 3,
                        .block_size = 4,
                        .kv_dim = 4,
                        .dtype = DType::kI8,
                        .kv_heads = 2};
  std::vector<uint8_t> cache(layout.total_bytes(), kSentinel);
  const std::vector<uint8_t> untouched = cache;
  // Head 0 keys (0.5, -1.27): scale 0.01; head 1 keys (2.54, 1.0): 0.02.
  const float k[4] = {0.5f, -1.27f, 2.54f, 1.0f}, v[4] = {0.0f, 0.0f, -0.127f, 0.0635f};
  const std::vector<int32_t> blocks = {2, 0};
  const AttentionRow row{5, blocks};
  backend_->WriteKv(k, 4, v, 4, std::span<const AttentionRow>(&row, 1), kLayer, layout,
                    cache.data());
  std::vector<size_t> changed;
  auto byte = [&](size_t offset) {
    changed.push_back(offset);
    return static_cast<int8_t>(cache[offset]);
  };
  EXPECT_EQ(byte(layout.KeyOffset(kLayer, 0, 1, 0)), 50);
  EXPECT_EQ(byte(layout.KeyOffset(kLayer, 0, 1, 1)), -127);
  EXPECT_EQ(byte(layout.KeyOffset(kLayer, 0, 1, 2)), 127);
  EXPECT_EQ(byte(layout.KeyOffset(kLayer, 0, 1, 3)), 50);
  EXPECT_EQ(byte(layout.ValueOffset(kLayer, 0, 1) + 0), 0);
  EXPECT_EQ(byte(layout.ValueOffset(kLayer, 0, 1) + 1), 0);
  EXPECT_EQ(byte(layout.ValueOffset(kLayer, 0, 1) + 2), -127);
  EXPECT_EQ(byte(layout.ValueOffset(kLayer, 0, 1) + 3), 64);  // 63.5 steps: ties to even
  const std::pair<size_t, float> scales[4] = {{layout.KeyScaleOffset(kLayer, 0, 0) + 4, 0.01f},
                                              {layout.KeyScaleOffset(kLayer, 0, 1) + 4, 0.02f},
                                              {layout.ValueScaleOffset(kLayer, 0, 0) + 4, 0.0f},
                                              {layout.ValueScaleOffset(kLayer, 0, 1) + 4, 0.001f}};
  for (const auto& [offset, want] : scales) {
    EXPECT_FLOAT_EQ(ScaleAt(cache, offset), want) << "scale at byte " << offset;
    for (size_t b = 0; b < sizeof(float); ++b) changed.push_back(offset + b);
  }
  for (size_t i = 0; i < cache.size(); ++i) {
    if (std::find(changed.begin(), changed.end(), i) != changed.end()) continue;
    ASSERT_EQ(cache[i], untouched[i]) << "byte " << i << " changed";
  }
}

struct Sequence {
  int length;
  std::vector<float> keys, values;  // logical [length][kv_dim]
  std::vector<int32_t> blocks;
};

// Naive float64 attention of one row over `keys`/`values` ([ctx][kv_dim]).
std::vector<double> Reference(const float* q, const std::vector<double>& keys,
                              const std::vector<double>& values, int position,
                              const AttentionShape& shape) {
  const int kv_dim = shape.n_kv_heads * shape.head_dim;
  return ::tandem::testing::NaiveAttention(
      q, [&](int t, int d) { return keys[size_t(t) * kv_dim + d]; },
      [&](int t, int d) { return values[size_t(t) * kv_dim + d]; }, position, shape);
}

// Decode rows (AttendGroup) and prefill runs of >= 16 rows (AttendTile), at
// block sizes 16 (full-block vector scores) and 7 (partial blocks), for
// GQA, MQA and MHA and head dims with and without a vector value path.
TEST_P(Int8KvTest, PagedAttentionReadsEachBytesScale) {
  const AttentionShape shapes[] = {{8, 2, 64}, {6, 3, 48}, {4, 1, 128}, {4, 4, 40}};
  const std::vector<int> lengths = {40, 17, 1, 100};
  const std::vector<std::tuple<int, int, int>> decode = {{0, 39, 1}, {1, 16, 1}, {2, 0, 1},
                                                         {3, 99, 1}, {3, 50, 1}, {0, 7, 1}};
  const std::vector<std::tuple<int, int, int>> prefill = {{0, 0, 40}, {3, 20, 80}, {1, 2, 15}};
  for (const AttentionShape& shape : shapes) {
    for (int block_size : {16, 7}) {
      SCOPED_TRACE(::testing::Message()
                   << "heads " << shape.n_heads << "/" << shape.n_kv_heads << " head_dim "
                   << shape.head_dim << " block_size " << block_size);
      KvLayout layout{.n_layers = 2,
                      .block_size = block_size,
                      .kv_dim = shape.n_kv_heads * shape.head_dim,
                      .dtype = DType::kI8,
                      .kv_heads = shape.n_kv_heads};
      for (int len : lengths) layout.num_blocks += (len + block_size - 1) / block_size;
      layout.num_blocks += 2;
      std::vector<int32_t> ids(layout.num_blocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng_);
      std::vector<uint8_t> cache(layout.total_bytes(), kSentinel);
      std::vector<Sequence> seqs;
      size_t next = 0;
      for (int len : lengths) {
        Sequence s{len,
                   RandomFloats(size_t(len) * layout.kv_dim, -1, 1, rng_),
                   RandomFloats(size_t(len) * layout.kv_dim, -1, 1, rng_),
                   {}};
        const int n_blocks = (len + block_size - 1) / block_size;
        s.blocks.assign(ids.begin() + next, ids.begin() + next + n_blocks);
        next += n_blocks;
        // All positions in one call, K and V in one [k | gap | v] buffer.
        const int stride = 2 * layout.kv_dim + 3;
        std::vector<float> fused(size_t(len) * stride, kGuard);
        std::vector<AttentionRow> rows;
        for (int t = 0; t < len; ++t) {
          std::copy_n(s.keys.begin() + size_t(t) * layout.kv_dim, layout.kv_dim,
                      fused.begin() + size_t(t) * stride);
          std::copy_n(s.values.begin() + size_t(t) * layout.kv_dim, layout.kv_dim,
                      fused.begin() + size_t(t) * stride + layout.kv_dim + 1);
          rows.push_back({t, s.blocks});
        }
        backend_->WriteKv(fused.data(), stride, fused.data() + layout.kv_dim + 1, stride, rows,
                          kLayer, layout, cache.data());
        seqs.push_back(std::move(s));
      }
      // What the cache holds, read back through the documented layout.
      auto held = [&](const Sequence& s, bool values) {
        std::vector<double> out(s.keys.size());
        for (int t = 0; t < s.length; ++t) {
          const int32_t block = s.blocks[t / block_size];
          const int slot = t % block_size;
          for (int d = 0; d < layout.kv_dim; ++d) {
            const int head = d / shape.head_dim;
            const size_t at = values ? layout.ValueOffset(kLayer, block, slot) + d
                                     : layout.KeyOffset(kLayer, block, slot, d);
            const size_t scale_at = (values ? layout.ValueScaleOffset(kLayer, block, head)
                                            : layout.KeyScaleOffset(kLayer, block, head)) +
                                    slot * sizeof(float);
            out[size_t(t) * layout.kv_dim + d] =
                static_cast<double>(static_cast<int8_t>(cache[at])) * ScaleAt(cache, scale_at);
          }
        }
        return out;
      };
      for (const auto* runs : {&decode, &prefill}) {
        SCOPED_TRACE(runs == &decode ? "decode rows" : "prefill runs");
        std::vector<AttentionRow> rows;
        std::vector<int> row_seq;
        for (const auto& [s, first, count] : *runs) {
          for (int i = 0; i < count; ++i) {
            rows.push_back({first + i, seqs[s].blocks});
            row_seq.push_back(s);
          }
        }
        const int q_width = shape.n_heads * shape.head_dim;
        const std::vector<float> q = RandomFloats(rows.size() * q_width, -2, 2, rng_);
        std::vector<float> out(rows.size() * q_width, kNaN);
        backend_->PagedAttention(q.data(), q_width, rows, kLayer, layout, cache.data(), shape,
                                 out.data());
        double vs_held = 0.0, vs_exact = 0.0;
        for (size_t r = 0; r < rows.size(); ++r) {
          const Sequence& s = seqs[row_seq[r]];
          const float* qr = q.data() + r * q_width;
          const float* got = out.data() + r * q_width;
          vs_held =
              std::max(vs_held, RelativeRowError(got, Reference(qr, held(s, false), held(s, true),
                                                                rows[r].position, shape)));
          const std::vector<double> keys(s.keys.begin(), s.keys.end());
          const std::vector<double> values(s.values.begin(), s.values.end());
          vs_exact =
              std::max(vs_exact,
                       RelativeRowError(got, Reference(qr, keys, values, rows[r].position, shape)));
        }
        EXPECT_LE(vs_held, 1e-5);
        EXPECT_LE(vs_exact, 2e-2);
        EXPECT_GT(vs_exact, 0.0) << "int8 values cannot all be exact";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, Int8KvTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace tandem
