#include "router/request_validation.h"

#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer.h"
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
using ::testing::Not;

GenerateParams Tokens(std::vector<int32_t> ids, int max_tokens) {
  GenerateParams r;
  r.token_ids = std::move(ids);
  r.max_tokens = max_tokens;
  return r;
}

GenerateParams Text(std::string text, int max_tokens) {
  GenerateParams r;
  r.text = std::move(text);
  r.max_tokens = max_tokens;
  return r;
}

absl::StatusOr<ValidRequest> ValidateRequest(const GenerateParams& params,
                                             const Tokenizer* tokenizer,
                                             const ChatTemplate* chat_template = nullptr) {
  return router::ValidateRequest(params, {.tokenizer = tokenizer,
                                          .chat_template = chat_template,
                                          .served_model_name = "m",
                                          .fresh_seed = 1234});
}

TEST(ValidateRequest, TokenIdsAreUsedAsGivenAndTextGetsBos) {
  testing::FakeTokenizer tokenizer;
  ASSERT_OK_AND_ASSIGN(ValidRequest a, ValidateRequest(Tokens({7, 8}, 3), &tokenizer));
  EXPECT_THAT(a.prompt, ElementsAre(7, 8));
  EXPECT_THAT(a.stop_token_ids, ElementsAre(testing::kFakeEos));
  ASSERT_OK_AND_ASSIGN(ValidRequest b, ValidateRequest(Text("w7 w8", 1), &tokenizer));
  EXPECT_THAT(b.prompt, ElementsAre(testing::kFakeBos, 7, 8));
  EXPECT_EQ(b.prompt_text, "w7 w8");
  // An unset seed is the fresh one; a set seed is kept.
  EXPECT_EQ(b.sampling.seed(), 1234u);
  GenerateParams seeded = Text("w7", 1);
  seeded.seed = 0;
  EXPECT_EQ(ValidateRequest(seeded, &tokenizer)->sampling.seed(), 0u);
  EXPECT_TRUE(ValidateRequest(seeded, &tokenizer)->sampling.has_seed());
}

TEST(ValidateRequest, ResponseFormatsReachTheWorkersOrAreRefusedNamingWhatToChange) {
  testing::FakeTokenizer tokenizer;
  GenerateParams p = Tokens({7}, 3);
  p.constraint = {grammar::ConstraintSpec::Kind::kJsonSchema, R"({"type": "boolean"})"};
  ASSERT_OK_AND_ASSIGN(ValidRequest a, ValidateRequest(p, &tokenizer));
  EXPECT_EQ(a.sampling.constraint().json_schema(), R"({"type": "boolean"})");
  p.constraint = {grammar::ConstraintSpec::Kind::kJsonObject, ""};
  ASSERT_OK_AND_ASSIGN(ValidRequest b, ValidateRequest(p, &tokenizer));
  EXPECT_TRUE(b.sampling.constraint().json_object());
  EXPECT_FALSE(ValidateRequest(Tokens({7}, 3), &tokenizer)->sampling.has_constraint());
  p.constraint = {grammar::ConstraintSpec::Kind::kJsonSchema,
                  R"({"properties": {"when": {"type": "string", "format": "hostname"}}})"};
  EXPECT_THAT(
      ValidateRequest(p, &tokenizer),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("response_format: `#/properties/when/format` \"hostname\" is not supported")));
  p.constraint = {grammar::ConstraintSpec::Kind::kJsonObject, ""};
  p.ignore_eos = true;
  EXPECT_THAT(ValidateRequest(p, &tokenizer),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ignore_eos")));
}

TEST(ValidateRequest, EmptyPromptsStartFromBos) {
  testing::FakeTokenizer tokenizer;
  EXPECT_THAT(ValidateRequest(Text("", 1), &tokenizer)->prompt, ElementsAre(testing::kFakeBos));
  EXPECT_THAT(ValidateRequest(Tokens({}, 1), &tokenizer)->prompt, ElementsAre(testing::kFakeBos));
  EXPECT_THAT(ValidateRequest(Tokens({}, 1), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tokenizer")));
}

TEST(ValidateRequest, OneServedModelName) {
  GenerateParams p = Tokens({1}, 1);
  p.model = "m";
  EXPECT_OK(ValidateRequest(p, nullptr).status());
  p.model = "gpt-4";
  EXPECT_THAT(ValidateRequest(p, nullptr),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("this router serves 'm'")));
}

TEST(ValidateRequest, IgnoreEosDropsTheStopIds) {
  testing::FakeTokenizer tokenizer;
  GenerateParams p = Tokens({1}, 1);
  p.ignore_eos = true;
  EXPECT_TRUE(ValidateRequest(p, &tokenizer)->stop_token_ids.empty());
}

TEST(ValidateRequest, SamplingLimits) {
  GenerateParams r = Tokens({1}, 1);
  r.top_p = 1.0f;
  r.temperature = 0.7f;
  EXPECT_OK(ValidateRequest(r, nullptr).status());
  r.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("temperature")));
  r = Tokens({1}, 1);
  r.min_p = 0.1f;
  absl::StatusOr<ValidRequest> with_min_p = ValidateRequest(r, nullptr);
  ASSERT_OK(with_min_p.status());
  EXPECT_FLOAT_EQ(with_min_p->sampling.min_p(), 0.1f);
  for (float bad : {-0.01f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    r.min_p = bad;
    EXPECT_THAT(ValidateRequest(r, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_p")))
        << bad;
  }
  r = Tokens({1}, 1);
  r.frequency_penalty = std::numeric_limits<float>::infinity();
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frequency_penalty")));
  r = Tokens({1}, 1);
  for (int i = 0; i <= kMaxLogitBias; ++i) r.logit_bias.push_back({i, 1.0f});
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 1024")));
  r = Tokens({1}, 1);
  r.logit_bias = {{-1, 1.0f}};
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token -1")));
  r = Tokens({1}, 1);
  r.n = 0;
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n is 0")));
  r = Tokens({1}, 1);
  r.echo = true;
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("echo")));
  r = Tokens({1}, 1);
  r.timeout = absl::Milliseconds(-1);
  EXPECT_THAT(ValidateRequest(r, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout_ms")));
}

GenerateParams Chat(const std::vector<std::pair<std::string, std::string>>& messages) {
  GenerateParams r;
  r.messages.emplace();  // Set even when empty.
  for (const auto& [role, content] : messages) r.messages->push_back({role, content});
  r.max_tokens = 4;
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
  EXPECT_THAT(ValidateRequest(Text("<s> w7", 1), &tokenizer, &chat_template),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no token '<s>'")));
}

// Tools reach the template, as do an assistant's calls and a tool's answer;
// "required" and a named function constrain the output to a call.
TEST(ValidateRequest, ToolsAreRenderedAndRequiredOnesConstrainTheCall) {
  testing::FakeTokenizer tokenizer;
  absl::StatusOr<ChatTemplate> with_tools = ChatTemplate::FromString(
      R"({# calls are {"name", "parameters"} #}{% if tools %}{% for t in tools %})"
      R"({{ t.function.name }} {% endfor %}{% endif %}{% for m in messages %}{{ m.content }} {% if m.tool_calls is defined %})"
      R"({{ m.tool_calls[0].function.arguments.k }} {% endif %}{% endfor %})",
      "<s>", "</s>");
  ASSERT_TRUE(with_tools.ok()) << with_tools.status();
  GenerateParams p = Chat({{"user", "w7"}});
  p.messages->push_back(
      {.role = "assistant",
       .content = "",
       .tool_calls =
           R"([{"type": "function", "function": {"name": "w5", "arguments": {"k": "w8"}}}])"});
  p.messages->push_back({.role = "tool", .content = "w9", .tool_call_id = "c1"});
  p.tools = {{.name = "w5", .parameters = R"({"type": "object", "properties": {}})"},
             {.name = "w6"}};
  p.tool_choice = ToolChoiceKind::kAuto;
  ASSERT_OK_AND_ASSIGN(ValidRequest a, ValidateRequest(p, &tokenizer, &*with_tools));
  EXPECT_THAT(a.prompt, ElementsAre(5, 6, 7, 8, 9));
  EXPECT_FALSE(a.sampling.has_constraint());
  p.tool_choice = ToolChoiceKind::kNone;  // the tools are not rendered
  ASSERT_OK_AND_ASSIGN(ValidRequest none, ValidateRequest(p, &tokenizer, &*with_tools));
  EXPECT_THAT(none.prompt, ElementsAre(7, 8, 9));
  p.tool_choice = ToolChoiceKind::kNamed;
  p.tool_choice_name = "w6";
  ASSERT_OK_AND_ASSIGN(ValidRequest named, ValidateRequest(p, &tokenizer, &*with_tools));
  EXPECT_THAT(named.sampling.constraint().json_schema(), HasSubstr(R"({"const":"w6"})"));
  EXPECT_THAT(named.sampling.constraint().json_schema(), Not(HasSubstr("w5")));
  p.tool_choice = ToolChoiceKind::kRequired;
  p.tools[0].parameters = R"({"type": "object", "properties": {"a": {"format": "hostname"}}})";
  EXPECT_THAT(ValidateRequest(p, &tokenizer, &*with_tools),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the tool's parameters: `#/anyOf/0/properties/parameters")));
  const ChatTemplate plain = FakeChatTemplate();
  p.tool_choice = ToolChoiceKind::kAuto;
  EXPECT_THAT(ValidateRequest(p, &tokenizer, &plain),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("takes no tools")));
}

// chat_template_kwargs reach the template as variables (Qwen3's
// enable_thinking), as does an assistant's reasoning_content; a key the
// template never reads, or one the request sets itself, is refused.
TEST(ValidateRequest, ChatTemplateKwargsActOrAreRefused) {
  testing::FakeTokenizer tokenizer;
  absl::StatusOr<ChatTemplate> thinking = ChatTemplate::FromString(
      "{% for m in messages %}{% if m.reasoning_content is defined %}{{ m.reasoning_content }} "
      "{% endif %}{{ m.content }} {% endfor %}{% if add_generation_prompt %}w12 {% if "
      "enable_thinking is defined and enable_thinking is false %}w13 {% endif %}{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(thinking.ok()) << thinking.status();
  GenerateParams p = Chat({{"user", "w7"}});
  ASSERT_OK_AND_ASSIGN(ValidRequest on, ValidateRequest(p, &tokenizer, &*thinking));
  EXPECT_THAT(on.prompt, ElementsAre(7, 12));
  p.chat_template_kwargs = R"({"enable_thinking": false})";
  ASSERT_OK_AND_ASSIGN(ValidRequest off, ValidateRequest(p, &tokenizer, &*thinking));
  EXPECT_THAT(off.prompt, ElementsAre(7, 12, 13));
  p.messages->push_back({.role = "assistant", .content = "w8", .reasoning_content = "w6"});
  p.messages->push_back({.role = "user", .content = "w9"});
  ASSERT_OK_AND_ASSIGN(ValidRequest history, ValidateRequest(p, &tokenizer, &*thinking));
  EXPECT_THAT(history.prompt, ElementsAre(7, 6, 8, 9, 12, 13));
  p.chat_template_kwargs = R"({"enable_thinkin": true})";
  EXPECT_THAT(ValidateRequest(p, &tokenizer, &*thinking),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("`chat_template_kwargs.enable_thinkin`: the served model's chat "
                                 "template does not read it")));
  p.chat_template_kwargs = R"({"add_generation_prompt": false})";
  EXPECT_THAT(ValidateRequest(p, &tokenizer, &*thinking),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("set by the request")));
  p.chat_template_kwargs = R"({"a-b": 1})";
  EXPECT_THAT(ValidateRequest(p, &tokenizer, &*thinking),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a template variable")));
}

TEST(ValidateRequest, GenerationPromptsThatOpenAThinkingBlock) {
  absl::StatusOr<ChatTemplate> r1 = ChatTemplate::FromString(
      "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}A:<think>\n"
      "{% if enable_thinking is defined and not enable_thinking %}</think>{% endif %}{% endif %}",
      std::nullopt, std::nullopt);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_TRUE(GenerationPromptOpensThinking(*r1, ""));
  EXPECT_FALSE(GenerationPromptOpensThinking(*r1, R"({"enable_thinking": false})"));
  EXPECT_FALSE(GenerationPromptOpensThinking(FakeChatTemplate(), ""));
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
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("message 1 has role 'robot'; the role must be system, developer, user, "
                         "assistant or tool")));
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

ValidRequest Resolvable(std::vector<int32_t> prompt, std::optional<int> max_tokens) {
  ValidRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

TEST(ResolveMaxTokens, VocabularyAndContext) {
  ValidRequest r = Resolvable({0, 63}, 1);
  EXPECT_OK(ResolveMaxTokens(r, 64, 3, 16));
  r = Resolvable({0, 64}, 1);
  EXPECT_THAT(ResolveMaxTokens(r, 64, 0, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocabulary [0, 64)")));
  r = Resolvable({0, 1, 2}, 1);
  EXPECT_THAT(ResolveMaxTokens(r, 64, 3, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 2 tokens")));
  // Unknown limits are not checked.
  r = Resolvable({1000}, 1);
  EXPECT_OK(ResolveMaxTokens(r, 0, 0, 16));
  r = Resolvable({1}, 1);
  (*r.sampling.mutable_logit_bias())[64] = 1.0f;
  EXPECT_THAT(ResolveMaxTokens(r, 64, 0, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logit_bias names token 64")));
}

TEST(CheckFitsKvPool, ARequestNoPoolCanHoldIsInvalidSayingWhatToLower) {
  // 4 choices of 3 + 61 tokens: 4 blocks of 16 each, 16 blocks in all.
  ValidRequest r = Resolvable({1, 2, 3}, 61);
  r.n = 4;
  EXPECT_OK(CheckFitsKvPool(r, 16, 16, 0));
  EXPECT_THAT(CheckFitsKvPool(r, 16, 15, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs 16 KV blocks at once (4 choices of 64 tokens: 3 in the "
                                 "prompt and 61 to generate) but the largest decode worker's KV "
                                 "pool holds 15 blocks of 16 tokens; lower max_tokens to at most "
                                 "45 for n=4, or lower n to at most 3 for max_tokens=61")));
  // The context caps what a choice holds.
  EXPECT_OK(CheckFitsKvPool(r, 16, 12, 48));
  // A prompt no pool holds even once.
  r = Resolvable(std::vector<int32_t>(40, 1), 1);
  EXPECT_THAT(CheckFitsKvPool(r, 16, 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("; shorten the prompt")));
  // Unknown sizes are not checked.
  EXPECT_OK(CheckFitsKvPool(r, 0, 2, 0));
  EXPECT_OK(CheckFitsKvPool(r, 16, 0, 0));
}

TEST(ResolveMaxTokens, PromptPlusMaxTokensMustFitTheContext) {
  ValidRequest r = Resolvable({1, 2, 3}, 8);
  EXPECT_THAT(ResolveMaxTokens(r, 0, 10, 16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("maximum context length is 10 tokens, but 11 were requested (3 "
                                 "in the prompt, 8 to generate); lower max_tokens to at most 7")));
  r = Resolvable({1, 2, 3}, INT32_MAX);
  EXPECT_THAT(ResolveMaxTokens(r, 0, 10, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2147483650 were requested")));
  r = Resolvable({1, 2, 3}, 7);
  EXPECT_OK(ResolveMaxTokens(r, 0, 10, 16));
  // Unset: what the context leaves, or the fallback when it is unknown.
  r = Resolvable({1, 2, 3}, std::nullopt);
  EXPECT_OK(ResolveMaxTokens(r, 0, 10, 16));
  EXPECT_EQ(r.max_tokens, 7);
  r = Resolvable({1, 2, 3}, std::nullopt);
  EXPECT_OK(ResolveMaxTokens(r, 0, 0, 16));
  EXPECT_EQ(r.max_tokens, 16);
  r = Resolvable({1, 2, 3}, 2);
  r.sampling.set_min_tokens(3);
  EXPECT_THAT(ResolveMaxTokens(r, 0, 10, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_tokens is 3")));
}

}  // namespace
}  // namespace tandem::router
