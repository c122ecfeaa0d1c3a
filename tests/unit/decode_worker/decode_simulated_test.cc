// The decode loop on a SimulatedExecutor and a fake clock: it schedules as
// on real compute, and every timing it reports comes from the cost model,
// which is what a capacity-planning simulator needs of it; without its own
// thread it runs inside a discrete-event loop, a round at a time.
#include <algorithm>
#include <memory>
#include <span>
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
          engine.config(), engine.step_limits(), &engine.block_pool(), &clock_,
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

// Token times as the loop's clock has them, per choice 0 of one request.
class TimingSink final : public EventSink {
 public:
  explicit TimingSink(const Clock* clock) : clock_(clock) {}
  void OnReserved(const Reservation&) override {}
  void OnPromptLogprobs(std::span<const TokenLogprob>) override {}
  void OnTokens(int, std::span<const int32_t> ids, std::span<const TokenLogprob>) override {
    for (size_t i = 0; i < ids.size(); ++i) times.push_back(clock_->Now());
  }
  void OnFinished(const Finished& f) override { ended = ended || f.last; }
  void OnMoving(bool) override {}
  void OnFailed(const absl::Status& status) override {
    ended = true;
    failure = status;
  }

  std::vector<absl::Time> times;
  bool ended = false;
  absl::Status failure;

 private:
  const Clock* clock_;
};

// A discrete-event run with no thread and no real time: the test drives
// the loop a round at a time, and the fake clock moves only by the cost of
// each step, or to the next arrival when the loop is idle. A long prompt
// arriving while a stream decodes stalls the stream by exactly what the
// policy puts in the step beside it: the interference benchmark's effect,
// computed from the cost model.
TEST_P(DecodeSimulated, ADiscreteEventRunStallsTheStreamAsThePolicySays) {
  DecodeLoopOptions options = Options();
  options.own_thread = false;
  DecodeHarness h(options);
  const int vocab = h.config().vocab_size;
  const absl::Time t0 = clock_.Now();
  struct Arrival {
    absl::Duration at;
    Request request;
    std::shared_ptr<TimingSink> sink;
  };
  std::vector<Arrival> arrivals = {
      {absl::ZeroDuration(), LocalRequest("stream", RandomTokens(8, vocab, 5), 40),
       std::make_shared<TimingSink>(&clock_)},
      {absl::Milliseconds(100), LocalRequest("long", RandomTokens(96, vocab, 6), 1),
       std::make_shared<TimingSink>(&clock_)},
  };
  size_t next = 0;
  while (
      !(next == arrivals.size() && std::all_of(arrivals.begin(), arrivals.end(),
                                               [](const Arrival& a) { return a.sink->ended; }))) {
    // What arrived by now is submitted; then one round; an idle loop jumps
    // the clock to the next arrival.
    while (next < arrivals.size() && t0 + arrivals[next].at <= clock_.Now()) {
      ASSERT_OK(h.loop().Submit(arrivals[next].request, arrivals[next].sink).status());
      ++next;
    }
    if (h.loop().RunRound()) continue;
    ASSERT_LT(next, arrivals.size()) << "the loop is idle with requests unfinished";
    clock_.Set(t0 + arrivals[next].at);
  }
  const TimingSink& stream = *arrivals[0].sink;
  const TimingSink& long_prompt = *arrivals[1].sink;
  ASSERT_OK(stream.failure);
  ASSERT_OK(long_prompt.failure);
  ASSERT_EQ(stream.times.size(), 40u);
  ASSERT_EQ(long_prompt.times.size(), 1u);
  absl::Duration longest_gap;
  for (size_t i = 1; i < stream.times.size(); ++i) {
    longest_gap = std::max(longest_gap, stream.times[i] - stream.times[i - 1]);
  }
  const absl::Duration ttft = long_prompt.times[0] - (t0 + absl::Milliseconds(100));
  // The stream's prompt (8 tokens) costs 18 ms, each decode 11 ms: tokens at
  // 18, 29, ..., 95, 106 ms. The long prompt arrives during the step that
  // ends at 106 and is admitted after it.
  switch (GetParam()) {
    case SchedulePolicyKind::kDecodePriority:
      // One step: the stream's token and the 96 prompt tokens, 107 ms.
      EXPECT_EQ(longest_gap, absl::Milliseconds(107));
      EXPECT_EQ(ttft, absl::Milliseconds(6 + 107));
      break;
    case SchedulePolicyKind::kChunked:
      // Steps of 16 tokens (the stream's one and 15 of the prompt), 26 ms
      // each; the seventh carries the prompt's last 6: 17 ms.
      EXPECT_EQ(longest_gap, absl::Milliseconds(26));
      EXPECT_EQ(ttft, absl::Milliseconds(6 + 6 * 26 + 17));
      break;
    case SchedulePolicyKind::kPrefillFirst:
      // The prompt alone (106 ms), then the stream's next step (11 ms).
      EXPECT_EQ(longest_gap, absl::Milliseconds(106 + 11));
      EXPECT_EQ(ttft, absl::Milliseconds(6 + 106));
      break;
  }
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
