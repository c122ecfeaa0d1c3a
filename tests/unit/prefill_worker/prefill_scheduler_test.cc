// The prefill scheduler driven by hand, one round at a time:
// - a job whose KV transfer has ended is answered before the next engine
//   step starts, not after it (a long prompt admitted meanwhile would
//   otherwise hold the first job's first token back for its whole step);
// - on a SimulatedExecutor and a fake clock it plans the same chunks as on
//   real compute, and the times it reports come from the cost model.
#include "prefill_worker/prefill_scheduler.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/engine/simulated_executor.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/cache_fixture.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::DecodeSide;
using ::tandem::prefill::testing::kWait;
using ::tandem::prefill::testing::PrefillCacheTest;
using ::tandem::prefill::testing::RandomTokens;

TEST_F(PrefillCacheTest, AnEndedJobIsAnsweredBeforeTheNextStep) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> scheduler,
                       MakeScheduler({.kv_blocks = 64}));
  // Each reply the hook delivers, with the engine steps run by then.
  struct Answer {
    absl::StatusOr<PrefillResult> result;
    uint64_t steps;
  };
  std::vector<Answer> answers;
  scheduler->SetReplyHook([&] {
    for (Reply& r : scheduler->TakeReplies()) {
      answers.push_back({std::move(r.result), scheduler->counters().steps});
    }
  });

  const std::vector<int32_t> first = RandomTokens(20, vocab_, 31);
  DecodeSide::Lease* first_lease = nullptr;
  std::unique_ptr<internal::Job> first_job = SchedulerJob(first, 1, &first_lease);
  ASSERT_TRUE(scheduler->TryAdmit(first_job));
  scheduler->RunOnce();  // Computes it; its transfer stays open.
  ASSERT_EQ(scheduler->counters().steps, 1u);
  EXPECT_TRUE(answers.empty());
  EXPECT_TRUE(scheduler->TakeReplies().empty());

  // The decode side takes every layer and confirms.
  ASSERT_TRUE(decode_->PumpUntil([&] { return first_lease->ended; }));
  ASSERT_OK(first_lease->status);
  scheduler->WaitForTransfers(absl::Now() + kWait);  // The confirmation is there.

  // A second prompt is admitted before the worker sees the confirmation:
  // the next round handles it, then computes the second prompt. The first
  // job's answer goes out between the two, not after the step.
  const std::vector<int32_t> second = RandomTokens(100, vocab_, 32);
  std::unique_ptr<internal::Job> second_job = SchedulerJob(second, 2);
  ASSERT_TRUE(scheduler->TryAdmit(second_job));
  scheduler->RunOnce();
  EXPECT_EQ(scheduler->counters().steps, 2u);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].steps, 1u) << "the answer waited for the second prompt's step";
  ASSERT_OK(answers[0].result.status());
  EXPECT_EQ(answers[0].result->first_token, Greedy(first));
  EXPECT_EQ(scheduler->active(), 1);

  scheduler->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
}

TEST_F(PrefillCacheTest, ASimulatedPrefillTakesTheModelsTime) {
  FakeClock clock;
  SimulatedExecutor* executor = nullptr;
  SchedulerOptions options{.kv_blocks = 64, .max_batch_tokens = 16};
  options.make_executor = [&](Engine& engine) {
    auto e = std::make_unique<SimulatedExecutor>(
        engine.config(), engine.step_limits(), &engine.block_pool(), &clock,
        LinearStepCost{.fixed = absl::Milliseconds(10), .per_token = absl::Milliseconds(1)});
    executor = e.get();
    return e;
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> scheduler, MakeScheduler(options, &clock));
  ASSERT_NE(executor, nullptr);

  const std::vector<int32_t> prompt = RandomTokens(40, vocab_, 41);
  DecodeSide::Lease* lease = nullptr;
  std::unique_ptr<internal::Job> job = SchedulerJob(prompt, 1, &lease);
  job->arrived = clock.Now();
  ASSERT_TRUE(scheduler->TryAdmit(job));
  ASSERT_OK_AND_ASSIGN(const PrefillResult result, DriveUntilReply(*scheduler));
  // Chunks of 16, 16 and 8 tokens: three steps of 10 ms plus 1 ms a token.
  EXPECT_EQ(executor->steps(), 3u);
  EXPECT_EQ(result.prefill_us, 3 * 10'000 + 40 * 1'000);
  EXPECT_EQ(result.queue_us, 0);
  EXPECT_EQ(result.first_token, SimulatedNextToken(prompt.back(), 39, vocab_));
  EXPECT_TRUE(lease->ended);
  scheduler->Shutdown(absl::CancelledError("test over"), absl::Now() + kWait);
}

}  // namespace
}  // namespace tandem::prefill
