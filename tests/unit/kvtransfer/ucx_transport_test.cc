#include "kvtransfer/ucx/ucx_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/kvtransfer/transport_events.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Kind = TransportEvent::Kind;

constexpr absl::Duration kStepTimeout = absl::Seconds(10);

std::vector<char> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> bytes(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t word = rng();
    std::memcpy(bytes.data() + i, &word, 8);
  }
  for (; i < n; ++i) bytes[i] = static_cast<char>(rng());
  return bytes;
}

// Splits [offset, offset + length) of `region` into `parts` slices with
// random boundaries.
std::vector<Slice> Split(RegionId region, uint64_t offset, uint64_t length, int parts,
                         std::mt19937_64& rng) {
  std::vector<uint64_t> cuts = {0, length};
  for (int i = 1; i < parts; ++i) cuts.push_back(length == 0 ? 0 : rng() % (length + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<Slice> slices;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    slices.push_back({region, offset + cuts[i], cuts[i + 1] - cuts[i]});
  }
  return slices;
}

// Two transports in this process, `sender` connected to `receiver`, with the
// events each has reported so far.
class UcxPairTest : public ::testing::Test {
 protected:
  virtual UcxTransportOptions Options() { return {}; }

  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(sender_, UcxTransport::Create(Options()));
    ASSERT_OK_AND_ASSIGN(receiver_, UcxTransport::Create(Options()));
    ASSERT_OK_AND_ASSIGN(peer_, sender_->Connect(receiver_->LocalAddress()));
  }

  // Closing flushes, which needs the other side to make progress: with both
  // transports on this one thread, disconnect while pumping both, or each
  // destructor waits out its close timeout.
  void TearDown() override {
    if (sender_ == nullptr || receiver_ == nullptr) return;
    sender_->Disconnect(peer_);
    const absl::Time until = absl::Now() + absl::Milliseconds(100);
    while (absl::Now() < until) {
      sender_->Poll(sender_events_);
      receiver_->Poll(receiver_events_);
    }
    sender_.reset();
    receiver_.reset();
  }

  // Polls both transports until `done` holds; false at the deadline.
  bool PumpUntil(const std::function<bool()>& done, absl::Duration timeout = kStepTimeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() > deadline) return false;
      sender_->Poll(sender_events_);
      receiver_->Poll(receiver_events_);
    }
    return true;
  }

  // Takes the first event of `kind` from `events`, pumping until one comes.
  std::optional<TransportEvent> Next(std::vector<TransportEvent>& events, Kind kind) {
    std::optional<TransportEvent> found;
    PumpUntil([&] { return (found = testing::TakeEvent(events, kind)).has_value(); });
    return found;
  }

  // Sends one message of each size, gathered from `send_parts` slices and
  // scattered into `receive_parts`, and checks every byte and the order.
  void RoundTrip(int send_parts, int receive_parts) {
    UcxTransport& sender = *sender_;
    UcxTransport& receiver = *receiver_;
    const PeerId peer = peer_;
    auto next = [this](bool sender_side, Kind kind) {
      return Next(sender_side ? sender_events_ : receiver_events_, kind);
    };
    const std::vector<uint64_t> sizes = {0, 1, 64 << 10, 1 << 20, 8 << 20};
    uint64_t total = 0;
    for (uint64_t size : sizes) total += size;
    std::vector<char> source = RandomBytes(total, send_parts * 31 + receive_parts);
    std::vector<char> destination(total, 0);
    ASSERT_OK_AND_ASSIGN(RegionId source_region,
                         sender.RegisterMemory(source.data(), source.size(), MemoryKind::kHost));
    ASSERT_OK_AND_ASSIGN(RegionId destination_region,
                         receiver.RegisterMemory(destination.data(), total, MemoryKind::kHost));
    std::mt19937_64 rng(7);
    uint64_t offset = 0;
    std::vector<SendId> sends;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<Slice> slices = Split(source_region, offset, sizes[i], send_parts, rng);
      ASSERT_OK_AND_ASSIGN(SendId send, sender.PostSend(peer, absl::StrCat("message ", i), slices));
      sends.push_back(send);
      offset += sizes[i];
    }
    offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::optional<TransportEvent> incoming = next(false, Kind::kIncoming);
      ASSERT_TRUE(incoming.has_value()) << "message " << i << " never arrived";
      EXPECT_EQ(incoming->header, absl::StrCat("message ", i));
      ASSERT_EQ(incoming->payload_bytes, sizes[i]);
      const std::vector<Slice> slices =
          Split(destination_region, offset, sizes[i], receive_parts, rng);
      ASSERT_OK(receiver.Accept(incoming->id, slices));
      std::optional<TransportEvent> received = next(false, Kind::kReceiveDone);
      ASSERT_TRUE(received.has_value()) << "message " << i << " was never placed";
      EXPECT_EQ(received->id, incoming->id);
      EXPECT_OK(received->status);
      offset += sizes[i];
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::optional<TransportEvent> done = next(true, Kind::kSendDone);
      ASSERT_TRUE(done.has_value());
      EXPECT_OK(done->status);
    }
    EXPECT_TRUE(source == destination) << "received bytes differ from the sent bytes";
    EXPECT_OK(sender.DeregisterMemory(source_region));
    EXPECT_OK(receiver.DeregisterMemory(destination_region));
  }

  std::unique_ptr<UcxTransport> sender_;
  std::unique_ptr<UcxTransport> receiver_;
  PeerId peer_ = 0;
  std::vector<TransportEvent> sender_events_;
  std::vector<TransportEvent> receiver_events_;
};

TEST_F(UcxPairTest, MessagesOfManySizesArriveByteExactAndInOrder) {
  for (int send_parts : {1, 3}) {
    for (int receive_parts : {1, 4}) {
      SCOPED_TRACE(absl::StrCat(send_parts, " source slices, ", receive_parts, " destination"));
      RoundTrip(send_parts, receive_parts);
    }
  }
}

TEST_F(UcxPairTest, ReceiverRepliesOverTheConnectionItWasOffered) {
  ASSERT_OK(sender_->PostSend(peer_, "ping", {}).status());
  std::optional<TransportEvent> ping = Next(receiver_events_, Kind::kIncoming);
  ASSERT_TRUE(ping.has_value());
  ASSERT_OK(receiver_->Accept(ping->id, {}));
  ASSERT_OK(receiver_->PostSend(ping->peer, "pong", {}).status());
  std::optional<TransportEvent> pong = Next(sender_events_, Kind::kIncoming);
  ASSERT_TRUE(pong.has_value());
  EXPECT_EQ(pong->header, "pong");
  EXPECT_EQ(pong->peer, peer_);
}

TEST_F(UcxPairTest, MessagesFromOnePeerKeepTheirOrderAcrossProtocols) {
  // Small messages go eagerly and large ones by rendezvous; the headers must
  // still come out in posting order.
  std::vector<char> source = RandomBytes(2 << 20, 3);
  ASSERT_OK_AND_ASSIGN(RegionId region,
                       sender_->RegisterMemory(source.data(), source.size(), MemoryKind::kHost));
  std::vector<std::string> posted;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    const uint64_t length = std::vector<uint64_t>{0, 100, 8 << 10, 300 << 10, 2 << 20}[rng() % 5];
    const Slice slice{region, 0, length};
    posted.push_back(absl::StrCat(i));
    ASSERT_OK(sender_->PostSend(peer_, posted.back(), {&slice, 1}).status());
  }
  std::vector<std::string> arrived;
  ASSERT_TRUE(PumpUntil([&] {
    for (const TransportEvent& event : receiver_events_) {
      if (event.kind == Kind::kIncoming) {
        arrived.push_back(event.header);
        receiver_->Discard(event.id);
      }
    }
    receiver_events_.clear();
    return arrived.size() == posted.size();
  }));
  EXPECT_THAT(arrived, ElementsAreArray(posted));
}

TEST_F(UcxPairTest, DiscardDropsThePayloadAndReleasesTheSender) {
  std::vector<char> source = RandomBytes(8 << 20, 5);
  ASSERT_OK_AND_ASSIGN(RegionId region,
                       sender_->RegisterMemory(source.data(), source.size(), MemoryKind::kHost));
  // Rendezvous and eager: both must be released, or the rendezvous send
  // never completes.
  for (uint64_t length : {uint64_t{8} << 20, uint64_t{512}}) {
    const Slice slice{region, 0, length};
    ASSERT_OK_AND_ASSIGN(SendId send, sender_->PostSend(peer_, "unwanted", {&slice, 1}));
    std::optional<TransportEvent> incoming = Next(receiver_events_, Kind::kIncoming);
    ASSERT_TRUE(incoming.has_value());
    receiver_->Discard(incoming->id);
    std::optional<TransportEvent> done = Next(sender_events_, Kind::kSendDone);
    ASSERT_TRUE(done.has_value()) << "the sender of a discarded " << length
                                  << "-byte message hangs";
    EXPECT_EQ(done->id, send);
    EXPECT_THAT(receiver_->Accept(incoming->id, {}), StatusIs(absl::StatusCode::kNotFound));
  }
}

TEST_F(UcxPairTest, AcceptWithTheWrongLengthIsRejectedAndTheMessageStaysPending) {
  std::vector<char> source = RandomBytes(1 << 20, 9);
  std::vector<char> destination(2 << 20, 0);
  ASSERT_OK_AND_ASSIGN(RegionId source_region,
                       sender_->RegisterMemory(source.data(), source.size(), MemoryKind::kHost));
  ASSERT_OK_AND_ASSIGN(
      RegionId destination_region,
      receiver_->RegisterMemory(destination.data(), destination.size(), MemoryKind::kHost));
  const Slice slice{source_region, 0, source.size()};
  ASSERT_OK(sender_->PostSend(peer_, "layer", {&slice, 1}).status());
  std::optional<TransportEvent> incoming = Next(receiver_events_, Kind::kIncoming);
  ASSERT_TRUE(incoming.has_value());
  const Slice too_long{destination_region, 0, destination.size()};
  EXPECT_THAT(receiver_->Accept(incoming->id, {&too_long, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes")));
  const Slice outside{destination_region, destination.size() - 10, 1 << 20};
  EXPECT_THAT(receiver_->Accept(incoming->id, {&outside, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside region")));
  const Slice right{destination_region, 0, source.size()};
  ASSERT_OK(receiver_->Accept(incoming->id, {&right, 1}));
  EXPECT_THAT(receiver_->Accept(incoming->id, {&right, 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  std::optional<TransportEvent> received = Next(receiver_events_, Kind::kReceiveDone);
  ASSERT_TRUE(received.has_value());
  EXPECT_OK(received->status);
  EXPECT_EQ(std::memcmp(source.data(), destination.data(), source.size()), 0);
}

TEST_F(UcxPairTest, CancelledSendReportsCancelledOnceUcxLetsGo) {
  std::vector<char> source = RandomBytes(8 << 20, 13);
  ASSERT_OK_AND_ASSIGN(RegionId region,
                       sender_->RegisterMemory(source.data(), source.size(), MemoryKind::kHost));
  const Slice slice{region, 0, source.size()};
  // A first message makes the connection introduced: the doomed send goes
  // to UCX at once instead of waiting for the welcome.
  ASSERT_OK(sender_->PostSend(peer_, "first", {}).status());
  ASSERT_TRUE(Next(receiver_events_, Kind::kIncoming).has_value());
  ASSERT_TRUE(Next(sender_events_, Kind::kSendDone).has_value());
  ASSERT_OK_AND_ASSIGN(SendId send, sender_->PostSend(peer_, "doomed", {&slice, 1}));
  sender_->Cancel(send);
  std::optional<TransportEvent> incoming = Next(receiver_events_, Kind::kIncoming);
  ASSERT_TRUE(incoming.has_value());
  receiver_->Discard(incoming->id);
  std::optional<TransportEvent> done = Next(sender_events_, Kind::kSendDone);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->id, send);
  EXPECT_THAT(done->status, StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(UcxPairTest, ASendCancelledBeforeTheWelcomeNeverLeaves) {
  ASSERT_OK_AND_ASSIGN(SendId doomed, sender_->PostSend(peer_, "doomed", {}));
  sender_->Cancel(doomed);
  ASSERT_OK(sender_->PostSend(peer_, "kept", {}).status());
  std::optional<TransportEvent> done = Next(sender_events_, Kind::kSendDone);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->id, doomed);
  EXPECT_THAT(done->status, StatusIs(absl::StatusCode::kCancelled));
  std::optional<TransportEvent> incoming = Next(receiver_events_, Kind::kIncoming);
  ASSERT_TRUE(incoming.has_value());
  EXPECT_EQ(incoming->header, "kept");
}

TEST_F(UcxPairTest, BadArgumentsAreClearErrors) {
  EXPECT_THAT(
      sender_->Connect("not an address"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a UCX transport address")));
  std::string truncated = receiver_->LocalAddress();
  truncated.pop_back();
  EXPECT_THAT(sender_->Connect(truncated),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  char byte = 0;
  EXPECT_THAT(sender_->RegisterMemory(&byte, 1, MemoryKind::kCuda),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("CUDA")));
  EXPECT_THAT(sender_->PostSend(peer_, std::string(KvTransport::kMaxHeaderBytes + 1, 'h'), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("header")));
  const Slice unregistered{77, 0, 1};
  EXPECT_THAT(sender_->PostSend(peer_, "h", {&unregistered, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unregistered region 77")));
  EXPECT_THAT(sender_->PostSend(999, "h", {}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(sender_->DeregisterMemory(77), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(UcxPairTest, ReportsTheMemoryTypesUcxSupports) {
  EXPECT_TRUE(sender_->SupportsMemory(MemoryKind::kHost));
  EXPECT_THAT(sender_->MemoryTypes(), HasSubstr("host"));
  // Whatever UCX supports, device memory is staged, not registered.
  char byte = 0;
  EXPECT_THAT(sender_->RegisterMemory(&byte, 1, MemoryKind::kCuda),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr(sender_->MemoryTypes())));
  EXPECT_EQ(sender_->SupportsMemory(MemoryKind::kCuda),
            sender_->MemoryTypes().find("cuda") != std::string::npos);
}

TEST_F(UcxPairTest, WaitForActivityReturnsByItsDeadline) {
  const absl::Time start = absl::Now();
  sender_->WaitForActivity(start + absl::Milliseconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

// UCX reads UCX_* from the environment when the context is created.
class UcxTcpPairTest : public UcxPairTest {
 protected:
  void SetUp() override {
    ASSERT_EQ(setenv("UCX_TLS", "tcp", 1), 0);
    UcxPairTest::SetUp();
  }
  void TearDown() override {
    UcxPairTest::TearDown();
    unsetenv("UCX_TLS");
  }
};

TEST_F(UcxTcpPairTest, MessagesArriveByteExactOverTcpOnly) {
  EXPECT_THAT(sender_->Description(), HasSubstr("UCX_TLS=tcp"));
  RoundTrip(3, 2);
}

// Without peer-failure handling UCX 1.13 may use its shared-memory
// transports; the messages must come out the same.
class UcxNoFailureDetectionPairTest : public UcxPairTest {
 protected:
  UcxTransportOptions Options() override {
    UcxTransportOptions options;
    options.detect_peer_failure = false;
    return options;
  }
};

TEST_F(UcxNoFailureDetectionPairTest, MessagesArriveByteExact) { RoundTrip(3, 2); }

// One send per peer in UCX at a time: the rest wait in order.
class UcxWindowOfOnePairTest : public UcxPairTest {
 protected:
  UcxTransportOptions Options() override {
    UcxTransportOptions options;
    options.max_sends_in_flight = 1;
    return options;
  }
};

TEST_F(UcxWindowOfOnePairTest, QueuedSendsArriveByteExactAndInOrder) { RoundTrip(2, 3); }

TEST_F(UcxWindowOfOnePairTest, CancellingAQueuedSendEndsItAtOnceUnsent) {
  std::vector<char> source = RandomBytes(8 << 20, 17);
  ASSERT_OK_AND_ASSIGN(RegionId region,
                       sender_->RegisterMemory(source.data(), source.size(), MemoryKind::kHost));
  const Slice slice{region, 0, source.size()};
  // The receiver holds the first (rendezvous) message, so the second waits.
  ASSERT_OK_AND_ASSIGN(SendId held, sender_->PostSend(peer_, "held", {&slice, 1}));
  ASSERT_OK_AND_ASSIGN(SendId queued, sender_->PostSend(peer_, "queued", {&slice, 1}));
  std::optional<TransportEvent> incoming = Next(receiver_events_, Kind::kIncoming);
  ASSERT_TRUE(incoming.has_value());
  EXPECT_EQ(incoming->header, "held");
  sender_->Cancel(queued);
  std::optional<TransportEvent> done = Next(sender_events_, Kind::kSendDone);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->id, queued);
  EXPECT_THAT(done->status, StatusIs(absl::StatusCode::kCancelled));
  receiver_->Discard(incoming->id);
  done = Next(sender_events_, Kind::kSendDone);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->id, held);
  EXPECT_OK(done->status);
  // The cancelled send never reached the receiver.
  ASSERT_TRUE(PumpUntil([] { return false; }, absl::Milliseconds(100)) == false);
  for (const TransportEvent& event : receiver_events_) {
    EXPECT_NE(event.header, "queued");
  }
}

// A receiver that never makes progress: the sender's messages fill UCX's
// queues and wait there. Destroying the sender then cannot flush; it must
// give up by its close timeout, without aborting inside UCX (destroying a
// worker with operations still queued on an endpoint does), with or without
// peer-failure handling.
class UcxStalledReceiverTest : public ::testing::TestWithParam<bool> {};

TEST_P(UcxStalledReceiverTest, DestroyingTheSenderGivesUpByItsCloseTimeout) {
  UcxTransportOptions options;
  options.detect_peer_failure = GetParam();
  options.max_sends_in_flight = 512;
  options.close_timeout = absl::Milliseconds(200);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UcxTransport> receiver, UcxTransport::Create(options));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UcxTransport> sender, UcxTransport::Create(options));
  ASSERT_OK_AND_ASSIGN(PeerId peer, sender->Connect(receiver->LocalAddress()));
  std::vector<char> source = RandomBytes(4 << 20, 3);
  ASSERT_OK_AND_ASSIGN(RegionId region,
                       sender->RegisterMemory(source.data(), source.size(), MemoryKind::kHost));
  std::vector<TransportEvent> events;
  for (int i = 0; i < 400; ++i) {
    // Small (eager) and large (rendezvous) messages.
    const Slice slice{region, 0, i % 8 == 0 ? source.size() : uint64_t{4096}};
    ASSERT_OK(sender->PostSend(peer, absl::StrCat("message ", i), {&slice, 1}).status());
    sender->Poll(events);
  }
  const absl::Time start = absl::Now();
  sender.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  receiver.reset();
}

INSTANTIATE_TEST_SUITE_P(PeerFailureHandling, UcxStalledReceiverTest, ::testing::Bool());

TEST(UcxTransportOptionsTest, AWindowBelowOneIsRejected) {
  UcxTransportOptions options;
  options.max_sends_in_flight = 0;
  EXPECT_THAT(UcxTransport::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_sends_in_flight")));
}

// A peer process, started with a pipe on its stdout, killed at the end.
class PeerProcess {
 public:
  explicit PeerProcess(std::vector<std::string> args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      std::vector<char*> argv = {const_cast<char*>(TANDEM_UCX_PEER_HELPER)};
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  ~PeerProcess() {
    Kill();
    if (out_ >= 0) close(out_);
  }

  // The next line the peer prints, or "" at the deadline.
  std::string ReadLine(absl::Duration timeout = kStepTimeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string line;
    while (absl::Now() < deadline) {
      pollfd fd{out_, POLLIN, 0};
      if (poll(&fd, 1, 50) <= 0) continue;
      char c;
      if (read(out_, &c, 1) != 1) break;
      if (c == '\n') return line;
      line.push_back(c);
    }
    return "";
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
};

// Polls `transport` until it has released every peer record (the peers
// failed); false after kStepTimeout.
bool PollUntilNoPeers(UcxTransport& transport, std::vector<TransportEvent>& seen) {
  const absl::Time deadline = absl::Now() + kStepTimeout;
  while (transport.num_peers() > 0) {
    if (absl::Now() > deadline) return false;
    transport.Poll(seen);
  }
  return true;
}

// Polls `transport` until an event of `kind` from `peer` (any peer when 0)
// arrives; collects every event into `seen`.
bool PollUntil(UcxTransport& transport, std::vector<TransportEvent>& seen, Kind kind,
               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  size_t checked = 0;
  while (absl::Now() < deadline) {
    transport.Poll(seen);
    for (; checked < seen.size(); ++checked) {
      if (seen[checked].kind == kind) return true;
    }
    transport.WaitForActivity(std::min(deadline, absl::Now() + absl::Milliseconds(10)));
  }
  return false;
}

class UcxPeerDeathTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (GetParam()[0] != '\0') {
      ASSERT_EQ(setenv("UCX_TLS", GetParam(), 1), 0);
    }
  }
  void TearDown() override { unsetenv("UCX_TLS"); }
};

TEST_P(UcxPeerDeathTest, ReceiverSeesSenderKilledMidTransfer) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UcxTransport> receiver, UcxTransport::Create());
  std::vector<char> destination(8 << 20);
  ASSERT_OK_AND_ASSIGN(
      RegionId region,
      receiver->RegisterMemory(destination.data(), destination.size(), MemoryKind::kHost));
  PeerProcess sender({"send", absl::BytesToHexString(receiver->LocalAddress())});
  ASSERT_EQ(sender.ReadLine(), "connected");

  // Take a few messages, leave one accepted but unfinished, then kill.
  std::vector<TransportEvent> events;
  int accepted = 0;
  size_t checked = 0;
  const absl::Time deadline = absl::Now() + kStepTimeout;
  while (accepted < 3 && absl::Now() < deadline) {
    receiver->Poll(events);
    for (; checked < events.size(); ++checked) {
      if (events[checked].kind != Kind::kIncoming) continue;
      const Slice slice{region, 0, events[checked].payload_bytes};
      ASSERT_OK(receiver->Accept(events[checked].id, {&slice, 1}));
      ++accepted;
    }
  }
  ASSERT_GE(accepted, 3) << "the sender process never streamed";
  sender.Kill();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(PollUntil(*receiver, events, Kind::kPeerFailed, absl::Seconds(15)))
      << "the death of the sender went unnoticed";
  EXPECT_LT(absl::Now() - killed, absl::Seconds(15));
  for (const TransportEvent& event : events) {
    if (event.kind == Kind::kPeerFailed) {
      EXPECT_THAT(event.status, StatusIs(absl::StatusCode::kUnavailable));
    }
  }
  EXPECT_TRUE(PollUntilNoPeers(*receiver, events)) << "the dead sender's record was kept";
}

TEST_P(UcxPeerDeathTest, SenderSeesReceiverKilledWithSendsInFlight) {
  PeerProcess receiver({"hold"});
  const std::string address = absl::HexStringToBytes(receiver.ReadLine());
  ASSERT_FALSE(address.empty());
  // Two of the four sends wait behind the window: they must fail too.
  UcxTransportOptions options;
  options.max_sends_in_flight = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UcxTransport> sender, UcxTransport::Create(options));
  ASSERT_OK_AND_ASSIGN(PeerId peer, sender->Connect(address));
  std::vector<char> source(8 << 20, 's');
  ASSERT_OK_AND_ASSIGN(RegionId region,
                       sender->RegisterMemory(source.data(), source.size(), MemoryKind::kHost));
  const Slice slice{region, 0, source.size()};
  std::vector<SendId> sends;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(SendId send, sender->PostSend(peer, "held", {&slice, 1}));
    sends.push_back(send);
  }
  std::vector<TransportEvent> events;
  // The receiver holds the rendezvous messages, so the sends stay in flight.
  EXPECT_FALSE(PollUntil(*sender, events, Kind::kSendDone, absl::Milliseconds(300)));
  receiver.Kill();
  ASSERT_TRUE(PollUntil(*sender, events, Kind::kPeerFailed, absl::Seconds(15)))
      << "the death of the receiver went unnoticed";
  std::vector<SendId> failed;
  for (const TransportEvent& event : events) {
    if (event.kind != Kind::kSendDone) continue;
    EXPECT_THAT(event.status, StatusIs(absl::StatusCode::kUnavailable));
    failed.push_back(event.id);
  }
  EXPECT_THAT(failed, ::testing::UnorderedElementsAreArray(sends));
  EXPECT_THAT(sender->PostSend(peer, "late", {}), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(PollUntilNoPeers(*sender, events)) << "the dead receiver's record was kept";
  EXPECT_THAT(sender->PostSend(peer, "later", {}), StatusIs(absl::StatusCode::kUnavailable));
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxPeerDeathTest, ::testing::Values("", "tcp"),
                         [](const auto& info) {
                           return std::string(info.param[0] == '\0' ? "Default" : info.param);
                         });

}  // namespace
}  // namespace tandem::kvtransfer
