// UcxTransport's connections: the introduction through the door, its
// deadline, and a door replaced when its ring stops moving.
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/kvtransfer/transport_events.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;
using Kind = TransportEvent::Kind;

constexpr absl::Duration kTimeout = absl::Seconds(10);

UcxTransportOptions FastOptions() {
  UcxTransportOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  options.door_probe_interval = absl::Milliseconds(10);
  options.door_probe_timeout = absl::Milliseconds(100);
  options.door_retire_after = absl::Milliseconds(200);
  // One thread polls them all: a graceful close, which needs the far end
  // to progress, cannot finish in a destructor.
  options.close_timeout = absl::Milliseconds(200);
  return options;
}

// Transports in this process, polled together; the events each reported.
class Pump {
 public:
  UcxTransport& Add() {
    auto created = UcxTransport::Create(FastOptions());
    EXPECT_TRUE(created.ok()) << created.status();
    transports_.push_back(*std::move(created));
    events_.emplace_back();
    return *transports_.back();
  }

  // Polls `polled` (all when empty) until `done`; false at kTimeout.
  template <typename Done>
  bool Until(Done done, std::initializer_list<int> polled = {}) {
    const absl::Time deadline = absl::Now() + kTimeout;
    while (!done()) {
      if (absl::Now() > deadline) return false;
      for (size_t i = 0; i < transports_.size(); ++i) {
        if (polled.size() > 0 && std::find(polled.begin(), polled.end(), int(i)) == polled.end()) {
          continue;
        }
        transports_[i]->Poll(events_[i]);
      }
    }
    return true;
  }

  // The first event of `kind` on transport `i`, taken out; polls all of
  // them (or `polled`) until one comes.
  std::optional<TransportEvent> Next(int i, Kind kind, std::initializer_list<int> polled = {}) {
    std::optional<TransportEvent> found;
    Until([&] { return (found = testing::TakeEvent(events_[i], kind)).has_value(); }, polled);
    return found;
  }

  // Sends an empty message with `header` from `from` on `peer`; true once
  // transport `to` heard it and `from` saw it leave.
  bool Deliver(int from, PeerId peer, int to, const std::string& header) {
    absl::StatusOr<SendId> send = transports_[from]->PostSend(peer, header, {});
    if (!send.ok()) return false;
    std::optional<TransportEvent> incoming = Next(to, Kind::kIncoming);
    std::optional<TransportEvent> done = Next(from, Kind::kSendDone);
    return incoming.has_value() && incoming->header == header && done.has_value() &&
           done->status.ok();
  }

  UcxTransport& operator[](int i) { return *transports_[i]; }

 private:
  std::vector<std::unique_ptr<UcxTransport>> transports_;
  std::vector<std::vector<TransportEvent>> events_;
};

TEST(UcxDoorTest, AWedgedDoorIsReplacedAndOpenConnectionsKeepWorking) {
  Pump pump;
  UcxTransport& receiver = pump.Add();
  UcxTransport& sender = pump.Add();
  UcxTransport& late = pump.Add();
  const std::string first_address = receiver.LocalAddress();
  ASSERT_OK_AND_ASSIGN(PeerId peer, sender.Connect(first_address));
  ASSERT_TRUE(pump.Deliver(1, peer, 0, "before"));
  EXPECT_EQ(receiver.doors_replaced(), 0u);

  receiver.IgnoreDoorProbesForTesting();
  ASSERT_TRUE(pump.Until([&] { return receiver.doors_replaced() == 1; }));
  EXPECT_NE(receiver.LocalAddress(), first_address);
  // The open connection never needed the door again.
  EXPECT_TRUE(pump.Deliver(1, peer, 0, "after"));
  // New connections go to the new door.
  ASSERT_OK_AND_ASSIGN(PeerId late_peer, late.Connect(receiver.LocalAddress()));
  EXPECT_TRUE(pump.Deliver(2, late_peer, 0, "late"));
  // A door that hears its probes stays.
  const absl::Time until = absl::Now() + absl::Milliseconds(500);
  ASSERT_TRUE(pump.Until([&] { return absl::Now() > until; }));
  EXPECT_EQ(receiver.doors_replaced(), 1u);
}

TEST(UcxDoorTest, AnUnansweredIntroductionFailsTheConnectionAndItsSends) {
  Pump pump;
  pump.Add();  // Never polled: its door never answers.
  UcxTransport& sender = pump.Add();
  ASSERT_OK_AND_ASSIGN(PeerId peer, sender.Connect(pump[0].LocalAddress()));
  ASSERT_OK_AND_ASSIGN(SendId send, sender.PostSend(peer, "waiting", {}));
  const absl::Time start = absl::Now();
  std::optional<TransportEvent> done = pump.Next(1, Kind::kSendDone, {1});
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->id, send);
  EXPECT_THAT(done->status, StatusIs(absl::StatusCode::kUnavailable,
                                     HasSubstr("did not answer the introduction")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  std::optional<TransportEvent> failed = pump.Next(1, Kind::kPeerFailed, {1});
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->peer, peer);
  EXPECT_THAT(sender.PostSend(peer, "later", {}).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(pump.Until([&] { return sender.num_peers() == 0; }, {1}));
}

TEST(UcxDoorTest, AConnectionDroppedBeforeItsWelcomeStillSaysGoodbye) {
  Pump pump;
  UcxTransport& receiver = pump.Add();
  UcxTransport& sender = pump.Add();
  ASSERT_OK_AND_ASSIGN(PeerId peer, sender.Connect(receiver.LocalAddress()));
  ASSERT_OK_AND_ASSIGN(SendId send, sender.PostSend(peer, "never", {}));
  sender.Disconnect(peer);
  std::optional<TransportEvent> done = pump.Next(1, Kind::kSendDone);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->id, send);
  EXPECT_THAT(done->status, StatusIs(absl::StatusCode::kCancelled));
  // The acceptor opened a worker for the connection on its hello, and lets
  // it go on the goodbye that follows the welcome.
  EXPECT_TRUE(pump.Until([&] { return receiver.num_peers() == 0 && sender.num_peers() == 0; }));
}

TEST(UcxDoorTest, AConnectionMayStayQuietLongerThanItsIntroduction) {
  // A prefill worker connects when a prompt starts and sends its first
  // layer when the whole prompt has been through it: minutes, for a long
  // prompt on a CPU.
  Pump pump;
  UcxTransport& receiver = pump.Add();
  UcxTransport& sender = pump.Add();
  ASSERT_OK_AND_ASSIGN(PeerId peer, sender.Connect(receiver.LocalAddress()));
  const absl::Time until = absl::Now() + 3 * FastOptions().connect_timeout;
  ASSERT_TRUE(pump.Until([&] { return absl::Now() > until; }));
  EXPECT_EQ(receiver.num_peers(), 1u);
  EXPECT_TRUE(pump.Deliver(1, peer, 0, "late but fine"));
}

}  // namespace
}  // namespace tandem::kvtransfer
