// The cluster end to end: real tandem-router, tandem-prefill and
// tandem-decode processes on loopback, real gRPC, KV over real UCX. Tokens
// through the cluster must equal the single-process engine's, and every
// failure must end in a clear status with every KV block free again.
#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/model/model_weights.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_harness.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

// tandem-generate's path in-process: the tokens a single engine gives.
class Reference {
 public:
  Reference(const std::string& model, const std::string& tokenizer) {
    auto weights = LoadModel(model);
    CHECK_OK(weights.status());
    auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = 1});
    CHECK_OK(backend.status());
    auto engine = Engine::Create(**weights, std::move(backend).value(), EngineOptions{});
    CHECK_OK(engine.status());
    engine_ = std::move(engine).value();
    auto tok = LoadTokenizer(tokenizer);
    CHECK_OK(tok.status());
    tokenizer_ = std::move(tok).value();
  }

  GenerateResult Greedy(const std::string& text, int max_tokens) {
    GenerateRequest request;
    auto prompt = tokenizer_->Encode(text, /*add_bos=*/true);
    CHECK_OK(prompt.status());
    request.prompt = *prompt;
    request.max_new_tokens = max_tokens;
    request.eos_ids = tokenizer_->eos_ids();
    auto result = Generate(*engine_, request);
    CHECK_OK(result.status());
    return *result;
  }

 private:
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

const char* const kPrompts[] = {
    "Once upon a time",
    "Lily and Tom went to the park. They saw a big",
    "The little dog was sad because",
    "One day, a girl named Sue found a shiny red ball in the garden. She wanted to show it to "
    "her mom, so she ran inside and",
    "Tim",
};

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = ModelFile("stories260K.bin");
    tokenizer_ = ModelFile("tok512.bin");
    if (!model_.empty() && !tokenizer_.empty()) reference_ = new Reference(model_, tokenizer_);
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }

  void StartCluster(ClusterOptions options) {
    options.model = model_;
    options.tokenizer = tokenizer_;
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
  }

  // Every prompt of kPrompts greedy through the cluster equals the reference.
  void ExpectPromptsMatchReference(int max_tokens) {
    for (const char* prompt : kPrompts) {
      const GenerateResult want = reference_->Greedy(prompt, max_tokens);
      const Completion got = RunGenerate(cluster_->router(), TextRequest(prompt, max_tokens));
      ASSERT_TRUE(got.status.ok()) << prompt << ": " << got.status.error_message() << "\n"
                                   << cluster_->Logs();
      EXPECT_EQ(got.tokens, want.tokens) << prompt;
      EXPECT_EQ(got.finished.usage().completion_tokens(), static_cast<int>(want.tokens.size()));
      EXPECT_EQ(got.finished.reason(), want.finish == FinishReason::kEos ? v1::FINISH_REASON_EOS
                                                                         : v1::FINISH_REASON_LENGTH)
          << prompt;
    }
  }

  static std::string model_, tokenizer_;
  static Reference* reference_;
  std::unique_ptr<Cluster> cluster_;
};

std::string ClusterTest::model_;
std::string ClusterTest::tokenizer_;
Reference* ClusterTest::reference_ = nullptr;

#define REQUIRE_FIXTURES()                                  \
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin"); \
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");  \
  (void)model_path;                                         \
  (void)tokenizer_path

TEST_F(ClusterTest, GreedyTokensEqualSingleProcessAndKvIsShipped) {
  REQUIRE_FIXTURES();
  StartCluster({.prefill = 2, .decode = 2});
  ExpectPromptsMatchReference(64);

  const Completion c = RunGenerate(cluster_->router(), TextRequest(kPrompts[3], 16));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_TRUE(c.finished.disaggregated());
  EXPECT_THAT(c.finished.prefill_worker(), HasSubstr("127.0.0.1:"));
  EXPECT_THAT(c.finished.decode_worker(), HasSubstr("127.0.0.1:"));
  const v1::Timeline& t = c.finished.timeline();
  EXPECT_GT(t.prefill_us(), 0);
  EXPECT_GT(t.first_token_us(), 0);
  EXPECT_GE(t.end_us(), t.first_token_us());
  // Text arrives with the tokens and decodes them.
  EXPECT_FALSE(c.text.empty());

  // The prefill pool really sent KV and the decode pool received it.
  uint64_t sent = 0, received = 0;
  for (int i = 0; i < 2; ++i) {
    auto p = cluster_->Stats(cluster_->prefill(i));
    auto d = cluster_->Stats(cluster_->decode(i));
    ASSERT_TRUE(p.ok() && d.ok());
    sent += p->kv_transfer_bytes();
    received += d->kv_transfer_bytes();
  }
  EXPECT_GT(sent, 0u);
  EXPECT_EQ(sent, received);
  EXPECT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(10)).ok());
}

TEST_F(ClusterTest, ColocatedDecodeWorkerGivesTheSameTokens) {
  REQUIRE_FIXTURES();
  StartCluster({.prefill = 0, .decode = 1});
  ExpectPromptsMatchReference(48);
  const Completion c = RunGenerate(cluster_->router(), TextRequest(kPrompts[0], 4));
  EXPECT_FALSE(c.finished.disaggregated());
  EXPECT_EQ(c.finished.prefill_worker(), "");
}

TEST_F(ClusterTest, ShortPromptsArePrefilledOnTheDecodeWorker) {
  REQUIRE_FIXTURES();
  StartCluster({.prefill = 1, .decode = 1, .router_flags = {"--local_prefill_tokens=8"}});
  ExpectPromptsMatchReference(32);
  const Completion short_prompt = RunGenerate(cluster_->router(), TextRequest("Tim", 4));
  const Completion long_prompt = RunGenerate(cluster_->router(), TextRequest(kPrompts[3], 4));
  ASSERT_TRUE(short_prompt.status.ok() && long_prompt.status.ok());
  EXPECT_FALSE(short_prompt.finished.disaggregated());
  EXPECT_TRUE(long_prompt.finished.disaggregated());
}

TEST_F(ClusterTest, SixtyFourConcurrentStreamsAllGetTheirOwnTokens) {
  REQUIRE_FIXTURES();
  StartCluster({.prefill = 2, .decode = 2});
  constexpr int kStreams = 64;
  std::vector<std::string> prompts(kStreams);
  std::vector<int> lengths(kStreams);
  std::vector<GenerateResult> want(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    prompts[i] = absl::StrCat(kPrompts[i % 5], i % 3 == 0 ? " and" : "", i % 7 == 0 ? " then" : "");
    lengths[i] = 8 + (i * 37) % 120;
    want[i] = reference_->Greedy(prompts[i], lengths[i]);
  }
  std::vector<Completion> got(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      got[i] =
          RunGenerate(cluster_->router(), TextRequest(prompts[i], lengths[i]), absl::Seconds(120));
    });
  }
  for (std::thread& t : threads) t.join();
  int disaggregated = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message() << "\n"
                                    << cluster_->Logs();
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "stream " << i << ": " << prompts[i];
    disaggregated += got[i].finished.disaggregated();
  }
  EXPECT_EQ(disaggregated, kStreams);
  EXPECT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(10)).ok());
}

TEST_F(ClusterTest, ClientCancelMidStreamFreesEveryBlock) {
  REQUIRE_FIXTURES();
  StartCluster({.prefill = 2, .decode = 2});
  for (int round = 0; round < 8; ++round) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = cluster_->router().Generate(&ctx, TextRequest(kPrompts[round % 5], 400));
    v1::GenerateResponse response;
    // Cancel at different points: before the first message, after one, after a few.
    for (int i = 0; i < round % 4; ++i) {
      if (!reader->Read(&response)) break;
    }
    ctx.TryCancel();
    while (reader->Read(&response)) {
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::CANCELLED)
        << status.error_message();
  }
  const absl::Status idle = cluster_->WaitUntilIdle(absl::Seconds(15));
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster_->Logs();
  // The cluster still serves.
  ExpectPromptsMatchReference(16);
}

TEST_F(ClusterTest, BadInputIsInvalidArgumentSayingWhatToChange) {
  REQUIRE_FIXTURES();
  StartCluster({.prefill = 1, .decode = 1});
  struct Case {
    v1::GenerateRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({TextRequest("Hi", -1), "max_tokens"});
  // INT32_MAX must not overflow the context arithmetic.
  cases.push_back({TextRequest("Hi", INT32_MAX), "maximum context length"});
  {
    v1::GenerateRequest r = TextRequest("Hi", 8);
    r.mutable_sampling()->set_top_p(1.5f);
    cases.push_back({r, "top_p"});
  }
  {
    v1::GenerateRequest r = TextRequest("Hi", 8);
    r.mutable_sampling()->set_temperature(-1.0f);
    cases.push_back({r, "temperature"});
  }
  {
    v1::GenerateRequest r;
    r.set_max_tokens(8);
    r.mutable_token_ids()->add_ids(1);
    r.mutable_token_ids()->add_ids(512);
    cases.push_back({r, "512"});
  }
  {
    std::string long_text;
    for (int i = 0; i < 300; ++i) long_text += " lily tom";
    cases.push_back({TextRequest(long_text, 8), "context"});
  }
  for (const Case& c : cases) {
    const Completion got = RunGenerate(cluster_->router(), c.request, absl::Seconds(10));
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.message << ": " << got.status.error_message();
    EXPECT_THAT(got.status.error_message(), HasSubstr(c.message));
    EXPECT_EQ(got.messages, 0);
  }
  // An empty prompt generates from BOS, as from the start of a document.
  const Completion empty = RunGenerate(cluster_->router(), TextRequest("", 4), absl::Seconds(10));
  EXPECT_TRUE(empty.status.ok()) << empty.status.error_message();
  EXPECT_EQ(empty.finished.usage().prompt_tokens(), 1);
  EXPECT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(10)).ok());
}

TEST_F(ClusterTest, OverloadIsResourceExhaustedQuickly) {
  REQUIRE_FIXTURES();
  StartCluster({.prefill = 1, .decode = 1, .router_flags = {"--max_inflight=2", "--max_queued=0"}});
  constexpr int kStreams = 24;
  std::vector<Completion> got(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back(
        [&, i] { got[i] = RunGenerate(cluster_->router(), TextRequest(kPrompts[i % 5], 400)); });
  }
  for (std::thread& t : threads) t.join();
  int ok = 0, exhausted = 0;
  for (const Completion& c : got) {
    if (c.status.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << c.status.error_message();
      EXPECT_LT(c.elapsed, absl::Seconds(2));
      ++exhausted;
    }
  }
  EXPECT_GE(ok, 2);
  EXPECT_GE(exhausted, 1);
  EXPECT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace tandem::testing
