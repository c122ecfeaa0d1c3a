#include "kvtransfer/inproc_transport.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::testing::StatusIs;
using Kind = TransportEvent::Kind;

std::vector<TransportEvent> PollAll(KvTransport& t) {
  std::vector<TransportEvent> events;
  t.Poll(events);
  return events;
}

class InProcTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fabric_ = InProcFabric::Create();
    a_ = InProcTransport::Create(fabric_);
    b_ = InProcTransport::Create(fabric_);
    src_.assign(64, 0);
    dst_.assign(64, 0);
    for (int i = 0; i < 64; ++i) src_[i] = static_cast<char>(i + 1);
    ASSERT_OK_AND_ASSIGN(src_region_,
                         a_->RegisterMemory(src_.data(), src_.size(), MemoryKind::kHost));
    ASSERT_OK_AND_ASSIGN(dst_region_,
                         b_->RegisterMemory(dst_.data(), dst_.size(), MemoryKind::kHost));
    ASSERT_OK_AND_ASSIGN(a_to_b_, a_->Connect(b_->LocalAddress()));
  }

  std::shared_ptr<InProcFabric> fabric_;
  std::unique_ptr<InProcTransport> a_, b_;
  std::vector<char> src_, dst_;
  RegionId src_region_ = 0, dst_region_ = 0;
  PeerId a_to_b_ = 0;
};

TEST_F(InProcTransportTest, BytesMoveOnlyAfterAcceptInsidePoll) {
  const Slice gather[] = {{src_region_, 0, 4}, {src_region_, 10, 6}};
  ASSERT_OK_AND_ASSIGN(SendId send, a_->PostSend(a_to_b_, "hdr", gather));
  std::vector<TransportEvent> events = PollAll(*b_);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kIncoming);
  EXPECT_EQ(events[0].header, "hdr");
  EXPECT_EQ(events[0].payload_bytes, 10u);
  const Slice scatter[] = {{dst_region_, 20, 5}, {dst_region_, 40, 5}};
  ASSERT_OK(b_->Accept(events[0].id, scatter));
  EXPECT_EQ(dst_[20], 0);  // Nothing lands before the next Poll.
  EXPECT_TRUE(PollAll(*a_).empty());
  events = PollAll(*b_);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kReceiveDone);
  EXPECT_OK(events[0].status);
  const std::vector<char> want = {1, 2, 3, 4, 11, 12, 13, 14, 15, 16};
  EXPECT_EQ(std::vector<char>(dst_.begin() + 20, dst_.begin() + 25),
            std::vector<char>(want.begin(), want.begin() + 5));
  EXPECT_EQ(std::vector<char>(dst_.begin() + 40, dst_.begin() + 45),
            std::vector<char>(want.begin() + 5, want.end()));
  events = PollAll(*a_);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kSendDone);
  EXPECT_EQ(events[0].id, send);
  EXPECT_OK(events[0].status);
}

TEST_F(InProcTransportTest, DiscardWritesNothingAndReplyUsesTheIncomingPeer) {
  const Slice gather[] = {{src_region_, 0, 8}};
  ASSERT_OK(a_->PostSend(a_to_b_, "x", gather).status());
  std::vector<TransportEvent> events = PollAll(*b_);
  ASSERT_EQ(events.size(), 1u);
  b_->Discard(events[0].id);
  EXPECT_THAT(b_->Accept(events[0].id, std::vector<Slice>{{dst_region_, 0, 8}}),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(PollAll(*b_).empty());
  EXPECT_EQ(dst_, std::vector<char>(64, 0));
  events = PollAll(*a_);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kSendDone);

  ASSERT_OK(a_->PostSend(a_to_b_, "ping", {}).status());
  events = PollAll(*b_);
  ASSERT_EQ(events.size(), 1u);
  ASSERT_OK(b_->PostSend(events[0].peer, "pong", {}).status());
  b_->Discard(events[0].id);
  events = PollAll(*a_);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].kind, Kind::kIncoming);
  EXPECT_EQ(events[1].header, "pong");
  EXPECT_EQ(events[1].peer, a_to_b_);
}

TEST_F(InProcTransportTest, AcceptRejectsWrongLength) {
  ASSERT_OK(a_->PostSend(a_to_b_, "x", std::vector<Slice>{{src_region_, 0, 8}}).status());
  std::vector<TransportEvent> events = PollAll(*b_);
  EXPECT_THAT(b_->Accept(events[0].id, std::vector<Slice>{{dst_region_, 0, 7}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(b_->Accept(events[0].id, std::vector<Slice>{{dst_region_, 60, 8}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(InProcTransportTest, CancelBeforeCopyLeavesDestinationUntouched) {
  ASSERT_OK_AND_ASSIGN(SendId send,
                       a_->PostSend(a_to_b_, "x", std::vector<Slice>{{src_region_, 0, 8}}));
  std::vector<TransportEvent> events = PollAll(*b_);
  ASSERT_OK(b_->Accept(events[0].id, std::vector<Slice>{{dst_region_, 0, 8}}));
  a_->Cancel(send);
  events = PollAll(*b_);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kReceiveDone);
  EXPECT_THAT(events[0].status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(dst_, std::vector<char>(64, 0));
  events = PollAll(*a_);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].status, StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(InProcTransportTest, ClosingATransportFailsItsPeers) {
  ASSERT_OK_AND_ASSIGN(SendId send,
                       a_->PostSend(a_to_b_, "x", std::vector<Slice>{{src_region_, 0, 8}}));
  b_.reset();
  std::vector<TransportEvent> events = PollAll(*a_);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, Kind::kSendDone);
  EXPECT_EQ(events[0].id, send);
  EXPECT_THAT(events[0].status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(events[1].kind, Kind::kPeerFailed);
  EXPECT_EQ(events[1].peer, a_to_b_);
  EXPECT_THAT(a_->PostSend(a_to_b_, "x", {}), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(InProcTransportTest, BadAddresses) {
  EXPECT_THAT(a_->Connect("nonsense"), StatusIs(absl::StatusCode::kInvalidArgument));
  auto other = InProcFabric::Create();
  auto stranger = InProcTransport::Create(other);
  EXPECT_THAT(a_->Connect(stranger->LocalAddress()), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string gone = InProcTransport::Create(fabric_)->LocalAddress();
  EXPECT_THAT(a_->Connect(gone), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(a_->RegisterMemory(nullptr, 0, MemoryKind::kCuda),
              StatusIs(absl::StatusCode::kUnimplemented));
}

TEST_F(InProcTransportTest, WaitForActivityReturnsAtDeadline) {
  const absl::Time start = absl::Now();
  a_->WaitForActivity(start + absl::Milliseconds(5));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(4));
}

}  // namespace
}  // namespace tandem::kvtransfer
