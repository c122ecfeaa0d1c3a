#include "common/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "common/base/philox.h"
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
  for (float m : {-0.1f, 1.01f, nan, inf}) {
    SamplingParams q = Params(1.0f);
    q.min_p = m;
    EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_p")))
        << m;
  }
}

TEST(SamplingParams, PenaltyBiasAndMinTokensBounds) {
  SamplingParams p;
  p.presence_penalty = 2.0f;
  p.frequency_penalty = -2.0f;
  p.repetition_penalty = 0.5f;
  p.logit_bias = {{0, 100.0f}, {7, -100.0f}};
  p.min_tokens = 3;
  EXPECT_OK(p.Validate());
  EXPECT_OK(p.ValidateForVocab(8));
  EXPECT_THAT(p.ValidateForVocab(7),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the vocabulary")));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float v : {2.01f, -2.01f, nan}) {
    SamplingParams q;
    q.presence_penalty = v;
    EXPECT_THAT(q.Validate(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("presence_penalty")));
    q = SamplingParams{};
    q.frequency_penalty = v;
    EXPECT_THAT(q.Validate(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frequency_penalty")));
  }
  for (float v : {0.0f, -1.0f, nan, std::numeric_limits<float>::infinity()}) {
    SamplingParams q;
    q.repetition_penalty = v;
    EXPECT_THAT(q.Validate(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repetition_penalty")));
  }
  SamplingParams q;
  q.logit_bias = {{3, 100.5f}};
  EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[-100, 100]")));
  q.logit_bias = {{-1, 1.0f}};
  EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logit_bias")));
  q.logit_bias = {{2, 1.0f}, {2, 3.0f}};
  EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  q.logit_bias.assign(kMaxLogitBias + 1, {0, 0.0f});
  for (int i = 0; i <= kMaxLogitBias; ++i) q.logit_bias[i].first = i;
  EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most")));
  q = SamplingParams{};
  q.min_tokens = -1;
  EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_tokens")));
}

TEST(ChoiceSeed, IndexZeroIsTheSeedOthersDiffer) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{42}, ~uint64_t{0}}) {
    EXPECT_EQ(ChoiceSeed(seed, 0), seed);
    std::set<uint64_t> seeds = {seed};
    for (int i = 1; i < 16; ++i) seeds.insert(ChoiceSeed(seed, i));
    EXPECT_EQ(seeds.size(), 16u) << "seed " << seed;
  }
  // Deterministic, and neighbouring seeds do not share choice seeds.
  EXPECT_EQ(ChoiceSeed(7, 3), ChoiceSeed(7, 3));
  EXPECT_NE(ChoiceSeed(7, 1), ChoiceSeed(8, 1));
  EXPECT_NE(ChoiceSeed(7, 1), 8u);
  // A well mixed output: about half the bits flip between neighbours.
  const int flipped = __builtin_popcountll(ChoiceSeed(100, 1) ^ ChoiceSeed(100, 2));
  EXPECT_GT(flipped, 12);
  EXPECT_LT(flipped, 52);
}

TEST(Sampler, NoProcessorsSampleTheRowItself) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  Sampler sampler(Params(1.0f));
  EXPECT_EQ(sampler.Processed(logits).data(), logits.data());  // not copied
}

TEST(Sampler, PenaltiesAndBiasMatchHandComputedLogits) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{4, 1.5f}, {0, -3.0f}};
  const std::vector<int32_t> prompt = {2, 3, 3};
  Sampler sampler(p, prompt, {});
  sampler.Accept(1);
  sampler.Accept(1);
  sampler.Accept(3);
  const std::vector<float> logits = {1.0f, 2.0f, -1.0f, 4.0f, 0.5f, 0.25f};
  const std::span<const float> out = sampler.Processed(logits);
  ASSERT_EQ(out.size(), logits.size());
  // 0: bias only: 1 - 3 = -2.
  EXPECT_FLOAT_EQ(out[0], -2.0f);
  // 1: generated twice: repetition 2 / 2 = 1, then 1 - 0.5 - 0.25 * 2 = 0.
  EXPECT_FLOAT_EQ(out[1], 0.0f);
  // 2: prompt only, negative: -1 * 2 = -2; no presence/frequency (prompt).
  EXPECT_FLOAT_EQ(out[2], -2.0f);
  // 3: prompt and generated once: 4 / 2 = 2 (once), then 2 - 0.5 - 0.25 = 1.25.
  EXPECT_FLOAT_EQ(out[3], 1.25f);
  // 4: bias 1.5 -> 2; never seen.
  EXPECT_FLOAT_EQ(out[4], 2.0f);
  // 5: untouched.
  EXPECT_FLOAT_EQ(out[5], 0.25f);
  // Greedy picks the processed argmax (token 4), not the raw one (3).
  EXPECT_EQ(sampler.Sample(logits), 4);
  EXPECT_EQ(Argmax(logits), 3);
}

TEST(Sampler, NegativePenaltiesEncourageRepeats) {
  SamplingParams p;
  p.presence_penalty = -1.0f;
  p.frequency_penalty = -0.5f;
  Sampler sampler(p, {}, {});
  sampler.Accept(0);
  const std::vector<float> logits = {1.0f, 2.0f};
  EXPECT_FLOAT_EQ(sampler.Processed(logits)[0], 2.5f);
  EXPECT_EQ(sampler.Sample(logits), 0);
}

TEST(Sampler, MinTokensMasksStopIdsUntilEnoughWereAccepted) {
  SamplingParams p;
  p.min_tokens = 2;
  const std::vector<int32_t> stops = {1, 3};
  Sampler sampler(p, {}, stops);
  const std::vector<float> logits = {0.0f, 9.0f, 1.0f, 8.0f};
  EXPECT_EQ(sampler.Processed(logits)[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(sampler.Processed(logits)[3], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(sampler.Sample(logits), 2);
  sampler.Accept(2);
  EXPECT_EQ(sampler.Sample(logits), 2);
  sampler.Accept(2);
  EXPECT_EQ(sampler.generated(), 2);
  EXPECT_EQ(sampler.Sample(logits), 1);                        // unmasked now
  EXPECT_EQ(sampler.Processed(logits).data(), logits.data());  // and no longer copied

  // At a temperature too, a masked stop id is never drawn.
  SamplingParams hot = Params(5.0f, 0, 1.0f, 3);
  hot.min_tokens = 1;
  Sampler s2(hot, {}, stops);
  for (int i = 0; i < 500; ++i) {
    const int32_t t = s2.Sample(logits);
    ASSERT_NE(t, 1);
    ASSERT_NE(t, 3);
  }
}

// PicksRawArgmax holds exactly when Sample returns the raw row's argmax
// without looking at anything else: greedy and nothing processing the row.
TEST(Sampler, PicksRawArgmaxOnlyWhenGreedyLeavesTheRowAsItIs) {
  EXPECT_TRUE(Sampler(Params(0.0f)).PicksRawArgmax());
  EXPECT_TRUE(Sampler(Params(0.7f, /*top_k=*/1)).PicksRawArgmax());
  EXPECT_FALSE(Sampler(Params(0.7f)).PicksRawArgmax());
  SamplingParams biased = Params(0.0f);
  biased.logit_bias = {{2, 5.0f}};
  EXPECT_FALSE(Sampler(biased).PicksRawArgmax());
  SamplingParams penalised = Params(0.0f);
  penalised.presence_penalty = 0.5f;
  EXPECT_FALSE(Sampler(penalised).PicksRawArgmax());
  penalised = Params(0.0f);
  penalised.repetition_penalty = 1.2f;
  EXPECT_FALSE(Sampler(penalised).PicksRawArgmax());

  // min_tokens changes the row until enough tokens were accepted.
  SamplingParams p = Params(0.0f);
  p.min_tokens = 2;
  const std::vector<int32_t> stops = {1};
  Sampler sampler(p, {}, stops);
  const std::vector<float> logits = {0.0f, 9.0f, 1.0f};
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(sampler.PicksRawArgmax());
    EXPECT_NE(sampler.Sample(logits), Argmax(logits));
    sampler.Accept(2);
  }
  EXPECT_TRUE(sampler.PicksRawArgmax());
  EXPECT_EQ(sampler.Sample(logits), Argmax(logits));
}

TEST(Sampler, EveryTokenMaskedStillReturnsAToken) {
  SamplingParams p = Params(1.0f);
  p.min_tokens = 1;
  const std::vector<int32_t> stops = {0, 1};
  Sampler sampler(p, {}, stops);
  const int32_t t = sampler.Sample(std::vector<float>{1.0f, 2.0f});
  EXPECT_TRUE(t == 0 || t == 1);
}

TEST(Sampler, OutOfRangeProcessorIdsAreIgnored) {
  SamplingParams p;
  p.logit_bias = {{10, 5.0f}};
  p.min_tokens = 1;
  const std::vector<int32_t> stops = {-1, 99};
  Sampler sampler(p, {}, stops);
  sampler.Accept(50);
  const std::vector<float> logits = {1.0f, 2.0f};
  const std::span<const float> out = sampler.Processed(logits);
  EXPECT_EQ(std::vector<float>(out.begin(), out.end()), logits);
}

// The decode worker skips the draw the prefill worker made for the first
// token: a sampler that skips then samples gives what one that sampled
// twice gives on its second draw.
// A sampler that advances by another's draw count continues exactly where
// that one would: how prefill and decode stay in step across workers.
TEST(Sampler, AdvancingByTheDrawCountContinuesTheSameStream) {
  std::mt19937_64 rng(13);
  std::vector<std::vector<float>> rows;
  for (int i = 0; i < 40; ++i) rows.push_back(RandomLogits(50, rng));
  SamplingParams p = Params(0.8f, 0, 0.9f, 5);
  p.presence_penalty = 0.3f;
  Sampler a(p, {}, {}), b(p, {}, {});
  std::vector<int32_t> head;
  for (int i = 0; i < 7; ++i) {
    head.push_back(a.Sample(rows[i]));
    a.Accept(head.back());
  }
  EXPECT_EQ(a.draws(), 7u);
  b.Advance(a.draws());
  for (int32_t t : head) b.Accept(t);
  for (size_t i = 7; i < rows.size(); ++i) {
    const int32_t x = a.Sample(rows[i]), y = b.Sample(rows[i]);
    ASSERT_EQ(x, y) << "token " << i;
    a.Accept(x);
    b.Accept(y);
  }
  Sampler greedy(Params(0.0f, 0, 1.0f, 5), {}, {});
  (void)greedy.Sample(rows[0]);
  EXPECT_EQ(greedy.draws(), 0u);
  std::vector<int32_t> too_many(Sampler::kMaxReplay + 1, 0);
  EXPECT_FALSE(greedy.Replay(too_many));
  EXPECT_EQ(greedy.generated(), 0);
}

// Draw n is a function of the seed and n alone: Sample's uniform is
// PhiloxUniform(seed, draws()), so a sampler advanced by a billion draws
// (a stream far along, moved between workers) picks what that number
// says, at no cost, and draws the same numbers the CUDA sampler does.
TEST(Sampler, EachDrawIsTheSeedsPhiloxNumberAtTheDrawCount) {
  // Three tokens of probability 1/4, 1/2 and 1/4 at temperature 1, walked
  // in id order: the draw u picks token 0 for u < 1/4, token 1 for
  // u < 3/4, else token 2.
  const std::vector<float> logits = {0.0f, std::log(2.0f), 0.0f};
  for (uint64_t seed : {uint64_t{0}, uint64_t{9}, ~uint64_t{0}}) {
    for (uint64_t start : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 30, uint64_t{1} << 40}) {
      Sampler sampler(Params(1.0f, 0, 1.0f, seed));
      sampler.Advance(start);
      for (uint64_t i = start; i < start + 64; ++i) {
        const double u = PhiloxUniform(seed, i);
        const int32_t want = u < 0.25 ? 0 : (u < 0.75 ? 1 : 2);
        ASSERT_EQ(sampler.Sample(logits), want) << "seed " << seed << " draw " << i << " u " << u;
      }
      EXPECT_EQ(sampler.draws(), start + 64);
    }
  }
}

// The sampler's cuts and draw equal a reference that sorts the whole row:
// the kept set is the shorter of the top_p and min_p prefixes of the top_k
// (highest logit first, ties by lower id), and draw u picks the first kept
// token in id order whose running sum exceeds u times the kept total.
// Nuclei of hundreds of tokens cross the sampler's growing sorted spans.
TEST(Sampler, CutsAndDrawEqualAFullSortReference) {
  std::mt19937_64 rng(21);
  struct Case {
    float temperature;
    int top_k;
    float top_p, min_p;
  };
  const Case cases[] = {{1.0f, 0, 1.0f, 0.0f},  {0.7f, 0, 0.95f, 0.0f},   {2.0f, 0, 0.99f, 0.0f},
                        {1.0f, 0, 1.0f, 0.05f}, {1.5f, 0, 0.9f, 0.01f},   {1.0f, 300, 0.97f, 0.0f},
                        {1.0f, 50, 1.0f, 0.1f}, {3.0f, 700, 0.8f, 0.001f}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T " << c.temperature << " top_k " << c.top_k << " top_p "
                                      << c.top_p << " min_p " << c.min_p);
    std::vector<float> logits = RandomLogits(1000, rng);
    for (int i = 0; i < 40; ++i) logits[i * 25] = logits[i * 25 + 1];  // ties
    SamplingParams p = Params(c.temperature, c.top_k, c.top_p, 77);
    p.min_p = c.min_p;
    // The reference.
    std::vector<std::pair<float, int32_t>> order;
    for (int i = 0; i < 1000; ++i) order.push_back({logits[i], i});
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    if (c.top_k > 0) order.resize(c.top_k);
    const double max = order[0].first;
    auto prob = [&](float x) { return std::exp((static_cast<double>(x) - max) / c.temperature); };
    double total = 0.0;
    for (const auto& o : order) total += prob(o.first);
    size_t keep = order.size(), by_min_p = 0;
    while (by_min_p < order.size() && prob(order[by_min_p].first) >= c.min_p) ++by_min_p;
    keep = std::min(keep, by_min_p);
    double mass = 0.0;
    for (size_t i = 0; i < order.size() && c.top_p < 1.0f; ++i) {
      mass += prob(order[i].first);
      if (mass >= c.top_p * total) {
        keep = std::min(keep, i + 1);
        break;
      }
    }
    ASSERT_GT(keep, 0u);
    std::vector<int32_t> kept;
    for (size_t i = 0; i < keep; ++i) kept.push_back(order[i].second);
    std::sort(kept.begin(), kept.end());
    double kept_sum = 0.0;
    for (int32_t id : kept) kept_sum += prob(logits[id]);
    Sampler sampler(p);
    std::set<int32_t> seen;
    for (uint64_t draw = 0; draw < 300; ++draw) {
      const double u = PhiloxUniform(77, draw) * kept_sum;
      double acc = 0.0;
      int32_t want = kept.back();
      for (int32_t id : kept) {
        acc += prob(logits[id]);
        if (u < acc) {
          want = id;
          break;
        }
      }
      ASSERT_EQ(sampler.Sample(logits), want) << "draw " << draw << " of " << keep << " kept";
      seen.insert(want);
    }
    EXPECT_GT(seen.size(), 1u);
  }
}

// min_p keeps the tokens whose probability is at least min_p times the
// most likely one's, and combines with top_p as the shorter prefix.
TEST(Sampler, MinPDropsTokensBelowItsShareOfTheTopToken) {
  // Probabilities proportional to 8, 4, 2, 1 (logits log 8 .. 0).
  const std::vector<float> logits = {std::log(2.0f), std::log(8.0f), 0.0f, std::log(4.0f)};
  SamplingParams p = Params(1.0f, 0, 1.0f, 3);
  p.min_p = 0.45f;  // 8 and 4 stay (4 >= 0.45 * 8), 2 and 1 go
  std::vector<int> counts = Histogram(p, logits, 6000);
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_NEAR(counts[1], 4000, 200);  // 8 / 12 of the draws
  EXPECT_NEAR(counts[3], 2000, 200);
  p.min_p = 0.2f;  // 2 stays (2 >= 0.2 * 8), 1 goes
  counts = Histogram(p, logits, 6000);
  EXPECT_EQ(counts[2], 0);
  EXPECT_GT(counts[0], 0);
  p.min_p = 1.0f;  // only the top token
  EXPECT_EQ(Histogram(p, logits, 500)[1], 500);
  // With top_p the shorter prefix wins: top_p 0.5 keeps 8 alone.
  p.min_p = 0.1f;
  p.top_p = 0.5f;
  EXPECT_EQ(Histogram(p, logits, 500)[1], 500);
  // The temperature sharpens the probabilities before the cut: at T = 0.5
  // they are 64, 16, 4, 1, so min_p 0.2 keeps 64 and 16 only.
  p = Params(0.5f, 0, 1.0f, 3);
  p.min_p = 0.2f;
  counts = Histogram(p, logits, 4000);
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_GT(counts[3], 0);
}

TEST(Sampler, DifferentChoiceSeedsGiveDifferentStreams) {
  std::mt19937_64 rng(13);
  std::vector<std::vector<float>> steps;
  for (int i = 0; i < 50; ++i) steps.push_back(RandomLogits(64, rng));
  auto run = [&](uint64_t seed) {
    Sampler sampler(Params(1.0f, 0, 1.0f, seed));
    std::vector<int32_t> tokens;
    for (const auto& logits : steps) tokens.push_back(sampler.Sample(logits));
    return tokens;
  };
  EXPECT_NE(run(ChoiceSeed(5, 0)), run(ChoiceSeed(5, 1)));
  EXPECT_EQ(run(ChoiceSeed(5, 0)), run(5));
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
