// The planner's load forecasts (planner/forecast.h) on hand-made series.
#include "planner/forecast.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem::planner {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(10);

absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }

TEST(ConstantForecaster, HoldsTheLastRate) {
  ConstantForecaster f;
  EXPECT_EQ(f.Predict(At(0)), 0);
  f.Observe(At(0), 4);
  f.Observe(At(10), 6);
  EXPECT_EQ(f.Predict(At(100)), 6);
}

// A ramp of 1 req/s every 10 s is extended to where it will be.
TEST(TrendForecaster, ExtendsALinearRamp) {
  TrendForecaster f(absl::Minutes(5));
  for (int i = 0; i <= 6; ++i) f.Observe(At(10 * i), 2 + i);
  EXPECT_THAT(f.Predict(At(60)), DoubleNear(8, 1e-9));
  EXPECT_THAT(f.Predict(At(120)), DoubleNear(14, 1e-9));
}

// Samples older than the window leave it: a ramp down after a plateau
// predicts from the ramp alone; a falling trend stops at zero.
TEST(TrendForecaster, ForgetsWhatLeftItsWindowAndNeverGoesBelowZero) {
  TrendForecaster f(absl::Seconds(30));
  for (int i = 0; i < 10; ++i) f.Observe(At(10 * i), 20);
  for (int i = 0; i <= 3; ++i) f.Observe(At(100 + 10 * i), 20 - 5 * i);
  EXPECT_THAT(f.Predict(At(140)), DoubleNear(0, 1e-9));
  EXPECT_THAT(f.Predict(At(135)), DoubleNear(2.5, 1e-9));
  EXPECT_EQ(f.Predict(At(1000)), 0);
}

TEST(TrendForecaster, OneSampleIsTheMean) {
  TrendForecaster f(absl::Minutes(1));
  f.Observe(At(0), 7);
  EXPECT_EQ(f.Predict(At(30)), 7);
}

TEST(MakeForecaster, NamesWhatItKnows) {
  EXPECT_OK(MakeForecaster("constant", absl::Minutes(1)).status());
  EXPECT_OK(MakeForecaster("trend", absl::Minutes(1)).status());
  EXPECT_THAT(MakeForecaster("arima", absl::Minutes(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("constant or trend")));
  EXPECT_THAT(MakeForecaster("trend", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive")));
}

}  // namespace
}  // namespace tandem::planner
