#include "common/base/status_macros.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd number " + std::to_string(x));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(half, Half(half));
  return half;
}

absl::Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPassesValuesAndErrors) {
  EXPECT_THAT(Quarter(12), ::tandem::testing::IsOkAndHolds(3));
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd number 3")));
}

TEST(StatusMacros, ReturnIfErrorStopsAtFirstError) {
  EXPECT_OK(CheckEven(4));
  EXPECT_THAT(CheckEven(5), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("5")));
}

}  // namespace
}  // namespace tandem
