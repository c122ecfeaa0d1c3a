// The OpenAI routes (router/openai_routes.h) on a real HttpServer over a
// FakeCore: what a client sends reaches the core as GenerateParams, the
// core's events come back in OpenAI's shapes, and a client that leaves
// cancels its request.
#include "router/openai_routes.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/http/http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/router/fake_core.h"
#include "tests/unit/router/http_test_client.h"

namespace tandem::router::testing {
namespace {

using ::nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Answers every request with "hi" per choice (and an echo when asked),
// finishing with EOS, or NOT_FOUND for a model other than fake-model.
void HelloScript(const GenerateParams& p, ResponseSink& sink) {
  if (!p.model.empty() && p.model != "fake-model") {
    sink.OnDone(absl::NotFoundError(absl::StrCat("the model '", p.model, "' is not served")));
    return;
  }
  if (p.echo) {
    GenerateEvent echo;
    echo.kind = GenerateEvent::Kind::kEcho;
    echo.token_ids = {kFakeBos, 'P'};
    echo.text = "P";
    if (p.logprobs.has_value())
      echo.logprobs = {{.token_id = 'P', .logprob = -1.5f, .token = "P", .top = {}}};
    sink.OnEvent(echo);
  }
  for (int i = 0; i < p.n; ++i) {
    std::vector<TokenLogprob> lps;
    if (p.logprobs.has_value()) {
      lps = {{.token_id = 'h', .logprob = -0.5f, .token = "h", .top = {{'h', -0.5f, "h"}}},
             {.token_id = 'i', .logprob = -0.25f, .token = "i", .top = {{'i', -0.25f, "i"}}}};
    }
    sink.OnEvent(TokensEvent(i, "hi", std::move(lps)));
    sink.OnEvent(FinishedEvent(i, FinishReason::kEos, 3, 2));
  }
  sink.OnDone(absl::OkStatus());
}

class OpenAiRoutesTest : public ::testing::Test {
 protected:
  void Start(OpenAiRoutesOptions options = {}, std::vector<std::string> keys = {},
             HttpServerOptions http = {}) {
    absl::StatusOr<ApiKeys> api_keys = ApiKeys::Create(keys, "");
    ASSERT_TRUE(api_keys.ok());
    options.version = "1.2.3";
    routes_ = std::make_unique<OpenAiRoutes>(&core_, *std::move(api_keys), std::move(options));
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start(std::move(http), routes_->Handler());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override { server_.reset(); }

  std::unique_ptr<RawConnection> Connect() {
    absl::StatusOr<std::unique_ptr<RawConnection>> c = RawConnection::Connect(server_->port());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  HttpResponse Call(absl::string_view method, absl::string_view path, absl::string_view body = "",
                    const std::vector<std::string>& headers = {}) {
    std::unique_ptr<RawConnection> c = Connect();
    if (c == nullptr) return {};
    EXPECT_TRUE(c->Send(Request(method, path, body, headers)));
    absl::StatusOr<HttpResponse> r = c->ReadResponse();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : HttpResponse{};
  }

  static json Json(const HttpResponse& r) {
    json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << r.body;
    return j;
  }

  // The JSON payloads of an SSE body; [DONE] as a string.
  static std::vector<json> Events(const std::string& body) {
    std::vector<json> out;
    for (absl::string_view e : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
      EXPECT_TRUE(absl::ConsumePrefix(&e, "data: ")) << e;
      out.push_back(e == "[DONE]" ? json("[DONE]") : json::parse(e));
    }
    return out;
  }

  FakeCore core_;
  std::unique_ptr<OpenAiRoutes> routes_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(OpenAiRoutesTest, CompletionWithChoicesReachesTheCoreAndComesBack) {
  core_.SetScript(HelloScript);
  Start();
  HttpResponse r = Call("POST", "/v1/completions",
                        R"({"prompt": "P", "n": 2, "seed": 7, "presence_penalty": 0.5,
                            "logit_bias": {"5": 1}, "min_tokens": 1, "ignore_eos": true,
                            "user": "me"})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("Content-Type"), "application/json");
  const json j = Json(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "cmpl-"));
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["text"], "hi");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][1]["logprobs"], nullptr);
  EXPECT_EQ(j["usage"], json::parse(R"({"prompt_tokens": 3, "completion_tokens": 4,
                                        "total_tokens": 7,
                                        "prompt_tokens_details": {"cached_tokens": 0}})"));
  const std::vector<GenerateParams> submitted = core_.submitted();
  ASSERT_EQ(submitted.size(), 1u);
  const GenerateParams& p = submitted[0];
  EXPECT_EQ(p.request_id, j["id"]);
  EXPECT_EQ(p.text, "P");
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(*p.seed, 7u);
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
  EXPECT_EQ(p.logit_bias.size(), 1u);
  EXPECT_EQ(p.min_tokens, 1);
  EXPECT_TRUE(p.ignore_eos);
}

TEST_F(OpenAiRoutesTest, EchoWithLogprobs) {
  core_.SetScript(HelloScript);
  Start();
  HttpResponse r = Call("POST", "/v1/completions",
                        R"({"prompt": "P", "echo": true, "logprobs": 1, "max_tokens": 2})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json lp = Json(r)["choices"][0]["logprobs"];
  EXPECT_EQ(Json(r)["choices"][0]["text"], "Phi");
  // The BOS detokenizes to "" through the core.
  EXPECT_EQ(lp["tokens"], json::parse(R"(["", "P", "h", "i"])"));
  EXPECT_EQ(lp["token_logprobs"], json::parse(R"([null, -1.5, -0.5, -0.25])"));
  EXPECT_EQ(lp["top_logprobs"][2], json::parse(R"({"h": -0.5})"));
  EXPECT_EQ(lp["text_offset"], json::parse("[0, 0, 1, 2]"));
}

TEST_F(OpenAiRoutesTest, ChatStreamWithUsageAndLogprobs) {
  core_.SetScript(HelloScript);
  Start();
  HttpResponse r = Call("POST", "/v1/chat/completions",
                        R"({"messages": [{"role": "user", "content": "P"}], "stream": true,
                            "n": 2, "logprobs": true, "top_logprobs": 1,
                            "stream_options": {"include_usage": true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("Content-Type"), "text/event-stream");
  const std::vector<json> events = Events(r.body);
  // 2 role chunks, then per choice a content chunk and a finish chunk,
  // the usage chunk and [DONE].
  ASSERT_EQ(events.size(), 8u) << r.body;
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events[1]["choices"][0]["index"], 1);
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], "hi");
  const json& content = events[2]["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "h");
  EXPECT_EQ(content[0]["bytes"], json::parse("[104]"));
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "h");
  EXPECT_EQ(events[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[4]["choices"][0]["index"], 1);
  EXPECT_EQ(events[6]["choices"], json::array());
  EXPECT_EQ(events[6]["usage"]["completion_tokens"], 4);
  EXPECT_EQ(events[7], "[DONE]");
  const GenerateParams p = core_.submitted().at(0);
  ASSERT_TRUE(p.messages.has_value());
  EXPECT_EQ((*p.messages)[0].content, "P");
  EXPECT_EQ(*p.logprobs, 1);
}

TEST_F(OpenAiRoutesTest, ChatNotStreamed) {
  core_.SetScript(HelloScript);
  Start();
  HttpResponse r = Call("POST", "/v1/chat/completions",
                        R"({"model": "fake-model", "messages": [{"role": "user", "content": "x"}],
                            "max_completion_tokens": 5})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = Json(r);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"], json::parse(R"({"role": "assistant", "content": "hi"})"));
  EXPECT_EQ(*core_.submitted().at(0).max_tokens, 5);
}

TEST_F(OpenAiRoutesTest, ErrorsHaveTheirStatusAndOpenAiShape) {
  core_.SetScript(HelloScript);
  Start({}, {}, {.max_body_bytes = 1000});
  // An unknown model: the core's NOT_FOUND, streamed or not.
  HttpResponse r = Call("POST", "/v1/completions", R"({"prompt": "x", "model": "gpt-4"})");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Json(r)["error"]["code"], "not_found");
  r = Call("POST", "/v1/completions", R"({"prompt": "x", "model": "gpt-4", "stream": true})");
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(Json(r)["error"]["message"].get<std::string>(), HasSubstr("gpt-4"));
  // An unsupported field, named.
  r = Call("POST", "/v1/completions", R"({"prompt": "x", "guided_regex": "a+"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["type"], "invalid_request_error");
  EXPECT_THAT(Json(r)["error"]["message"].get<std::string>(), HasSubstr("guided_regex"));
  // A POST without a body is answered at once.
  {
    std::unique_ptr<RawConnection> c = Connect();
    ASSERT_TRUE(c->Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"));
    absl::StatusOr<HttpResponse> empty = c->ReadResponse();
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_EQ(empty->status, 400);
    EXPECT_THAT(empty->body, HasSubstr("empty"));
  }
  // A body over the limit.
  r = Call("POST", "/v1/completions",
           absl::StrCat(R"({"prompt": ")", std::string(2000, 'a'), "\"}"));
  EXPECT_EQ(r.status, 413);
  // No such route; a wrong method.
  r = Call("GET", "/v1/engines");
  EXPECT_EQ(r.status, 404);
  r = Call("GET", "/v1/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(core_.submitted().size(), 2u);
}

// HEAD is GET without a body; every response names its request.
TEST_F(OpenAiRoutesTest, HeadAnswersAsGetWithoutABody) {
  Start();
  for (const char* path : {"/health", "/v1/models", "/version"}) {
    std::unique_ptr<RawConnection> c = Connect();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->Send(Request("HEAD", path)));
    absl::StatusOr<HttpResponse> head = c->ReadResponse(/*head=*/true);
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->status, 200) << path;
    const HttpResponse get = Call("GET", path);
    EXPECT_EQ(head->Header("Content-Length"), absl::StrCat(get.body.size())) << path;
    // No body followed: the connection serves the next request at once.
    ASSERT_TRUE(c->Send(Request("GET", path)));
    absl::StatusOr<HttpResponse> next = c->ReadResponse();
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->status, 200);
    EXPECT_EQ(next->body, get.body) << path;
  }
  HttpResponse r = Call("POST", "/health");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.Header("Allow"), "GET, HEAD");
  EXPECT_EQ(Call("GET", "/v1/completions").Header("Allow"), "GET, HEAD, POST, OPTIONS");
}

TEST_F(OpenAiRoutesTest, EveryResponseCarriesARequestId) {
  core_.SetScript(HelloScript);
  Start({}, {}, {.max_body_bytes = 1000});
  // A generation's id is its completion's id, and the request id it is
  // logged under.
  HttpResponse r = Call("POST", "/v1/completions", R"({"prompt": "x"})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("X-Request-Id"), Json(r)["id"]);
  ASSERT_EQ(core_.submitted().size(), 1u);
  EXPECT_EQ(core_.submitted()[0].request_id, Json(r)["id"]);
  // The client's own id wins; the completion keeps its id.
  r = Call("POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}]})",
           {"X-Request-Id: trace-42.a:b_c"});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("X-Request-Id"), "trace-42.a:b_c");
  EXPECT_TRUE(absl::StartsWith(Json(r)["id"].get<std::string>(), "chatcmpl-"));
  EXPECT_EQ(core_.submitted()[1].request_id, "trace-42.a:b_c");
  // Errors and other routes carry one too.
  r = Call("GET", "/v1/engines");
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(absl::StartsWith(r.Header("X-Request-Id"), "req-")) << r.Header("X-Request-Id");
  EXPECT_FALSE(Call("GET", "/v1/models").Header("X-Request-Id").empty());
  // An id the logs could not carry is refused, saying what to send.
  r = Call("POST", "/v1/completions", R"({"prompt": "x"})", {"X-Request-Id: a b"});
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(Json(r)["error"]["message"].get<std::string>(), HasSubstr("X-Request-Id"));
  r = Call("POST", "/v1/completions", R"({"prompt": "x"})",
           {absl::StrCat("X-Request-Id: ", std::string(129, 'a'))});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(core_.submitted().size(), 2u);
  // The server's own errors have the shape of the router's.
  r = Call("POST", "/v1/completions",
           absl::StrCat(R"({"prompt": ")", std::string(2000, 'a'), "\"}"));
  EXPECT_EQ(r.status, 413);
  const json error = Json(r)["error"];
  EXPECT_TRUE(error.contains("param") && error["param"].is_null()) << r.body;
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_TRUE(error["message"].is_string() && error["code"].is_string()) << r.body;
}

TEST_F(OpenAiRoutesTest, ApiKeysGuardEveryRouteButHealth) {
  core_.SetScript(HelloScript);
  Start({}, {"sk-right"});
  const std::string body = R"({"prompt": "x"})";
  HttpResponse r = Call("POST", "/v1/completions", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(Json(r)["error"]["type"], "authentication_error");
  EXPECT_EQ(r.Header("WWW-Authenticate"), "Bearer");
  r = Call("POST", "/v1/completions", body, {"Authorization: Bearer sk-wrong"});
  EXPECT_EQ(r.status, 401);
  r = Call("GET", "/v1/models", "", {"Authorization: Bearer sk-wrong"});
  EXPECT_EQ(r.status, 401);
  r = Call("POST", "/v1/completions", body, {"Authorization: Bearer sk-right"});
  EXPECT_EQ(r.status, 200);
  r = Call("GET", "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(core_.submitted().size(), 1u);
}

TEST_F(OpenAiRoutesTest, ModelsVersionHealthAndTokenizer) {
  Start();
  HttpResponse r = Call("GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(Json(r)["data"][0]["id"], "fake-model");
  EXPECT_EQ(Json(r)["data"][0]["created"], 1700000000);
  r = Call("GET", "/v1/models/fake-model");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(Json(r)["object"], "model");
  EXPECT_EQ(Call("GET", "/v1/models/other").status, 404);
  r = Call("GET", "/version");
  EXPECT_EQ(Json(r), json::parse(R"({"version": "1.2.3"})"));
  EXPECT_EQ(Call("GET", "/health").status, 200);
  core_.set_serving(false);
  EXPECT_EQ(Call("GET", "/health").status, 503);

  r = Call("POST", "/tokenize", R"({"prompt": "hi"})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json(r),
            json::parse(R"({"tokens": [256, 104, 105], "count": 3, "max_model_len": 128})"));
  r = Call("POST", "/tokenize", R"({"prompt": "hi", "add_special_tokens": false})");
  EXPECT_EQ(Json(r)["tokens"], json::parse("[104, 105]"));
  r = Call("POST", "/tokenize",
           R"({"messages": [{"role": "u", "content": "x"}], "add_generation_prompt": false})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json(r)["count"], 5);  // "u: x\n"
  r = Call("POST", "/tokenize", R"({"prompt": "hi", "model": "other"})");
  EXPECT_EQ(r.status, 404);
  r = Call("POST", "/detokenize", R"({"tokens": [104, 105]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json(r), json::parse(R"({"prompt": "hi"})"));
  r = Call("POST", "/detokenize", R"({"tokens": [999]})");
  EXPECT_EQ(r.status, 400);
}

TEST_F(OpenAiRoutesTest, Cors) {
  Start({.allowed_origins = {"https://app.example"}});
  HttpResponse r = Call("OPTIONS", "/v1/chat/completions", "",
                        {"Origin: https://app.example", "Access-Control-Request-Method: POST",
                         "Access-Control-Request-Headers: authorization, content-type"});
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.Header("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_THAT(r.Header("Access-Control-Allow-Methods"), HasSubstr("POST"));
  EXPECT_EQ(r.Header("Access-Control-Allow-Headers"), "authorization, content-type");
  r = Call("OPTIONS", "/v1/models", "", {"Origin: https://evil.example"});
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.Header("Access-Control-Allow-Origin"), "");
  r = Call("GET", "/v1/models", "", {"Origin: https://app.example"});
  EXPECT_EQ(r.Header("Access-Control-Allow-Origin"), "https://app.example");
  r = Call("GET", "/v1/models", "", {"Origin: https://evil.example"});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.Header("Access-Control-Allow-Origin"), "");
}

TEST_F(OpenAiRoutesTest, AnyOriginWithStar) {
  Start({.allowed_origins = {"*"}});
  HttpResponse r = Call("GET", "/v1/models", "", {"Origin: http://localhost:3000"});
  EXPECT_EQ(r.Header("Access-Control-Allow-Origin"), "http://localhost:3000");
}

TEST_F(OpenAiRoutesTest, DisconnectMidStreamCancels) {
  Start();
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("POST", "/v1/completions", R"({"prompt": "x", "stream": true})")));
  std::shared_ptr<FakeCore::Call> call = core_.NextCall();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->sink->OnEvent(TokensEvent(0, "first")));
  ASSERT_TRUE(c->ReadUntil("first").ok());
  EXPECT_FALSE(call->handle->cancelled());
  c->Close();
  EXPECT_TRUE(call->handle->WaitCancelled());
  // Later events are refused, and the end goes nowhere.
  EXPECT_FALSE(call->sink->OnEvent(TokensEvent(0, "second")));
  call->sink->OnDone(absl::CancelledError("client gone"));
}

TEST_F(OpenAiRoutesTest, DisconnectWhileNotStreamedCancels) {
  Start();
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("POST", "/v1/chat/completions",
                              R"({"messages": [{"role": "user", "content": "x"}]})")));
  std::shared_ptr<FakeCore::Call> call = core_.NextCall();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->sink->OnEvent(TokensEvent(0, "partial")));
  c->Close();
  EXPECT_TRUE(call->handle->WaitCancelled());
  call->sink->OnDone(absl::CancelledError("client gone"));
}

TEST_F(OpenAiRoutesTest, StreamFailureAfterStartIsAnSseError) {
  Start();
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("POST", "/v1/completions", R"({"prompt": "x", "stream": true})")));
  std::shared_ptr<FakeCore::Call> call = core_.NextCall();
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->sink->OnEvent(TokensEvent(0, "a")));
  call->sink->OnDone(absl::UnavailableError("the decode worker was lost"));
  absl::StatusOr<HttpResponse> r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  const std::vector<json> events = Events(r->body);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1]["error"]["code"], "unavailable");
  EXPECT_EQ(events[2], "[DONE]");
  // The connection stays usable.
  core_.SetScript(HelloScript);
  ASSERT_TRUE(c->Send(Request("GET", "/v1/models")));
  r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
}

}  // namespace
}  // namespace tandem::router::testing
