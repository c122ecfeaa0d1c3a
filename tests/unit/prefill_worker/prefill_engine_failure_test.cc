// The prefill worker when its engine fails (a fake device failure part way
// through a step): the job of that step fails with the engine's error once
// its transfer let go, every KV block is free, new jobs are refused naming
// the cause, health turns NOT_SERVING and the stats say why. Also the KV
// pool sized by gpu_memory_fraction on a backend that reports device
// memory.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/model/synthetic.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "prefill_worker/prefill_loop.h"
#include "prefill_worker/prefill_service.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/device_memory_backend.h"
#include "tests/testing/failing_backend.h"
#include "tests/testing/health_client.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::DecodeSide;
using ::tandem::prefill::testing::MakeEngine;
using ::tandem::prefill::testing::Outcome;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::prefill::testing::ReferenceTokens;
using ::tandem::prefill::testing::TestShape;
using ::tandem::testing::CheckHealth;
using ::tandem::testing::DeviceMemoryBackend;
using ::tandem::testing::FailingBackend;
using ::tandem::testing::IsOkAndHolds;
using ::tandem::testing::ServingStatus;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kEngineWait = absl::Seconds(60);

// The error of a job whose step the failure hit.
auto StepError() {
  return StatusIs(absl::StatusCode::kInternal,
                  AllOf(HasSubstr("prefill step failed: the cpu backend failed"),
                        HasSubstr("injected device failure")));
}

// What a new job gets once the engine has failed.
auto Refusal() {
  return StatusIs(absl::StatusCode::kUnavailable,
                  AllOf(HasSubstr("prefill worker cannot compute: the cpu backend failed"),
                        HasSubstr("injected device failure")));
}

std::unique_ptr<Backend> OneThreadBackend() {
  auto backend = CpuBackend::Create(CpuBackendOptions{1});
  CHECK_OK(backend.status());
  return std::move(backend).value();
}

class PrefillEngineFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(weights_, MakeSyntheticModel(TestShape(), 7));
    fabric_ = kvtransfer::InProcFabric::Create();
    transport_ = kvtransfer::InProcTransport::Create(fabric_);
    decode_ = std::make_unique<DecodeSide>(*weights_, fabric_);
  }

  void StartLoop(std::unique_ptr<Backend> backend, PrefillLoopOptions options = {}) {
    options.model_name = "synthetic";
    ASSERT_OK_AND_ASSIGN(loop_, PrefillLoop::Create(*weights_, std::move(backend), transport_.get(),
                                                    &Clock::Real(), options));
  }
  // The loop over a backend that fails when told to.
  void StartFailingLoop() {
    auto backend = std::make_unique<FailingBackend>(OneThreadBackend());
    device_ = backend.get();
    StartLoop(std::move(backend));
  }

  PrefillJob Job(const std::vector<int32_t>& tokens, const DecodeSide::Lease& lease) {
    PrefillJob job;
    job.request_id = absl::StrCat("r", lease.request_id);
    job.tokens = tokens;
    job.kv_descriptor = lease.descriptor;
    job.deadline = absl::Now() + kEngineWait;
    return job;
  }

  // Stats are published before replies go out.
  void ExpectEveryBlockFree() {
    const PrefillStats stats = loop_->Stats();
    EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
    EXPECT_EQ(stats.running, 0);
    EXPECT_EQ(stats.waiting, 0);
  }

  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<DecodeSide> decode_;
  std::unique_ptr<kvtransfer::InProcTransport> transport_;
  FailingBackend* device_ = nullptr;   // Owned by the loop's engine.
  std::unique_ptr<PrefillLoop> loop_;  // Last: goes before the transport.
};

TEST_F(PrefillEngineFailureTest, FailedStepFailsItsJobFreesEveryBlockAndRefusesNewJobs) {
  StartFailingLoop();
  std::vector<absl::Status> heard;
  loop_->SetEngineFailureListener([&](const absl::Status& s) { heard.push_back(s); });
  // After layer 0's K/V was handed to the sender: the transfer was under
  // way and must let go before the blocks are freed.
  device_->FailAfter(5);
  DecodeSide::Lease* lease = decode_->Expect(37);
  Outcome out;
  EXPECT_NE(loop_->Submit(Job(RandomTokens(37, TestShape().vocab_size, 1), *lease), out.Callback()),
            0u);
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done() && lease->ended; }));
  EXPECT_THAT(out.status(), StepError());
  EXPECT_THAT(out.status().message(), HasSubstr("request 'r"));
  EXPECT_FALSE(lease->status.ok());
  ExpectEveryBlockFree();
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_THAT(heard[0], StatusIs(absl::StatusCode::kInternal, HasSubstr("can compute no more")));
  loop_->SetEngineFailureListener(nullptr);

  // Refused at once (id 0), naming the cause.
  DecodeSide::Lease* next = decode_->Expect(20);
  Outcome refused;
  EXPECT_EQ(
      loop_->Submit(Job(RandomTokens(20, TestShape().vocab_size, 2), *next), refused.Callback()),
      0u);
  ASSERT_TRUE(refused.done());
  EXPECT_THAT(refused.status(), Refusal());

  const PrefillStats stats = loop_->Stats();
  EXPECT_THAT(stats.engine_error, HasSubstr("injected device failure"));
  EXPECT_EQ(stats.requests_total, 2u);
  EXPECT_EQ(stats.requests_failed, 2u);
  EXPECT_EQ(stats.steps, 0u);
  EXPECT_GT(stats.kv_cache_bytes, 0u);
  EXPECT_EQ(stats.device_memory_total_bytes, 0u);
  decode_->Release(*lease);
  decode_->Release(*next);
}

// Through the gRPC service: the failed Prefill's status, health, GetStats
// and the refusal of the next Prefill.
TEST_F(PrefillEngineFailureTest, ServiceReportsNotServingAndTheCause) {
  StartFailingLoop();
  PrefillService service(loop_.get());
  ASSERT_OK_AND_ASSIGN(rpc::RunningServer server,
                       rpc::StartServer({.address = "127.0.0.1:0"}, {&service}));
  ReportEngineHealth(*loop_, server);
  const std::shared_ptr<grpc::Channel> channel =
      rpc::MakeChannel(absl::StrCat("127.0.0.1:", server.port));
  auto stub = v1::PrefillWorker::NewStub(channel);
  // `transfer`: the job starts a KV transfer (refused ones do not), whose
  // end the decode side waits for.
  auto prefill = [&](int len, uint64_t seed, bool transfer = true) -> absl::Status {
    DecodeSide::Lease* lease = decode_->Expect(len);
    v1::PrefillRequest request;
    request.set_request_id(absl::StrCat("r", lease->request_id));
    for (int32_t t : RandomTokens(len, TestShape().vocab_size, seed)) request.add_tokens(t);
    request.set_kv_descriptor(lease->descriptor);
    std::atomic<bool> finished{false};
    grpc::Status status;
    std::thread caller([&] {
      grpc::ClientContext context;
      context.set_deadline(rpc::ToChrono(absl::Now() + kEngineWait));
      v1::PrefillResponse response;
      status = stub->Prefill(&context, request, &response);
      finished = true;
    });
    decode_->PumpUntil([&] { return finished.load() && (lease->ended || !transfer); });
    caller.join();
    decode_->Release(*lease);
    return rpc::FromGrpc(status);
  };

  EXPECT_OK(prefill(30, 3));
  EXPECT_THAT(CheckHealth(channel, ""), IsOkAndHolds(ServingStatus::kServing));
  device_->FailAfter(5);
  EXPECT_THAT(prefill(30, 4), StepError());
  // The listener ran inside the failed step, before the job was answered.
  EXPECT_THAT(CheckHealth(channel, ""), IsOkAndHolds(ServingStatus::kNotServing));
  EXPECT_THAT(CheckHealth(channel, "tandem.v1.PrefillWorker"),
              IsOkAndHolds(ServingStatus::kNotServing));
  EXPECT_THAT(prefill(30, 5, /*transfer=*/false), Refusal());

  grpc::ClientContext context;
  context.set_deadline(rpc::ToChrono(absl::Now() + kEngineWait));
  v1::WorkerStats stats;
  ASSERT_TRUE(stub->GetStats(&context, v1::StatsRequest(), &stats).ok());
  EXPECT_THAT(stats.engine_error(), HasSubstr("the cpu backend failed"));
  EXPECT_EQ(stats.kv_blocks_free(), stats.kv_blocks_total());
  EXPECT_GT(stats.kv_cache_bytes(), 0u);

  // The listener names the server: gone before it is.
  loop_->SetEngineFailureListener(nullptr);
  server.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
}

// On a backend that reports device memory, kv_blocks 0 takes the pool from
// gpu_memory_fraction; an explicit kv_blocks wins.
TEST_F(PrefillEngineFailureTest, GpuMemoryFractionSizesThePoolUnlessKvBlocksAreGiven) {
  constexpr size_t kTotal = size_t{16} << 20;
  for (const int kv_blocks : {0, 30}) {
    SCOPED_TRACE(kv_blocks);
    auto memory = std::make_unique<DeviceMemoryBackend>(OneThreadBackend(), kTotal);
    DeviceMemoryBackend* device = memory.get();
    StartLoop(std::move(memory), {.kv_blocks = kv_blocks, .gpu_memory_fraction = 0.5});
    const PrefillStats stats = loop_->Stats();
    const KvLayout layout{TestShape().n_layers, 1, 16, TestShape().kv_dim(), DType::kF32};
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
    const std::vector<int32_t> prompt = RandomTokens(37, TestShape().vocab_size, 9);
    DecodeSide::Lease* lease = decode_->Expect(37);
    Outcome out;
    loop_->Submit(Job(prompt, *lease), out.Callback());
    ASSERT_TRUE(decode_->PumpUntil([&] { return out.done() && lease->ended; }));
    ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());
    auto reference = MakeEngine(*weights_, 16);
    EXPECT_EQ(decode_->Continue(*lease, result.first_token, 4),
              ReferenceTokens(*reference, prompt, 4));
    decode_->Release(*lease);
    loop_.reset();
  }
}

}  // namespace
}  // namespace tandem::prefill
