// The prefix cache: chained block hashes and the pool's cached blocks.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_pool.h"
#include "common/kvcache/block_table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int kBs = 4;

std::vector<int32_t> Iota(int n, int32_t from = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

const BlockHash kSalt = BlockHashSalt("00000000000fa4e1", "f32", kBs);

TEST(BlockHash, OnlyFullBlocksAreHashedAndTheChainCarriesThePrefix) {
  const std::vector<int32_t> tokens = Iota(11);
  const std::vector<BlockHash> h = HashBlocks(kSalt, tokens, kBs, 100);
  ASSERT_EQ(h.size(), 2u);  // 11 tokens: two full blocks.
  EXPECT_NE(h[0], h[1]);
  // The same second block after a different first one hashes differently.
  std::vector<int32_t> other = tokens;
  other[0] = 99;
  const std::vector<BlockHash> g = HashBlocks(kSalt, other, kBs, 100);
  EXPECT_NE(g[0], h[0]);
  EXPECT_NE(g[1], h[1]);
  // A shared prefix shares hashes; max_blocks caps the count.
  const std::vector<int32_t> longer = Iota(20);
  const std::vector<BlockHash> l = HashBlocks(kSalt, longer, kBs, 3);
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0], h[0]);
  EXPECT_EQ(l[1], h[1]);
  // Extending a chain gives what hashing at once gives.
  std::vector<BlockHash> grown(h.begin(), h.begin() + 1);
  ExtendBlockHashes(kSalt, longer, kBs, 5, grown);
  EXPECT_EQ(grown, HashBlocks(kSalt, longer, kBs, 5));
}

TEST(BlockHash, TheSaltSeparatesModelsDtypesAndBlockSizes) {
  const std::vector<int32_t> tokens = Iota(8);
  const BlockHash a = HashBlocks(kSalt, tokens, kBs, 1)[0];
  EXPECT_NE(a, HashBlocks(BlockHashSalt("00000000000fa4e2", "f32", kBs), tokens, kBs, 1)[0]);
  EXPECT_NE(a, HashBlocks(BlockHashSalt("00000000000fa4e1", "bf16", kBs), tokens, kBs, 1)[0]);
  EXPECT_NE(a, HashBlocks(BlockHashSalt("00000000000fa4e1", "f32", 8), tokens, kBs, 1)[0]);
  EXPECT_EQ(a.ToString().size(), 32u);
}

// Allocates a sequence of `tokens`' full blocks and caches them.
std::vector<int32_t> CacheSequence(BlockPool& pool, const std::vector<int32_t>& tokens) {
  const std::vector<BlockHash> h = HashBlocks(kSalt, tokens, kBs, 1000);
  auto blocks = pool.Allocate(static_cast<int>(h.size()));
  EXPECT_TRUE(blocks.ok());
  for (size_t i = 0; i < h.size(); ++i) EXPECT_TRUE(pool.SetCached((*blocks)[i], h[i]));
  return *blocks;
}

TEST(PrefixCache, ReleasedBlocksStayFindableAndCountAsFree) {
  BlockPool pool(6);
  const std::vector<int32_t> tokens = Iota(12);
  const std::vector<int32_t> blocks = CacheSequence(pool, tokens);
  EXPECT_EQ(pool.num_cached(), 3);
  EXPECT_EQ(pool.num_free(), 3);
  pool.Release(blocks);
  EXPECT_EQ(pool.num_free(), 6);
  EXPECT_EQ(pool.num_evictable(), 3);
  // A longer prompt with the same start finds the three blocks.
  const std::vector<int32_t> prompt = Iota(17);
  const std::vector<int32_t> hit = pool.AcquirePrefix(HashBlocks(kSalt, prompt, kBs, 1000));
  EXPECT_EQ(hit, blocks);
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_EQ(pool.num_free(), 3);
  for (int32_t b : hit) EXPECT_EQ(pool.ref_count(b), 1);
}

TEST(PrefixCache, SharedBlocksAreCountedPerUserAndNeverEvictedInUse) {
  BlockPool pool(4);
  const std::vector<int32_t> blocks = CacheSequence(pool, Iota(8));  // 2 blocks
  const std::vector<int32_t> again = pool.AcquirePrefix(HashBlocks(kSalt, Iota(8), kBs, 1000));
  EXPECT_EQ(again, blocks);
  for (int32_t b : blocks) EXPECT_EQ(pool.ref_count(b), 2);
  pool.Release(blocks);
  EXPECT_EQ(pool.num_evictable(), 0);  // Still used by the second holder.
  // The pool can hand out only the two never-cached blocks.
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> rest, pool.Allocate(2));
  EXPECT_THAT(pool.Allocate(1), tandem::testing::StatusIs(absl::StatusCode::kResourceExhausted));
  for (int32_t b : again) EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.Lookup(HashBlocks(kSalt, Iota(8), kBs, 1)[0]), blocks[0]);
  pool.Release(rest);
  pool.Release(again);
}

TEST(PrefixCache, EvictsLeastRecentlyReleasedAndATailBeforeItsPrefix) {
  BlockPool pool(4);
  const std::vector<int32_t> a = CacheSequence(pool, Iota(8, 0));    // blocks 0, 1
  const std::vector<int32_t> b = CacheSequence(pool, Iota(8, 100));  // blocks 2, 3
  pool.Release(a);
  pool.Release(b);
  EXPECT_EQ(pool.num_free(), 4);
  // a's tail goes first, then a's prefix, then b's tail.
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> one, pool.Allocate(1));
  EXPECT_THAT(one, ElementsAre(a[1]));
  EXPECT_EQ(pool.Lookup(HashBlocks(kSalt, Iota(8, 0), kBs, 2)[1]), -1);
  EXPECT_EQ(pool.Lookup(HashBlocks(kSalt, Iota(8, 0), kBs, 2)[0]), a[0]);
  // Using b again makes it the most recent: a's prefix goes next.
  const std::vector<int32_t> b_again = pool.AcquirePrefix(HashBlocks(kSalt, Iota(8, 100), kBs, 2));
  pool.Release(b_again);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> two, pool.Allocate(1));
  EXPECT_THAT(two, ElementsAre(a[0]));
  EXPECT_EQ(pool.evictions(), 2u);
  // A prefix whose first block was evicted finds nothing, even though a
  // later block of it might still be cached.
  EXPECT_THAT(pool.AcquirePrefix(HashBlocks(kSalt, Iota(8, 0), kBs, 2)), IsEmpty());
  pool.Release(one);
  pool.Release(two);
}

TEST(PrefixCache, ADuplicateHashKeepsTheFirstBlock) {
  BlockPool pool(4);
  const std::vector<int32_t> first = CacheSequence(pool, Iota(4));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> copy, pool.Allocate(1));
  EXPECT_FALSE(pool.SetCached(copy[0], HashBlocks(kSalt, Iota(4), kBs, 1)[0]));
  EXPECT_FALSE(pool.SetCached(first[0], HashBlocks(kSalt, Iota(4, 7), kBs, 1)[0]));
  pool.Release(copy);  // Not cached: free at once.
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_EQ(pool.num_free(), 3);
  pool.Release(first);
  EXPECT_EQ(pool.Flush(), 1);
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_free(), 4);
}

TEST(PrefixCache, TablesAdoptCachedBlocksAndGrowPastThem) {
  BlockPool pool(8);
  const std::vector<int32_t> cached = CacheSequence(pool, Iota(8));
  pool.Release(cached);
  BlockTable table(kBs);
  table.Adopt(pool.AcquirePrefix(HashBlocks(kSalt, Iota(10), kBs, 1000)), 8);
  EXPECT_EQ(table.num_tokens(), 8);
  ASSERT_OK(table.Reserve(2, pool));
  EXPECT_EQ(table.blocks().size(), 3u);
  table.Release(pool);
  EXPECT_EQ(pool.num_free(), 8);
  EXPECT_EQ(pool.num_evictable(), 2);
}

// Random sequences come and go, sharing prefixes; a block in use is never
// handed out again, and at the end everything is free or cached and the
// cache flushes to zero.
TEST(PrefixCache, RandomUseNeverHandsOutABlockInUseAndFlushesToZero) {
  std::mt19937 rng(7);
  BlockPool pool(32);
  struct Seq {
    std::vector<int32_t> blocks;
  };
  std::vector<Seq> live;
  std::vector<int> owners(32, 0);
  for (int round = 0; round < 3000; ++round) {
    if (!live.empty() && (rng() % 3 == 0 || pool.num_free() < 6)) {
      const size_t i = rng() % live.size();
      for (int32_t b : live[i].blocks) --owners[b];
      pool.Release(live[i].blocks);
      live.erase(live.begin() + static_cast<long>(i));
      continue;
    }
    // One of 4 system prompts, then a random tail.
    std::vector<int32_t> tokens = Iota(8, static_cast<int32_t>(1000 * (rng() % 4)));
    const int tail = static_cast<int>(rng() % 12);
    for (int t = 0; t < tail; ++t) tokens.push_back(static_cast<int32_t>(rng() % 50));
    const std::vector<BlockHash> h = HashBlocks(kSalt, tokens, kBs, 1000);
    std::vector<int32_t> blocks = pool.AcquirePrefix(h);
    const int need = static_cast<int>(h.size()) - static_cast<int>(blocks.size());
    auto fresh = pool.Allocate(need);
    if (!fresh.ok()) {
      pool.Release(blocks);
      continue;
    }
    for (int32_t b : *fresh) {
      ASSERT_EQ(owners[b], 0) << "block " << b << " handed out while in use";
    }
    for (size_t i = blocks.size(); i < h.size(); ++i) {
      pool.SetCached((*fresh)[i - blocks.size()], h[i]);
    }
    blocks.insert(blocks.end(), fresh->begin(), fresh->end());
    for (int32_t b : blocks) ++owners[b];
    for (int32_t b : blocks) ASSERT_EQ(pool.ref_count(b), owners[b]);
    live.push_back({std::move(blocks)});
  }
  for (const Seq& s : live) pool.Release(s.blocks);
  EXPECT_EQ(pool.num_free(), 32);
  EXPECT_GT(pool.evictions(), 0u);
  pool.Flush();
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_evictable(), 0);
  for (int32_t b = 0; b < 32; ++b) EXPECT_EQ(pool.ref_count(b), 0);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> all, pool.Allocate(32));
  EXPECT_EQ(all.size(), 32u);
}

}  // namespace
}  // namespace tandem
