#include "kvtransfer/slices.h"

#include <cstdint>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

using Triple = std::tuple<RegionId, uint64_t, uint64_t>;

std::vector<Triple> Triples(const std::vector<Slice>& slices) {
  std::vector<Triple> out;
  for (const Slice& s : slices) out.emplace_back(s.region, s.offset, s.length);
  return out;
}

TEST(PagedKvSlices, MergesRunsOfAdjacentBlocksPerLayer) {
  const uint64_t block = 256, layer = block * 10;
  const std::vector<int32_t> blocks = {3, 4, 5, 1, 7, 8};
  const auto slices = PagedKvSlices(9, 2, layer, block, blocks);
  ASSERT_EQ(slices.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    const std::vector<Triple> want = {
        {9, l * layer + 3 * block, 3 * block},
        {9, l * layer + 1 * block, block},
        {9, l * layer + 7 * block, 2 * block},
    };
    EXPECT_EQ(Triples(slices[l]), want) << "layer " << l;
    EXPECT_EQ(TotalBytes(slices[l]), blocks.size() * block);
  }
}

TEST(PagedKvSlices, NoBlocksGiveEmptyLayers) {
  const auto slices = PagedKvSlices(1, 3, 512, 256, {});
  ASSERT_EQ(slices.size(), 3u);
  for (const auto& s : slices) EXPECT_TRUE(s.empty());
}

}  // namespace
}  // namespace tandem::kvtransfer
