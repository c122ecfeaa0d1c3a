// PrefixIndex: longest-prefix lookups, the LRU bound, and how the workers'
// stats trim it (restarts, flushes, departures, identity changes, a cache
// that is off). Hashes are made up: the index treats them as opaque names.
#include "router/prefix_index.h"

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

// Block i of chain `chain`.
std::vector<BlockHash> Chain(uint64_t chain, int n, int first = 0) {
  std::vector<BlockHash> out;
  for (int i = first; i < first + n; ++i) out.push_back({chain, static_cast<uint64_t>(i)});
  return out;
}

WorkerSnapshot Worker(std::string address, int kv_blocks_total = 1000) {
  WorkerSnapshot s;
  s.address = std::move(address);
  s.healthy = true;
  s.weights_fingerprint = "00000000000fa4e1";
  s.kv_dtype = "f32";
  s.block_size = 16;
  s.kv_blocks_total = kv_blocks_total;
  return s;
}

TEST(PrefixIndex, MatchCountsTheLeadingBlocksAWorkerHolds) {
  PrefixIndex index;
  index.Sync({Worker("a"), Worker("b")});
  index.Insert("a", Chain(1, 4));
  EXPECT_EQ(index.Match("a", Chain(1, 4)), 4);
  EXPECT_EQ(index.Match("a", Chain(1, 6)), 4);  // Longer prompt: its first 4.
  EXPECT_EQ(index.Match("a", Chain(1, 2)), 2);
  EXPECT_EQ(index.Match("b", Chain(1, 4)), 0);
  EXPECT_EQ(index.Match("nobody", Chain(1, 4)), 0);
  EXPECT_EQ(index.Match("a", {}), 0);
  // The walk stops at the first block it does not hold.
  std::vector<BlockHash> diverged = Chain(1, 2);
  diverged.push_back({9, 9});
  diverged.push_back({1, 3});
  EXPECT_EQ(index.Match("a", diverged), 2);
  EXPECT_EQ(index.size("a"), 4);
  EXPECT_EQ(index.size("b"), 0);
}

TEST(PrefixIndex, SharedBlocksAreHeldOnce) {
  PrefixIndex index;
  index.Sync({Worker("a")});
  index.Insert("a", Chain(1, 4));
  std::vector<BlockHash> longer = Chain(1, 4);
  longer.push_back({1, 100});
  index.Insert("a", longer);
  EXPECT_EQ(index.size("a"), 5);
  EXPECT_EQ(index.Match("a", longer), 5);
}

TEST(PrefixIndex, HoldsAtMostKvBlocksTotalEvictingTailsOfTheLeastRecentFirst) {
  PrefixIndex index;
  index.Sync({Worker("a", /*kv_blocks_total=*/4)});
  index.Insert("a", Chain(1, 3));
  index.Insert("a", Chain(2, 3));
  EXPECT_EQ(index.size("a"), 4);
  EXPECT_EQ(index.Match("a", Chain(2, 3)), 3);
  // Chain 1 lost its tail, kept its first block.
  EXPECT_EQ(index.Match("a", Chain(1, 3)), 1);
}

TEST(PrefixIndex, UsingAChainAgainMakesItTheMostRecent) {
  PrefixIndex index;
  index.Sync({Worker("a", /*kv_blocks_total=*/6)});
  index.Insert("a", Chain(1, 3));
  index.Insert("a", Chain(2, 3));
  index.Insert("a", Chain(1, 3));  // Chain 2 is now the least recent.
  index.Insert("a", Chain(3, 3));
  EXPECT_EQ(index.Match("a", Chain(1, 3)), 3);
  EXPECT_EQ(index.Match("a", Chain(3, 3)), 3);
  EXPECT_EQ(index.Match("a", Chain(2, 3)), 0);
}

TEST(PrefixIndex, ABoundBeforeTheFirstStats) {
  PrefixIndex index;
  index.Insert("a", Chain(1, PrefixIndex::kDefaultCapacityBlocks + 10));
  EXPECT_EQ(index.size("a"), PrefixIndex::kDefaultCapacityBlocks);
  // The stats then bound it by the worker's pool.
  index.Sync({Worker("a", /*kv_blocks_total=*/100)});
  EXPECT_EQ(index.size("a"), 100);
  EXPECT_EQ(index.Match("a", Chain(1, 200)), 100);
}

TEST(PrefixIndex, ARestartedWorkerStartsEmpty) {
  PrefixIndex index;
  WorkerSnapshot a = Worker("a");
  a.requests_total = 10;
  a.prefix_cache_queried_tokens = 640;
  a.kv_blocks_cached = 8;
  index.Sync({a});
  index.Insert("a", Chain(1, 8));
  a.requests_total = 12;
  a.prefix_cache_queried_tokens = 700;
  index.Sync({a});
  EXPECT_EQ(index.size("a"), 8);  // Counters went up: same process.

  a.requests_total = 1;  // Went down: a new process.
  a.prefix_cache_queried_tokens = 700;
  index.Sync({a});
  EXPECT_EQ(index.size("a"), 0);

  index.Insert("a", Chain(1, 8));
  a.requests_total = 5;
  a.prefix_cache_queried_tokens = 16;  // Only this counter went down.
  index.Sync({a});
  EXPECT_EQ(index.size("a"), 0);
}

TEST(PrefixIndex, ADropOfCachedBlocksTrimsTheLeastRecent) {
  PrefixIndex index;
  WorkerSnapshot a = Worker("a");
  a.requests_total = 10;
  a.prefix_cache_queried_tokens = 640;
  a.kv_blocks_cached = 100;
  index.Sync({a});
  index.Insert("a", Chain(1, 60));
  index.Insert("a", Chain(2, 40));
  // A small drop is within the slack: nothing trimmed.
  a.kv_blocks_cached = 90;
  index.Sync({a});
  EXPECT_EQ(index.size("a"), 100);
  // A flush: trimmed to what the worker holds, the most recent kept.
  a.kv_blocks_cached = 10;
  index.Sync({a});
  EXPECT_EQ(index.size("a"), 10);
  EXPECT_EQ(index.Match("a", Chain(2, 40)), 10);
  EXPECT_EQ(index.Match("a", Chain(1, 60)), 0);
  // Stats that merely stay low (no new drop) trim nothing more.
  index.Insert("a", Chain(3, 50));
  index.Sync({a});
  EXPECT_EQ(index.size("a"), 60);
}

TEST(PrefixIndex, WorkersThatLeaveThePoolAreForgotten) {
  PrefixIndex index;
  index.Sync({Worker("a"), Worker("b")});
  index.Insert("a", Chain(1, 4));
  index.Insert("b", Chain(1, 4));
  index.Sync({Worker("a")});
  EXPECT_EQ(index.size("a"), 4);
  EXPECT_EQ(index.size("b"), 0);
  EXPECT_EQ(index.Match("b", Chain(1, 4)), 0);
  EXPECT_FALSE(index.KeyOf("b").has_value());
}

TEST(PrefixIndex, ANewModelOrLayoutStartsEmpty) {
  PrefixIndex index;
  WorkerSnapshot a = Worker("a");
  index.Sync({a});
  ASSERT_TRUE(index.KeyOf("a").has_value());
  EXPECT_EQ(index.KeyOf("a")->block_size, 16);
  index.Insert("a", Chain(1, 4));
  a.kv_dtype = "bf16";
  index.Sync({a});
  EXPECT_EQ(index.size("a"), 0);
  EXPECT_EQ(index.KeyOf("a")->kv_dtype, "bf16");
}

TEST(PrefixIndex, NothingIsRecordedForAWorkerWhoseCacheIsOff) {
  PrefixIndex index;
  WorkerSnapshot a = Worker("a");
  a.requests_total = 3;  // Served requests, looked nothing up.
  index.Sync({a});
  index.Insert("a", Chain(1, 4));
  EXPECT_EQ(index.size("a"), 0);
  // Once it looks prompts up, it is recorded again.
  a.prefix_cache_queried_tokens = 64;
  index.Sync({a});
  index.Insert("a", Chain(1, 4));
  EXPECT_EQ(index.size("a"), 4);
}

TEST(PrefixIndex, UnpolledWorkersAreKeptWithoutAKey) {
  PrefixIndex index;
  WorkerSnapshot a = Worker("a");
  a.block_size = 0;  // No stats yet.
  index.Sync({a});
  EXPECT_FALSE(index.KeyOf("a").has_value());
}

TEST(PrefixIndex, ConcurrentInsertsAndLookupsStayBounded) {
  PrefixIndex index;
  index.Sync({Worker("a", /*kv_blocks_total=*/64)});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&index, t] {
      for (int i = 0; i < 200; ++i) {
        index.Insert("a", Chain(t * 1000 + i, 8));
        (void)index.Match("a", Chain(t * 1000 + i, 8));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(index.size("a"), 64);
}

}  // namespace
}  // namespace tandem::router
