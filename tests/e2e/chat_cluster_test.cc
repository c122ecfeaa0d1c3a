// Chat through a cluster: a stories260K hub folder with a chat_template.jinja
// that writes BOS, EOS and refuses roles out of turn, and one that renders
// tools, whose calls come back parsed over gRPC. The router renders a
// GenerateRequest's messages with that template and encodes the special
// tokens; the tokens through the cluster equal the single-process engine's
// on the same rendered prompt, and the template's refusal reaches the client
// as INVALID_ARGUMENT with its message.
#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_harness.h"
#include "tests/e2e/hub_folder.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

// BOS, "<role>: <content>" lines, EOS after each assistant turn, and
// "assistant:" to generate; user and assistant must alternate after an
// optional system message.
constexpr char kTemplate[] =
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if not loop.first and m['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{{ m['role'] ~ ': ' ~ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

v1::GenerateRequest ChatRequest(const std::vector<ChatMessage>& messages, int max_tokens) {
  v1::GenerateRequest r;
  for (const ChatMessage& m : messages) {
    v1::ChatMessage* out = r.mutable_messages()->add_messages();
    out->set_role(m.role);
    out->set_content(m.content);
  }
  r.set_max_tokens(max_tokens);
  return r;
}

TEST(ChatClusterTest, ChatGivesTheEnginesTokensOnTheRenderedPrompt) {
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  const std::string dir = WriteStoriesHubFolder("stories260K-chat", DType::kF32);
  {
    std::ofstream out(dir + "/chat_template.jinja");
    out << kTemplate;
    ASSERT_TRUE(out.good());
  }
  // The router gets only --model: its tokenizer and template come from there.
  auto cluster =
      Cluster::Start({.prefill = 1, .decode = 1, .model = dir, .router_flags = {"--model=" + dir}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // What the router must do, in process.
  ASSERT_OK_AND_ASSIGN(ChatTemplate chat_template, ChatTemplate::FromModelDir(dir));
  ASSERT_FALSE(chat_template.is_default());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(dir));
  const std::vector<ChatMessage> chat = {{"system", "You tell short stories."},
                                         {"user", "Tell me about a cat."},
                                         {"assistant", "Once upon a time there was a cat."},
                                         {"user", "What did the cat do next?"}};
  ASSERT_OK_AND_ASSIGN(const std::string text,
                       chat_template.Render(chat, /*add_generation_prompt=*/true));
  ASSERT_OK_AND_ASSIGN(
      const std::vector<int32_t> prompt,
      tokenizer->Encode(text, EncodeOptions{.add_bos = false, .parse_special = true}));
  // The template's <s> and </s> became BOS and EOS ids, not text.
  ASSERT_EQ(prompt.front(), tokenizer->bos_id());
  ASSERT_EQ(std::count(prompt.begin(), prompt.end(), tokenizer->bos_id()), 1);
  ASSERT_EQ(std::count(prompt.begin(), prompt.end(), tokenizer->eos_id()), 1);
  const std::vector<int32_t> want = LocalGreedyTokens(dir, prompt, 40);
  ASSERT_FALSE(want.empty());

  const Completion got = RunGenerate((*cluster)->router(), ChatRequest(chat, 40));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*cluster)->Logs();
  EXPECT_EQ(got.tokens, want);
  EXPECT_EQ(got.finished.usage().prompt_tokens(), static_cast<int>(prompt.size()));

  // The template refuses two user turns in a row: INVALID_ARGUMENT with its
  // message, before any worker is involved.
  const Completion refused = RunGenerate(
      (*cluster)->router(), ChatRequest({{"user", "Hello"}, {"user", "Hello again"}}, 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("roles must alternate"));
  EXPECT_OK((*cluster)->WaitUntilIdle(absl::Seconds(30)));
}

// A template of the Hermes family (its calls are <tool_call> blocks) that
// renders tools, calls and tool results compactly.
constexpr char kToolTemplate[] =
    "{{ bos_token }}{% if tools %}tools:{% for t in tools %} {{ t['function']['name'] }}"
    "{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}<tool_call>"
    "{{ c['function'] | tojson }}</tool_call>{% endfor %}{% else %}{{ m['content'] }}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

v1::GenerateRequest ToolRequest(v1::ToolChoice choice, const std::string& named = "") {
  v1::GenerateRequest r = ChatRequest({{"user", "What is the weather in Oslo?"}}, 120);
  v1::Tool* weather = r.mutable_messages()->add_tools();
  weather->set_name("get_weather");
  weather->set_parameters(R"({"type": "object", "properties": {"city": {"type": "string",
      "maxLength": 12}}, "required": ["city"], "additionalProperties": false})");
  r.mutable_messages()->add_tools()->set_name("get_time");
  r.mutable_messages()->set_tool_choice(choice);
  r.mutable_messages()->set_tool_choice_name(named);
  return r;
}

// Tools over gRPC: a required call comes back parsed on the last message
// with its arguments following the function's schema, a named function is
// the one called, and a call with its result goes back through the template.
TEST(ChatClusterTest, ToolCallsOverGrpc) {
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  const std::string dir = WriteStoriesHubFolder("stories260K-tools", DType::kF32);
  {
    std::ofstream out(dir + "/chat_template.jinja");
    out << kToolTemplate;
    ASSERT_TRUE(out.good());
  }
  auto cluster =
      Cluster::Start({.prefill = 1, .decode = 1, .model = dir, .router_flags = {"--model=" + dir}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  v1::Router::Stub& router = (*cluster)->router();

  const Completion required = RunGenerate(router, ToolRequest(v1::TOOL_CHOICE_REQUIRED));
  ASSERT_TRUE(required.status.ok()) << required.status.error_message();
  EXPECT_EQ(required.finished.reason(), v1::FINISH_REASON_TOOL_CALLS) << required.text;
  ASSERT_EQ(required.finished.tool_calls_size(), 1) << required.text;
  const v1::ToolCall& call = required.finished.tool_calls(0);
  EXPECT_THAT(required.text, ::testing::StartsWith("<tool_call>\n"));
  EXPECT_THAT(call.id(), ::testing::StartsWith("call_"));
  const nlohmann::json args = nlohmann::json::parse(call.arguments(), nullptr, false);
  ASSERT_TRUE(args.is_object()) << call.arguments();
  if (call.name() == "get_weather") {
    ASSERT_EQ(args.size(), 1u) << call.arguments();
    ASSERT_TRUE(args["city"].is_string()) << call.arguments();
  } else {
    EXPECT_EQ(call.name(), "get_time");
  }

  const Completion named = RunGenerate(router, ToolRequest(v1::TOOL_CHOICE_NAMED, "get_time"));
  ASSERT_TRUE(named.status.ok()) << named.status.error_message();
  ASSERT_EQ(named.finished.tool_calls_size(), 1) << named.text;
  EXPECT_EQ(named.finished.tool_calls(0).name(), "get_time");

  // Without tools the same chat is text.
  const Completion plain = RunGenerate(router, ChatRequest({{"user", "Hi"}}, 8));
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  EXPECT_EQ(plain.finished.tool_calls_size(), 0);

  // The call and its result, back through the template.
  v1::GenerateRequest round = ToolRequest(v1::TOOL_CHOICE_AUTO);
  v1::ChatMessage* assistant = round.mutable_messages()->add_messages();
  assistant->set_role("assistant");
  *assistant->add_tool_calls() = call;
  v1::ChatMessage* result = round.mutable_messages()->add_messages();
  result->set_role("tool");
  result->set_tool_call_id(call.id());
  result->set_content("Sunny, 21 C");
  round.set_max_tokens(8);
  const Completion back = RunGenerate(router, round);
  ASSERT_TRUE(back.status.ok()) << back.status.error_message();
  // The call was rendered: the prompt holds its JSON.
  EXPECT_GT(back.finished.usage().prompt_tokens(),
            required.finished.usage().prompt_tokens() + static_cast<int>(call.arguments().size()));

  // What cannot be served says what to change, before any worker.
  v1::GenerateRequest unknown = ToolRequest(v1::TOOL_CHOICE_NAMED, "get_mood");
  v1::GenerateRequest misplaced = ToolRequest(v1::TOOL_CHOICE_AUTO);
  *misplaced.mutable_messages()->mutable_messages(0)->add_tool_calls() = call;
  v1::GenerateRequest bad_args = round;
  bad_args.mutable_messages()->mutable_messages(1)->mutable_tool_calls(0)->set_arguments("[1]");
  for (const auto& [request, message] : std::vector<std::pair<v1::GenerateRequest, std::string>>{
           {unknown, "does not offer"},
           {misplaced, "belong to assistant messages"},
           {bad_args, "JSON object"}}) {
    const Completion refused = RunGenerate(router, request);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(refused.status.error_message(), HasSubstr(message));
  }
  EXPECT_OK((*cluster)->WaitUntilIdle(absl::Seconds(30)));
}

}  // namespace
}  // namespace tandem::testing
