#include "common/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

SamplingParams Params(float temperature, int top_k = 0, float top_p = 1.0f, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

std::vector<float> RandomLogits(int vocab, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = dist(rng);
  return logits;
}

// Token counts of `n` samples from a sampler made with `params`.
std::vector<int> Histogram(const SamplingParams& params, const std::vector<float>& logits, int n) {
  Sampler sampler(params);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[sampler.Sample(logits)];
  return counts;
}

TEST(SamplingParams, DefaultsAndEdgesAreValid) {
  EXPECT_OK(SamplingParams{}.Validate());
  EXPECT_OK(Params(0.7f, 40, 0.9f).Validate());
  EXPECT_OK(Params(1.0f, 0, 1.0f).Validate());
}

TEST(SamplingParams, ErrorsNameTheParameter) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float t : {-0.5f, nan, inf}) {
    EXPECT_THAT(Params(t).Validate(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("temperature")))
        << t;
  }
  EXPECT_THAT(Params(1.0f, -1).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")));
  for (float p : {0.0f, -0.1f, 1.01f, nan}) {
    EXPECT_THAT(Params(1.0f, 0, p).Validate(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_p")))
        << p;
  }
}

TEST(Sampler, ArgmaxTakesLowestIndexOnTies) {
  EXPECT_EQ(Argmax(std::vector<float>{1, 5, 5, 2}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{-3, -1, -2, -1}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{7}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{0, 0, 0}), 0);
}

TEST(Sampler, GreedyIsArgmax) {
  std::mt19937_64 rng(3);
  // Temperature 0, and top_k = 1 at any temperature, are greedy.
  Sampler greedy(Params(0.0f, 0, 1.0f, 5)), top1(Params(1.5f, 1, 1.0f, 5));
  for (int i = 0; i < 100; ++i) {
    const std::vector<float> logits = RandomLogits(50, rng);
    EXPECT_EQ(greedy.Sample(logits), Argmax(logits));
    EXPECT_EQ(top1.Sample(logits), Argmax(logits));
  }
  const std::vector<float> tie = {0, 9, 3, 9, 9};
  EXPECT_EQ(greedy.Sample(tie), 1);
  EXPECT_EQ(top1.Sample(tie), 1);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::mt19937_64 rng(4);
  std::vector<std::vector<float>> steps;
  for (int i = 0; i < 200; ++i) steps.push_back(RandomLogits(64, rng));
  auto run = [&](uint64_t seed) {
    Sampler sampler(Params(1.0f, 0, 1.0f, seed));
    std::vector<int32_t> tokens;
    for (const std::vector<float>& logits : steps) tokens.push_back(sampler.Sample(logits));
    return tokens;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, TopKNeverLeavesTheKBest) {
  std::mt19937_64 rng(5);
  constexpr int kVocab = 100, kTopK = 5;
  // A high temperature flattens the distribution, so without the cut most
  // samples would fall outside the five best.
  Sampler sampler(Params(4.0f, kTopK, 1.0f, 9));
  for (int step = 0; step < 50; ++step) {
    const std::vector<float> logits = RandomLogits(kVocab, rng);
    std::vector<float> sorted = logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const float kth = sorted[kTopK - 1];
    std::set<int32_t> seen;
    for (int i = 0; i < 200; ++i) {
      const int32_t token = sampler.Sample(logits);
      ASSERT_GE(logits[token], kth) << "token " << token << " outside the top " << kTopK;
      seen.insert(token);
    }
    EXPECT_GT(seen.size(), 1u) << "top_k sampling collapsed to greedy";
  }
}

TEST(Sampler, TopKBreaksTiesAtTheCutByLowerId) {
  // Four tokens tie for second place; top_k = 3 keeps the best and ids 1, 2.
  const std::vector<float> logits = {0, 1, 1, 5, 1, 1};
  const std::vector<int> counts = Histogram(Params(8.0f, 3, 1.0f, 11), logits, 3000);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
  EXPECT_GT(counts[3], 0);
  EXPECT_EQ(counts[0] + counts[4] + counts[5], 0);
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // Probabilities 0.5, 0.3, 0.15 and 0.05 spread over 10 tokens, shuffled.
  std::vector<double> probs(13, 0.005);
  probs[7] = 0.5;
  probs[2] = 0.3;
  probs[11] = 0.15;
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));

  // 0.5 < 0.75 <= 0.8: the nucleus is {7, 2}, sampled 5 : 3.
  std::vector<int> counts = Histogram(Params(1.0f, 0, 0.75f), logits, 8000);
  EXPECT_EQ(counts[7] + counts[2], 8000);
  EXPECT_NEAR(counts[7] / 8000.0, 0.5 / 0.8, 0.03);

  // 0.8 < 0.9 <= 0.95: token 11 joins.
  counts = Histogram(Params(1.0f, 0, 0.9f), logits, 8000);
  EXPECT_EQ(counts[7] + counts[2] + counts[11], 8000);
  EXPECT_GT(counts[11], 0);

  // Below the top token's mass only the top token is left.
  counts = Histogram(Params(1.0f, 0, 0.3f), logits, 1000);
  EXPECT_EQ(counts[7], 1000);
}

// Frequencies over 20000 draws match softmax(logits / T) within 5 standard
// deviations of a binomial count, per token. The seed is fixed, so the
// outcome is deterministic; 5 sigma keeps it robust to reordering changes.
TEST(Sampler, FrequenciesMatchSoftmax) {
  std::mt19937_64 rng(6);
  constexpr int kDraws = 20000;
  for (float temperature : {1.0f, 0.5f, 2.0f}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << temperature);
    const std::vector<float> logits = RandomLogits(12, rng);
    double max = logits[0], sum = 0.0;
    for (float x : logits) max = std::max<double>(max, x);
    std::vector<double> p;
    for (float x : logits) sum += p.emplace_back(std::exp((x - max) / temperature));
    const std::vector<int> counts = Histogram(Params(temperature, 0, 1.0f, 17), logits, kDraws);
    for (size_t i = 0; i < p.size(); ++i) {
      const double expected = kDraws * p[i] / sum;
      const double sigma = std::sqrt(expected * (1.0 - p[i] / sum));
      EXPECT_LE(std::abs(counts[i] - expected), 5.0 * sigma + 1.0)
          << "token " << i << " p=" << p[i] / sum;
    }
  }
}

}  // namespace
}  // namespace tandem
