// The OpenAI-compatible HTTP API (router/openai_http.h) in front of a real
// RouterService over fake workers, spoken to with httplib::Client; and the
// pure JSON conversions of router/openai_json.h.
#include "router/openai_http.h"

#include <httplib.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/chat_template.h"
#include "common/rpc/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/openai_json.h"
#include "tests/testing/model_files.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router::testing {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

// --- openai_json ---------------------------------------------------------

TEST(OpenAiJsonTest, DefaultsAreOpenAis) {
  absl::StatusOr<openai::CompletionRequest> r =
      openai::ParseCompletionRequest(R"({"prompt": "hello", "model": "m"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_FALSE(r->stream);
  EXPECT_EQ(r->request.text(), "hello");
  EXPECT_EQ(r->request.max_tokens(), 16);
  EXPECT_FLOAT_EQ(r->request.sampling().temperature(), 1.0f);
  EXPECT_FALSE(r->request.sampling().has_top_p());
  EXPECT_EQ(r->request.stop_size(), 0);
}

TEST(OpenAiJsonTest, EveryFieldIsConverted) {
  absl::StatusOr<openai::CompletionRequest> r = openai::ParseCompletionRequest(
      R"({"prompt": [1, 5, 6], "max_tokens": 7, "temperature": 0, "top_p": 0.5,
          "top_k": -1, "seed": 42, "stop": ["a", "b"], "stream": true, "n": 1,
          "echo": false, "logprobs": null, "user": "x", "presence_penalty": 0})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->stream);
  ASSERT_TRUE(r->request.has_token_ids());
  EXPECT_THAT(r->request.token_ids().ids(), ::testing::ElementsAre(1, 5, 6));
  EXPECT_EQ(r->request.max_tokens(), 7);
  EXPECT_FLOAT_EQ(r->request.sampling().temperature(), 0.0f);
  EXPECT_FLOAT_EQ(r->request.sampling().top_p(), 0.5f);
  EXPECT_EQ(r->request.sampling().top_k(), 0);
  EXPECT_EQ(r->request.sampling().seed(), 42u);
  EXPECT_THAT(r->request.stop(), ::testing::ElementsAre("a", "b"));
  // A one-element batch is one prompt; a single stop string is a list of one.
  r = openai::ParseCompletionRequest(R"({"prompt": ["hi"], "stop": "x"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.text(), "hi");
  EXPECT_THAT(r->request.stop(), ::testing::ElementsAre("x"));
  r = openai::ParseCompletionRequest(R"({"prompt": [[3, 4]]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->request.token_ids().ids(), ::testing::ElementsAre(3, 4));
}

TEST(OpenAiJsonTest, BadInputNamesTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "JSON"},
      {"[1]", "object"},
      {R"({"max_tokens": 3})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "one prompt"},
      {R"({"prompt": [1, 99999999999]})", "prompt"},
      {R"({"prompt": "x", "max_tokens": "ten"})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 99999999999})", "max_tokens"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "top_p": []})", "top_p"},
      {R"({"prompt": "x", "top_k": -2})", "top_k"},
      {R"({"prompt": "x", "seed": 1.5})", "seed"},
      {R"({"prompt": "x", "stop": 3})", "stop"},
      {R"({"prompt": "x", "stop": ["a", 3]})", "stop"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "model": 3})", "model"},
      {R"({"prompt": "x", "n": 2})", "n"},
      {R"({"prompt": "x", "echo": true})", "echo"},
      {R"({"prompt": "x", "logprobs": 5})", "logprobs"},
  };
  for (const auto& [body, field] : cases) {
    absl::StatusOr<openai::CompletionRequest> r = openai::ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_THAT(r.status().message(), HasSubstr(field)) << body;
  }
}

TEST(OpenAiJsonTest, ChatMessagesAndTheirTextParts) {
  absl::StatusOr<openai::CompletionRequest> r = openai::ParseChatCompletionRequest(
      R"({"model": "m", "messages": [{"role": "system", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
          "text": "b"}]}, {"role": "assistant", "content": null}], "temperature": 0,
          "logprobs": false, "stream": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->chat);
  EXPECT_TRUE(r->stream);
  EXPECT_EQ(r->model, "m");
  ASSERT_TRUE(r->request.has_messages());
  ASSERT_EQ(r->request.messages().messages_size(), 3);
  EXPECT_EQ(r->request.messages().messages(0).role(), "system");
  EXPECT_EQ(r->request.messages().messages(0).content(), "be brief");
  EXPECT_EQ(r->request.messages().messages(1).content(), "ab");
  EXPECT_EQ(r->request.messages().messages(2).content(), "");
  EXPECT_EQ(r->request.max_tokens(), openai::kDefaultChatMaxTokens);
  EXPECT_FLOAT_EQ(r->request.sampling().temperature(), 0.0f);
  r = openai::ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
          "max_completion_tokens": 5})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.max_tokens(), 5);
}

TEST(OpenAiJsonTest, ChatBadInputNamesTheField) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "x"})", "messages"},
      {R"({"messages": "x"})", "messages"},
      {R"({"messages": [3]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 3}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url",
          "image_url": {"url": "x"}}]}]})",
       "'image_url'"},
      {R"({"messages": [{"role": "user", "content": [{"text": "x"}]}]})", "type"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]})", "tool_calls"},
      {absl::StrCat("{", user, R"(, "n": 2})"), "n"},
      {absl::StrCat("{", user, R"(, "echo": true})"), "echo"},
      {absl::StrCat("{", user, R"(, "logprobs": true})"), "logprobs"},
      {absl::StrCat("{", user, R"(, "top_logprobs": 2})"), "top_logprobs"},
      {absl::StrCat("{", user, R"(, "max_tokens": "ten"})"), "max_tokens"},
      {absl::StrCat("{", user, R"(, "max_completion_tokens": 1.5})"), "max_completion_tokens"},
      {absl::StrCat("{", user, R"(, "tools": [{"type": "function"}]})"), "tools"},
      {absl::StrCat("{", user, R"(, "response_format": {"type": "json_object"}})"),
       "response_format"},
  };
  for (const auto& [body, field] : cases) {
    absl::StatusOr<openai::CompletionRequest> r = openai::ParseChatCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_THAT(r.status().message(), HasSubstr(field)) << body;
  }
}

TEST(OpenAiJsonTest, FinishReasonsAndErrorStatuses) {
  EXPECT_EQ(openai::FinishReasonName(v1::FINISH_REASON_EOS), "stop");
  EXPECT_EQ(openai::FinishReasonName(v1::FINISH_REASON_STOP), "stop");
  EXPECT_EQ(openai::FinishReasonName(v1::FINISH_REASON_LENGTH), "length");
  EXPECT_EQ(openai::FinishReasonName(v1::FINISH_REASON_CONTEXT), "length");
  EXPECT_EQ(openai::ErrorFor(absl::InvalidArgumentError("x")).http_status, 400);
  EXPECT_EQ(openai::ErrorFor(absl::ResourceExhaustedError("x")).http_status, 429);
  EXPECT_EQ(openai::ErrorFor(absl::UnavailableError("x")).http_status, 503);
  EXPECT_EQ(openai::ErrorFor(absl::DeadlineExceededError("x")).http_status, 504);
  EXPECT_EQ(openai::ErrorFor(absl::InternalError("x")).http_status, 500);
  const json body = openai::ErrorFor(absl::ResourceExhaustedError("busy")).body;
  EXPECT_EQ(body["error"]["message"], "busy");
  EXPECT_EQ(body["error"]["type"], "rate_limit_error");
  EXPECT_EQ(body["error"]["code"], "resource_exhausted");
}

// --- The HTTP server against a router over fake workers -------------------

// One SSE response: the JSON of every `data:` event before [DONE].
struct SseResult {
  int status = 0;
  std::string content_type;
  std::vector<json> events;
  bool done = false;  // "data: [DONE]" was the last event.
  std::string raw;
};

SseResult ParseSse(const std::string& raw) {
  SseResult r;
  r.raw = raw;
  for (absl::string_view event : absl::StrSplit(raw, "\n\n", absl::SkipEmpty())) {
    if (absl::StartsWith(event, ":")) continue;  // A comment (heartbeat).
    EXPECT_TRUE(absl::StartsWith(event, "data: ")) << event;
    EXPECT_FALSE(r.done) << "an event after [DONE]";
    const absl::string_view data = event.substr(6);
    if (data == "[DONE]") {
      r.done = true;
      continue;
    }
    r.events.push_back(json::parse(data.begin(), data.end(), nullptr, false));
    EXPECT_FALSE(r.events.back().is_discarded()) << data;
  }
  return r;
}

class OpenAiHttpTest : public ::testing::Test {
 protected:
  void StartAll(HarnessOptions options = {.prefill = 1, .decode = 1},
                OpenAiHttpOptions http_options = {}) {
    harness_ = std::make_unique<RouterHarness>(options);
    ASSERT_TRUE(harness_->Start().ok());
    http_options.served_model_name = "tandem-test";
    http_options.heartbeat = absl::Milliseconds(100);
    // Connected before the first request, so that a slow start (sanitizers)
    // is no fail-fast UNAVAILABLE.
    std::shared_ptr<grpc::Channel> channel =
        rpc::MakeChannel(absl::StrCat("127.0.0.1:", harness_->port()));
    ASSERT_TRUE(channel->WaitForConnected(rpc::ToChrono(absl::Now() + absl::Seconds(20))));
    absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> http =
        OpenAiHttpServer::Start(channel, http_options);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = *std::move(http);
    ASSERT_GT(http_->port(), 0);
  }
  void TearDown() override {
    if (http_ != nullptr) http_->Stop();
    http_.reset();
    harness_.reset();
  }

  std::unique_ptr<httplib::Client> Client() {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", http_->port());
    c->set_read_timeout(20, 0);
    return c;
  }

  // POSTs `body`; the status and the parsed JSON body.
  std::pair<int, json> Post(const std::string& body, const std::string& path = "/v1/completions") {
    httplib::Result r = Client()->Post(path, body, "application/json");
    if (!r) {
      ADD_FAILURE() << "no response: " << httplib::to_string(r.error());
      return {0, json()};
    }
    json j = json::parse(r->body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    return {r->status, j};
  }

  SseResult PostStream(const std::string& body, const std::string& path = "/v1/completions") {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    std::string raw;
    req.content_receiver = [&raw](const char* data, size_t n, uint64_t, uint64_t) {
      raw.append(data, n);
      return true;
    };
    httplib::Result r = Client()->send(req);
    SseResult sse = ParseSse(raw);
    if (r) {
      sse.status = r->status;
      sse.content_type = r->get_header_value("Content-Type");
    }
    return sse;
  }

  // A router whose chat template is kFakeChatTemplate.
  void StartChat() {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(kFakeChatTemplate, "<s>", "</s>");
    ASSERT_TRUE(t.ok()) << t.status();
    chat_template_.emplace(*std::move(t));
    HarnessOptions options{.prefill = 1, .decode = 1};
    options.chat_template = &*chat_template_;
    StartAll(options);
  }

  // Outlives the router.
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<RouterHarness> harness_;
  std::unique_ptr<OpenAiHttpServer> http_;
};

// Fake workers: the prefill worker's first token is 40, the decode worker
// then produces 20, 21, ...; the fake tokenizer spells token N " wN".

TEST_F(OpenAiHttpTest, NonStreamingCompletionOfTokenIds) {
  StartAll();
  const auto [status, j] = Post(R"({"model": "m1", "prompt": [1, 5, 6], "max_tokens": 3})");
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_THAT(j["id"].get<std::string>(), ::testing::StartsWith("cmpl-"));
  EXPECT_GT(j["created"].get<int64_t>(), 0);
  EXPECT_EQ(j["model"], "m1");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], " w40 w20 w21");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 6);
  // The token ids reached the workers as given.
  ASSERT_FALSE(harness_->prefill(0).requests().empty());
  EXPECT_THAT(harness_->prefill(0).requests().back().tokens(), ::testing::ElementsAre(1, 5, 6));
}

TEST_F(OpenAiHttpTest, NonStreamingTextWithSamplingAndStop) {
  StartAll();
  const auto [status, j] = Post(
      R"({"prompt": "w5", "max_tokens": 10, "temperature": 0.5, "top_k": 3, "top_p": 0.9,
          "seed": 7, "stop": [" w21"]})");
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["model"], "tandem-test");  // No model in the request.
  EXPECT_EQ(j["choices"][0]["text"], " w40 w20");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2);  // BOS + w5.
  const v1::DecodeRequest last = harness_->decode(0).requests().back();
  EXPECT_FLOAT_EQ(last.sampling().temperature(), 0.5f);
  EXPECT_EQ(last.sampling().top_k(), 3);
  EXPECT_FLOAT_EQ(last.sampling().top_p(), 0.9f);
  EXPECT_EQ(last.sampling().seed(), 7u);
}

TEST_F(OpenAiHttpTest, EosIsFinishReasonStop) {
  StartAll();
  harness_->decode(0).SetBehaviour({.script = {20, kFakeEos}});
  const auto [status, j] = Post(R"({"prompt": [1, 5], "max_tokens": 10})");
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], " w40 w20");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(OpenAiHttpTest, StreamingSendsChunksThenUsageThenDone) {
  StartAll();
  const SseResult r = PostStream(R"({"prompt": "w5 w6", "max_tokens": 3, "stream": true})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_THAT(r.content_type, HasSubstr("text/event-stream"));
  EXPECT_TRUE(r.done) << r.raw;
  ASSERT_GE(r.events.size(), 2u) << r.raw;
  std::string text;
  for (size_t i = 0; i + 1 < r.events.size(); ++i) {
    const json& e = r.events[i];
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_EQ(e["id"], r.events[0]["id"]);
    EXPECT_TRUE(e["choices"][0]["finish_reason"].is_null()) << e.dump();
    EXPECT_FALSE(e.contains("usage"));
    EXPECT_EQ(e["choices"][0]["index"], 0);
    text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, " w40 w20 w21");
  const json& last = r.events.back();
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["choices"][0]["text"], "");
  EXPECT_EQ(last["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(last["usage"]["completion_tokens"], 3);
  EXPECT_EQ(last["usage"]["total_tokens"], 6);
}

TEST_F(OpenAiHttpTest, StreamingStopStringIsFinishReasonStop) {
  StartAll();
  const SseResult r =
      PostStream(R"({"prompt": [1, 5], "max_tokens": 10, "stop": " w21", "stream": true})");
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_TRUE(r.done) << r.raw;
  std::string text;
  for (const json& e : r.events) text += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, " w40 w20");
  EXPECT_EQ(r.events.back()["choices"][0]["finish_reason"], "stop");
}

TEST_F(OpenAiHttpTest, AWorkerLostMidStreamEndsWithAnErrorEventAndDone) {
  StartAll();
  harness_->decode(0).SetBehaviour({.fail_after = 2});
  const SseResult r = PostStream(R"({"prompt": [1, 5], "max_tokens": 10, "stream": true})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_TRUE(r.done) << r.raw;
  ASSERT_FALSE(r.events.empty());
  EXPECT_TRUE(r.events.back().contains("error")) << r.raw;
}

TEST_F(OpenAiHttpTest, BadRequestsAre400NamingTheField) {
  StartAll();
  struct Case {
    std::string body;
    std::string field;
  };
  for (const Case& c : std::vector<Case>{
           {"{not json", "JSON"},
           {R"({"max_tokens": 3})", "prompt"},
           {R"({"prompt": "w5", "max_tokens": 0})", "max_tokens"},
           {R"({"prompt": "w5", "max_tokens": "3"})", "max_tokens"},
           {R"({"prompt": "", "max_tokens": 3})", "prompt"},
           {R"({"prompt": "w5", "temperature": -1})", "temperature"},
           {R"({"prompt": [1, 5], "stream": true, "max_tokens": 0})", "max_tokens"},
       }) {
    const auto [status, j] = Post(c.body);
    EXPECT_EQ(status, 400) << c.body << " -> " << j.dump();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << c.body;
    EXPECT_EQ(j["error"]["code"], "invalid_argument") << c.body;
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(c.field)) << c.body;
  }
  // Prompt over the model's context: the router's limit check.
  std::string long_prompt = "[1";
  for (int i = 0; i < kFakeMaxContext; ++i) long_prompt += ", 5";
  const auto [status, j] = Post(absl::StrCat(R"({"prompt": )", long_prompt, "]}"));
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("context"));
}

TEST_F(OpenAiHttpTest, OverloadIs429) {
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.router.max_inflight = 1;
  StartAll(options);
  harness_->decode(0).SetBehaviour({.hold_after = 0});
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(30)));
  auto reader = harness_->stub().Generate(&ctx, TokenRequest({1, 5, 6}, 100));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));  // In flight.
  for (bool stream : {false, true}) {
    const auto [status, j] = Post(absl::StrCat(R"({"prompt": [1, 5], "max_tokens": 2, "stream": )",
                                               stream ? "true" : "false", "}"));
    EXPECT_EQ(status, 429) << j.dump();
    EXPECT_EQ(j["error"]["code"], "resource_exhausted");
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("--max_inflight"));
  }
  ctx.TryCancel();
  while (reader->Read(&response)) {
  }
  reader->Finish();
}

TEST_F(OpenAiHttpTest, RequestTimeoutIs504) {
  OpenAiHttpOptions http_options;
  http_options.request_timeout = absl::Milliseconds(500);
  StartAll({.prefill = 1, .decode = 1}, http_options);
  harness_->decode(0).SetBehaviour({.hold_after = 0});
  const absl::Time start = absl::Now();
  const auto [status, j] = Post(R"({"prompt": [1, 5], "max_tokens": 5})");
  EXPECT_EQ(status, 504) << j.dump();
  EXPECT_EQ(j["error"]["code"], "deadline_exceeded");
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(harness_->decode(0).WaitForCancelled(1, absl::Seconds(10)));
}

TEST_F(OpenAiHttpTest, AClientGoneMidStreamCancelsTheDecode) {
  StartAll();
  harness_->decode(0).SetBehaviour({.hold_after = 2});
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt": [1, 5], "max_tokens": 50, "stream": true})";
  req.set_header("Content-Type", "application/json");
  std::string raw;
  req.content_receiver = [&raw](const char* data, size_t n, uint64_t, uint64_t) {
    raw.append(data, n);
    // Hang up once some text arrived.
    return raw.find("\"text\"") == std::string::npos;
  };
  httplib::Result r = Client()->send(req);
  EXPECT_FALSE(r);  // Cancelled by the receiver.
  EXPECT_THAT(raw, HasSubstr("w40"));
  EXPECT_TRUE(harness_->decode(0).WaitForCancelled(1, absl::Seconds(10)));
  EXPECT_TRUE(harness_->decode(0).WaitForNoStreams(absl::Seconds(10)));
}

TEST_F(OpenAiHttpTest, StopWaitsForOpenStreamsToEnd) {
  StartAll();
  harness_->decode(0).SetBehaviour({.hold_after = 2});
  std::atomic<bool> got_text{false};
  std::string raw;
  std::thread client([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = R"({"prompt": [1, 5], "max_tokens": 50, "stream": true})";
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      raw.append(data, n);
      if (raw.find("\"text\"") != std::string::npos) got_text = true;
      return true;
    };
    Client()->send(req);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!got_text && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(got_text);
  EXPECT_EQ(http_->active(), 1);
  std::thread stopper([&] { http_->Stop(absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(http_->active(), 1);  // Stop is waiting for the stream.
  const absl::Time cancel = absl::Now();
  harness_->core().CancelAll();  // What main does when the drain times out.
  stopper.join();
  client.join();
  EXPECT_LT(absl::Now() - cancel, absl::Seconds(5));
  const SseResult r = ParseSse(raw);
  EXPECT_TRUE(r.done) << raw;
  ASSERT_FALSE(r.events.empty());
  EXPECT_TRUE(r.events.back().contains("error")) << raw;
}

TEST_F(OpenAiHttpTest, ModelsHealthAndUnknownPaths) {
  StartAll();
  auto client = Client();
  httplib::Result models = client->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "tandem-test");
  EXPECT_EQ(m["data"][0]["object"], "model");

  httplib::Result health = client->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok");

  httplib::Result unknown = client->Get("/v1/chat/nothing");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_THAT(unknown->body, HasSubstr("/v1/completions"));

  http_->SetServing(false);
  health = client->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
}

TEST_F(OpenAiHttpTest, DrainingRouterIs503) {
  StartAll();
  harness_->core().StartDraining();
  const auto [status, j] = Post(R"({"prompt": [1, 5], "max_tokens": 2})");
  EXPECT_EQ(status, 503) << j.dump();
  EXPECT_EQ(j["error"]["code"], "unavailable");
}

TEST_F(OpenAiHttpTest, TheListenAddressIsChecked) {
  StartAll();
  OpenAiHttpOptions options;
  options.listen = "no-port";
  absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> bad = OpenAiHttpServer::Start(
      rpc::MakeChannel(absl::StrCat("127.0.0.1:", harness_->port())), options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  options.listen = absl::StrCat("127.0.0.1:", http_->port());  // Taken.
  bad = OpenAiHttpServer::Start(rpc::MakeChannel(absl::StrCat("127.0.0.1:", harness_->port())),
                                options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
}

// A real tokenizer: the HTTP text is what the gRPC API returns.
TEST_F(OpenAiHttpTest, TextPromptWithTheRealTokenizerMatchesGrpc) {
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(tokenizer_path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.tokenizer = tokenizer->get();
  options.vocab_size = (*tokenizer)->vocab_size();
  StartAll(options);
  const std::string prompt = "Once upon a time";
  const auto [status, j] =
      Post(absl::StrCat(R"({"prompt": ")", prompt, R"(", "max_tokens": 5, "temperature": 0})"));
  ASSERT_EQ(status, 200) << j.dump();
  v1::GenerateRequest request;
  request.set_text(prompt);
  request.set_max_tokens(5);
  const Result grpc = harness_->Run(request);
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  EXPECT_EQ(j["choices"][0]["text"], grpc.text);
  EXPECT_EQ(j["usage"]["prompt_tokens"], grpc.finished.usage().prompt_tokens());
  const SseResult r =
      PostStream(absl::StrCat(R"({"prompt": ")", prompt, R"(", "max_tokens": 5, "stream": true})"));
  ASSERT_TRUE(r.done) << r.raw;
  std::string text;
  for (const json& e : r.events) text += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, grpc.text);
}

// Chat: the router renders "<s> w7 w8 </s> w9" with kFakeChatTemplate, so
// the prompt is [BOS, 7, 8, EOS, 9] (5 tokens).
constexpr char kChatBody[] = R"("messages": [{"role": "user", "content": "w7 w8"}])";

TEST_F(OpenAiHttpTest, NonStreamingChatCompletion) {
  StartChat();
  const auto [status, j] =
      Post(absl::StrCat("{", kChatBody, R"(, "max_tokens": 3})"), "/v1/chat/completions");
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_THAT(j["id"].get<std::string>(), ::testing::StartsWith("chatcmpl-"));
  EXPECT_EQ(j["model"], "tandem-test");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], " w40 w20 w21");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
}

TEST_F(OpenAiHttpTest, StreamingChatSendsRoleThenContentThenFinish) {
  StartChat();
  const SseResult r = PostStream(absl::StrCat("{", kChatBody, R"(, "max_tokens": 3, "stream": true,
                              "model": "asked"})"),
                                 "/v1/chat/completions");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_THAT(r.content_type, HasSubstr("text/event-stream"));
  EXPECT_TRUE(r.done) << r.raw;
  ASSERT_GE(r.events.size(), 3u) << r.raw;
  EXPECT_EQ(r.events[0]["choices"][0]["delta"], json({{"role", "assistant"}})) << r.raw;
  std::string text;
  for (size_t i = 0; i < r.events.size(); ++i) {
    const json& e = r.events[i];
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], r.events[0]["id"]);
    EXPECT_EQ(e["model"], "asked");
    if (i == 0 || i + 1 == r.events.size()) continue;
    EXPECT_TRUE(e["choices"][0]["finish_reason"].is_null()) << e.dump();
    EXPECT_FALSE(e["choices"][0]["delta"].contains("role")) << e.dump();
    text += e["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, " w40 w20 w21");
  const json& last = r.events.back();
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(last["usage"]["completion_tokens"], 3);
}

TEST_F(OpenAiHttpTest, ChatContentPartsAreConcatenated) {
  StartChat();
  const auto [status, j] = Post(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "w7"},
          {"type": "text", "text": " w8"}]}], "max_tokens": 1})",
      "/v1/chat/completions");
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["message"]["content"], " w40");
}

TEST_F(OpenAiHttpTest, ChatErrorsAre400WithTheReason) {
  StartChat();
  const std::vector<std::pair<std::string, std::string>> cases = {
      // The template's own message.
      {R"({"messages": [{"role": "user", "content": "w7"}, {"role": "user", "content": "w8"}]})",
       "roles must alternate"},
      {R"({"messages": [{"role": "robot", "content": "w7"}]})", "role 'robot'"},
      {R"({"messages": []})", "messages is empty"},
      {R"({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]})",
       "'input_audio'"},
      {absl::StrCat("{", kChatBody, R"(, "max_tokens": 0})"), "max_tokens"},
      {absl::StrCat("{", kChatBody, R"(, "n": 3})"), "`n`"},
  };
  for (const auto& [body, reason] : cases) {
    const auto [status, j] = Post(body, "/v1/chat/completions");
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << body;
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(reason)) << body;
  }
  // The same for a stream: refused before any event.
  const auto [stream_status, stream_error] =
      Post(R"({"messages": [{"role": "robot", "content": "w7"}], "stream": true})",
           "/v1/chat/completions");
  EXPECT_EQ(stream_status, 400) << stream_error.dump();
  EXPECT_THAT(stream_error["error"]["message"].get<std::string>(), HasSubstr("role 'robot'"));
  // A chat longer than the model's context.
  std::string long_chat;
  for (int i = 0; i < kFakeMaxContext; ++i) long_chat += " w5";
  const auto [status, j] =
      Post(absl::StrCat(R"({"messages": [{"role": "user", "content": ")", long_chat, R"("}]})"),
           "/v1/chat/completions");
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("context"));
}

}  // namespace
}  // namespace tandem::router::testing
