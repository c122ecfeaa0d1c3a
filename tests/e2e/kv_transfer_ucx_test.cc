// KV transfers between two processes over UCX, through the lease protocol:
// the test is the decode side (TransferReceiver), a spawned kv_sender_peer
// the prefill side. Bytes are checked exactly, including that nothing
// outside the leased blocks was written.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/transfer_receiver.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "tests/e2e/kv_receiver_side.h"
#include "tests/testing/child_process.h"
#include "tests/testing/status_matchers.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::testing::Child;

// Sets environment variables for the life of the object (the child inherits
// them); restores the old values after.
class ScopedEnv {
 public:
  void Set(const char* name, const std::string& value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old != nullptr, old ? old : ""});
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->had) {
        setenv(it->name.c_str(), it->value.c_str(), 1);
      } else {
        unsetenv(it->name.c_str());
      }
    }
  }

 private:
  struct Saved {
    std::string name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

std::vector<std::string> PeerArgs(const std::string& descriptor, uint64_t seed, int lanes,
                                  int stall_after) {
  return {TANDEM_KV_SENDER_PEER, absl::BytesToHexString(descriptor), std::to_string(seed),
          std::to_string(lanes), std::to_string(stall_after)};
}

class TwoProcessTransfer : public ::testing::TestWithParam<Shape> {};

TEST_P(TwoProcessTransfer, BytesArriveExactly) {
  const Shape& shape = GetParam();
  ScopedEnv env;
  if (!shape.tls.empty()) env.Set("UCX_TLS", shape.tls);
  const uint64_t seed = 1000 + shape.layers * 7 + shape.lanes;
  ASSERT_OK_AND_ASSIGN(auto side, KvReceiverSide::Create(shape, seed));
  KvReceiverSide& receiver = *side;
  ASSERT_OK_AND_ASSIGN(std::string descriptor, receiver.Lease(absl::Seconds(20)));
  Child peer(PeerArgs(descriptor, seed, shape.lanes, -1));
  ASSERT_GT(peer.pid(), 0);
  receiver.RunUntilDone(absl::Seconds(25));
  ASSERT_EQ(receiver.done_calls(), 1);
  ASSERT_OK(receiver.status());
  EXPECT_OK(receiver.CheckBytes());
  // The sender exits 0 only once the receiver confirmed the transfer.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  int code = -1;
  while (absl::Now() < until && (code = peer.Wait(absl::Milliseconds(10))) == -1) {
    receiver.receiver().Poll();
  }
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(receiver.receiver().idle());
}

INSTANTIATE_TEST_SUITE_P(Shapes, TwoProcessTransfer,
                         ::testing::Values(Shape{8, 64, 20, 4096, 1, 0, false, ""},
                                           Shape{32, 40, 9, 65536, 1, 0, true, ""},
                                           Shape{5, 16, 16, 1 << 20, 4, 1 << 18, false, ""},
                                           Shape{12, 30, 7, 12288, 2, 8192, true, "tcp"},
                                           Shape{3, 8, 5, 1 << 20, 1, 0, false, "tcp"}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return absl::StrCat(s.layers, "layers_", s.block_bytes, "B_lanes",
                                               s.lanes, s.checksums ? "_xxh3" : "",
                                               s.tls.empty() ? "" : "_tcp");
                         });

// A sender killed with SIGKILL halfway: the lease fails within its deadline,
// its destination is released exactly once, and nothing hangs.
TEST(TwoProcessTransferFaults, SenderKilledMidTransferFailsTheLease) {
  const Shape shape{6, 32, 10, 65536, 1, 0, false, ""};
  ASSERT_OK_AND_ASSIGN(auto side, KvReceiverSide::Create(shape, 5));
  KvReceiverSide& receiver = *side;
  ASSERT_OK_AND_ASSIGN(std::string descriptor, receiver.Lease(absl::Seconds(8)));
  Child peer(PeerArgs(descriptor, 5, 1, /*stall_after=*/3));
  ASSERT_GT(peer.pid(), 0);
  const absl::Time start = absl::Now();
  while (receiver.receiver().stats().accepted_messages < 3 &&
         absl::Now() < start + absl::Seconds(10)) {
    receiver.receiver().Poll();
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_GE(receiver.receiver().stats().accepted_messages, 3u);
  peer.Kill();
  receiver.RunUntilDone(absl::Seconds(12));
  EXPECT_LT(absl::Now() - start, absl::Seconds(12));
  ASSERT_EQ(receiver.done_calls(), 1);
  EXPECT_THAT(receiver.status().code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                                         absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(receiver.receiver().idle());
}

// Two network namespaces joined by a veth pair, the way two hosts would be.
// Both ends are fresh namespaces (some sandboxes do not forward veth traffic
// into their root namespace). Addresses come from 192.0.2.0/24 (TEST-NET-1,
// reserved for documentation), which no real network uses.
class VethPair {
 public:
  VethPair() {
    const std::string id = std::to_string(getpid() % 100000);
    ns_a_ = "tandem-kva-" + id;
    ns_b_ = "tandem-kvb-" + id;
    dev_a_ = "tkva" + id;
    dev_b_ = "tkvb" + id;
    ok_ = Sh("ip netns add " + ns_a_) && Sh("ip netns add " + ns_b_) &&
          Sh("ip link add " + dev_a_ + " type veth peer name " + dev_b_) &&
          Sh("ip link set " + dev_a_ + " netns " + ns_a_) &&
          Sh("ip link set " + dev_b_ + " netns " + ns_b_) &&
          Sh(InA("ip addr add 192.0.2.1/24 dev " + dev_a_)) &&
          Sh(InA("ip link set " + dev_a_ + " up")) && Sh(InA("ip link set lo up")) &&
          Sh(InB("ip addr add 192.0.2.2/24 dev " + dev_b_)) &&
          Sh(InB("ip link set " + dev_b_ + " up")) && Sh(InB("ip link set lo up"));
  }
  ~VethPair() {
    Sh("ip netns del " + ns_a_ + " 2>/dev/null");
    Sh("ip netns del " + ns_b_ + " 2>/dev/null");
  }
  bool ok() const { return ok_; }
  const std::string& ns_a() const { return ns_a_; }
  const std::string& ns_b() const { return ns_b_; }
  const std::string& dev_a() const { return dev_a_; }
  const std::string& dev_b() const { return dev_b_; }

 private:
  static bool Sh(const std::string& command) { return std::system(command.c_str()) == 0; }
  std::string InA(const std::string& c) const { return "ip netns exec " + ns_a_ + " " + c; }
  std::string InB(const std::string& c) const { return "ip netns exec " + ns_b_ + " " + c; }
  std::string ns_a_, ns_b_, dev_a_, dev_b_;
  bool ok_ = false;
};

TEST(NetnsTransfer, SenderAndReceiverInTwoNamespacesOverVeth) {
  if (geteuid() != 0 || std::system("ip netns list >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs root and 'ip netns' (iproute2) to build two namespaces";
  }
  VethPair veth;
  if (!veth.ok()) GTEST_SKIP() << "could not create network namespaces here";
  // The receiver prints its descriptor on stdout, then checks the bytes it
  // got and exits 0 when they are right.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  Child receiver({"ip", "netns", "exec", veth.ns_a(), "env", "UCX_TLS=tcp",
                  "UCX_NET_DEVICES=" + veth.dev_a(), TANDEM_KV_RECEIVER_PEER, "77"},
                 &actions);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  ASSERT_GT(receiver.pid(), 0);
  std::string descriptor_hex;
  char c;
  while (read(pipe_fds[0], &c, 1) == 1 && c != '\n') descriptor_hex += c;
  close(pipe_fds[0]);
  ASSERT_FALSE(descriptor_hex.empty()) << "the receiver printed no descriptor";
  Child sender({"ip", "netns", "exec", veth.ns_b(), "env", "UCX_TLS=tcp",
                "UCX_NET_DEVICES=" + veth.dev_b(), TANDEM_KV_SENDER_PEER, descriptor_hex, "77", "2",
                "-1"});
  EXPECT_EQ(receiver.Wait(absl::Seconds(30)), 0);
  EXPECT_EQ(sender.Wait(absl::Seconds(10)), 0);
}

}  // namespace
}  // namespace tandem::kvtransfer
