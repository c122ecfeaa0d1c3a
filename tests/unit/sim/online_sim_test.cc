// The online planner in the simulator (tools/sim/online_sim.h): rate
// curves and their arrivals, a cluster that changes size, Dynamo's
// formula, and the planner resizing a simulated cluster through the
// router's metrics text as tandem-planner reads it.
#include "tools/sim/online_sim.h"

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/router_metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/sim/sim_test_util.h"

namespace tandem::sim {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::HasSubstr;

TEST(RateCurve, MovesLinearlyBetweenItsPoints) {
  ASSERT_OK_AND_ASSIGN(const RateCurve c, ParseRateCurve("0:2,10:22,20:2"));
  EXPECT_EQ(c.duration(), 20);
  EXPECT_THAT(c.RateAt(5), DoubleNear(12, 1e-12));
  EXPECT_THAT(c.RateAt(15), DoubleNear(12, 1e-12));
  EXPECT_EQ(c.RateAt(30), 2);
  EXPECT_THAT(ParseRateCurve("0:2"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseRateCurve("5:2,10:4"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseRateCurve("0:2,0:4"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("increase")));
  EXPECT_THAT(ParseRateCurve("0:2,10:x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("SECONDS:RATE")));
}

// 0 -> 200 -> 0 req/s over 20 s holds 2,000 expected arrivals; a Poisson
// count lies within 4 standard deviations (about 180), the times rise,
// and more fall in the busy middle than at the quiet ends.
TEST(RateCurve, ArrivalsFollowTheCurve) {
  ASSERT_OK_AND_ASSIGN(const RateCurve c, ParseRateCurve("0:0,10:200,20:0"));
  const std::vector<double> a = CurveArrivals(c, 7);
  EXPECT_NEAR(static_cast<double>(a.size()), 2000, 180);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_GE(a.front(), 0);
  EXPECT_LE(a.back(), 20);
  const auto middle = std::count_if(a.begin(), a.end(), [](double t) { return t > 5 && t < 15; });
  EXPECT_GT(middle, static_cast<long>(a.size() * 7 / 10));
  EXPECT_EQ(CurveArrivals(c, 7), a);
  EXPECT_NE(CurveArrivals(c, 8), a);
}

// 10 ms + 1 ms per token: a 100-token prompt takes 110 ms (909 prompt
// tokens/s); decode steps of b rows take 10 + b ms, so 20 rows is the
// largest batch within 30 ms (667 tokens/s).
TEST(DynamoTable, SizesEachPoolFromItsThroughput) {
  const StepCostFn cost =
      LinearStepCost{.fixed = absl::Milliseconds(10), .per_token = absl::Milliseconds(1)};
  ASSERT_OK_AND_ASSIGN(const planner::ScalingTable t,
                       DynamoTable(cost, {10, 100}, 100, 10, absl::Milliseconds(30), 64));
  EXPECT_EQ(t.For(10), (planner::PoolCounts{2, 1}));
  EXPECT_EQ(t.For(100), (planner::PoolCounts{11, 2}));
  EXPECT_THAT(DynamoTable(cost, {10}, 100, 10, absl::Milliseconds(5), 64),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ITL target")));
}

class OnlineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = MakeSyntheticModel(testing::TinyShape(), 7).value();
    metrics_ = std::make_shared<router::RouterMetrics>(registry_);
  }
  std::unique_ptr<SimCluster> Cluster(int prefill, int decode) {
    SimClusterOptions o;
    o.prefill_workers = prefill;
    o.decode_workers = decode;
    o.make_backend = testing::OneThread;
    o.prefill.kv_blocks = o.decode.kv_blocks = 256;
    o.resizable = true;
    o.router.driver.metrics = metrics_.get();
    o.on_poll_round = [m = metrics_](int p, int d) {
      m->prefill_workers_ready.Set(p);
      m->decode_workers_ready.Set(d);
    };
    o.make_executor = [](Engine& engine, FakeClock* clock) {
      return std::make_unique<SimulatedExecutor>(
          engine.config(), engine.step_limits(), &engine.block_pool(), clock,
          LinearStepCost{.fixed = absl::Milliseconds(10), .per_token = absl::Milliseconds(1)});
    };
    return SimCluster::Create(*weights_, std::move(o)).value();
  }
  std::unique_ptr<ModelWeights> weights_;
  prometheus::Registry registry_;
  std::shared_ptr<router::RouterMetrics> metrics_;
};

int Routable(SimCluster& c, router::WorkerRole role) {
  int n = 0;
  for (const auto& w : c.registry().Snapshot(role)) n += w.healthy;
  return n;
}

// A new worker costs from its start and serves after its start-up; a
// leaving one leaves its pool at once and stops costing once idle.
TEST_F(OnlineTest, AResizedPoolGrowsAfterStartUpAndShrinksAtOnce) {
  auto c = Cluster(0, 1);
  const absl::Time t0 = c->clock().Now();
  c->AdvanceTo(t0 + absl::Seconds(10));
  ASSERT_OK(c->Resize(0, 2, absl::Seconds(5)));
  EXPECT_EQ(c->pool_size(router::WorkerRole::kDecode), 2);
  c->AdvanceTo(t0 + absl::Seconds(14));
  EXPECT_EQ(Routable(*c, router::WorkerRole::kDecode), 1);
  c->AdvanceTo(t0 + absl::Seconds(16));
  EXPECT_EQ(Routable(*c, router::WorkerRole::kDecode), 2);
  c->AdvanceTo(t0 + absl::Seconds(20));
  ASSERT_OK(c->Resize(0, 1, absl::Seconds(5)));
  EXPECT_EQ(Routable(*c, router::WorkerRole::kDecode), 1);
  c->AdvanceTo(t0 + absl::Seconds(30));
  // 30 s of the first worker and 10 s (10 to 20) of the second.
  EXPECT_THAT(c->WorkerSeconds(), DoubleNear(40, 1e-9));
  EXPECT_THAT(c->Resize(0, 0, absl::ZeroDuration()), StatusIs(absl::StatusCode::kInvalidArgument));
}

// A burst of 20 req/s between quiet stretches of 2: the planner (reading
// the router's metrics text every second) grows the pools from one
// colocated worker and shrinks them again; every request succeeds, and the
// run costs fewer worker-hours than the peak's deployment held throughout.
TEST_F(OnlineTest, ThePlannerResizesThroughTheRoutersMetrics) {
  ASSERT_OK_AND_ASSIGN(const RateCurve curve, ParseRateCurve("0:2,10:2,12:20,22:20,24:2,60:2"));
  const std::vector<double> arrivals = CurveArrivals(curve, 3);
  const auto dataset = ScheduledDataset(bench::MakeDataset({.kind = "synthetic",
                                                            .input_len = 32,
                                                            .output_len = 8,
                                                            .token_ids = true,
                                                            .vocab_size = 101,
                                                            .seed = 3})
                                            .value(),
                                        arrivals);
  bench::RunOptions run{.num_requests = static_cast<int>(arrivals.size()), .progress = false};
  ASSERT_OK_AND_ASSIGN(const planner::ScalingTable table,
                       planner::ScalingTable::Create({{5, {0, 1}}, {20, {1, 3}}}));
  OnlineOptions online;
  online.interval = absl::Seconds(2);
  online.startup = absl::Seconds(2);
  online.forecast = "constant";
  online.planner.horizon = absl::ZeroDuration();
  online.planner.cooldown = absl::Seconds(1);
  online.planner.scale_down_delay = absl::Seconds(5);
  online.planner.stale_after = absl::Seconds(5);

  auto planned = Cluster(0, 1);
  ASSERT_OK_AND_ASSIGN(const OnlineRun a,
                       RunOnline(*planned, registry_, *dataset, run, {}, &table, online));
  EXPECT_EQ(a.run.metrics.failed, 0);
  EXPECT_EQ(a.run.metrics.completed, static_cast<int>(arrivals.size()));
  ASSERT_GE(a.changes, 2);
  EXPECT_EQ(a.targets.front(), std::make_tuple(std::get<0>(a.targets.front()), 1, 3));
  EXPECT_EQ(std::get<1>(a.targets.back()), 0);
  EXPECT_EQ(std::get<2>(a.targets.back()), 1);

  auto fixed = Cluster(1, 3);
  ASSERT_OK_AND_ASSIGN(const OnlineRun b,
                       RunOnline(*fixed, registry_, *dataset, run, {}, nullptr, online));
  EXPECT_EQ(b.changes, 0);
  EXPECT_LT(a.worker_hours, b.worker_hours);
}

}  // namespace
}  // namespace tandem::sim
