// The runner's load shapes: --max_concurrency bounds the streams in flight,
// and --waves sends each wave only when the previous one has wholly ended.
#include "tools/bench/runner.h"

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
  auto run = RunBenchmark(target, *dataset,
                          {.max_concurrency = 4, .waves = true, .num_requests = 12,
                           .progress = false});
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

TEST(RunnerTest, WavesNeedAWaveSize) {
  CountingTarget target;
  auto dataset = Synthetic();
  EXPECT_FALSE(RunBenchmark(target, *dataset, {.waves = true, .num_requests = 2,
                                               .progress = false})
                   .ok());
}

}  // namespace
}  // namespace tandem::bench
