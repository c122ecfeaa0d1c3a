// The prefill worker's prefix cache against a loop without it: the same
// first tokens, prompt logprobs and landed K/V, while only the blocks a
// prompt does not share are computed.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "prefill_worker/prefill_loop.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/cache_fixture.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::Concat;
using ::tandem::prefill::testing::DecodeSide;
using ::tandem::prefill::testing::kBlock;
using ::tandem::prefill::testing::PrefillCacheTest;
using ::tandem::prefill::testing::Prefix;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::prefill::testing::ReferenceTokens;
using ::tandem::prefill::testing::Value;

// With 16 tokens a step, the steps a job takes count the tokens computed.
TEST_F(PrefillCacheTest, SharedPrefixComputesOnlyTheUncachedBlocks) {
  StartLoops({.max_batch_tokens = kBlock});
  const std::vector<int32_t> first = RandomTokens(40, vocab_, 1);  // 2 full blocks
  const std::vector<int32_t> second =
      Concat(Prefix(first, 32), RandomTokens(20, vocab_, 2));  // 52 tokens, 4 blocks

  ASSERT_OK_AND_ASSIGN(PrefillResult a, Prefill(*cached_, first));
  EXPECT_EQ(a.cached_tokens, 0);
  EXPECT_EQ(cached_->Stats().steps, 3u);
  EXPECT_EQ(cached_->Stats().kv_blocks_cached, 2);

  DecodeSide::Lease* hit = nullptr;
  ASSERT_OK_AND_ASSIGN(PrefillResult b, Prefill(*cached_, second, &hit));
  EXPECT_EQ(b.cached_tokens, 32);
  EXPECT_EQ(cached_->Stats().steps, 3u + 2u);  // 20 tokens computed, not 52.

  DecodeSide::Lease* miss = nullptr;
  ASSERT_OK_AND_ASSIGN(PrefillResult reference, Prefill(*uncached_, second, &miss));
  EXPECT_EQ(reference.cached_tokens, 0);
  EXPECT_EQ(uncached_->Stats().steps, 4u);

  EXPECT_EQ(b.first_token, reference.first_token);
  EXPECT_EQ(b.first_token, Greedy(second));
  EXPECT_EQ(b.kv_bytes, BlockBytes(4));
  EXPECT_EQ(b.kv_bytes, reference.kv_bytes);
  EXPECT_TRUE(Same(Blocks(*hit, 0, 4), Blocks(*miss, 0, 4)));
  EXPECT_EQ(decode_->Continue(*hit, b.first_token, 6), ReferenceTokens(*reference_, second, 6));

  // Lookups stop short of the last token: 2 blocks of the first prompt,
  // 3 of the second (2 found).
  const PrefillStats stats = cached_->Stats();
  EXPECT_EQ(stats.prefix_cache_queried_tokens, 80u);
  EXPECT_EQ(stats.prefix_cache_hit_tokens, 32u);
  EXPECT_EQ(stats.kv_blocks_cached, 3);
  EXPECT_EQ(Value(registry_, "tandem_prefill_prefix_cache_queried_tokens_total"), 80);
  EXPECT_EQ(Value(registry_, "tandem_prefill_prefix_cache_hit_tokens_total"), 32);
  EXPECT_EQ(Value(registry_, "tandem_prefill_kv_blocks_cached"), 3);
  ExpectNothingHeld(*cached_);
  ExpectNothingHeld(*uncached_);
}

// One block a step in every test that compares K/V bytes: the cached and
// the uncached loop then compute the same chunks, so equal K/V is bitwise
// equal (other chunkings round differently).
TEST_F(PrefillCacheTest, FullyCachedPromptStillComputesItsLastBlock) {
  StartLoops({.max_batch_tokens = kBlock});
  for (int len : {48, 40}) {  // Ending on a block boundary, and not.
    SCOPED_TRACE(len);
    const std::vector<int32_t> prompt = RandomTokens(len, vocab_, 3 + len);
    ASSERT_OK_AND_ASSIGN(PrefillResult first, Prefill(*cached_, prompt));
    EXPECT_EQ(first.cached_tokens, 0);
    DecodeSide::Lease* hit = nullptr;
    ASSERT_OK_AND_ASSIGN(PrefillResult again, Prefill(*cached_, prompt, &hit));
    EXPECT_EQ(again.cached_tokens, 32);
    DecodeSide::Lease* miss = nullptr;
    ASSERT_OK_AND_ASSIGN(PrefillResult reference, Prefill(*uncached_, prompt, &miss));
    EXPECT_EQ(again.first_token, first.first_token);
    EXPECT_EQ(again.first_token, reference.first_token);
    EXPECT_EQ(again.first_token, Greedy(prompt));
    EXPECT_TRUE(Same(Blocks(*hit, 0, 3), Blocks(*miss, 0, 3)));
  }
  // 48: 3 blocks (the recomputed third one duplicates a cached hash and is
  // freed); 40: 2.
  EXPECT_EQ(cached_->Stats().kv_blocks_cached, 5);
  ExpectNothingHeld(*cached_);
}

TEST_F(PrefillCacheTest, PromptLogprobsTakeNoCachedBlocksButLeaveTheirOwn) {
  StartLoops({.max_batch_tokens = kBlock});
  const std::vector<int32_t> first = RandomTokens(40, vocab_, 4);
  const std::vector<int32_t> second = Concat(Prefix(first, 32), RandomTokens(20, vocab_, 5));
  const std::vector<int32_t> third = Concat(Prefix(second, 48), RandomTokens(10, vocab_, 6));
  ASSERT_OK(Prefill(*cached_, first).status());
  const PrefillStats before = cached_->Stats();

  std::vector<PrefillResult> results;
  for (PrefillLoop* loop : {cached_.get(), uncached_.get()}) {
    DecodeSide::Lease* lease = decode_->Expect(static_cast<int>(second.size()));
    PrefillJob job = Job(second, *lease);
    job.prompt_logprobs = true;
    job.logprobs = 3;
    ASSERT_OK_AND_ASSIGN(PrefillResult result, Run(*loop, job, *lease));
    results.push_back(result);
  }
  const PrefillResult& got = results[0];
  const PrefillResult& want = results[1];
  EXPECT_EQ(got.cached_tokens, 0);
  EXPECT_EQ(cached_->Stats().steps - before.steps, 4u);  // Every token computed.
  EXPECT_EQ(cached_->Stats().prefix_cache_queried_tokens, before.prefix_cache_queried_tokens);
  EXPECT_EQ(cached_->Stats().prefix_cache_hit_tokens, before.prefix_cache_hit_tokens);
  EXPECT_EQ(got.first_token, want.first_token);
  ASSERT_EQ(got.prompt_logprobs.size(), second.size() - 1);
  ASSERT_EQ(want.prompt_logprobs.size(), second.size() - 1);
  for (size_t t = 0; t < got.prompt_logprobs.size(); ++t) {
    EXPECT_EQ(got.prompt_logprobs[t].token_id, want.prompt_logprobs[t].token_id);
    EXPECT_FLOAT_EQ(got.prompt_logprobs[t].logprob, want.prompt_logprobs[t].logprob)
        << "position " << t;
    ASSERT_EQ(got.prompt_logprobs[t].top.size(), 3u);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(got.prompt_logprobs[t].top[k].token_id, want.prompt_logprobs[t].top[k].token_id);
    }
  }

  // The logprobs prompt registered its third block: a prompt sharing it hits.
  ASSERT_OK_AND_ASSIGN(PrefillResult c, Prefill(*cached_, third));
  EXPECT_EQ(c.cached_tokens, 48);
  EXPECT_EQ(c.first_token, Greedy(third));
  ExpectNothingHeld(*cached_);
}

TEST_F(PrefillCacheTest, CacheOffNeverReusesBlocks) {
  StartLoops({.max_batch_tokens = kBlock});
  const std::vector<int32_t> prompt = RandomTokens(48, vocab_, 13);
  const std::vector<int32_t> longer = Concat(prompt, RandomTokens(9, vocab_, 14));
  for (const std::vector<int32_t>* p : {&prompt, &prompt, &longer}) {
    ASSERT_OK_AND_ASSIGN(PrefillResult result, Prefill(*uncached_, *p));
    EXPECT_EQ(result.cached_tokens, 0);
  }
  const PrefillStats stats = uncached_->Stats();
  EXPECT_EQ(stats.steps, 3u + 3u + 4u);
  EXPECT_EQ(stats.prefix_cache_queried_tokens, 0u);
  EXPECT_EQ(stats.prefix_cache_hit_tokens, 0u);
  EXPECT_EQ(stats.kv_blocks_cached, 0);
  EXPECT_EQ(uncached_->FlushPrefixCache(), 0);
  ExpectNothingHeld(*uncached_);
}

}  // namespace
}  // namespace tandem::prefill
