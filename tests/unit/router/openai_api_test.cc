// The OpenAI JSON mapping (router/openai_api.h): request bodies into
// GenerateParams, and events into responses and SSE chunks.
#include "router/openai_api.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/fake_core.h"

namespace tandem::router::openai_api {
namespace {

using ::nlohmann::json;
using ::tandem::router::testing::FinishedEvent;
using ::tandem::router::testing::TokensEvent;
using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(OpenAiApiTest, CompletionDefaultsAreOpenAis) {
  absl::StatusOr<ApiRequest> r = ParseCompletionRequest(R"({"prompt": "hello"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->endpoint, Endpoint::kCompletions);
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->include_usage);
  const GenerateParams& p = r->params;
  EXPECT_EQ(p.text, "hello");
  EXPECT_EQ(p.model, "");
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_FALSE(p.top_p.has_value());
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_FALSE(p.logprobs.has_value());
  EXPECT_FALSE(p.echo);
  EXPECT_EQ(p.n, 1);
}

TEST(OpenAiApiTest, EveryCompletionOptionIsMapped) {
  absl::StatusOr<ApiRequest> r = ParseCompletionRequest(R"({
      "model": "m", "prompt": [1, 5, 6], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
      "top_k": 40, "seed": 42, "stop": ["a", "b"], "stream": true,
      "stream_options": {"include_usage": true}, "n": 3, "best_of": 3, "logprobs": 2,
      "echo": true, "presence_penalty": 0.25, "frequency_penalty": -0.5,
      "repetition_penalty": 1.1, "logit_bias": {"17": -100, "3": 2.5}, "min_tokens": 4,
      "ignore_eos": true, "user": "u-1", "suffix": "", "min_p": 0.05})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  const GenerateParams& p = r->params;
  EXPECT_EQ(p.model, "m");
  ASSERT_TRUE(p.token_ids.has_value());
  EXPECT_THAT(*p.token_ids, ElementsAre(1, 5, 6));
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(*p.seed, 42u);
  EXPECT_THAT(p.stop, ElementsAre("a", "b"));
  EXPECT_EQ(p.n, 3);
  EXPECT_EQ(*p.logprobs, 2);
  EXPECT_TRUE(p.echo);
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.25f);
  EXPECT_FLOAT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(*p.repetition_penalty, 1.1f);
  EXPECT_THAT(p.logit_bias, ::testing::UnorderedElementsAre(Pair(17, -100.0f), Pair(3, 2.5f)));
  EXPECT_EQ(p.min_tokens, 4);
  EXPECT_TRUE(p.ignore_eos);
  // A one-element batch is one prompt; top_k -1 is no limit; a lone stop
  // string is a list of one; an empty token list generates from BOS.
  r = ParseCompletionRequest(R"({"prompt": ["hi"], "top_k": -1, "stop": "x", "seed": -1})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.text, "hi");
  EXPECT_EQ(r->params.top_k, 0);
  EXPECT_THAT(r->params.stop, ElementsAre("x"));
  EXPECT_EQ(*r->params.seed, ~uint64_t{0});
  r = ParseCompletionRequest(R"({"prompt": "x", "priority": -7})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.priority, -7);
  r = ParseCompletionRequest(R"({"prompt": []})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->params.token_ids.has_value() && r->params.token_ids->empty());
}

TEST(OpenAiApiTest, ChatOptionsAreMapped) {
  absl::StatusOr<ApiRequest> r = ParseChatRequest(R"({
      "model": "m", "messages": [{"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": []}],
      "max_tokens": 9, "max_completion_tokens": 3, "logprobs": true, "top_logprobs": 5,
      "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "n": 2})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->endpoint, Endpoint::kChat);
  const GenerateParams& p = r->params;
  ASSERT_TRUE(p.messages.has_value());
  ASSERT_EQ(p.messages->size(), 3u);
  EXPECT_EQ((*p.messages)[0].role, "system");
  EXPECT_EQ((*p.messages)[1].content, "ab");
  EXPECT_EQ((*p.messages)[2].content, "");
  EXPECT_EQ(p.max_tokens, 3);  // max_completion_tokens wins
  EXPECT_EQ(*p.logprobs, 5);
  EXPECT_EQ(p.n, 2);
  // Chat leaves max_tokens to the context; logprobs alone asks for no
  // alternatives.
  r = ParseChatRequest(R"({"messages": [], "logprobs": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->params.max_tokens.has_value());
  EXPECT_EQ(*r->params.logprobs, 0);
  r = ParseChatRequest(R"({"messages": [], "logprobs": false, "top_logprobs": 0})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->params.logprobs.has_value());
}

// Fields OpenAI clients send routinely: role developer (the system role's
// newer name), a message's name, store false, metadata (for the request
// log), parallel_tool_calls (meaningless without tools).
TEST(OpenAiApiTest, FieldsClientsSendAreTaken) {
  absl::StatusOr<ApiRequest> r = ParseChatRequest(R"({
      "messages": [{"role": "developer", "content": "be brief"},
                   {"role": "user", "name": "ada_1", "content": "hi"}],
      "store": false, "metadata": {"team": "search", "run": "7"},
      "parallel_tool_calls": true, "temperature": 2})");
  ASSERT_TRUE(r.ok()) << r.status();
  const GenerateParams& p = r->params;
  EXPECT_EQ((*p.messages)[0].role, "system");
  EXPECT_EQ((*p.messages)[0].name, "");
  EXPECT_EQ((*p.messages)[1].name, "ada_1");
  EXPECT_THAT(p.metadata, ElementsAre(std::pair<std::string, std::string>("run", "7"),
                                      std::pair<std::string, std::string>("team", "search")));
  EXPECT_EQ(p.temperature, 2.0f);
  // OpenAI's bounds on metadata.
  std::string many = "{";
  for (int i = 0; i < 17; ++i) absl::StrAppend(&many, i > 0 ? "," : "", "\"k", i, "\": \"v\"");
  many += "}";
  EXPECT_THAT(ParseChatRequest(absl::StrCat(R"({"messages": [], "metadata": )", many, "}")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 16")));
  EXPECT_THAT(ParseCompletionRequest(absl::StrCat(R"({"prompt": "x", "metadata": {"k": ")",
                                                  std::string(513, 'v'), R"("}})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("512")));
  EXPECT_THAT(ParseChatRequest(absl::StrCat(R"({"messages": [{"role": "user", "name": ")",
                                            std::string(65, 'a'), R"("}]})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("64")));
}

TEST(OpenAiApiTest, BadOrUnsupportedFieldsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> completions = {
      {"", "empty"},
      {"{", "JSON"},
      {"[1]", "object"},
      {R"({"max_tokens": 3})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "one prompt"},
      {R"({"prompt": [1, 99999999999]})", "prompt[1]"},
      {R"({"prompt": "x", "max_tokens": "ten"})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 99999999999})", "max_tokens"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "temperature": 1e300})", "temperature"},
      {R"({"prompt": "x", "top_k": -2})", "top_k"},
      {R"({"prompt": "x", "seed": 1.5})", "seed"},
      {R"({"prompt": "x", "stop": 3})", "stop"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"x": 1}})", "`x`"},
      {R"({"prompt": "x", "n": 0})", "n"},
      {R"({"prompt": "x", "n": 17})", "n"},
      {R"({"prompt": "x", "priority": 1001})", "priority"},
      {R"({"prompt": "x", "priority": "high"})", "priority"},
      {R"({"prompt": "x", "n": 2, "best_of": 3})", "best_of"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs"},
      {R"({"prompt": "x", "echo": 1})", "echo"},
      {R"({"prompt": "x", "suffix": "y"})", "suffix"},
      {R"({"prompt": "x", "logit_bias": {"a": 1}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"5": "big"}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": [1]})", "logit_bias"},
      {R"({"prompt": "x", "min_tokens": -1})", "min_tokens"},
      {R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos"},
      {R"({"prompt": "x", "user": 5})", "user"},
      {R"({"prompt": "x", "model": 3})", "model"},
      {R"({"prompt": "x", "messages": []})", "`messages`"},
      {R"({"prompt": "x", "guided_json": {}})", "`guided_json`"},
  };
  for (const auto& [body, field] : completions) {
    EXPECT_THAT(ParseCompletionRequest(body),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)))
        << body;
  }
  const std::vector<std::pair<std::string, std::string>> chat = {
      {R"({"prompt": "x"})", "`prompt`"},
      {R"({"model": "m"})", "messages"},
      {R"({"messages": {}})", "messages"},
      {R"({"messages": [1]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "name": "bob smith"}]})", "messages[0].name"},
      {R"({"messages": [{"role": "user", "name": 5}]})", "messages[0].name"},
      {R"({"messages": [], "temperature": 2.5})", "[0, 2]"},
      {R"({"messages": [], "temperature": -0.1})", "[0, 2]"},
      {R"({"messages": [], "store": true})", "not stored"},
      {R"({"messages": [], "store": "no"})", "store"},
      {R"({"messages": [], "metadata": []})", "metadata"},
      {R"({"messages": [], "metadata": {"k": 1}})", "metadata[\"k\"]"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "image_url"},
      {R"({"messages": [{"role": "user", "tool_calls": [{}]}]})", "tool_calls"},
      {R"({"messages": [], "top_logprobs": 3})", "top_logprobs"},
      {R"({"messages": [], "logprobs": 1})", "logprobs"},
      {R"({"messages": [], "tools": [{}]})", "tools"},
      {R"({"messages": [], "functions": [{}]})", "functions"},
      {R"({"messages": [], "tool_choice": "auto"})", "tool_choice"},
      {R"({"messages": [], "response_format": {"type": "xml"}})", "response_format.type"},
      {R"({"messages": [], "response_format": "json"})", "response_format"},
      {R"({"messages": [], "response_format": {"type": "json_object", "x": 1}})", "`x`"},
      {R"({"messages": [], "response_format": {"type": "json_schema"}})",
       "response_format.json_schema"},
      {R"({"messages": [], "response_format": {"type": "json_schema",
          "json_schema": {"schema": {}}}})",
       "json_schema.name"},
      {R"({"messages": [], "response_format": {"type": "json_schema",
          "json_schema": {"name": "a b", "schema": {}}}})",
       "json_schema.name"},
      {R"({"messages": [], "response_format": {"type": "json_schema",
          "json_schema": {"name": "a"}}})",
       "json_schema.schema"},
      {R"({"messages": [], "response_format": {"type": "json_schema",
          "json_schema": {"name": "a", "schema": {}, "strict": "yes"}}})",
       "json_schema.strict"},
      {R"({"messages": [], "echo": true})", "`echo`"},
      {R"({"messages": [], "best_of": 1})", "`best_of`"},
      {R"({"messages": [], "max_completion_tokens": 1.5})", "max_completion_tokens"},
      {R"({"messages": [], "parallel_tool_calls": "yes"})", "parallel_tool_calls"},
  };
  for (const auto& [body, field] : chat) {
    EXPECT_THAT(ParseChatRequest(body),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)))
        << body;
  }
}

TEST(OpenAiApiTest, ResponseFormatsOnChatAndCompletions) {
  using Kind = grammar::ConstraintSpec::Kind;
  absl::StatusOr<ApiRequest> r =
      ParseChatRequest(R"({"messages": [], "response_format": {"type": "text"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.constraint.kind, Kind::kNone);
  r = ParseChatRequest(R"({"messages": [], "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.constraint.kind, Kind::kJsonObject);
  // The schema keeps its properties' order (the body's parse sorts keys).
  r = ParseChatRequest(R"({"messages": [], "response_format": {"type": "json_schema",
      "json_schema": {"name": "p-1", "strict": true, "description": "d", "schema":
      {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {}}}}}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.constraint.kind, Kind::kJsonSchema);
  EXPECT_EQ(r->params.constraint.schema,
            R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{}}})");
  r = ParseCompletionRequest(R"({"prompt": "x", "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.constraint.kind, Kind::kJsonObject);
  r = ParseCompletionRequest(
      R"({"prompt": "x", "response_format": {"type": "regex", "regex": "(yes|no)\\."}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.constraint.kind, Kind::kRegex);
  EXPECT_EQ(r->params.constraint.schema, "(yes|no)\\.");
  EXPECT_THAT(ParseCompletionRequest(R"({"prompt": "x", "response_format": {"type": "regex"}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("response_format.regex")));
}

TEST(OpenAiApiTest, TokenizeAndDetokenizeBodies) {
  absl::StatusOr<TokenizeRequest> t =
      ParseTokenizeRequest(R"({"model": "m", "prompt": "hi", "add_special_tokens": false})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->model, "m");
  EXPECT_EQ(*t->prompt, "hi");
  EXPECT_FALSE(t->add_special_tokens);
  t = ParseTokenizeRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->messages.has_value());
  EXPECT_FALSE(t->add_generation_prompt);
  EXPECT_THAT(ParseTokenizeRequest(R"({})"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokenizeRequest(R"({"prompt": "a", "messages": []})"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokenizeRequest(R"({"prompt": "a", "return_token_strs": true})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("return_token_strs")));
  absl::StatusOr<DetokenizeRequest> d = ParseDetokenizeRequest(R"({"tokens": [104, 105]})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->tokens, ElementsAre(104, 105));
  EXPECT_THAT(ParseDetokenizeRequest(R"({"tokens": ["a"]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens[0]")));
}

ResponseMeta Meta(Endpoint endpoint, int n, bool logprobs, bool include_usage = false) {
  return ResponseMeta{.endpoint = endpoint,
                      .id = "id-1",
                      .created = 123,
                      .model = "m",
                      .n = n,
                      .logprobs = logprobs,
                      .include_usage = include_usage,
                      .token_text = [](int32_t id) { return absl::StrCat("<", id, ">"); }};
}

TokenLogprob Lp(std::string token, float logprob, std::vector<TopLogprob> top = {}) {
  return TokenLogprob{
      .token_id = 0, .logprob = logprob, .token = std::move(token), .top = std::move(top)};
}

TEST(OpenAiApiTest, CompletionResponseWithEchoAndLogprobs) {
  ResponseBuilder b(Meta(Endpoint::kCompletions, 2, /*logprobs=*/true));
  GenerateEvent echo;
  echo.kind = GenerateEvent::Kind::kEcho;
  echo.token_ids = {7, 8};
  echo.text = "Pq";
  echo.logprobs = {Lp("q", -0.5f, {{.token_id = 8, .logprob = -0.5f, .token = "q"}})};
  ASSERT_TRUE(b.Add(echo).ok());
  ASSERT_TRUE(b.Add(TokensEvent(1, "xy", {Lp("x", -1.0f), Lp("y", -2.0f)})).ok());
  ASSERT_TRUE(b.Add(TokensEvent(0, "z", {Lp("z", -3.0f)})).ok());
  GenerateEvent finished = FinishedEvent(1, FinishReason::kLength, 2, 2);
  finished.cached_tokens = 1;  // From a worker's prefix cache.
  ASSERT_TRUE(b.Add(finished).ok());
  finished = FinishedEvent(0, FinishReason::kEos, 2, 1);
  finished.cached_tokens = 1;
  ASSERT_TRUE(b.Add(finished).ok());
  EXPECT_THAT(b.Add(TokensEvent(2, "w")), StatusIs(absl::StatusCode::kInternal));
  const json r = b.Build();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["usage"], json::parse(R"({"prompt_tokens": 2, "completion_tokens": 3,
                                        "total_tokens": 5,
                                        "prompt_tokens_details": {"cached_tokens": 1}})"));
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["text"], "Pqz");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][1]["text"], "Pqxy");
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  const json& lp = r["choices"][1]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::parse(R"(["<7>", "q", "x", "y"])"));
  EXPECT_EQ(lp["token_logprobs"], json::parse(R"([null, -0.5, -1.0, -2.0])"));
  EXPECT_EQ(lp["top_logprobs"][0], nullptr);
  EXPECT_EQ(lp["top_logprobs"][1], json::parse(R"({"q": -0.5})"));
  EXPECT_EQ(lp["text_offset"], json::parse(R"([0, 3, 4, 5])"));
}

TEST(OpenAiApiTest, ChatResponseLogprobsCarryBytesOfInvalidUtf8) {
  ResponseBuilder b(Meta(Endpoint::kChat, 1, /*logprobs=*/true));
  ASSERT_TRUE(b.Add(TokensEvent(0, "",
                                {Lp("\xe2\x82", -0.25f,
                                    {{.token_id = 1, .logprob = -0.25f, .token = "\xff"}})}))
                  .ok());
  ASSERT_TRUE(b.Add(FinishedEvent(0, FinishReason::kStop, 4, 1)).ok());
  const json r = b.Build();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"], json::parse(R"({"role": "assistant", "content": ""})"));
  const json& entry = r["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(entry["bytes"], json::parse("[226, 130]"));
  EXPECT_EQ(entry["top_logprobs"][0]["bytes"], json::parse("[255]"));
  // The dump replaces the invalid bytes instead of throwing.
  const std::string dumped = Dump(r);
  EXPECT_THAT(dumped, HasSubstr("\xef\xbf\xbd"));
  EXPECT_TRUE(json::accept(dumped));
  // Without logprobs the field is null.
  ResponseBuilder plain(Meta(Endpoint::kChat, 1, /*logprobs=*/false));
  ASSERT_TRUE(plain.Add(TokensEvent(0, "hi")).ok());
  EXPECT_EQ(plain.Build()["choices"][0]["logprobs"], nullptr);
}

// The JSON payloads of an SSE text, [DONE] as a string.
std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  for (absl::string_view e : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(e, "data: ")) << e;
    e.remove_prefix(6);
    out.push_back(e == "[DONE]" ? json("[DONE]") : json::parse(e));
  }
  return out;
}

TEST(OpenAiApiTest, ChatStreamWithChoicesAndUsage) {
  StreamBuilder s(Meta(Endpoint::kChat, 2, /*logprobs=*/false, /*include_usage=*/true));
  std::string sse = s.Start();
  sse += *s.OnEvent(TokensEvent(1, "b"));
  sse += *s.OnEvent(TokensEvent(0, "a"));
  sse += *s.OnEvent(FinishedEvent(0, FinishReason::kEos, 5, 1));
  sse += *s.OnEvent(FinishedEvent(1, FinishReason::kLength, 5, 1));
  sse += s.Finish();
  const std::vector<json> events = Events(sse);
  ASSERT_EQ(events.size(), 8u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(events[i]["choices"][0]["index"], i);
    EXPECT_EQ(events[i]["choices"][0]["delta"]["role"], "assistant");
  }
  EXPECT_EQ(events[2]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[2]["choices"][0]["index"], 1);
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "b");
  EXPECT_EQ(events[2]["usage"], nullptr);
  EXPECT_TRUE(events[2].contains("usage"));
  EXPECT_EQ(events[4]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[4]["choices"][0]["delta"], json::object());
  EXPECT_EQ(events[5]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events[6]["choices"], json::array());
  EXPECT_EQ(events[6]["usage"]["completion_tokens"], 2);
  EXPECT_EQ(events[6]["usage"]["total_tokens"], 7);
  EXPECT_EQ(events[6]["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(events[7], "[DONE]");
}

TEST(OpenAiApiTest, CompletionStreamEchoesEveryChoiceAndContinuesOffsets) {
  StreamBuilder s(Meta(Endpoint::kCompletions, 2, /*logprobs=*/true));
  GenerateEvent echo;
  echo.kind = GenerateEvent::Kind::kEcho;
  echo.token_ids = {7};
  echo.text = "P";
  std::string sse = s.Start();
  EXPECT_EQ(sse, "");
  sse += *s.OnEvent(echo);
  sse += *s.OnEvent(TokensEvent(1, "ab", {Lp("a", -1), Lp("b", -1)}));
  sse += *s.OnEvent(TokensEvent(1, "c", {Lp("c", -1)}));
  sse += s.Finish();
  const std::vector<json> events = Events(sse);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0]["choices"][0]["text"], "P");
  EXPECT_EQ(events[0]["choices"][0]["logprobs"]["token_logprobs"], json::parse("[null]"));
  EXPECT_EQ(events[1]["choices"][0]["index"], 1);
  EXPECT_FALSE(events[1].contains("usage"));
  EXPECT_EQ(events[2]["choices"][0]["logprobs"]["text_offset"], json::parse("[3, 4]"));
  EXPECT_EQ(events[3]["choices"][0]["logprobs"]["text_offset"], json::parse("[5]"));
  EXPECT_EQ(events[4], "[DONE]");
  const std::vector<json> failure = Events(StreamBuilder::Failure(absl::UnavailableError("gone")));
  ASSERT_EQ(failure.size(), 2u);
  EXPECT_EQ(failure[0]["error"]["code"], "unavailable");
}

TEST(OpenAiApiTest, ErrorStatuses) {
  EXPECT_EQ(ErrorFor(absl::InvalidArgumentError("x")).http_status, 400);
  EXPECT_EQ(ErrorFor(absl::UnauthenticatedError("x")).http_status, 401);
  EXPECT_EQ(ErrorFor(absl::NotFoundError("x")).http_status, 404);
  EXPECT_EQ(ErrorFor(absl::ResourceExhaustedError("x")).http_status, 429);
  EXPECT_EQ(ErrorFor(absl::UnavailableError("x")).http_status, 503);
  EXPECT_EQ(ErrorFor(absl::DeadlineExceededError("x")).http_status, 504);
  EXPECT_EQ(ErrorFor(absl::InternalError("x")).http_status, 500);
  const HttpError e = ErrorFor(absl::ResourceExhaustedError("busy"));
  EXPECT_EQ(e.body["error"]["message"], "busy");
  EXPECT_EQ(e.body["error"]["type"], "rate_limit_error");
  EXPECT_EQ(e.body["error"]["code"], "resource_exhausted");
}

TEST(OpenAiApiTest, ToolsAndToolChoices) {
  absl::StatusOr<ApiRequest> r = ParseChatRequest(R"({"messages": [], "tools": [
      {"type": "function", "function": {"name": "weather", "description": "d",
       "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}, "strict": true}},
      {"type": "function", "function": {"name": "time"}}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->params.tools.size(), 2u);
  EXPECT_EQ(r->params.tools[0].name, "weather");
  EXPECT_EQ(r->params.tools[0].description, "d");
  // The parameters keep their properties' order.
  EXPECT_EQ(r->params.tools[0].parameters, R"({"type":"object","properties":{"z":{},"a":{}}})");
  EXPECT_EQ(r->params.tool_choice, ToolChoiceKind::kAuto);
  r = ParseChatRequest(R"({"messages": [], "tools": [{"type": "function",
      "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "f"}},
      "parallel_tool_calls": false})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.tool_choice, ToolChoiceKind::kNamed);
  EXPECT_EQ(r->params.tool_choice_name, "f");
  EXPECT_FALSE(r->params.parallel_tool_calls);
  r = ParseChatRequest(R"({"messages": [
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42", "refusal": null,
       "annotations": []}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r->params.messages)[0].tool_calls,
            R"([{"type":"function","function":{"name":"f","arguments":{"x":1}},"id":"c1"}])");
  EXPECT_EQ((*r->params.messages)[1].tool_call_id, "c1");
  const std::pair<const char*, const char*> bad[] = {
      {R"({"messages": [], "tools": {}})", "`tools`"},
      {R"({"messages": [], "tools": [{"type": "code"}]})", "tools[0].type"},
      {R"({"messages": [], "tools": [{"type": "function", "function": {}}]})", "name"},
      {R"({"messages": [], "tools": [{"type": "function", "function": {"name": "a b"}}]})",
       "function.name"},
      {R"({"messages": [], "tools": [{"type": "function", "function": {"name": "a"}},
          {"type": "function", "function": {"name": "a"}}]})",
       "twice"},
      {R"({"messages": [], "tool_choice": "required"})", "needs `tools`"},
      {R"({"messages": [], "tools": [{"type": "function", "function": {"name": "a"}}],
          "tool_choice": {"type": "function", "function": {"name": "b"}}})",
       "`b`"},
      {R"({"messages": [], "tools": [{"type": "function", "function": {"name": "a"}}],
          "tool_choice": "sometimes"})",
       "sometimes"},
      {R"({"messages": [{"role": "user", "tool_calls": [{"function": {"name": "f"}}]}]})",
       "assistant"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
          "arguments": "{"}}]}]})",
       "not JSON"},
      {R"({"messages": [], "functions": [{"name": "f"}]})", "`tools`"},
  };
  for (const auto& [body, message] : bad) {
    EXPECT_THAT(ParseChatRequest(body),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << body;
  }
}

TEST(OpenAiApiTest, ToolCallsInWholeAndStreamedResponses) {
  ResponseMeta meta = Meta(Endpoint::kChat, 2, /*logprobs=*/false);
  meta.tool_format = ToolFormat::kLlama3Json;
  meta.tool_call_id = [] { return std::string("call_x"); };
  const std::string call = R"({"name": "f", "parameters": {"a": 1}})";
  ResponseBuilder b(meta);
  ASSERT_TRUE(b.Add(TokensEvent(0, call)).ok());
  ASSERT_TRUE(b.Add(TokensEvent(1, "Plain text.")).ok());
  ASSERT_TRUE(b.Add(FinishedEvent(0, FinishReason::kEos, 3, 9)).ok());
  ASSERT_TRUE(b.Add(FinishedEvent(1, FinishReason::kEos, 3, 2)).ok());
  const json whole = b.Build();
  const json& c0 = whole["choices"][0];
  EXPECT_EQ(c0["finish_reason"], "tool_calls");
  EXPECT_EQ(c0["message"]["content"], nullptr);
  EXPECT_EQ(c0["message"]["tool_calls"], json::parse(R"([{"id": "call_x", "type": "function",
                             "function": {"name": "f", "arguments": "{\"a\":1}"}}])"));
  EXPECT_EQ(whole["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(whole["choices"][1]["message"]["content"], "Plain text.");
  EXPECT_FALSE(whole["choices"][1]["message"].contains("tool_calls"));

  StreamBuilder s(meta);
  std::string sse = s.Start();
  for (size_t k = 0; k < call.size(); k += 7) sse += *s.OnEvent(TokensEvent(0, call.substr(k, 7)));
  sse += *s.OnEvent(TokensEvent(1, "Pl"));
  sse += *s.OnEvent(TokensEvent(1, "ain"));
  sse += *s.OnEvent(FinishedEvent(0, FinishReason::kEos, 3, 9));
  sse += *s.OnEvent(FinishedEvent(1, FinishReason::kEos, 3, 2));
  const std::vector<json> events = Events(sse + s.Finish());
  // 2 role deltas; "Pl" and "ain" at once (text, not a call); the call and
  // its finish; the other finish; [DONE].
  ASSERT_EQ(events.size(), 8u) << sse;
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "Pl");
  EXPECT_EQ(events[3]["choices"][0]["delta"]["content"], "ain");
  const json& delta = events[4]["choices"][0]["delta"];
  EXPECT_EQ(delta["tool_calls"][0]["index"], 0);
  EXPECT_EQ(delta["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(delta["tool_calls"][0]["function"]["arguments"], R"({"a":1})");
  EXPECT_EQ(events[5]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(events[6]["choices"][0]["finish_reason"], "stop");

  // Cut by max_tokens: text, as it came.
  StreamBuilder cut(meta);
  std::string cut_sse = cut.Start() + *cut.OnEvent(TokensEvent(0, R"({"name": "f", "par)"));
  cut_sse += *cut.OnEvent(FinishedEvent(0, FinishReason::kLength, 3, 5));
  const std::vector<json> cut_events = Events(cut_sse);
  ASSERT_EQ(cut_events.size(), 4u);
  EXPECT_EQ(cut_events[2]["choices"][0]["delta"]["content"], R"({"name": "f", "par)");
  EXPECT_EQ(cut_events[3]["choices"][0]["finish_reason"], "length");
}

// Hermes calls may follow text: the text streams as it comes, the call is
// held from its marker, and the assembled stream equals the whole response.
TEST(OpenAiApiTest, HermesTextBeforeACallStreamsThenTheCall) {
  ResponseMeta meta = Meta(Endpoint::kChat, 1, /*logprobs=*/false);
  meta.tool_format = ToolFormat::kHermes;
  meta.tool_call_id = [] { return std::string("call_h"); };
  const std::string output =
      "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
  ResponseBuilder b(meta);
  ASSERT_TRUE(b.Add(TokensEvent(0, output)).ok());
  ASSERT_TRUE(b.Add(FinishedEvent(0, FinishReason::kEos, 3, 20)).ok());
  const json whole = b.Build()["choices"][0];
  ASSERT_EQ(whole["finish_reason"], "tool_calls");

  StreamBuilder s(meta);
  std::string sse = s.Start();
  for (size_t k = 0; k < output.size(); k += 3)
    sse += *s.OnEvent(TokensEvent(0, output.substr(k, 3)));
  sse += *s.OnEvent(FinishedEvent(0, FinishReason::kEos, 3, 20));
  std::string content;
  json tool_calls = json::array();
  std::string finish;
  for (const json& e : Events(sse + s.Finish())) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (c["delta"].contains("tool_calls")) {
      for (json call : c["delta"]["tool_calls"]) {
        call.erase("index");
        tool_calls.push_back(call);
      }
    }
    if (c["finish_reason"].is_string()) finish = c["finish_reason"];
  }
  EXPECT_EQ(content, "Let me look.");
  EXPECT_EQ(content, whole["message"]["content"]);
  EXPECT_EQ(tool_calls, whole["message"]["tool_calls"]);
  EXPECT_EQ(finish, "tool_calls");
  // The text went out before the call ended: its first delta comes early.
  StreamBuilder early(meta);
  early.Start();
  EXPECT_THAT(*early.OnEvent(TokensEvent(0, "Let me look.\n<tool")), HasSubstr("Let me look."));
}

}  // namespace
}  // namespace tandem::router::openai_api
