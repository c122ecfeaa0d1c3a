// The decode loop under each schedule policy: what one step carries when a
// local prompt arrives beside a running sequence, and identical greedy
// tokens whatever the policy.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"
#include "tests/unit/decode_worker/step_gate.h"

namespace tandem::decode::testing {
namespace {

constexpr int kChunk = 16;

DecodeLoopOptions PolicyOptions(SchedulePolicyKind kind) {
  DecodeLoopOptions options;
  options.schedule_policy = kind;
  options.max_sequences = 8;
  options.max_batch_tokens = 64;
  options.prefill_chunk_tokens = kChunk;
  return options;
}

class DecodeSchedule : public ::testing::TestWithParam<SchedulePolicyKind> {};

// A 40-token local prompt arrives while another sequence decodes: the next
// step carries what the policy says, and both requests give the tokens a
// single-stream run gives.
TEST_P(DecodeSchedule, StepAfterAPromptArrivesCarriesWhatThePolicySays) {
  StepLog log;
  auto gated = std::make_unique<GatedBackend>(OneThreadBackend(), &log);
  GatedBackend* gate = gated.get();
  HarnessSetup setup;
  setup.backend = std::move(gated);
  DecodeHarness h(PolicyOptions(GetParam()), {}, std::move(setup));
  gate->Arm();
  const Request a = LocalRequest("a", RandomTokens(8, SmallShape().vocab_size, 1), 12);
  const Request b = LocalRequest("b", RandomTokens(40, SmallShape().vocab_size, 2), 6);
  auto a_sink = NewSink();
  auto b_sink = NewSink();
  ASSERT_OK(h.loop().Submit(a, a_sink).status());
  ASSERT_TRUE(gate->WaitHeld(1, kWait));  // A's prompt.
  gate->Allow();
  ASSERT_TRUE(gate->WaitHeld(2, kWait));  // A's first decode; B comes in meanwhile.
  ASSERT_OK(h.loop().Submit(b, b_sink).status());
  gate->Allow();
  ASSERT_TRUE(gate->WaitHeld(3, kWait));
  const int rows = log.step_rows().back();
  switch (GetParam()) {
    case SchedulePolicyKind::kDecodePriority:
      EXPECT_EQ(rows, 1 + 40);  // A's decode, then all of B's prompt (within 64).
      break;
    case SchedulePolicyKind::kChunked:
      EXPECT_EQ(rows, kChunk);  // A's decode and 15 of B's prompt tokens.
      break;
    case SchedulePolicyKind::kPrefillFirst:
      EXPECT_EQ(rows, 40);  // B's whole prompt alone; A waits one step.
      break;
  }
  gate->Disarm();
  gate->Allow();
  ASSERT_TRUE(a_sink->WaitEnded());
  ASSERT_TRUE(b_sink->WaitEnded());
  ASSERT_OK(a_sink->status());
  ASSERT_OK(b_sink->status());
  EXPECT_EQ(a_sink->tokens(), h.Expected(a));
  EXPECT_EQ(b_sink->tokens(), h.Expected(b));
  for (int r : log.step_rows()) {
    EXPECT_LE(r, GetParam() == SchedulePolicyKind::kChunked ? kChunk : 64);
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

// Many local requests at once, some longer than a step, one with prompt
// logprobs and one of two choices: greedy tokens equal the reference under
// every policy.
TEST_P(DecodeSchedule, GreedyTokensMatchTheReference) {
  DecodeHarness h(PolicyOptions(GetParam()));
  std::vector<Request> requests;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  const int lengths[] = {5, 40, 70, 100, 17, 33};
  for (int i = 0; i < 6; ++i) {
    Request r = LocalRequest(absl::StrCat("r", i),
                             RandomTokens(lengths[i], SmallShape().vocab_size, 100 + i), 4 + 3 * i);
    if (i == 4) r.prompt_logprobs = true;
    if (i == 5) r.n = 2;
    requests.push_back(r);
    sinks.push_back(NewSink());
  }
  for (int i = 0; i < 6; ++i) ASSERT_OK(h.loop().Submit(requests[i], sinks[i]).status());
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(sinks[i]->WaitEnded());
    ASSERT_OK(sinks[i]->status());
    const std::vector<int32_t> expected = h.Expected(requests[i]);
    for (int c = 0; c < requests[i].n; ++c) {
      EXPECT_EQ(sinks[i]->tokens(c), expected) << "request " << i << " choice " << c;
    }
  }
  ASSERT_TRUE(sinks[4]->prompt_logprobs().has_value());
  EXPECT_EQ(sinks[4]->prompt_logprobs()->size(), requests[4].prompt.size() - 1);
  EXPECT_TRUE(h.AllBlocksFree());
}

INSTANTIATE_TEST_SUITE_P(Policies, DecodeSchedule,
                         ::testing::Values(SchedulePolicyKind::kDecodePriority,
                                           SchedulePolicyKind::kChunked,
                                           SchedulePolicyKind::kPrefillFirst),
                         [](const ::testing::TestParamInfo<SchedulePolicyKind>& info) {
                           return std::string(SchedulePolicyName(info.param));
                         });

TEST(DecodeScheduleOptions, ChunkBudgetOutsideItsBoundsIsRefused) {
  const auto weights = MakeSyntheticModel(SmallShape(), 7).value();
  auto fabric = kvtransfer::InProcFabric::Create();
  auto transport = kvtransfer::InProcTransport::Create(fabric);
  for (int chunk : {4, 65}) {
    DecodeLoopOptions options = PolicyOptions(SchedulePolicyKind::kChunked);
    options.prefill_chunk_tokens = chunk;
    EXPECT_THAT(DecodeLoop::Create(*weights, OneThreadBackend(), transport.get(), options),
                ::tandem::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                            ::testing::HasSubstr("prefill_chunk_tokens")));
  }
}

}  // namespace
}  // namespace tandem::decode::testing
