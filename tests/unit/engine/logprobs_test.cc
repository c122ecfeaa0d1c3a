#include "common/engine/logprobs.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

TEST(ComputeLogprob, MatchesHandComputedLogSoftmax) {
  // log Z = log(e^0 + e^1 + e^2 + e^1) = log(1 + 2e + e^2).
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 1.0f};
  const double log_z = std::log(1.0 + 2.0 * std::exp(1.0) + std::exp(2.0));
  const TokenLogprob lp = ComputeLogprob(logits, 1, 3);
  EXPECT_EQ(lp.token_id, 1);
  EXPECT_NEAR(lp.logprob, 1.0 - log_z, 1e-6);
  // Most likely first; the tie between ids 1 and 3 goes to the lower id.
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token_id, 2);
  EXPECT_EQ(lp.top[1].token_id, 1);
  EXPECT_EQ(lp.top[2].token_id, 3);
  EXPECT_NEAR(lp.top[0].logprob, 2.0 - log_z, 1e-6);
  EXPECT_NEAR(lp.top[2].logprob, 1.0 - log_z, 1e-6);
}

TEST(ComputeLogprob, TopIsClampedToTheRowAndTheMaximum) {
  const std::vector<float> logits = {0.5f, -0.5f};
  EXPECT_TRUE(ComputeLogprob(logits, 0, 0).top.empty());
  EXPECT_EQ(ComputeLogprob(logits, 0, 5).top.size(), 2u);
  EXPECT_TRUE(ComputeLogprob(logits, 0, -3).top.empty());
  std::vector<float> wide(100);
  for (int i = 0; i < 100; ++i) wide[i] = static_cast<float>(i % 7);
  EXPECT_EQ(ComputeLogprob(wide, 0, 50).top.size(), static_cast<size_t>(kMaxTopLogprobs));
}

TEST(ComputeLogprob, TopMatchesAFullSort) {
  std::vector<float> logits(300);
  for (int i = 0; i < 300; ++i) logits[i] = std::sin(i * 0.37f) * 4.0f + (i % 5 == 0 ? 0.0f : 0.1f);
  const TokenLogprob lp = ComputeLogprob(logits, 17, kMaxTopLogprobs);
  std::vector<int> order(300);
  for (int i = 0; i < 300; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  ASSERT_EQ(lp.top.size(), static_cast<size_t>(kMaxTopLogprobs));
  for (int i = 0; i < kMaxTopLogprobs; ++i) EXPECT_EQ(lp.top[i].token_id, order[i]) << i;
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - logits[order[0]]));
  EXPECT_NEAR(lp.top[0].logprob, -std::log(sum), 1e-5);
  // Probabilities of the whole row sum to one.
  double total = 0;
  for (int t = 0; t < 300; ++t) total += std::exp(ComputeLogprob(logits, t, 0).logprob);
  EXPECT_NEAR(total, 1.0, 1e-4);
}

}  // namespace
}  // namespace tandem
