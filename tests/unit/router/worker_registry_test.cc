#include "router/worker_registry.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/grpc_worker_channel.h"
#include "router/routing_policy.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/fake_workers.h"

namespace tandem::router {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

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

// Names resolve again: workers join and leave (a headless Service scaling).
TEST(WorkerRegistryResolveTest, WorkersJoinAndLeaveAsTheNameResolvesDifferently) {
  auto mu = std::make_shared<absl::Mutex>();
  auto answer = std::make_shared<absl::StatusOr<std::vector<std::string>>>(
      std::vector<std::string>{"10.0.0.1:8200", "10.0.0.2:8200"});
  RegistryOptions options;
  options.channels = GrpcWorkerChannels().value();
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

// The last reference to a worker (and its channel) is often dropped on a
// gRPC callback thread; the worker is only destroyed on the registry's own
// threads.
TEST(WorkerRegistryResolveTest, AWorkerReleasedElsewhereIsDestroyedByTheRegistry) {
  auto mu = std::make_shared<absl::Mutex>();
  auto answer = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"10.0.0.1:8200", "10.0.0.2:8200"});
  RegistryOptions options;
  options.channels = GrpcWorkerChannels().value();
  options.decode_targets = {"decode.svc:8200"};
  options.resolve_interval = absl::Hours(1);
  options.health_interval = absl::Hours(1);
  options.health_timeout = absl::Milliseconds(100);
  options.resolver = [mu, answer](const std::string&) {
    absl::MutexLock lock(mu.get());
    return absl::StatusOr<std::vector<std::string>>(*answer);
  };
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(options));
  // A poll round holds the workers while it runs: end the background
  // threads (after their first round); the test resolves by hand.
  registry->Stop();
  EXPECT_EQ(registry->workers_not_destroyed(), 2);
  std::shared_ptr<Worker> held = registry->Find(WorkerRole::kDecode, "10.0.0.2:8200");
  ASSERT_NE(held, nullptr);
  {
    absl::MutexLock lock(mu.get());
    *answer = {"10.0.0.1:8200"};
  }
  registry->ResolveNow();
  EXPECT_EQ(registry->Find(WorkerRole::kDecode, "10.0.0.2:8200"), nullptr);
  EXPECT_EQ(registry->workers_not_destroyed(), 2);  // Still held here.
  std::thread([released = std::move(held)]() mutable { released.reset(); }).join();
  EXPECT_EQ(registry->workers_not_destroyed(), 2);  // Released, not destroyed.
  registry->ResolveNow();
  EXPECT_EQ(registry->workers_not_destroyed(), 1);
}

// ---------------------------------------------------------------------------
// file: targets

// Replaces `path` as a deployment should: a new file renamed over the old.
void WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.flush()) << tmp;
  }
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0) << path;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ReadTargetFile, OneTargetPerLineWithCommentsAndBlanks) {
  const std::string path = ::tandem::testing::TempDir() + "/targets-ok";
  WriteAtomically(path,
                  "# the decode pool\n"
                  "10.0.0.1:8200\n"
                  "\n"
                  "  decode-1.tandem.svc:8200   # a name, resolved\n"
                  "\t[::1]:8201\r\n"
                  "10.0.0.1:8200\n"  // a duplicate
                  "10.0.0.2:8200");  // no final newline
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> targets, ReadTargetFile(path));
  EXPECT_THAT(targets, ElementsAre("10.0.0.1:8200", "decode-1.tandem.svc:8200", "[::1]:8201",
                                   "10.0.0.2:8200"));
  WriteAtomically(path, "# nothing yet\n\n");
  EXPECT_THAT(ReadTargetFile(path), ::tandem::testing::IsOkAndHolds(IsEmpty()));
}

TEST(ReadTargetFile, BadFilesAreErrorsThatSayWhy) {
  const std::string dir = ::tandem::testing::TempDir();
  EXPECT_THAT(ReadTargetFile(dir + "/no-such-file"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-file")));
  // A folder opens but cannot be read.
  EXPECT_THAT(ReadTargetFile(dir),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cannot read")));
  const std::string path = dir + "/targets-bad";
  WriteAtomically(path, "10.0.0.1:8200\n# fine\n10.0.0.2\n");
  EXPECT_THAT(ReadTargetFile(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr(path + " line 3: worker target '10.0.0.2' "
                                                              "is not host:port")));
  WriteAtomically(path, "file:/etc/other:8200\n");
  EXPECT_THAT(ReadTargetFile(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("line 1: a worker target file lists "
                                                       "host:port targets, not other files")));
}

TEST(ReadTargetFile, IsBoundedInBytesAndTargets) {
  const std::string path = ::tandem::testing::TempDir() + "/targets-big";
  std::string text;
  for (int i = 0; i < kMaxTargetFileTargets; ++i) {
    absl::StrAppend(&text, "10.1.", i / 256, ".", i % 256, ":8200\n");
  }
  WriteAtomically(path, text);
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> targets, ReadTargetFile(path));
  EXPECT_EQ(targets.size(), static_cast<size_t>(kMaxTargetFileTargets));
  WriteAtomically(path, text + "10.2.0.0:8200\n");
  EXPECT_THAT(ReadTargetFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than 4096 targets")));
  // Comments count against the bytes, not the targets.
  WriteAtomically(path, "10.0.0.1:8200 #" + std::string(kMaxTargetFileBytes, 'x') + "\n");
  EXPECT_THAT(ReadTargetFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is over 1048576 bytes")));
}

// A registry on one "file:" decode target whose names the test resolves;
// it resolves and polls only when the test says.
class FileTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::tandem::testing::TempDir() + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".targets";
    // A repetition (--gtest_repeat) finds the file the previous one wrote.
    std::remove(path_.c_str());
    target_ = "file:" + path_;
  }

  RegistryOptions Options() {
    RegistryOptions options;
    options.channels = GrpcWorkerChannels().value();
    options.channels = GrpcWorkerChannels().value();
    options.decode_targets = {target_};
    options.resolve_interval = absl::Hours(1);
    options.health_interval = absl::Hours(1);
    options.health_timeout = absl::Milliseconds(100);
    // "pod-N.svc:P" resolves to 10.0.0.N:P; addresses resolve to themselves.
    options.resolver = [](const std::string& target) -> absl::StatusOr<std::vector<std::string>> {
      if (absl::StartsWith(target, "pod-")) {
        return std::vector<std::string>{absl::StrCat(
            "10.0.0.", target.substr(4, target.find('.') - 4), target.substr(target.rfind(':')))};
      }
      return std::vector<std::string>{target};
    };
    return options;
  }

  std::vector<std::string> Addresses(const WorkerRegistry& registry) {
    std::vector<std::string> out;
    for (const WorkerSnapshot& s : registry.Snapshot(WorkerRole::kDecode)) out.push_back(s.address);
    return out;
  }

  std::string path_;
  std::string target_;
};

TEST_F(FileTargetTest, WorkersJoinAndLeaveAsLinesAreAddedAndRemoved) {
  WriteAtomically(path_, "pod-1.svc:8200\n");
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(Options()));
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200"));
  // The worker's target is its line (TLS checks the certificate against
  // its host), not the file.
  EXPECT_EQ(registry->Snapshot(WorkerRole::kDecode)[0].target, "pod-1.svc:8200");

  // Scale up: two lines added.
  WriteAtomically(path_, "pod-1.svc:8200\npod-2.svc:8200\n10.0.0.3:8200\n");
  std::shared_ptr<Worker> kept = registry->Find(WorkerRole::kDecode, "10.0.0.1:8200");
  registry->ResolveNow();
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200", "10.0.0.2:8200", "10.0.0.3:8200"));
  // A worker that stays is the same object (its load and stats are kept).
  EXPECT_EQ(registry->Find(WorkerRole::kDecode, "10.0.0.1:8200"), kept);

  // Scale down: a request still on the removed worker keeps it; new
  // requests cannot find it.
  std::shared_ptr<Worker> leaving = registry->Find(WorkerRole::kDecode, "10.0.0.2:8200");
  ASSERT_NE(leaving, nullptr);
  std::unique_ptr<Worker::Load> request = leaving->StartRequest();
  ::testing::internal::CaptureStderr();
  WriteAtomically(path_, "pod-1.svc:8200\n10.0.0.3:8200\n");
  registry->ResolveNow();
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("decode worker 10.0.0.2:8200 left the pool (pod-2.svc:8200 is no longer "
                        "listed)"));
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200", "10.0.0.3:8200"));
  EXPECT_EQ(registry->Find(WorkerRole::kDecode, "10.0.0.2:8200"), nullptr);
  EXPECT_EQ(leaving->Snapshot().inflight, 1);
  for (const WorkerSnapshot& s : registry->Snapshot(WorkerRole::kDecode)) {
    EXPECT_NE(s.address, "10.0.0.2:8200");
  }
  request.reset();
  EXPECT_EQ(leaving->Snapshot().inflight, 0);
}

TEST_F(FileTargetTest, AnUnreadableFileKeepsTheLastListAndIsLoggedOnce) {
  WriteAtomically(path_, "10.0.0.1:8200\n10.0.0.2:8200\n");
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(Options()));
  ASSERT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200", "10.0.0.2:8200"));

  ::testing::internal::CaptureStderr();
  std::filesystem::remove(path_);
  for (int i = 0; i < 5; ++i) registry->ResolveNow();
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200", "10.0.0.2:8200"));
  // A malformed file is refused as a whole, like a missing one.
  WriteAtomically(path_, "10.0.0.1:8200\n10.0.0.2\n");
  for (int i = 0; i < 5; ++i) registry->ResolveNow();
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200", "10.0.0.2:8200"));
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Count(log, "cannot open worker target file " + path_), 1) << log;
  EXPECT_EQ(Count(log, "line 2: worker target '10.0.0.2' is not host:port"), 1) << log;
  EXPECT_EQ(Count(log, "keeping the 2 targets it listed before"), 2) << log;

  // Readable again: its list applies at once.
  ::testing::internal::CaptureStderr();
  WriteAtomically(path_, "10.0.0.2:8200\n");
  registry->ResolveNow();
  registry->ResolveNow();
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Count(log, "worker target " + target_ + " is readable again"), 1) << log;
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.2:8200"));
}

TEST_F(FileTargetTest, ANameThatFailsToResolveKeepsItsWorkersAsWithDns) {
  auto options = Options();
  auto answer = std::make_shared<std::atomic<bool>>(true);
  options.resolver =
      [answer](const std::string& target) -> absl::StatusOr<std::vector<std::string>> {
    if (target == "decode.svc:8200" && !answer->load()) {
      return absl::UnavailableError("DNS timeout");
    }
    return std::vector<std::string>{target == "decode.svc:8200" ? "10.0.0.9:8200" : target};
  };
  WriteAtomically(path_, "decode.svc:8200\n10.0.0.1:8200\n");
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(options));
  ASSERT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200", "10.0.0.9:8200"));
  answer->store(false);
  registry->ResolveNow();
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200", "10.0.0.9:8200"));
  // Its line removed, the name's workers leave even though it fails.
  WriteAtomically(path_, "10.0.0.1:8200\n");
  registry->ResolveNow();
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200"));
}

TEST_F(FileTargetTest, FileAndPlainTargetsMixAndBothRolesReadFiles) {
  auto options = Options();
  const std::string prefill_path = path_ + ".prefill";
  options.prefill_targets = {"file:" + prefill_path};
  options.decode_targets = {target_, "10.0.0.7:8200"};
  WriteAtomically(prefill_path, "10.0.1.1:8100\n");
  WriteAtomically(path_, "10.0.0.7:8200\n10.0.0.1:8200\n");
  ASSERT_OK_AND_ASSIGN(auto registry, WorkerRegistry::Create(options));
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.1:8200", "10.0.0.7:8200"));
  ASSERT_EQ(registry->Snapshot(WorkerRole::kPrefill).size(), 1u);
  EXPECT_EQ(registry->Snapshot(WorkerRole::kPrefill)[0].address, "10.0.1.1:8100");
  // An empty file empties its part of the pool; the plain target stays.
  WriteAtomically(path_, "");
  WriteAtomically(prefill_path, "10.0.1.1:8100\n10.0.1.2:8100\n");
  registry->ResolveNow();
  EXPECT_THAT(Addresses(*registry), ElementsAre("10.0.0.7:8200"));
  EXPECT_EQ(registry->Snapshot(WorkerRole::kPrefill).size(), 2u);
}

TEST_F(FileTargetTest, AFileThatCannotBeReadAtStartIsAClearError) {
  EXPECT_THAT(WorkerRegistry::Create(Options()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat("worker target '", target_,
                                              "': cannot open worker target file"))));
  WriteAtomically(path_, "10.0.0.1\n");
  EXPECT_THAT(WorkerRegistry::Create(Options()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("line 1: worker target '10.0.0.1' is not host:port")));
  auto options = Options();
  options.decode_targets = {"file:"};
  EXPECT_THAT(WorkerRegistry::Create(options), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace tandem::router
