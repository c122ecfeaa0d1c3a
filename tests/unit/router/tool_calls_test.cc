#include "router/tool_calls.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "common/grammar/automaton.h"
#include "common/grammar/constraint.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/hf_tokenizer.h"
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
  auto hold = [](ToolFormat f, absl::string_view text) { return ToolCallHoldFrom(f, text); };
  EXPECT_EQ(hold(ToolFormat::kLlama3Json, ""), 0u);
  EXPECT_EQ(hold(ToolFormat::kLlama3Json, "  {\"na"), 0u);
  EXPECT_EQ(hold(ToolFormat::kLlama3Json, "<|pyth"), 0u);
  EXPECT_EQ(hold(ToolFormat::kLlama3Json, "The"), 3u);
  EXPECT_EQ(hold(ToolFormat::kHermes, "<tool"), 0u);
  EXPECT_EQ(hold(ToolFormat::kHermes, "<tool_call>\n{"), 0u);
  EXPECT_EQ(hold(ToolFormat::kHermes, "<b>"), 3u);
  // Hermes calls may follow text: the text goes, the marker (or what may
  // begin one) and the white space before it stay.
  EXPECT_EQ(hold(ToolFormat::kHermes, "Sure. <tool_call>\n{"), 5u);
  EXPECT_EQ(hold(ToolFormat::kHermes, "Sure.\n<too"), 5u);
  EXPECT_EQ(hold(ToolFormat::kHermes, "a < b"), 5u);
  EXPECT_EQ(hold(ToolFormat::kHermes, "a <"), 1u);
  EXPECT_EQ(hold(ToolFormat::kMistral, "[{"), 0u);
  EXPECT_EQ(hold(ToolFormat::kMistral, "Hi"), 2u);
}

TEST(ToolCallsTest, RequiredAndNamedChoicesConstrainTheCall) {
  const std::vector<ToolFunction> tools = {
      {.name = "weather",
       .parameters = R"({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"], "additionalProperties": false})"},
      {.name = "time"}};
  absl::StatusOr<grammar::ConstraintSpec> any =
      ToolCallConstraint(ToolFormat::kLlama3Json, tools, ToolChoiceKind::kRequired, "", nullptr);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_TRUE(Accepts(*any, R"({"name": "weather", "parameters": {"city": "Oslo"}})"));
  EXPECT_TRUE(Accepts(*any, R"({"name": "time", "parameters": {}})"));
  EXPECT_FALSE(Accepts(*any, R"({"name": "weather", "parameters": {}})"));
  EXPECT_FALSE(Accepts(*any, R"({"name": "other", "parameters": {}})"));
  absl::StatusOr<grammar::ConstraintSpec> named =
      ToolCallConstraint(ToolFormat::kHermes, tools, ToolChoiceKind::kNamed, "time", nullptr);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_TRUE(
      Accepts(*named, "<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(*named, "{\"name\": \"time\", \"arguments\": {}}"));
  EXPECT_THAT(
      ToolCallConstraint(ToolFormat::kMistral, tools, ToolChoiceKind::kRequired, "", nullptr)
          .status()
          .message(),
      HasSubstr("[TOOL_CALLS] control token"));
  EXPECT_THAT(
      ToolCallConstraint(ToolFormat::kHermes, tools, ToolChoiceKind::kNamed, "nope", nullptr)
          .status()
          .message(),
      HasSubstr("`nope`"));
}

// A byte-level tokenizer whose id 256 is Mistral's [TOOL_CALLS] control
// token, or a plain special token without `marker` (257 is EOS).
std::unique_ptr<Tokenizer> MistralLikeTokenizer(bool marker = true) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string piece;
    AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(b)), &piece);
    vocab[piece] = b;
  }
  const auto added = [](int id, const char* content) {
    return nlohmann::json{{"id", id},        {"content", content}, {"single_word", false},
                          {"lstrip", false}, {"rstrip", false},    {"normalized", false},
                          {"special", true}};
  };
  const nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", {added(256, marker ? "[TOOL_CALLS]" : "[INST]"), added(257, "</s>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::FromFiles(
      {.tokenizer_path = "/m/tokenizer.json", .tokenizer_json = tokenizer.dump()});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// Mistral's call starts with a control token: forced by its id, then one
// call in an array, which ParseToolCalls reads back.
TEST(ToolCallsTest, MistralRequiredForcesItsControlTokenThenTheCall) {
  const std::unique_ptr<Tokenizer> tokenizer = MistralLikeTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<ToolFunction> tools = {
      {.name = "weather",
       .parameters = R"({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]})"},
      {.name = "time"}};
  absl::StatusOr<grammar::ConstraintSpec> spec = ToolCallConstraint(
      ToolFormat::kMistral, tools, ToolChoiceKind::kRequired, "", tokenizer.get());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->forced_tokens, std::vector<int32_t>{256});
  const std::string call = R"([{"name": "weather", "arguments": {"city": "Oslo"}}])";
  EXPECT_TRUE(Accepts(*spec, call));
  EXPECT_FALSE(Accepts(*spec, R"({"name": "weather", "arguments": {"city": "Oslo"}})"));
  EXPECT_FALSE(Accepts(*spec, R"([])"));
  EXPECT_FALSE(
      Accepts(*spec, R"([{"name": "time", "arguments": {}}, {"name": "time", "arguments": {}}])"));
  ParsedToolCalls parsed = ParseToolCalls(ToolFormat::kMistral, call, Ids());
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].arguments, R"({"city":"Oslo"})");
  // A tokenizer without the marker cannot force it.
  const std::unique_ptr<Tokenizer> plain = MistralLikeTokenizer(/*marker=*/false);
  ASSERT_NE(plain, nullptr);
  EXPECT_THAT(
      ToolCallConstraint(ToolFormat::kMistral, tools, ToolChoiceKind::kRequired, "", plain.get())
          .status()
          .message(),
      HasSubstr("[TOOL_CALLS]"));
}

}  // namespace
}  // namespace tandem::router
