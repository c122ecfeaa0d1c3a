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

// cache[layer][block][K|V][slot][kv_dim], written out as the header draws it.
size_t DocumentedOffset(const KvLayout& l, int layer, int block, int kv, int slot) {
  return ((((static_cast<size_t>(layer) * l.num_blocks + block) * 2 + kv) * l.block_size + slot) *
          l.kv_dim);
}

TEST(KvLayout, SizesFollowTheShape) {
  const KvLayout l = SmallLayout();
  EXPECT_EQ(l.block_floats(), 2u * 5 * 6);
  EXPECT_EQ(l.layer_floats(), 2u * 5 * 6 * 7);
  EXPECT_EQ(l.total_floats(), 2u * 5 * 6 * 7 * 3);
}

TEST(KvLayout, OffsetsMatchTheDocumentedLayout) {
  const KvLayout l = SmallLayout();
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int block = 0; block < l.num_blocks; ++block) {
      EXPECT_EQ(l.BlockOffset(layer, block), DocumentedOffset(l, layer, block, 0, 0));
      for (int slot = 0; slot < l.block_size; ++slot) {
        EXPECT_EQ(l.KeyOffset(layer, block, slot), DocumentedOffset(l, layer, block, 0, slot));
        EXPECT_EQ(l.ValueOffset(layer, block, slot), DocumentedOffset(l, layer, block, 1, slot));
      }
    }
  }
}

// Every float of the cache belongs to exactly one (layer, block, K|V, slot).
TEST(KvLayout, SlotsTileTheCacheExactlyOnce) {
  const KvLayout l = SmallLayout();
  std::vector<int> uses(l.total_floats(), 0);
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int block = 0; block < l.num_blocks; ++block) {
      for (int slot = 0; slot < l.block_size; ++slot) {
        for (size_t start : {l.KeyOffset(layer, block, slot), l.ValueOffset(layer, block, slot)}) {
          ASSERT_LE(start + l.kv_dim, uses.size());
          for (int i = 0; i < l.kv_dim; ++i) ++uses[start + i];
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
        const size_t end = begin + count * l.block_floats();
        std::vector<int> uses(l.total_floats(), 0);
        for (int block = first; block < first + count; ++block) {
          for (int slot = 0; slot < l.block_size; ++slot) {
            for (size_t start :
                 {l.KeyOffset(layer, block, slot), l.ValueOffset(layer, block, slot)}) {
              for (int i = 0; i < l.kv_dim; ++i) ++uses[start + i];
            }
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
