// The CUDA kernels' addressing of the KV cache (cuda/device_layout.h)
// against kv_layout.h's offsets, on any machine: every block of every
// layer, and for an int8 cache every key and value scale, at the byte the
// CPU backend reads and writes. Also the host-side refusals of the int8
// cache's launches, which return before any device is touched.
#include <cstdint>
#include <vector>

#include "common/compute/cuda/device_layout.h"
#include "common/compute/cuda/kernels.h"
#include "common/compute/cuda/prefill_mma.h"
#include "common/kvcache/kv_layout.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

KvLayout Layout(DType dtype, int block_size, int kv_heads, int head_dim) {
  KvLayout layout;
  layout.n_layers = 3;
  layout.num_blocks = 5;
  layout.block_size = block_size;
  layout.kv_dim = kv_heads * head_dim;
  layout.kv_heads = kv_heads;
  layout.dtype = dtype;
  return layout;
}

template <typename T>
void ExpectBlocksAt(const KvLayout& layout) {
  std::vector<uint8_t> cache(layout.total_bytes());
  const uint8_t* base = cache.data();
  for (int layer = 0; layer < layout.n_layers; ++layer) {
    const auto device = cuda::MakeDeviceLayout<T>(layout, layer, base);
    for (int32_t block = 0; block < layout.num_blocks; ++block) {
      const uint8_t* got = reinterpret_cast<const uint8_t*>(device.Block(block));
      EXPECT_EQ(got - base, layout.BlockOffset(layer, block) * layout.element_bytes())
          << "layer " << layer << " block " << block;
    }
  }
}

TEST(CudaDeviceLayout, BlocksAreWhereKvLayoutPutsThem) {
  ExpectBlocksAt<float>(Layout(DType::kF32, 16, 2, 64));
  ExpectBlocksAt<uint16_t>(Layout(DType::kBF16, 12, 8, 128));
  ExpectBlocksAt<int8_t>(Layout(DType::kI8, 16, 2, 64));
  ExpectBlocksAt<int8_t>(Layout(DType::kI8, 7, 3, 40));
}

TEST(CudaDeviceLayout, Int8ScalesAreWhereKvLayoutPutsThem) {
  for (const KvLayout& layout : {Layout(DType::kI8, 16, 2, 64), Layout(DType::kI8, 7, 3, 40),
                                 Layout(DType::kI8, 16, 8, 128), Layout(DType::kI8, 32, 1, 8)}) {
    std::vector<uint8_t> cache(layout.total_bytes());
    const int8_t* base = reinterpret_cast<const int8_t*>(cache.data());
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      const auto device = cuda::MakeDeviceLayout<int8_t>(layout, layer, base);
      for (int32_t block = 0; block < layout.num_blocks; ++block) {
        const int8_t* b = device.Block(block);
        for (int head = 0; head < layout.kv_heads; ++head) {
          for (int slot = 0; slot < layout.block_size; ++slot) {
            const auto at = [&](const float* p) {
              return reinterpret_cast<const int8_t*>(p) - base;
            };
            ASSERT_EQ(at(device.KeyScales(b, head) + slot),
                      layout.KeyScaleOffset(layer, block, head) + slot * sizeof(float));
            ASSERT_EQ(at(device.ValueScales(b, head) + slot),
                      layout.ValueScaleOffset(layer, block, head) + slot * sizeof(float));
          }
        }
        // The last value scale ends the block.
        const float* last = device.ValueScales(b, layout.kv_heads - 1) + layout.block_size;
        EXPECT_EQ(reinterpret_cast<const int8_t*>(last) - base,
                  layout.BlockOffset(layer, block + 1));
      }
    }
  }
}

// The tensor-core prefill reads 16-bit caches only: an int8 cache goes to
// the kernel that scales each byte as it stages it.
TEST(CudaDeviceLayout, Int8CacheNeverTakesTheTensorCorePrefill) {
  alignas(16) static float out[4];
  alignas(16) static uint8_t cache[64];
  EXPECT_TRUE(cuda::PrefillMmaApplies(Layout(DType::kBF16, 16, 2, 64), 64, cache, out));
  EXPECT_FALSE(cuda::PrefillMmaApplies(Layout(DType::kI8, 16, 2, 64), 64, cache, out));
  EXPECT_FALSE(cuda::PrefillMmaApplies(Layout(DType::kF32, 16, 2, 64), 64, cache, out));
}

// The paged-block decode kernel takes 16-bit caches in blocks of 16 slots,
// head_dim 64 or 128, up to 8 query heads per KV head, aligned; the tiled
// kernel takes the rest.
TEST(CudaDeviceLayout, BlockDecodeTakesOnlyTheCachesItReads) {
  alignas(16) static uint8_t cache[64];
  EXPECT_TRUE(cuda::BlockDecodeApplies(Layout(DType::kBF16, 16, 8, 128), 32, 8, 128, cache));
  EXPECT_TRUE(cuda::BlockDecodeApplies(Layout(DType::kF16, 16, 2, 64), 8, 2, 64, cache));
  EXPECT_TRUE(cuda::BlockDecodeApplies(Layout(DType::kBF16, 16, 4, 128), 28, 4, 128, cache));
  EXPECT_FALSE(cuda::BlockDecodeApplies(Layout(DType::kF32, 16, 8, 128), 32, 8, 128, cache));
  EXPECT_FALSE(cuda::BlockDecodeApplies(Layout(DType::kI8, 16, 8, 128), 32, 8, 128, cache));
  EXPECT_FALSE(cuda::BlockDecodeApplies(Layout(DType::kBF16, 12, 8, 128), 32, 8, 128, cache));
  EXPECT_FALSE(cuda::BlockDecodeApplies(Layout(DType::kBF16, 16, 1, 256), 16, 1, 256, cache));
  EXPECT_FALSE(cuda::BlockDecodeApplies(Layout(DType::kBF16, 16, 2, 40), 6, 2, 40, cache));
  EXPECT_FALSE(cuda::BlockDecodeApplies(Layout(DType::kBF16, 16, 1, 128), 16, 1, 128, cache));
  EXPECT_FALSE(cuda::BlockDecodeApplies(Layout(DType::kBF16, 16, 8, 128), 32, 8, 128, cache + 2));
}

// Its plan splits a context only into whole multiples of 64 positions (a
// paged block for each of a block's four warps) that cover the longest row,
// splits more when few rows would leave SMs idle, and sizes the partials.
TEST(CudaDeviceLayout, BlockDecodePlanCoversTheContextInWholeBlocks) {
  struct Case {
    int rows, context;
  };
  for (const Case c : {Case{1, 1}, Case{1, 1024}, Case{8, 1040}, Case{32, 1040}, Case{32, 4095},
                       Case{256, 100}, Case{3, 65}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows, context " << c.context);
    const cuda::AttentionPlan plan = cuda::PlanBlockDecode(c.rows, c.context, 8, 128, 32, 132);
    EXPECT_TRUE(plan.by_block);
    EXPECT_EQ(plan.chunk % 64, 0);
    EXPECT_GE(plan.splits * plan.chunk, c.context);
    EXPECT_LT((plan.splits - 1) * plan.chunk, c.context);  // no split past the context
    EXPECT_EQ(plan.partial_floats,
              plan.splits == 1 ? 0u : size_t{1} * c.rows * 32 * plan.splits * (128 + 2));
  }
  // One row of a long context spreads over many SMs; many rows need no split.
  EXPECT_GE(cuda::PlanBlockDecode(1, 4096, 8, 128, 32, 132).splits, 32);
  EXPECT_EQ(cuda::PlanBlockDecode(256, 4096, 8, 128, 32, 132).splits, 1);
}

// A KV width that is not a whole number of heads is refused before a launch.
TEST(CudaDeviceLayout, Int8WriteRefusesHeadsThatDoNotDivideTheKvWidth) {
  KvLayout layout = Layout(DType::kI8, 16, 3, 40);
  layout.kv_dim = 100;
  EXPECT_EQ(cuda::LaunchWriteKv(nullptr, 0, nullptr, 0, nullptr, 1, 0, layout, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
