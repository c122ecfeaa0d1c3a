// Prefix-aware scoring (routing_policy.h's *ByPrefix, pure functions over
// made-up snapshots) and PrefixRouter, which feeds them from its index with
// the very hashes the workers compute.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/prefix_routing.h"
#include "router/routing_policy.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

WorkerSnapshot Prefill(std::string address, int waiting = 0, int inflight = 0) {
  WorkerSnapshot s;
  s.address = std::move(address);
  s.role = WorkerRole::kPrefill;
  s.healthy = true;
  s.weights_fingerprint = "00000000000fa4e1";
  s.kv_dtype = "f32";
  s.block_size = 16;
  s.kv_blocks_total = 1000;
  s.kv_blocks_free = 1000;
  s.waiting = waiting;
  s.inflight = inflight;
  return s;
}

WorkerSnapshot Decode(std::string address, int free_blocks, int running = 0) {
  WorkerSnapshot s = Prefill(std::move(address));
  s.role = WorkerRole::kDecode;
  s.kv_blocks_free = free_blocks;
  s.running = running;
  return s;
}

PrefixAffinity Cached(std::vector<std::pair<std::string, int>> cached, int load_tokens = 128) {
  PrefixAffinity a;
  a.load_tokens = load_tokens;
  for (auto& [address, tokens] : cached) a.cached_tokens[address] = tokens;
  return a;
}

TEST(PickPrefillWorkerByPrefix, CachedPrefixWinsUntilTheLoadGapExceedsIt) {
  // 384 of 448 tokens cached on "a"; each request ahead costs 128 tokens.
  const PrefixAffinity affinity = Cached({{"a", 384}});
  for (int queue = 0; queue <= 2; ++queue) {
    const auto pick = PickPrefillWorkerByPrefix({Prefill("a", queue), Prefill("b")}, 448, affinity);
    ASSERT_TRUE(pick.has_value());
    EXPECT_EQ(pick->address, "a") << "queue " << queue;
  }
  // 3 x 128 = 384: equal cost, the shorter queue wins.
  auto pick = PickPrefillWorkerByPrefix({Prefill("a", 3), Prefill("b")}, 448, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  // Router in-flight requests count as queue too.
  pick = PickPrefillWorkerByPrefix({Prefill("a", 0, 4), Prefill("b")}, 448, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
}

TEST(PickPrefillWorkerByPrefix, LongerCachedPrefixWins) {
  const auto pick = PickPrefillWorkerByPrefix({Prefill("a"), Prefill("b"), Prefill("c")}, 448,
                                              Cached({{"a", 128}, {"b", 256}}));
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  EXPECT_THAT(pick->reason, HasSubstr("256 of 448 prompt tokens cached"));
  EXPECT_THAT(pick->reason, HasSubstr("best of 3"));
}

TEST(PickPrefillWorkerByPrefix, ReasonTellsTheCachedTokensAndCost) {
  const auto pick =
      PickPrefillWorkerByPrefix({Prefill("a", 1), Prefill("b", 3)}, 448, Cached({{"a", 384}}));
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");
  EXPECT_THAT(pick->reason, HasSubstr("prefill a: 384 of 448 prompt tokens cached per the prefix "
                                      "index, cost 192 = 64 uncached + 1 x 128"));
}

TEST(PickPrefillWorkerByPrefix, TiesGoToTheShorterQueueThenFewerIndexedBlocksThenAddress) {
  PrefixAffinity affinity = Cached({}, /*load_tokens=*/0);
  // No load penalty: equal cost, the shorter queue wins.
  auto pick = PickPrefillWorkerByPrefix({Prefill("a", 2), Prefill("b", 1)}, 100, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  // Equal queues: the worker the index holds less for.
  affinity.indexed_blocks["a"] = 10;
  affinity.indexed_blocks["b"] = 30;
  pick = PickPrefillWorkerByPrefix({Prefill("a"), Prefill("b")}, 100, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");
  // All equal: the address.
  affinity.indexed_blocks.clear();
  pick = PickPrefillWorkerByPrefix({Prefill("b"), Prefill("a")}, 100, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");
}

TEST(PickPrefillWorkerByPrefix, SkipsExcludedAndUnroutableWorkers) {
  const PrefixAffinity affinity = Cached({{"a", 384}, {"b", 256}});
  std::vector<WorkerSnapshot> w = {Prefill("a"), Prefill("b"), Prefill("c")};
  auto pick = PickPrefillWorkerByPrefix(w, 448, affinity, {"a"});
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  EXPECT_THAT(pick->reason, HasSubstr("not yet tried"));
  w[1].draining = true;
  pick = PickPrefillWorkerByPrefix(w, 448, affinity, {"a"});
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "c");
  EXPECT_FALSE(PickPrefillWorkerByPrefix(w, 448, affinity, {"a", "c"}).has_value());
  EXPECT_FALSE(PickPrefillWorkerByPrefix({}, 448, affinity).has_value());
}

TEST(PickPrefillWorkerByPrefix, CachedTokensBeyondThePromptAreClamped) {
  const auto pick =
      PickPrefillWorkerByPrefix({Prefill("a"), Prefill("b", 1)}, 10, Cached({{"b", 1000}}));
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");  // b: 0 uncached + 128 > a: 10 uncached.
}

TEST(PickDecodeWorkerByPrefix, RoomComesBeforeTheCache) {
  // 448 + 64 tokens = 32 blocks; "a" holds the prefix but has 20 free.
  const PrefixAffinity affinity = Cached({{"a", 384}});
  auto pick = PickDecodeWorkerByPrefix({Decode("a", 20), Decode("b", 40, 5)}, 448, 64, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  // Nobody has room: the most free blocks, cache or not.
  pick = PickDecodeWorkerByPrefix({Decode("a", 20), Decode("b", 25, 5)}, 448, 64, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  EXPECT_THAT(pick->reason, HasSubstr("no worker has room"));
}

TEST(PickDecodeWorkerByPrefix, AmongWorkersWithRoomCacheAgainstLoad) {
  const PrefixAffinity affinity = Cached({{"a", 384}});
  auto pick = PickDecodeWorkerByPrefix({Decode("a", 100, 2), Decode("b", 100)}, 448, 64, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");
  EXPECT_THAT(pick->reason, HasSubstr("384 of 448 prompt tokens cached"));
  // Load gap 3 x 128 = the cached tokens: tie, the lighter load wins.
  pick = PickDecodeWorkerByPrefix({Decode("a", 100, 3), Decode("b", 100)}, 448, 64, affinity);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  // Equal cost and load: more free blocks, then fewer indexed blocks.
  pick = PickDecodeWorkerByPrefix({Decode("a", 90), Decode("b", 100)}, 448, 64, Cached({}));
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  PrefixAffinity indexed = Cached({});
  indexed.indexed_blocks["a"] = 5;
  pick = PickDecodeWorkerByPrefix({Decode("a", 100), Decode("b", 100)}, 448, 64, indexed);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  // Exclusions hold.
  pick =
      PickDecodeWorkerByPrefix({Decode("a", 100), Decode("b", 100, 9)}, 448, 64, affinity, {"a"});
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  EXPECT_FALSE(PickDecodeWorkerByPrefix({Decode("a", 100)}, 448, 64, affinity, {"a"}).has_value());
}

// PrefixRouter over real block hashes.
std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 7 + seed) % 60);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(PrefixRouter, APromptSentToAWorkerIsFoundThereByTheNextSharingItsPrefix) {
  PrefixRouter router({.load_tokens = 16});
  const std::vector<WorkerSnapshot> pool = {Prefill("a"), Prefill("b")};
  const std::vector<int32_t> first = Concat(Tokens(64, 1), Tokens(8, 2));
  PromptBlocks first_blocks(first);
  auto pick = router.PickPrefill(pool, first_blocks);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");
  EXPECT_THAT(pick->reason, HasSubstr("0 of 72 prompt tokens cached"));
  router.RecordPrompt(WorkerRole::kPrefill, "a", first_blocks);
  EXPECT_EQ(router.index(WorkerRole::kPrefill).size("a"), 4);  // 72 tokens: 4 full blocks.

  // Same 64-token prefix, another suffix: 4 blocks cached on "a", even
  // with "a" busier (2 x 16 < 64).
  const std::vector<int32_t> second = Concat(Tokens(64, 1), Tokens(20, 5));
  PromptBlocks second_blocks(second);
  const std::vector<WorkerSnapshot> busy = {Prefill("a", 2), Prefill("b")};
  const PrefixAffinity a = router.Affinity(WorkerRole::kPrefill, busy, second_blocks, {});
  EXPECT_EQ(a.cached_tokens.at("a"), 64);
  EXPECT_EQ(a.cached_tokens.at("b"), 0);
  EXPECT_EQ(a.indexed_blocks.at("a"), 4);
  pick = router.PickPrefill(busy, second_blocks);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");
  EXPECT_THAT(pick->reason, HasSubstr("64 of 84 prompt tokens cached"));

  // An unrelated prompt goes to the worker the index holds less for.
  const std::vector<int32_t> other = Tokens(72, 33);
  PromptBlocks other_blocks(other);
  pick = router.PickPrefill(pool, other_blocks);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");

  // The decode pool has its own index.
  EXPECT_EQ(router.index(WorkerRole::kDecode).size("a"), 0);
}

TEST(PrefixRouter, TheLastPromptTokenIsNeverCountedCached) {
  PrefixRouter router;
  const std::vector<WorkerSnapshot> pool = {Prefill("a")};
  const std::vector<int32_t> prompt = Tokens(64, 1);
  PromptBlocks blocks(prompt);
  ASSERT_TRUE(router.PickPrefill(pool, blocks).has_value());
  router.RecordPrompt(WorkerRole::kPrefill, "a", blocks);
  PromptBlocks again(prompt);
  // 4 full blocks held, but the one holding the last token is computed.
  EXPECT_EQ(router.Affinity(WorkerRole::kPrefill, pool, again, {}).cached_tokens.at("a"), 48);
}

TEST(PrefixRouter, AFinishedDecodeSequenceLeavesItsWrittenBlocks) {
  PrefixRouter router;
  const std::vector<WorkerSnapshot> pool = {Decode("a", 100), Decode("b", 100)};
  const std::vector<int32_t> prompt = Tokens(40, 1);
  const std::vector<int32_t> generated = Tokens(30, 9);
  PromptBlocks blocks(prompt);
  ASSERT_TRUE(router.PickDecode(pool, blocks, 30).has_value());
  router.RecordPrompt(WorkerRole::kDecode, "a", blocks);
  EXPECT_EQ(router.index(WorkerRole::kDecode).size("a"), 2);
  router.RecordFinished("a", blocks, generated);
  // 70 tokens, the last one's K/V unwritten: 4 full blocks.
  EXPECT_EQ(router.index(WorkerRole::kDecode).size("a"), 4);

  // The chat's next turn: prompt + answer + a new message.
  const std::vector<int32_t> next = Concat(Concat(prompt, generated), Tokens(30, 4));
  PromptBlocks next_blocks(next);
  const auto pick = router.PickDecode(pool, next_blocks, 30);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "a");
  EXPECT_THAT(pick->reason, HasSubstr("64 of 100 prompt tokens cached"));
}

TEST(PrefixRouter, NothingIsRecordedForAWorkerWithoutStats) {
  PrefixRouter router;
  const std::vector<int32_t> prompt = Tokens(64, 1);
  PromptBlocks blocks(prompt);
  router.RecordPrompt(WorkerRole::kPrefill, "a", blocks);  // Never synced.
  EXPECT_EQ(router.index(WorkerRole::kPrefill).size("a"), 0);
}

}  // namespace
}  // namespace tandem::router
