// A thinking model's output answered as reasoning_content and content
// (router/reasoning.h): the splitter alone, fed whole and in pieces, and
// through the OpenAI response and stream builders, with tool calls after
// the reasoning; and the request fields that go with it.
#include "router/reasoning.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/openai_api.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/fake_core.h"

namespace tandem::router {
namespace {

using ::nlohmann::json;
using ::tandem::router::testing::FinishedEvent;
using ::tandem::router::testing::TokensEvent;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

ReasoningParts Pieces(const std::string& text, bool inside, size_t step) {
  ReasoningSplitter s(inside);
  ReasoningParts out;
  for (size_t k = 0; k < text.size(); k += step) {
    ReasoningParts p = s.Feed(text.substr(k, step));
    out.reasoning += p.reasoning;
    out.content += p.content;
  }
  ReasoningParts p = s.Finish();
  out.reasoning += p.reasoning;
  out.content += p.content;
  return out;
}

TEST(ReasoningSplitterTest, TheBlockIsReasoningAndTheRestIsContent) {
  // Qwen3 writes the block itself, with new lines around both parts.
  ReasoningParts p = ReasoningSplitter::Split("<think>\nFirst, 2+2.\n</think>\n\n4.", false);
  EXPECT_EQ(p.reasoning, "First, 2+2.");
  EXPECT_EQ(p.content, "4.");
  // DeepSeek-R1's prompt opened it: the output starts inside.
  p = ReasoningSplitter::Split("Hmm.\n\nYes.\n</think>\n\nYes", true);
  EXPECT_EQ(p.reasoning, "Hmm.\n\nYes.");
  EXPECT_EQ(p.content, "Yes");
  // No block: all content, untouched.
  p = ReasoningSplitter::Split("  plain <b>text</b>\n", false);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "  plain <b>text</b>\n");
  // A block later in the text is content (only an opening block is reasoning).
  p = ReasoningSplitter::Split("a <think>b</think> c", false);
  EXPECT_EQ(p.content, "a <think>b</think> c");
  // An empty block (thinking switched off) and a cut one.
  p = ReasoningSplitter::Split("<think>\n\n</think>\n\nHi", false);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "Hi");
  p = ReasoningSplitter::Split("<think>\nstill going </thi", false);
  EXPECT_EQ(p.reasoning, "still going </thi");
  EXPECT_EQ(p.content, "");
  // A text that only looks like the start of a tag is content.
  p = ReasoningSplitter::Split("<thin", false);
  EXPECT_EQ(p.content, "<thin");
}

TEST(ReasoningSplitterTest, PiecesGiveWhatTheWholeGives) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"<think>", "</think>", "<", "</", "think", ">",
                                          "\n",      " ",        "a", "b.", "<th",   "</thi"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) text += atoms[rng() % atoms.size()];
    for (const bool inside : {false, true}) {
      const ReasoningParts whole = ReasoningSplitter::Split(text, inside);
      for (size_t step : {size_t{1}, size_t{2}, size_t{5}}) {
        const ReasoningParts parts = Pieces(text, inside, step);
        ASSERT_EQ(parts.reasoning, whole.reasoning) << "'" << text << "' step " << step;
        ASSERT_EQ(parts.content, whole.content) << "'" << text << "' step " << step;
      }
    }
  }
}

TEST(ReasoningSplitterTest, TextGoesOutAsSoonAsItIsSettled) {
  ReasoningSplitter s(false);
  EXPECT_EQ(s.Feed("<thi").reasoning, "");
  EXPECT_EQ(s.Feed("nk>\nStep one").reasoning, "Step one");
  // Trailing white space and a tail that may begin </think> wait.
  EXPECT_EQ(s.Feed(", two \n</th").reasoning, ", two");
  ReasoningParts p = s.Feed("ink>\n\nAnswer");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "Answer");
  EXPECT_EQ(s.Feed(" more").content, " more");
}

TEST(ReasoningTest, TemplatesAndPromptsThatThink) {
  EXPECT_TRUE(WritesThinking("{{ '<think>\\n' }}...{{ c.split('</think>')[-1] }}"));
  EXPECT_FALSE(WritesThinking("{{ messages }}"));
  EXPECT_TRUE(OpensThinking("<|User|>hi<|Assistant|><think>\n"));
  EXPECT_FALSE(OpensThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(OpensThinking("<|im_start|>assistant\n"));
}

std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  for (absl::string_view e : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(e, "data: ")) << e;
    e.remove_prefix(6);
    if (e != "[DONE]") out.push_back(json::parse(e));
  }
  return out;
}

openai_api::ResponseMeta ThinkingMeta(bool logprobs) {
  openai_api::ResponseMeta meta{.endpoint = openai_api::Endpoint::kChat,
                                .id = "id",
                                .created = 1,
                                .model = "m",
                                .n = 1,
                                .logprobs = logprobs};
  meta.reasoning = true;
  return meta;
}

// The stream's deltas add up to the whole response, tool calls included,
// and every token's logprob goes out exactly once.
TEST(ReasoningTest, StreamAndWholeResponseAgreeWithAToolCallAfterTheReasoning) {
  openai_api::ResponseMeta meta = ThinkingMeta(/*logprobs=*/true);
  meta.tool_format = ToolFormat::kHermes;
  meta.tool_call_id = [] { return std::string("call_1"); };
  const std::string output =
      "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"weather\", "
      "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  std::vector<GenerateEvent> events;
  for (size_t k = 0; k < output.size(); k += 4) {
    TokenLogprob lp{.token_id = static_cast<int32_t>(k),
                    .logprob = -1.0f,
                    .token = output.substr(k, 4),
                    .top = {}};
    events.push_back(TokensEvent(0, output.substr(k, 4), {lp}));
  }
  openai_api::ResponseBuilder b(meta);
  for (const GenerateEvent& e : events) ASSERT_TRUE(b.Add(e).ok());
  ASSERT_TRUE(b.Add(FinishedEvent(0, FinishReason::kEos, 5, 40)).ok());
  const json whole = b.Build()["choices"][0];
  EXPECT_EQ(whole["message"]["reasoning_content"], "The user wants weather.");
  ASSERT_EQ(whole["finish_reason"], "tool_calls");
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["name"], "weather");
  EXPECT_TRUE(whole["message"]["content"].is_null());

  openai_api::StreamBuilder s(meta);
  std::string sse = s.Start();
  for (const GenerateEvent& e : events) sse += *s.OnEvent(e);
  sse += *s.OnEvent(FinishedEvent(0, FinishReason::kEos, 5, 40));
  std::string reasoning, content, finish;
  json calls = json::array();
  size_t logprobs = 0;
  for (const json& e : Events(sse + s.Finish())) {
    if (e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (c["delta"].contains("reasoning_content")) reasoning += c["delta"]["reasoning_content"];
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (c["delta"].contains("tool_calls")) {
      for (json call : c["delta"]["tool_calls"]) {
        call.erase("index");
        calls.push_back(call);
      }
    }
    if (c["logprobs"].is_object()) logprobs += c["logprobs"]["content"].size();
    if (c["finish_reason"].is_string()) finish = c["finish_reason"];
  }
  EXPECT_EQ(reasoning, "The user wants weather.");
  EXPECT_EQ(content, "");
  EXPECT_EQ(calls, whole["message"]["tool_calls"]);
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(logprobs, events.size()) << sse;
}

TEST(ReasoningTest, AnOutputWithoutABlockIsAnsweredAsBefore) {
  openai_api::ResponseMeta meta = ThinkingMeta(false);
  openai_api::ResponseBuilder b(meta);
  ASSERT_TRUE(b.Add(TokensEvent(0, "Just text.")).ok());
  ASSERT_TRUE(b.Add(FinishedEvent(0, FinishReason::kEos, 2, 3)).ok());
  const json message = b.Build()["choices"][0]["message"];
  EXPECT_EQ(message["content"], "Just text.");
  EXPECT_FALSE(message.contains("reasoning_content"));
  // The prompt opened the block: what precedes </think> is reasoning.
  meta.thinking_open = true;
  openai_api::StreamBuilder s(meta);
  std::string sse = s.Start() + *s.OnEvent(TokensEvent(0, "ok\n</think>\n\nYes"));
  sse += *s.OnEvent(FinishedEvent(0, FinishReason::kEos, 2, 3));
  const std::vector<json> events = Events(sse);
  ASSERT_EQ(events.size(), 4u) << sse;
  EXPECT_EQ(events[1]["choices"][0]["delta"]["reasoning_content"], "ok");
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "Yes");
}

TEST(ReasoningTest, ChatTemplateKwargsAndReasoningContentAreParsedAndBounded) {
  absl::StatusOr<openai_api::ApiRequest> r = openai_api::ParseChatRequest(R"({
      "messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
                   {"role": "user", "content": "and?"}],
      "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.chat_template_kwargs, R"({"enable_thinking":false})");
  EXPECT_EQ((*r->params.messages)[1].reasoning_content, "2+2");
  EXPECT_THAT(openai_api::ParseChatRequest(
                  R"({"messages": [{"role": "user", "content": "x", "reasoning_content": "r"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only on an assistant")));
  EXPECT_THAT(openai_api::ParseChatRequest(
                  R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chat_template_kwargs")));
  json many = {{"messages", {{{"role", "user"}, {"content", "x"}}}}};
  for (int k = 0; k < 17; ++k) many["chat_template_kwargs"]["k" + std::to_string(k)] = k;
  EXPECT_THAT(openai_api::ParseChatRequest(many.dump()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 16")));
  json big = {{"messages", {{{"role", "user"}, {"content", "x"}}}}};
  big["chat_template_kwargs"]["k"] = std::string(5000, 'x');
  EXPECT_THAT(openai_api::ParseChatRequest(big.dump()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes of JSON")));
}

}  // namespace
}  // namespace tandem::router
