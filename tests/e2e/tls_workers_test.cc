// Real tandem-prefill and tandem-decode processes serving gRPC over mutual
// TLS, with certificates made by the openssl CLI: a client with a
// certificate of the cluster's CA reaches GetStats and health by service
// name, and so does the router's WorkerRegistry given the certificate; a
// client with no certificate, one from an unknown CA, or plain gRPC is
// refused. Also: a worker with a bad PEM file fails at start-up naming
// the flag, and the workers' KV data plane (UCX) listens on loopback only
// by default.
#include <dirent.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "common/rpc/tls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/grpc_worker_channel.h"
#include "router/worker_registry.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/child_process.h"
#include "tests/testing/health_client.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tls_files.h"

namespace tandem::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Worker {
  std::unique_ptr<Child> process;
  std::string log;
  std::string address;  // 127.0.0.1:port
};

// Starts `binary` with `flags` on 127.0.0.1 and waits (bounded) for its port.
absl::StatusOr<Worker> StartWorker(const std::string& dir, const std::string& name,
                                   const std::string& binary, std::vector<std::string> flags) {
  Worker w;
  const std::string port_file = absl::StrCat(dir, "/", name, ".port");
  w.log = absl::StrCat(dir, "/", name, ".log");
  flags.insert(flags.begin(), binary);
  flags.push_back("--listen=127.0.0.1:0");
  flags.push_back("--port_file=" + port_file);
  w.process = std::make_unique<Child>(flags, w.log);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    const std::string port = ReadFile(port_file);
    if (!port.empty() && port.back() == '\n') {
      w.address = absl::StrCat("127.0.0.1:", port.substr(0, port.size() - 1));
      return w;
    }
    if (w.process->Wait(absl::ZeroDuration()) != -1) {
      return absl::InternalError(absl::StrCat(name, " exited during start-up:\n", ReadFile(w.log)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(name, " did not start within 60 s:\n", ReadFile(w.log)));
}

// The local addresses ("127.0.0.1", "::1", "192.0.2.2", ...) of every TCP
// socket process `pid` listens on, from /proc.
std::set<std::string> ListeningAddresses(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  for (const auto& entry : std::filesystem::directory_iterator(fd_dir)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::set<std::string> addresses;
  for (const char* table : {"tcp", "tcp6"}) {
    std::istringstream lines(ReadFile(absl::StrCat("/proc/", pid, "/net/", table)));
    std::string line;
    std::getline(lines, line);  // header
    while (std::getline(lines, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      if (f.size() < 10 || f[3] != "0A" || !inodes.contains(f[9])) continue;
      const std::string hex = f[1].substr(0, f[1].find(':'));
      if (hex == "0100007F") {
        addresses.insert("127.0.0.1");
      } else if (hex == "00000000000000000000000001000000") {
        addresses.insert("::1");
      } else if (hex == "0000000000000000FFFF00000100007F") {
        addresses.insert("::ffff:127.0.0.1");
      } else {
        addresses.insert(hex);  // anything else, as /proc writes it
      }
    }
  }
  return addresses;
}

class TlsWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = ModelFile("stories260K.bin");
    if (model_.empty()) {
      if (ModelsRequired()) FAIL() << "fixture stories260K.bin missing and TANDEM_REQUIRE_MODELS=1";
      GTEST_SKIP() << "fixture stories260K.bin not found; set TANDEM_MODELS";
    }
    dir_ = TempDir();
    absl::StatusOr<TlsFiles> files = MakeTlsFiles(dir_ + "/tls");
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *files;
  }

  std::vector<std::string> MutualTlsFlags() const {
    return {"--model=" + model_, "--threads=1", "--tls_cert=" + files_.server_cert,
            "--tls_key=" + files_.server_key, "--tls_client_ca=" + files_.ca_cert};
  }

  void StartWorkers() {
    absl::StatusOr<Worker> prefill =
        StartWorker(dir_, "prefill", TANDEM_PREFILL_BIN, MutualTlsFlags());
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    prefill_ = std::move(*prefill);
    absl::StatusOr<Worker> decode =
        StartWorker(dir_, "decode", TANDEM_DECODE_BIN, MutualTlsFlags());
    ASSERT_TRUE(decode.ok()) << decode.status();
    decode_ = std::move(*decode);
  }

  // The router's side: its --worker_tls_* flags as a TlsConfig.
  rpc::TlsConfig RouterTls(const std::string& cert, const std::string& key) const {
    rpc::TlsConfig c;
    c.flags = rpc::WorkerClientTlsFlags();
    c.ca_file = files_.ca_cert;
    c.cert_file = cert;
    c.key_file = key;
    return c;
  }

  static std::shared_ptr<grpc::Channel> Channel(const Worker& w, const rpc::TlsConfig& tls) {
    absl::StatusOr<rpc::ChannelSecurity> security = rpc::MakeChannelSecurity(tls);
    EXPECT_TRUE(security.ok()) << security.status();
    return rpc::MakeChannel(w.address, security.ok() ? *security : rpc::ChannelSecurity{});
  }

  static absl::Status PrefillStats(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(20)));
    v1::WorkerStats stats;
    return rpc::FromGrpc(
        v1::PrefillWorker::NewStub(channel)->GetStats(&ctx, v1::StatsRequest(), &stats));
  }
  static absl::Status DecodeStats(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext ctx;
    ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(20)));
    v1::WorkerStats stats;
    return rpc::FromGrpc(
        v1::DecodeWorker::NewStub(channel)->GetStats(&ctx, v1::StatsRequest(), &stats));
  }

  std::string model_;
  std::string dir_;
  TlsFiles files_;
  Worker prefill_;
  Worker decode_;
};

TEST_F(TlsWorkersTest, ClientWithTheClusterCertificateReachesBothWorkers) {
  StartWorkers();
  const rpc::TlsConfig tls = RouterTls(files_.client_cert, files_.client_key);
  EXPECT_OK(PrefillStats(Channel(prefill_, tls))) << ReadFile(prefill_.log);
  EXPECT_OK(DecodeStats(Channel(decode_, tls))) << ReadFile(decode_.log);
  EXPECT_THAT(CheckHealth(Channel(prefill_, tls), "tandem.v1.PrefillWorker"),
              IsOkAndHolds(ServingStatus::kServing));
  EXPECT_THAT(CheckHealth(Channel(decode_, tls), "tandem.v1.DecodeWorker"),
              IsOkAndHolds(ServingStatus::kServing));
}

TEST_F(TlsWorkersTest, ClientsWithoutAValidCertificateAreRefused) {
  StartWorkers();
  const rpc::TlsConfig no_cert = RouterTls("", "");
  const rpc::TlsConfig unknown = RouterTls(files_.unknown_client_cert, files_.unknown_client_key);
  for (const Worker* w : {&prefill_, &decode_}) {
    const bool is_prefill = w == &prefill_;
    auto stats = [&](const rpc::TlsConfig& tls) {
      return is_prefill ? PrefillStats(Channel(*w, tls)) : DecodeStats(Channel(*w, tls));
    };
    EXPECT_THAT(stats(no_cert), StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_THAT(stats(unknown), StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_THAT(stats(rpc::TlsConfig{}), StatusIs(absl::StatusCode::kUnavailable));
  }
  // The workers are still up for clients that may call.
  EXPECT_OK(DecodeStats(Channel(decode_, RouterTls(files_.client_cert, files_.client_key))));
}

// The router's registry, its decode target `host`:port resolved to the
// decode worker's 127.0.0.1 address, with `tls` on its channels.
absl::StatusOr<std::unique_ptr<router::WorkerRegistry>> DecodeRegistry(const std::string& host,
                                                                       const Worker& decode,
                                                                       const rpc::TlsConfig& tls) {
  const std::string port = decode.address.substr(decode.address.rfind(':') + 1);
  router::RegistryOptions options;
  options.decode_targets = {absl::StrCat(host, ":", port)};
  options.resolver = [address = decode.address](const std::string&) {
    return absl::StatusOr<std::vector<std::string>>(std::vector<std::string>{address});
  };
  options.health_timeout = absl::Seconds(10);
  absl::StatusOr<router::WorkerChannelFactory> channels = router::GrpcWorkerChannels(tls);
  if (!channels.ok()) return channels.status();
  options.channels = *std::move(channels);
  return router::WorkerRegistry::Create(std::move(options));
}

bool DecodeHealthy(router::WorkerRegistry& registry) {
  registry.PollNow();
  const std::vector<router::WorkerSnapshot> workers =
      registry.Snapshot(router::WorkerRole::kDecode);
  return workers.size() == 1 && workers[0].healthy;
}

TEST_F(TlsWorkersTest, RegistryWithTheClusterCertificateReachesTheDecodeWorker) {
  StartWorkers();
  auto registry =
      DecodeRegistry("localhost", decode_, RouterTls(files_.client_cert, files_.client_key));
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_TRUE((*registry)->WaitForRoutable(router::WorkerRole::kDecode, absl::Seconds(60)))
      << ReadFile(decode_.log);
}

TEST_F(TlsWorkersTest, RegistryWithoutAValidCertificateCannotPollTheDecodeWorker) {
  StartWorkers();
  for (const rpc::TlsConfig& tls :
       {RouterTls("", ""), RouterTls(files_.unknown_client_cert, files_.unknown_client_key)}) {
    auto registry = DecodeRegistry("localhost", decode_, tls);
    ASSERT_TRUE(registry.ok()) << registry.status();
    EXPECT_FALSE(DecodeHealthy(**registry));
  }
}

// The worker's certificate is checked against the name the router was
// given for it, not the address that name resolved to.
TEST_F(TlsWorkersTest, RegistryChecksTheCertificateAgainstTheTargetName) {
  StartWorkers();
  auto registry = DecodeRegistry("decode.cluster.invalid", decode_,
                                 RouterTls(files_.client_cert, files_.client_key));
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_FALSE(DecodeHealthy(**registry));
}

TEST_F(TlsWorkersTest, RegistryRefusesToStartWithABadCertificateFile) {
  rpc::TlsConfig tls = RouterTls(files_.client_cert, files_.server_key);
  EXPECT_THAT(DecodeRegistry("localhost", decode_, tls),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--worker_tls_key"), HasSubstr("does not belong"))));
}

TEST_F(TlsWorkersTest, KvDataPlaneListensOnLoopbackOnlyByDefault) {
  StartWorkers();
  for (const Worker* w : {&prefill_, &decode_}) {
    const std::set<std::string> addresses = ListeningAddresses(w->process->pid());
    EXPECT_FALSE(addresses.empty());
    for (const std::string& a : addresses) {
      EXPECT_TRUE(a == "127.0.0.1" || a == "::1" || a == "::ffff:127.0.0.1")
          << "a worker listens on " << a << " (as /proc/net/tcp writes it)";
    }
  }
}

TEST_F(TlsWorkersTest, UnreadableCertificateIsAStartUpErrorNamingTheFlag) {
  const std::string log = dir_ + "/bad.log";
  Child bad({TANDEM_DECODE_BIN, "--model=" + model_, "--threads=1", "--listen=127.0.0.1:0",
             "--tls_cert=" + dir_ + "/missing.pem", "--tls_key=" + files_.server_key},
            log);
  EXPECT_NE(bad.Wait(absl::Seconds(60)), 0);
  EXPECT_THAT(ReadFile(log), HasSubstr("--tls_cert file '" + dir_ + "/missing.pem'"));
}

}  // namespace
}  // namespace tandem::testing
