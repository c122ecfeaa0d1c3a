// RouterService against fake prefill and decode workers over real gRPC: what
// a client's request does: cancels, timeouts, bad input, text prompts and the
// tokenizer, refusals (no worker, admission, draining), stop strings, EOS,
// max_tokens and concurrent streams. Routing over the workers and their
// failures are in router_service_test.cc.
#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/router_service.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/router_harness.h"
#include "tests/unit/router/router_service_fixture.h"

namespace tandem::router::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

TEST(RouterServiceTest, ClientCancelCancelsTheDecodeStream) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.hold_after = 2});
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(30)));
  auto reader = h->stub().Generate(&ctx, TokenRequest({1, 5, 6}, 100));
  v1::GenerateResponse response;
  int tokens = 0;
  while (tokens < 3 && reader->Read(&response)) tokens += response.token_ids_size();
  ASSERT_EQ(tokens, 3);
  ctx.TryCancel();
  EXPECT_TRUE(h->decode(0).WaitForCancelled(1, kWait));
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForRouterIdle(*h));
  EXPECT_TRUE(h->decode(0).WaitForNoStreams(kWait));
}

// A client that goes away after its stream moved cancels the new stream,
// and nothing of the request is left on either worker.
TEST(RouterServiceTest, ClientCancelAfterAMigrationCancelsTheNewStream) {
  auto h = StartHarness({.prefill = 1, .decode = 2});
  ASSERT_NE(h, nullptr);
  const int bad = h->FirstDecode();
  h->decode(bad).SetBehaviour({.fail_after = 2});
  h->decode(1 - bad).SetBehaviour({.hold_after = 1});
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(30)));
  auto reader = h->stub().Generate(&ctx, TokenRequest({1, 5, 6}, 100));
  v1::GenerateResponse response;
  std::vector<int32_t> tokens;
  while (tokens.size() < 4 && reader->Read(&response)) {
    tokens.insert(tokens.end(), response.token_ids().begin(), response.token_ids().end());
  }
  // The prefill worker's first token, two from the lost worker, then the
  // new worker's first: the script goes on where it was.
  ASSERT_THAT(tokens, ElementsAre(40, 20, 21, 22));
  ctx.TryCancel();
  EXPECT_TRUE(h->decode(1 - bad).WaitForCancelled(1, kWait));
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForRouterIdle(*h));
  EXPECT_TRUE(h->decode(1 - bad).WaitForNoStreams(kWait));
  EXPECT_TRUE(h->decode(bad).WaitForNoStreams(kWait));
}

TEST(RouterServiceTest, ClientCancelDuringPrefillCancelsPrefillAndReservation) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->prefill(0).SetBehaviour({.hold = true});
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(30)));
  auto reader = h->stub().Generate(&ctx, TokenRequest({1, 5, 6}, 10));
  // Wait until the prefill worker holds the request, then go away.
  const absl::Time deadline = absl::Now() + kWait;
  while (h->prefill(0).requests().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(h->prefill(0).requests().size(), 1u);
  ctx.TryCancel();
  EXPECT_TRUE(h->prefill(0).WaitForCancelled(1, kWait));
  EXPECT_TRUE(h->decode(0).WaitForCancelled(1, kWait));
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForRouterIdle(*h));
  // No retry after the client left.
  EXPECT_EQ(h->decode(0).requests().size(), 1u);
}

TEST(RouterServiceTest, RequestTimeoutIsDeadlineExceededAndFreesTheStream) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.hold_after = 1});
  v1::GenerateRequest request = TokenRequest({1, 5, 6}, 100);
  request.set_timeout_ms(300);
  const Result r = h->Run(request);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(r.status.error_message(), HasSubstr("timeout_ms"));
  // The prefill's token and one decode token come, then the worker holds;
  // on a loaded machine the timeout may pass before they arrive, so only
  // their order is certain.
  ASSERT_LE(r.tokens.size(), 2u);
  const std::vector<int32_t> sent = {40, 20};
  EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), sent.begin())) << r.tokens.size();
  EXPECT_TRUE(h->decode(0).WaitForNoStreams(kWait));
}

TEST(RouterServiceTest, RouterRequestTimeoutAppliesWithoutTimeoutMs) {
  HarnessOptions options = {.prefill = 0, .decode = 1};
  options.router.driver.request_timeout = absl::Milliseconds(300);
  auto h = StartHarness(options);
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.hold_after = 0});
  // The client's own deadline (20 s) is the later one; the message says
  // which one ran out.
  const Result r = h->Run(TokenRequest({1, 5, 6}, 100));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(r.status.error_message(), HasSubstr("--request_timeout"));
  EXPECT_TRUE(h->decode(0).WaitForNoStreams(kWait));
}

TEST(RouterServiceTest, BadInputIsInvalidArgumentSayingWhatToChange) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  struct Case {
    v1::GenerateRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  {
    v1::GenerateRequest r;
    r.set_max_tokens(4);
    cases.push_back({r, "no prompt"});
  }
  cases.push_back({TokenRequest({1, 5}, -1), "max_tokens"});
  // INT32_MAX must not overflow the context check.
  cases.push_back({TokenRequest({1, 5}, INT32_MAX), "2147483649 were requested"});
  cases.push_back(
      {TokenRequest(std::vector<int32_t>(kFakeMaxContext - 2, 5), 3), "maximum context length is"});
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.set_n(kMaxChoices + 1);
    cases.push_back({r, "n is 17"});
  }
  {
    // 16 choices of the whole context (128 tokens, 8 blocks each) can never
    // be held by a 64-block pool: no 429, which a client would retry.
    v1::GenerateRequest r = TokenRequest({1, 5}, 0);
    r.set_n(16);
    cases.push_back({r, "needs 128 KV blocks at once (16 choices of 128 tokens"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.set_logprobs(kMaxTopLogprobs + 1);
    cases.push_back({r, "logprobs is 21"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.mutable_sampling()->set_presence_penalty(2.5f);
    cases.push_back({r, "presence_penalty"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.mutable_sampling()->set_repetition_penalty(0.0f);
    cases.push_back({r, "repetition_penalty"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    (*r.mutable_sampling()->mutable_logit_bias())[kFakeVocab] = 1.0f;
    cases.push_back({r, "logit_bias names token 64"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    (*r.mutable_sampling()->mutable_logit_bias())[5] = 101.0f;
    cases.push_back({r, "logit_bias value"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.mutable_sampling()->set_min_tokens(5);
    cases.push_back({r, "min_tokens"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    for (int i = 0; i <= kMaxStopStrings; ++i) r.add_stop("s");
    cases.push_back({r, "stop strings"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.add_stop(std::string(kMaxStopBytes + 1, 's'));
    cases.push_back({r, "stop string has"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.mutable_sampling()->set_temperature(-0.5f);
    cases.push_back({r, "temperature"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.mutable_sampling()->set_top_k(-1);
    cases.push_back({r, "top_k"});
  }
  for (float top_p : {0.0f, 1.5f}) {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.mutable_sampling()->set_top_p(top_p);
    cases.push_back({r, "top_p"});
  }
  cases.push_back({TokenRequest({1, kFakeVocab}, 4), "64"});
  cases.push_back({TokenRequest({1, -3}, 4), "-3"});
  cases.push_back({TokenRequest(std::vector<int32_t>(kFakeMaxContext, 5), 4), "context"});
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.add_stop("");
    cases.push_back({r, "stop"});
  }
  {
    v1::GenerateRequest r = TokenRequest({1, 5}, 4);
    r.set_timeout_ms(-5);
    cases.push_back({r, "timeout_ms"});
  }
  for (const Case& c : cases) {
    const Result r = h->Run(c.request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(r.status.error_message(), HasSubstr(c.message));
    EXPECT_TRUE(r.messages.empty());
  }
  EXPECT_TRUE(h->decode(0).requests().empty());
  // One token short of the context is fine.
  EXPECT_TRUE(h->Run(TokenRequest(std::vector<int32_t>(kFakeMaxContext - 1, 5), 1)).status.ok());
}

TEST(RouterServiceTest, TextPromptNeedsATokenizer) {
  auto h = StartHarness({.prefill = 0, .decode = 1, .no_tokenizer = true});
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest text;
  text.set_text("w5 w6");
  text.set_max_tokens(2);
  const Result bad = h->Run(text);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), HasSubstr("token_ids"));
  // Token ids work, without text and without stop tokens.
  const Result ok = h->Run(TokenRequest({1, 5}, 2));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_THAT(ok.tokens, ElementsAre(20, 21));
  EXPECT_EQ(ok.text, "");
  EXPECT_TRUE(h->decode(0).requests().at(0).stop_token_ids().empty());
  v1::GenerateRequest with_stop = TokenRequest({1, 5}, 2);
  with_stop.add_stop("x");
  EXPECT_EQ(h->Run(with_stop).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(RouterServiceTest, TextIsTokenizedWithBos) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest text;
  text.set_text("w5 w6");
  text.set_max_tokens(2);
  const Result r = h->Run(text);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(h->decode(0).requests().at(0).prompt(), ElementsAre(kFakeBos, 5, 6));
  EXPECT_EQ(r.finished.usage().prompt_tokens(), 3);
  EXPECT_EQ(r.text, " w40 w20");
}

TEST(RouterServiceTest, NoHealthyDecodeWorkerIsUnavailable) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->StopDecodeServer(0);
  const absl::Time deadline = absl::Now() + kWait;
  while (h->registry().Snapshot(WorkerRole::kDecode)[0].healthy && absl::Now() < deadline) {
    h->registry().PollNow();
  }
  const Result r = h->Run(TokenRequest({1, 5}, 2));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("no healthy decode worker"));
  EXPECT_THAT(r.status.error_message(), HasSubstr(h->decode_address(0)));
}

TEST(RouterServiceTest, OverMaxInflightWithNoQueueIsResourceExhaustedAtOnce) {
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.router.max_inflight = 1;
  options.router.max_queued = 0;
  auto h = StartHarness(options);
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.hold_after = 0});
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(30)));
  auto reader = h->stub().Generate(&ctx, TokenRequest({1, 5, 6}, 100));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));  // The first token: the request is in flight.
  // At once: had it been queued, it would wait on the held request and end
  // with its own deadline instead.
  const Result second = h->Run(TokenRequest({1, 5}, 2));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.status.error_message(), HasSubstr("--max_inflight"));
  ctx.TryCancel();
  while (reader->Read(&response)) {
  }
  reader->Finish();
  ASSERT_TRUE(WaitForRouterIdle(*h));
  // Room again.
  h->decode(0).SetBehaviour({});
  EXPECT_TRUE(h->Run(TokenRequest({1, 5}, 2)).status.ok());
}

TEST(RouterServiceTest, DrainingRouterRefusesNewRequests) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->core().StartDraining();
  const Result r = h->Run(TokenRequest({1, 5}, 2));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("draining"));
}

TEST(RouterServiceTest, StopStringEndsTheStreamAndCancelsDecode) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  // The worker would go on (it holds after 6 tokens): the router must cut it.
  h->decode(0).SetBehaviour({.hold_after = 6});
  v1::GenerateRequest request = TokenRequest({1, 5}, 50);
  request.add_stop("w22 w2");  // Spans two tokens: " w22" and " w23".
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(r.text, " w40 w20 w21 ");
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23));
  EXPECT_EQ(r.finished.usage().completion_tokens(), 5);
  // Text that could start the stop string was held back: no message ever
  // carried "w22".
  for (const v1::GenerateResponse& m : r.messages)
    EXPECT_THAT(m.text(), ::testing::Not(HasSubstr("w22")));
  EXPECT_TRUE(h->decode(0).WaitForCancelled(1, kWait));
}

TEST(RouterServiceTest, HeldBackTextIsSentWhenNoStopStringCompletes) {
  auto h = StartHarness({.prefill = 0, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.script = {20, 21, 22}, .chunk = 2});
  v1::GenerateRequest request = TokenRequest({1, 5}, 3);
  request.add_stop(" w22 and more");
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.text, " w20 w21 w22");
}

TEST(RouterServiceTest, EosFromPrefillEndsWithoutStartingDecode) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->prefill(0).SetBehaviour({.first_token = kFakeEos});
  const Result r = h->Run(TokenRequest({1, 5}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_EOS);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(r.finished.usage().completion_tokens(), 0);
  EXPECT_TRUE(h->decode(0).starts().empty());
  EXPECT_TRUE(h->decode(0).WaitForCancelled(1, kWait));
}

TEST(RouterServiceTest, EosFromDecodeIsFinishReasonEos) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.script = {20, 21, kFakeEos}});
  const Result r = h->Run(TokenRequest({1, 5}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_EOS);
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21));
}

TEST(RouterServiceTest, MaxTokensOneIsTheFirstTokenAlone) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  const Result r = h->Run(TokenRequest({1, 5}, 1));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40));
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(h->decode(0).starts().empty());
  EXPECT_TRUE(h->decode(0).WaitForCancelled(1, kWait));
}

TEST(RouterServiceTest, ConcurrentStreamsEachGetTheirOwnTokens) {
  auto h = StartHarness({.prefill = 2, .decode = 2});
  ASSERT_NE(h, nullptr);
  constexpr int kStreams = 16;
  std::vector<Result> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] { results[i] = h->Run(TokenRequest({1, 5 + i}, 2 + i % 5)); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(2 + i % 5));
    EXPECT_EQ(results[i].finished.usage().completion_tokens(), 2 + i % 5);
  }
  EXPECT_EQ(h->decode(0).requests().size() + h->decode(1).requests().size(),
            static_cast<size_t>(kStreams));
}

// The real stories260K tokenizer: text in, BOS + SentencePiece ids to the
// workers, EOS as the stop token, and the text of the returned tokens.
TEST(RouterServiceTest, RealTokenizerTextRoundTrip) {
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(tokenizer_path));
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.tokenizer = tokenizer.get();
  options.vocab_size = tokenizer->vocab_size();
  auto h = StartHarness(options);
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest request;
  request.set_text("Once upon a time");
  request.set_max_tokens(4);
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> want, tokenizer->Encode("Once upon a time", true));
  const auto decode_requests = h->decode(0).requests();
  ASSERT_EQ(decode_requests.size(), 1u);
  EXPECT_THAT(decode_requests[0].prompt(), ElementsAreArray(want));
  EXPECT_THAT(decode_requests[0].stop_token_ids(), ElementsAre(tokenizer->eos_id()));
  IncrementalDetokenizer detok(*tokenizer, want.back());
  std::string text;
  for (int32_t id : r.tokens) text += detok.Push(id).value_or("?");
  text += detok.Flush();
  EXPECT_EQ(r.text, text);
}

}  // namespace
}  // namespace tandem::router::testing
