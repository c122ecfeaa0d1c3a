#include "router/worker_registry.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/routing_policy.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/fake_workers.h"

namespace tandem::router {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::Contains;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);

// Polls until `pred(snapshots)` holds or `kWait` passes.
template <typename Pred>
bool PollUntil(WorkerRegistry& registry, WorkerRole role, Pred pred) {
  const absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline) {
    if (pred(registry.Snapshot(role))) return true;
    registry.PollNow();
  }
  return pred(registry.Snapshot(role));
}

const WorkerSnapshot* FindSnapshot(const std::vector<WorkerSnapshot>& all,
                                   const std::string& address) {
  for (const WorkerSnapshot& s : all) {
    if (s.address == address) return &s;
  }
  return nullptr;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto running = rpc::StartServer({}, {&decode_});
    ASSERT_OK(running.status());
    server_ = *std::move(running);
    address_ = absl::StrCat("127.0.0.1:", server_.port);
  }
  void TearDown() override {
    if (server_.server != nullptr) {
      server_.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
    }
  }

  RegistryOptions Options(std::vector<std::string> decode_targets) {
    RegistryOptions o;
    o.decode_targets = std::move(decode_targets);
    o.health_interval = absl::Milliseconds(20);
    o.health_timeout = absl::Milliseconds(500);
    return o;
  }

  testing::FakeDecodeWorker decode_;
  rpc::RunningServer server_;
  std::string address_;
};

TEST(ResolveTarget, LocalhostResolvesToLoopback) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> a, ResolveTarget("localhost:8200"));
  EXPECT_THAT(a, Contains("127.0.0.1:8200"));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> b, ResolveTarget("[::1]:9"));
  EXPECT_THAT(b, Contains("[::1]:9"));
}

TEST(ResolveTarget, MalformedTargetsAreInvalidArgument) {
  for (const char* t : {"localhost", "localhost:", ":80", "host:0", "host:99999", "host:http"}) {
    EXPECT_THAT(ResolveTarget(t),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host:port")))
        << t;
  }
}

TEST(ResolveTarget, UnknownNameIsAnError) {
  EXPECT_FALSE(ResolveTarget("no-such-host.invalid:80").ok());
}

TEST_F(WorkerRegistryTest, NeedsDecodeTargetsAndWellFormedOnes) {
  EXPECT_THAT(WorkerRegistry::Create(Options({})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--decode_workers")));
  EXPECT_THAT(WorkerRegistry::Create(Options({"nohost"})),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(WorkerRegistryTest, LocalhostTargetBecomesAHealthyWorkerWithItsStats) {
  ASSERT_OK_AND_ASSIGN(auto registry,
                       WorkerRegistry::Create(Options({absl::StrCat("localhost:", server_.port)})));
  ASSERT_TRUE(registry->WaitForRoutable(WorkerRole::kDecode, kWait));
  const std::vector<WorkerSnapshot> all = registry->Snapshot(WorkerRole::kDecode);
  const WorkerSnapshot* s = FindSnapshot(all, address_);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->routable());
  EXPECT_EQ(s->target, absl::StrCat("localhost:", server_.port));
  EXPECT_EQ(s->vocab_size, testing::kFakeVocab);
  EXPECT_EQ(s->max_context, testing::kFakeMaxContext);
  EXPECT_EQ(s->kv_blocks_free, 64);
  EXPECT_TRUE(registry->Snapshot(WorkerRole::kPrefill).empty());
  EXPECT_NE(registry->Find(WorkerRole::kDecode, address_), nullptr);
  EXPECT_EQ(registry->Find(WorkerRole::kPrefill, address_), nullptr);
}

TEST_F(WorkerRegistryTest, BackgroundPollsKeepComing) {
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(Options({address_})));
  const absl::Time deadline = absl::Now() + kWait;
  while (decode_.stats_polls() < 5 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_GE(decode_.stats_polls(), 5);
}

TEST_F(WorkerRegistryTest, UnreachableWorkerIsDroppedFromRouting) {
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(Options({address_})));
  ASSERT_TRUE(registry->WaitForRoutable(WorkerRole::kDecode, kWait));
  ASSERT_TRUE(PickDecodeWorker(registry->Snapshot(WorkerRole::kDecode), 4, 4).has_value());
  server_.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
  server_.server.reset();
  EXPECT_TRUE(PollUntil(*registry, WorkerRole::kDecode,
                        [](const auto& all) { return all.size() == 1 && !all[0].healthy; }));
  EXPECT_FALSE(PickDecodeWorker(registry->Snapshot(WorkerRole::kDecode), 4, 4).has_value());
  EXPECT_FALSE(registry->WaitForRoutable(WorkerRole::kDecode, absl::Milliseconds(100)));
}

TEST_F(WorkerRegistryTest, DrainingWorkerIsHealthyButNotRoutable) {
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(Options({address_})));
  ASSERT_TRUE(registry->WaitForRoutable(WorkerRole::kDecode, kWait));
  decode_.SetDraining(true);
  EXPECT_TRUE(
      PollUntil(*registry, WorkerRole::kDecode, [](const auto& all) { return all[0].draining; }));
  const WorkerSnapshot s = registry->Snapshot(WorkerRole::kDecode)[0];
  EXPECT_TRUE(s.healthy);
  EXPECT_FALSE(s.routable());
  decode_.SetDraining(false);
  EXPECT_TRUE(
      PollUntil(*registry, WorkerRole::kDecode, [](const auto& all) { return all[0].routable(); }));
}

TEST_F(WorkerRegistryTest, AWorkerOfTheWrongRoleIsNotRoutable) {
  testing::FakePrefillWorker prefill;
  ASSERT_OK_AND_ASSIGN(rpc::RunningServer server, rpc::StartServer({}, {&prefill}));
  const std::string address = absl::StrCat("127.0.0.1:", server.port);
  // A prefill worker given as a decode worker: its GetStats says "prefill".
  // (The DecodeWorker service is not even there, so the poll fails either way.)
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(Options({address})));
  registry->PollNow();
  registry->PollNow();
  EXPECT_FALSE(registry->Snapshot(WorkerRole::kDecode)[0].healthy);
  server.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
}

TEST_F(WorkerRegistryTest, MarkUnavailableTakesItOutUntilTheNextPoll) {
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(Options({address_})));
  ASSERT_TRUE(registry->WaitForRoutable(WorkerRole::kDecode, kWait));
  registry->Find(WorkerRole::kDecode, address_)->MarkUnavailable(absl::UnavailableError("gone"));
  EXPECT_FALSE(registry->Snapshot(WorkerRole::kDecode)[0].routable());
  EXPECT_TRUE(
      PollUntil(*registry, WorkerRole::kDecode, [](const auto& all) { return all[0].routable(); }));
}

TEST_F(WorkerRegistryTest, ReservedBlocksCountUntilAPollSeesThem) {
  RegistryOptions options = Options({address_});
  options.health_interval = absl::Hours(1);  // Polls only when the test says.
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(options));
  registry->PollNow();
  std::shared_ptr<Worker> worker = registry->Find(WorkerRole::kDecode, address_);
  ASSERT_NE(worker, nullptr);
  auto first = worker->StartRequest();
  auto second = worker->StartRequest();
  first->ReserveBlocks(5);
  second->ReserveBlocks(7);
  WorkerSnapshot s = worker->Snapshot();
  EXPECT_EQ(s.inflight, 2);
  EXPECT_EQ(s.reserved_blocks, 12);
  // Confirmed reservations are in the stats of the next poll; unconfirmed
  // ones are not.
  first->ConfirmReservation();
  registry->PollNow();
  EXPECT_EQ(worker->Snapshot().reserved_blocks, 7);
  second.reset();
  s = worker->Snapshot();
  EXPECT_EQ(s.inflight, 1);
  EXPECT_EQ(s.reserved_blocks, 0);
}

// Names resolve again: workers join and leave (a headless Service scaling).
TEST(WorkerRegistryResolveTest, WorkersJoinAndLeaveAsTheNameResolvesDifferently) {
  auto mu = std::make_shared<absl::Mutex>();
  auto answer = std::make_shared<absl::StatusOr<std::vector<std::string>>>(
      std::vector<std::string>{"10.0.0.1:8200", "10.0.0.2:8200"});
  RegistryOptions options;
  options.decode_targets = {"decode.svc:8200"};
  options.resolve_interval = absl::Hours(1);
  options.health_interval = absl::Hours(1);
  options.health_timeout = absl::Milliseconds(100);
  options.resolver = [mu, answer](const std::string& target) {
    absl::MutexLock lock(mu.get());
    EXPECT_EQ(target, "decode.svc:8200");
    return *answer;
  };
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(options));
  auto addresses = [&] {
    std::vector<std::string> out;
    for (const WorkerSnapshot& s : registry->Snapshot(WorkerRole::kDecode)) {
      out.push_back(s.address);
      EXPECT_FALSE(s.healthy);  // Nothing listens there.
      EXPECT_EQ(s.target, "decode.svc:8200");
    }
    return out;
  };
  EXPECT_THAT(addresses(), ::testing::ElementsAre("10.0.0.1:8200", "10.0.0.2:8200"));
  std::shared_ptr<Worker> kept = registry->Find(WorkerRole::kDecode, "10.0.0.2:8200");
  {
    absl::MutexLock lock(mu.get());
    *answer = std::vector<std::string>{"10.0.0.2:8200", "10.0.0.3:8200"};
  }
  registry->ResolveNow();
  EXPECT_THAT(addresses(), ::testing::ElementsAre("10.0.0.2:8200", "10.0.0.3:8200"));
  // The worker that stayed is the same object (its load and stats are kept).
  EXPECT_EQ(registry->Find(WorkerRole::kDecode, "10.0.0.2:8200"), kept);
  // A failed resolution keeps the workers it had.
  {
    absl::MutexLock lock(mu.get());
    *answer = absl::UnavailableError("DNS timeout");
  }
  registry->ResolveNow();
  EXPECT_THAT(addresses(), ::testing::ElementsAre("10.0.0.2:8200", "10.0.0.3:8200"));
}

}  // namespace
}  // namespace tandem::router
