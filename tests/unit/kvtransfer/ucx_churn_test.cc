// Connection churn over UCX in this process: receivers (decode workers) come
// and go against one sender (a prefill worker), and senders against one
// receiver, and neither side keeps anything of the connections that ended:
// no pooled connection, no peer record, no file descriptor.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "gtest/gtest.h"
#include "kvtransfer/transfer_receiver.h"
#include "kvtransfer/transfer_sender.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "tests/testing/status_matchers.h"

namespace tandem::kvtransfer {
namespace {

constexpr int kLayers = 2;
constexpr size_t kLayerBytes = 16 << 10;
constexpr int kChurn = 100;
// Real time allowed for one step (a transfer, a close) on a loaded machine.
constexpr absl::Duration kStepTimeout = absl::Seconds(10);

int OpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

// Calls `poll` until `done` holds; false after kStepTimeout.
bool PollUntil(const std::function<void()>& poll, const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + kStepTimeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    poll();
  }
  return true;
}

// Host KV memory of kLayers layers, registered with a UCX transport.
struct Side {
  std::vector<char> kv = std::vector<char>(kLayers * kLayerBytes);
  std::unique_ptr<UcxTransport> transport;
  RegionId region = 0;

  std::vector<std::vector<Slice>> Layers() const {
    std::vector<std::vector<Slice>> layers;
    for (int l = 0; l < kLayers; ++l) layers.push_back({{region, l * kLayerBytes, kLayerBytes}});
    return layers;
  }
};

struct Sender : Side {
  std::unique_ptr<TransferSender> sender;
};
struct Receiver : Side {
  std::unique_ptr<TransferReceiver> receiver;
};

std::unique_ptr<Sender> MakeSender(const Clock* clock, SenderOptions options = {}) {
  auto s = std::make_unique<Sender>();
  s->transport = UcxTransport::Create().value();
  s->sender = std::make_unique<TransferSender>(s->transport.get(), clock, options);
  s->region = s->sender->RegisterMemory(s->kv.data(), s->kv.size(), MemoryKind::kHost).value();
  return s;
}

std::unique_ptr<Receiver> MakeReceiver(const Clock* clock) {
  auto r = std::make_unique<Receiver>();
  r->transport = UcxTransport::Create().value();
  r->receiver = std::make_unique<TransferReceiver>(r->transport.get(), clock);
  r->region = r->receiver->RegisterMemory(r->kv.data(), r->kv.size(), MemoryKind::kHost).value();
  return r;
}

void PollBoth(Sender& s, Receiver& r) {
  s.sender->Poll();
  r.receiver->Poll();
}

// Moves the sender's KV (filled with `fill`) into the receiver's as request
// `id` and checks that both ends report OK and every byte arrived.
void Transfer(Sender& s, Receiver& r, const FakeClock& clock, uint64_t id, char fill) {
  std::memset(s.kv.data(), fill, s.kv.size());
  std::memset(r.kv.data(), 0, r.kv.size());
  std::optional<absl::Status> received, sent;
  ASSERT_OK_AND_ASSIGN(
      TransferLease lease,
      r.receiver->Expect(
          {.request_id = id,
           .layers = r.Layers(),
           .deadline = clock.Now() + absl::Hours(1),
           .done = [&](uint64_t, uint64_t, const absl::Status& status) { received = status; }}));
  ASSERT_OK(s.sender
                ->Start({.descriptor = lease.Serialize(),
                         .layers = s.Layers(),
                         .done = [&](uint64_t, const absl::Status& status) { sent = status; }})
                .status());
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_OK(s.sender->MarkLayerReady(id, l));
  ASSERT_TRUE(PollUntil([&] { PollBoth(s, r); }, [&] { return received && sent; }))
      << "transfer " << id << " did not end";
  EXPECT_OK(*received);
  EXPECT_OK(*sent);
  EXPECT_TRUE(s.kv == r.kv) << "transfer " << id << " delivered different bytes";
}

// Destroys `side` on another thread (its transport's close flushes, which
// needs the far end to make progress) while `poll` drives the far end,
// until the other thread is done and `released` holds.
template <typename T>
bool LeaveWhilePolling(std::unique_ptr<T>& side, const std::function<void()>& poll,
                       const std::function<bool()>& released) {
  std::atomic<bool> gone = false;
  std::thread leave([&] {
    side.reset();
    gone = true;
  });
  const bool ok = PollUntil(poll, [&] { return gone && released(); });
  leave.join();
  return ok;
}

TEST(UcxChurnTest, ReceiversComingAndGoingLeaveNothingBehindAtTheSender) {
  FakeClock clock;
  const SenderOptions options;
  std::unique_ptr<Sender> s = MakeSender(&clock, options);
  int fds_after_first = 0;
  for (int i = 0; i < kChurn; ++i) {
    SCOPED_TRACE(i);
    std::unique_ptr<Receiver> r = MakeReceiver(&clock);
    ASSERT_NO_FATAL_FAILURE(Transfer(*s, *r, clock, i + 1, static_cast<char>(i)));
    ASSERT_EQ(s->sender->stats().pooled_connections, 1u);
    ASSERT_EQ(s->transport->num_peers(), 1u);
    if (i % 2 == 0) {
      // The decode worker goes away; the sender hears it close.
      ASSERT_TRUE(LeaveWhilePolling(
          r, [&] { s->sender->Poll(); },
          [&] {
            return s->sender->stats().pooled_connections == 0 && s->transport->num_peers() == 0;
          }))
          << "the sender kept the connection to a receiver that is gone";
    } else {
      // The receiver stays but gets no more work: the sender closes the
      // idle connection, and the receiver releases its end too.
      clock.Advance(options.idle_timeout);
      ASSERT_TRUE(PollUntil([&] { PollBoth(*s, *r); },
                            [&] {
                              return s->sender->stats().pooled_connections == 0 &&
                                     s->transport->num_peers() == 0 &&
                                     r->transport->num_peers() == 0;
                            }))
          << "the idle connection was not released on both ends";
      r.reset();
    }
    if (i == 0) fds_after_first = OpenFds();
  }
  EXPECT_EQ(s->sender->stats().connections, static_cast<uint64_t>(kChurn));
  EXPECT_EQ(s->sender->stats().idle_closed, static_cast<uint64_t>(kChurn / 2));
  EXPECT_EQ(s->sender->stats().completed, static_cast<uint64_t>(kChurn));
  // UCX opens a few descriptors lazily; a leak would grow with every round.
  EXPECT_LE(OpenFds(), fds_after_first + 4);
}

TEST(UcxChurnTest, SendersComingAndGoingLeaveNothingBehindAtTheReceiver) {
  FakeClock clock;
  std::unique_ptr<Receiver> r = MakeReceiver(&clock);
  int fds_after_first = 0;
  for (int i = 0; i < kChurn; ++i) {
    SCOPED_TRACE(i);
    std::unique_ptr<Sender> s = MakeSender(&clock);
    ASSERT_NO_FATAL_FAILURE(Transfer(*s, *r, clock, i + 1, static_cast<char>(i)));
    ASSERT_EQ(r->transport->num_peers(), 1u);
    // The prefill worker goes away with its connection pooled.
    ASSERT_TRUE(LeaveWhilePolling(
        s, [&] { r->receiver->Poll(); }, [&] { return r->transport->num_peers() == 0; }))
        << "the receiver kept the peer record of a sender that is gone";
    if (i == 0) fds_after_first = OpenFds();
  }
  EXPECT_EQ(r->receiver->stats().completed, static_cast<uint64_t>(kChurn));
  EXPECT_LE(OpenFds(), fds_after_first + 4);
}

TEST(UcxChurnTest, IdleTimeoutClosesThePooledConnectionAndTheNextTransferReconnects) {
  FakeClock clock;
  const SenderOptions options{.idle_timeout = absl::Seconds(60)};
  std::unique_ptr<Sender> s = MakeSender(&clock, options);
  std::unique_ptr<Receiver> r = MakeReceiver(&clock);
  ASSERT_NO_FATAL_FAILURE(Transfer(*s, *r, clock, 1, 'a'));
  EXPECT_EQ(s->sender->stats().pooled_connections, 1u);

  // A transfer ending restarts the idle time; just short of it nothing closes.
  clock.Advance(options.idle_timeout - absl::Milliseconds(1));
  for (int i = 0; i < 100; ++i) PollBoth(*s, *r);
  EXPECT_EQ(s->sender->stats().pooled_connections, 1u);
  EXPECT_EQ(s->sender->stats().idle_closed, 0u);
  EXPECT_EQ(s->transport->num_peers(), 1u);

  clock.Advance(absl::Milliseconds(1));
  s->sender->Poll();
  EXPECT_EQ(s->sender->stats().pooled_connections, 0u);
  EXPECT_EQ(s->sender->stats().idle_closed, 1u);
  ASSERT_TRUE(
      PollUntil([&] { PollBoth(*s, *r); },
                [&] { return s->transport->num_peers() == 0 && r->transport->num_peers() == 0; }));

  ASSERT_NO_FATAL_FAILURE(Transfer(*s, *r, clock, 2, 'b'));
  EXPECT_EQ(s->sender->stats().connections, 2u);
  EXPECT_EQ(s->sender->stats().pooled_connections, 1u);
  EXPECT_EQ(s->sender->stats().completed, 2u);
  // The sender leaves with its connection pooled; the receiver hears of it.
  EXPECT_TRUE(LeaveWhilePolling(
      s, [&] { r->receiver->Poll(); }, [&] { return r->transport->num_peers() == 0; }));
}

TEST(UcxChurnTest, APostToAReleasedPeerIsUnavailable) {
  FakeClock clock;
  std::unique_ptr<Sender> s = MakeSender(&clock);
  std::unique_ptr<Receiver> r = MakeReceiver(&clock);
  ASSERT_OK_AND_ASSIGN(PeerId peer, s->transport->Connect(r->transport->LocalAddress()));
  s->transport->Disconnect(peer);
  ASSERT_TRUE(
      PollUntil([&] { PollBoth(*s, *r); },
                [&] { return s->transport->num_peers() == 0 && r->transport->num_peers() == 0; }));
  EXPECT_THAT(s->transport->PostSend(peer, "late", {}),
              tandem::testing::StatusIs(absl::StatusCode::kUnavailable));
  // Ids are never reused: a new connection gets a new one.
  ASSERT_OK_AND_ASSIGN(PeerId again, s->transport->Connect(r->transport->LocalAddress()));
  EXPECT_NE(again, peer);
  s->transport->Disconnect(again);
  ASSERT_TRUE(
      PollUntil([&] { PollBoth(*s, *r); },
                [&] { return s->transport->num_peers() == 0 && r->transport->num_peers() == 0; }));
}

TEST(UcxChurnDeathTest, ANonPositiveIdleTimeoutIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeClock clock;
  // The constructor checks its options before it ever uses the transport.
  EXPECT_DEATH(TransferSender(nullptr, &clock, {.idle_timeout = absl::ZeroDuration()}),
               "idle_timeout is 0; it must be positive");
}

}  // namespace
}  // namespace tandem::kvtransfer
