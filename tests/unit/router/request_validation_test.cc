#include "router/request_validation.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/fake_workers.h"

namespace tandem::router {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::GenerateRequest Tokens(std::vector<int32_t> ids, int max_tokens) {
  v1::GenerateRequest r;
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  r.set_max_tokens(max_tokens);
  return r;
}

TEST(ValidateRequest, TokenIdsAreUsedAsGivenAndTextGetsBos) {
  testing::FakeTokenizer tokenizer;
  ASSERT_OK_AND_ASSIGN(ValidRequest a, ValidateRequest(Tokens({7, 8}, 3), &tokenizer));
  EXPECT_THAT(a.prompt, ElementsAre(7, 8));
  EXPECT_THAT(a.stop_token_ids, ElementsAre(testing::kFakeEos));
  v1::GenerateRequest text;
  text.set_text("w7 w8");
  text.set_max_tokens(1);
  ASSERT_OK_AND_ASSIGN(ValidRequest b, ValidateRequest(text, &tokenizer));
  EXPECT_THAT(b.prompt, ElementsAre(testing::kFakeBos, 7, 8));
}

TEST(ValidateRequest, SamplingLimits) {
  v1::GenerateRequest r = Tokens({1}, 1);
  r.mutable_sampling()->set_top_p(1.0f);
  r.mutable_sampling()->set_temperature(0.7f);
  EXPECT_OK(ValidateRequest(r, nullptr).status());
  r.mutable_sampling()->set_temperature(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("temperature")));
  r = Tokens({1}, 1);
  r.set_timeout_ms(-1);
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout_ms")));
}

TEST(CheckModelLimits, VocabularyAndContext) {
  EXPECT_OK(CheckModelLimits({0, 63}, 64, 3));
  EXPECT_THAT(CheckModelLimits({0, 64}, 64, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocabulary [0, 64)")));
  EXPECT_THAT(CheckModelLimits({0, 1, 2}, 64, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 2 tokens")));
  // Unknown limits are not checked.
  EXPECT_OK(CheckModelLimits({1000}, 0, 0));
}

}  // namespace
}  // namespace tandem::router
