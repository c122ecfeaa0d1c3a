// Statistics against hand-computed fixtures (vLLM bench serve definitions).
#include "tools/bench/stats.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/bench/options.h"

namespace tandem::bench {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;

TEST(PercentileTest, InterpolatesLikeNumpy) {
  // np.percentile([1, 2, 3, 4], q): 50 -> 2.5, 90 -> 3.7, 99 -> 3.97, 0 -> 1, 100 -> 4.
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_NEAR(Percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(Percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  // np.percentile([10, 20, 30, 40, 50], 90) = 46.
  EXPECT_NEAR(Percentile({10, 20, 30, 40, 50}, 90), 46, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(SummarizeTest, MeanPopulationStdAndPercentiles) {
  const Summary s = Summarize({1, 2, 3, 4});
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_NEAR(s.std, std::sqrt(1.25), 1e-12);  // np.std, ddof 0
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_NEAR(s.p90, 3.7, 1e-12);
  EXPECT_NEAR(s.p99, 3.97, 1e-12);
  EXPECT_EQ(s.count, 4u);
  const Summary empty = Summarize({});
  EXPECT_EQ(empty.mean, 0);
  EXPECT_EQ(empty.count, 0u);
}

RequestRecord Ok(double ttft, double e2e, int out, int prompt, std::vector<double> itls) {
  return {.start = 0,
          .success = true,
          .error = "",
          .ttft = ttft,
          .e2e = e2e,
          .prompt_tokens = prompt,
          .output_tokens = out,
          .itls = std::move(itls)};
}

RequestRecord Failed(std::string error) {
  RequestRecord r;
  r.error = std::move(error);
  return r;
}

TEST(TpotTest, ExcludesFirstTokenAndSingleTokenRequests) {
  EXPECT_NEAR(*Tpot(Ok(0.1, 0.5, 5, 1, {})), 0.1, 1e-12);  // (0.5 - 0.1) / 4
  EXPECT_FALSE(Tpot(Ok(0.3, 0.3, 1, 1, {})).has_value());
  EXPECT_FALSE(Tpot(Failed("x")).has_value());
}

// A: 5 tokens, TTFT 100 ms, E2E 500 ms (TPOT 100 ms); B: 1 token, TTFT 300
// ms; C failed. Over 2 s.
std::vector<RequestRecord> Fixture() {
  return {Ok(0.1, 0.5, 5, 10, {0.1, 0.1, 0.1, 0.1}), Ok(0.3, 0.3, 1, 20, {}), Failed("boom")};
}

TEST(MetricsTest, AggregatesCompletedRequestsOnly) {
  const Metrics m = ComputeMetrics(Fixture(), 2.0);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_THAT(m.first_errors, ElementsAre("boom"));
  EXPECT_EQ(m.total_input_tokens, 30);
  EXPECT_EQ(m.total_output_tokens, 6);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 18.0);
  EXPECT_NEAR(m.ttft_ms.mean, 200, 1e-9);
  EXPECT_NEAR(m.ttft_ms.median, 200, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p99, 298, 1e-9);  // 100 + 0.99 * 200
  EXPECT_EQ(m.tpot_ms.count, 1u);         // B has one token: no TPOT
  EXPECT_NEAR(m.tpot_ms.mean, 100, 1e-9);
  EXPECT_EQ(m.itl_ms.count, 4u);
  EXPECT_NEAR(m.itl_ms.mean, 100, 1e-9);
  EXPECT_NEAR(m.e2e_ms.mean, 400, 1e-9);
  EXPECT_FALSE(m.goodput.has_value());
}

TEST(MetricsTest, GoodputTtftOnly) {
  const Metrics m = ComputeMetrics(Fixture(), 2.0, Slo{.ttft = 0.2, .tpot = {}, .e2e = {}});
  ASSERT_TRUE(m.goodput.has_value());
  EXPECT_DOUBLE_EQ(*m.goodput, 0.5);  // only A
}

TEST(MetricsTest, GoodputTtftAndTpot) {
  // A's TPOT (100 ms) misses 50 ms; B has one token, so TPOT counts as 0.
  EXPECT_DOUBLE_EQ(
      *ComputeMetrics(Fixture(), 2.0, Slo{.ttft = 0.5, .tpot = 0.05, .e2e = {}}).goodput, 0.5);
  EXPECT_DOUBLE_EQ(
      *ComputeMetrics(Fixture(), 2.0, Slo{.ttft = 0.5, .tpot = 0.2, .e2e = {}}).goodput, 1.0);
  EXPECT_DOUBLE_EQ(*ComputeMetrics(Fixture(), 2.0, Slo{.ttft = {}, .tpot = {}, .e2e = 0.4}).goodput,
                   0.5);
}

TEST(OptionsTest, ParsesSloInMilliseconds) {
  auto slo = ParseSlo("ttft=500,tpot=50");
  ASSERT_TRUE(slo.ok()) << slo.status();
  EXPECT_DOUBLE_EQ(*slo->ttft, 0.5);
  EXPECT_DOUBLE_EQ(*slo->tpot, 0.05);
  EXPECT_FALSE(slo->e2e.has_value());
  EXPECT_TRUE(ParseSlo("")->empty());
  EXPECT_FALSE(ParseSlo("ttft").ok());
  EXPECT_FALSE(ParseSlo("ttft=-1").ok());
  EXPECT_FALSE(ParseSlo("latency=5").ok());
}

TEST(OptionsTest, ParsesRates) {
  auto rates = ParseRates("1,2.5,inf");
  ASSERT_TRUE(rates.ok());
  ASSERT_EQ(rates->size(), 3u);
  EXPECT_DOUBLE_EQ((*rates)[1], 2.5);
  EXPECT_TRUE(std::isinf((*rates)[2]));
  EXPECT_FALSE(ParseRates("1,x").ok());
  EXPECT_FALSE(ParseRates("0").ok());
}

}  // namespace
}  // namespace tandem::bench
