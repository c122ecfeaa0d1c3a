// The prefill worker's prefix cache and partial leases: two loops on one
// fabric, one with the cache and one without, must give the same first
// tokens, logprobs and landed KV bytes, while the cached one computes only
// the blocks a prompt does not share and ships only the blocks a lease asks
// for.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/sampler.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "prefill_worker/prefill_loop.h"
#include "prefill_worker/prefill_metrics.h"
#include "prometheus/registry.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::DecodeSide;
using ::tandem::prefill::testing::MakeEngine;
using ::tandem::prefill::testing::Outcome;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::prefill::testing::ReferenceTokens;
using ::tandem::prefill::testing::TestShape;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(60);
constexpr int kBlock = 16;  // The loops' default block size.

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& tokens, size_t n) {
  return std::vector<int32_t>(tokens.begin(), tokens.begin() + n);
}

double Value(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name || family.metric.empty()) continue;
    const prometheus::ClientMetric& m = family.metric.front();
    return family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
  }
  return -1;
}

class PrefillCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(weights_, MakeSyntheticModel(TestShape(), 7));
    fabric_ = kvtransfer::InProcFabric::Create();
    decode_ = std::make_unique<DecodeSide>(*weights_, fabric_, 512);
    reference_ = MakeEngine(*weights_, 64);
    vocab_ = weights_->config.vocab_size;
  }

  // Starts `cached_` (prefix cache on, feeding `registry_`) and `uncached_`
  // (off), both with `options` otherwise.
  void StartLoops(PrefillLoopOptions options = {}) {
    options.model_name = "synthetic";
    for (bool cache : {true, false}) {
      PrefillLoopOptions o = options;
      o.prefix_cache = cache;
      o.metrics = cache ? &metrics_ : nullptr;
      transports_.push_back(kvtransfer::InProcTransport::Create(fabric_));
      auto backend = CpuBackend::Create(CpuBackendOptions{1});
      ASSERT_OK(backend.status());
      ASSERT_OK_AND_ASSIGN(
          (cache ? cached_ : uncached_),
          PrefillLoop::Create(*weights_, std::move(backend).value(), transports_.back().get(),
                              &Clock::Real(), o));
    }
  }

  PrefillJob Job(const std::vector<int32_t>& tokens, const DecodeSide::Lease& lease) {
    PrefillJob job;
    job.request_id = absl::StrCat("r", lease.request_id);
    job.tokens = tokens;
    job.kv_descriptor = lease.descriptor;
    job.deadline = absl::Now() + kWait;
    return job;
  }

  // Submits `job` to `loop` and drives the decode side until the job was
  // answered and, when it succeeded, its lease has ended.
  absl::StatusOr<PrefillResult> Run(PrefillLoop& loop, const PrefillJob& job,
                                    const DecodeSide::Lease& lease) {
    Outcome out;
    loop.Submit(job, out.Callback());
    const bool ended = decode_->PumpUntil([&] {
      return out.done() && (lease.ended || !out.status().ok());
    });
    EXPECT_TRUE(ended) << job.request_id << " did not end";
    return out.result();
  }

  // A plain greedy prefill of `prompt` into a new lease from `first_block`.
  absl::StatusOr<PrefillResult> Prefill(PrefillLoop& loop, const std::vector<int32_t>& prompt,
                                        DecodeSide::Lease** lease_out = nullptr,
                                        int first_block = 0) {
    DecodeSide::Lease* lease =
        decode_->Expect(static_cast<int>(prompt.size()), 16, absl::Now() + kWait, first_block);
    if (lease_out != nullptr) *lease_out = lease;
    return Run(loop, Job(prompt, *lease), *lease);
  }

  // The landed K/V of prompt blocks [from, to) of `lease`: the slots of
  // prompt tokens only (the rest of a last block holds whatever the block
  // held before), or with `whole` every byte.
  std::vector<std::string> Blocks(const DecodeSide::Lease& lease, int from, int to,
                                  bool whole = false) {
    const KvLayout& layout = reference_->kv_layout();
    const size_t element = layout.element_bytes();
    const size_t kv_dim = static_cast<size_t>(layout.kv_dim);
    std::vector<std::string> blocks;
    for (int b = from; b < to; ++b) {
      const std::string bytes = decode_->BlockBytes(lease, b);
      if (whole) {
        blocks.push_back(bytes);
        continue;
      }
      const size_t slots = std::min(kBlock, lease.prompt_len - b * kBlock);
      std::string valid;
      for (size_t layer = 0; layer * layout.block_bytes() < bytes.size(); ++layer) {
        const char* base = bytes.data() + layer * layout.block_bytes();
        for (size_t d = 0; d < kv_dim; ++d) {  // Keys: dimension-major.
          valid.append(base + d * kBlock * element, slots * element);
        }
        const char* values = base + kv_dim * kBlock * element;  // Values: slot-major.
        valid.append(values, slots * kv_dim * element);
      }
      blocks.push_back(std::move(valid));
    }
    return blocks;
  }

  // Equal bytes, or where the first difference is and how large the
// largest one is (the KV is f32).
static ::testing::AssertionResult Same(const std::vector<std::string>& got,
                                       const std::vector<std::string>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " blocks, want " << want.size();
  }
  for (size_t b = 0; b < got.size(); ++b) {
    if (got[b] == want[b]) continue;
    const auto* g = reinterpret_cast<const float*>(got[b].data());
    const auto* w = reinterpret_cast<const float*>(want[b].data());
    size_t first = 0, differ = 0;
    float largest = 0;
    for (size_t i = 0; i < got[b].size() / sizeof(float); ++i) {
      if (g[i] == w[i]) continue;
      if (differ++ == 0) first = i;
      largest = std::max(largest, std::abs(g[i] - w[i]));
    }
    return ::testing::AssertionFailure() << "block " << b << ": " << differ
                                         << " floats differ, first at " << first
                                         << ", largest by " << largest;
  }
  return ::testing::AssertionSuccess();
}

int32_t Greedy(const std::vector<int32_t>& prompt) {
    return ReferenceTokens(*reference_, prompt, 1).front();
  }

  int64_t BlockBytes(int blocks) const {
    const KvLayout& layout = reference_->kv_layout();
    return int64_t{blocks} * layout.n_layers * static_cast<int64_t>(layout.block_bytes());
  }

  // Every block free or only cached, nothing running.
  void ExpectNothingHeld(PrefillLoop& loop) {
    const PrefillStats stats = loop.Stats();
    EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
    EXPECT_EQ(stats.running, 0);
    EXPECT_EQ(stats.waiting, 0);
  }

  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<DecodeSide> decode_;
  std::unique_ptr<Engine> reference_;
  prometheus::Registry registry_;
  PrefillMetrics metrics_{registry_};
  std::vector<std::unique_ptr<kvtransfer::InProcTransport>> transports_;
  // After the transports, so that they go first.
  std::unique_ptr<PrefillLoop> cached_;
  std::unique_ptr<PrefillLoop> uncached_;
  int vocab_ = 0;
};

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

// The decode side holds the first blocks already: only the rest is shipped,
// and the held blocks are never written.
TEST_F(PrefillCacheTest, LeaseFromFirstBlockShipsOnlyTheRest) {
  StartLoops({.max_batch_tokens = kBlock});
  const std::vector<int32_t> prompt = RandomTokens(52, vocab_, 7);  // 4 blocks
  DecodeSide::Lease* whole = nullptr;
  ASSERT_OK_AND_ASSIGN(PrefillResult full, Prefill(*uncached_, prompt, &whole));
  EXPECT_EQ(full.kv_bytes, BlockBytes(4));

  for (PrefillLoop* loop : {uncached_.get(), cached_.get()}) {
    for (int first_block : {2, 3}) {
      SCOPED_TRACE(absl::StrCat(loop == cached_.get() ? "cached" : "uncached", " first_block ",
                                first_block));
      const uint64_t sent_before = loop->Stats().kv_transfer_bytes;
      DecodeSide::Lease* lease =
          decode_->Expect(static_cast<int>(prompt.size()), 16, absl::Now() + kWait, first_block);
      const std::vector<std::string> held = Blocks(*lease, 0, first_block, true);
      ASSERT_OK_AND_ASSIGN(PrefillResult part, Run(*loop, Job(prompt, *lease), *lease));
      EXPECT_OK(lease->status);
      EXPECT_EQ(part.first_token, full.first_token);
      EXPECT_EQ(part.kv_bytes, BlockBytes(4 - first_block));
      EXPECT_EQ(loop->Stats().kv_transfer_bytes - sent_before,
                static_cast<uint64_t>(part.kv_bytes));
      EXPECT_TRUE(Same(Blocks(*lease, first_block, 4), Blocks(*whole, first_block, 4)));
      EXPECT_TRUE(Same(Blocks(*lease, 0, first_block, true), held));
    }
  }

  DecodeSide::Lease* past = decode_->Expect(52, 16, absl::Now() + kWait, 5);
  EXPECT_THAT(Run(*cached_, Job(prompt, *past), *past).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("starts at block 5")));
  ExpectNothingHeld(*cached_);
  ExpectNothingHeld(*uncached_);
}

// A pool of 8 blocks: a 120-token job holds every block, later prompts
// evict cached ones; cancels and a failed transfer leave nothing held, and
// a flush empties the cache.
TEST_F(PrefillCacheTest, NothingLeaksAndFlushEmptiesTheCache) {
  StartLoops({.kv_blocks = 8});
  PrefillLoop& loop = *cached_;
  const std::vector<int32_t> big = RandomTokens(120, vocab_, 8);  // 7 full blocks + 8
  DecodeSide::Lease* big_lease = decode_->Expect(120);
  Outcome big_out;
  const JobId big_id = loop.Submit(Job(big, *big_lease), big_out.Callback());
  DecodeSide::Lease* queued_lease = decode_->Expect(10);
  Outcome queued;
  const JobId queued_id =
      loop.Submit(Job(RandomTokens(10, vocab_, 9), *queued_lease), queued.Callback());
  // The undriven decode side keeps the big job's transfer open.
  const auto wait_for = [](const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + kWait;
    while (!done()) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  };
  ASSERT_TRUE(wait_for([&] { return loop.Stats().steps == 1; }));
  loop.Cancel(queued_id);
  EXPECT_THAT(queued.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(loop.Stats().kv_blocks_cached, 7);  // Registered once computed.
  EXPECT_EQ(loop.Stats().kv_blocks_free, 0);
  loop.Cancel(big_id);
  ASSERT_TRUE(wait_for([&] { return big_out.done(); }));
  EXPECT_THAT(big_out.status(), StatusIs(absl::StatusCode::kCancelled));
  ExpectNothingHeld(loop);
  ASSERT_TRUE(decode_->PumpUntil([&] { return big_lease->ended; }));

  // Shares 4 blocks with the cancelled job and needs 2 more, which come
  // from evicting cached blocks.
  const std::vector<int32_t> shared = Concat(Prefix(big, 64), RandomTokens(30, vocab_, 10));
  ASSERT_OK_AND_ASSIGN(PrefillResult hit, Prefill(loop, shared));
  EXPECT_EQ(hit.cached_tokens, 64);
  EXPECT_EQ(hit.first_token, Greedy(shared));

  // The receiver gives up mid-transfer.
  const std::vector<int32_t> lost = Concat(Prefix(shared, 80), RandomTokens(20, vocab_, 11));
  DecodeSide::Lease* lost_lease = decode_->Expect(100);
  Outcome lost_out;
  loop.Submit(Job(lost, *lost_lease), lost_out.Callback());
  kvtransfer::TransferReceiver& receiver = decode_->receiver();
  const uint64_t accepted = receiver.stats().accepted_messages;
  ASSERT_TRUE(wait_for([&] {
    receiver.Poll();
    return receiver.stats().accepted_messages > accepted;
  }));
  ASSERT_OK(receiver.Cancel(lost_lease->request_id));
  ASSERT_TRUE(decode_->PumpUntil([&] { return lost_out.done(); }));
  EXPECT_THAT(lost_out.status(), StatusIs(absl::StatusCode::kCancelled));

  // Refused at admission: no blocks taken.
  DecodeSide::Lease* past = decode_->Expect(20, 16, absl::Now() + kWait, 3);
  EXPECT_THAT(Run(loop, Job(RandomTokens(20, vocab_, 12), *past), *past).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));

  ExpectNothingHeld(loop);
  const int cached = loop.Stats().kv_blocks_cached;
  EXPECT_GT(cached, 0);
  EXPECT_EQ(loop.FlushPrefixCache(), cached);
  const PrefillStats stats = loop.Stats();
  EXPECT_EQ(stats.kv_blocks_cached, 0);
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
  EXPECT_EQ(loop.FlushPrefixCache(), 0);

  // Flushed: the shared prompt is computed in full again, still exactly.
  ASSERT_OK_AND_ASSIGN(PrefillResult again, Prefill(loop, shared));
  EXPECT_EQ(again.cached_tokens, 0);
  EXPECT_EQ(again.first_token, hit.first_token);
  ExpectNothingHeld(loop);
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
