// The worker registry (router/worker_registry.h) against fake workers over
// real gRPC: health polls and what they make routable (draining, wrong role,
// unavailable and unresponsive marks, reserved blocks) and the pool's
// agreement on weights, KV layout and vocabulary. Targets (resolving names,
// workers joining and leaving, file: targets) are in
// worker_registry_targets_test.cc.
#include "router/worker_registry.h"

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/grpc_worker_channel.h"
#include "router/routing_policy.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/fake_workers.h"

namespace tandem::router {
namespace {

using ::tandem::testing::StatusIs;
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
    o.channels = GrpcWorkerChannels().value();
    o.decode_targets = std::move(decode_targets);
    o.health_interval = absl::Milliseconds(20);
    // Live fake workers answer at once and a stopped one fails at once: the
    // timeout only has to outlast a loaded machine.
    o.health_timeout = absl::Seconds(30);
    return o;
  }

  testing::FakeDecodeWorker decode_;
  rpc::RunningServer server_;
  std::string address_;
};

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

// A request that got no answer (MarkUnresponsive) or a health poll that got
// none tells the requests still waiting on the worker; a refused poll does
// not (their own calls fail at once).
TEST(WorkerWatchTest, UnansweredCallsReachTheWatchersUntilTheyLeave) {
  Worker worker("127.0.0.1:1", "127.0.0.1:1", WorkerRole::kPrefill,
                NewGrpcWorkerChannel("127.0.0.1:1", "127.0.0.1:1", WorkerRole::kPrefill, {}));
  std::vector<std::string> heard;
  auto watch = worker.WatchUnresponsive(
      [&](const absl::Status& why) { heard.push_back(std::string(why.message())); });
  worker.RecordPoll(worker.BeginPoll(), absl::UnavailableError("connection refused"));
  EXPECT_TRUE(heard.empty());
  worker.RecordPoll(worker.BeginPoll(), absl::DeadlineExceededError("Deadline Exceeded"));
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_THAT(heard[0], HasSubstr("did not answer a health poll"));
  worker.MarkUnresponsive(absl::UnavailableError("request r got no answer"));
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[1], "request r got no answer");
  EXPECT_FALSE(worker.Snapshot().routable());
  watch.reset();
  worker.MarkUnresponsive(absl::UnavailableError("again"));
  EXPECT_EQ(heard.size(), 2u);
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

// A pool of fake workers on loopback, for the agreement checks: every
// worker serves the default FakeModel until a test changes it.
class PoolAgreementTest : public ::testing::Test {
 protected:
  static constexpr int kDecode = 3;

  void SetUp() override {
    for (int i = 0; i < kDecode; ++i) {
      ASSERT_OK_AND_ASSIGN(rpc::RunningServer s, rpc::StartServer({}, {&decode_[i]}));
      decode_addresses_.push_back(absl::StrCat("127.0.0.1:", s.port));
      servers_.push_back(std::move(s));
    }
    ASSERT_OK_AND_ASSIGN(rpc::RunningServer s, rpc::StartServer({}, {&prefill_}));
    prefill_address_ = absl::StrCat("127.0.0.1:", s.port);
    servers_.push_back(std::move(s));
  }
  void TearDown() override {
    for (rpc::RunningServer& s : servers_) {
      s.server->Shutdown(rpc::ToChrono(absl::Now() + absl::Seconds(5)));
    }
  }

  // A registry that polls only when the test says.
  std::unique_ptr<WorkerRegistry> Registry(int tokenizer_vocab_size = 0) {
    RegistryOptions o;
    o.channels = GrpcWorkerChannels().value();
    o.prefill_targets = {prefill_address_};
    o.decode_targets = decode_addresses_;
    o.health_interval = absl::Hours(1);
    o.health_timeout = absl::Seconds(30);
    o.tokenizer_vocab_size = tokenizer_vocab_size;
    absl::StatusOr<std::unique_ptr<WorkerRegistry>> r = WorkerRegistry::Create(std::move(o));
    EXPECT_OK(r.status());
    return r.ok() ? *std::move(r) : nullptr;
  }

  const WorkerSnapshot Decode(WorkerRegistry& registry, int i) {
    const std::vector<WorkerSnapshot> all = registry.Snapshot(WorkerRole::kDecode);
    const WorkerSnapshot* s = FindSnapshot(all, decode_addresses_[i]);
    EXPECT_NE(s, nullptr);
    return s != nullptr ? *s : WorkerSnapshot{};
  }

  testing::FakeDecodeWorker decode_[kDecode];
  testing::FakePrefillWorker prefill_;
  std::vector<rpc::RunningServer> servers_;
  std::vector<std::string> decode_addresses_;
  std::string prefill_address_;
};

TEST_F(PoolAgreementTest, AgreeingWorkersAreRoutableAndThePoolHasTheirIdentity) {
  auto registry = Registry(testing::kFakeVocab);
  ASSERT_NE(registry, nullptr);
  registry->PollNow();
  for (int i = 0; i < kDecode; ++i) {
    EXPECT_TRUE(Decode(*registry, i).routable()) << i;
    EXPECT_EQ(Decode(*registry, i).kv_dtype, "f32");
    EXPECT_EQ(Decode(*registry, i).weights_fingerprint, testing::FakeModel().weights_fingerprint);
  }
  EXPECT_TRUE(registry->Snapshot(WorkerRole::kPrefill)[0].routable());
  ASSERT_TRUE(registry->pool_identity().has_value());
  EXPECT_EQ(registry->pool_identity()->model, "fake");
  EXPECT_EQ(registry->pool_identity()->kv_dtype, "f32");
  EXPECT_EQ(registry->pool_identity()->block_size, 16);
}

struct Mismatch {
  const char* name;
  testing::FakeModel model;
  const char* expected;  // the log line's clause
};

void PrintTo(const Mismatch& m, std::ostream* os) { *os << m.name; }

class PoolMismatchTest : public PoolAgreementTest,
                         public ::testing::WithParamInterface<Mismatch> {};

// Guards: workers with other weights or another KV layout were routed to,
// and the KV bytes they received were garbage to them.
TEST_P(PoolMismatchTest, ADisagreeingWorkerIsNeverRoutedToAndLoggedOnce) {
  decode_[1].SetModel(GetParam().model);
  auto registry = Registry(testing::kFakeVocab);
  ASSERT_NE(registry, nullptr);
  ::testing::internal::CaptureStderr();
  for (int round = 0; round < 10; ++round) {
    registry->PollNow();
    const WorkerSnapshot bad = Decode(*registry, 1);
    EXPECT_TRUE(bad.healthy);
    EXPECT_FALSE(bad.routable()) << "round " << round;
    EXPECT_THAT(bad.disagreement, HasSubstr(GetParam().expected));
    EXPECT_TRUE(Decode(*registry, 0).routable());
    EXPECT_TRUE(Decode(*registry, 2).routable());
    for (int i = 0; i < 20; ++i) {
      std::optional<Pick> pick = PickDecodeWorker(registry->Snapshot(WorkerRole::kDecode), 4, 4);
      ASSERT_TRUE(pick.has_value());
      EXPECT_NE(pick->address, decode_addresses_[1]);
    }
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string line =
      absl::StrCat("decode worker ", decode_addresses_[1], " ", GetParam().expected);
  size_t count = 0;
  for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++count;
  EXPECT_EQ(count, 1u) << log;
  EXPECT_THAT(log, HasSubstr("not routing to it until it agrees"));

  // Restarted with the pool's model: it rejoins.
  ::testing::internal::CaptureStderr();
  decode_[1].SetModel({});
  registry->PollNow();
  EXPECT_TRUE(Decode(*registry, 1).routable());
  EXPECT_EQ(Decode(*registry, 1).disagreement, "");
  EXPECT_THAT(
      ::testing::internal::GetCapturedStderr(),
      HasSubstr(absl::StrCat("decode worker ", decode_addresses_[1], " agrees with the pool now")));
}

INSTANTIATE_TEST_SUITE_P(
    EveryField, PoolMismatchTest,
    ::testing::Values(
        Mismatch{"Fingerprint",
                 {.weights_fingerprint = "ffffffffffffffff"},
                 "has weights fingerprint ffffffffffffffff, the pool has 00000000000fa4e1"},
        Mismatch{"ExpertLayout",
                 {.model_shape = "dim=64 layers=2 experts=16 top_k=2"},
                 "has experts 16, the pool has 8"},
        Mismatch{"KvDtype", {.kv_dtype = "bf16"}, "has kv_dtype bf16, the pool has f32"},
        Mismatch{"BlockSize", {.block_size = 32}, "has block_size 32, the pool has 16"},
        Mismatch{"ModelName", {.name = "other"}, "has model 'other', the pool has 'fake'"},
        Mismatch{"VocabSize", {.vocab_size = 80}, "has vocab_size 80, the pool has 64"}),
    [](const ::testing::TestParamInfo<Mismatch>& info) { return info.param.name; });

TEST_F(PoolAgreementTest, APrefillWorkerMustAgreeWithTheDecodeWorkers) {
  prefill_.SetModel({.kv_dtype = "bf16"});
  auto registry = Registry();
  ASSERT_NE(registry, nullptr);
  registry->PollNow();
  const WorkerSnapshot p = registry->Snapshot(WorkerRole::kPrefill)[0];
  EXPECT_TRUE(p.healthy);
  EXPECT_FALSE(p.routable());
  EXPECT_EQ(p.disagreement, "has kv_dtype bf16, the pool has f32");
  // No routable prefill worker: requests are prefilled on the decode worker.
  EXPECT_FALSE(PickPrefillWorker(registry->Snapshot(WorkerRole::kPrefill)).has_value());
  EXPECT_TRUE(DecidePrefill(registry->Snapshot(WorkerRole::kPrefill), 100, 0).local);
}

// Guards: a worker that restarted with another model stayed routable until
// the round's end.
TEST_F(PoolAgreementTest, AWorkerWhoseStatsChangeIdentityLeavesAtOnce) {
  auto registry = Registry();
  ASSERT_NE(registry, nullptr);
  registry->PollNow();
  ASSERT_TRUE(Decode(*registry, 2).routable());
  decode_[2].SetModel({.block_size = 8});
  std::shared_ptr<Worker> worker = registry->Find(WorkerRole::kDecode, decode_addresses_[2]);
  ASSERT_NE(worker, nullptr);
  // The poll alone, before the registry's check, takes it out.
  v1::WorkerStats stats;
  stats.set_role("decode");
  stats.set_model("fake");
  stats.set_block_size(8);
  worker->RecordPoll(worker->BeginPoll(), stats);
  EXPECT_FALSE(worker->Snapshot().routable());
  registry->PollNow();
  EXPECT_FALSE(Decode(*registry, 2).routable());
  EXPECT_THAT(Decode(*registry, 2).disagreement, HasSubstr("has block_size 8, the pool has 16"));
}

TEST_F(PoolAgreementTest, AMinorityNeverTakesOverButAMajorityMovesThePool) {
  auto registry = Registry();
  ASSERT_NE(registry, nullptr);
  registry->PollNow();
  // Two of four workers (prefill included) move to bf16: a tie keeps f32.
  decode_[0].SetModel({.kv_dtype = "bf16"});
  decode_[1].SetModel({.kv_dtype = "bf16"});
  registry->PollNow();
  EXPECT_EQ(registry->pool_identity()->kv_dtype, "f32");
  EXPECT_FALSE(Decode(*registry, 0).routable());
  EXPECT_TRUE(Decode(*registry, 2).routable());
  // The third: bf16 is the majority now, and the f32 ones are out.
  decode_[2].SetModel({.kv_dtype = "bf16"});
  registry->PollNow();
  EXPECT_EQ(registry->pool_identity()->kv_dtype, "bf16");
  for (int i = 0; i < kDecode; ++i) EXPECT_TRUE(Decode(*registry, i).routable()) << i;
  EXPECT_FALSE(registry->Snapshot(WorkerRole::kPrefill)[0].routable());
}

// Guards: a router started with another model's tokenizer sent token ids
// outside the workers' vocabulary.
TEST_F(PoolAgreementTest, WorkersWithFewerIdsThanTheTokenizerAreOutOfThePool) {
  auto registry = Registry(/*tokenizer_vocab_size=*/testing::kFakeVocab + 1);
  ASSERT_NE(registry, nullptr);
  registry->PollNow();
  for (int i = 0; i < kDecode; ++i) {
    const WorkerSnapshot s = Decode(*registry, i);
    EXPECT_TRUE(s.healthy);
    EXPECT_FALSE(s.routable());
    EXPECT_EQ(s.disagreement, absl::StrCat("has vocab_size ", testing::kFakeVocab,
                                           ", smaller than the router's tokenizer (",
                                           testing::kFakeVocab + 1, ")"));
  }
  EXPECT_FALSE(registry->pool_identity().has_value());
  EXPECT_FALSE(registry->WaitForRoutable(WorkerRole::kDecode, absl::Milliseconds(50)));
}

}  // namespace
}  // namespace tandem::router
