// Extreme values of every number a client controls, through the real
// router core: over gRPC (RouterService) and over HTTP (the OpenAI routes on
// the Beast server), both in front of fake workers. Each is refused with
// INVALID_ARGUMENT / 400 naming the field, or served when it is a legal
// value, and none overflows an integer: built with the asan preset
// (-fsanitize=undefined), an overflow fails the test.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/chat_template.h"
#include "common/http/http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/api_keys.h"
#include "router/openai_routes.h"
#include "router/routing_policy.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/http_test_client.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router::testing {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr float kFloatMax = std::numeric_limits<float>::max();

// A template the harness's FakeTokenizer can encode (the router's default
// one writes role names, which are not fake tokens).
const ChatTemplate* FakeChatTemplate() {
  static const ChatTemplate* const t =
      new ChatTemplate(*ChatTemplate::FromString(kFakeChatTemplate, "<s>", "</s>"));
  return t;
}

std::unique_ptr<RouterHarness> StartHarness() {
  HarnessOptions options;
  options.prefill = 1;
  options.decode = 1;
  options.chat_template = FakeChatTemplate();
  auto h = std::make_unique<RouterHarness>(std::move(options));
  const absl::Status s = h->Start();
  EXPECT_OK(s);
  return s.ok() ? std::move(h) : nullptr;
}

v1::GenerateRequest Plain() { return TokenRequest({1, 5, 6}, 3); }

TEST(RouterLimitsTest, ExtremeGrpcFieldsAreInvalidArgumentNamingTheField) {
  auto h = StartHarness();
  ASSERT_NE(h, nullptr);
  struct Case {
    v1::GenerateRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({TokenRequest({1, 5, 6}, kInt32Max), "lower max_tokens to at most 125"});
  cases.push_back({TokenRequest({1, 5, 6}, kInt32Min), "max_tokens is -2147483648"});
  {
    v1::GenerateRequest r = Plain();
    r.set_n(kInt32Max);
    cases.push_back({r, "n is 2147483647"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.set_n(kInt32Min);
    cases.push_back({r, "n is -2147483648"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.set_logprobs(kInt32Max);
    cases.push_back({r, "logprobs is 2147483647"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.set_logprobs(kInt32Min);
    cases.push_back({r, "logprobs is -2147483648"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.set_timeout_ms(kInt64Min);
    cases.push_back({r, "timeout_ms"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.set_priority(kInt32Max);
    cases.push_back({r, "priority"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.mutable_sampling()->set_min_tokens(kInt32Max);
    cases.push_back({r, "min_tokens is 2147483647"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.mutable_sampling()->set_min_tokens(kInt32Min);
    cases.push_back({r, "min_tokens is -2147483648"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.mutable_sampling()->set_top_k(kInt32Min);
    cases.push_back({r, "top_k"});
  }
  cases.push_back({TokenRequest({kInt32Max, kInt32Max}, 3), "prompt token 0 is 2147483647"});
  cases.push_back({TokenRequest({1, kInt32Min}, 3), "prompt token 1 is -2147483648"});
  cases.push_back(
      {TokenRequest(std::vector<int32_t>(kMaxPromptTokenIds + 1, 5), 3), "1048577 token ids"});
  {
    v1::GenerateRequest r = Plain();
    (*r.mutable_sampling()->mutable_logit_bias())[kInt32Max] = 1.0f;
    cases.push_back({r, "logit_bias names token 2147483647"});
  }
  {
    v1::GenerateRequest r = Plain();
    (*r.mutable_sampling()->mutable_logit_bias())[kInt32Min] = 1.0f;
    cases.push_back({r, "logit_bias names token -2147483648"});
  }
  for (float bias : {kFloatMax, -kFloatMax, std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::quiet_NaN()}) {
    v1::GenerateRequest r = Plain();
    (*r.mutable_sampling()->mutable_logit_bias())[5] = bias;
    cases.push_back({r, "logit_bias value"});
  }
  {
    v1::GenerateRequest r = Plain();
    for (int i = 0; i <= kMaxLogitBias; ++i) {
      (*r.mutable_sampling()->mutable_logit_bias())[kInt32Max - i] = kFloatMax;
    }
    cases.push_back({r, "logit_bias has 1025 entries"});
  }
  for (float t : {kFloatMax, std::numeric_limits<float>::infinity()}) {
    v1::GenerateRequest r = Plain();
    r.mutable_sampling()->set_temperature(t);
    r.mutable_sampling()->set_presence_penalty(t);
    cases.push_back({r, t == kFloatMax ? "presence_penalty" : "temperature"});
  }
  {
    v1::GenerateRequest r = Plain();
    r.mutable_sampling()->set_repetition_penalty(std::numeric_limits<float>::infinity());
    cases.push_back({r, "repetition_penalty"});
  }
  for (const Case& c : cases) {
    const Result r = h->Run(c.request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(r.status.error_message(), HasSubstr(c.message));
    EXPECT_TRUE(r.messages.empty());
  }
  EXPECT_TRUE(h->decode(0).requests().empty());
  EXPECT_TRUE(h->prefill(0).requests().empty());
  const Result ok = h->Run(Plain());
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST(RouterLimitsTest, ExtremeButLegalGrpcFieldsAreServed) {
  auto h = StartHarness();
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest r = Plain();
  r.set_timeout_ms(kInt64Max);  // the call's own deadline wins
  r.mutable_sampling()->set_top_k(kInt32Max);
  r.mutable_sampling()->set_seed(std::numeric_limits<uint64_t>::max());
  (*r.mutable_sampling()->mutable_logit_bias())[kFakeVocab - 1] = -kMaxLogitBiasValue;
  r.set_n(kMaxChoices);
  r.set_logprobs(kMaxTopLogprobs);
  const Result ok = h->Run(r);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.finished.usage().prompt_tokens(), 3);
  ASSERT_EQ(h->decode(0).requests().size(), 1u);
  EXPECT_EQ(h->decode(0).requests()[0].n(), kMaxChoices);
  // max_tokens 0 fills what the context leaves, no more.
  const Result fill = h->Run(TokenRequest({1, 5, 6}, 0));
  ASSERT_TRUE(fill.status.ok()) << fill.status.error_message();
  EXPECT_EQ(h->decode(0).requests().back().max_tokens(), kFakeMaxContext - 3);
}

// The OpenAI routes on an HttpServer over the harness's real core.
class HttpLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    harness_ = StartHarness();
    ASSERT_NE(harness_, nullptr);
    absl::StatusOr<ApiKeys> keys = ApiKeys::Create({}, "");
    ASSERT_OK(keys.status());
    routes_ =
        std::make_unique<OpenAiRoutes>(&harness_->core(), *std::move(keys), OpenAiRoutesOptions{});
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start(HttpServerOptions{}, routes_->Handler());
    ASSERT_OK(server.status());
    server_ = *std::move(server);
  }
  void TearDown() override { server_.reset(); }

  HttpResponse Post(absl::string_view path, absl::string_view body,
                    const std::vector<std::string>& headers = {}) {
    absl::StatusOr<std::unique_ptr<RawConnection>> c = RawConnection::Connect(server_->port());
    EXPECT_OK(c.status());
    if (!c.ok()) return {};
    EXPECT_TRUE((*c)->Send(Request("POST", path, body, headers)));
    absl::StatusOr<HttpResponse> r = (*c)->ReadResponse();
    EXPECT_OK(r.status());
    return r.ok() ? *std::move(r) : HttpResponse{};
  }

  static std::string ErrorMessage(const HttpResponse& r) {
    const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("error") || !j["error"].contains("message")) return r.body;
    return j["error"]["message"].get<std::string>();
  }

  std::unique_ptr<RouterHarness> harness_;
  std::unique_ptr<OpenAiRoutes> routes_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpLimitsTest, ExtremeFieldsAre400NamingTheField) {
  struct Case {
    const char* path;
    std::string body;
    std::string message;
  };
  const std::string c = "/v1/completions";
  const std::string chat = "/v1/chat/completions";
  const std::string messages = R"("messages": [{"role": "user", "content": "w5"}])";
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": [1, 5], "max_tokens": 2147483647})",
       "lower max_tokens to at most 126"},
      {"/v1/completions", R"({"prompt": [1, 5], "max_tokens": 2147483647, "stream": true})",
       "lower max_tokens to at most 126"},
      {"/v1/completions", R"({"prompt": [1, 5], "max_tokens": 2147483648})", "`max_tokens`"},
      {"/v1/completions", R"({"prompt": [1, 5], "max_tokens": -2147483648})",
       "`max_tokens` is -2147483648; it must be in [1, 2147483647]"},
      {"/v1/completions", R"({"prompt": [1, 5], "max_tokens": 18446744073709551615})",
       "`max_tokens`"},
      {"/v1/completions", R"({"prompt": [1, 5], "max_tokens": -9223372036854775808})",
       "`max_tokens`"},
      {"/v1/completions", R"({"prompt": [1, 5], "max_tokens": 1e300})",
       "`max_tokens` is 1e+300; it must be an integer in [1, 2147483647]"},
      // The parser's message quotes the byte it read: the error body stays
      // valid JSON.
      {"/v1/completions", "{\"prompt\": \"\xff\"}", "ill-formed UTF-8 byte"},
      {"/v1/completions", R"({"prompt": [1, 5], "n": 2147483647})", "`n`"},
      {"/v1/completions", R"({"prompt": [1, 5], "best_of": 2147483647})", "`best_of`"},
      {"/v1/completions", R"({"prompt": [1, 5], "logprobs": 2147483647})", "`logprobs`"},
      {"/v1/completions", R"({"prompt": [1, 5], "min_tokens": 2147483647, "max_tokens": 3})",
       "min_tokens is 2147483647"},
      {"/v1/completions", R"({"prompt": [1, 5], "top_k": 9223372036854775807})", "`top_k`"},
      {"/v1/completions", R"({"prompt": [2147483647, 5]})", "prompt token 0 is 2147483647"},
      {"/v1/completions", R"({"prompt": [1, 2147483648]})", "prompt[1]"},
      {"/v1/completions", R"({"prompt": [1, -2147483649]})", "prompt[1]"},
      {"/v1/completions", R"({"prompt": [1, 5], "logit_bias": {"2147483647": 1}})",
       "logit_bias names token 2147483647"},
      {"/v1/completions", R"({"prompt": [1, 5], "logit_bias": {"2147483648": 1}})",
       "`logit_bias` key '2147483648'"},
      {"/v1/completions", R"({"prompt": [1, 5], "logit_bias": {"-2147483648": 1}})",
       "logit_bias names token -2147483648"},
      {"/v1/completions", R"({"prompt": [1, 5], "logit_bias": {"5": 1e300}})", "logit_bias"},
      {"/v1/completions", R"({"prompt": [1, 5], "logit_bias": {"5": 3.4e38}})", "logit_bias value"},
      {"/v1/completions", R"({"prompt": [1, 5], "temperature": 1e300})", "temperature"},
      {"/v1/completions", R"({"prompt": [1, 5], "presence_penalty": -3.4e38})", "presence_penalty"},
      {"/v1/chat/completions", absl::StrCat("{", messages, R"(, "max_tokens": 2147483647})"),
       "max_tokens"},
      {"/v1/chat/completions",
       absl::StrCat("{", messages, R"(, "max_completion_tokens": 2147483647, "stream": true})"),
       "max_tokens"},
      {"/v1/chat/completions", absl::StrCat("{", messages, R"(, "n": 2147483647})"), "`n`"},
      {"/v1/chat/completions",
       absl::StrCat("{", messages, R"(, "logprobs": true, "top_logprobs": 2147483647})"),
       "`top_logprobs`"},
      {"/v1/chat/completions",
       absl::StrCat("{", messages, R"(, "logit_bias": {"2147483647": 3.4e38}})"), "logit_bias"},
  };
  for (const Case& k : cases) {
    const HttpResponse r = Post(k.path, k.body);
    EXPECT_EQ(r.status, 400) << k.body << " -> " << r.body;
    EXPECT_THAT(ErrorMessage(r), HasSubstr(k.message)) << k.body;
  }
  EXPECT_TRUE(harness_->decode(0).requests().empty());
  const HttpResponse ok = Post(c, R"({"prompt": [1, 5], "max_tokens": 2, "top_k": 2147483647,
                                     "seed": 18446744073709551615})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  const HttpResponse ok_chat = Post(chat, absl::StrCat("{", messages, "}"));
  EXPECT_EQ(ok_chat.status, 200) << ok_chat.body;
}

TEST_F(HttpLimitsTest, HugeContentLengthIsRefusedBeforeTheBody) {
  absl::StatusOr<std::unique_ptr<RawConnection>> c = RawConnection::Connect(server_->port());
  ASSERT_OK(c.status());
  ASSERT_TRUE((*c)->Send(absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                                      "Content-Type: application/json\r\n",
                                      "Content-Length: 9223372036854775807\r\n\r\n{")));
  absl::StatusOr<HttpResponse> r = (*c)->ReadResponse();
  ASSERT_OK(r.status());
  EXPECT_EQ(r->status, 413);
}

TEST(RoutingLimitsTest, BlocksAndPicksDoNotOverflow) {
  EXPECT_EQ(BlocksFor(kInt32Max, 16), 134217728);
  EXPECT_EQ(BlocksFor(kInt32Max, 1), kInt32Max);
  EXPECT_EQ(BlocksFor(kInt32Max, kInt32Max), 1);
  WorkerSnapshot a;
  a.address = "a";
  a.healthy = true;
  a.block_size = 16;
  a.kv_blocks_free = kInt32Min;  // a faulty worker's stats
  a.reserved_blocks = kInt32Max;
  a.running = kInt32Max;
  a.waiting = kInt32Max;
  WorkerSnapshot b = a;
  b.address = "b";
  b.kv_blocks_free = 10;
  // A decode worker whose context is unknown lets max_tokens reach
  // INT32_MAX: prompt plus completion passes INT32_MAX.
  const std::optional<Pick> pick = PickDecodeWorker({a, b}, kInt32Max, kInt32Max);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  EXPECT_THAT(pick->reason, HasSubstr("134217728 wanted"));
  a.role = b.role = WorkerRole::kPrefill;
  a.inflight = kInt32Max;
  b.waiting = 0;
  const std::optional<Pick> prefill = PickPrefillWorker({a, b});
  ASSERT_TRUE(prefill.has_value());
  EXPECT_EQ(prefill->address, "b");
}

}  // namespace
}  // namespace tandem::router::testing
