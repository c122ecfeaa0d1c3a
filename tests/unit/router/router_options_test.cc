// The generation options a request carries through the router's core: n
// choices, logprobs and echo, seeds, penalties, ignore_eos, the served
// model's name, API keys, and the context arithmetic. Fake workers over
// real gRPC (fake_workers.h).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/router_harness.h"
#include "tests/unit/router/router_service_fixture.h"

namespace tandem::router::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Per choice: the tokens and the finished message.
struct Choices {
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, std::string> text;
  std::map<int, v1::Finished> finished;
  std::map<int, std::vector<v1::TokenLogprob>> logprobs;
};

Choices Split(const Result& r) {
  Choices c;
  for (const v1::GenerateResponse& m : r.messages) {
    auto& t = c.tokens[m.index()];
    t.insert(t.end(), m.token_ids().begin(), m.token_ids().end());
    c.text[m.index()] += m.text();
    auto& l = c.logprobs[m.index()];
    l.insert(l.end(), m.logprobs().begin(), m.logprobs().end());
    if (m.has_finished()) c.finished[m.index()] = m.finished();
  }
  return c;
}

class RouterOptionsTest : public ::testing::TestWithParam<bool> {
 protected:
  // Disaggregated (a prefill worker) or colocated (none).
  bool disaggregated() const { return GetParam(); }
  HarnessOptions Options() const { return {.prefill = disaggregated() ? 1 : 0, .decode = 1}; }
};

TEST_P(RouterOptionsTest, NChoicesStreamTheirOwnTokensAndFinishEach) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest request = TokenRequest({1, 5, 6}, 3);
  request.set_n(3);
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const Choices c = Split(r);
  ASSERT_EQ(c.finished.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.tokens.at(i).size(), 3u) << i;
    EXPECT_EQ(c.finished.at(i).usage().completion_tokens(), 3) << i;
    EXPECT_EQ(c.finished.at(i).reason(), v1::FINISH_REASON_LENGTH);
  }
  if (disaggregated()) {
    // The prefill worker's first tokens, then each choice's decode script.
    EXPECT_THAT(c.tokens.at(0), ElementsAre(40, 20, 21));
    EXPECT_THAT(c.tokens.at(1), ElementsAre(41, 21, 22));
    EXPECT_THAT(c.tokens.at(2), ElementsAre(42, 22, 23));
    ASSERT_EQ(h->prefill(0).requests().size(), 1u);
    EXPECT_EQ(h->prefill(0).requests()[0].n(), 3);
    ASSERT_EQ(h->decode(0).starts().size(), 1u);
    EXPECT_THAT(h->decode(0).starts()[0].extra_first_tokens(), ElementsAre(41, 42));
    // Each choice's sampler draws reach the decode worker as the prefill sent them.
    EXPECT_THAT(h->decode(0).starts()[0].sampler_draws(), ElementsAre(0, 1, 2));
  } else {
    EXPECT_THAT(c.tokens.at(1), ElementsAre(21, 22, 23));
  }
  ASSERT_EQ(h->decode(0).requests().size(), 1u);
  EXPECT_EQ(h->decode(0).requests()[0].n(), 3);
}

TEST_P(RouterOptionsTest, LogprobsComeWithTokenTexts) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest request = TokenRequest({1, 5}, 3);
  request.set_logprobs(2);
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const Choices c = Split(r);
  const std::vector<v1::TokenLogprob>& l = c.logprobs.at(0);
  ASSERT_EQ(l.size(), c.tokens.at(0).size());
  for (size_t i = 0; i < l.size(); ++i) {
    const int32_t token = c.tokens.at(0)[i];
    EXPECT_EQ(l[i].token_id(), token);
    EXPECT_FLOAT_EQ(l[i].logprob(), -0.25f * static_cast<float>(token % 8));
    // FakeTokenizer: token t reads " w<t>".
    EXPECT_EQ(l[i].token(), " w" + std::to_string(token));
    ASSERT_EQ(l[i].top_size(), 2);
    EXPECT_EQ(l[i].top(1).token_id(), token + 1);
    EXPECT_EQ(l[i].top(1).token(), " w" + std::to_string(token + 1));
  }
  EXPECT_EQ(h->decode(0).requests()[0].logprobs(), 2);
}

TEST_P(RouterOptionsTest, EchoSendsThePromptFirstWithItsLogprobs) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest request;
  request.set_text("w5 w6 w7");
  request.set_max_tokens(2);
  request.set_echo(true);
  request.set_logprobs(0);
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_FALSE(r.messages.empty());
  ASSERT_TRUE(r.messages[0].has_echo());
  const v1::Echo& echo = r.messages[0].echo();
  EXPECT_EQ(echo.text(), "w5 w6 w7");
  EXPECT_THAT(echo.token_ids(), ElementsAre(kFakeBos, 5, 6, 7));
  ASSERT_EQ(echo.logprobs_size(), 3);
  EXPECT_EQ(echo.logprobs(0).token_id(), 5);
  EXPECT_EQ(echo.logprobs(2).token(), " w7");
  EXPECT_EQ(Split(r).tokens.at(0).size(), 2u);
  for (size_t i = 1; i < r.messages.size(); ++i) EXPECT_FALSE(r.messages[i].has_echo());
}

TEST_P(RouterOptionsTest, EchoWithoutLogprobsAsksNoPromptLogprobs) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest request = TokenRequest({1, 5, 6}, 2);
  request.set_echo(true);
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.messages.at(0).has_echo());
  EXPECT_EQ(r.messages[0].echo().text(), " w5 w6");
  EXPECT_EQ(r.messages[0].echo().logprobs_size(), 0);
  EXPECT_FALSE(h->decode(0).requests()[0].prompt_logprobs());
}

TEST_P(RouterOptionsTest, SamplingOptionsReachTheWorkers) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest request = TokenRequest({1, 5}, 4);
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_temperature(0.7f);
  s->set_seed(99);
  s->set_presence_penalty(0.5f);
  s->set_frequency_penalty(-0.25f);
  s->set_repetition_penalty(1.2f);
  (*s->mutable_logit_bias())[7] = -100.0f;
  s->set_min_tokens(2);
  ASSERT_TRUE(h->Run(request).status.ok());
  const v1::SamplingParams got = h->decode(0).requests().at(0).sampling();
  EXPECT_EQ(got.seed(), 99u);
  EXPECT_FLOAT_EQ(got.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(got.frequency_penalty(), -0.25f);
  EXPECT_FLOAT_EQ(got.repetition_penalty(), 1.2f);
  EXPECT_FLOAT_EQ(got.logit_bias().at(7), -100.0f);
  EXPECT_EQ(got.min_tokens(), 2);
  if (disaggregated()) {
    const v1::PrefillRequest p = h->prefill(0).requests().at(0);
    EXPECT_EQ(p.sampling().min_tokens(), 2);
    EXPECT_THAT(p.stop_token_ids(), ElementsAre(kFakeEos));
  }
}

TEST_P(RouterOptionsTest, AnUnsetSeedIsFreshPerRequest) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest request = TokenRequest({1, 5}, 2);
  request.mutable_sampling()->set_temperature(1.0f);
  ASSERT_TRUE(h->Run(request).status.ok());
  ASSERT_TRUE(h->Run(request).status.ok());
  const auto requests = h->decode(0).requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_TRUE(requests[0].sampling().has_seed());
  EXPECT_NE(requests[0].sampling().seed(), requests[1].sampling().seed());
}

TEST_P(RouterOptionsTest, IgnoreEosSendsNoStopIds) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  // The script reaches EOS (2) at its second token.
  h->decode(0).SetBehaviour({.script = {20, kFakeEos, 21}});
  v1::GenerateRequest request = TokenRequest({1, 5}, 5);
  request.set_ignore_eos(true);
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_TRUE(h->decode(0).requests()[0].stop_token_ids().empty());
  request.set_ignore_eos(false);
  const Result stopped = h->Run(request);
  EXPECT_EQ(stopped.finished.reason(), v1::FINISH_REASON_EOS);
}

TEST_P(RouterOptionsTest, EmptyPromptGeneratesFromBos) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest text;
  text.set_text("");
  text.set_max_tokens(2);
  ASSERT_TRUE(h->Run(text).status.ok());
  ASSERT_TRUE(h->Run(TokenRequest({}, 2)).status.ok());
  const auto requests = h->decode(0).requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_THAT(requests[0].prompt(), ElementsAre(kFakeBos));
  EXPECT_THAT(requests[1].prompt(), ElementsAre(kFakeBos));
}

TEST_P(RouterOptionsTest, UnsetMaxTokensFillsTheContext) {
  auto h = StartHarness(Options());
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->Run(TokenRequest({1, 5, 6}, 0)).status.ok());
  EXPECT_EQ(h->decode(0).requests().at(0).max_tokens(), kFakeMaxContext - 3);
}

TEST_P(RouterOptionsTest, ModelMustBeTheServedOne) {
  HarnessOptions options = Options();
  options.router.served_model_name = "tiny";
  auto h = StartHarness(options);
  ASSERT_NE(h, nullptr);
  v1::GenerateRequest request = TokenRequest({1, 5}, 2);
  request.set_model("other");
  const Result r = h->Run(request);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(r.status.error_message(), HasSubstr("tiny"));
  request.set_model("tiny");
  EXPECT_TRUE(h->Run(request).status.ok());
}

INSTANTIATE_TEST_SUITE_P(Modes, RouterOptionsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Disaggregated" : "Local"; });

TEST(RouterAuthTest, TheAuthorizerGuardsGenerate) {
  HarnessOptions options{.prefill = 0, .decode = 1};
  options.authorize = [](const grpc::CallbackServerContext& ctx) {
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    if (it != md.end() && it->second == "Bearer k1") return absl::OkStatus();
    return absl::UnauthenticatedError("no valid API key");
  };
  auto h = StartHarness(options);
  ASSERT_NE(h, nullptr);
  const Result refused = h->Run(TokenRequest({1, 5}, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(h->decode(0).requests().empty());
}

}  // namespace
}  // namespace tandem::router::testing
