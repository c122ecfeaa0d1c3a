#include "prefill_worker/kv_slices.h"

#include <cstdint>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::prefill {
namespace {

using Triple = std::tuple<kvtransfer::RegionId, uint64_t, uint64_t>;

std::vector<Triple> Triples(const std::vector<kvtransfer::Slice>& slices) {
  std::vector<Triple> out;
  for (const kvtransfer::Slice& s : slices) out.emplace_back(s.region, s.offset, s.length);
  return out;
}

TEST(LayerSlices, MergesRunsOfAdjacentBlocksPerLayer) {
  KvLayout layout{.n_layers = 2, .num_blocks = 10, .block_size = 4, .kv_dim = 8};
  const uint64_t block = layout.block_floats() * sizeof(float);  // 256
  const uint64_t layer = block * 10;
  const std::vector<int32_t> blocks = {3, 4, 5, 1, 7, 8};
  const auto slices = LayerSlices(layout, 9, blocks);
  ASSERT_EQ(slices.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    const std::vector<Triple> want = {
        {9, l * layer + 3 * block, 3 * block},
        {9, l * layer + 1 * block, block},
        {9, l * layer + 7 * block, 2 * block},
    };
    EXPECT_EQ(Triples(slices[l]), want) << "layer " << l;
  }
  EXPECT_EQ(LayerBytes(layout, 6), 6 * block);
}

TEST(LayerSlices, NoBlocksGiveEmptyLayers) {
  KvLayout layout{.n_layers = 3, .num_blocks = 2, .block_size = 4, .kv_dim = 8};
  const auto slices = LayerSlices(layout, 1, {});
  ASSERT_EQ(slices.size(), 3u);
  for (const auto& s : slices) EXPECT_TRUE(s.empty());
}

}  // namespace
}  // namespace tandem::prefill
