// The planner's decisions (planner/planner_core.h): pure functions of the
// observations and the times given, so every case runs on a hand-moved
// clock.
#include "planner/planner_core.h"

#include <memory>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem::planner {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kCoreT0 = absl::UnixEpoch() + absl::Hours(10);

absl::Time CoreAt(double seconds) { return kCoreT0 + absl::Seconds(seconds); }

// Colocated up to 2 req/s, then disaggregated.
ScalingTable Table() {
  return ScalingTable::Create({{2, {0, 1}}, {10, {1, 2}}, {20, {2, 4}}, {40, {4, 7}}}).value();
}

PlannerOptions Options() {
  PlannerOptions o;
  o.horizon = absl::ZeroDuration();
  o.cooldown = absl::Seconds(30);
  o.scale_down_delay = absl::Seconds(120);
  o.stale_after = absl::Seconds(20);
  o.start_timeout = absl::Seconds(300);
  return o;
}

std::unique_ptr<PlannerCore> Planner(PlannerOptions o = Options(), PoolCounts initial = {0, 1}) {
  return PlannerCore::Create(std::move(o), Table(), std::make_unique<ConstantForecaster>(), initial,
                             kCoreT0)
      .value();
}

// An observation read at `t` of `rate` req/s with every target worker ready.
Observation Seen(double t, double rate, PoolCounts ready = {100, 100}) {
  Observation o;
  o.at = CoreAt(t);
  o.request_rate = rate;
  o.prefill_ready = ready.prefill;
  o.decode_ready = ready.decode;
  return o;
}

TEST(ScalingTable, TakesTheFirstRateAtLeastAsHighAndScalesPastTheLast) {
  const ScalingTable t = Table();
  EXPECT_EQ(t.For(0), (PoolCounts{0, 1}));
  EXPECT_EQ(t.For(2), (PoolCounts{0, 1}));
  EXPECT_EQ(t.For(2.01), (PoolCounts{1, 2}));
  EXPECT_EQ(t.For(20), (PoolCounts{2, 4}));
  // 60 req/s: 1.5 times the last point's 4 and 7, rounded up.
  EXPECT_EQ(t.For(60), (PoolCounts{6, 11}));
  EXPECT_EQ(t.For(80), (PoolCounts{8, 14}));
}

TEST(ScalingTable, RefusesWhatIsNotARateCurve) {
  EXPECT_THAT(ScalingTable::Create({}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ScalingTable::Create({{4, {0, 1}}, {2, {0, 2}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("increasing")));
  EXPECT_THAT(ScalingTable::Create({{4, {1, 0}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1+")));
}

// tandem-plan's --plan_json, as plan_main.cc writes it.
TEST(ScalingTable, ReadsTandemPlansRateCurve) {
  const nlohmann::json plan = {
      {"plans",
       {{{"request_rate", 10},
         {"chosen", 1},
         {"points", {{{"prefill", 0}, {"decode", 3}}, {{"prefill", 1}, {"decode", 2}}}}},
        {{"request_rate", 2}, {"chosen", 0}, {"points", {{{"prefill", 0}, {"decode", 1}}}}}}}};
  ASSERT_OK_AND_ASSIGN(const ScalingTable t, ScalingTable::FromPlanJson(plan));
  ASSERT_EQ(t.points().size(), 2u);
  EXPECT_EQ(t.For(1), (PoolCounts{0, 1}));
  EXPECT_EQ(t.For(5), (PoolCounts{1, 2}));
  nlohmann::json none = plan;
  none["plans"][0].erase("chosen");
  EXPECT_THAT(ScalingTable::FromPlanJson(none),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max_workers")));
  EXPECT_THAT(ScalingTable::FromPlanJson(nlohmann::json::array()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plans")));
}

TEST(PlannerCore, GrowsAtOnceOutsideTheCooldown) {
  auto planner = Planner();
  // Within the cool-down of start: held.
  Decision d = planner->Step(Seen(10, 15), CoreAt(10));
  EXPECT_EQ(d.desired, (PoolCounts{2, 4}));
  EXPECT_EQ(d.target, (PoolCounts{0, 1}));
  EXPECT_FALSE(d.changed);
  EXPECT_THAT(d.reason, HasSubstr("cool-down"));
  d = planner->Step(Seen(30, 15), CoreAt(30));
  EXPECT_TRUE(d.changed);
  EXPECT_EQ(d.target, (PoolCounts{2, 4}));
  // Another rise 10 s later waits out the cool-down, then applies.
  d = planner->Step(Seen(40, 35), CoreAt(40));
  EXPECT_EQ(d.target, (PoolCounts{2, 4}));
  d = planner->Step(Seen(60, 35), CoreAt(60));
  EXPECT_EQ(d.target, (PoolCounts{4, 7}));
}

// A pool shrinks only after every desired count for scale_down_delay was
// lower, to the largest of them; a dip shorter than that changes nothing.
TEST(PlannerCore, ShrinksOnlyAfterTheDelayToTheLargestCountWanted) {
  auto planner = Planner(Options(), {4, 7});
  planner->Step(Seen(100, 5), CoreAt(100));   // wants 1P+2D
  planner->Step(Seen(150, 15), CoreAt(150));  // wants 2P+4D
  Decision d = planner->Step(Seen(210, 1), CoreAt(210));
  EXPECT_EQ(d.target, (PoolCounts{4, 7}));
  EXPECT_THAT(d.reason, HasSubstr("could shrink"));
  d = planner->Step(Seen(220, 1), CoreAt(220));
  EXPECT_TRUE(d.changed);
  EXPECT_EQ(d.target, (PoolCounts{2, 4}));

  auto dip = Planner(Options(), {4, 7});
  dip->Step(Seen(100, 1), CoreAt(100));
  dip->Step(Seen(200, 40), CoreAt(200));  // back up: the dip is over
  d = dip->Step(Seen(400, 1), CoreAt(400));
  EXPECT_EQ(d.target, (PoolCounts{4, 7}));
}

TEST(PlannerCore, KeepsEachPoolWithinItsBounds) {
  PlannerOptions o = Options();
  o.prefill = {1, 3};
  o.decode = {2, 5};
  auto planner = Planner(o, {1, 2});
  Decision d = planner->Step(Seen(100, 200), CoreAt(100));
  EXPECT_EQ(d.desired, (PoolCounts{3, 5}));
  EXPECT_EQ(d.target, (PoolCounts{3, 5}));
  d = planner->Step(Seen(200, 0), CoreAt(200));
  d = planner->Step(Seen(400, 0), CoreAt(400));
  EXPECT_EQ(d.target, (PoolCounts{1, 2}));
  EXPECT_THAT(
      PlannerCore::Create(o, Table(), std::make_unique<ConstantForecaster>(), {0, 2}, kCoreT0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside its bounds")));
  o.decode = {3, 2};
  EXPECT_THAT(
      PlannerCore::Create(o, Table(), std::make_unique<ConstantForecaster>(), {1, 2}, kCoreT0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min <= max")));
}

TEST(PlannerCore, HoldsOnStaleOrMissingMetrics) {
  auto planner = Planner();
  Decision d = planner->Step(Seen(100, 35), CoreAt(125));
  EXPECT_FALSE(d.changed);
  EXPECT_EQ(d.target, (PoolCounts{0, 1}));
  EXPECT_THAT(d.warnings, ElementsAre(HasSubstr("stale")));
  Observation none = Seen(130, 0);
  none.request_rate.reset();
  d = planner->Step(none, CoreAt(130));
  EXPECT_FALSE(d.changed);
  EXPECT_THAT(d.warnings, ElementsAre(HasSubstr("no request rate")));
  // Neither reached the forecaster: a fresh reading decides alone.
  d = planner->Step(Seen(140, 5), CoreAt(140));
  EXPECT_EQ(d.target, (PoolCounts{1, 2}));
  EXPECT_THAT(d.warnings, IsEmpty());
}

TEST(PlannerCore, ReportsAPoolWhoseWorkersDidNotStart) {
  auto planner = Planner();
  planner->Step(Seen(100, 15), CoreAt(100));  // asks for 2P+4D
  Decision d = planner->Step(Seen(200, 15, {2, 3}), CoreAt(200));
  EXPECT_THAT(d.warnings, IsEmpty());  // still within the start timeout
  d = planner->Step(Seen(400, 15, {2, 3}), CoreAt(400));
  EXPECT_THAT(d.warnings, ElementsAre(HasSubstr("decode pool has 3 of 4 workers ready")));
  EXPECT_EQ(d.target, (PoolCounts{2, 4}));  // asks for no more than it wants
}

// Observed TTFT p99 at twice its target doubles the rate the prefill pool
// is looked up at (the running mean moves halfway each step); TPOT within
// its target shrinks the decode pool's rate, down to half.
TEST(PlannerCore, CorrectsEachPoolByItsObservedLatency) {
  PlannerOptions o = Options();
  o.ttft_target = 0.5;
  o.tpot_target = 0.05;
  auto planner = Planner(o, {1, 2});
  Observation seen = Seen(100, 8);
  seen.ttft_p99 = 1.0;
  seen.tpot_p99 = 0.01;
  Decision d = planner->Step(seen, CoreAt(100));
  EXPECT_THAT(d.prefill_correction, DoubleNear(1.5, 1e-9));
  EXPECT_THAT(d.decode_correction, DoubleNear(0.75, 1e-9));
  // 8 x 1.5 = 12 req/s for prefill (2P); 8 x 0.75 = 6 for decode (2D).
  EXPECT_EQ(d.desired, (PoolCounts{2, 2}));
  seen.at = CoreAt(200);
  d = planner->Step(seen, CoreAt(200));
  EXPECT_THAT(d.prefill_correction, DoubleNear(1.75, 1e-9));
  EXPECT_THAT(d.decode_correction, DoubleNear(0.625, 1e-9));
}

// Requests turned away for want of capacity show no latency: they count
// as TPOT at the correction limit, with or without a TPOT target.
TEST(PlannerCore, RefusedRequestsGrowTheDecodePool) {
  auto planner = Planner(Options(), {1, 2});
  Observation seen = Seen(100, 8);
  seen.refused_fraction = 0.05;
  const Decision d = planner->Step(seen, CoreAt(100));
  EXPECT_THAT(d.decode_correction, DoubleNear(1.5, 1e-9));
  EXPECT_THAT(d.prefill_correction, DoubleNear(1, 1e-9));
  // Prefill looks up 8 req/s (1P), decode 12 (4D).
  EXPECT_EQ(d.desired, (PoolCounts{1, 4}));
  // No TPOT target: once refusals stop, the correction returns toward 1.
  seen.refused_fraction = 0;
  seen.at = CoreAt(110);
  EXPECT_THAT(planner->Step(seen, seen.at).decode_correction, DoubleNear(1.25, 1e-9));
}

// Prompts that decode workers prefill because every prefill worker is full
// are a prefill pool that is short, but one burst is what the absorbing is
// for: only burst_intervals readings in a row over burst_limit count, as
// TTFT at the correction limit.
TEST(PlannerCore, DecodeWorkersAbsorbingBurstsGrowThePrefillPoolOnlyWhenTheyKeepAtIt) {
  auto planner = Planner(Options(), {1, 2});
  Observation seen = Seen(100, 8);
  seen.burst_fraction = 0.3;
  for (int i = 0; i < 2; ++i) {
    seen.at = CoreAt(100 + 10 * i);
    EXPECT_THAT(planner->Step(seen, seen.at).prefill_correction, DoubleNear(1, 1e-9)) << i;
  }
  seen.burst_fraction = 0.05;  // under the limit: the run starts over
  seen.at = CoreAt(120);
  planner->Step(seen, seen.at);
  seen.burst_fraction = 0.3;
  for (int i = 0; i < 2; ++i) {
    seen.at = CoreAt(130 + 10 * i);
    EXPECT_THAT(planner->Step(seen, seen.at).prefill_correction, DoubleNear(1, 1e-9)) << i;
  }
  seen.at = CoreAt(150);
  const Decision d = planner->Step(seen, seen.at);
  EXPECT_THAT(d.prefill_correction, DoubleNear(1.5, 1e-9));
  EXPECT_THAT(d.decode_correction, DoubleNear(1, 1e-9));
  // Prefill looks up 12 req/s (2P), decode 8 (2D).
  EXPECT_EQ(d.desired, (PoolCounts{2, 2}));
  // Without a TTFT target, the correction returns toward 1 once the
  // bursts stop: halfway each reading.
  seen.burst_fraction = 0;
  seen.at = CoreAt(160);
  EXPECT_THAT(planner->Step(seen, seen.at).prefill_correction, DoubleNear(1.25, 1e-9));
  seen.at = CoreAt(170);
  EXPECT_THAT(planner->Step(seen, seen.at).prefill_correction, DoubleNear(1.125, 1e-9));
}

// A colocated deployment's decode workers prefill: when the TTFT lookup
// lands on one, its decode count holds if it is the larger.
TEST(PlannerCore, AColocatedLookupSizesTheDecodePool) {
  PlannerOptions o = Options();
  o.ttft_target = 0.5;
  o.tpot_target = 0.05;
  o.correction_weight = 1;
  const ScalingTable table = ScalingTable::Create({{4, {0, 4}}, {8, {1, 2}}, {16, {2, 5}}}).value();
  auto planner =
      PlannerCore::Create(o, table, std::make_unique<ConstantForecaster>(), {1, 3}, kCoreT0)
          .value();
  Observation seen = Seen(100, 6);
  seen.ttft_p99 = 0.125;  // a quarter of its target: the correction's floor, 0.5
  seen.tpot_p99 = 0.05;
  const Decision d = planner->Step(seen, CoreAt(100));
  // Prefill looks up 3 req/s (colocated on 4 workers); decode 6 (2).
  EXPECT_EQ(d.desired, (PoolCounts{0, 4}));
}

TEST(PlannerCore, ForecastsAheadWithTheTrend) {
  PlannerOptions o = Options();
  o.horizon = absl::Seconds(60);
  o.cooldown = absl::ZeroDuration();
  auto planner =
      PlannerCore::Create(o, Table(), std::make_unique<TrendForecaster>(absl::Minutes(5)), {0, 1},
                          kCoreT0)
          .value();
  planner->Step(Seen(0, 1), CoreAt(0));
  // 1 req/s more every 10 s: at 30 s it is 4, and 60 s ahead 10.
  planner->Step(Seen(10, 2), CoreAt(10));
  planner->Step(Seen(20, 3), CoreAt(20));
  const Decision d = planner->Step(Seen(30, 4), CoreAt(30));
  EXPECT_THAT(d.forecast_rate, DoubleNear(10, 1e-9));
  EXPECT_EQ(d.target, (PoolCounts{1, 2}));
}

}  // namespace
}  // namespace tandem::planner
