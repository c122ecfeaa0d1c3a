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

// A KV width that is not a whole number of heads is refused before a launch.
TEST(CudaDeviceLayout, Int8WriteRefusesHeadsThatDoNotDivideTheKvWidth) {
  KvLayout layout = Layout(DType::kI8, 16, 3, 40);
  layout.kv_dim = 100;
  EXPECT_EQ(cuda::LaunchWriteKv(nullptr, 0, nullptr, 0, nullptr, 1, 0, layout, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
