// When a prefill worker answers: a job whose KV transfer has ended is
// answered before the next engine step starts, not after it. A long prompt
// admitted meanwhile would otherwise hold the first job's first token back
// for its whole step.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_scheduler.h"
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

}  // namespace
}  // namespace tandem::prefill
