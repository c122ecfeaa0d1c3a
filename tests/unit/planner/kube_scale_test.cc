// The planner's Kubernetes apply path (planner/kube_scale.h) against an API
// server faked in the test: the requests it makes (path, verb, content
// type, token, body) and what each refusal tells the operator.
#include "planner/kube_scale.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem::planner {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kScalePath[] = "/apis/apps/v1/namespaces/serving/deployments/tandem-decode/scale";

// Holds one Deployment's replicas; answers 403 for any other path in the
// namespace, as RBAC limited to resourceNames does, and 401 without the
// token.
class FakeApiServer {
 public:
  FakeApiServer() {
    auto scale = [this](int replicas) {
      return nlohmann::json{{"kind", "Scale"},
                            {"apiVersion", "autoscaling/v1"},
                            {"spec", {{"replicas", replicas}}},
                            {"status", {{"replicas", replicas}}}}
          .dump();
    };
    auto authorised = [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      last_authorization_ = req.get_header_value("Authorization");
      if (last_authorization_ != "Bearer token-1") {
        res.status = 401;
        res.set_content(R"({"kind":"Status","message":"Unauthorized"})", "application/json");
        return false;
      }
      if (req.path != kScalePath) {
        res.status = 403;
        res.set_content(R"({"kind":"Status","message":"deployments.apps \"other\" is forbidden"})",
                        "application/json");
        return false;
      }
      return true;
    };
    server_.Get(".*", [=, this](const httplib::Request& req, httplib::Response& res) {
      if (!authorised(req, res)) return;
      std::lock_guard<std::mutex> lock(mu_);
      res.set_content(scale(replicas_), "application/json");
    });
    server_.Patch(".*", [=, this](const httplib::Request& req, httplib::Response& res) {
      if (!authorised(req, res)) return;
      std::lock_guard<std::mutex> lock(mu_);
      last_content_type_ = req.get_header_value("Content-Type");
      last_patch_ = req.body;
      const nlohmann::json patch = nlohmann::json::parse(req.body, nullptr, false);
      if (last_content_type_ != "application/merge-patch+json" || !patch.is_object()) {
        res.status = 415;
        return;
      }
      replicas_ = patch["spec"]["replicas"].get<int>();
      res.set_content(scale(replicas_), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() only works once the loop runs; the bound only stops a hang.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!server_.is_running() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~FakeApiServer() {
    server_.stop();
    thread_.join();
  }
  KubeApi Api(const std::string& token_file) const {
    return {.server = "http://127.0.0.1:" + std::to_string(port_),
            .kube_namespace = "serving",
            .token_file = token_file};
  }
  int replicas() {
    std::lock_guard<std::mutex> lock(mu_);
    return replicas_;
  }
  std::string last_patch() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_patch_;
  }
  std::string last_content_type() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_content_type_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  int replicas_ = 2;
  std::string last_authorization_, last_patch_, last_content_type_;
};

// ctest runs tests two at a time: each writes under its own directory, or
// one would rewrite a token file while another reads it.
std::string ScratchPath(const std::string& name) {
  return ::tandem::testing::TempDir() + "/" + name;
}

std::string WriteToken(const std::string& token) {
  const std::string path = ScratchPath("kube-token-" + token);
  std::ofstream(path) << token << "\n";  // as the kubelet writes it
  return path;
}

TEST(DeploymentScaler, ReadsAndPatchesTheScaleSubresource) {
  FakeApiServer api;
  const DeploymentScaler scaler(api.Api(WriteToken("token-1")));
  ASSERT_OK_AND_ASSIGN(const int replicas, scaler.Replicas("tandem-decode"));
  EXPECT_EQ(replicas, 2);
  ASSERT_OK(scaler.Scale("tandem-decode", 5));
  EXPECT_EQ(api.replicas(), 5);
  EXPECT_EQ(api.last_content_type(), "application/merge-patch+json");
  EXPECT_EQ(nlohmann::json::parse(api.last_patch()), (nlohmann::json{{"spec", {{"replicas", 5}}}}));
  EXPECT_THAT(scaler.Replicas("tandem-decode"), ::tandem::testing::IsOkAndHolds(5));
}

TEST(DeploymentScaler, SaysWhatEachRefusalMeans) {
  FakeApiServer api;
  const DeploymentScaler scaler(api.Api(WriteToken("token-1")));
  EXPECT_THAT(scaler.Scale("other", 1),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("patch deployments/other/scale in namespace serving"),
                             HasSubstr("Role"), HasSubstr("forbidden"))));
  EXPECT_THAT(DeploymentScaler(api.Api(WriteToken("token-2"))).Replicas("tandem-decode"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("refused the token")));
  EXPECT_THAT(DeploymentScaler(api.Api("/nonexistent/token")).Scale("tandem-decode", 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/nonexistent/token")));
  EXPECT_THAT(scaler.Scale("tandem-decode", -1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(api.replicas(), 2);
}

// The token is read for every call: the kubelet rotates projected tokens
// while the pod runs.
TEST(DeploymentScaler, ReadsTheTokenAgainForEveryCall) {
  FakeApiServer api;
  const std::string path = ScratchPath("kube-token-rotated");
  std::ofstream(path) << "token-0\n";
  const DeploymentScaler scaler(api.Api(path));
  EXPECT_THAT(scaler.Replicas("tandem-decode"), StatusIs(absl::StatusCode::kUnauthenticated));
  std::ofstream(path) << "token-1\n";
  EXPECT_THAT(scaler.Replicas("tandem-decode"), ::tandem::testing::IsOkAndHolds(2));
}

TEST(DeploymentScaler, AnApiServerThatDoesNotAnswerIsUnavailable) {
  // A port bound and not listening refuses connections for as long as the
  // socket is held.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const KubeApi gone{.server = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)),
                     .kube_namespace = "serving",
                     .timeout = absl::Seconds(5)};
  EXPECT_THAT(DeploymentScaler(gone).Replicas("tandem-decode"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("did not answer")));
  close(fd);
}

TEST(ServerUrl, TakesHexIpv6AddressesAndDefaultPorts) {
  ASSERT_OK_AND_ASSIGN(ServerUrl v6, ParseServerUrl("https://[fd00:10:96::1]:6443"));
  EXPECT_TRUE(v6.tls);
  EXPECT_EQ(v6.host, "fd00:10:96::1");
  EXPECT_EQ(v6.port, 6443);
  ASSERT_OK_AND_ASSIGN(ServerUrl proxy, ParseServerUrl("http://127.0.0.1:8001/"));
  EXPECT_FALSE(proxy.tls);
  EXPECT_EQ(proxy.host, "127.0.0.1");
  EXPECT_EQ(proxy.port, 8001);
  ASSERT_OK_AND_ASSIGN(ServerUrl plain, ParseServerUrl("https://kubernetes.default.svc"));
  EXPECT_EQ(plain.port, 443);
  for (const char* bad : {"kubernetes.default.svc", "ftp://host", "https://host:0",
                          "https://host:x", "https://host/api", "https://[fd00::1", "https://"}) {
    EXPECT_THAT(ParseServerUrl(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(InClusterApi, ReadsThePodsServiceAccount) {
  const std::string dir = ScratchPath("serviceaccount");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/namespace") << "serving";
  setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  ASSERT_OK_AND_ASSIGN(const KubeApi api, InClusterApi(dir));
  EXPECT_EQ(api.server, "https://[fd00:10:96::1]:443");
  EXPECT_OK(ParseServerUrl(api.server).status());
  EXPECT_EQ(api.kube_namespace, "serving");
  EXPECT_EQ(api.token_file, dir + "/token");
  EXPECT_EQ(api.ca_file, dir + "/ca.crt");
  EXPECT_THAT(InClusterApi(dir + "/missing"), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                       HasSubstr("automountServiceAccountToken")));
  unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_THAT(InClusterApi(dir), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("KUBERNETES_SERVICE_HOST")));
}

}  // namespace
}  // namespace tandem::planner
