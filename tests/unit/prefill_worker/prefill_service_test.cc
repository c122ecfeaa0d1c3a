// PrefillService through a real gRPC server on loopback: the KV still goes
// over the in-process transport to the test's decode side.
#include "prefill_worker/prefill_service.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/grammar/constraint.h"
#include "common/model/synthetic.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/held_executor.h"
#include "tests/testing/printable_vocabulary.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::DecodeSide;
using ::tandem::prefill::testing::MakeEngine;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::prefill::testing::ReferenceTokens;
using ::tandem::prefill::testing::TestShape;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

class PrefillServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(weights_, MakeSyntheticModel(TestShape(), 7));
    fabric_ = kvtransfer::InProcFabric::Create();
    transport_ = kvtransfer::InProcTransport::Create(fabric_);
    decode_ = std::make_unique<DecodeSide>(*weights_, fabric_);
    auto backend = CpuBackend::Create(CpuBackendOptions{1});
    ASSERT_OK(backend.status());
    ASSERT_OK_AND_ASSIGN(
        loop_, PrefillLoop::Create(*weights_, std::move(backend).value(), transport_.get(),
                                   loop_clock_, {.model_name = "synthetic"}));
    service_ = std::make_unique<PrefillService>(loop_.get(), constraints_);
    ASSERT_OK_AND_ASSIGN(server_, rpc::StartServer({.address = "127.0.0.1:0"}, {service_.get()}));
    stub_ = v1::PrefillWorker::NewStub(rpc::MakeChannel(absl::StrCat("127.0.0.1:", server_.port)));
  }

  void TearDown() override {
    if (server_.server != nullptr) server_.server->Shutdown();
  }

  // Calls Prefill on another thread while this one drives the decode side.
  absl::StatusOr<v1::PrefillResponse> Prefill(const v1::PrefillRequest& request,
                                              absl::Duration timeout, bool drive_decode = true) {
    std::atomic<bool> finished{false};
    grpc::Status status;
    v1::PrefillResponse response;
    std::thread caller([&] {
      grpc::ClientContext context;
      context.set_deadline(rpc::ToChrono(absl::Now() + timeout));
      status = stub_->Prefill(&context, request, &response);
      finished = true;
    });
    if (drive_decode) {
      decode_->PumpUntil([&] { return finished.load(); }, timeout + absl::Seconds(10));
    }
    caller.join();
    if (!status.ok()) return rpc::FromGrpc(status);
    return response;
  }

  absl::StatusOr<v1::WorkerStats> Stats() {
    grpc::ClientContext context;
    context.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(10)));
    v1::WorkerStats stats;
    const grpc::Status status = stub_->GetStats(&context, v1::StatsRequest(), &stats);
    if (!status.ok()) return rpc::FromGrpc(status);
    return stats;
  }

  v1::PrefillRequest Request(const std::vector<int32_t>& prompt, const DecodeSide::Lease& lease) {
    v1::PrefillRequest request;
    request.set_request_id(absl::StrCat("r", lease.request_id));
    for (int32_t t : prompt) request.add_tokens(t);
    request.set_kv_descriptor(lease.descriptor);
    return request;
  }

  // Starts at the real time and stands still unless a test moves it; the
  // loop runs on it in PrefillServiceFakeClockTest.
  FakeClock fake_clock_{absl::Now()};
  const Clock* loop_clock_ = &Clock::Real();
  // Null: the service has no grammars.
  const ConstraintResolver* constraints_ = nullptr;
  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<DecodeSide> decode_;
  std::unique_ptr<kvtransfer::InProcTransport> transport_;
  std::unique_ptr<PrefillLoop> loop_;
  std::unique_ptr<PrefillService> service_;
  rpc::RunningServer server_;
  std::unique_ptr<v1::PrefillWorker::Stub> stub_;
};

class PrefillServiceFakeClockTest : public PrefillServiceTest {
 protected:
  PrefillServiceFakeClockTest() { loop_clock_ = &fake_clock_; }
};

TEST_F(PrefillServiceTest, PrefillOverGrpcIsExactAndStatsShowIt) {
  const std::vector<int32_t> prompt = RandomTokens(37, weights_->config.vocab_size, 1);
  DecodeSide::Lease* lease = decode_->Expect(37);
  ASSERT_OK_AND_ASSIGN(v1::PrefillResponse response,
                       Prefill(Request(prompt, *lease), absl::Seconds(60)));
  ASSERT_TRUE(lease->ended);
  auto reference = MakeEngine(*weights_, 64);
  EXPECT_EQ(decode_->Continue(*lease, response.first_token(), 8),
            ReferenceTokens(*reference, prompt, 8));
  EXPECT_GT(response.kv_bytes(), 0);
  EXPECT_GT(response.prefill_us(), 0);

  ASSERT_OK_AND_ASSIGN(v1::WorkerStats stats, Stats());
  EXPECT_EQ(stats.role(), "prefill");
  EXPECT_EQ(stats.model(), "synthetic");
  EXPECT_EQ(stats.weights_fingerprint(), weights_->Fingerprint());
  EXPECT_EQ(stats.kv_dtype(), "f32");  // the weights' type
  EXPECT_EQ(stats.vocab_size(), 101);
  EXPECT_EQ(stats.max_context(), 128);
  EXPECT_EQ(stats.block_size(), 16);
  EXPECT_EQ(stats.kv_blocks_total(), 8 * 8);  // 8 full-context sequences of 8 blocks.
  EXPECT_EQ(stats.kv_blocks_free(), stats.kv_blocks_total());
  EXPECT_EQ(stats.running(), 0);
  EXPECT_EQ(stats.waiting(), 0);
  EXPECT_FALSE(stats.draining());
  EXPECT_EQ(stats.requests_total(), 1u);
  EXPECT_EQ(stats.requests_failed(), 0u);
  EXPECT_EQ(stats.kv_transfers(), 1u);
  EXPECT_EQ(stats.kv_transfer_bytes(), static_cast<uint64_t>(response.kv_bytes()));
}

TEST_F(PrefillServiceTest, CachedTokensAndPrefixCacheStatsComeBackOverGrpc) {
  const std::vector<int32_t> prompt = RandomTokens(37, weights_->config.vocab_size, 5);
  std::vector<int32_t> cached;
  for (int i = 0; i < 2; ++i) {
    DecodeSide::Lease* lease = decode_->Expect(37);
    ASSERT_OK_AND_ASSIGN(v1::PrefillResponse response,
                         Prefill(Request(prompt, *lease), absl::Seconds(60)));
    cached.push_back(response.cached_tokens());
  }
  // The second call finds the first's two full blocks.
  EXPECT_EQ(cached, (std::vector<int32_t>{0, 32}));
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats stats, Stats());
  EXPECT_EQ(stats.prefix_cache_queried_tokens(), 64u);
  EXPECT_EQ(stats.prefix_cache_hit_tokens(), 32u);
  EXPECT_EQ(stats.kv_blocks_cached(), 2);
  EXPECT_EQ(stats.kv_blocks_free(), stats.kv_blocks_total());
}

TEST_F(PrefillServiceTest, ChoicesAndLogprobsComeBackOverGrpc) {
  const std::vector<int32_t> prompt = RandomTokens(20, weights_->config.vocab_size, 2);
  DecodeSide::Lease* lease = decode_->Expect(20);
  v1::PrefillRequest request = Request(prompt, *lease);
  request.set_n(3);
  request.set_logprobs(2);
  request.set_prompt_logprobs(true);
  request.mutable_sampling()->set_temperature(1.0f);
  request.mutable_sampling()->set_seed(4);
  (*request.mutable_sampling()->mutable_logit_bias())[5] = -100.0f;
  ASSERT_OK_AND_ASSIGN(v1::PrefillResponse response, Prefill(request, absl::Seconds(60)));
  EXPECT_EQ(response.extra_first_tokens_size(), 2);
  EXPECT_THAT(response.sampler_draws(), ::testing::ElementsAre(1, 1, 1));
  ASSERT_EQ(response.first_logprobs_size(), 3);
  EXPECT_EQ(response.first_logprobs(0).token_id(), response.first_token());
  EXPECT_EQ(response.first_logprobs(2).token_id(), response.extra_first_tokens(1));
  EXPECT_EQ(response.first_logprobs(1).top_size(), 2);
  ASSERT_EQ(response.prompt_logprobs_size(), 19);
  EXPECT_EQ(response.prompt_logprobs(0).token_id(), prompt[1]);
  EXPECT_EQ(response.prompt_logprobs(18).token_id(), prompt[19]);
  EXPECT_LE(response.prompt_logprobs(3).logprob(), 0.0f);
  decode_->Release(*lease);

  DecodeSide::Lease* second = decode_->Expect(20);
  v1::PrefillRequest bad = Request(prompt, *second);
  bad.set_n(17);
  EXPECT_THAT(Prefill(bad, absl::Seconds(60)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("choices")));
}

TEST_F(PrefillServiceTest, BadRequestsAreInvalidArgumentOverGrpc) {
  DecodeSide::Lease* lease = decode_->Expect(10);
  v1::PrefillRequest request = Request(RandomTokens(10, 101, 2), *lease);
  request.set_kv_descriptor("junk");
  EXPECT_THAT(Prefill(request, absl::Seconds(10), false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("descriptor")));
  request = Request({}, *lease);
  EXPECT_THAT(Prefill(request, absl::Seconds(10), false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  request = Request(RandomTokens(10, 101, 2), *lease);
  request.mutable_sampling()->set_top_p(1.5f);
  EXPECT_THAT(Prefill(request, absl::Seconds(10), false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_p")));
}

// The client's deadline passes while the transfer waits for a decode side
// that never answers: the call ends and every block comes back. The worker
// reads the call's deadline on its loop's clock, which the test moves once
// the job is sending: no real time has to pass, and a loaded machine can
// neither run the deadline out early nor in the handshake.
TEST_F(PrefillServiceFakeClockTest, ClientDeadlineFreesEveryBlock) {
  DecodeSide::Lease* lease = decode_->Expect(30);
  absl::StatusOr<v1::PrefillResponse> answer;
  std::thread caller([&] {
    answer = Prefill(Request(RandomTokens(30, 101, 3), *lease), absl::Seconds(60), false);
  });
  const absl::Time wait_until = absl::Now() + absl::Seconds(60);
  absl::StatusOr<v1::WorkerStats> stats;
  do {
    stats = Stats();
    if (stats.ok() && stats->running() == 1 && stats->kv_blocks_free() < stats->kv_blocks_total()) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  } while (absl::Now() < wait_until);
  ASSERT_OK(stats.status());
  EXPECT_EQ(stats->running(), 1);
  fake_clock_.Advance(absl::Seconds(61));
  caller.join();
  EXPECT_THAT(answer.status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("not confirmed")));
  // Stats are published before the reply goes out.
  ASSERT_OK_AND_ASSIGN(v1::WorkerStats after, Stats());
  EXPECT_EQ(after.running(), 0);
  EXPECT_EQ(after.kv_blocks_free(), after.kv_blocks_total());
  EXPECT_EQ(after.kv_transfers_failed(), 1u);
  EXPECT_EQ(after.requests_failed(), 1u);
}

// Grammars over a vocabulary of the synthetic model's size (ids 0-94 the
// printable ASCII characters, digits 16-25; the rest without bytes), whose
// compiles wait until the test runs them.
class PrefillServiceGrammarTest : public PrefillServiceTest {
 protected:
  PrefillServiceGrammarTest() { constraints_ = &resolver_; }
  void TearDown() override {
    compiles_.RunHeld();
    PrefillServiceTest::TearDown();
  }

  grammar::GrammarCache grammars_{::tandem::testing::PrintableVocabulary(101)};
  ::tandem::testing::HeldExecutor compiles_;
  ConstraintResolver resolver_{&grammars_, &compiles_};
};

// The compile runs on the resolver's executor, not on the gRPC thread:
// while it is held the loop has no job and the server answers; once run,
// the first token follows the grammar.
TEST_F(PrefillServiceGrammarTest, GrammarCompilesOffTheGrpcThreadThenConstrainsTheFirstToken) {
  DecodeSide::Lease* lease = decode_->Expect(20);
  v1::PrefillRequest request = Request(RandomTokens(20, 101, 6), *lease);
  request.mutable_sampling()->mutable_constraint()->set_regex("[0-9]+");
  absl::StatusOr<v1::PrefillResponse> answer;
  std::thread caller([&] { answer = Prefill(request, absl::Seconds(60)); });
  ASSERT_TRUE(compiles_.AwaitPosted(1));
  absl::StatusOr<v1::WorkerStats> held = Stats();
  EXPECT_EQ(compiles_.RunHeld(), 1);
  caller.join();
  ASSERT_OK(held.status());
  EXPECT_EQ(held->requests_total(), 0u);
  EXPECT_EQ(held->running(), 0);
  ASSERT_OK(answer.status());
  EXPECT_GE(answer->first_token(), 16);
  EXPECT_LE(answer->first_token(), 25);
}

// The client goes while its grammar compiles: the job the compile then
// submits is cancelled (its id was not known when the cancel came) and
// every block comes back.
TEST_F(PrefillServiceGrammarTest, ClientGoneDuringTheCompileFreesEveryBlock) {
  DecodeSide::Lease* lease = decode_->Expect(20);
  v1::PrefillRequest request = Request(RandomTokens(20, 101, 7), *lease);
  request.mutable_sampling()->mutable_constraint()->set_regex("[0-9]+");
  grpc::ClientContext context;
  context.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(60)));
  grpc::Status status;
  v1::PrefillResponse response;
  std::thread caller([&] { status = stub_->Prefill(&context, request, &response); });
  ASSERT_TRUE(compiles_.AwaitPosted(1));
  context.TryCancel();
  caller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  compiles_.RunHeld();
  // The job is dropped on the loop's next round: poll its published stats.
  const absl::Time wait_until = absl::Now() + absl::Seconds(60);
  absl::StatusOr<v1::WorkerStats> stats;
  do {
    stats = Stats();
    if (stats.ok() && stats->requests_total() == 1 && stats->running() == 0 &&
        stats->kv_blocks_free() == stats->kv_blocks_total()) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  } while (absl::Now() < wait_until);
  ASSERT_OK(stats.status());
  EXPECT_EQ(stats->requests_total(), 1u);
  EXPECT_EQ(stats->running(), 0);
  EXPECT_EQ(stats->kv_blocks_free(), stats->kv_blocks_total());
}

}  // namespace
}  // namespace tandem::prefill
