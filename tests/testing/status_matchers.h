// GoogleTest matchers and macros for absl::Status / absl::StatusOr, named as
// in newer Abseil releases (Debian's 20220623 has none).
#ifndef TANDEM_TESTS_TESTING_STATUS_MATCHERS_H_
#define TANDEM_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = ::tandem::testing::GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s;
  return s.ok();
}

// StatusIs(code) / StatusIs(code, message_matcher).
MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a matching message") {
  const absl::Status& s = ::tandem::testing::GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

// StatusIs(code): any message.
MATCHER_P(StatusIs, code, "has code " + absl::StatusCodeToString(code)) {
  const absl::Status& s = ::tandem::testing::GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace tandem::testing

#define TANDEM_TESTING_CONCAT_INNER_(a, b) a##b
#define TANDEM_TESTING_CONCAT_(a, b) TANDEM_TESTING_CONCAT_INNER_(a, b)

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::tandem::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::tandem::testing::IsOk())

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  TANDEM_ASSERT_OK_AND_ASSIGN_IMPL_(TANDEM_TESTING_CONCAT_(tandem_sor_, __LINE__), lhs, expr)
#define TANDEM_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                      \
  ASSERT_TRUE(statusor.ok()) << statusor.status();             \
  lhs = std::move(statusor).value()

#endif  // TANDEM_TESTS_TESTING_STATUS_MATCHERS_H_
