#include "router/tool_calls.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "common/grammar/automaton.h"
#include "common/grammar/constraint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_files.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::function<std::string()> Ids() {
  return [n = std::make_shared<int>(0)] { return "id" + std::to_string((*n)++); };
}

bool Accepts(const grammar::ConstraintSpec& spec, const std::string& text) {
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g = grammar::CompileConstraint(spec);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return false;
  grammar::Automaton a(*g);
  int32_t state = a.start();
  for (const char c : text) {
    state = a.Step(state, static_cast<uint8_t>(c));
    if (state == grammar::kDeadState) return false;
  }
  return a.accepting(state);
}

TEST(ToolCallsTest, TheFamiliesOfRealTemplates) {
  TANDEM_MODEL_FILE_OR_SKIP(llama31, "chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
  TANDEM_MODEL_FILE_OR_SKIP(llama32, "chat_templates/meta-llama-Llama-3.2-3B-Instruct.jinja");
  TANDEM_MODEL_FILE_OR_SKIP(qwen, "chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  TANDEM_MODEL_FILE_OR_SKIP(mistral, "chat_templates/mistralai-Mistral-Nemo-Instruct-2407.jinja");
  TANDEM_MODEL_FILE_OR_SKIP(gemma, "chat_templates/google-gemma-2-2b-it.jinja");
  EXPECT_EQ(ToolFormatOf(ReadFile(llama31)), ToolFormat::kLlama3Json);
  EXPECT_EQ(ToolFormatOf(ReadFile(llama32)), ToolFormat::kLlama3Json);
  EXPECT_EQ(ToolFormatOf(ReadFile(qwen)), ToolFormat::kHermes);
  EXPECT_EQ(ToolFormatOf(ReadFile(mistral)), ToolFormat::kMistral);
  EXPECT_EQ(ToolFormatOf(ReadFile(gemma)), ToolFormat::kNone);
}

TEST(ToolCallsTest, ParsesEachFamilysCallsAndLeavesTextAlone) {
  ParsedToolCalls l = ParseToolCalls(
      ToolFormat::kLlama3Json, R"(<|python_tag|>{"name": "f", "parameters": {"x": 1}})", Ids());
  ASSERT_EQ(l.calls.size(), 1u);
  EXPECT_EQ(l.calls[0].name, "f");
  EXPECT_EQ(l.calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(l.calls[0].id, "id0");
  EXPECT_FALSE(l.content.has_value());

  ParsedToolCalls h = ParseToolCalls(ToolFormat::kHermes,
                                     "Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n"
                                     "</tool_call>\n<tool_call>\n{\"name\": \"b\", "
                                     "\"arguments\": {\"k\": \"v\"}}\n</tool_call>",
                                     Ids());
  ASSERT_EQ(h.calls.size(), 2u);
  EXPECT_EQ(h.calls[1].name, "b");
  EXPECT_EQ(h.calls[1].arguments, R"({"k":"v"})");
  EXPECT_EQ(h.content, "Sure.");

  ParsedToolCalls m = ParseToolCalls(
      ToolFormat::kMistral, R"([{"name": "a", "arguments": {"q": [1]}}, {"name": "b"}])", Ids());
  ASSERT_EQ(m.calls.size(), 2u);
  EXPECT_EQ(m.calls[1].arguments, "{}");

  for (const auto& [format, text] : std::initializer_list<std::pair<ToolFormat, const char*>>{
           {ToolFormat::kLlama3Json, "The answer is 4."},
           {ToolFormat::kLlama3Json, R"({"name": 3})"},
           {ToolFormat::kLlama3Json, R"({"name": "f", "parameters": "x"})"},
           {ToolFormat::kHermes, "<tool_call>\n{not json}\n</tool_call>"},
           {ToolFormat::kMistral, "[1, 2]"},
       }) {
    ParsedToolCalls p = ParseToolCalls(format, text, Ids());
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

TEST(ToolCallsTest, StreamsHoldBackOnlyWhatMayBeACall) {
  EXPECT_TRUE(MayBeToolCall(ToolFormat::kLlama3Json, ""));
  EXPECT_TRUE(MayBeToolCall(ToolFormat::kLlama3Json, "  {\"na"));
  EXPECT_TRUE(MayBeToolCall(ToolFormat::kLlama3Json, "<|pyth"));
  EXPECT_FALSE(MayBeToolCall(ToolFormat::kLlama3Json, "The"));
  EXPECT_TRUE(MayBeToolCall(ToolFormat::kHermes, "<tool"));
  EXPECT_TRUE(MayBeToolCall(ToolFormat::kHermes, "<tool_call>\n{"));
  EXPECT_FALSE(MayBeToolCall(ToolFormat::kHermes, "<b>"));
  EXPECT_TRUE(MayBeToolCall(ToolFormat::kMistral, "[{"));
  EXPECT_FALSE(MayBeToolCall(ToolFormat::kMistral, "Hi"));
}

TEST(ToolCallsTest, RequiredAndNamedChoicesConstrainTheCall) {
  const std::vector<ToolFunction> tools = {
      {.name = "weather",
       .parameters = R"({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"], "additionalProperties": false})"},
      {.name = "time"}};
  absl::StatusOr<grammar::ConstraintSpec> any =
      ToolCallConstraint(ToolFormat::kLlama3Json, tools, ToolChoiceKind::kRequired, "");
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_TRUE(Accepts(*any, R"({"name": "weather", "parameters": {"city": "Oslo"}})"));
  EXPECT_TRUE(Accepts(*any, R"({"name": "time", "parameters": {}})"));
  EXPECT_FALSE(Accepts(*any, R"({"name": "weather", "parameters": {}})"));
  EXPECT_FALSE(Accepts(*any, R"({"name": "other", "parameters": {}})"));
  absl::StatusOr<grammar::ConstraintSpec> named =
      ToolCallConstraint(ToolFormat::kHermes, tools, ToolChoiceKind::kNamed, "time");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_TRUE(
      Accepts(*named, "<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(*named, "{\"name\": \"time\", \"arguments\": {}}"));
  EXPECT_THAT(ToolCallConstraint(ToolFormat::kMistral, tools, ToolChoiceKind::kRequired, "")
                  .status()
                  .message(),
              HasSubstr("control token"));
  EXPECT_THAT(ToolCallConstraint(ToolFormat::kHermes, tools, ToolChoiceKind::kNamed, "nope")
                  .status()
                  .message(),
              HasSubstr("`nope`"));
}

}  // namespace
}  // namespace tandem::router
