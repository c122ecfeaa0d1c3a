// Reading the router's /metrics (planner/router_scrape.h): the series the
// planner needs, and quantiles of a histogram's growth as Prometheus's
// histogram_quantile computes them.
#include "planner/router_scrape.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem::planner {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Optional;

const absl::Time kScrapeT0 = absl::UnixEpoch() + absl::Hours(10);

// The router's text as prometheus-cpp writes it, with `requests` ok and 2
// refused, TTFT buckets 0.1 / 0.5 / +Inf holding a, b, c, and the pools.
std::string Text(int requests, int a, int b, int c, int prefill = 1, int decode = 2) {
  return absl::StrCat(
      "# HELP tandem_router_requests_total Client Generate requests by outcome\n"
      "# TYPE tandem_router_requests_total counter\n"
      "tandem_router_requests_total{outcome=\"ok\"} ",
      requests, "\n", "tandem_router_requests_total{outcome=\"resource_exhausted\"} 2\n",
      "tandem_router_time_to_first_token_seconds_count ", c, "\n",
      "tandem_router_time_to_first_token_seconds_bucket{le=\"0.1\"} ", a, "\n",
      "tandem_router_time_to_first_token_seconds_bucket{le=\"0.5\"} ", b, "\n",
      "tandem_router_time_to_first_token_seconds_bucket{le=\"+Inf\"} ", c, "\n",
      "tandem_router_workers_ready{pool=\"prefill\"} ", prefill, "\n",
      "tandem_router_workers_ready{pool=\"decode\"} ", decode, "\n",
      "tandem_router_requests_queued 0\n");
}

TEST(RouterScrape, ReadsTheSeriesThePlannerNeeds) {
  ASSERT_OK_AND_ASSIGN(const RouterScrape r, ParseRouterMetrics(Text(10, 1, 2, 3), kScrapeT0));
  EXPECT_EQ(r.requests, 12);
  EXPECT_EQ(r.refused, 2);
  ASSERT_EQ(r.ttft_buckets.size(), 3u);
  EXPECT_EQ(r.ttft_buckets[1], (std::pair<double, double>{0.5, 2}));
  EXPECT_TRUE(std::isinf(r.ttft_buckets[2].first));
  EXPECT_TRUE(r.tpot_buckets.empty());
  EXPECT_EQ(r.prefill_ready, 1);
  EXPECT_EQ(r.decode_ready, 2);
}

TEST(RouterScrape, RefusesWhatIsNotARoutersMetrics) {
  EXPECT_THAT(ParseRouterMetrics("up 1\n", kScrapeT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tandem router")));
  EXPECT_THAT(ParseRouterMetrics("tandem_router_requests_total{outcome=\"ok} 1\n", kScrapeT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
  EXPECT_THAT(ParseRouterMetrics("tandem_router_requests_total x\n", kScrapeT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed value")));
}

// 100 new requests between two readings: 90 under 0.1 s, 8 more under
// 0.5 s, 2 beyond. The 50th lies in the first bucket (0.1 x 50/90), the
// 95th in the second (0.1 + 0.4 x 5/8), the 99th in +Inf (0.5).
TEST(RouterScrape, QuantilesComeFromTheGrowthBetweenReadings) {
  const std::vector<std::pair<double, double>> before = {{0.1, 10}, {0.5, 20}, {INFINITY, 30}};
  const std::vector<std::pair<double, double>> after = {{0.1, 100}, {0.5, 118}, {INFINITY, 130}};
  EXPECT_THAT(QuantileOfGrowth(before, after, 0.5), Optional(DoubleNear(0.1 * 50 / 90, 1e-12)));
  EXPECT_THAT(QuantileOfGrowth(before, after, 0.95),
              Optional(DoubleNear(0.1 + 0.4 * 5 / 8, 1e-12)));
  EXPECT_THAT(QuantileOfGrowth(before, after, 0.99), Optional(DoubleNear(0.5, 1e-12)));
  EXPECT_EQ(QuantileOfGrowth(after, after, 0.99), std::nullopt);
  EXPECT_EQ(QuantileOfGrowth(before, {}, 0.99), std::nullopt);
}

TEST(RouterScrape, AnObservationIsTheIntervalBetweenTwoReadings) {
  ASSERT_OK_AND_ASSIGN(const RouterScrape a, ParseRouterMetrics(Text(10, 1, 2, 3), kScrapeT0));
  ASSERT_OK_AND_ASSIGN(const RouterScrape b, ParseRouterMetrics(Text(60, 51, 52, 53, 2, 3),
                                                                kScrapeT0 + absl::Seconds(10)));
  const Observation o = Between(a, b);
  EXPECT_EQ(o.at, kScrapeT0 + absl::Seconds(10));
  EXPECT_THAT(o.request_rate, Optional(DoubleNear(5, 1e-12)));
  EXPECT_THAT(o.refused_fraction, Optional(DoubleNear(0, 1e-12)));
  EXPECT_THAT(o.ttft_p99, Optional(DoubleNear(0.1 * 49.5 / 50, 1e-12)));
  EXPECT_EQ(o.tpot_p99, std::nullopt);
  EXPECT_EQ(o.prefill_ready, 2);
  EXPECT_EQ(o.decode_ready, 3);
  // A router that restarted counts from zero: no rate, not a negative one.
  EXPECT_EQ(Between(b, a).request_rate, std::nullopt);
}

// Two replicas of the router over 10 s: A saw 50 requests (5/s), all of
// TTFT under 0.1 s; B 20 (2/s), 10 under 0.5 s and 10 beyond. C appeared
// between the readings and D restarted: they add nothing but C's view of
// the pools. Merged, 70 requests: the median lies in A's bucket (0.1 x
// 35/50), the 99th beyond 0.5 s.
TEST(RouterScrape, ReplicasOfTheRouterAreAddedBeforeTheQuantile) {
  auto read = [](const std::string& text, absl::Duration at) {
    absl::StatusOr<RouterScrape> r = ParseRouterMetrics(text, kScrapeT0 + at);
    EXPECT_OK(r.status());
    return *r;
  };
  const RouterScrapes before = {{"a", read(Text(10, 1, 2, 3), absl::ZeroDuration())},
                                {"b", read(Text(0, 0, 0, 0), absl::Seconds(1))},
                                {"d", read(Text(500, 500, 500, 500), absl::Seconds(1))}};
  const RouterScrapes after = {{"a", read(Text(60, 51, 52, 53, 2, 3), absl::Seconds(10))},
                               {"b", read(Text(20, 0, 10, 20, 2, 2), absl::Seconds(11))},
                               {"c", read(Text(900, 900, 900, 900, 2, 4), absl::Seconds(11))},
                               {"d", read(Text(5, 5, 5, 5), absl::Seconds(11))}};
  const Observation o = BetweenRouters(before, after);
  EXPECT_EQ(o.at, kScrapeT0 + absl::Seconds(11));
  EXPECT_THAT(o.request_rate, Optional(DoubleNear(7, 1e-12)));
  EXPECT_THAT(o.refused_fraction, Optional(DoubleNear(0, 1e-12)));
  EXPECT_THAT(o.ttft_p99, Optional(DoubleNear(0.5, 1e-12)));
  EXPECT_THAT(BetweenRouters(before, after, 0.5).ttft_p99,
              Optional(DoubleNear(0.1 * 35 / 50, 1e-12)));
  EXPECT_EQ(o.prefill_ready, 2);
  EXPECT_EQ(o.decode_ready, 4);
  // Every router new or restarted: no rate and no quantile yet.
  const Observation none = BetweenRouters({{"d", before.at("d")}}, after);
  EXPECT_EQ(none.request_rate, std::nullopt);
  EXPECT_EQ(none.ttft_p99, std::nullopt);
}

// The prompts decode workers prefilled in bursts, as a share of the
// interval's requests (a router without the series counts none).
TEST(RouterScrape, BurstPrefillsAreAShareOfTheIntervalsRequests) {
  ASSERT_OK_AND_ASSIGN(
      const RouterScrape a,
      ParseRouterMetrics(Text(10, 1, 2, 3) + "tandem_router_burst_prefill_requests_total 4\n",
                         kScrapeT0));
  ASSERT_OK_AND_ASSIGN(
      const RouterScrape b,
      ParseRouterMetrics(Text(60, 51, 52, 53) + "tandem_router_burst_prefill_requests_total 14\n",
                         kScrapeT0 + absl::Seconds(10)));
  EXPECT_EQ(b.burst_prefills, 14);
  EXPECT_THAT(Between(a, b).burst_fraction, Optional(DoubleNear(0.2, 1e-12)));
  ASSERT_OK_AND_ASSIGN(const RouterScrape old,
                       ParseRouterMetrics(Text(60, 51, 52, 53), kScrapeT0 + absl::Seconds(10)));
  EXPECT_THAT(Between(a, old).burst_fraction, Optional(DoubleNear(0, 1e-12)));
}

}  // namespace
}  // namespace tandem::planner
