// The decode loop on a SimulatedExecutor and a fake clock: it schedules as
// on real compute, and every timing it reports comes from the cost model,
// which is what a capacity-planning simulator needs of it.
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/engine/simulated_executor.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode::testing {
namespace {

constexpr absl::Duration kFixed = absl::Milliseconds(10);
constexpr absl::Duration kPerToken = absl::Milliseconds(1);

// The tokens SimulatedExecutor's greedy choices give after `prompt`.
std::vector<int32_t> SimulatedTokens(const std::vector<int32_t>& prompt, int n, int vocab) {
  std::vector<int32_t> out;
  int32_t last = prompt.back();
  for (int i = 0; i < n; ++i) {
    last = SimulatedNextToken(last, static_cast<int>(prompt.size()) + i - 1, vocab);
    out.push_back(last);
  }
  return out;
}

class DecodeSimulated : public ::testing::TestWithParam<SchedulePolicyKind> {
 protected:
  DecodeLoopOptions Options() {
    DecodeLoopOptions options;
    options.schedule_policy = GetParam();
    options.max_sequences = 8;
    options.prefill_chunk_tokens = 16;
    options.clock = &clock_;
    options.make_executor = [this](Engine& engine) {
      auto executor = std::make_unique<SimulatedExecutor>(
          engine.config(), &engine.block_pool(), &clock_,
          LinearStepCost{.fixed = kFixed, .per_token = kPerToken});
      executor_ = executor.get();
      return executor;
    };
    return options;
  }

  FakeClock clock_;
  SimulatedExecutor* executor_ = nullptr;
};

// A 64-token local prompt, then 5 tokens: the prefill takes the steps the
// policy plans (16-token chunks under `chunked`, one step otherwise), each
// costing 10 ms + 1 ms per token of fake time, and so does every decode.
TEST_P(DecodeSimulated, TimingsComeFromTheCostModel) {
  DecodeHarness h(Options());
  ASSERT_NE(executor_, nullptr);
  const int vocab = h.config().vocab_size;
  const Request r = LocalRequest("a", RandomTokens(64, vocab, 3), 5);
  const absl::Time start = clock_.Now();
  auto sink = NewSink();
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitEnded());
  ASSERT_OK(sink->status());

  EXPECT_EQ(sink->tokens(), SimulatedTokens(r.prompt, 5, vocab));
  const bool chunked = GetParam() == SchedulePolicyKind::kChunked;
  const int prefill_steps = chunked ? 4 : 1;
  const absl::Duration prefill = kFixed * prefill_steps + kPerToken * 64;
  const std::optional<Finished> finished = sink->finished();
  ASSERT_TRUE(finished.has_value());
  EXPECT_EQ(finished->prefill, prefill);
  EXPECT_EQ(finished->decode_queue, absl::ZeroDuration());
  // The first token comes from the prompt's last step; 4 decode steps follow.
  EXPECT_EQ(executor_->steps(), static_cast<uint64_t>(prefill_steps + 4));
  EXPECT_EQ(clock_.Now() - start, prefill + 4 * (kFixed + kPerToken));
  EXPECT_EQ(executor_->busy(), clock_.Now() - start);
  EXPECT_TRUE(h.AllBlocksFree());
}

INSTANTIATE_TEST_SUITE_P(Policies, DecodeSimulated,
                         ::testing::Values(SchedulePolicyKind::kDecodePriority,
                                           SchedulePolicyKind::kChunked,
                                           SchedulePolicyKind::kPrefillFirst),
                         [](const auto& info) {
                           return std::string(SchedulePolicyName(info.param));
                         });

}  // namespace
}  // namespace tandem::decode::testing
