#include "kvtransfer/faulty_transport.h"

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

// A faulty sender and a plain receiver that accepts everything into `dst_`.
class FaultyTransportTest : public ::testing::Test {
 protected:
  void Make(FaultPlan plan) {
    fabric_ = InProcFabric::Create();
    sender_ = std::make_unique<FaultyTransport>(InProcTransport::Create(fabric_), std::move(plan),
                                                &clock_);
    receiver_ = InProcTransport::Create(fabric_);
    src_.assign(16, 0);
    for (int i = 0; i < 16; ++i) src_[i] = static_cast<char>('a' + i);
    dst_.assign(64, '.');
    ASSERT_OK_AND_ASSIGN(src_region_,
                         sender_->RegisterMemory(src_.data(), src_.size(), MemoryKind::kHost));
    ASSERT_OK_AND_ASSIGN(dst_region_,
                         receiver_->RegisterMemory(dst_.data(), dst_.size(), MemoryKind::kHost));
    ASSERT_OK_AND_ASSIGN(peer_, sender_->Connect(receiver_->LocalAddress()));
  }

  absl::StatusOr<SendId> Send(std::string header, uint64_t bytes = 4) {
    return sender_->PostSend(peer_, header, std::vector<Slice>{{src_region_, 0, bytes}});
  }

  // Polls both sides `rounds` times; returns the headers received, in
  // order, each accepted at the next 4 bytes of `dst_` when sizes allow.
  std::vector<std::string> Deliver(int rounds = 4) {
    std::vector<std::string> headers;
    for (int r = 0; r < rounds; ++r) {
      std::vector<TransportEvent> events;
      sender_->Poll(events);
      for (TransportEvent& e : events) sender_events_.push_back(std::move(e));
      events.clear();
      receiver_->Poll(events);
      for (const TransportEvent& e : events) {
        if (e.kind != Kind::kIncoming) continue;
        headers.push_back(e.header);
        if (e.payload_bytes <= dst_.size() - next_dst_) {
          EXPECT_OK(receiver_->Accept(
              e.id, std::vector<Slice>{{dst_region_, next_dst_, e.payload_bytes}}));
          next_dst_ += e.payload_bytes;
        } else {
          receiver_->Discard(e.id);
        }
      }
    }
    return headers;
  }

  int SendDones() const {
    int n = 0;
    for (const TransportEvent& e : sender_events_) n += e.kind == Kind::kSendDone;
    return n;
  }

  FakeClock clock_;
  std::shared_ptr<InProcFabric> fabric_;
  std::unique_ptr<FaultyTransport> sender_;
  std::unique_ptr<InProcTransport> receiver_;
  std::vector<char> src_, dst_;
  RegionId src_region_ = 0, dst_region_ = 0;
  PeerId peer_ = 0;
  uint64_t next_dst_ = 0;
  std::vector<TransportEvent> sender_events_;
};

FaultPlan At(uint64_t index, Fault fault) {
  FaultPlan plan;
  plan.at_message[index] = fault;
  return plan;
}

TEST_F(FaultyTransportTest, DropReportsSuccessButNothingArrives) {
  Make(At(1, Fault{.kind = Fault::Kind::kDrop}));
  ASSERT_OK(Send("m0").status());
  ASSERT_OK(Send("m1").status());
  ASSERT_OK(Send("m2").status());
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("m0", "m2"));
  EXPECT_EQ(SendDones(), 3);
  EXPECT_EQ(sender_->injected(Fault::Kind::kDrop), 1u);
}

TEST_F(FaultyTransportTest, DuplicateArrivesTwiceWithOneSendDone) {
  Make(At(0, Fault{.kind = Fault::Kind::kDuplicate}));
  ASSERT_OK(Send("m0").status());
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("m0", "m0"));
  EXPECT_EQ(SendDones(), 1);
}

TEST_F(FaultyTransportTest, ReorderSwapsWithTheNextMessage) {
  Make(At(0, Fault{.kind = Fault::Kind::kReorder}));
  ASSERT_OK(Send("m0").status());
  ASSERT_OK(Send("m1").status());
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("m1", "m0"));
  EXPECT_EQ(SendDones(), 2);
}

TEST_F(FaultyTransportTest, ReorderedLastMessageStillArrives) {
  Make(At(0, Fault{.kind = Fault::Kind::kReorder}));
  ASSERT_OK(Send("m0").status());
  EXPECT_THAT(Deliver(), ::testing::ElementsAre("m0"));
}

TEST_F(FaultyTransportTest, DelayByPollsAndByTime) {
  FaultPlan plan;
  plan.at_message[0] = Fault{.kind = Fault::Kind::kDelayPolls, .polls = 3};
  plan.at_message[1] = Fault{.kind = Fault::Kind::kDelayTime, .delay = absl::Seconds(2)};
  Make(plan);
  ASSERT_OK(Send("m0").status());
  ASSERT_OK(Send("m1").status());
  ASSERT_OK(Send("m2").status());
  EXPECT_THAT(Deliver(2), ::testing::ElementsAre("m2"));
  EXPECT_THAT(Deliver(2), ::testing::ElementsAre("m0"));
  EXPECT_THAT(Deliver(2), ::testing::IsEmpty());
  clock_.Advance(absl::Seconds(2));
  EXPECT_THAT(Deliver(2), ::testing::ElementsAre("m1"));
}

TEST_F(FaultyTransportTest, TruncateShortensThePayload) {
  Make(At(0, Fault{.kind = Fault::Kind::kTruncate, .bytes = 3}));
  ASSERT_OK(Send("m0", 8).status());
  Deliver();
  EXPECT_EQ(next_dst_, 5u);
  EXPECT_EQ(std::string(dst_.data(), 6), "abcde.");
}

TEST_F(FaultyTransportTest, CorruptFlipsBytesOfACopyOnly) {
  Make(At(0, Fault{.kind = Fault::Kind::kCorrupt, .bytes = 2}));
  ASSERT_OK(Send("m0", 16).status());
  Deliver();
  EXPECT_EQ(next_dst_, 16u);
  EXPECT_NE(std::string(dst_.data(), 16), std::string(src_.data(), 16));
  EXPECT_EQ(std::string(src_.data(), 16), "abcdefghijklmnop");
  EXPECT_EQ(SendDones(), 1);
}

TEST_F(FaultyTransportTest, KillFailsThisAndLaterSendsOnBothSides) {
  Make(At(1, Fault{.kind = Fault::Kind::kKill}));
  ASSERT_OK(Send("m0").status());
  ASSERT_OK(Send("m1").status());
  EXPECT_THAT(Send("m2"), StatusIs(absl::StatusCode::kUnavailable));
  std::vector<TransportEvent> receiver_events;
  receiver_->Poll(receiver_events);
  bool receiver_saw_failure = false;
  for (const TransportEvent& e : receiver_events) {
    receiver_saw_failure |= e.kind == Kind::kPeerFailed;
  }
  EXPECT_TRUE(receiver_saw_failure);
  Deliver();
  bool sender_saw_failure = false;
  int failed_sends = 0;
  for (const TransportEvent& e : sender_events_) {
    sender_saw_failure |= e.kind == Kind::kPeerFailed;
    failed_sends += e.kind == Kind::kSendDone && !e.status.ok();
  }
  EXPECT_TRUE(sender_saw_failure);
  EXPECT_EQ(failed_sends, 2);  // m0 was in flight on the killed connection, m1 was the kill.
}

TEST_F(FaultyTransportTest, RandomFaultsDependOnlyOnTheSeed) {
  FaultPlan plan;
  plan.random_probability = 0.5;
  plan.random_faults = {Fault{.kind = Fault::Kind::kDrop}};
  plan.seed = 7;
  Make(plan);
  for (int i = 0; i < 20; ++i) ASSERT_OK(Send(std::to_string(i)).status());
  const std::vector<std::string> first = Deliver();
  Make(plan);
  next_dst_ = 0;
  for (int i = 0; i < 20; ++i) ASSERT_OK(Send(std::to_string(i)).status());
  EXPECT_EQ(Deliver(), first);
  EXPECT_GT(first.size(), 0u);
  EXPECT_LT(first.size(), 20u);
}

}  // namespace
}  // namespace tandem::kvtransfer
