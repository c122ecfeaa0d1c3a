#include "common/kvcache/kv_layout.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

KvLayout SmallLayout() {
  KvLayout layout;
  layout.n_layers = 3;
  layout.num_blocks = 7;
  layout.block_size = 5;
  layout.kv_dim = 6;
  return layout;
}

// cache[layer][block] = {K[kv_dim][block_size], V[block_size][kv_dim]},
// written out as the header draws it.
size_t DocumentedBlock(const KvLayout& l, int layer, int block) {
  return (static_cast<size_t>(layer) * l.num_blocks + block) * 2 * l.block_size * l.kv_dim;
}
size_t DocumentedKey(const KvLayout& l, int layer, int block, int slot, int dim) {
  return DocumentedBlock(l, layer, block) + static_cast<size_t>(dim) * l.block_size + slot;
}
size_t DocumentedValue(const KvLayout& l, int layer, int block, int slot) {
  return DocumentedBlock(l, layer, block) + static_cast<size_t>(l.block_size + slot) * l.kv_dim;
}

// Offsets of every float of a slot's key and value.
std::vector<size_t> SlotFloats(const KvLayout& l, int layer, int block, int slot) {
  std::vector<size_t> at;
  for (int d = 0; d < l.kv_dim; ++d) at.push_back(l.KeyOffset(layer, block, slot, d));
  for (int d = 0; d < l.kv_dim; ++d) at.push_back(l.ValueOffset(layer, block, slot) + d);
  return at;
}

TEST(KvLayout, SizesFollowTheShape) {
  const KvLayout l = SmallLayout();
  EXPECT_EQ(l.block_elements(), 2u * 5 * 6);
  EXPECT_EQ(l.layer_elements(), 2u * 5 * 6 * 7);
  EXPECT_EQ(l.total_elements(), 2u * 5 * 6 * 7 * 3);
}

TEST(KvLayout, OffsetsMatchTheDocumentedLayout) {
  const KvLayout l = SmallLayout();
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int block = 0; block < l.num_blocks; ++block) {
      EXPECT_EQ(l.BlockOffset(layer, block), DocumentedBlock(l, layer, block));
      for (int slot = 0; slot < l.block_size; ++slot) {
        for (int d = 0; d < l.kv_dim; ++d) {
          EXPECT_EQ(l.KeyOffset(layer, block, slot, d), DocumentedKey(l, layer, block, slot, d));
        }
        EXPECT_EQ(l.ValueOffset(layer, block, slot), DocumentedValue(l, layer, block, slot));
      }
    }
  }
}

// A latent layout: keys only, one scale per slot for int8.
TEST(KvLayout, LatentBlocksHoldKeysAlone) {
  KvLayout l = SmallLayout();
  l.latent = true;
  EXPECT_EQ(l.value_dim(), 0);
  EXPECT_EQ(l.block_elements(), 5u * 6);
  EXPECT_EQ(l.BlockOffset(1, 2), (1u * 7 + 2) * 5 * 6);
  EXPECT_EQ(l.KeyOffset(1, 2, 3, 4), l.BlockOffset(1, 2) + 4u * 5 + 3);
  l.dtype = DType::kI8;
  l.kv_heads = 1;
  EXPECT_EQ(l.scale_bytes(), 5u * sizeof(float));
  EXPECT_EQ(l.block_bytes(), 5u * 6 + 5 * sizeof(float));
  EXPECT_EQ(l.KeyScaleOffset(0, 1, 0), l.BlockOffset(0, 1) + 5u * 6);
  l.latent = false;
  EXPECT_EQ(l.block_bytes(), 2u * 5 * 6 + 2 * 5 * sizeof(float));
}

// Every float of the cache belongs to exactly one (layer, block, K|V, slot).
TEST(KvLayout, SlotsTileTheCacheExactlyOnce) {
  const KvLayout l = SmallLayout();
  std::vector<int> uses(l.total_elements(), 0);
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int block = 0; block < l.num_blocks; ++block) {
      for (int slot = 0; slot < l.block_size; ++slot) {
        for (size_t at : SlotFloats(l, layer, block, slot)) {
          ASSERT_LT(at, uses.size());
          ++uses[at];
        }
      }
    }
  }
  for (size_t i = 0; i < uses.size(); ++i) ASSERT_EQ(uses[i], 1) << "float " << i;
}

// The property transfers rely on: one layer of a run of consecutive block ids
// is exactly one contiguous range of the cache, holding nothing else.
TEST(KvLayout, LayerOfConsecutiveBlocksIsOneRange) {
  const KvLayout l = SmallLayout();
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int first = 0; first < l.num_blocks; ++first) {
      for (int count = 1; first + count <= l.num_blocks; ++count) {
        const size_t begin = l.BlockOffset(layer, first);
        const size_t end = begin + count * l.block_elements();
        std::vector<int> uses(l.total_elements(), 0);
        for (int block = first; block < first + count; ++block) {
          for (int slot = 0; slot < l.block_size; ++slot) {
            for (size_t at : SlotFloats(l, layer, block, slot)) ++uses[at];
          }
        }
        for (size_t i = 0; i < uses.size(); ++i) {
          ASSERT_EQ(uses[i], i >= begin && i < end ? 1 : 0)
              << "layer " << layer << " blocks [" << first << ", " << first + count << ") float "
              << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
