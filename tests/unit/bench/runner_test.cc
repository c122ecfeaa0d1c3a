// The runner's load shapes: --max_concurrency bounds the streams in flight,
// --waves sends each wave only when the previous one has wholly ended,
// --pad_waves pads every request of a wave to its longest, and a
// multi_turn conversation sends its turns one after the other.
#include "tools/bench/runner.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/bench/fake_run_clock.h"
#include "tools/bench/dataset.h"
#include "tools/bench/target.h"

namespace tandem::bench {
namespace {

// Records, for each request as it starts, how many were in flight and how
// many had ended.
class CountingTarget final : public Target {
 public:
  struct Entry {
    int in_flight;
    int ended;
  };

  RequestRecord Send(const BenchRequest&) override {
    {
      std::lock_guard lock(mu_);
      ++in_flight_;
      entries_.push_back({in_flight_, ended_});
    }
    RequestRecord r;
    r.success = true;
    std::lock_guard lock(mu_);
    --in_flight_;
    ++ended_;
    return r;
  }

  std::vector<Entry> entries() {
    std::lock_guard lock(mu_);
    return entries_;
  }

 private:
  std::mutex mu_;
  int in_flight_ = 0;
  int ended_ = 0;
  std::vector<Entry> entries_;
};

std::unique_ptr<Dataset> Synthetic() {
  auto d = MakeDataset({.kind = "synthetic", .input_len = 4, .output_len = 2});
  EXPECT_TRUE(d.ok());
  return std::move(d).value();
}

TEST(RunnerTest, WavesStartOnlyWhenThePreviousWaveHasEnded) {
  CountingTarget target;
  auto dataset = Synthetic();
  auto run =
      RunBenchmark(target, *dataset,
                   {.max_concurrency = 4, .waves = true, .num_requests = 12, .progress = false});
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<CountingTarget::Entry> entries = target.entries();
  ASSERT_EQ(entries.size(), 12u);
  // The i-th request to start saw every request of the earlier waves ended.
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_GE(entries[i].ended, static_cast<int>(i / 4 * 4)) << "request " << i;
    EXPECT_LE(entries[i].in_flight, 4);
  }
  EXPECT_EQ(run->metrics.completed, 12);
}

// Answers each request with max_tokens tokens, one per message: the first
// after 1 s, then one every 0.5 s; records what was asked.
class EchoLengthTarget final : public Target {
 public:
  RequestRecord Send(const BenchRequest& request) override {
    {
      std::lock_guard lock(mu_);
      asked_.push_back(request.max_tokens);
    }
    RequestRecord r;
    r.success = true;
    r.output_tokens = request.max_tokens;
    r.ttft = 1;
    r.itls.assign(request.max_tokens - 1, 0.5);
    r.e2e = 1 + 0.5 * (request.max_tokens - 1);
    return r;
  }

  std::vector<int> asked() {
    std::lock_guard lock(mu_);
    return asked_;
  }

 private:
  std::mutex mu_;
  std::vector<int> asked_;
};

TEST(RunnerTest, PaddedWavesAskForTheLongestAndCountTheirOwn) {
  EchoLengthTarget target;
  auto dataset =
      MakeDataset({.kind = "synthetic", .input_len = 4, .output_len = 20, .range_ratio = 0.9});
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto run = RunBenchmark(target, **dataset,
                          {.max_concurrency = 4,
                           .waves = true,
                           .pad_waves = true,
                           .num_requests = 10,
                           .progress = false});
  ASSERT_TRUE(run.ok()) << run.status();
  // Waves of 4, 4 and 2: each request asked for its wave's longest.
  std::vector<int> own, longest(3, 0);
  for (int i = 0; i < 10; ++i) {
    own.push_back((*dataset)->Get(i).max_tokens);
    longest[i / 4] = std::max(longest[i / 4], own.back());
  }
  ASSERT_NE(*std::min_element(own.begin(), own.end()),
            *std::max_element(own.begin(), own.end()));  // Lengths differ.
  std::vector<int> asked = target.asked();
  ASSERT_EQ(asked.size(), 10u);
  for (int w = 0; w < 3; ++w) {
    // Within a wave the order of sending may vary; every one asked the same.
    for (int i = w * 4; i < std::min(10, w * 4 + 4); ++i) EXPECT_EQ(asked[i], longest[w]);
  }
  int total = 0;
  for (int i = 0; i < 10; ++i) {
    const RequestRecord& r = run->records[i];
    EXPECT_EQ(r.output_tokens, own[i]) << i;
    EXPECT_EQ(r.itls.size(), static_cast<size_t>(own[i] - 1)) << i;
    EXPECT_DOUBLE_EQ(r.e2e, 1 + 0.5 * (own[i] - 1)) << i;
    total += own[i];
  }
  EXPECT_EQ(run->metrics.total_output_tokens, total);

  EXPECT_FALSE(
      RunBenchmark(target, **dataset,
                   {.max_concurrency = 4, .pad_waves = true, .num_requests = 2, .progress = false})
          .ok());
}

TEST(RunnerTest, WavesNeedAWaveSize) {
  CountingTarget target;
  auto dataset = Synthetic();
  EXPECT_FALSE(
      RunBenchmark(target, *dataset, {.waves = true, .num_requests = 2, .progress = false}).ok());
}

// Each request takes one second of the fake clock and records when it
// started and its prompt's length; the `fail_at`th request sent fails.
class TimedTarget final : public Target {
 public:
  TimedTarget(FakeRunClock* clock, int fail_at) : clock_(clock), fail_at_(fail_at) {}
  RequestRecord Send(const BenchRequest& request) override {
    RequestRecord r;
    {
      std::lock_guard lock(mu_);
      sends_.push_back({clock_->Now(), request.prompt_len});
      r.success = static_cast<int>(sends_.size()) != fail_at_;
    }
    clock_->Advance(1);
    return r;
  }
  std::vector<std::pair<double, int>> sends() {
    std::lock_guard lock(mu_);
    return sends_;
  }

 private:
  FakeRunClock* const clock_;
  const int fail_at_;
  std::mutex mu_;
  std::vector<std::pair<double, int>> sends_;
};

std::unique_ptr<Dataset> Conversations(int turns) {
  auto d = MakeDataset({.kind = "multi_turn",
                        .input_len = 4,
                        .output_len = 2,
                        .turns = turns,
                        .think_time_s = 0.5,
                        .token_ids = true});
  EXPECT_TRUE(d.ok());
  return std::move(d).value();
}

// One conversation at a time: each turn is sent half a second (the think
// time) after the previous one's end, with the conversation so far, and
// the next conversation starts only when the last one's last turn ended.
TEST(RunnerTest, AConversationSendsEachTurnAThinkTimeAfterThePreviousEnded) {
  FakeRunClock clock;
  TimedTarget target(&clock, /*fail_at=*/0);
  auto data = Conversations(3);
  auto run = RunBenchmark(
      target, *data,
      {.max_concurrency = 1, .num_requests = 5, .progress = false, .slo = {}, .clock = &clock});
  ASSERT_TRUE(run.ok()) << run.status();
  const auto sends = target.sends();
  ASSERT_EQ(sends.size(), 5u);
  const double starts[] = {1000, 1001.5, 1003, 1004, 1005.5};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_DOUBLE_EQ(sends[i].first, starts[i]) << i;
    EXPECT_EQ(sends[i].second, data->Get(i).prompt_len) << i;
  }
  EXPECT_EQ(sends[1].second, 4 + 2 + 4);
  EXPECT_EQ(run->records.size(), 5u);
  EXPECT_DOUBLE_EQ(run->records[2].start, 3);
}

// A failed turn ends its conversation; the next conversation goes on.
TEST(RunnerTest, AFailedTurnEndsItsConversation) {
  FakeRunClock clock;
  TimedTarget target(&clock, /*fail_at=*/2);
  auto data = Conversations(3);
  auto run = RunBenchmark(
      target, *data,
      {.max_concurrency = 1, .num_requests = 6, .progress = false, .slo = {}, .clock = &clock});
  ASSERT_TRUE(run.ok()) << run.status();
  const auto sends = target.sends();
  ASSERT_EQ(sends.size(), 5u);  // Turns 1 and 2 of the first, then 3 of the second.
  EXPECT_EQ(sends[2].second, data->Get(3).prompt_len);
  EXPECT_EQ(run->metrics.failed, 1);
  EXPECT_EQ(run->records.size(), 5u);
}

TEST(RunnerTest, ConversationsAreNotSentInWaves) {
  FakeRunClock clock;
  TimedTarget target(&clock, 0);
  EXPECT_FALSE(RunBenchmark(target, *Conversations(2),
                            {.max_concurrency = 2, .waves = true, .progress = false, .slo = {}})
                   .ok());
}

}  // namespace
}  // namespace tandem::bench
