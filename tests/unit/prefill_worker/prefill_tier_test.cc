// The prefill worker over an SSD KV tier (and host memory over it): a
// prompt whose blocks the pool evicted loads them back from the tier,
// verified, and lands the same K/V and first token as a worker without
// cache or tier; a damaged record, a
// slow disk or a cancel makes it compute what did not arrive, never fail;
// the tier survives a restart of the worker.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/executor.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/cache_events.h"
#include "common/kvcache/host_tier.h"
#include "common/kvcache/ssd_tier.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_scheduler.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/cache_fixture.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::DecodeSide;
using ::tandem::prefill::testing::kBlock;
using ::tandem::prefill::testing::kWait;
using ::tandem::prefill::testing::PrefillCacheTest;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::testing::StatusIs;

// A pool of 8 blocks over an SSD tier whose disk operations the test runs
// (io_), one block a step so that loaded and computed K/V are bitwise
// comparable with the uncached loop's.
class PrefillTierTest : public PrefillCacheTest {
 protected:
  void SetUp() override {
    PrefillCacheTest::SetUp();
    StartLoops({.max_batch_tokens = kBlock});
  }

  // With `host_records`, a host-memory tier of that many blocks over the SSD.
  SchedulerOptions Options(absl::Duration wait = kWait, uint64_t host_records = 0) {
    SchedulerOptions options{.kv_blocks = 8, .max_batch_tokens = kBlock};
    options.kv_tier_wait = wait;
    options.make_kv_tier =
        [this, host_records](const KvTierIdentity& id) -> absl::StatusOr<std::unique_ptr<KvTier>> {
      ASSIGN_OR_RETURN(
          std::unique_ptr<SsdTier> tier,
          SsdTier::Open(
              {.dir = dir_, .capacity_bytes = 64 * (TierRecordHeader::kBytes + id.payload_bytes())},
              id, &io_));
      tier_ = tier.get();
      if (host_records == 0) return std::unique_ptr<KvTier>(std::move(tier));
      ASSIGN_OR_RETURN(std::unique_ptr<HostTier> host,
                       HostTier::Create({.capacity_bytes = host_records * id.payload_bytes()}, id,
                                        &io_, std::move(tier)));
      host_ = host.get();
      return std::unique_ptr<KvTier>(std::move(host));
    };
    return options;
  }

  // Admits `prompt` and runs the scheduler, the decode side and (with
  // `run_io`) the tier's disk operations until the reply.
  absl::StatusOr<PrefillResult> Prefill(PrefillScheduler& s, const std::vector<int32_t>& prompt,
                                        DecodeSide::Lease** lease_out = nullptr,
                                        bool run_io = true) {
    std::unique_ptr<internal::Job> job = SchedulerJob(prompt, ++next_id_, lease_out);
    if (!s.TryAdmit(job)) return absl::ResourceExhaustedError("not admitted");
    const absl::Time deadline = absl::Now() + kWait;
    while (absl::Now() < deadline) {
      s.RunOnce();
      for (Reply& r : s.TakeReplies()) return std::move(r.result);
      if (run_io) io_.RunDue();
      decode_->receiver().Poll();
      s.WaitForTransfers(absl::Now() + absl::Milliseconds(1));
    }
    return absl::DeadlineExceededError("no reply");
  }

  // The reference: the loop without cache or tier.
  void ExpectSameAsUncached(const std::vector<int32_t>& prompt, const PrefillResult& got,
                            DecodeSide::Lease& lease) {
    DecodeSide::Lease* miss = nullptr;
    ASSERT_OK_AND_ASSIGN(PrefillResult want, PrefillCacheTest::Prefill(*uncached_, prompt, &miss));
    EXPECT_EQ(got.first_token, want.first_token);
    EXPECT_EQ(got.first_token, Greedy(prompt));
    const int blocks = static_cast<int>((prompt.size() + kBlock - 1) / kBlock);
    EXPECT_TRUE(Same(Blocks(lease, 0, blocks), Blocks(*miss, 0, blocks)));
  }

  // Computes `prompt` (72 tokens: 4 cached blocks and a partial one), then
  // two prompts of 8 blocks each, which evict it from the pool into the
  // tier; the tier's writes run.
  void ComputeAndEvict(PrefillScheduler& s, const std::vector<int32_t>& prompt) {
    ASSERT_OK_AND_ASSIGN(PrefillResult first, Prefill(s, prompt));
    EXPECT_EQ(first.cached_tokens, 0);
    for (uint64_t seed : {101, 102}) {
      ASSERT_OK(Prefill(s, RandomTokens(8 * kBlock, vocab_, seed)).status());
    }
    io_.RunDue();
    ASSERT_EQ(s.engine().block_pool().Lookup(Hashes(prompt)[0]), -1) << "still in the pool";
  }

  std::vector<BlockHash> Hashes(const std::vector<int32_t>& prompt) const {
    const BlockHash salt = BlockHashSalt(weights_->Fingerprint(), "f32", kBlock);
    return HashBlocks(salt, prompt, kBlock, static_cast<int>(prompt.size()) / kBlock);
  }

  std::string dir_ = absl::StrCat(::tandem::testing::TempDir(), "/prefill-tier-",
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  FakeClock io_clock_;
  ManualExecutor io_{&io_clock_};
  SsdTier* tier_ = nullptr;   // The scheduler's, once made.
  HostTier* host_ = nullptr;  // Its host tier, when Options made one.
  JobId next_id_ = 0;
};

TEST_F(PrefillTierTest, AnEvictedPromptLoadsFromTheTierAndLandsTheSameKv) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> s, MakeScheduler(Options()));
  const std::vector<int32_t> prompt = RandomTokens(72, vocab_, 100);
  ComputeAndEvict(*s, prompt);
  EXPECT_GE(s->tier_link()->stats().spilled, 4u);
  // The router hears of the prompt's blocks in the tier, through the
  // pool's events (which the loop publishes to GetStats).
  s->ForwardTierEvents();
  absl::flat_hash_set<BlockHash> in_tier;
  for (const CacheEvent& e : s->engine().block_pool().events().Read(0, 1 << 20).events) {
    if (e.tier == CacheTier::kSsd && e.kind == CacheEventKind::kStored) in_tier.insert(e.hash);
  }
  for (const BlockHash& h : Hashes(prompt)) EXPECT_TRUE(in_tier.contains(h));

  const uint64_t steps = s->counters().steps;
  DecodeSide::Lease* lease = nullptr;
  ASSERT_OK_AND_ASSIGN(PrefillResult again, Prefill(*s, prompt, &lease));
  EXPECT_EQ(again.cached_tokens, 64);
  EXPECT_EQ(s->counters().steps - steps, 1u);  // the last 8 tokens only
  EXPECT_EQ(s->counters().tier_hit_tokens, 64u);
  EXPECT_EQ(s->tier_link()->stats().blocks_loaded, 4u);
  EXPECT_EQ(tier_->stats().hits, 4u);
  ExpectSameAsUncached(prompt, again, *lease);
  EXPECT_EQ(decode_->Continue(*lease, again.first_token, 4),
            ::tandem::prefill::testing::ReferenceTokens(*reference_, prompt, 4));
  s->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
  EXPECT_EQ(s->free_blocks(), s->total_blocks());
}

// Host memory over the SSD: with room for the prompt the blocks come back
// from host memory; with room for only the last evicted blocks, the
// prompt's went on down and come back from the SSD through it. Either way
// the K/V are those of a worker without cache or tier.
TEST_F(PrefillTierTest, AnEvictedPromptLoadsFromHostMemoryOrTheSsdBelowIt) {
  for (const uint64_t host_records : {64u, 4u}) {
    SCOPED_TRACE(absl::StrCat(host_records, " host records"));
    std::filesystem::remove_all(dir_);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> s,
                         MakeScheduler(Options(kWait, host_records)));
    const std::vector<int32_t> prompt = RandomTokens(72, vocab_, 100 + host_records);
    ComputeAndEvict(*s, prompt);
    s->ForwardTierEvents();
    absl::flat_hash_set<BlockHash> in_host, on_ssd;
    for (const CacheEvent& e : s->engine().block_pool().events().Read(0, 1 << 20).events) {
      auto& set = e.tier == CacheTier::kHost ? in_host : on_ssd;
      if (e.tier == CacheTier::kPool) continue;
      if (e.kind == CacheEventKind::kStored) set.insert(e.hash);
      if (e.kind == CacheEventKind::kEvicted) set.erase(e.hash);
    }
    const bool from_host = host_records == 64;
    for (const BlockHash& h : Hashes(prompt)) {
      EXPECT_EQ(in_host.contains(h), from_host);
      EXPECT_EQ(on_ssd.contains(h), !from_host);
    }
    DecodeSide::Lease* lease = nullptr;
    ASSERT_OK_AND_ASSIGN(PrefillResult again, Prefill(*s, prompt, &lease));
    EXPECT_EQ(again.cached_tokens, 64);
    EXPECT_EQ(s->counters().tier_hit_tokens, 64u);
    EXPECT_EQ(host_->stats().hits, from_host ? 4u : 0u);
    EXPECT_EQ(tier_->stats().hits, from_host ? 0u : 4u);
    ExpectSameAsUncached(prompt, again, *lease);
    s->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
  }
}

TEST_F(PrefillTierTest, ADamagedRecordIsComputedFromThereOn) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> s, MakeScheduler(Options()));
  const std::vector<int32_t> prompt = RandomTokens(72, vocab_, 110);
  ComputeAndEvict(*s, prompt);
  {  // One byte of the third block's K/V changes on disk.
    std::fstream f(tier_->RecordPath(Hashes(prompt)[2]),
                   std::ios::binary | std::ios::in | std::ios::out);
    ASSERT_TRUE(f.good());
    f.seekp(TierRecordHeader::kBytes + 17);
    f.put('\x5a');
  }
  DecodeSide::Lease* lease = nullptr;
  ASSERT_OK_AND_ASSIGN(PrefillResult again, Prefill(*s, prompt, &lease));
  EXPECT_EQ(again.cached_tokens, 32);
  EXPECT_EQ(tier_->stats().misses[static_cast<int>(TierMiss::kCorrupt)], 1u);
  ExpectSameAsUncached(prompt, again, *lease);
  s->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
}

TEST_F(PrefillTierTest, ADiskSlowerThanTheWaitIsComputedInstead) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> s,
                       MakeScheduler(Options(absl::Nanoseconds(1))));
  const std::vector<int32_t> prompt = RandomTokens(72, vocab_, 120);
  ComputeAndEvict(*s, prompt);
  // The reads are never run while the job waits: it stops waiting.
  DecodeSide::Lease* lease = nullptr;
  ASSERT_OK_AND_ASSIGN(PrefillResult again, Prefill(*s, prompt, &lease, /*run_io=*/false));
  EXPECT_EQ(again.cached_tokens, 0);
  EXPECT_EQ(s->tier_link()->stats().blocks_late, 4u);
  io_.RunDue();  // the reads land nowhere now
  ExpectSameAsUncached(prompt, again, *lease);
  s->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
}

TEST_F(PrefillTierTest, AJobCancelledWhileLoadingFreesItsBlocks) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> s, MakeScheduler(Options()));
  const std::vector<int32_t> prompt = RandomTokens(72, vocab_, 130);
  ComputeAndEvict(*s, prompt);
  std::unique_ptr<internal::Job> job = SchedulerJob(prompt, 99);
  ASSERT_TRUE(s->TryAdmit(job));
  EXPECT_TRUE(s->loads_pending());
  s->Cancel(99);
  EXPECT_FALSE(s->loads_pending());
  std::vector<Reply> replies = s->TakeReplies();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_THAT(replies[0].result.status(), StatusIs(absl::StatusCode::kCancelled));
  io_.RunDue();  // the reads must not touch the freed blocks
  EXPECT_EQ(s->free_blocks(), s->total_blocks());
  EXPECT_EQ(tier_->stats().misses[static_cast<int>(TierMiss::kCancelled)], 4u);
  s->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
}

TEST_F(PrefillTierTest, TheTierOutlivesTheWorker) {
  const std::vector<int32_t> prompt = RandomTokens(72, vocab_, 140);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> s, MakeScheduler(Options()));
    ComputeAndEvict(*s, prompt);
    s->Shutdown(absl::CancelledError("restart"), absl::Now() + kWait);
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> s, MakeScheduler(Options()));
  EXPECT_GE(tier_->open_report().kept, 4u);
  DecodeSide::Lease* lease = nullptr;
  ASSERT_OK_AND_ASSIGN(PrefillResult again, Prefill(*s, prompt, &lease));
  EXPECT_EQ(again.cached_tokens, 64);
  ExpectSameAsUncached(prompt, again, *lease);
  s->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
}

TEST_F(PrefillTierTest, ATierNeedsThePrefixCache) {
  SchedulerOptions options = Options();
  options.prefix_cache = false;
  EXPECT_THAT(MakeScheduler(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("prefix cache")));
}

}  // namespace
}  // namespace tandem::prefill
