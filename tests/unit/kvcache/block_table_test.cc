#include "common/kvcache/block_table.h"

#include <cstdint>
#include <vector>

#include "common/kvcache/block_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(BlockTable, StartsEmpty) {
  BlockTable table(16);
  EXPECT_EQ(table.block_size(), 16);
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_THAT(table.blocks(), IsEmpty());
}

TEST(BlockTable, ReserveGrowsByWholeBlocks) {
  BlockPool pool(10);
  BlockTable table(4);
  ASSERT_OK(table.Reserve(1, pool));
  EXPECT_THAT(table.blocks(), ElementsAre(0));
  table.Advance(1);
  // Tokens 1..3 still fit in block 0.
  ASSERT_OK(table.Reserve(3, pool));
  EXPECT_THAT(table.blocks(), ElementsAre(0));
  ASSERT_OK(table.Reserve(4, pool));
  EXPECT_THAT(table.blocks(), ElementsAre(0, 1));
  table.Advance(4);
  EXPECT_EQ(table.num_tokens(), 5);
  // 5 + 11 = 16 tokens: exactly four blocks.
  ASSERT_OK(table.Reserve(11, pool));
  EXPECT_THAT(table.blocks(), ElementsAre(0, 1, 2, 3));
  ASSERT_OK(table.Reserve(12, pool));
  EXPECT_THAT(table.blocks(), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(pool.num_free(), 5);
}

TEST(BlockTable, ReserveCountsFromWrittenTokensNotReservedOnes) {
  BlockPool pool(10);
  BlockTable table(4);
  ASSERT_OK(table.Reserve(9, pool));
  EXPECT_EQ(table.blocks().size(), 3u);
  // Nothing was written yet, so asking again needs nothing new.
  ASSERT_OK(table.Reserve(9, pool));
  ASSERT_OK(table.Reserve(0, pool));
  EXPECT_EQ(table.blocks().size(), 3u);
  EXPECT_EQ(pool.num_free(), 7);
}

TEST(BlockTable, FailedReserveChangesNothing) {
  BlockPool pool(3);
  BlockTable table(4);
  ASSERT_OK(table.Reserve(8, pool));
  table.Advance(8);
  const std::vector<int32_t> before(table.blocks().begin(), table.blocks().end());
  // Two more blocks are needed, one is free.
  EXPECT_THAT(table.Reserve(5, pool), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(table.blocks(), ElementsAre(before[0], before[1]));
  EXPECT_EQ(table.num_tokens(), 8);
  EXPECT_EQ(pool.num_free(), 1);
  // What does fit still works afterwards.
  ASSERT_OK(table.Reserve(4, pool));
  EXPECT_EQ(table.blocks().size(), 3u);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockTable, ReleaseReturnsEveryBlock) {
  BlockPool pool(6);
  BlockTable a(4), b(4);
  ASSERT_OK(a.Reserve(6, pool));
  ASSERT_OK(b.Reserve(13, pool));
  a.Advance(6);
  EXPECT_EQ(pool.num_free(), 0);
  a.Release(pool);
  EXPECT_THAT(a.blocks(), IsEmpty());
  EXPECT_EQ(a.num_tokens(), 0);
  EXPECT_EQ(pool.num_free(), 2);
  b.Release(pool);
  EXPECT_EQ(pool.num_free(), 6);
  for (int32_t id = 0; id < 6; ++id) EXPECT_EQ(pool.ref_count(id), 0);
  // A released table can be used again.
  ASSERT_OK(a.Reserve(1, pool));
  EXPECT_THAT(a.blocks(), ElementsAre(0));
}

TEST(BlockTable, ReleaseLeavesSharedBlocksToOtherHolders) {
  BlockPool pool(4);
  BlockTable table(4);
  ASSERT_OK(table.Reserve(8, pool));
  const int32_t shared = table.blocks()[0];
  pool.Ref(shared);
  table.Release(pool);
  EXPECT_EQ(pool.ref_count(shared), 1);
  EXPECT_EQ(pool.num_free(), 3);
}

}  // namespace
}  // namespace tandem
