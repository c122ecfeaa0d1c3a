// The decode worker when its engine fails (a fake device failure part way
// through a step): the requests of that step fail with the engine's error,
// the others it holds with UNAVAILABLE, every KV block is free afterwards,
// new requests are refused naming the cause, health turns NOT_SERVING and
// the stats say why. Also the KV pool sized by gpu_memory_fraction on a
// backend that reports device memory.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "decode_worker/decode_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/device_memory_backend.h"
#include "tests/testing/failing_backend.h"
#include "tests/testing/health_client.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"
#include "tests/unit/decode_worker/step_gate.h"

namespace tandem::decode {
namespace {

using ::tandem::decode::testing::DecodeHarness;
using ::tandem::decode::testing::GatedBackend;
using ::tandem::decode::testing::HarnessSetup;
using ::tandem::decode::testing::kWait;
using ::tandem::decode::testing::LocalRequest;
using ::tandem::decode::testing::NewSink;
using ::tandem::decode::testing::OneThreadBackend;
using ::tandem::decode::testing::RandomTokens;
using ::tandem::decode::testing::RecordingSink;
using ::tandem::decode::testing::RemoteRequest;
using ::tandem::decode::testing::StepLog;
using ::tandem::testing::DeviceMemoryBackend;
using ::tandem::testing::FailingBackend;
using ::tandem::testing::ServingStatus;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

using testing::kVocab;

// The error of a request whose step the failure hit.
auto StepError() {
  return StatusIs(absl::StatusCode::kInternal,
                  AllOf(HasSubstr("decode step failed: the gated backend failed"),
                        HasSubstr("injected device failure")));
}

// What a request held, or new, gets once the engine has failed.
auto Refusal() {
  return StatusIs(absl::StatusCode::kUnavailable,
                  AllOf(HasSubstr("decode worker cannot compute: the gated backend failed"),
                        HasSubstr("injected device failure")));
}

// A decode harness whose backend fails when told to, with its steps held
// at their start while the gate is armed.
struct FailingHarness {
  explicit FailingHarness(DecodeLoopOptions options = {}) {
    auto failing = std::make_unique<FailingBackend>(OneThreadBackend());
    device = failing.get();
    auto gated = std::make_unique<GatedBackend>(std::move(failing), &log);
    gate = gated.get();
    HarnessSetup setup;
    setup.backend = std::move(gated);
    h = std::make_unique<DecodeHarness>(options, kvtransfer::FaultPlan{}, std::move(setup));
  }
  StepLog log;
  FailingBackend* device = nullptr;  // Owned by the loop's engine.
  GatedBackend* gate = nullptr;
  std::unique_ptr<DecodeHarness> h;
};

// Holds steps until `a` and `b` both run (each has a token), leaving the
// loop held at the start of the step that decodes both.
void HoldUntilBothRun(FailingHarness& f, RecordingSink& a, RecordingSink& b) {
  int step = 1;
  ASSERT_TRUE(f.gate->WaitHeld(step, kWait));
  // Events of a step are out before the next one starts.
  while (a.tokens().empty() || b.tokens().empty()) {
    f.gate->Allow();
    ASSERT_TRUE(f.gate->WaitHeld(++step, kWait)) << "step " << step;
  }
}

TEST(DecodeEngineFailure, StepRequestsFailWithTheEngineErrorTheRestWithUnavailable) {
  FailingHarness f;
  DecodeHarness& h = *f.h;
  std::vector<absl::Status> heard;
  f.gate->Arm();

  // Reserved, waiting for a prefill worker's KV: in no step.
  const Request remote = RemoteRequest("remote", RandomTokens(20, kVocab, 1), 10);
  auto remote_sink = NewSink();
  ASSERT_OK(h.loop().Submit(remote, remote_sink).status());
  ASSERT_TRUE(remote_sink->WaitReserved());

  auto a = NewSink(), b = NewSink();
  ASSERT_OK(h.loop().Submit(LocalRequest("a", RandomTokens(12, kVocab, 2), 40), a).status());
  ASSERT_OK(h.loop().Submit(LocalRequest("b", RandomTokens(30, kVocab, 3), 40), b).status());
  ASSERT_NO_FATAL_FAILURE(HoldUntilBothRun(f, *a, *b));
  ASSERT_EQ(a->finished_count() + b->finished_count(), 0);

  f.device->FailAfter(5);  // Inside the first layer.
  f.gate->Disarm();
  f.gate->Allow();
  ASSERT_TRUE(a->WaitEnded());
  ASSERT_TRUE(b->WaitEnded());
  EXPECT_THAT(a->status(), StepError());
  EXPECT_THAT(b->status(), StepError());
  ASSERT_TRUE(remote_sink->WaitEnded());
  EXPECT_THAT(remote_sink->status(), Refusal());
  EXPECT_TRUE(h.AllBlocksFree());

  // Refused at once from now on, naming the cause.
  EXPECT_THAT(
      h.loop().Submit(LocalRequest("late", RandomTokens(5, kVocab, 4), 5), NewSink()).status(),
      Refusal());
  const LoopStats stats = h.loop().Stats();
  EXPECT_THAT(stats.engine_error, HasSubstr("injected device failure"));
  EXPECT_EQ(stats.requests_failed, 4u);
  EXPECT_GT(stats.kv_cache_bytes, 0u);
  EXPECT_EQ(stats.device_memory_total_bytes, 0u);

  h.loop().SetEngineFailureListener([&](const absl::Status& s) { heard.push_back(s); });
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_THAT(heard[0], StatusIs(absl::StatusCode::kInternal, HasSubstr("can compute no more")));
  h.loop().SetEngineFailureListener(nullptr);
}

// The first step of a local prompt fails part way: the request fails, its
// blocks are free, and the loop steps no more.
TEST(DecodeEngineFailure, FailedPrefillStepFreesItsBlocks) {
  FailingHarness f;
  DecodeHarness& h = *f.h;
  f.device->FailAfter(12);  // The second layer.
  auto sink = NewSink();
  ASSERT_OK(h.loop().Submit(LocalRequest("p", RandomTokens(50, kVocab, 5), 10), sink).status());
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StepError());
  EXPECT_TRUE(sink->tokens().empty());
  EXPECT_TRUE(h.AllBlocksFree());
  EXPECT_EQ(f.gate->started(), 1);
}

class DecodeEngineFailureServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    f_ = std::make_unique<FailingHarness>();
    service_ = std::make_unique<DecodeService>(&f_->h->loop());
    ASSERT_OK_AND_ASSIGN(server_, rpc::StartServer({.address = "127.0.0.1:0"}, {service_.get()}));
    ReportEngineHealth(f_->h->loop(), server_);
    channel_ = rpc::MakeChannel(absl::StrCat("127.0.0.1:", server_.port));
    stub_ = v1::DecodeWorker::NewStub(channel_);
  }
  void TearDown() override {
    // The listener names the server: gone before it is.
    f_->h->loop().SetEngineFailureListener(nullptr);
    server_.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
    server_.server.reset();
    service_.reset();
    f_.reset();
  }

  // A local request over Generate: its stream's final status.
  absl::Status Generate(const std::string& id) {
    v1::DecodeRequest request;
    request.set_request_id(id);
    for (int32_t t : RandomTokens(10, kVocab, 6)) request.add_prompt(t);
    request.set_max_tokens(5);
    request.set_local_prefill(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::ToChrono(absl::Now() + kWait));
    auto reader = stub_->Generate(&ctx, request);
    v1::DecodeEvent event;
    while (reader->Read(&event)) {
    }
    return rpc::FromGrpc(reader->Finish());
  }

  std::unique_ptr<FailingHarness> f_;
  std::unique_ptr<DecodeService> service_;
  rpc::RunningServer server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DecodeWorker::Stub> stub_;
};

TEST_F(DecodeEngineFailureServiceTest, HealthTurnsNotServingAndStatsAndRefusalsSayWhy) {
  EXPECT_OK(Generate("fine"));
  EXPECT_THAT(::tandem::testing::CheckHealth(channel_, ""),
              ::tandem::testing::IsOkAndHolds(ServingStatus::kServing));

  f_->device->FailAfter(5);
  EXPECT_THAT(Generate("failed"), StepError());
  // The listener ran inside the failed step, before the request ended.
  EXPECT_THAT(::tandem::testing::CheckHealth(channel_, ""),
              ::tandem::testing::IsOkAndHolds(ServingStatus::kNotServing));
  EXPECT_THAT(::tandem::testing::CheckHealth(channel_, "tandem.v1.DecodeWorker"),
              ::tandem::testing::IsOkAndHolds(ServingStatus::kNotServing));
  EXPECT_THAT(Generate("refused"), Refusal());

  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + kWait));
  v1::WorkerStats stats;
  ASSERT_TRUE(stub_->GetStats(&ctx, v1::StatsRequest(), &stats).ok());
  EXPECT_THAT(stats.engine_error(), HasSubstr("the gated backend failed"));
  EXPECT_GT(stats.kv_cache_bytes(), 0u);
  EXPECT_EQ(stats.device_memory_total_bytes(), 0u);
  EXPECT_TRUE(f_->h->AllBlocksFree());
}

// On a backend that reports device memory, kv_blocks 0 takes the pool from
// gpu_memory_fraction; an explicit kv_blocks wins.
TEST(DecodeGpuMemoryFraction, SizesThePoolFromTheDeviceUnlessKvBlocksAreGiven) {
  constexpr size_t kTotal = size_t{16} << 20;
  for (const int kv_blocks : {0, 40}) {
    SCOPED_TRACE(kv_blocks);
    auto memory = std::make_unique<DeviceMemoryBackend>(OneThreadBackend(), kTotal);
    DeviceMemoryBackend* device = memory.get();
    HarnessSetup setup;
    setup.backend = std::move(memory);
    DecodeLoopOptions options;
    options.kv_blocks = kv_blocks;
    options.gpu_memory_fraction = 0.5;
    DecodeHarness h(options, kvtransfer::FaultPlan{}, std::move(setup));
    const LoopStats stats = h.loop().Stats();
    const KvLayout layout{h.config().n_layers, 1, 16, h.config().kv_dim(), DType::kF32};
    const size_t block_bytes = layout.block_bytes() * layout.n_layers;
    const size_t others = device->allocated() - stats.kv_cache_bytes;
    const int want = kv_blocks > 0
                         ? kv_blocks
                         : static_cast<int>(std::floor((0.5 * kTotal - others) / block_bytes));
    EXPECT_EQ(stats.kv_blocks_total, want);
    EXPECT_EQ(stats.kv_cache_bytes, uint64_t(want) * block_bytes);
    EXPECT_EQ(stats.device_memory_total_bytes, kTotal);
    if (kv_blocks == 0) {
      EXPECT_GT(want, 8 * 8);  // Past the host default.
    }

    // And it serves.
    auto sink = NewSink();
    const Request r = LocalRequest("sized", RandomTokens(20, kVocab, 7), 6);
    ASSERT_OK_AND_ASSIGN(auto tokens, h.RunLocalChoices(r, sink));
    EXPECT_EQ(tokens[0], h.Expected(r));
  }
}

}  // namespace
}  // namespace tandem::decode
