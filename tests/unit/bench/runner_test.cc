// The runner's load shapes: --max_concurrency bounds the streams in flight,
// --waves sends each wave only when the previous one has wholly ended, and
// --pad_waves pads every request of a wave to its longest.
#include "tools/bench/runner.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace tandem::bench
