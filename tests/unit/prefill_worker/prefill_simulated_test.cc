// The prefill scheduler on a SimulatedExecutor and a fake clock: it plans
// the same chunks as on real compute, and the times it reports come from
// the cost model.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/engine/simulated_executor.h"
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

TEST_F(PrefillCacheTest, ASimulatedPrefillTakesTheModelsTime) {
  FakeClock clock;
  SimulatedExecutor* executor = nullptr;
  SchedulerOptions options{.kv_blocks = 64, .max_batch_tokens = 16};
  options.make_executor = [&](Engine& engine) {
    auto e = std::make_unique<SimulatedExecutor>(
        engine.config(), &engine.block_pool(), &clock,
        LinearStepCost{.fixed = absl::Milliseconds(10), .per_token = absl::Milliseconds(1)});
    executor = e.get();
    return e;
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PrefillScheduler> scheduler,
                       MakeScheduler(options, &clock));
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
