// Cost profiles (tools/sim/cost_profile.h): the fit recovers a linear cost
// exactly and never goes negative; profiling a simulated executor whose
// cost is known gives back that cost; profiles survive JSON; a profile of
// another shape or a malformed one is refused.
#include "tools/sim/cost_profile.h"

#include <memory>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/simulated_executor.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/sim/sim_test_util.h"

namespace tandem::sim {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

ModelConfig ProfileShape() { return testing::TinyShape(256); }

const LinearStepCost kCost{.fixed = absl::Microseconds(1500),
                           .per_token = absl::Microseconds(40),
                           .per_attended = absl::Nanoseconds(3),
                           .per_logit_row = absl::Microseconds(25),
                           .per_decode_token = absl::Microseconds(20),
                           .per_decode_attended = absl::Nanoseconds(9)};

void ExpectCost(const LinearStepCost& got, const LinearStepCost& want) {
  EXPECT_NEAR(absl::ToDoubleSeconds(got.fixed), absl::ToDoubleSeconds(want.fixed), 1e-12);
  EXPECT_NEAR(absl::ToDoubleSeconds(got.per_token), absl::ToDoubleSeconds(want.per_token), 1e-12);
  EXPECT_NEAR(absl::ToDoubleSeconds(got.per_attended), absl::ToDoubleSeconds(want.per_attended),
              1e-12);
  EXPECT_NEAR(absl::ToDoubleSeconds(got.per_logit_row), absl::ToDoubleSeconds(want.per_logit_row),
              1e-12);
  ASSERT_TRUE(got.per_decode_token.has_value() && got.per_decode_attended.has_value());
  EXPECT_NEAR(absl::ToDoubleSeconds(*got.per_decode_token),
              absl::ToDoubleSeconds(*want.per_decode_token), 1e-12);
  EXPECT_NEAR(absl::ToDoubleSeconds(*got.per_decode_attended),
              absl::ToDoubleSeconds(*want.per_decode_attended), 1e-12);
}

std::vector<ProfilePoint> PointsOf(const LinearStepCost& cost) {
  std::vector<ProfilePoint> points;
  // Prompt chunks, decode batches (every item one token) and a mixed step.
  const StepShape shapes[] = {{1, 16, 136, 1, 0, 0},          {1, 256, 32896, 1, 0, 0},
                              {1, 64, 2080, 1, 0, 0},         {1, 1, 65, 1, 1, 65},
                              {8, 8, 2056, 8, 8, 2056},       {32, 32, 8224, 32, 32, 8224},
                              {16, 16, 16400, 16, 16, 16400}, {4, 100, 9000, 4, 3, 300}};
  for (const StepShape& s : shapes) {
    points.push_back({s, absl::ToDoubleSeconds(cost(s))});
  }
  return points;
}

TEST(ScaleCost, MultipliesEveryStepsTime) {
  const LinearStepCost linear{.fixed = absl::Milliseconds(2), .per_token = absl::Microseconds(100)};
  ASSERT_OK_AND_ASSIGN(StepCostFn scaled, ScaleCost(linear, 1.5));
  const StepShape step{.items = 1, .tokens = 10, .logit_rows = 1};
  EXPECT_EQ(scaled(step), 1.5 * linear(step));
  EXPECT_EQ(scaled(step), absl::Microseconds(4500) + 1.5 * linear.per_logit_row);
  EXPECT_FALSE(ScaleCost(linear, 0).ok());
  EXPECT_FALSE(ScaleCost(linear, 101).ok());
}

TEST(FitLinear, RecoversALinearCostExactly) {
  ASSERT_OK_AND_ASSIGN(LinearStepCost fit, FitLinear(PointsOf(kCost)));
  ExpectCost(fit, kCost);
}

TEST(FitLinear, NeverFitsANegativeCost) {
  // Times that fall as rows grow would want a negative per-row cost.
  std::vector<ProfilePoint> points = {{{1, 1, 10, 1}, 0.010},
                                      {{8, 8, 80, 8}, 0.009},
                                      {{32, 32, 320, 32}, 0.008},
                                      {{1, 64, 640, 1}, 0.012}};
  ASSERT_OK_AND_ASSIGN(LinearStepCost fit, FitLinear(points));
  for (absl::Duration c : {fit.fixed, fit.per_token, fit.per_attended, fit.per_logit_row}) {
    EXPECT_GE(c, absl::ZeroDuration());
  }
  EXPECT_GT(fit.fixed, absl::ZeroDuration());
}

TEST(FitLinear, RefusesNoPointsAndTimesThatAreNotPositive) {
  EXPECT_THAT(FitLinear({}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(FitLinear({{{1, 1, 1, 1}, 0.0}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive")));
}

class MeasureProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = MakeSyntheticModel(ProfileShape(), 3).value();
    grid_ = ProfileGrid{.prompt_tokens = {16, 64, 200},
                        .decode_batches = {1, 4, 8},
                        .decode_contexts = {32, 128},
                        .repeats = 2};
    engine_ = Engine::Create(*weights_, testing::OneThread(),
                             EngineOptions{.num_blocks = ProfileBlocks(grid_, 16),
                                           .max_batch_tokens = 256,
                                           .max_logit_rows = 8})
                  .value();
  }

  std::unique_ptr<ModelWeights> weights_;
  ProfileGrid grid_;
  std::unique_ptr<Engine> engine_;
};

// Timing a SimulatedExecutor on its fake clock measures exactly its cost
// model, so the profile's fit must be that model, with no error.
TEST_F(MeasureProfileTest, ProfilingAKnownCostGivesItBack) {
  FakeClock clock;
  SimulatedExecutor executor(engine_->config(), engine_->step_limits(), &engine_->block_pool(),
                             &clock, kCost);
  ASSERT_OK_AND_ASSIGN(CostProfile profile, MeasureProfile(executor, *engine_, clock, grid_));
  ASSERT_EQ(profile.points.size(), 3u + 3u * 2u);
  EXPECT_EQ(profile.points[0].shape.tokens, 16);
  EXPECT_EQ(profile.points[2].shape.tokens, 200);
  EXPECT_EQ(profile.points.back().shape.items, 8);
  EXPECT_EQ(profile.points.back().shape.logit_rows, 8);
  ExpectCost(profile.fit, kCost);
  EXPECT_LT(profile.max_error, 1e-9);
  // Every block is back in the pool.
  EXPECT_EQ(engine_->block_pool().num_free(), engine_->block_pool().num_blocks());

  // The JSON form reads back the same.
  profile.backend = "cpu";
  profile.threads = 1;
  profile.weights_dtype = "f32";
  ASSERT_OK_AND_ASSIGN(CostProfile back, ParseProfile(ProfileJson(profile)));
  EXPECT_EQ(ProfileJson(back), ProfileJson(profile));
  EXPECT_OK(CheckProfileShape(back, ProfileShape()));
  ModelConfig other = ProfileShape();
  other.n_layers = 4;
  EXPECT_THAT(CheckProfileShape(back, other),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4 layers")));
}

TEST_F(MeasureProfileTest, AGridThatDoesNotFitIsRefused) {
  FakeClock clock;
  SimulatedExecutor executor(engine_->config(), engine_->step_limits(), &engine_->block_pool(),
                             &clock, kCost);
  ProfileGrid too_long = grid_;
  too_long.decode_contexts = {300};
  EXPECT_THAT(MeasureProfile(executor, *engine_, clock, too_long),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context")));
  ProfileGrid too_wide = grid_;
  too_wide.decode_batches = {64};
  EXPECT_THAT(MeasureProfile(executor, *engine_, clock, too_wide),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KV blocks")));
}

TEST(ParseProfile, AMalformedProfileIsRefused) {
  EXPECT_THAT(ParseProfile(nlohmann::json::object()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed")));
  CostProfile p;
  p.config = ProfileShape();
  p.points = PointsOf(kCost);
  p.fit = kCost;
  nlohmann::json json = ProfileJson(p);
  json["fit"]["per_token_s"] = -1.0;
  EXPECT_THAT(ParseProfile(json),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

}  // namespace
}  // namespace tandem::sim
