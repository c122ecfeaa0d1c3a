// Partial leases (the decode worker holds a prompt's first blocks) and the
// prefix cache's bookkeeping: cancels, evictions and failed transfers leave
// every block free or only cached, and a flush empties the cache.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/compute/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/transfer_receiver.h"
#include "kvtransfer/wire_format.h"
#include "prefill_worker/prefill_loop.h"
#include "prefill_worker/prefill_scheduler.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/cache_fixture.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::Concat;
using ::tandem::prefill::testing::DecodeSide;
using ::tandem::prefill::testing::kBlock;
using ::tandem::prefill::testing::kWait;
using ::tandem::prefill::testing::Outcome;
using ::tandem::prefill::testing::PrefillCacheTest;
using ::tandem::prefill::testing::Prefix;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::prefill::testing::ReferenceTokens;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

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

  // The decode side holds every block of a prompt that ends on a block
  // boundary: the last block is still computed (for the first token), and
  // nothing is shipped.
  const std::vector<int32_t> whole_blocks = Prefix(prompt, 48);
  DecodeSide::Lease* all = decode_->Expect(48, 16, absl::Now() + kWait, 3);
  ASSERT_OK_AND_ASSIGN(PrefillResult none, Run(*cached_, Job(whole_blocks, *all), *all));
  EXPECT_OK(all->status);
  EXPECT_EQ(none.kv_bytes, 0);
  EXPECT_EQ(none.cached_tokens, 32);
  EXPECT_EQ(none.first_token, ReferenceTokens(*reference_, whole_blocks, 1).front());

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

// The scheduler alone, driven by this thread: a job that finds cached
// blocks but cannot get the rest waits holding none of them, and takes
// them once room frees up.
TEST_F(PrefillCacheTest, AdmissionThatDoesNotFitHoldsNoCachedBlocks) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> scheduler,
                       MakeScheduler({.kv_blocks = 8}));
  JobId next_id = 1;
  auto make_job = [&](const std::vector<int32_t>& prompt) {
    return SchedulerJob(prompt, next_id++);
  };
  auto reply = [&] { return DriveUntilReply(*scheduler); };

  const std::vector<int32_t> big = RandomTokens(120, vocab_, 21);  // Every block.
  std::unique_ptr<internal::Job> big_job = make_job(big);
  ASSERT_TRUE(scheduler->TryAdmit(big_job));
  scheduler->RunOnce();  // Computes it; the decode side is not driven yet.
  EXPECT_FALSE(scheduler->has_compute());
  EXPECT_EQ(scheduler->cached_blocks(), 7);
  EXPECT_EQ(scheduler->free_blocks(), 0);

  const std::vector<int32_t> shared = Concat(Prefix(big, 64), RandomTokens(10, vocab_, 22));
  std::unique_ptr<internal::Job> job = make_job(shared);
  for (int attempt = 0; attempt < 3; ++attempt) {
    ASSERT_FALSE(scheduler->TryAdmit(job));
    ASSERT_NE(job, nullptr);
    EXPECT_EQ(job->table.num_tokens(), 0);
    EXPECT_TRUE(job->table.blocks().empty());
  }
  EXPECT_EQ(scheduler->counters().prefix_cache_queried_tokens, 112u);  // Admitted jobs only.
  ASSERT_OK_AND_ASSIGN(PrefillResult big_result, reply());
  EXPECT_EQ(big_result.cached_tokens, 0);
  // Nothing held: the failed admissions let go of the cached blocks.
  EXPECT_EQ(scheduler->free_blocks(), 8);

  ASSERT_TRUE(scheduler->TryAdmit(job));
  ASSERT_OK_AND_ASSIGN(PrefillResult result, reply());
  EXPECT_EQ(result.cached_tokens, 64);
  EXPECT_EQ(result.first_token, ReferenceTokens(*reference_, shared, 1).front());
  EXPECT_EQ(scheduler->counters().prefix_cache_hit_tokens, 64u);
  EXPECT_EQ(scheduler->free_blocks(), 8);
  const int cached = scheduler->cached_blocks();
  EXPECT_EQ(scheduler->FlushPrefixCache(), cached);
  EXPECT_EQ(scheduler->cached_blocks(), 0);
  EXPECT_EQ(scheduler->free_blocks(), 8);
  scheduler->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
}

}  // namespace
}  // namespace tandem::prefill
