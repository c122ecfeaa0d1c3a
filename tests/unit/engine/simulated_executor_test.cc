// SimulatedExecutor: a step's shape and cost, time passing layer by layer,
// the made-up logits, the tables advanced, and bad steps refused as the
// engine refuses them (ValidateStep), changing nothing.
#include "common/engine/simulated_executor.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/kvcache/block_pool.h"
#include "common/kvcache/block_table.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;

StepLimits Limits() {
  return StepLimits{.block_size = 4,
                    .vocab_size = 50,
                    .seq_len = 64,
                    .max_batch_tokens = 32,
                    .max_logit_rows = 8};
}

ModelConfig ExecutorShape() {
  ModelConfig c;
  c.n_layers = 4;
  c.vocab_size = 50;
  c.seq_len = 64;
  return c;
}

TEST(StepShapeTest, CountsTokensAttendedKeysAndLogitRows) {
  BlockPool pool(16, 4);
  BlockTable prompt(4), decode(4);
  decode.Advance(9);  // Nine positions written already.
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  const std::vector<int32_t> one = {7};
  BatchItem a{&prompt, five};
  a.all_logits = true;
  const std::vector<BatchItem> items = {a, BatchItem{&decode, one}};
  const StepShape shape = ShapeOf(items);
  EXPECT_EQ(shape.items, 2);
  EXPECT_EQ(shape.tokens, 6);
  // Positions 0..4 attend to 1..5 keys; position 9 to 10.
  EXPECT_EQ(shape.attended, 15 + 10);
  EXPECT_EQ(shape.logit_rows, 5 + 1);
  const LinearStepCost cost{.fixed = absl::Milliseconds(2),
                            .per_token = absl::Microseconds(100),
                            .per_attended = absl::Microseconds(10),
                            .per_logit_row = absl::Microseconds(50)};
  EXPECT_EQ(cost(shape), absl::Microseconds(2000 + 600 + 250 + 300));
}

TEST(SimulatedExecutorTest, MovesTheClockLayerByLayerAndAnswersItsOwnTokens) {
  const ModelConfig config = ExecutorShape();
  BlockPool pool(16, 4);
  FakeClock clock;
  SimulatedExecutor executor(
      config, Limits(), &pool, &clock,
      LinearStepCost{.fixed = absl::Milliseconds(8), .per_token = absl::Milliseconds(1)});
  BlockTable table(4);
  const std::vector<int32_t> prompt = {3, 9, 27, 31, 2, 40};
  const absl::Time start = clock.Now();
  std::vector<absl::Duration> at_layer;
  ASSERT_OK_AND_ASSIGN(std::vector<float> logits,
                       executor.Step(std::vector<BatchItem>{{&table, prompt}},
                                     [&](int) { at_layer.push_back(clock.Now() - start); }));
  // 8 + 6 = 14 ms in four shares, each before its layer's hook.
  EXPECT_EQ(at_layer,
            (std::vector<absl::Duration>{absl::Microseconds(3500), absl::Milliseconds(7),
                                         absl::Microseconds(10500), absl::Milliseconds(14)}));
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(14));
  EXPECT_EQ(table.num_tokens(), 6);
  EXPECT_EQ(pool.num_free(), 16 - 2);
  ASSERT_EQ(logits.size(), 50u);
  const int32_t first = SimulatedNextToken(40, 5, 50);
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), first);

  const std::vector<int32_t> next = {first};
  ASSERT_OK_AND_ASSIGN(logits, executor.Step(std::vector<BatchItem>{{&table, next}}, nullptr));
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(),
            SimulatedNextToken(first, 6, 50));
  EXPECT_EQ(executor.steps(), 2u);
  EXPECT_EQ(executor.busy(), absl::Milliseconds(14 + 9));

  // A greedy pick comes back as the token, beside another item's row.
  BlockTable other(4);
  const std::vector<int32_t> then = {SimulatedNextToken(first, 6, 50)};
  std::vector<BatchItem> items = {{&table, then}, {&other, prompt}};
  items[0].pick_greedy = true;
  std::vector<int32_t> picks;
  ASSERT_OK_AND_ASSIGN(logits, executor.Step(items, nullptr, &picks));
  EXPECT_EQ(picks, std::vector<int32_t>{SimulatedNextToken(then[0], 7, 50)});
  ASSERT_EQ(logits.size(), 50u);
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), first);
  table.Release(pool);
  other.Release(pool);
  EXPECT_EQ(pool.num_free(), 16);
}

TEST(SimulatedExecutorTest, RefusesWhatTheEngineWould) {
  const ModelConfig config = ExecutorShape();
  BlockPool pool(2, 4);  // Eight positions.
  FakeClock clock;
  SimulatedExecutor executor(config, Limits(), &pool, &clock, LinearStepCost{});
  BlockTable table(4);
  const std::vector<int32_t> empty;
  const std::vector<int32_t> outside = {50};
  const std::vector<int32_t> five(5, 1);
  BlockTable other(4);
  ASSERT_OK(other.Reserve(4, pool));  // One block left.
  EXPECT_THAT(executor.Step(std::vector<BatchItem>{}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(executor.Step(std::vector<BatchItem>{{&table, empty}}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(executor.Step(std::vector<BatchItem>{{&table, outside}}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(executor.Step(std::vector<BatchItem>{{&table, five}}, nullptr).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  const std::vector<int32_t> one = {1};
  EXPECT_THAT(executor.Step(std::vector<BatchItem>{{&table, one}, {&table, one}}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));  // One sequence twice.
  const std::vector<int32_t> over(33, 1);
  EXPECT_THAT(executor.Step(std::vector<BatchItem>{{&table, over}}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));  // Over max_batch_tokens.
  BlockTable late(4);
  late.Advance(62);  // Two positions short of the context.
  const std::vector<int32_t> three = {1, 2, 3};
  EXPECT_THAT(executor.Step(std::vector<BatchItem>{{&late, three}}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(executor.steps(), 0u);
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_TRUE(table.blocks().empty());  // A refused step reserves nothing.
  EXPECT_EQ(clock.Now(), FakeClock().Now());
  other.Release(pool);
}

}  // namespace
}  // namespace tandem
