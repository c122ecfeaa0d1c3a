// The decode loop on a backend whose memory the transport cannot write: a
// lease lands in host staging, and the loop copies it into the reserved
// blocks with the backend's KvCopier (here HostKvCopier, whose copies land
// only when the test says so) before it commits them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/host_kv_copier.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode {
namespace {

using ::tandem::decode::testing::DecodeHarness;
using ::tandem::decode::testing::HarnessSetup;
using ::tandem::decode::testing::kWait;
using ::tandem::decode::testing::NewSink;
using ::tandem::decode::testing::OneThreadBackend;
using ::tandem::decode::testing::RandomTokens;
using ::tandem::decode::testing::RecordingSink;
using ::tandem::decode::testing::RemoteRequest;
using ::tandem::decode::testing::SmallShape;
using ::tandem::decode::testing::StartResult;
using ::tandem::decode::testing::WaitFor;
using ::tandem::testing::CopierBackend;
using ::tandem::testing::HostKvCopier;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

using testing::kVocab;

// A decode harness whose loop stages its KV through a HostKvCopier.
class StagedHarness {
 public:
  explicit StagedHarness(DecodeLoopOptions options = {}) {
    auto copier = std::make_unique<HostKvCopier>();
    copier_ = copier.get();
    HarnessSetup setup;
    setup.backend = std::make_unique<CopierBackend>(OneThreadBackend(), std::move(copier));
    harness_ = std::make_unique<DecodeHarness>(options, kvtransfer::FaultPlan{}, std::move(setup));
  }

  DecodeHarness& h() { return *harness_; }
  DecodeLoop& loop() { return harness_->loop(); }
  HostKvCopier& copier() { return *copier_; }

  // Waits until the loop has run at least two more rounds that polled the
  // copier: everything it was handed before is handled.
  bool RoundsPassed() {
    const int calls = copier_->finished_calls();
    return WaitFor([&] { return copier_->finished_calls() >= calls + 2; });
  }

  // Reserves `r`, has the stand-in prefill worker send its KV (the lease
  // ends well once it all landed in the staging) and waits for the copy
  // into the blocks to be queued; returns the first token.
  absl::StatusOr<int32_t> ReserveAndReceive(const Request& r,
                                            const std::shared_ptr<RecordingSink>& sink) {
    RETURN_IF_ERROR(loop().Submit(r, sink).status());
    if (!sink->WaitReserved()) return absl::InternalError("test: no reservation");
    const int queued = copier_->to_device_calls();
    ASSIGN_OR_RETURN(int32_t first, h().prefill().Prefill(r.prompt, sink->descriptor()));
    if (!WaitFor([&] { return copier_->to_device_calls() > queued; })) {
      return absl::InternalError("test: the copy into the blocks was never queued");
    }
    return first;
  }

 private:
  HostKvCopier* copier_ = nullptr;  // Owned by the loop's backend.
  std::unique_ptr<DecodeHarness> harness_;
};

// Bytes of `blocks` KV blocks of every layer (f32 KV, 16-token blocks).
uint64_t PromptBytes(const ModelConfig& shape, int blocks) {
  const KvLayout layout{.n_layers = shape.n_layers,
                        .num_blocks = 1,
                        .block_size = 16,
                        .kv_dim = shape.n_kv_heads * (shape.dim / shape.n_heads),
                        .dtype = DType::kF32};
  return static_cast<uint64_t>(blocks) * shape.n_layers * layout.block_bytes();
}

// The blocks are committed (and decoding starts) only once the copy from
// the staging into them has finished, however early the Start comes.
TEST(DecodeStaging, CommitsOnlyAfterTheCopyIntoTheBlocksFinished) {
  StagedHarness s;
  const Request r = RemoteRequest("staged", RandomTokens(37, kVocab, 1), 12);  // 3 blocks.
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(int32_t first, s.ReserveAndReceive(r, sink));
  EXPECT_EQ(s.copier().pending(), 1);
  EXPECT_TRUE(s.copier().front_to_device());

  StartResult start;
  s.loop().Start(r.request_id, sink->generation(), first, start.Callback());
  ASSERT_TRUE(s.RoundsPassed());
  EXPECT_FALSE(start.answered()) << "committed before the copy finished";
  EXPECT_TRUE(sink->tokens().empty());
  EXPECT_EQ(s.loop().Stats().running, 0);

  s.copier().Complete(1);
  ASSERT_OK(start.Wait());
  ASSERT_TRUE(sink->WaitEnded());
  ASSERT_OK(sink->status());
  std::vector<int32_t> got = {first};
  for (int32_t t : sink->tokens()) got.push_back(t);
  EXPECT_EQ(got, s.h().Expected(r));
  EXPECT_EQ(s.copier().to_device_bytes(), PromptBytes(SmallShape(), 3));
  EXPECT_EQ(s.loop().Stats().kv_transfer_bytes, PromptBytes(SmallShape(), 3));
  EXPECT_EQ(s.copier().to_host_calls(), 0);
  EXPECT_TRUE(s.h().AllBlocksFree());
}

// A copy that fails (the device broke) fails the request as a failed
// transfer does, and gives its blocks and its staging back.
TEST(DecodeStaging, FailedCopyFailsTheRequestAndFreesItsBlocksAndStaging) {
  DecodeLoopOptions options;
  options.kv_staging_blocks = 8;  // The least: a 127-token prompt's blocks.
  StagedHarness s(options);
  const Request r = RemoteRequest("doomed", RandomTokens(100, kVocab, 2), 8);  // 7 blocks.
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(int32_t first, s.ReserveAndReceive(r, sink));
  StartResult start;
  s.loop().Start(r.request_id, sink->generation(), first, start.Callback());
  ASSERT_TRUE(s.RoundsPassed());  // The Start waits for the copy.
  s.copier().FailPending(absl::InternalError("device fell off the bus"));
  EXPECT_THAT(start.Wait(),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("copying the received KV cache from host staging to the device "
                                 "failed: device fell off the bus")));
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kInternal, HasSubstr("'doomed'")));
  EXPECT_TRUE(s.h().AllBlocksFree());

  // Every slot is free again: the same 7 blocks find room at once.
  const Request again = RemoteRequest("again", RandomTokens(100, kVocab, 3), 8);
  auto sink2 = NewSink();
  ASSERT_OK_AND_ASSIGN(int32_t first2, s.ReserveAndReceive(again, sink2));
  s.copier().Complete(1);
  StartResult start2;
  s.loop().Start(again.request_id, sink2->generation(), first2, start2.Callback());
  ASSERT_OK(start2.Wait());
  ASSERT_TRUE(sink2->WaitEnded());
  ASSERT_OK(sink2->status());
  EXPECT_TRUE(s.h().AllBlocksFree());
}

TEST(DecodeStaging, RefusedCopyFailsTheRequestAndFreesItsBlocks) {
  StagedHarness s;
  s.copier().FailQueueing(absl::InternalError("copy stream gone"));
  const Request r = RemoteRequest("refused", RandomTokens(20, kVocab, 4), 8);
  auto sink = NewSink();
  ASSERT_OK(s.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  ASSERT_OK(s.h().prefill().Prefill(r.prompt, sink->descriptor()).status());
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kInternal, HasSubstr("copy stream gone")));
  EXPECT_TRUE(s.h().AllBlocksFree());
}

// A request cancelled while the copy into its blocks is in flight keeps
// them until the copy is done, so that no other request gets blocks a copy
// still writes.
TEST(DecodeStaging, CancelDuringTheCopyKeepsTheBlocksUntilItFinished) {
  StagedHarness s;
  const Request r = RemoteRequest("cancelled", RandomTokens(45, kVocab, 5), 8);
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket ticket, s.loop().Submit(r, sink));
  ASSERT_TRUE(sink->WaitReserved());
  const int queued = s.copier().to_device_calls();
  ASSERT_OK(s.h().prefill().Prefill(r.prompt, sink->descriptor()).status());
  ASSERT_TRUE(WaitFor([&] { return s.copier().to_device_calls() > queued; }));
  s.loop().Cancel(ticket);
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kCancelled));
  ASSERT_TRUE(s.RoundsPassed());
  const LoopStats held = s.loop().Stats();
  EXPECT_LT(held.kv_blocks_free, held.kv_blocks_total) << "blocks freed under a running copy";
  s.copier().Complete(1);
  EXPECT_TRUE(s.h().AllBlocksFree());
}

// With the staging full a reservation waits, as for KV blocks, until a
// copy finishes and frees its slots.
TEST(DecodeStaging, FullStagingMakesAReservationWait) {
  DecodeLoopOptions options;
  options.kv_staging_blocks = 8;
  StagedHarness s(options);
  const Request a = RemoteRequest("a", RandomTokens(100, kVocab, 6), 6);  // 7 blocks.
  const Request b = RemoteRequest("b", RandomTokens(40, kVocab, 7), 6);   // 3 blocks.
  auto sink_a = NewSink();
  auto sink_b = NewSink();
  ASSERT_OK(s.loop().Submit(a, sink_a).status());
  ASSERT_TRUE(sink_a->WaitReserved());
  ASSERT_OK(s.loop().Submit(b, sink_b).status());
  // a's transfer ends in a round after b was taken in: b found no room.
  ASSERT_OK_AND_ASSIGN(int32_t first_a, s.h().prefill().Prefill(a.prompt, sink_a->descriptor()));
  ASSERT_TRUE(s.copier().WaitForPending(1, kWait));
  ASSERT_TRUE(s.RoundsPassed());
  EXPECT_EQ(sink_b->reserved_count(), 0) << "reserved with the staging full";

  s.copier().Complete(1);  // a's slots come back.
  ASSERT_TRUE(sink_b->WaitReserved());
  ASSERT_OK_AND_ASSIGN(int32_t first_b, s.h().prefill().Prefill(b.prompt, sink_b->descriptor()));
  ASSERT_TRUE(s.copier().WaitForPending(1, kWait));
  s.copier().Complete(1);
  StartResult start_a;
  StartResult start_b;
  s.loop().Start(a.request_id, sink_a->generation(), first_a, start_a.Callback());
  s.loop().Start(b.request_id, sink_b->generation(), first_b, start_b.Callback());
  ASSERT_OK(start_a.Wait());
  ASSERT_OK(start_b.Wait());
  ASSERT_TRUE(sink_a->WaitEnded());
  ASSERT_TRUE(sink_b->WaitEnded());
  std::vector<int32_t> got_b = {first_b};
  for (int32_t t : sink_b->tokens()) got_b.push_back(t);
  EXPECT_EQ(got_b, s.h().Expected(b));
  EXPECT_TRUE(s.h().AllBlocksFree());
}

// A lease that fails (the sender gave up after one layer) frees its
// staging with its blocks.
TEST(DecodeStaging, FailedLeaseFreesItsStaging) {
  DecodeLoopOptions options;
  options.kv_staging_blocks = 8;
  StagedHarness s(options);
  const Request r = RemoteRequest("aborted", RandomTokens(100, kVocab, 8), 6);
  auto sink = NewSink();
  ASSERT_OK(s.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  EXPECT_FALSE(s.h().prefill().Prefill(r.prompt, sink->descriptor(), /*abort_after_layer=*/0).ok());
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_FALSE(sink->status().ok());
  EXPECT_EQ(s.copier().to_device_calls(), 0);
  EXPECT_TRUE(s.h().AllBlocksFree());
  // The same 7 blocks of staging are free again.
  auto sink2 = NewSink();
  ASSERT_OK(s.loop().Submit(RemoteRequest("next", r.prompt, 6), sink2).status());
  EXPECT_TRUE(sink2->WaitReserved());
}

TEST(DecodeStaging, StagingOptionsAreChecked) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ModelWeights> weights, MakeSyntheticModel(SmallShape(), 7));
  auto transport = kvtransfer::InProcTransport::Create(kvtransfer::InProcFabric::Create());
  DecodeLoopOptions options;
  options.kv_staging_blocks = 16;
  EXPECT_THAT(DecodeLoop::Create(*weights, OneThreadBackend(), transport.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host memory")));
  options.kv_staging_blocks = 7;
  EXPECT_THAT(DecodeLoop::Create(*weights,
                                 std::make_unique<CopierBackend>(OneThreadBackend(),
                                                                 std::make_unique<HostKvCopier>()),
                                 transport.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from 8")));
}

}  // namespace
}  // namespace tandem::decode
