// Checksums verified off the polling thread (ReceiverOptions::verify_executor
// and verify_threads): a chunk counts as landed only once its check has read
// it, a mismatch found there fails the transfer as an inline one does, and
// nothing ends while a check still reads the destination.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "common/base/clock.h"
#include "common/base/executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/chunk_verifier.h"
#include "kvtransfer/slices.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/kvtransfer/transfer_harness.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::kvtransfer::testing::Harness;
using ::tandem::kvtransfer::testing::HarnessOptions;
using ::tandem::kvtransfer::testing::RandomBlocks;
using ::tandem::kvtransfer::testing::StreamLayers;
using ::tandem::testing::IsOk;
using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::span<const std::byte>> Parts(const std::vector<std::byte>& bytes, size_t cut) {
  return {std::span<const std::byte>(bytes).first(cut),
          std::span<const std::byte>(bytes).subspan(cut)};
}

TEST(ChunkVerifierTest, VerdictsComeOutTaggedOnceTheirChecksRan) {
  std::vector<std::byte> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7);
  const uint64_t sum = Xxh3Of(Parts(bytes, bytes.size()));
  // Split anywhere, the parts hash as the whole.
  EXPECT_EQ(Xxh3Of(Parts(bytes, 333)), sum);

  FakeClock clock;
  ManualExecutor executor(&clock);
  ChunkVerifier verifier(&executor);
  verifier.Submit(1, Parts(bytes, 10), sum);
  verifier.Submit(2, Parts(bytes, 10), sum + 1);
  std::vector<ChunkVerifier::Verdict> got;
  verifier.Collect(got);
  EXPECT_TRUE(got.empty());  // Nothing ran yet.
  EXPECT_EQ(verifier.outstanding(), 2u);
  executor.RunDue();
  verifier.Collect(got);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].tag, 1u);
  EXPECT_TRUE(got[0].ok);
  EXPECT_EQ(got[1].tag, 2u);
  EXPECT_FALSE(got[1].ok);
  EXPECT_EQ(verifier.outstanding(), 0u);

  // Below the offload size a chunk is checked at once, executor or not.
  ChunkVerifier small_inline(&executor, bytes.size() + 1);
  small_inline.Submit(8, Parts(bytes, 1), sum + 1);
  got.clear();
  small_inline.Collect(got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tag, 8u);
  EXPECT_FALSE(got[0].ok);
  EXPECT_EQ(executor.pending(), 0u);

  ChunkVerifier inline_verifier(nullptr);
  inline_verifier.Submit(7, Parts(bytes, 500), sum);
  got.clear();
  inline_verifier.Collect(got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].ok);
}

TEST(ChunkVerifierTest, ChecksOutlivingTheVerifierFinishQuietly) {
  std::vector<std::byte> bytes(64, std::byte{1});
  FakeClock clock;
  ManualExecutor executor(&clock);
  {
    ChunkVerifier verifier(&executor);
    verifier.Submit(1, Parts(bytes, 1), 0);
  }
  EXPECT_EQ(executor.RunDue(), 1);
}

HarnessOptions Offloaded(Executor* executor) {
  HarnessOptions o;
  o.receiver.verify_executor = executor;
  o.receiver.verify_offload_bytes = 0;  // The harness's chunks are small.
  return o;
}

TEST(OffloadedChecksTest, TheTransferCompletesOnlyOnceItsChecksHaveRun) {
  FakeClock executor_clock;
  ManualExecutor executor(&executor_clock);
  Harness h(Offloaded(&executor));
  const std::vector<int32_t> blocks = {2, 3, 5};
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(1, blocks));
  ASSERT_OK(h.Start(lease, blocks));
  StreamLayers(h, 1, 4);
  EXPECT_FALSE(h.RunUntil([&] { return h.rx_done.contains(1); }, 50));
  EXPECT_EQ(executor.pending(), 4u);  // One check a layer, none run.
  EXPECT_EQ(executor.RunDue(), 4);
  ASSERT_TRUE(h.RunUntil([&] { return h.Ended(1); }, 10));
  EXPECT_THAT(h.rx_done[1], ElementsAre(IsOk()));
  EXPECT_THAT(h.tx_done[1], ElementsAre(IsOk()));
  EXPECT_TRUE(h.Same(blocks, blocks));
  EXPECT_EQ(h.receiver->stats().accepted_bytes, 4 * blocks.size() * h.dst.block_bytes());
}

TEST(OffloadedChecksTest, AMismatchFoundOffThePollingThreadFailsTheTransfer) {
  FakeClock executor_clock;
  ManualExecutor executor(&executor_clock);
  HarnessOptions o = Offloaded(&executor);
  o.faults.at_message[2] = Fault{.kind = Fault::Kind::kCorrupt, .bytes = 1};
  Harness h(o);
  const std::vector<int32_t> blocks = {0, 1, 2};
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(3, blocks));
  ASSERT_OK(h.Start(lease, blocks));
  StreamLayers(h, 3, 4);
  h.Round();
  EXPECT_FALSE(h.rx_done.contains(3));
  executor.RunDue();
  ASSERT_TRUE(h.RunUntil([&] { return h.Ended(3); }, 20));
  EXPECT_THAT(h.rx_done[3],
              ElementsAre(StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch"))));
  EXPECT_THAT(h.tx_done[3], ElementsAre(StatusIs(absl::StatusCode::kDataLoss,
                                                 HasSubstr("aborted by the receiver"))));
}

// Chunks below the offload size never reach the verifier threads.
TEST(OffloadedChecksTest, ChunksBelowTheOffloadSizeAreCheckedInline) {
  FakeClock executor_clock;
  ManualExecutor executor(&executor_clock);
  HarnessOptions o = Offloaded(&executor);
  o.receiver.verify_offload_bytes = 1 << 30;
  Harness h(o);
  const std::vector<int32_t> blocks = {4, 6};
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(2, blocks));
  ASSERT_OK(h.Start(lease, blocks));
  StreamLayers(h, 2, 4);
  ASSERT_TRUE(h.RunUntil([&] { return h.Ended(2); }, 20));
  EXPECT_THAT(h.rx_done[2], ElementsAre(IsOk()));
  EXPECT_TRUE(h.Same(blocks, blocks));
  EXPECT_EQ(executor.pending(), 0u);
}

// `done` gives the destination back, so it must wait for every check still
// reading it, whatever ended the lease.
TEST(OffloadedChecksTest, CancelAndDeadlineWaitForTheChecksStillReading) {
  FakeClock executor_clock;
  ManualExecutor executor(&executor_clock);
  Harness h(Offloaded(&executor));
  ASSERT_OK_AND_ASSIGN(TransferLease cancelled, h.Expect(5, {0, 1}));
  ASSERT_OK_AND_ASSIGN(TransferLease expired, h.Expect(6, {2, 3}, absl::Milliseconds(30)));
  ASSERT_OK(h.Start(cancelled, {0, 1}));
  ASSERT_OK(h.Start(expired, {2, 3}));
  for (uint32_t layer = 0; layer < 2; ++layer) {
    ASSERT_OK(h.sender->MarkLayerReady(5, layer));
    ASSERT_OK(h.sender->MarkLayerReady(6, layer));
  }
  h.RunUntil([&] { return executor.pending() == 4; }, 10);
  ASSERT_EQ(executor.pending(), 4u);
  ASSERT_OK(h.receiver->Cancel(5));
  h.RunUntil([] { return false; }, 40);  // Past request 6's deadline.
  EXPECT_TRUE(h.rx_done.empty());
  executor.RunDue();
  h.Round();
  EXPECT_THAT(h.rx_done[5], ElementsAre(StatusIs(absl::StatusCode::kCancelled)));
  EXPECT_THAT(h.rx_done[6], ElementsAre(StatusIs(absl::StatusCode::kDeadlineExceeded)));
  EXPECT_TRUE(h.receiver->idle());
}

TEST(OffloadedChecksTest, DestroyingTheReceiverWithChecksQueuedEndsItsLeases) {
  FakeClock executor_clock;
  ManualExecutor executor(&executor_clock);
  {
    Harness h(Offloaded(&executor));
    ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(4, {0}));
    ASSERT_OK(h.Start(lease, {0}));
    StreamLayers(h, 4, 4);
    h.Round();
    ASSERT_GT(executor.pending(), 0u);
    h.receiver.reset();
    EXPECT_THAT(h.rx_done[4], ElementsAre(StatusIs(absl::StatusCode::kCancelled)));
    executor.RunDue();  // The destination is still alive; the verdicts go nowhere.
  }
}

// The receiver's own threads, as a decode worker runs them: every transfer
// ends, the clean ones with their bytes and the corrupted ones refused.
TEST(OffloadedChecksTest, VerifierThreadsLandCleanTransfersAndRefuseCorruptOnes) {
  HarnessOptions o;
  o.layout = testing::Layout(4, 64, 4, 16);
  o.receiver.verify_threads = 2;
  o.receiver.verify_offload_bytes = 0;
  o.faults.random_faults = {Fault{.kind = Fault::Kind::kCorrupt, .bytes = 3}};
  o.faults.random_probability = 0.05;
  o.faults.seed = 11;
  Harness h(o);
  std::mt19937_64 rng(5);
  int clean = 0, refused = 0;
  for (uint64_t id = 1; id <= 30; ++id) {
    const std::vector<int32_t> blocks = RandomBlocks(rng, 64, 1 + rng() % 8);
    // A long lease: each round moves the fake clock a millisecond while the
    // checks run in real time.
    ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(id, blocks, absl::Hours(24)));
    ASSERT_OK(h.Start(lease, blocks));
    StreamLayers(h, id, 4);
    ASSERT_TRUE(h.RunUntil([&] { return h.Ended(id); }, 50'000'000)) << "transfer " << id;
    ASSERT_EQ(h.rx_done[id].size(), 1u);
    if (h.rx_done[id][0].ok()) {
      EXPECT_TRUE(h.Same(blocks, blocks)) << "transfer " << id;
      ++clean;
    } else {
      EXPECT_THAT(h.rx_done[id][0],
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));
      ++refused;
    }
  }
  EXPECT_GT(clean, 0);
  EXPECT_GT(refused, 0);
  // Each refusal has a corrupted message behind it.
  EXPECT_LE(static_cast<uint64_t>(refused), h.faulty_->injected(Fault::Kind::kCorrupt));
}

}  // namespace
}  // namespace tandem::kvtransfer
