// The transfer protocol under every FaultyTransport mode, and under many
// concurrent transfers cancelled at random from both sides.
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

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
using ::tandem::kvtransfer::testing::StreamLayers;
using ::tandem::testing::IsOk;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

struct FaultCase {
  std::string name;
  Fault fault;
  uint64_t index;
};

class FaultModeTest : public ::testing::TestWithParam<FaultCase> {};

// Every fault ends in a correct transfer or a clear failure within the
// deadline, with `done` run exactly once on both sides and nothing left.
TEST_P(FaultModeTest, EndsCorrectlyOrFailsClearly) {
  const FaultCase& c = GetParam();
  HarnessOptions o;
  o.layout = Layout(4, 16, 4, 8);
  o.receiver.chunk_bytes = 256;  // Two chunks per layer of two blocks.
  o.receiver.checksums = true;
  o.sender.lanes = 2;
  o.faults.at_message[c.index] = c.fault;
  Harness h(o);
  const std::vector<int32_t> src_blocks = {1, 2};
  const std::vector<int32_t> dst_blocks = {5, 9};
  ASSERT_OK_AND_ASSIGN(TransferLease lease, h.Expect(1, dst_blocks, absl::Milliseconds(100)));
  ASSERT_OK(h.Start(lease, src_blocks));
  StreamLayers(h, 1, 4);
  ASSERT_TRUE(h.RunUntil([&] { return h.Ended(1); }, 110));
  ASSERT_EQ(h.rx_done[1].size(), 1u);
  ASSERT_EQ(h.tx_done[1].size(), 1u);
  const absl::Status& rx = h.rx_done[1][0];
  const absl::Status& tx = h.tx_done[1][0];
  if (rx.ok()) {
    EXPECT_TRUE(h.Same(src_blocks, dst_blocks));
  } else {
    EXPECT_THAT(std::string(rx.message()), HasSubstr("request 1"));
  }
  if (tx.ok()) {
    EXPECT_TRUE(rx.ok()) << "the sender may only succeed on a confirmed transfer";
  } else {
    EXPECT_THAT(std::string(tx.message()), HasSubstr("request 1"));
  }
  EXPECT_TRUE(h.receiver->idle());
  EXPECT_TRUE(h.sender->idle());
  EXPECT_EQ(h.faulty_->injected(c.fault.kind), 1u);
  // Faults the protocol recovers from must not fail the transfer.
  const Fault::Kind k = c.fault.kind;
  if (k == Fault::Kind::kDuplicate || k == Fault::Kind::kReorder || k == Fault::Kind::kDelayPolls ||
      k == Fault::Kind::kDelayTime) {
    EXPECT_OK(rx);
    EXPECT_OK(tx);
  }
  if (k == Fault::Kind::kTruncate || k == Fault::Kind::kCorrupt) {
    EXPECT_THAT(rx, StatusIs(absl::StatusCode::kDataLoss));
  }
  if (k == Fault::Kind::kDrop) {
    EXPECT_THAT(rx, StatusIs(absl::StatusCode::kDeadlineExceeded));
  }
  if (k == Fault::Kind::kKill) {
    EXPECT_THAT(tx, StatusIs(absl::StatusCode::kUnavailable));
  }
}

std::vector<FaultCase> AllFaultCases() {
  const std::vector<std::pair<std::string, Fault>> faults = {
      {"Drop", Fault{.kind = Fault::Kind::kDrop}},
      {"DelayPolls", Fault{.kind = Fault::Kind::kDelayPolls, .polls = 5}},
      {"DelayTime", Fault{.kind = Fault::Kind::kDelayTime, .delay = absl::Milliseconds(20)}},
      {"Duplicate", Fault{.kind = Fault::Kind::kDuplicate}},
      {"Reorder", Fault{.kind = Fault::Kind::kReorder}},
      {"Truncate", Fault{.kind = Fault::Kind::kTruncate, .bytes = 8}},
      {"Corrupt", Fault{.kind = Fault::Kind::kCorrupt, .bytes = 3}},
      {"Kill", Fault{.kind = Fault::Kind::kKill}},
  };
  std::vector<FaultCase> cases;
  for (const auto& [name, fault] : faults) {
    for (uint64_t index : {0, 3, 7}) {  // First, middle and last of 8 data messages.
      cases.push_back(FaultCase{name + "AtMessage" + std::to_string(index), fault, index});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllModes, FaultModeTest, ::testing::ValuesIn(AllFaultCases()),
                         [](const ::testing::TestParamInfo<FaultCase>& info) {
                           return info.param.name;
                         });

TEST(TransferTest, HundredConcurrentTransfersWithRandomCancellations) {
  constexpr int kTransfers = 100;
  constexpr int kBlocksEach = 2;
  HarnessOptions o;
  o.layout = Layout(4, kTransfers * kBlocksEach, 2, 8);
  o.receiver.chunk_bytes = 96;
  o.sender.lanes = 2;
  Harness h(o);
  std::mt19937_64 rng(99);
  std::vector<std::vector<int32_t>> src_blocks(kTransfers), dst_blocks(kTransfers);
  std::vector<int> next_layer(kTransfers, 0);
  for (int i = 0; i < kTransfers; ++i) {
    for (int b = 0; b < kBlocksEach; ++b) {
      src_blocks[i].push_back(
          static_cast<int32_t>((i * kBlocksEach + b * 37) % (kTransfers * kBlocksEach)));
      dst_blocks[i].push_back(
          static_cast<int32_t>(kTransfers * kBlocksEach - 1 - i * kBlocksEach - b));
    }
    ASSERT_OK_AND_ASSIGN(TransferLease lease,
                         h.Expect(i, dst_blocks[i], absl::Milliseconds(100 + rng() % 200)));
    ASSERT_OK(h.Start(lease, src_blocks[i]));
  }
  int sender_cancels = 0, receiver_cancels = 0;
  auto all_ended = [&] {
    for (int i = 0; i < kTransfers; ++i) {
      if (!h.Ended(i)) return false;
    }
    return true;
  };
  for (int round = 0; round < 400 && !all_ended(); ++round) {
    for (int i = 0; i < kTransfers; ++i) {
      const uint64_t dice = rng() % 1000;
      if (dice < 5) {
        sender_cancels += h.sender->Cancel(i).ok();
      } else if (dice < 10) {
        receiver_cancels += h.receiver->Cancel(i).ok();
      } else if (dice < 300 && next_layer[i] < 4) {
        if (h.sender->MarkLayerReady(i, next_layer[i]).ok()) ++next_layer[i];
      }
    }
    h.Round();
  }
  ASSERT_TRUE(all_ended());
  EXPECT_GT(sender_cancels, 0);
  EXPECT_GT(receiver_cancels, 0);
  int rx_ok = 0, tx_ok = 0;
  for (int i = 0; i < kTransfers; ++i) {
    ASSERT_EQ(h.rx_done[i].size(), 1u) << i;
    ASSERT_EQ(h.tx_done[i].size(), 1u) << i;
    rx_ok += h.rx_done[i][0].ok();
    tx_ok += h.tx_done[i][0].ok();
    if (h.tx_done[i][0].ok()) {
      EXPECT_TRUE(h.rx_done[i][0].ok()) << i;
    }
    if (h.rx_done[i][0].ok()) {
      EXPECT_TRUE(h.Same(src_blocks[i], dst_blocks[i])) << i;
    }
  }
  EXPECT_GT(rx_ok, 0);
  EXPECT_LT(rx_ok, kTransfers);
  const ReceiverStats& rs = h.receiver->stats();
  const SenderStats& ss = h.sender->stats();
  EXPECT_EQ(rs.leases, static_cast<uint64_t>(kTransfers));
  EXPECT_EQ(rs.completed, static_cast<uint64_t>(rx_ok));
  EXPECT_EQ(rs.completed + rs.failed, static_cast<uint64_t>(kTransfers));
  EXPECT_EQ(ss.completed, static_cast<uint64_t>(tx_ok));
  EXPECT_EQ(ss.completed + ss.failed, static_cast<uint64_t>(kTransfers));
  EXPECT_TRUE(h.receiver->idle());
  EXPECT_TRUE(h.sender->idle());
}

}  // namespace
}  // namespace tandem::kvtransfer
