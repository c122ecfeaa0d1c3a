// The transfer protocol (TransferSender -> TransferReceiver) over the
// in-process transport: integrity, lanes, checksums, deadlines, generations
// and cancellation. Fault injection per mode is in transfer_faults_test.cc.
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/kvtransfer/transfer_harness.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::kvtransfer::testing::Harness;
using ::tandem::kvtransfer::testing::HarnessOptions;
using ::tandem::kvtransfer::testing::Layout;
using ::tandem::kvtransfer::testing::RandomBlocks;
using ::tandem::kvtransfer::testing::RunTransfer;
using ::tandem::kvtransfer::testing::StreamLayers;
using ::tandem::testing::IsOk;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TransferTest, IntegrityOverRandomBlockSetsSizesAndLayers) {
  std::mt19937_64 rng(12345);
  for (int trial = 0; trial < 24; ++trial) {
    SCOPED_TRACE(trial);
    HarnessOptions o;
    const int n_layers = 1 + rng() % 8;
    const int num_blocks = 8 + rng() % 24;
    o.layout = Layout(n_layers, num_blocks, 1 + rng() % 16, 1 + rng() % 32);
    o.receiver.chunk_bytes = std::vector<uint64_t>{0, 100, 1000, 4096}[rng() % 4];
    o.receiver.checksums = rng() % 2 == 0;
    o.sender.lanes = 1 << (rng() % 3);
    o.seed = rng();
    Harness h(o);
    const int count = 1 + rng() % num_blocks;
    const std::vector<int32_t> src_blocks = RandomBlocks(rng, num_blocks, count);
    const std::vector<int32_t> dst_blocks = RandomBlocks(rng, num_blocks, count);
    ASSERT_OK(RunTransfer(h, trial, src_blocks, dst_blocks, n_layers));
    EXPECT_THAT(h.rx_done[trial], ::testing::ElementsAre(IsOk()));
    EXPECT_THAT(h.tx_done[trial], ::testing::ElementsAre(IsOk()));
    EXPECT_TRUE(h.Same(src_blocks, dst_blocks));
    // Blocks outside the lease keep their old bytes.
    std::vector<int32_t> others;
    for (int b = 0; b < num_blocks; ++b) {
      if (std::find(dst_blocks.begin(), dst_blocks.end(), b) == dst_blocks.end()) {
        others.push_back(b);
      }
    }
    EXPECT_TRUE(h.Untouched(others));
    EXPECT_EQ(h.receiver->stats().dropped(), 0u);
    EXPECT_TRUE(h.receiver->idle());
    EXPECT_TRUE(h.sender->idle());
  }
}

TEST(TransferTest, LanesOneTwoFourGiveIdenticalBytes) {
  std::vector<std::byte> first;
  for (int lanes : {1, 2, 4}) {
    SCOPED_TRACE(lanes);
    HarnessOptions o;
    o.layout = Layout(6, 16, 4, 8);
    o.receiver.chunk_bytes = 200;
    o.sender.lanes = lanes;
    Harness h(o);
    const std::vector<int32_t> src_blocks = {3, 4, 5, 9, 0, 12};
    const std::vector<int32_t> dst_blocks = {7, 1, 2, 3, 15, 10};
    ASSERT_OK(RunTransfer(h, 1, src_blocks, dst_blocks, 6));
    EXPECT_THAT(h.rx_done[1], ::testing::ElementsAre(IsOk()));
    EXPECT_THAT(h.tx_done[1], ::testing::ElementsAre(IsOk()));
    EXPECT_TRUE(h.Same(src_blocks, dst_blocks));
    EXPECT_EQ(h.sender->stats().connections, static_cast<uint64_t>(lanes));
    if (first.empty()) {
      first = h.dst.bytes;
    } else {
      EXPECT_TRUE(first == h.dst.bytes);
    }
  }
}

TEST(TransferTest, ConnectionsAreReusedAcrossTransfers) {
  HarnessOptions o;
  o.sender.lanes = 2;
  Harness h(o);
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(id, {static_cast<int32_t>(id)}));
    ASSERT_OK(h.Start(lease, {0}));
    StreamLayers(h, id, 4);
    ASSERT_TRUE(h.RunUntil([&] { return h.Ended(id); }));
    EXPECT_THAT(h.tx_done[id], ::testing::ElementsAre(IsOk()));
  }
  EXPECT_EQ(h.sender->stats().connections, 2u);
}

TEST(TransferTest, IdleConnectionsAreClosedAndTheNextTransferReconnects) {
  HarnessOptions o;
  o.sender.lanes = 2;
  o.sender.idle_timeout = absl::Seconds(60);
  Harness h(o);
  ASSERT_OK(RunTransfer(h, 1, {0}, {1}, 4));
  EXPECT_THAT(h.tx_done[1], ::testing::ElementsAre(IsOk()));
  EXPECT_EQ(h.sender->stats().pooled_connections, 2u);

  // The idle time counts from the end of the last transfer (a few rounds of
  // a millisecond each before now).
  h.clock.Advance(absl::Seconds(59));
  h.sender->Poll();
  EXPECT_EQ(h.sender->stats().pooled_connections, 2u);
  h.clock.Advance(absl::Seconds(1));
  h.sender->Poll();
  EXPECT_EQ(h.sender->stats().pooled_connections, 0u);
  EXPECT_EQ(h.sender->stats().idle_closed, 2u);

  ASSERT_OK(RunTransfer(h, 2, {2}, {3}, 4));
  EXPECT_THAT(h.tx_done[2], ::testing::ElementsAre(IsOk()));
  EXPECT_THAT(h.rx_done[2], ::testing::ElementsAre(IsOk()));
  EXPECT_TRUE(h.Same({2}, {3}));
  EXPECT_EQ(h.sender->stats().connections, 4u);
  EXPECT_EQ(h.sender->stats().pooled_connections, 2u);
}

TEST(TransferTest, AFailedConnectionLeavesThePoolAndTheNextTransferReconnects) {
  HarnessOptions o;
  o.sender.lanes = 2;
  Harness h(o);
  ASSERT_OK(RunTransfer(h, 1, {0}, {1}, 4));
  EXPECT_EQ(h.sender->stats().pooled_connections, 2u);
  // The receiver's transport closes both connections (as a restarted decode
  // worker's would); the sender drops them as their failures arrive.
  auto* rx = static_cast<InProcTransport*>(h.rx_transport_.get());
  for (PeerId peer = 1; peer <= 2; ++peer) rx->Disconnect(peer);
  ASSERT_TRUE(h.RunUntil([&] { return h.sender->stats().pooled_connections == 0; }));
  ASSERT_OK(RunTransfer(h, 2, {2}, {3}, 4));
  EXPECT_THAT(h.tx_done[2], ::testing::ElementsAre(IsOk()));
  EXPECT_EQ(h.sender->stats().connections, 4u);
}

// A transport whose sends never finish until their connection is closed,
// as UCX's to a peer that died before the connection was set up: nothing
// reports the peer failed, and Cancel() cannot withdraw a send.
class StallingTransport final : public KvTransport {
 public:
  explicit StallingTransport(std::unique_ptr<KvTransport> inner) : inner_(std::move(inner)) {}

  std::string_view name() const override { return "stalling"; }
  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    return inner_->RegisterMemory(base, length, kind);
  }
  absl::Status DeregisterMemory(RegionId region) override {
    return inner_->DeregisterMemory(region);
  }
  std::string LocalAddress() const override { return inner_->LocalAddress(); }
  absl::StatusOr<PeerId> Connect(std::string_view address) override {
    return inner_->Connect(address);
  }
  // Closing the connection is what lets go of its sends.
  void Disconnect(PeerId peer) override {
    disconnected.push_back(peer);
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->second != peer) {
        ++it;
        continue;
      }
      TransportEvent done{.kind = TransportEvent::Kind::kSendDone, .id = it->first, .peer = peer};
      done.status = absl::CancelledError("connection closed");
      released_.push_back(std::move(done));
      held_.erase(it++);
    }
    inner_->Disconnect(peer);
  }
  absl::StatusOr<SendId> PostSend(PeerId peer, std::string_view, std::span<const Slice>) override {
    held_[next_send_] = peer;
    return next_send_++;
  }
  absl::Status Accept(IncomingId incoming, std::span<const Slice> destination) override {
    return inner_->Accept(incoming, destination);
  }
  void Discard(IncomingId incoming) override { inner_->Discard(incoming); }
  void Cancel(SendId) override {}
  void Poll(std::vector<TransportEvent>& events) override {
    inner_->Poll(events);
    for (TransportEvent& e : released_) events.push_back(std::move(e));
    released_.clear();
  }
  void WaitForActivity(absl::Time deadline) override { inner_->WaitForActivity(deadline); }

  std::vector<PeerId> disconnected;

 private:
  const std::unique_ptr<KvTransport> inner_;
  std::map<SendId, PeerId> held_;
  std::vector<TransportEvent> released_;
  SendId next_send_ = 1;
};

TEST(TransferTest, SendsStillHeldAtTheDeadlineCloseTheirConnection) {
  Harness h(HarnessOptions{});
  StallingTransport stalling(InProcTransport::Create(h.fabric_));
  TransferSender sender(&stalling, &h.clock, SenderOptions{});
  ASSERT_OK_AND_ASSIGN(
      RegionId region,
      sender.RegisterMemory(h.src.bytes.data(), h.src.bytes.size(), MemoryKind::kHost));
  ASSERT_EQ(region, h.src.region);  // The harness's slices name it.
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(5, {0, 1}, absl::Milliseconds(100)));
  ASSERT_OK(h.Start(lease, {0, 1}, &sender));
  for (uint32_t layer = 0; layer < 4; ++layer) ASSERT_OK(sender.MarkLayerReady(5, layer));
  auto round = [&] {
    sender.Poll();
    h.receiver->Poll();
    h.clock.Advance(testing::kStep);
  };
  for (int i = 0; i < 90; ++i) round();
  EXPECT_FALSE(h.tx_done.contains(5));
  EXPECT_EQ(sender.stats().pooled_connections, 1u);
  EXPECT_TRUE(stalling.disconnected.empty());

  // At the deadline the held sends can only be released by closing the
  // connection; the transfer then ends and the next one reconnects.
  for (int i = 0; i < 20 && !h.tx_done.contains(5); ++i) round();
  ASSERT_TRUE(h.tx_done.contains(5));
  EXPECT_THAT(h.tx_done[5], ::testing::ElementsAre(StatusIs(absl::StatusCode::kDeadlineExceeded)));
  EXPECT_EQ(stalling.disconnected.size(), 1u);
  EXPECT_EQ(sender.stats().stuck_closed, 1u);
  EXPECT_EQ(sender.stats().pooled_connections, 0u);
  EXPECT_TRUE(sender.idle());
}

// Checksums are on by default: a byte flipped on the way is refused.
TEST(TransferTest, ChecksumCatchesCorruption) {
  HarnessOptions o;
  ASSERT_TRUE(o.receiver.checksums);
  o.faults.at_message[2] = Fault{.kind = Fault::Kind::kCorrupt, .bytes = 1};
  Harness h(o);
  const std::vector<int32_t> blocks = {0, 1, 2};
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(3, blocks));
  ASSERT_OK(h.Start(lease, blocks));
  StreamLayers(h, 3, 4);
  ASSERT_TRUE(h.RunUntil([&] { return h.Ended(3); }, 50));  // Long before the deadline.
  EXPECT_THAT(h.rx_done[3], ::testing::ElementsAre(StatusIs(absl::StatusCode::kDataLoss,
                                                            HasSubstr("checksum mismatch"))));
  EXPECT_THAT(h.tx_done[3], ::testing::ElementsAre(StatusIs(absl::StatusCode::kDataLoss,
                                                            HasSubstr("aborted by the receiver"))));
  EXPECT_EQ(h.faulty_->injected(Fault::Kind::kCorrupt), 1u);
}

// What the checksum is for: without it, the same corruption is committed.
TEST(TransferTest, WithoutChecksumsCorruptionGoesUnnoticed) {
  HarnessOptions o;
  o.receiver.checksums = false;
  o.faults.at_message[2] = Fault{.kind = Fault::Kind::kCorrupt, .bytes = 1};
  Harness h(o);
  const std::vector<int32_t> blocks = {0, 1, 2};
  ASSERT_OK(RunTransfer(h, 3, blocks, blocks, 4));
  EXPECT_THAT(h.rx_done[3], ::testing::ElementsAre(IsOk()));
  EXPECT_FALSE(h.Same(blocks, blocks));
}

// Regression guard for the classic hang: the message carrying the last layer
// is lost, and nothing ever completes the transfer.
TEST(TransferTest, LostLastLayerFailsAtTheDeadlineOnBothSides) {
  HarnessOptions o;
  o.faults.at_message[3] = Fault{.kind = Fault::Kind::kDrop};  // Layer 3 of 4, one chunk each.
  Harness h(o);
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(7, {4, 5}, absl::Milliseconds(100)));
  ASSERT_OK(h.Start(lease, {0, 1}));
  StreamLayers(h, 7, 4);
  ASSERT_TRUE(h.RunUntil([&] { return h.Ended(7); }, 110));
  EXPECT_THAT(h.rx_done[7], ::testing::ElementsAre(StatusIs(absl::StatusCode::kDeadlineExceeded,
                                                            HasSubstr("request 7"))));
  EXPECT_THAT(h.tx_done[7], ::testing::ElementsAre(StatusIs(absl::StatusCode::kDeadlineExceeded,
                                                            HasSubstr("request 7"))));
  EXPECT_EQ(h.receiver->stats().deadline_exceeded, 1u);
  EXPECT_TRUE(h.receiver->idle());
  EXPECT_TRUE(h.sender->idle());
}

TEST(TransferTest, DeadlineWithoutAnySenderNamesTheRequest) {
  Harness h(HarnessOptions{});
  ASSERT_OK(h.Expect(42, {0}, absl::Milliseconds(10)).status());
  ASSERT_TRUE(h.RunUntil([&] { return h.rx_done.contains(42); }, 20));
  EXPECT_THAT(h.rx_done[42], ::testing::ElementsAre(StatusIs(absl::StatusCode::kDeadlineExceeded,
                                                             HasSubstr("request 42"))));
}

// Regression guard: a sender still holding an old lease must never write
// into the blocks after they were re-leased to the same request.
TEST(TransferTest, StaleGenerationIsDroppedAndNeverWritten) {
  Harness h(HarnessOptions{});
  const std::vector<int32_t> slot = {2, 3};
  ASSERT_OK_AND_ASSIGN(TransferLease old_lease, h.Expect(5, slot));
  ASSERT_OK(h.receiver->Cancel(5));
  h.Round();
  ASSERT_THAT(h.rx_done[5], ::testing::ElementsAre(StatusIs(absl::StatusCode::kCancelled)));
  ASSERT_OK_AND_ASSIGN(TransferLease new_lease, h.Expect(5, slot));
  EXPECT_GT(new_lease.generation, old_lease.generation);

  // The old sender, on its own transport, writes with the old lease.
  auto old_transport = InProcTransport::Create(h.fabric_);
  TransferSender old_sender(old_transport.get(), &h.clock);
  ASSERT_OK_AND_ASSIGN(
      RegionId region,
      old_sender.RegisterMemory(h.src.bytes.data(), h.src.bytes.size(), MemoryKind::kHost));
  ASSERT_EQ(region, h.src.region);
  ASSERT_OK(h.Start(old_lease, {0, 1}, &old_sender));
  for (int l = 0; l < 4; ++l) ASSERT_OK(old_sender.MarkLayerReady(5, l));
  for (int r = 0; r < 5; ++r) {
    old_sender.Poll();
    h.Round();
  }
  EXPECT_TRUE(h.Untouched(slot));
  EXPECT_EQ(h.receiver->stats().dropped_stale, 4u);
  EXPECT_EQ(h.receiver->stats().accepted_messages, 0u);
  // The receiver told it to stop.
  EXPECT_THAT(h.tx_done[5], ::testing::ElementsAre(StatusIs(absl::StatusCode::kAborted)));
  EXPECT_TRUE(old_sender.idle());
  EXPECT_EQ(h.rx_done[5].size(), 1u);

  // The new lease's sender fills the slot.
  h.tx_done.clear();
  ASSERT_OK(h.Start(new_lease, {6, 7}));
  StreamLayers(h, 5, 4);
  ASSERT_TRUE(h.RunUntil([&] { return h.tx_done.contains(5); }));
  EXPECT_THAT(h.rx_done[5], ::testing::ElementsAre(StatusIs(absl::StatusCode::kCancelled), IsOk()));
  EXPECT_TRUE(h.Same({6, 7}, slot));
}

TEST(TransferTest, DuplicatesAndReorderingAreHandled) {
  HarnessOptions o;
  o.layout = Layout(8, 16, 4, 8);
  o.receiver.chunk_bytes = 128;
  o.sender.lanes = 2;
  o.faults.random_probability = 0.5;
  o.faults.random_faults = {Fault{.kind = Fault::Kind::kDuplicate},
                            Fault{.kind = Fault::Kind::kReorder},
                            Fault{.kind = Fault::Kind::kDelayPolls, .polls = 3}};
  o.faults.seed = 3;
  Harness h(o);
  const std::vector<int32_t> src_blocks = {0, 1, 2, 3, 8};
  const std::vector<int32_t> dst_blocks = {9, 10, 4, 5, 6};
  ASSERT_OK(RunTransfer(h, 11, src_blocks, dst_blocks, 8));
  EXPECT_THAT(h.rx_done[11], ::testing::ElementsAre(IsOk()));
  EXPECT_THAT(h.tx_done[11], ::testing::ElementsAre(IsOk()));
  EXPECT_TRUE(h.Same(src_blocks, dst_blocks));
  EXPECT_GT(h.faulty_->injected(Fault::Kind::kDuplicate), 0u);
  EXPECT_GT(h.faulty_->injected(Fault::Kind::kReorder), 0u);
  EXPECT_EQ(h.receiver->stats().dropped_duplicate, h.faulty_->injected(Fault::Kind::kDuplicate));
}

TEST(TransferTest, ReceiverCancelStopsTheSender) {
  Harness h(HarnessOptions{});
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(8, {0, 1}));
  ASSERT_OK(h.Start(lease, {0, 1}));
  ASSERT_OK(h.sender->MarkLayerReady(8, 0));
  h.Round();
  h.Round();
  ASSERT_OK(h.receiver->Cancel(8));
  ASSERT_TRUE(h.RunUntil([&] { return h.Ended(8); }, 10));
  EXPECT_THAT(h.rx_done[8], ::testing::ElementsAre(StatusIs(absl::StatusCode::kCancelled,
                                                            HasSubstr("by the receiver"))));
  EXPECT_THAT(h.tx_done[8], ::testing::ElementsAre(StatusIs(absl::StatusCode::kCancelled)));
}

TEST(TransferTest, SenderCancelAbortsTheReceiver) {
  Harness h(HarnessOptions{});
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(9, {0, 1}));
  ASSERT_OK(h.Start(lease, {0, 1}));
  ASSERT_OK(h.sender->MarkLayerReady(9, 0));
  ASSERT_OK(h.sender->Cancel(9));
  ASSERT_TRUE(h.RunUntil([&] { return h.Ended(9); }, 10));
  EXPECT_THAT(h.rx_done[9], ::testing::ElementsAre(StatusIs(absl::StatusCode::kCancelled,
                                                            HasSubstr("aborted by the sender"))));
  EXPECT_THAT(h.tx_done[9], ::testing::ElementsAre(StatusIs(absl::StatusCode::kCancelled)));
  EXPECT_THAT(h.sender->MarkLayerReady(9, 1), StatusIs(absl::StatusCode::kNotFound));
}

TEST(TransferTest, StartRejectsMismatchedLayersAndBadDescriptors) {
  Harness h(HarnessOptions{});
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(1, {0, 1}));
  EXPECT_THAT(h.Start(lease, {0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the lease expects")));
  EXPECT_THAT(h.sender->Start(SendRequest{.descriptor = "garbage",
                                          .layers = {},
                                          .deadline = absl::InfiniteFuture(),
                                          .done = [](uint64_t, const absl::Status&) {}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(h.Expect(1, {2}), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_TRUE(h.tx_done.empty());
}

TEST(TransferTest, DestroyingTheReceiverEndsOpenLeases) {
  absl::flat_hash_map<uint64_t, std::vector<absl::Status>> done;
  {
    Harness h(HarnessOptions{});
    ASSERT_OK(h.receiver
                  ->Expect(ReceiveRequest{
                      .request_id = 4,
                      .layers = h.dst.Slices({0}),
                      .deadline = h.clock.Now() + absl::Seconds(1),
                      .done = [&done](uint64_t id, uint64_t,
                                      const absl::Status& s) { done[id].push_back(s); }})
                  .status());
  }
  EXPECT_THAT(done[4], ::testing::ElementsAre(StatusIs(absl::StatusCode::kCancelled)));
}

}  // namespace
}  // namespace tandem::kvtransfer
