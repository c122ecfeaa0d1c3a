// The decode worker through its real gRPC service: a server on loopback, a
// stub client, the loop behind it on an in-process KV transport.
#include "decode_worker/decode_service.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/grammar/constraint.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/held_executor.h"
#include "tests/testing/printable_vocabulary.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode {
namespace {

using ::tandem::decode::testing::DecodeHarness;
using ::tandem::decode::testing::LocalRequest;
using ::tandem::decode::testing::RandomTokens;
using ::tandem::decode::testing::RemoteRequest;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

using testing::kVocab;

class DecodeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DecodeLoopOptions options;
    options.model_name = "synthetic-small";
    options.clock = loop_clock_;
    harness_ = std::make_unique<DecodeHarness>(options);
    service_ = std::make_unique<DecodeService>(&harness_->loop(), constraints_);
    auto running = rpc::StartServer(rpc::ServerOptions{.address = "127.0.0.1:0"}, {service_.get()});
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(running).value();
    stub_ =
        v1::DecodeWorker::NewStub(rpc::MakeChannel("127.0.0.1:" + std::to_string(server_.port)));
  }
  void TearDown() override {
    if (server_.server) server_.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
    server_.server.reset();
    service_.reset();
    harness_.reset();
  }

  static v1::DecodeRequest ToWire(const Request& r) {
    v1::DecodeRequest w;
    w.set_request_id(r.request_id);
    w.mutable_prompt()->Add(r.prompt.begin(), r.prompt.end());
    w.set_max_tokens(r.max_tokens);
    w.set_local_prefill(r.local_prefill);
    w.mutable_stop_token_ids()->Add(r.stop_token_ids.begin(), r.stop_token_ids.end());
    return w;
  }

  static void SetDeadline(grpc::ClientContext& ctx, absl::Duration d = absl::Seconds(30)) {
    ctx.set_deadline(rpc::ToChrono(absl::Now() + d));
  }

  absl::StatusOr<v1::WorkerStats> Stats() {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Seconds(10));
    v1::WorkerStats stats;
    const grpc::Status s = stub_->GetStats(&ctx, v1::StatsRequest(), &stats);
    if (!s.ok()) return rpc::FromGrpc(s);
    return stats;
  }

  // The loop's clock; null: the real one.
  const Clock* loop_clock_ = nullptr;
  // Null: the service has no grammars.
  const ConstraintResolver* constraints_ = nullptr;
  std::unique_ptr<DecodeHarness> harness_;
  std::unique_ptr<DecodeService> service_;
  rpc::RunningServer server_;
  std::unique_ptr<v1::DecodeWorker::Stub> stub_;
};

// The loop on a fake clock, standing still unless a test moves it.
class DecodeServiceFakeClockTest : public DecodeServiceTest {
 protected:
  DecodeServiceFakeClockTest() { loop_clock_ = &clock_; }
  FakeClock clock_{absl::Now()};
};

TEST_F(DecodeServiceTest, GenerateStreamsLocalPrefillTokens) {
  const Request r = LocalRequest("svc-local", RandomTokens(30, kVocab, 21), 15);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, ToWire(r));
  std::vector<int32_t> tokens;
  std::vector<v1::DecodeFinished> finished;
  v1::DecodeEvent event;
  while (reader->Read(&event)) {
    ASSERT_TRUE(finished.empty()) << "event after finished";
    ASSERT_FALSE(event.has_reserved());
    if (event.has_tokens())
      tokens.insert(tokens.end(), event.tokens().ids().begin(), event.tokens().ids().end());
    if (event.has_finished()) finished.push_back(event.finished());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, harness_->Expected(r));
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(finished[0].completion_tokens(), 15);
  EXPECT_GT(finished[0].prefill_us(), 0);
  EXPECT_EQ(finished[0].kv_wait_us(), 0);

  EXPECT_TRUE(harness_->AllBlocksFree());
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats stats, Stats());
  EXPECT_EQ(stats.role(), "decode");
  EXPECT_EQ(stats.model(), "synthetic-small");
  // Computed from the weights when the options give none.
  EXPECT_EQ(stats.weights_fingerprint(),
            MakeSyntheticModel(testing::SmallShape(), 7).value()->Fingerprint());
  EXPECT_EQ(stats.kv_dtype(), "f32");  // the weights' type
  EXPECT_EQ(stats.vocab_size(), kVocab);
  EXPECT_EQ(stats.max_context(), 128);
  EXPECT_EQ(stats.block_size(), 16);
  EXPECT_EQ(stats.kv_blocks_total(), 64);  // 8 full-context sequences of 8 blocks
  EXPECT_EQ(stats.kv_blocks_free(), stats.kv_blocks_total());
  EXPECT_EQ(stats.running(), 0);
  EXPECT_EQ(stats.waiting(), 0);
  EXPECT_FALSE(stats.draining());
  EXPECT_EQ(stats.requests_total(), 1u);
  EXPECT_EQ(stats.requests_failed(), 0u);
}

TEST_F(DecodeServiceTest, GenerateWithRemotePrefillAndStart) {
  const Request r = RemoteRequest("svc-remote", RandomTokens(40, kVocab, 22), 12);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, ToWire(r));
  v1::DecodeEvent event;
  ASSERT_TRUE(reader->Read(&event));
  ASSERT_TRUE(event.has_reserved());
  ASSERT_OK_AND_ASSIGN(int32_t first,
                       harness_->prefill().Prefill(r.prompt, event.reserved().kv_descriptor()));
  {
    // A stale generation is refused and leaves the reservation alone.
    grpc::ClientContext start_ctx;
    SetDeadline(start_ctx);
    v1::StartRequest start;
    start.set_request_id(r.request_id);
    start.set_generation(event.reserved().generation() + 7);
    start.set_first_token(first);
    v1::StartResponse response;
    const grpc::Status s = stub_->Start(&start_ctx, start, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  }
  {
    grpc::ClientContext start_ctx;
    SetDeadline(start_ctx);
    v1::StartRequest start;
    start.set_request_id(r.request_id);
    start.set_generation(event.reserved().generation());
    start.set_first_token(first);
    v1::StartResponse response;
    const grpc::Status s = stub_->Start(&start_ctx, start, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  std::vector<int32_t> tokens = {first};
  bool finished = false;
  while (reader->Read(&event)) {
    if (event.has_tokens())
      tokens.insert(tokens.end(), event.tokens().ids().begin(), event.tokens().ids().end());
    if (event.has_finished()) {
      finished = true;
      EXPECT_EQ(event.finished().completion_tokens(), 12);
      EXPECT_GT(event.finished().kv_wait_us(), 0);
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(finished);
  EXPECT_EQ(tokens, harness_->Expected(r));
  EXPECT_TRUE(harness_->AllBlocksFree());
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats stats, Stats());
  EXPECT_EQ(stats.kv_transfers(), 1u);
  EXPECT_GT(stats.kv_transfer_bytes(), 0u);
}

TEST_F(DecodeServiceTest, ChoicesStreamWithTheirIndexAndEndAfterTheLast) {
  Request r = LocalRequest("svc-n", RandomTokens(20, kVocab, 22), 6);
  v1::DecodeRequest wire = ToWire(r);
  wire.set_n(2);
  wire.set_logprobs(1);
  wire.set_prompt_logprobs(true);
  wire.mutable_sampling()->set_temperature(1.0f);
  wire.mutable_sampling()->set_seed(3);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, wire);
  std::vector<std::vector<int32_t>> tokens(2);
  std::vector<int> logprobs(2, 0);
  std::vector<int> finished;
  int prompt_logprobs = -1;
  v1::DecodeEvent event;
  while (reader->Read(&event)) {
    if (event.has_prompt_logprobs()) {
      EXPECT_TRUE(tokens[0].empty() && tokens[1].empty()) << "prompt logprobs after a token";
      prompt_logprobs = event.prompt_logprobs().logprobs_size();
    }
    if (event.has_tokens()) {
      const int i = event.tokens().index();
      ASSERT_TRUE(i == 0 || i == 1);
      tokens[i].insert(tokens[i].end(), event.tokens().ids().begin(), event.tokens().ids().end());
      logprobs[i] += event.tokens().logprobs_size();
      EXPECT_EQ(event.tokens().logprobs_size(), event.tokens().ids_size());
    }
    if (event.has_finished()) finished.push_back(event.finished().index());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(prompt_logprobs, 19);
  EXPECT_THAT(finished, ::testing::UnorderedElementsAre(0, 1));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(tokens[i].size(), 6u);
    EXPECT_EQ(logprobs[i], 6);
  }
  EXPECT_TRUE(harness_->AllBlocksFree());
}

TEST_F(DecodeServiceTest, TooManyChoicesIsInvalidArgument) {
  v1::DecodeRequest wire = ToWire(LocalRequest("svc-17", {1, 2, 3}, 4));
  wire.set_n(17);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, wire);
  v1::DecodeEvent event;
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(DecodeServiceRequestTest, PriorityIsCarriedIntoTheRequest) {
  v1::DecodeRequest request;
  request.set_priority(-7);
  EXPECT_EQ(FromProto(request).priority, -7);
  request.set_priority(12);
  EXPECT_EQ(FromProto(request).priority, 12);
}

TEST(DecodeServiceStatsTest, ReportTheKvDtypeAndTheFingerprintGiven) {
  DecodeLoopOptions options;
  options.kv_dtype = DType::kBF16;
  options.weights_fingerprint = "0123456789abcdef";
  DecodeHarness harness(options);
  const v1::WorkerStats stats = ToProto(harness.loop().Stats());
  EXPECT_EQ(stats.kv_dtype(), "bf16");
  EXPECT_EQ(stats.weights_fingerprint(), "0123456789abcdef");
}

TEST_F(DecodeServiceTest, StartOfUnknownRequestIsNotFound) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::StartRequest start;
  start.set_request_id("nobody");
  start.set_generation(1);
  v1::StartResponse response;
  EXPECT_EQ(stub_->Start(&ctx, start, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(DecodeServiceTest, BadRequestIsInvalidArgument) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::DecodeRequest request;
  request.set_local_prefill(true);
  request.set_max_tokens(5);
  auto reader = stub_->Generate(&ctx, request);
  v1::DecodeEvent event;
  EXPECT_FALSE(reader->Read(&event));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("prompt is empty"));
}

TEST_F(DecodeServiceTest, ClientCancellationFreesTheReservation) {
  const Request r = RemoteRequest("svc-cancel", RandomTokens(40, kVocab, 23), 12);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, ToWire(r));
  v1::DecodeEvent event;
  ASSERT_TRUE(reader->Read(&event));
  ASSERT_TRUE(event.has_reserved());
  // Stats are published at the end of the loop's round: poll them.
  EXPECT_TRUE(testing::WaitFor([&] {
    absl::StatusOr<v1::WorkerStats> held = Stats();
    return held.ok() && held->kv_blocks_free() < held->kv_blocks_total() && held->waiting() == 1;
  }));
  ctx.TryCancel();
  while (reader->Read(&event)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(harness_->AllBlocksFree());
}

TEST_F(DecodeServiceFakeClockTest, RpcDeadlineFreesTheReservation) {
  const Request r = RemoteRequest("svc-deadline", RandomTokens(10, kVocab, 24), 12);
  grpc::ClientContext ctx;
  // Shorter than the loop's KV timeout (30 s), so that the request's
  // deadline, not its lease's, is what runs out.
  SetDeadline(ctx, absl::Seconds(20));
  auto reader = stub_->Generate(&ctx, ToWire(r));
  v1::DecodeEvent event;
  ASSERT_TRUE(reader->Read(&event));
  ASSERT_TRUE(event.has_reserved());
  // The loop holds the RPC's deadline and reads it on its own clock: moved
  // past it, the loop ends the request long before gRPC's timer would.
  clock_.Advance(absl::Seconds(21));
  while (reader->Read(&event)) {
  }
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(s.error_message(), HasSubstr("svc-deadline"));
  EXPECT_TRUE(harness_->AllBlocksFree());
}

TEST_F(DecodeServiceTest, ConstraintWithoutGrammarsIsFailedPrecondition) {
  v1::DecodeRequest w = ToWire(LocalRequest("svc-nogrammar", RandomTokens(8, kVocab, 25), 4));
  w.mutable_sampling()->mutable_constraint()->set_regex("[0-9]+");
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, w);
  v1::DecodeEvent event;
  EXPECT_FALSE(reader->Read(&event));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("--tokenizer"));
}

// A service with grammars over a vocabulary of the synthetic model's size:
// ids 0-94 are the printable ASCII characters (digits are 16-25), the rest
// have no bytes (100 is the stop token). Compiles wait until the test runs
// them.
class DecodeServiceGrammarTest : public DecodeServiceTest {
 protected:
  DecodeServiceGrammarTest() { constraints_ = &resolver_; }
  void TearDown() override {
    compiles_.RunHeld();
    DecodeServiceTest::TearDown();
  }

  v1::DecodeRequest DigitsRequest(const std::string& id, const std::string& regex) {
    v1::DecodeRequest w = ToWire(LocalRequest(id, RandomTokens(20, kVocab, 26), 10));
    w.add_stop_token_ids(kStop);
    w.mutable_sampling()->mutable_constraint()->set_regex(regex);
    return w;
  }

  static constexpr int32_t kStop = 100;
  grammar::GrammarCache grammars_{::tandem::testing::PrintableVocabulary(kVocab)};
  ::tandem::testing::HeldExecutor compiles_;
  ConstraintResolver resolver_{&grammars_, &compiles_};
};

// The compile runs on the resolver's executor, not on the gRPC thread that
// took the call: while it is held the loop has not seen the request and
// the server still answers; once run, the output follows the grammar.
TEST_F(DecodeServiceGrammarTest, GrammarCompilesOffTheGrpcThreadThenConstrainsTheOutput) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, DigitsRequest("svc-digits", "[0-9]+"));
  ASSERT_TRUE(compiles_.AwaitPosted(1));
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats held, Stats());
  EXPECT_EQ(held.requests_total(), 0u);
  EXPECT_EQ(held.running() + held.waiting(), 0);

  EXPECT_EQ(compiles_.RunHeld(), 1);
  std::vector<int32_t> tokens;
  v1::DecodeEvent event;
  while (reader->Read(&event)) {
    if (event.has_tokens()) {
      tokens.insert(tokens.end(), event.tokens().ids().begin(), event.tokens().ids().end());
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_FALSE(tokens.empty());
  // Digits, then perhaps the stop token once the output is complete.
  if (tokens.back() == kStop) tokens.pop_back();
  ASSERT_FALSE(tokens.empty());
  EXPECT_TRUE(std::all_of(tokens.begin(), tokens.end(), [](int32_t t) {
    return t >= 16 && t <= 25;
  })) << ::testing::PrintToString(tokens);
  EXPECT_TRUE(harness_->AllBlocksFree());
}

TEST_F(DecodeServiceGrammarTest, UncompilableConstraintIsInvalidArgumentFromTheCompile) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, DigitsRequest("svc-badregex", "([0-9]"));
  ASSERT_TRUE(compiles_.AwaitPosted(1));
  compiles_.RunHeld();
  v1::DecodeEvent event;
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats stats, Stats());
  EXPECT_EQ(stats.requests_total(), 0u);
}

// The client goes while its grammar compiles: the request the compile then
// submits is cancelled at once and holds nothing.
TEST_F(DecodeServiceGrammarTest, ClientGoneDuringTheCompileFreesEverything) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub_->Generate(&ctx, DigitsRequest("svc-gone", "[0-9]+"));
  ASSERT_TRUE(compiles_.AwaitPosted(1));
  ctx.TryCancel();
  v1::DecodeEvent event;
  while (reader->Read(&event)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  compiles_.RunHeld();
  EXPECT_TRUE(testing::WaitFor([&] {
    absl::StatusOr<v1::WorkerStats> stats = Stats();
    return stats.ok() && stats->requests_total() == 1 && stats->running() + stats->waiting() == 0;
  }));
  EXPECT_TRUE(harness_->AllBlocksFree());
}

}  // namespace
}  // namespace tandem::decode
