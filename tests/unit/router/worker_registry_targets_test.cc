// The worker registry's targets (router/worker_registry.h): resolving
// host:port targets, workers joining and leaving as a name resolves
// differently, and "file:" targets (reading the file, following its changes).
// Health polls and the pool's agreement are in worker_registry_test.cc.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/grpc_worker_channel.h"
#include "router/worker_registry.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem::router {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

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
  // The next resolve destroys it. The first poll round's last callback may
  // still hold it for a moment after Stop (a round ends inside its last
  // answer, whose closure holds that worker until gRPC drops it): a
  // worker that answers at once (here something listens at 10.0.0.x and
  // says 404) makes that window real.
  registry->ResolveNow();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (registry->workers_not_destroyed() != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    registry->ResolveNow();
  }
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
