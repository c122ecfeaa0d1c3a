#include "common/kvcache/block_pool.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(BlockPool, StartsAllFree) {
  BlockPool pool(5);
  EXPECT_EQ(pool.num_blocks(), 5);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.num_used(), 0);
  for (int32_t b = 0; b < 5; ++b) EXPECT_EQ(pool.ref_count(b), 0);
}

TEST(BlockPool, HandsOutLowestIdsFirst) {
  BlockPool pool(8);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> a, pool.Allocate(3));
  EXPECT_THAT(a, ElementsAre(0, 1, 2));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> b, pool.Allocate(2));
  EXPECT_THAT(b, ElementsAre(3, 4));
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_used(), 5);
  for (int32_t id : {0, 1, 2, 3, 4}) EXPECT_EQ(pool.ref_count(id), 1);
  EXPECT_EQ(pool.ref_count(5), 0);
}

TEST(BlockPool, AllocateZeroIsEmpty) {
  BlockPool pool(2);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> none, pool.Allocate(0));
  EXPECT_THAT(none, IsEmpty());
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPool, NegativeCountIsInvalid) {
  BlockPool pool(2);
  EXPECT_THAT(pool.Allocate(-1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-1")));
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPool, ExhaustionIsAllOrNothing) {
  BlockPool pool(8);
  ASSERT_OK(pool.Allocate(5).status());
  // Three are free: asking for four must take none of them.
  EXPECT_THAT(pool.Allocate(4), StatusIs(absl::StatusCode::kResourceExhausted,
                                         HasSubstr("4 blocks wanted, 3 of 8 free")));
  EXPECT_EQ(pool.num_free(), 3);
  for (int32_t b = 5; b < 8; ++b) EXPECT_EQ(pool.ref_count(b), 0);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> rest, pool.Allocate(3));
  EXPECT_THAT(rest, ElementsAre(5, 6, 7));
  EXPECT_THAT(pool.Allocate(1), StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(BlockPool, RefKeepsBlockUntilLastRelease) {
  BlockPool pool(4);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> blocks, pool.Allocate(2));
  pool.Ref(blocks[1]);
  EXPECT_EQ(pool.ref_count(blocks[1]), 2);

  pool.Release(blocks);
  EXPECT_EQ(pool.ref_count(blocks[0]), 0);
  EXPECT_EQ(pool.ref_count(blocks[1]), 1);
  EXPECT_EQ(pool.num_free(), 3);

  const int32_t shared = blocks[1];
  pool.Release({&shared, 1});
  EXPECT_EQ(pool.ref_count(shared), 0);
  EXPECT_EQ(pool.num_free(), 4);
}

TEST(BlockPool, FreedBlocksAreReusedLowestFirst) {
  BlockPool pool(8);
  ASSERT_OK(pool.Allocate(6).status());
  // Released out of order, so the free list has to be re-sorted.
  pool.Release(std::vector<int32_t>{4, 1, 3});
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> a, pool.Allocate(2));
  EXPECT_THAT(a, ElementsAre(1, 3));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> b, pool.Allocate(2));
  EXPECT_THAT(b, ElementsAre(4, 6));
  pool.Release(std::vector<int32_t>{0});
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> c, pool.Allocate(2));
  EXPECT_THAT(c, ElementsAre(0, 7));
}

// Random allocations, extra references and releases against a model of the
// reference counts: the pool must agree on every count, on num_free, and on
// which ids Allocate returns (always the lowest free ones, ascending).
TEST(BlockPool, RandomSoakMatchesModel) {
  constexpr int kBlocks = 64;
  BlockPool pool(kBlocks);
  std::vector<int> model(kBlocks, 0);
  std::vector<int32_t> held;  // one entry per reference held
  std::mt19937_64 rng(7);
  int exhausted = 0;
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      const int n = static_cast<int>(rng() % 9);
      std::vector<int32_t> expected;
      for (int32_t b = 0; b < kBlocks && static_cast<int>(expected.size()) < n; ++b) {
        if (model[b] == 0) expected.push_back(b);
      }
      absl::StatusOr<std::vector<int32_t>> got = pool.Allocate(n);
      if (static_cast<int>(expected.size()) < n) {
        ASSERT_THAT(got, StatusIs(absl::StatusCode::kResourceExhausted)) << "step " << step;
        ++exhausted;
      } else {
        ASSERT_OK(got.status());
        ASSERT_EQ(*got, expected) << "step " << step;
        for (int32_t b : *got) {
          model[b] = 1;
          held.push_back(b);
        }
      }
    } else if (op == 1 && !held.empty()) {
      const int32_t b = held[rng() % held.size()];
      pool.Ref(b);
      ++model[b];
      held.push_back(b);
    } else if (!held.empty()) {
      // Release a random handful of held references in one call.
      std::vector<int32_t> release;
      const size_t n = 1 + rng() % std::min<size_t>(held.size(), 6);
      for (size_t i = 0; i < n; ++i) {
        const size_t at = rng() % held.size();
        release.push_back(held[at]);
        held[at] = held.back();
        held.pop_back();
      }
      pool.Release(release);
      for (int32_t b : release) --model[b];
    }
    int model_free = 0;
    for (int32_t b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(pool.ref_count(b), model[b]) << "block " << b << " step " << step;
      model_free += model[b] == 0;
    }
    ASSERT_EQ(pool.num_free(), model_free) << "step " << step;
  }
  // The walk must have visited both a full pool and the exhaustion path.
  EXPECT_GT(exhausted, 0);
  pool.Release(held);
  EXPECT_EQ(pool.num_free(), kBlocks);
}

TEST(BlockPoolDeathTest, DoubleReleaseAborts) {
  BlockPool pool(4);
  std::vector<int32_t> blocks = *pool.Allocate(2);
  pool.Release(blocks);
  EXPECT_DEATH(pool.Release(blocks), "double free");
}

TEST(BlockPoolDeathTest, RepeatedIdInOneReleaseAborts) {
  BlockPool pool(4);
  ASSERT_OK(pool.Allocate(1).status());
  EXPECT_DEATH(pool.Release(std::vector<int32_t>{0, 0}), "double free of block 0");
}

TEST(BlockPoolDeathTest, RefOfFreeBlockAborts) {
  BlockPool pool(4);
  EXPECT_DEATH(pool.Ref(2), "block 2");
}

}  // namespace
}  // namespace tandem
