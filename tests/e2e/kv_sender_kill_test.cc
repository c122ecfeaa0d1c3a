// Senders SIGKILLed at random instants of their sends, on this host, while
// other senders keep transferring to the same receiver: every transfer from
// a live sender completes with its bytes exact, the receiver never crashes
// or stalls, and every lease, peer and file descriptor of the dead senders
// is released.
//
// Each round starts a victim (kv_sender_peer with a lease of many small
// chunks, so that it is sending almost all of its life) and a live sender,
// kills the victim after a seeded random delay that falls anywhere from its
// start-up and UCX wire-up to its last message, and requires the live
// sender's transfer to complete. A transport whose same-host message ring a
// dying writer can leave half-claimed stops hearing every later sender: the
// next live transfer misses its deadline and the round fails.
//
// TANDEM_SENDER_KILLS sets the number of kills (40 by default; the long
// suite's kv_sender_kill_long runs 400) and TANDEM_SENDER_KILL_SEED the seed
// (1 by default; a failure names both).
//
// The regular suite runs the short form (kv_sender_kill), the long suite
// the long one (kv_sender_kill_long).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/status_macros.h"
#include "gtest/gtest.h"
#include "kvtransfer/transfer_receiver.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "tests/e2e/kv_pattern.h"
#include "tests/testing/child_process.h"
#include "tests/testing/status_matchers.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::testing::Child;

// A live sender's transfer: 64 layers of 64 KiB in 4 KiB chunks, 1,024
// messages. A victim's has four times the layers, handed over one every
// kVictimLayerGap as a prefill worker's compute would, so that it sends
// for about a quarter of a second; every victim lands in the same area
// (nothing checks what a killed sender wrote but its first chunk, which
// says that it has started).
constexpr int kLiveLayers = 64;
constexpr int kVictimLayers = 4 * kLiveLayers;
constexpr absl::Duration kVictimLayerGap = absl::Microseconds(1000);
constexpr uint64_t kLayerBytes = 64 << 10;
constexpr uint64_t kChunkBytes = 4096;
constexpr uint64_t kLiveBytes = kLiveLayers * kLayerBytes;
constexpr uint64_t kVictimBytes = kVictimLayers * kLayerBytes;
// A dead victim's lease ends when UCX finds the peer gone, or at this
// deadline when it died before it connected.
constexpr absl::Duration kVictimDeadline = absl::Seconds(6);
// Real time a live sender's transfer may take on a loaded machine.
constexpr absl::Duration kLiveDeadline = absl::Seconds(20);

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::atoi(value);
}

int OpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

struct LeaseState {
  bool done = false;
  absl::Status status;
};

class KillHarness {
 public:
  // The live sender's area, then the victims'.
  KillHarness() : memory_(kLiveBytes + kVictimBytes, 0) {}

  absl::Status Init() {
    ASSIGN_OR_RETURN(transport_, UcxTransport::Create());
    ReceiverOptions options;
    options.chunk_bytes = kChunkBytes;
    receiver_ = std::make_unique<TransferReceiver>(transport_.get(), &Clock::Real(), options);
    ASSIGN_OR_RETURN(region_,
                     receiver_->RegisterMemory(memory_.data(), memory_.size(), MemoryKind::kHost));
    return absl::OkStatus();
  }

  // Opens a lease over a live sender's area (`victim` false) or the
  // victims' for `deadline`; its end lands in `state`.
  absl::StatusOr<std::string> Lease(bool victim, uint64_t request_id, absl::Duration deadline,
                                    LeaseState* state) {
    ReceiveRequest request;
    request.request_id = request_id;
    const uint64_t base = victim ? kLiveBytes : 0;
    for (int l = 0; l < (victim ? kVictimLayers : kLiveLayers); ++l) {
      request.layers.push_back({Slice{region_, base + l * kLayerBytes, kLayerBytes}});
    }
    request.deadline = absl::Now() + deadline;
    *state = LeaseState{};
    request.done = [state](uint64_t, uint64_t, const absl::Status& status) {
      state->done = true;
      state->status = status;
    };
    ASSIGN_OR_RETURN(TransferLease lease, receiver_->Expect(std::move(request)));
    return lease.Serialize();
  }

  // Polls the receiver for `duration`.
  void PumpFor(absl::Duration duration) {
    const absl::Time until = absl::Now() + duration;
    do {
      receiver_->Poll();
      receiver_->WaitForActivity(std::min(until, absl::Now() + absl::Milliseconds(1)));
    } while (absl::Now() < until);
  }

  // Polls until `done` or `timeout`; whether `done` held.
  template <typename Done>
  bool PumpUntil(absl::Duration timeout, Done done) {
    const absl::Time until = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() > until) return false;
      receiver_->Poll();
      receiver_->WaitForActivity(absl::Now() + absl::Milliseconds(2));
    }
    return true;
  }

  // Polls until `child` exits; its exit code, -1 after `timeout`.
  int PumpUntilExit(Child& child, absl::Duration timeout) {
    int code = -1;
    PumpUntil(timeout, [&] { return (code = child.Wait(absl::ZeroDuration())) != -1; });
    return code;
  }

  // Whether the live sender's area holds `seed`'s pattern in every layer.
  bool LiveAreaHolds(uint64_t seed) const {
    std::vector<uint8_t> expected(kLayerBytes);
    for (int l = 0; l < kLiveLayers; ++l) {
      testing::FillKvPattern(seed, l, expected.data(), expected.size());
      if (std::memcmp(memory_.data() + l * kLayerBytes, expected.data(), kLayerBytes) != 0) {
        return false;
      }
    }
    return true;
  }

  // Zeroes the victims' first chunk, so that VictimStarted() says when the
  // next victim's has landed.
  void ClearVictimStart() { std::memset(memory_.data() + kLiveBytes, 0, kChunkBytes); }
  bool VictimStarted() const {
    const uint8_t* chunk = memory_.data() + kLiveBytes;
    return std::any_of(chunk, chunk + kChunkBytes, [](uint8_t b) { return b != 0; });
  }

  TransferReceiver& receiver() { return *receiver_; }
  UcxTransport& transport() { return *transport_; }

 private:
  std::vector<uint8_t> memory_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<TransferReceiver> receiver_;
  RegionId region_ = 0;
};

std::vector<std::string> SenderArgs(const std::string& descriptor, uint64_t seed,
                                    absl::Duration layer_gap = absl::ZeroDuration()) {
  return {TANDEM_KV_SENDER_PEER,
          absl::BytesToHexString(descriptor),
          std::to_string(seed),
          "1",
          "-1",
          std::to_string(absl::ToInt64Microseconds(layer_gap))};
}

// One live sender's transfer from spawn to exit: OK once its bytes landed
// exactly and it exited 0. `first` and `done` (optional) get the times from
// spawn to its first message and to the lease's end.
void LiveTransfer(KillHarness& h, uint64_t request_id, uint64_t seed, absl::Duration* first,
                  absl::Duration* done) {
  LeaseState live;
  ASSERT_OK_AND_ASSIGN(std::string lease, h.Lease(false, request_id, kLiveDeadline, &live));
  const uint64_t messages = h.receiver().stats().accepted_messages;
  const absl::Time start = absl::Now();
  Child sender(SenderArgs(lease, seed));
  ASSERT_GT(sender.pid(), 0);
  if (first != nullptr) {
    ASSERT_TRUE(h.PumpUntil(kLiveDeadline, [&] {
      return live.done || h.receiver().stats().accepted_messages > messages;
    }));
    *first = absl::Now() - start;
  }
  ASSERT_TRUE(h.PumpUntil(kLiveDeadline + absl::Seconds(5), [&] { return live.done; }))
      << "a live sender's transfer did not end";
  if (done != nullptr) *done = absl::Now() - start;
  ASSERT_OK(live.status) << "a live sender's transfer";
  ASSERT_TRUE(h.LiveAreaHolds(seed)) << "a live sender's bytes";
  EXPECT_EQ(h.PumpUntilExit(sender, absl::Seconds(20)), 0);
}

TEST(SenderKills, LiveSendersCompleteWhileOthersAreKilledMidSend) {
  const int kills = EnvInt("TANDEM_SENDER_KILLS", 40);
  const int seed = EnvInt("TANDEM_SENDER_KILL_SEED", 1);
  ASSERT_GT(kills, 0) << "TANDEM_SENDER_KILLS must be a count above 0";
  SCOPED_TRACE(absl::StrCat("TANDEM_SENDER_KILLS=", kills, " TANDEM_SENDER_KILL_SEED=", seed));
  std::mt19937_64 rng(seed);

  KillHarness h;
  ASSERT_OK(h.Init());
  const int fds_before = OpenFds();
  // Where a sender's life is on this machine: a quarter of the kills fall
  // uniformly in the second half of its start-up (UCX's wire-up and the
  // introduction among them), the rest once its first chunk has landed,
  // uniformly over the time its sends take.
  absl::Duration first, done;
  ASSERT_NO_FATAL_FAILURE(LiveTransfer(h, 1, 1, &first, &done));
  const int64_t startup_from = absl::ToInt64Microseconds(first / 2);
  const int64_t startup_to = std::max(absl::ToInt64Microseconds(first), startup_from + 1);
  const int64_t sends_for = absl::ToInt64Microseconds(kVictimLayers * kVictimLayerGap);
  std::printf(
      "sender kills: a sender's first message %s after its spawn, its last %s; kills "
      "fall %s to %s after a victim's spawn, or up to %s after its first chunk\n",
      absl::FormatDuration(first).c_str(), absl::FormatDuration(done).c_str(),
      absl::FormatDuration(absl::Microseconds(startup_from)).c_str(),
      absl::FormatDuration(absl::Microseconds(startup_to)).c_str(),
      absl::FormatDuration(absl::Microseconds(sends_for)).c_str());

  std::vector<std::unique_ptr<LeaseState>> victims;
  int during_sends = 0;
  for (int round = 0; round < kills; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto& victim = victims.emplace_back(std::make_unique<LeaseState>());
    ASSERT_OK_AND_ASSIGN(std::string victim_lease,
                         h.Lease(true, 1000 + 3 * round, kVictimDeadline, victim.get()));
    LeaseState live;
    const uint64_t live_seed = 200'000 + round;
    ASSERT_OK_AND_ASSIGN(std::string live_lease,
                         h.Lease(false, 1000 + 3 * round + 1, kLiveDeadline, &live));

    // The victim and a live sender start together; the victim dies at a
    // random instant while the live one sends.
    h.ClearVictimStart();
    Child victim_process(SenderArgs(victim_lease, 100'000 + round, kVictimLayerGap));
    ASSERT_GT(victim_process.pid(), 0);
    Child live_process(SenderArgs(live_lease, live_seed));
    ASSERT_GT(live_process.pid(), 0);
    absl::Duration kill_after;
    if (rng() % 4 == 0) {
      kill_after = absl::Microseconds(
          startup_from + static_cast<int64_t>(rng() % uint64_t(startup_to - startup_from)));
      h.PumpFor(kill_after);
    } else {
      const absl::Time spawned = absl::Now();
      ASSERT_TRUE(h.PumpUntil(kLiveDeadline, [&] { return h.VictimStarted(); }))
          << "a victim's first chunk did not land";
      h.PumpFor(absl::Microseconds(static_cast<int64_t>(rng() % uint64_t(sends_for))));
      kill_after = absl::Now() - spawned;
    }
    if (h.VictimStarted() && !victim->done) ++during_sends;
    victim_process.Kill();
    SCOPED_TRACE(
        absl::StrCat("victim killed ", absl::FormatDuration(kill_after), " after its spawn"));

    ASSERT_TRUE(h.PumpUntil(kLiveDeadline + absl::Seconds(5), [&] { return live.done; }))
        << "a live sender's transfer did not end after a victim was killed";
    ASSERT_OK(live.status) << "the live sender's transfer beside the victim";
    ASSERT_TRUE(h.LiveAreaHolds(live_seed));
    EXPECT_EQ(h.PumpUntilExit(live_process, absl::Seconds(20)), 0);
    // A sender that starts after the kill is heard too.
    ASSERT_NO_FATAL_FAILURE(
        LiveTransfer(h, 1000 + 3 * round + 2, 300'000 + round, nullptr, nullptr));
  }

  // Every victim's lease ends (by peer failure or its deadline), and the
  // receiver holds nothing of the dead senders.
  int victims_completed = 0;
  int victims_failed = 0;
  for (auto& victim : victims) {
    ASSERT_TRUE(h.PumpUntil(kVictimDeadline + absl::Seconds(10), [&] { return victim->done; }))
        << "a killed sender's lease did not end by its deadline";
    ++(victim->status.ok() ? victims_completed : victims_failed);
  }
  EXPECT_TRUE(h.receiver().idle());
  EXPECT_TRUE(h.PumpUntil(absl::Seconds(20), [&] { return h.transport().num_peers() == 0; }))
      << h.transport().num_peers() << " peers still held";
  // UCX may keep a few descriptors of its own; none may grow with the kills.
  EXPECT_LE(OpenFds(), fds_before + 4);
  std::printf(
      "sender kills: %d kills (seed %d), %d while messages were arriving: %d victims "
      "had finished, %d were cut off; %d live transfers completed; the door was replaced "
      "%d times\n",
      kills, seed, during_sends, victims_completed, victims_failed, 2 * kills + 1,
      static_cast<int>(h.transport().doors_replaced()));
}

}  // namespace
}  // namespace tandem::kvtransfer
