// LinkModelTransport: a message reaches its peer exactly when the link model
// says (bytes over bandwidth, per-message cost, latency, the lanes it
// queues for), never before an earlier one to the same peer, and a held
// message can be cancelled or fails with its connection.
#include "kvtransfer/link_model_transport.h"

#include <memory>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "tests/testing/status_matchers.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::testing::StatusIs;
using Kind = TransportEvent::Kind;

// 1,000 bytes per millisecond; every message here is a 4-byte header and
// 996 payload bytes (1 ms on a lane).
constexpr double kBandwidth = 1e6;
constexpr uint64_t kPayload = 996;

class LinkModelTransportTest : public ::testing::Test {
 protected:
  void Make(LinkModel model, const Clock* release_clock = nullptr) {
    fabric_ = InProcFabric::Create();
    sender_ = std::make_unique<LinkModelTransport>(InProcTransport::Create(fabric_), model, &clock_,
                                                   release_clock);
    receiver_ = InProcTransport::Create(fabric_);
    src_.assign(4 * kPayload, 'x');
    dst_.assign(4 * kPayload, '.');
    ASSERT_OK_AND_ASSIGN(src_region_,
                         sender_->RegisterMemory(src_.data(), src_.size(), MemoryKind::kHost));
    ASSERT_OK_AND_ASSIGN(dst_region_,
                         receiver_->RegisterMemory(dst_.data(), dst_.size(), MemoryKind::kHost));
    ASSERT_OK_AND_ASSIGN(peer_, sender_->Connect(receiver_->LocalAddress()));
  }

  SendId Send(std::string header) {
    return sender_->PostSend(peer_, header, std::vector<Slice>{{src_region_, 0, kPayload}}).value();
  }

  // Polls both sides a few times; the headers that reached the receiver,
  // each accepted.
  std::vector<std::string> Deliver() {
    std::vector<std::string> headers;
    for (int r = 0; r < 3; ++r) {
      std::vector<TransportEvent> events;
      sender_->Poll(events);
      for (TransportEvent& e : events) sender_events_.push_back(std::move(e));
      events.clear();
      receiver_->Poll(events);
      for (const TransportEvent& e : events) {
        if (e.kind != Kind::kIncoming) continue;
        headers.push_back(e.header);
        EXPECT_OK(receiver_->Accept(e.id, std::vector<Slice>{{dst_region_, 0, e.payload_bytes}}));
      }
    }
    return headers;
  }

  const absl::Time t0_ = absl::UnixEpoch() + absl::Hours(1);
  FakeClock clock_{t0_};
  std::shared_ptr<InProcFabric> fabric_;
  std::unique_ptr<LinkModelTransport> sender_;
  std::unique_ptr<InProcTransport> receiver_;
  std::vector<char> src_, dst_;
  RegionId src_region_ = 0, dst_region_ = 0;
  PeerId peer_ = 0;
  std::vector<TransportEvent> sender_events_;
};

TEST_F(LinkModelTransportTest, AMessageArrivesAfterItsBytesAndTheLatency) {
  Make({.bandwidth = kBandwidth, .latency = absl::Microseconds(500)});
  const SendId id = Send("hdr0");
  EXPECT_EQ(sender_->next_release(), t0_ + absl::Microseconds(1500));
  clock_.Advance(absl::Microseconds(1499));
  EXPECT_THAT(Deliver(), ::testing::IsEmpty());
  clock_.Advance(absl::Microseconds(1));
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("hdr0"));
  ASSERT_EQ(sender_events_.size(), 1u);
  EXPECT_EQ(sender_events_[0].kind, Kind::kSendDone);
  EXPECT_EQ(sender_events_[0].id, id);
  EXPECT_OK(sender_events_[0].status);
  EXPECT_EQ(sender_->bytes_carried(), 1000u);
  EXPECT_EQ(sender_->next_release(), absl::InfiniteFuture());
}

TEST_F(LinkModelTransportTest, OneLaneCarriesMessagesOneAfterAnotherAndTwoSideBySide) {
  Make({.bandwidth = kBandwidth,
        .latency = absl::ZeroDuration(),
        .per_message = absl::Microseconds(100),
        .lanes = 1});
  Send("a");
  Send("b");
  // "a" holds the lane 1.1 ms (bytes + per-message), then "b" 1.1 ms more.
  clock_.Advance(absl::Microseconds(1100));
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("a"));
  clock_.Advance(absl::Microseconds(1100));
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("b"));

  sender_events_.clear();
  Make({.bandwidth = kBandwidth,
        .latency = absl::ZeroDuration(),
        .per_message = absl::Microseconds(100),
        .lanes = 2});
  Send("a");
  Send("b");
  clock_.Advance(absl::Microseconds(1100));
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("a", "b"));
}

TEST_F(LinkModelTransportTest, AMessageNeverOvertakesAnEarlierOneToItsPeer) {
  Make({.bandwidth = kBandwidth, .latency = absl::ZeroDuration(), .lanes = 2});
  Send("big");                                               // 1 ms on lane 0.
  ASSERT_OK(sender_->PostSend(peer_, "tiny", {}).status());  // 4 us on lane 1.
  clock_.Advance(absl::Microseconds(4));
  EXPECT_THAT(Deliver(), ::testing::IsEmpty());
  clock_.Advance(absl::Microseconds(996));
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("big", "tiny"));
}

TEST_F(LinkModelTransportTest, MessagesAreReleasedOnTheReleaseClock) {
  FakeClock cluster(t0_);
  Make({.bandwidth = kBandwidth, .latency = absl::ZeroDuration()}, &cluster);
  // The sender's clock runs ahead (a worker in a step): the message is
  // stamped there, and waits for the cluster to catch up.
  clock_.Advance(absl::Milliseconds(5));
  Send("late");
  EXPECT_EQ(sender_->next_release(), t0_ + absl::Milliseconds(6));
  cluster.Advance(absl::Microseconds(5999));
  sender_->ReleaseDue();
  EXPECT_THAT(Deliver(), ::testing::IsEmpty());
  cluster.Advance(absl::Microseconds(1));
  sender_->ReleaseDue();
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("late"));
}

TEST_F(LinkModelTransportTest, AHeldMessageCanBeCancelledOrFailsWithItsConnection) {
  Make({.bandwidth = kBandwidth});
  const SendId cancelled = Send("cancelled");
  sender_->Cancel(cancelled);
  const SendId dropped = Send("dropped");
  sender_->Disconnect(peer_);
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(Deliver(), ::testing::IsEmpty());
  ASSERT_EQ(sender_events_.size(), 2u);
  EXPECT_EQ(sender_events_[0].id, cancelled);
  EXPECT_THAT(sender_events_[0].status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(sender_events_[1].id, dropped);
  EXPECT_THAT(sender_events_[1].status, StatusIs(absl::StatusCode::kUnavailable));
}

TEST(LinkModel, ImpossibleLinksAreRefused) {
  EXPECT_THAT(LinkModel{.bandwidth = 0}.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("bandwidth")));
  EXPECT_THAT(LinkModel{.latency = absl::Milliseconds(-1)}.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("latency")));
  EXPECT_THAT(LinkModel{.lanes = 0}.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("lanes")));
  EXPECT_OK(LinkModel{}.Validate());
}

}  // namespace
}  // namespace tandem::kvtransfer
