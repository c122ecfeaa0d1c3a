// What the OpenAI API says about a bad body: each message names the field,
// the value and what to send instead.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/openai_api.h"
#include "tests/testing/status_matchers.h"

namespace tandem::router::openai_api {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(OpenAiMessagesTest, NumbersSayTheRangeTheyMustBeIn) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"prompt": "x", "seed": 18446744073709551616})",
       {"`seed` is 1.8446744073709552e+19",
        "an integer in [-9223372036854775808, 18446744073709551615]"}},
      {R"({"prompt": "x", "seed": 1.5})", {"`seed` is 1.5", "an integer in"}},
      {R"({"prompt": "x", "max_tokens": 1000000000000000000})",
       {"`max_tokens` is 1000000000000000000", "[1, 2147483647]"}},
      {R"({"prompt": "x", "max_tokens": 0})", {"`max_tokens` is 0", "[1, 2147483647]"}},
      {R"({"prompt": "x", "max_tokens": 1e300})", {"`max_tokens` is 1e+300", "an integer in [1,"}},
      {R"({"prompt": "x", "repetition_penalty": 1e308})",
       {"`repetition_penalty` is 1e+308", "beyond a 32-bit float", "-3.4e38 to 3.4e38"}},
      {R"({"prompt": "x", "user": 5})", {"`user` must be a string, not number"}},
      {absl::StrCat(R"({"prompt": "x", "user": ")", std::string(257, 'u'), R"("})"),
       {"`user` is 257 bytes; at most 256"}},
  };
  for (const auto& [body, parts] : cases) {
    std::vector<::testing::Matcher<const std::string&>> has;
    for (const std::string& part : parts) has.push_back(HasSubstr(part));
    EXPECT_THAT(ParseCompletionRequest(body),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::AllOfArray(has)))
        << body;
  }
  // The whole range is taken: a negative seed wraps modulo 2^64.
  absl::StatusOr<ApiRequest> top = ParseCompletionRequest(
      R"({"prompt": "x", "seed": 18446744073709551615, "max_tokens": 1, "user": "u-1"})");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->params.seed, 18446744073709551615u);
  EXPECT_EQ(top->params.max_tokens, 1);
  EXPECT_EQ(top->params.user, "u-1");
  absl::StatusOr<ApiRequest> negative = ParseCompletionRequest(R"({"prompt": "x", "seed": -1})");
  ASSERT_TRUE(negative.ok()) << negative.status();
  EXPECT_EQ(negative->params.seed, 18446744073709551615u);
}

TEST(OpenAiMessagesTest, InvalidJsonSaysWhereAndWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "x", "temperature": NaN})", "column 32"},
      {R"({"prompt": "x", "temperature": Infinity})", "column 32"},
      {R"({"prompt": "x", "temperature": 1e400})", "1e400"},
      {R"({"prompt": "\ud800"})", "surrogate"},
      {"{\"prompt\": \"\xff\"}", "UTF-8"},
      {R"({"prompt": "x",})", "column 16"},
  };
  for (const auto& [body, why] : cases) {
    EXPECT_THAT(ParseCompletionRequest(body),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("not valid JSON: "), HasSubstr(why),
                               HasSubstr("no NaN or Infinity"),
                               ::testing::Not(HasSubstr("json.exception")))))
        << body;
  }
}

TEST(OpenAiMessagesTest, RolesSayWhichAreTaken) {
  EXPECT_THAT(ParseChatRequest(R"({"messages": [{"role": 5, "content": "x"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("`messages[0].role` must be a string, not number")));
  EXPECT_THAT(
      ParseChatRequest(R"({"messages": [{"content": "x"}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(R"(`messages[0].role` is required: "system", "developer", "user", )")));
}

}  // namespace
}  // namespace tandem::router::openai_api
