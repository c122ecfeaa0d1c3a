#include "router/request_validation.h"

#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/model/chat_template.h"
#include "common/model/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
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

v1::GenerateRequest Chat(const std::vector<std::pair<std::string, std::string>>& messages) {
  v1::GenerateRequest r;
  r.mutable_messages();  // Set even when empty.
  for (const auto& [role, content] : messages) {
    v1::ChatMessage* m = r.mutable_messages()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  r.set_max_tokens(4);
  return r;
}

ChatTemplate FakeChatTemplate() {
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::FromString(testing::kFakeChatTemplate, "<s>", "</s>");
  CHECK_OK(t.status());
  return *std::move(t);
}

TEST(ValidateRequest, ChatIsRenderedAndEncodedWithSpecialTokens) {
  testing::FakeTokenizer tokenizer;
  const ChatTemplate chat_template = FakeChatTemplate();
  ASSERT_OK_AND_ASSIGN(
      ValidRequest r,
      ValidateRequest(
          Chat({{"system", "w5"}, {"user", "w7 w8"}, {"assistant", "w10"}, {"user", "w11"}}),
          &tokenizer, &chat_template));
  // "<s> w5 </s> w7 w8 </s> w10 </s> w11 </s> w9": the template's <s> and
  // </s> are BOS and EOS, and no second BOS is added.
  EXPECT_THAT(r.prompt,
              ElementsAre(testing::kFakeBos, 5, testing::kFakeEos, 7, 8, testing::kFakeEos, 10,
                          testing::kFakeEos, 11, testing::kFakeEos, 9));
  EXPECT_THAT(r.stop_token_ids, ElementsAre(testing::kFakeEos));
  EXPECT_EQ(r.max_tokens, 4);
  // Text prompts still do not parse special tokens.
  v1::GenerateRequest text;
  text.set_text("<s> w7");
  text.set_max_tokens(1);
  EXPECT_THAT(ValidateRequest(text, &tokenizer, &chat_template),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no token '<s>'")));
}

TEST(ValidateRequest, ChatTheTemplateRejectsIsInvalidWithItsMessage) {
  testing::FakeTokenizer tokenizer;
  const ChatTemplate chat_template = FakeChatTemplate();
  EXPECT_THAT(ValidateRequest(Chat({{"user", "w7"}, {"user", "w8"}}), &tokenizer, &chat_template),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("roles must alternate")));
}

TEST(ValidateRequest, ChatRolesAndBounds) {
  testing::FakeTokenizer tokenizer;
  const ChatTemplate chat_template = FakeChatTemplate();
  EXPECT_THAT(
      ValidateRequest(Chat({{"user", "w7"}, {"robot", "w8"}}), &tokenizer, &chat_template),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("message 1 has role 'robot'")));
  EXPECT_OK(
      ValidateRequest(Chat({{"user", "w7"}, {"tool", "w8"}}), &tokenizer, &chat_template).status());
  EXPECT_THAT(ValidateRequest(Chat({}), &tokenizer, &chat_template),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("messages is empty")));
  std::vector<std::pair<std::string, std::string>> many;
  for (int i = 0; i <= kMaxChatMessages; ++i) {
    many.push_back({i % 2 == 0 ? "user" : "assistant", "w7"});
  }
  EXPECT_THAT(ValidateRequest(Chat(many), &tokenizer, &chat_template),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 1024")));
  many.pop_back();
  EXPECT_OK(ValidateRequest(Chat(many), &tokenizer, &chat_template).status());
  std::string big;
  while (big.size() <= kMaxChatBytes) big += "w7 ";
  EXPECT_THAT(ValidateRequest(Chat({{"user", big}}), &tokenizer, &chat_template),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2097152 bytes")));
  // A router without a chat template (or tokenizer) serves no chat.
  EXPECT_THAT(ValidateRequest(Chat({{"user", "w7"}}), &tokenizer, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chat template")));
  EXPECT_THAT(ValidateRequest(Chat({{"user", "w7"}}), nullptr, &chat_template),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokenizer")));
  // A template that renders nothing.
  ASSERT_OK_AND_ASSIGN(ChatTemplate empty,
                       ChatTemplate::FromString("", std::nullopt, std::nullopt));
  EXPECT_THAT(ValidateRequest(Chat({{"user", "w7"}}), &tokenizer, &empty),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty prompt")));
}

// The default template of a router given a bare tokenizer file writes no
// BOS: the tokenizer adds its own, as for text prompts.
TEST(ValidateRequest, ChatWithTheDefaultTemplateGetsTheTokenizersBos) {
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(tokenizer_path));
  ASSERT_OK_AND_ASSIGN(ChatTemplate chat_template,
                       ChatTemplate::FromString(kDefaultChatTemplate, std::nullopt, std::nullopt));
  ASSERT_OK_AND_ASSIGN(ValidRequest r, ValidateRequest(Chat({{"user", "Hello there"}}),
                                                       tokenizer.get(), &chat_template));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> want,
                       tokenizer->Encode("user: Hello there\nassistant:", /*add_bos=*/true));
  EXPECT_EQ(r.prompt, want);
  EXPECT_EQ(r.prompt.front(), tokenizer->bos_id());
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
