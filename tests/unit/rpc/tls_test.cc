// TLS and mutual TLS between a real in-process server and real channels,
// with certificates made by the openssl CLI; and the start-up errors for
// missing, malformed or mismatched PEM files.
#include "common/rpc/tls.h"

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/health_client.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tls_files.h"

namespace tandem::rpc {
namespace {

using ::tandem::testing::CheckHealth;
using ::tandem::testing::ServingStatus;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto files = ::tandem::testing::MakeTlsFiles(::tandem::testing::TempDir() + "/tls");
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = new ::tandem::testing::TlsFiles(*files);
  }
  static void TearDownTestSuite() {
    delete files_;
    files_ = nullptr;
  }

  void TearDown() override {
    if (server_.server != nullptr)
      server_.server->Shutdown(ToChrono(absl::Now() + absl::Seconds(5)));
  }

  // A server on 127.0.0.1 with the test CA's "localhost" certificate; with
  // `mutual`, clients must present a certificate the test CA signed.
  void StartTlsServer(bool mutual) {
    ServerOptions options;
    options.tls.cert_file = files_->server_cert;
    options.tls.key_file = files_->server_key;
    if (mutual) {
      options.tls.ca_file = files_->ca_cert;
      options.tls.require_client_cert = true;
    }
    auto running = StartServer(options, {&service_});
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(running).value();
  }

  std::string Target() const { return absl::StrCat("127.0.0.1:", server_.port); }

  absl::StatusOr<ServingStatus> Check(const TlsConfig& client) {
    absl::StatusOr<ChannelSecurity> security = MakeChannelSecurity(client);
    if (!security.ok()) return security.status();
    return CheckHealth(MakeChannel(Target(), *security), "");
  }

  TlsConfig TrustingClient() const {
    TlsConfig c;
    c.ca_file = files_->ca_cert;
    return c;
  }

  static ::tandem::testing::TlsFiles* files_;
  v1::PrefillWorker::CallbackService service_;
  RunningServer server_;
};

::tandem::testing::TlsFiles* TlsTest::files_ = nullptr;

TEST_F(TlsTest, TlsClientReachesTlsServer) {
  StartTlsServer(/*mutual=*/false);
  EXPECT_THAT(Check(TrustingClient()), ::tandem::testing::IsOkAndHolds(ServingStatus::kServing));
}

TEST_F(TlsTest, PlainClientIsRefusedByTlsServer) {
  StartTlsServer(/*mutual=*/false);
  EXPECT_THAT(Check(TlsConfig{}), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, ClientRefusesServerCertificateFromAnotherCa) {
  StartTlsServer(/*mutual=*/false);
  TlsConfig client;
  client.ca_file = files_->unknown_ca_cert;
  EXPECT_THAT(Check(client), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, TargetNameOverrideIsWhatTheServerCertificateMustName) {
  StartTlsServer(/*mutual=*/false);
  TlsConfig client = TrustingClient();
  client.target_name_override = "localhost";
  EXPECT_THAT(Check(client), ::tandem::testing::IsOkAndHolds(ServingStatus::kServing));
  client.target_name_override = "elsewhere.example";
  EXPECT_THAT(Check(client), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, MutualTlsAcceptsClientCertificateOfTheCa) {
  StartTlsServer(/*mutual=*/true);
  TlsConfig client = TrustingClient();
  client.cert_file = files_->client_cert;
  client.key_file = files_->client_key;
  EXPECT_THAT(Check(client), ::tandem::testing::IsOkAndHolds(ServingStatus::kServing));
}

TEST_F(TlsTest, MutualTlsRefusesClientWithoutCertificate) {
  StartTlsServer(/*mutual=*/true);
  EXPECT_THAT(Check(TrustingClient()), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, MutualTlsRefusesClientCertificateOfUnknownCa) {
  StartTlsServer(/*mutual=*/true);
  TlsConfig client = TrustingClient();
  client.cert_file = files_->unknown_client_cert;
  client.key_file = files_->unknown_client_key;
  EXPECT_THAT(Check(client), StatusIs(absl::StatusCode::kUnavailable));
}

// --- Start-up errors: each names the flag and the file.

TEST_F(TlsTest, MissingFileIsNotFoundNamingFlagAndFile) {
  ServerOptions options;
  options.tls.cert_file = ::tandem::testing::TempDir() + "/absent.pem";
  options.tls.key_file = files_->server_key;
  EXPECT_THAT(StartServer(options, {&service_}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("--tls_cert"), HasSubstr("absent.pem"))));
}

TEST_F(TlsTest, FileWithoutPemCertificateIsInvalid) {
  const std::string junk = ::tandem::testing::TempDir() + "/junk.pem";
  std::ofstream(junk) << "not a certificate\n";
  TlsConfig config;
  config.ca_file = junk;
  config.flags = WorkerClientTlsFlags();
  EXPECT_THAT(MakeChannelSecurity(config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--worker_tls_ca"), HasSubstr("junk.pem"),
                             HasSubstr("no valid PEM certificate"))));
}

TEST_F(TlsTest, TruncatedCertificateIsInvalid) {
  std::ifstream in(files_->server_cert);
  std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = ::tandem::testing::TempDir() + "/cut.pem";
  std::ofstream(cut) << pem.substr(0, pem.size() / 2) << "\n-----END CERTIFICATE-----\n";
  TlsConfig config;
  config.cert_file = cut;
  config.key_file = files_->server_key;
  EXPECT_THAT(MakeServerCredentials(config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--tls_cert"), HasSubstr("cut.pem"))));
}

TEST_F(TlsTest, KeyOfAnotherCertificateIsInvalid) {
  TlsConfig config;
  config.cert_file = files_->server_cert;
  config.key_file = files_->client_key;
  EXPECT_THAT(MakeServerCredentials(config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("does not belong"), HasSubstr("client.key"))));
}

TEST_F(TlsTest, CertificateIsNotAKey) {
  TlsConfig config;
  config.cert_file = files_->server_cert;
  config.key_file = files_->server_cert;
  EXPECT_THAT(
      MakeServerCredentials(config),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("--tls_key"), HasSubstr("no valid unencrypted PEM private key"))));
}

TEST_F(TlsTest, IncompleteServerConfigurationsAreInvalid) {
  TlsConfig cert_only;
  cert_only.cert_file = files_->server_cert;
  EXPECT_THAT(MakeServerCredentials(cert_only),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("go together")));
  TlsConfig ca_only;
  ca_only.ca_file = files_->ca_cert;
  EXPECT_THAT(MakeServerCredentials(ca_only),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs the server's own certificate")));
  TlsConfig require_without_ca;
  require_without_ca.cert_file = files_->server_cert;
  require_without_ca.key_file = files_->server_key;
  require_without_ca.require_client_cert = true;
  EXPECT_THAT(MakeServerCredentials(require_without_ca),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls_client_ca")));
}

}  // namespace
}  // namespace tandem::rpc
