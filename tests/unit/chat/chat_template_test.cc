// ChatTemplate (common/model/chat_template.h): loading from model folders,
// the default template, errors; and conformance of the seven real chat
// templates of ../shared/models/chat_templates with Python's Jinja2.
#include "common/chat/chat_template.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/chat/jinja2_reference.h"

namespace tandem {
namespace {

using ::tandem::jinja::Json;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string NewModelDir(const std::string& name) {
  const std::string dir = testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  return dir;
}

// 2024-07-26 13:20:00 UTC.
constexpr int64_t kNow = 1722000000;

ChatTemplate::Options FixedTimeOptions(const Clock* clock) {
  ChatTemplate::Options options;
  options.clock = clock;
  options.time_zone = absl::UTCTimeZone();
  return options;
}

TEST(ChatTemplateTest, DefaultTemplateWithoutOne) {
  const std::string dir = NewModelDir("plain");
  ASSERT_OK_AND_ASSIGN(ChatTemplate t, ChatTemplate::FromModelDir(dir));
  EXPECT_TRUE(t.is_default());
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_THAT(t.Render(chat, true),
              testing::IsOkAndHolds("system: Be brief.\nuser: Hi\nassistant:"));
  EXPECT_THAT(t.Render(chat, false), testing::IsOkAndHolds("system: Be brief.\nuser: Hi\n"));
}

// A base model's prompt starts with BOS, which the template must write:
// chat prompts are encoded without adding it.
TEST(ChatTemplateTest, DefaultTemplateStartsWithTheModelsBos) {
  const std::string dir = NewModelDir("plain_bos");
  WriteFile(dir + "/tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  ASSERT_OK_AND_ASSIGN(ChatTemplate t, ChatTemplate::FromModelDir(dir));
  EXPECT_TRUE(t.is_default());
  EXPECT_THAT(t.Render({{"user", "Hi"}}, true), testing::IsOkAndHolds("<s>user: Hi\nassistant:"));
}

TEST(ChatTemplateTest, ConfigTemplateStringListAndSpecialTokens) {
  const std::string dir = NewModelDir("config");
  WriteFile(dir + "/tokenizer_config.json", R"({
    "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
    "chat_template": [
      {"name": "tool_use", "template": "tools"},
      {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}{{ pad_token is defined }}"}
    ]})");
  ASSERT_OK_AND_ASSIGN(ChatTemplate t, ChatTemplate::FromModelDir(dir));
  EXPECT_FALSE(t.is_default());
  EXPECT_THAT(t.Render({{"user", "x"}}, false), testing::IsOkAndHolds("<s>[user]x</s>False"));
  // chat_template.jinja overrides the config, as in transformers.
  WriteFile(dir + "/chat_template.jinja", "jinja file {{ messages | length }}\n");
  ASSERT_OK_AND_ASSIGN(ChatTemplate f, ChatTemplate::FromModelDir(dir));
  EXPECT_THAT(f.Render({{"user", "x"}}, false), testing::IsOkAndHolds("jinja file 1"));
}

TEST(ChatTemplateTest, FromConfigTakesTheFilesContents) {
  ASSERT_OK_AND_ASSIGN(
      ChatTemplate t,
      ChatTemplate::FromConfig(R"({"eos_token": "</s>", "chat_template": "{{ eos_token }}"})",
                               std::nullopt, "cfg.json", "t.jinja"));
  EXPECT_THAT(t.Render({{"user", "x"}}, false), testing::IsOkAndHolds("</s>"));
  ASSERT_OK_AND_ASSIGN(ChatTemplate j,
                       ChatTemplate::FromConfig(std::nullopt, "j{{ 1 }}", "cfg.json", "t.jinja"));
  EXPECT_FALSE(j.is_default());
  EXPECT_THAT(j.Render({}, false), testing::IsOkAndHolds("j1"));
  ASSERT_OK_AND_ASSIGN(ChatTemplate d,
                       ChatTemplate::FromConfig(std::nullopt, std::nullopt, "cfg.json", "t.jinja"));
  EXPECT_TRUE(d.is_default());
  EXPECT_THAT(
      ChatTemplate::FromConfig("[1]", std::nullopt, "cfg.json", "t.jinja"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cfg.json: not a JSON object")));
  EXPECT_THAT(ChatTemplate::FromConfig(std::nullopt, "{% if %}", "cfg.json", "t.jinja"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("t.jinja")));
}

TEST(ChatTemplateTest, StrftimeNowReadsTheInjectedClock) {
  FakeClock clock(absl::FromUnixSeconds(kNow));
  ASSERT_OK_AND_ASSIGN(ChatTemplate t,
                       ChatTemplate::FromString("{{ strftime_now('%d %b %Y') }}", std::nullopt,
                                                std::nullopt, FixedTimeOptions(&clock)));
  EXPECT_THAT(t.Render({}, false), testing::IsOkAndHolds("26 Jul 2024"));
  clock.Advance(absl::Hours(24 * 7));
  EXPECT_THAT(t.Render({}, false), testing::IsOkAndHolds("02 Aug 2024"));
}

TEST(ChatTemplateTest, ErrorsNameTheFileAndField) {
  EXPECT_THAT(ChatTemplate::FromModelDir(testing::TempDir() + "/missing"),
              StatusIs(absl::StatusCode::kNotFound));
  const std::string dir = NewModelDir("bad");
  WriteFile(dir + "/tokenizer_config.json", "{not json");
  EXPECT_THAT(ChatTemplate::FromModelDir(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokenizer_config.json")));
  WriteFile(dir + "/tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_THAT(ChatTemplate::FromModelDir(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("'chat_template'"))));
  WriteFile(dir + "/tokenizer_config.json",
            R"({"chat_template": [{"name": "rag", "template": ""}]})");
  EXPECT_THAT(ChatTemplate::FromModelDir(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"default\"")));
  WriteFile(dir + "/tokenizer_config.json", R"({"bos_token": 1, "chat_template": "x"})");
  EXPECT_THAT(ChatTemplate::FromModelDir(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'bos_token'")));
  WriteFile(dir + "/tokenizer_config.json", R"({"chat_template": "a\n{% if %}"})");
  EXPECT_THAT(ChatTemplate::FromModelDir(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("field 'chat_template'"), HasSubstr("line 2"))));
  WriteFile(dir + "/tokenizer_config.json",
            R"({"chat_template": "{{ raise_exception('no system role') }}"})");
  ASSERT_OK_AND_ASSIGN(ChatTemplate t, ChatTemplate::FromModelDir(dir));
  EXPECT_THAT(t.Render({{"system", "x"}}, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("no system role"), HasSubstr("'chat_template'"))));
}

struct ModelTemplate {
  const char* file;
  const char* config;  // tokenizer_config.json without chat_template; empty: use a .jinja file
};

// The special tokens of the real models; half of them load the template from
// tokenizer_config.json, the others from chat_template.jinja.
const ModelTemplate kModels[] = {
    {"meta-llama-Llama-3.1-8B-Instruct.jinja",
     R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})"},
    {"meta-llama-Llama-3.2-3B-Instruct.jinja", ""},
    {"Qwen-Qwen2.5-7B-Instruct.jinja",
     R"({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})"},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ""},
    {"google-gemma-2-2b-it.jinja",
     R"({"bos_token": {"content": "<bos>"}, "eos_token": {"content": "<eos>"}})"},
    {"microsoft-Phi-3.5-mini-instruct.jinja", ""},
    {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
     R"({"bos_token": {"content": "<｜begin▁of▁sentence｜>"}, "eos_token": "<｜end▁of▁sentence｜>"})"},
};

struct Conversation {
  const char* name;
  const char* messages;  // JSON list
  const char* extra;     // JSON object
};

const Conversation kConversations[] = {
    {"system+user", R"([{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "Hello!"}])",
     "{}"},
    {"multi-turn", R"([{"role": "system", "content": "Sys"}, {"role": "user", "content": "Q1"},
                       {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"},
                       {"role": "assistant", "content": "A2"}, {"role": "user", "content": "Q3"}])",
     "{}"},
    {"no-system", R"([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                      {"role": "user", "content": "Q2"}])",
     "{}"},
    {"single-user", R"([{"role": "user", "content": "Just one"}])", "{}"},
    {"ends-with-assistant", R"([{"role": "user", "content": "Q"},
                                {"role": "assistant", "content": "<think>hmm</think>The answer"}])",
     "{}"},
    {"unicode", R"([{"role": "system", "content": "\u3000 Réponds en français 🤖 "},
                    {"role": "user", "content": "日本語のテキスト — «ça va?» \u00a0"},
                    {"role": "assistant", "content": "Ünïcödé ✓"},
                    {"role": "user", "content": "emoji 👍🏽 and zero-width \u200b"}])",
     "{}"},
    {"special-characters", R"([{"role": "user",
        "content": "  line1\n\tline2\r\n{{ not_a_var }} {% raw %} <|eot_id|> [INST] \"dq\" 'sq' \\ end  \n\n"},
        {"role": "assistant", "content": "\n{# not a comment #}\n"},
        {"role": "user", "content": ""}])",
     "{}"},
    {"non-alternating", R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])",
     "{}"},
    {"assistant-first", R"([{"role": "assistant", "content": "hi"},
                            {"role": "user", "content": "yo"}])",
     "{}"},
    {"unknown-role",
     R"([{"role": "narrator", "content": "Once"}, {"role": "user", "content": "Q"}])", "{}"},
    {"empty", "[]", "{}"},
    {"extra-context", R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])",
     R"({"date_string": "01 Jan 2025", "tools_in_user_message": false})"},
    {"tools", R"([{"role": "system", "content": "Use tools."},
                  {"role": "user", "content": "Weather in Paris?"}])",
     R"({"tools": [{"type": "function", "function": {"name": "get_weather",
         "description": "Current weather «now»",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]}}}]})"},
    {"tool-call", R"([{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "abcDEF123", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temp\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5°C."}])",
     "{}"},
};

TEST(ChatTemplateConformanceTest, RealTemplatesRenderAsJinja2Does) {
  FakeClock clock(absl::FromUnixSeconds(kNow));
  std::vector<testing::Jinja2Job> jobs;
  std::vector<std::string> labels;
  std::vector<absl::StatusOr<std::string>> ours;
  for (const ModelTemplate& model : kModels) {
    TANDEM_MODEL_FILE_OR_SKIP(path, absl::StrCat("chat_templates/", model.file));
    std::ifstream f(path, std::ios::binary);
    const std::string source((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string dir = NewModelDir(model.file);
    if (model.config[0] != '\0') {
      Json config = Json::parse(model.config);
      config["chat_template"] = source;
      WriteFile(dir + "/tokenizer_config.json", config.dump(2));
    } else {
      WriteFile(dir + "/chat_template.jinja", source);
    }
    absl::StatusOr<ChatTemplate> t = ChatTemplate::FromModelDir(dir, FixedTimeOptions(&clock));
    ASSERT_TRUE(t.ok()) << model.file << ": " << t.status();
    ASSERT_EQ(t->source(), source);
    for (const Conversation& c : kConversations) {
      for (bool add_generation_prompt : {true, false}) {
        const Json messages = Json::parse(c.messages);
        const Json extra = Json::parse(c.extra);
        testing::Jinja2Job job;
        job.source = source;
        job.context = t->Context(messages, add_generation_prompt, extra);
        job.now_unix_seconds = kNow;
        jobs.push_back(std::move(job));
        labels.push_back(absl::StrCat(model.file, " / ", c.name,
                                      add_generation_prompt ? " / generation prompt" : ""));
        ours.push_back(t->RenderJson(messages, add_generation_prompt, extra));
      }
    }
  }
  absl::StatusOr<std::vector<testing::Jinja2Result>> expected = testing::RenderWithJinja2(jobs);
  TANDEM_JINJA2_OR_SKIP(expected.status());
  int rendered = 0, raised = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(labels[i]);
    const testing::Jinja2Result& want = (*expected)[i];
    if (want.ok) {
      ++rendered;
      ASSERT_TRUE(ours[i].ok()) << ours[i].status() << "\nJinja2 rendered:\n" << want.output;
      EXPECT_EQ(*ours[i], want.output);
    } else {
      ++raised;
      EXPECT_FALSE(ours[i].ok()) << "rendered:\n" << *ours[i] << "\nJinja2 failed: " << want.error;
      // A template's own raise_exception message reaches the caller.
      const std::string prefix = "TemplateError: ";
      if (want.error.rfind(prefix, 0) == 0 && !ours[i].ok()) {
        EXPECT_THAT(std::string(ours[i].status().message()),
                    HasSubstr(want.error.substr(prefix.size())));
      }
    }
  }
  // Both outcomes are exercised: Gemma and Mistral reject non-alternating
  // roles and Gemma a system message.
  EXPECT_GT(rendered, 100);
  EXPECT_GT(raised, 10);
}

}  // namespace
}  // namespace tandem
