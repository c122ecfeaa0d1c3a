// The prefill scheduler on a backend whose memory the transport cannot
// read: KV goes through host staging, each layer copied by the backend's
// KvCopier (here HostKvCopier, whose copies land only when the test says
// so) and shipped only once its copy has finished. The test thread drives
// both the scheduler and the decode side, so every step is deterministic.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "prefill_worker/prefill_scheduler.h"
#include "tests/testing/host_kv_copier.h"
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
using ::tandem::testing::CopierBackend;
using ::tandem::testing::HostKvCopier;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

// Rounds the test drives before it gives up on something that needs only
// a few (the in-process transport delivers within two polls).
constexpr int kMaxRounds = 200;

class PrefillStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(weights_, MakeSyntheticModel(TestShape(), 7));
    fabric_ = kvtransfer::InProcFabric::Create();
    transport_ = kvtransfer::InProcTransport::Create(fabric_);
    decode_ = std::make_unique<DecodeSide>(*weights_, fabric_);
    reference_ = MakeEngine(*weights_, 64);
    vocab_ = weights_->config.vocab_size;
  }

  void TearDown() override {
    if (scheduler_ != nullptr) scheduler_->Shutdown(absl::CancelledError("test over"), Soon());
    scheduler_.reset();
  }

  static absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

  // A scheduler over the CPU backend, presented as one with a copier whose
  // copies finish after `finish_after_polls` polls (0: when told).
  void Start(SchedulerOptions options = {}, int finish_after_polls = 0) {
    auto copier = std::make_unique<HostKvCopier>(finish_after_polls);
    copier_ = copier.get();
    auto backend = std::make_unique<CopierBackend>(CpuBackend::Create(CpuBackendOptions{1}).value(),
                                                   std::move(copier));
    ASSERT_OK_AND_ASSIGN(scheduler_,
                         PrefillScheduler::Create(*weights_, std::move(backend), transport_.get(),
                                                  &Clock::Real(), options));
    ASSERT_NE(scheduler_->staging(), nullptr);
  }

  std::unique_ptr<internal::Job> Job(const std::vector<int32_t>& prompt,
                                     const DecodeSide::Lease& lease, Outcome& out) {
    auto job = std::make_unique<internal::Job>(scheduler_->layout().block_size);
    job->id = next_job_++;
    job->request.request_id = absl::StrCat("r", lease.request_id);
    job->request.tokens = prompt;
    job->request.kv_descriptor = lease.descriptor;
    job->request.deadline = absl::Now() + absl::Seconds(60);
    job->done = out.Callback();
    job->lease = kvtransfer::TransferLease::Parse(lease.descriptor).value();
    job->arrived = absl::Now();
    return job;
  }

  // One round of the prefill worker (its replies delivered) and of the
  // decode side.
  void Round() {
    scheduler_->RunOnce();
    for (Reply& r : scheduler_->TakeReplies()) r.done(std::move(r.result));
    decode_->receiver().Poll();
  }
  bool RoundsUntil(const std::function<bool()>& done) {
    for (int i = 0; i < kMaxRounds; ++i) {
      if (done()) return true;
      Round();
    }
    return done();
  }

  int staging_free() const { return scheduler_->staging()->num_free(); }
  int staging_capacity() const { return scheduler_->staging()->capacity(); }
  uint64_t landed_bytes() const { return decode_->receiver().stats().accepted_bytes; }
  uint64_t layer_bytes(int blocks) const {
    return static_cast<uint64_t>(blocks) * reference_->kv_layout().block_bytes();
  }

  void ExpectExact(const std::vector<int32_t>& prompt, DecodeSide::Lease& lease,
                   const PrefillResult& result) {
    EXPECT_EQ(decode_->Continue(lease, result.first_token, 8),
              ReferenceTokens(*reference_, prompt, 8))
        << "prompt of " << prompt.size() << " tokens";
    decode_->Release(lease);
  }

  void ExpectEverythingFree() {
    EXPECT_EQ(scheduler_->active(), 0);
    EXPECT_EQ(scheduler_->free_blocks(), scheduler_->total_blocks());
    EXPECT_EQ(staging_free(), staging_capacity());
  }

  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<kvtransfer::InProcTransport> transport_;
  std::unique_ptr<DecodeSide> decode_;
  std::unique_ptr<Engine> reference_;
  HostKvCopier* copier_ = nullptr;               // Owned by the scheduler's backend.
  std::unique_ptr<PrefillScheduler> scheduler_;  // Last: goes before the transport.
  JobId next_job_ = 1;
  int vocab_ = 0;
};

// MarkLayerReady waits for the copy: while a layer's copy to the staging
// is in flight not a byte of it goes out, and each finished copy releases
// exactly its layer.
TEST_F(PrefillStagingTest, LayersShipOnlyOnceTheirCopyToStagingFinished) {
  Start();
  const std::vector<int32_t> prompt = RandomTokens(37, vocab_, 1);  // 3 blocks.
  DecodeSide::Lease* lease = decode_->Expect(37);
  Outcome out;
  std::unique_ptr<internal::Job> job = Job(prompt, *lease, out);
  ASSERT_TRUE(scheduler_->TryAdmit(job));
  EXPECT_EQ(staging_free(), staging_capacity() - 3);

  scheduler_->RunOnce();  // The step: one copy per layer, none finished.
  EXPECT_EQ(scheduler_->counters().steps, 1u);
  EXPECT_EQ(copier_->to_host_calls(), TestShape().n_layers);
  EXPECT_EQ(copier_->pending(), TestShape().n_layers);
  for (int i = 0; i < 20; ++i) Round();
  EXPECT_EQ(landed_bytes(), 0u);
  EXPECT_FALSE(lease->ended);

  for (int layer = 1; layer <= TestShape().n_layers; ++layer) {
    copier_->Complete(1);
    ASSERT_TRUE(RoundsUntil([&] { return landed_bytes() == layer * layer_bytes(3); }))
        << "layer " << layer - 1 << " was not shipped after its copy finished";
    for (int i = 0; i < 20; ++i) Round();
    if (layer < TestShape().n_layers) {
      EXPECT_EQ(landed_bytes(), layer * layer_bytes(3)) << "a layer left before its copy";
    }
  }
  ASSERT_TRUE(RoundsUntil([&] { return out.done() && lease->ended; }));
  ASSERT_OK(lease->status);
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());
  EXPECT_EQ(result.kv_bytes, static_cast<int64_t>(TestShape().n_layers * layer_bytes(3)));
  EXPECT_EQ(copier_->to_host_bytes(), TestShape().n_layers * layer_bytes(3));
  ExpectExact(prompt, *lease, result);
  ExpectEverythingFree();
}

TEST_F(PrefillStagingTest, SlotsAreFreedOnlyWhenTheTransferEnds) {
  Start();
  const std::vector<int32_t> prompt = RandomTokens(50, vocab_, 2);  // 4 blocks.
  DecodeSide::Lease* lease = decode_->Expect(50);
  Outcome out;
  std::unique_ptr<internal::Job> job = Job(prompt, *lease, out);
  ASSERT_TRUE(scheduler_->TryAdmit(job));
  scheduler_->RunOnce();
  copier_->CompleteAll();
  // Every layer handed to the sender, but the decode side has not taken
  // them: the transfer goes on, and the sender may still read the slots.
  for (int i = 0; i < 20; ++i) scheduler_->RunOnce();
  EXPECT_EQ(staging_free(), staging_capacity() - 4);
  EXPECT_FALSE(out.done());
  ASSERT_TRUE(RoundsUntil([&] { return out.done(); }));
  ASSERT_OK(out.status());
  ExpectEverythingFree();
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());
  ExpectExact(prompt, *lease, result);
}

// A failed copy (the device broke) fails the transfer with a clear status,
// tells the decode side, and gives every block and slot back.
TEST_F(PrefillStagingTest, FailedCopyFailsTheTransferAndFreesEveryBlockAndSlot) {
  Start();
  DecodeSide::Lease* lease = decode_->Expect(37);
  Outcome out;
  std::unique_ptr<internal::Job> job = Job(RandomTokens(37, vocab_, 3), *lease, out);
  ASSERT_TRUE(scheduler_->TryAdmit(job));
  scheduler_->RunOnce();
  copier_->Complete(1);  // Layer 0 copied; layers 1 and 2 fail.
  copier_->FailPending(absl::InternalError("device fell off the bus"));
  ASSERT_TRUE(RoundsUntil([&] { return out.done() && lease->ended; }));
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kInternal,
                                     HasSubstr("copying layer 1 of the KV cache to host staging "
                                               "failed: device fell off the bus")));
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("request 'r"));
  EXPECT_FALSE(lease->status.ok());
  EXPECT_EQ(out.calls(), 1);
  EXPECT_EQ(scheduler_->counters().kv_transfers_failed, 1u);
  ExpectEverythingFree();
  decode_->Release(*lease);
}

TEST_F(PrefillStagingTest, RefusedCopyFailsTheTransferAndFreesEveryBlockAndSlot) {
  Start();
  DecodeSide::Lease* lease = decode_->Expect(20);
  Outcome out;
  std::unique_ptr<internal::Job> job = Job(RandomTokens(20, vocab_, 4), *lease, out);
  ASSERT_TRUE(scheduler_->TryAdmit(job));
  copier_->FailQueueing(absl::InternalError("copy stream gone"));
  ASSERT_TRUE(RoundsUntil([&] { return out.done() && lease->ended; }));
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kInternal,
                                     HasSubstr("layer 0 of the KV cache to host staging failed: "
                                               "copy stream gone")));
  EXPECT_FALSE(lease->status.ok());
  ExpectEverythingFree();
  decode_->Release(*lease);
}

// With the staging full a job waits for admission, as for KV blocks, and
// is admitted once a transfer ends and frees its slots.
TEST_F(PrefillStagingTest, FullStagingMakesAJobWaitUntilATransferEnds) {
  SchedulerOptions options;
  options.kv_staging_blocks = 8;  // The least: a 127-token prompt's blocks.
  Start(options);
  const std::vector<int32_t> long_prompt = RandomTokens(100, vocab_, 5);  // 7 blocks.
  const std::vector<int32_t> short_prompt = RandomTokens(40, vocab_, 6);  // 3 blocks.
  DecodeSide::Lease* first = decode_->Expect(100);
  DecodeSide::Lease* second = decode_->Expect(40);
  Outcome out1;
  Outcome out2;
  std::unique_ptr<internal::Job> job1 = Job(long_prompt, *first, out1);
  std::unique_ptr<internal::Job> job2 = Job(short_prompt, *second, out2);
  ASSERT_TRUE(scheduler_->TryAdmit(job1));
  const int free_blocks = scheduler_->free_blocks();
  EXPECT_FALSE(scheduler_->TryAdmit(job2));
  ASSERT_NE(job2, nullptr);  // Untouched: it stays queued.
  EXPECT_TRUE(job2->table.blocks().empty());
  EXPECT_EQ(scheduler_->free_blocks(), free_blocks);

  scheduler_->RunOnce();
  copier_->CompleteAll();
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(scheduler_->TryAdmit(job2)) << "slots freed before the transfer ended";
    scheduler_->RunOnce();
  }
  ASSERT_TRUE(RoundsUntil([&] { return out1.done(); }));
  ASSERT_OK(out1.status());
  ASSERT_TRUE(scheduler_->TryAdmit(job2));
  scheduler_->RunOnce();
  copier_->CompleteAll();
  ASSERT_TRUE(RoundsUntil([&] { return out2.done(); }));
  ASSERT_OK_AND_ASSIGN(PrefillResult r1, out1.result());
  ASSERT_OK_AND_ASSIGN(PrefillResult r2, out2.result());
  ExpectExact(long_prompt, *first, r1);
  ExpectExact(short_prompt, *second, r2);
  ExpectEverythingFree();
}

// A prompt computed in several chunks ships from the final step, which
// copies every shipped block of each layer, earlier chunks' included; two
// jobs finishing in one step share one copy per layer.
TEST_F(PrefillStagingTest, ChunkedPromptsAndBatchedJobsArriveExactly) {
  SchedulerOptions options;
  options.max_batch_tokens = 64;
  Start(options, /*finish_after_polls=*/2);
  const std::vector<int32_t> a = RandomTokens(100, vocab_, 7);  // Chunks of 64 and 36.
  const std::vector<int32_t> b = RandomTokens(20, vocab_, 8);
  DecodeSide::Lease* la = decode_->Expect(100);
  DecodeSide::Lease* lb = decode_->Expect(20);
  Outcome oa;
  Outcome ob;
  std::unique_ptr<internal::Job> ja = Job(a, *la, oa);
  std::unique_ptr<internal::Job> jb = Job(b, *lb, ob);
  ASSERT_TRUE(scheduler_->TryAdmit(ja));
  ASSERT_TRUE(scheduler_->TryAdmit(jb));
  ASSERT_TRUE(RoundsUntil([&] { return oa.done() && ob.done(); }));
  EXPECT_EQ(scheduler_->counters().steps, 2u);
  EXPECT_EQ(copier_->to_host_calls(), TestShape().n_layers);  // Both in the second step.
  ASSERT_OK_AND_ASSIGN(PrefillResult ra, oa.result());
  ASSERT_OK_AND_ASSIGN(PrefillResult rb, ob.result());
  EXPECT_EQ(copier_->to_host_bytes(), TestShape().n_layers * layer_bytes(7 + 2));
  ExpectExact(a, *la, ra);
  ExpectExact(b, *lb, rb);
  ExpectEverythingFree();
}

TEST_F(PrefillStagingTest, StagingOptionsAreChecked) {
  SchedulerOptions options;
  options.kv_staging_blocks = 7;  // A 127-token prompt needs 8.
  auto backend = std::make_unique<CopierBackend>(CpuBackend::Create(CpuBackendOptions{1}).value(),
                                                 std::make_unique<HostKvCopier>());
  EXPECT_THAT(PrefillScheduler::Create(*weights_, std::move(backend), transport_.get(),
                                       &Clock::Real(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from 8")));
  // A host-memory backend stages nothing, so the option has nothing to act on.
  options.kv_staging_blocks = 16;
  EXPECT_THAT(PrefillScheduler::Create(*weights_, CpuBackend::Create(CpuBackendOptions{1}).value(),
                                       transport_.get(), &Clock::Real(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host memory")));
  options.kv_staging_blocks = 0;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<PrefillScheduler> direct,
      PrefillScheduler::Create(*weights_, CpuBackend::Create(CpuBackendOptions{1}).value(),
                               transport_.get(), &Clock::Real(), options));
  EXPECT_EQ(direct->staging(), nullptr);
  direct->Shutdown(absl::CancelledError("test over"), Soon());
}

}  // namespace
}  // namespace tandem::prefill
