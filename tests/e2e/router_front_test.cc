// The router's front ends with real binaries (one tandem-prefill and one
// tandem-decode on loopback): API keys on gRPC and HTTP, TLS on both
// listeners, mutual TLS from the router to its workers, gRPC and HTTP health
// following the decode pool, disconnected HTTP clients freeing every KV
// block, client-controlled limits, and tandem-cli's --api_key and --tls_ca.
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "common/rpc/tls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_harness.h"
#include "tests/testing/child_process.h"
#include "tests/testing/health_client.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tls_files.h"
#include "tests/unit/router/http_test_client.h"

namespace tandem::testing {
namespace {

using ::nlohmann::json;
using ::tandem::router::testing::ClientTlsContext;
using ::tandem::router::testing::FreeTlsContext;
using ::tandem::router::testing::HttpResponse;
using ::tandem::router::testing::RawConnection;
using ::tandem::router::testing::Request;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kRouterService[] = "tandem.v1.Router";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A client TLS context, freed with the object.
class TlsContext {
 public:
  explicit TlsContext(const std::string& ca_file) : ctx_(ClientTlsContext(ca_file)) {}
  ~TlsContext() { FreeTlsContext(ctx_); }
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  SSL_CTX* get() const { return ctx_; }

 private:
  SSL_CTX* ctx_;
};

// One request on a fresh connection (plain, or TLS with `tls`), and its
// whole response.
absl::StatusOr<HttpResponse> Http(int port, const std::string& method, const std::string& target,
                                  const std::string& body = "",
                                  const std::vector<std::string>& headers = {},
                                  SSL_CTX* tls = nullptr) {
  absl::StatusOr<std::unique_ptr<RawConnection>> c = RawConnection::Connect(port, tls);
  if (!c.ok()) return c.status();
  std::vector<std::string> all = headers;
  if (method == "POST") all.push_back("Content-Type: application/json");
  if (!(*c)->Send(Request(method, target, body, all))) {
    return absl::UnavailableError("the request could not be sent");
  }
  return (*c)->ReadResponse();
}

// A Generate call to the end with `authorization` as its metadata ("" =
// none).
Completion Call(v1::Router::Stub& router, const v1::GenerateRequest& request,
                const std::string& authorization) {
  Completion c;
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(60)));
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = router.Generate(&ctx, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    c.tokens.insert(c.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    c.text += response.text();
  }
  c.status = reader->Finish();
  return c;
}

// A channel to `address` over TLS, trusting `ca_file`.
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& ca_file) {
  rpc::TlsConfig tls;
  tls.ca_file = ca_file;
  absl::StatusOr<rpc::ChannelSecurity> security = rpc::MakeChannelSecurity(tls);
  EXPECT_TRUE(security.ok()) << security.status();
  return rpc::MakeChannel(address, security.ok() ? *security : rpc::ChannelSecurity{});
}

// Polls `probe` every 50 ms until it holds, for at most `timeout`.
template <typename Probe>
bool Eventually(Probe probe, absl::Duration timeout = absl::Seconds(60)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!probe()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs tandem-cli generate with `args`, bounded by 60 s.
CliRun RunCli(const std::string& dir, const std::string& args) {
  const std::string out = dir + "/cli.out", err = dir + "/cli.err";
  const std::string command =
      absl::StrCat("timeout 60 ", TANDEM_CLI_BIN, " generate ", args, " >", out, " 2>", err);
  const int status = std::system(command.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

constexpr char kCompletion[] = R"({"prompt": "Once upon a time", "max_tokens": 8})";

// Tests on stories260K skip without the fixtures (fail with
// TANDEM_REQUIRE_MODELS=1).
#define REQUIRE_FIXTURES()                                                                     \
  if (model_.empty() || tokenizer_.empty()) {                                                  \
    if (ModelsRequired()) {                                                                    \
      FAIL() << "fixtures stories260K.bin and tok512.bin missing and TANDEM_REQUIRE_MODELS=1"; \
    }                                                                                          \
    GTEST_SKIP() << "fixtures stories260K.bin and tok512.bin not found; set TANDEM_MODELS";    \
  }

class RouterFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = ModelFile("stories260K.bin");
    tokenizer_ = ModelFile("tok512.bin");
    dir_ = TempDir();
  }

  void MakeTls() {
    absl::StatusOr<TlsFiles> files = MakeTlsFiles(dir_ + "/tls");
    ASSERT_TRUE(files.ok()) << files.status();
    tls_ = *files;
  }

  void StartCluster(ClusterOptions options) {
    options.prefill = 1;
    options.decode = 1;
    if (options.model.empty()) options.model = model_;
    if (options.tokenizer.empty()) options.tokenizer = tokenizer_;
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  std::string model_, tokenizer_, dir_;
  TlsFiles tls_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(RouterFrontTest, ApiKeysAreRequiredOnGrpcAndHttp) {
  REQUIRE_FIXTURES();
  ASSERT_NO_FATAL_FAILURE(StartCluster({.router_flags = {"--api_key=k1,k2"}, .http = true}));
  v1::Router::Stub& router = cluster_->router();
  const v1::GenerateRequest request = TextRequest("Once upon a time", 8);

  const Completion none = Call(router, request, "");
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << none.status.error_message();
  const Completion wrong = Call(router, request, "Bearer not-a-key-7f3a");
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(wrong.status.error_message(), Not(HasSubstr("not-a-key-7f3a")));
  EXPECT_TRUE(wrong.tokens.empty());
  const Completion right = Call(router, request, "Bearer k2");
  ASSERT_TRUE(right.status.ok()) << right.status.error_message() << "\n" << cluster_->Logs();
  EXPECT_FALSE(right.tokens.empty());
  // Health checks need no key.
  EXPECT_THAT(CheckHealth(rpc::MakeChannel(cluster_->router_member().address), kRouterService),
              IsOkAndHolds(ServingStatus::kServing));

  const int port = cluster_->http_port();
  absl::StatusOr<HttpResponse> r = Http(port, "POST", "/v1/completions", kCompletion);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 401) << r->body;
  r = Http(port, "POST", "/v1/completions", kCompletion, {"Authorization: Bearer not-a-key-7f3a"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 401) << r->body;
  EXPECT_THAT(r->body, Not(HasSubstr("not-a-key-7f3a")));
  r = Http(port, "POST", "/v1/completions", kCompletion, {"Authorization: Bearer k1"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  const json body = json::parse(r->body);
  EXPECT_FALSE(body["choices"][0]["text"].get<std::string>().empty()) << r->body;
  r = Http(port, "GET", "/health");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << r->body;
}

// The TLS router of the next two tests: both listeners on the test CA's
// certificate, and an API key.
ClusterOptions TlsRouter(const TlsFiles& tls) {
  return {.router_flags = {"--tls_cert=" + tls.server_cert, "--tls_key=" + tls.server_key,
                           "--api_key=k1"},
          .http = true};
}

TEST_F(RouterFrontTest, TlsListenersServeOnlyClientsThatTrustTheCa) {
  REQUIRE_FIXTURES();
  ASSERT_NO_FATAL_FAILURE(MakeTls());
  ASSERT_NO_FATAL_FAILURE(StartCluster(TlsRouter(tls_)));
  const std::string address = cluster_->router_member().address;

  auto trusting = v1::Router::NewStub(TlsChannel(address, tls_.ca_cert));
  const Completion ok = Call(*trusting, TextRequest("Once upon a time", 8), "Bearer k1");
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message() << "\n" << cluster_->Logs();
  EXPECT_FALSE(ok.tokens.empty());
  auto distrusting = v1::Router::NewStub(TlsChannel(address, tls_.unknown_ca_cert));
  EXPECT_EQ(Call(*distrusting, TextRequest("Once", 4), "Bearer k1").status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
  auto plain = v1::Router::NewStub(rpc::MakeChannel(address));
  EXPECT_EQ(Call(*plain, TextRequest("Once", 4), "Bearer k1").status.error_code(),
            grpc::StatusCode::UNAVAILABLE);

  const int port = cluster_->http_port();
  TlsContext trusting_tls(tls_.ca_cert);
  ASSERT_NE(trusting_tls.get(), nullptr);
  absl::StatusOr<HttpResponse> r = Http(port, "POST", "/v1/completions", kCompletion,
                                        {"Authorization: Bearer k1"}, trusting_tls.get());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << r->body;
  TlsContext distrusting_tls(tls_.unknown_ca_cert);
  ASSERT_NE(distrusting_tls.get(), nullptr);
  EXPECT_FALSE(RawConnection::Connect(port, distrusting_tls.get()).ok());
  // Plain HTTP to the TLS port gets no HTTP answer.
  absl::StatusOr<std::unique_ptr<RawConnection>> c = RawConnection::Connect(port);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Send(Request("GET", "/health")));
  std::string received;
  EXPECT_TRUE((*c)->WaitClosed(absl::Seconds(30), &received));
  EXPECT_THAT(received, Not(HasSubstr("HTTP/1.1")));
}

TEST_F(RouterFrontTest, CliPresentsItsKeyOverTls) {
  REQUIRE_FIXTURES();
  ASSERT_NO_FATAL_FAILURE(MakeTls());
  ASSERT_NO_FATAL_FAILURE(StartCluster(TlsRouter(tls_)));
  const std::string common = absl::StrCat("--router ", cluster_->router_member().address,
                                          " --prompt 'Once upon a time' --max_tokens 8");
  const std::string trust = " --tls_ca " + tls_.ca_cert;

  CliRun run = RunCli(dir_, common + trust + " --api_key k1");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_FALSE(run.out.empty()) << run.err;
  EXPECT_THAT(run.err, HasSubstr("[tandem-cli] finish"));

  run = RunCli(dir_, common + trust);
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_THAT(run.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_TRUE(run.out.empty()) << run.out;

  run = RunCli(dir_, common + " --tls_ca " + tls_.unknown_ca_cert + " --api_key k1");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_THAT(run.err, HasSubstr("UNAVAILABLE"));

  run = RunCli(dir_, common + " --tls_ca " + dir_ + "/missing.pem --api_key k1");
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr("--tls_ca"));
}

TEST_F(RouterFrontTest, MutualTlsToTheWorkers) {
  REQUIRE_FIXTURES();
  ASSERT_NO_FATAL_FAILURE(MakeTls());
  const std::vector<std::string> worker_tls = {"--tls_cert=" + tls_.server_cert,
                                               "--tls_key=" + tls_.server_key,
                                               "--tls_client_ca=" + tls_.ca_cert};
  ASSERT_NO_FATAL_FAILURE(StartCluster(
      {.router_flags = {"--worker_tls_ca=" + tls_.ca_cert, "--worker_tls_cert=" + tls_.client_cert,
                        "--worker_tls_key=" + tls_.client_key},
       .prefill_flags = worker_tls,
       .decode_flags = worker_tls}));
  const Completion c = Call(cluster_->router(), TextRequest("Once upon a time", 8), "");
  ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
  EXPECT_FALSE(c.tokens.empty());

  // A router that trusts the workers but has no client certificate never
  // finds a routable decode worker, and says so at start-up.
  const std::string log = dir_ + "/no-cert-router.log";
  Child router(
      {TANDEM_ROUTER_BIN, "--tokenizer=" + tokenizer_,
       "--prefill_workers=" + cluster_->prefill(0).address,
       "--decode_workers=" + cluster_->decode(0).address, "--worker_tls_ca=" + tls_.ca_cert,
       "--listen=127.0.0.1:0", "--health_interval=100ms", "--startup_timeout=2s"},
      log);
  EXPECT_EQ(router.Wait(absl::Seconds(60)), 1) << ReadFile(log);
  EXPECT_THAT(ReadFile(log), HasSubstr("became healthy within --startup_timeout=2s"));
}

TEST_F(RouterFrontTest, HealthFollowsTheDecodePool) {
  REQUIRE_FIXTURES();
  ASSERT_NO_FATAL_FAILURE(
      StartCluster({.router_flags = {"--health_interval=100ms"}, .http = true}));
  const std::shared_ptr<grpc::Channel> channel =
      rpc::MakeChannel(cluster_->router_member().address);
  const int port = cluster_->http_port();
  auto health = [&](ServingStatus want_grpc, int want_http) {
    absl::StatusOr<ServingStatus> s = CheckHealth(channel, kRouterService);
    absl::StatusOr<HttpResponse> r = Http(port, "GET", "/health");
    return s.ok() && *s == want_grpc && r.ok() && r->status == want_http;
  };
  EXPECT_TRUE(health(ServingStatus::kServing, 200)) << cluster_->Logs();

  cluster_->decode(0).process->Kill();
  EXPECT_TRUE(Eventually([&] { return health(ServingStatus::kNotServing, 503); }))
      << cluster_->Logs();

  ASSERT_TRUE(cluster_->Restart(cluster_->decode(0)).ok()) << cluster_->Logs();
  EXPECT_TRUE(Eventually([&] { return health(ServingStatus::kServing, 200); })) << cluster_->Logs();
  const Completion c = Call(cluster_->router(), TextRequest("Once upon a time", 8), "");
  ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
  EXPECT_FALSE(c.tokens.empty());
}

// Lines of the router's request log whose status is `status`.
int LoggedWithStatus(const std::string& path, const std::string& status) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("status", "") == status) ++n;
  }
  return n;
}

TEST_F(RouterFrontTest, HttpClientsThatGoAwayFreeEveryKvBlock) {
  // A model with a long context (random weights, so no fixtures needed)
  // keeps a request generating for seconds, long after its client has gone.
  const ModelConfig shape{.dim = 288,
                          .hidden_dim = 768,
                          .n_layers = 6,
                          .n_heads = 6,
                          .n_kv_heads = 6,
                          .vocab_size = 512,
                          .seq_len = 2048};
  auto files = WriteSyntheticModel(shape, 7, "long");
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string& model = files->model;
  const std::string& tokenizer = files->tokenizer;
  const std::string request_log = dir_ + "/requests.jsonl";
  ASSERT_NO_FATAL_FAILURE(StartCluster({.model = model,
                                        .tokenizer = tokenizer,
                                        .router_flags = {"--request_log=" + request_log},
                                        .http = true}));
  const int port = cluster_->http_port();
  const std::string long_request =
      R"({"prompt": "a long story", "max_tokens": 2000, "ignore_eos": true)";

  // Streamed: the client closes after the first chunk.
  {
    absl::StatusOr<std::unique_ptr<RawConnection>> c = RawConnection::Connect(port);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Send(Request("POST", "/v1/completions", long_request + R"(, "stream": true})",
                                   {"Content-Type: application/json"})));
    absl::StatusOr<std::string> first = (*c)->ReadUntil("data: ");
    ASSERT_TRUE(first.ok()) << first.status() << "\n" << cluster_->Logs();
    EXPECT_THAT(*first, HasSubstr("200"));
    (*c)->Close();
  }
  ASSERT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(60)).ok()) << cluster_->Logs();

  // Not streamed: the client closes while the decode worker runs it.
  {
    absl::StatusOr<std::unique_ptr<RawConnection>> c = RawConnection::Connect(port);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Send(Request("POST", "/v1/completions", long_request + "}",
                                   {"Content-Type: application/json"})));
    const bool running = Eventually([&] {
      absl::StatusOr<v1::WorkerStats> s = cluster_->Stats(cluster_->decode(0));
      return s.ok() && s->running() > 0;
    });
    ASSERT_TRUE(running) << cluster_->Logs();
    (*c)->Close();
  }
  absl::Status idle = cluster_->WaitUntilIdle(absl::Seconds(60));
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster_->Logs();

  // Both were cancelled, not generated to the end.
  EXPECT_TRUE(Eventually([&] { return LoggedWithStatus(request_log, "cancelled") == 2; }))
      << ReadFile(request_log);
  EXPECT_EQ(LoggedWithStatus(request_log, "ok"), 0) << ReadFile(request_log);
}

TEST_F(RouterFrontTest, ClientLimitsAreRefusedNamingTheField) {
  REQUIRE_FIXTURES();
  ASSERT_NO_FATAL_FAILURE(StartCluster({.http = true}));
  const int port = cluster_->http_port();
  auto post = [&](const json& body) {
    absl::StatusOr<HttpResponse> r = Http(port, "POST", "/v1/completions", body.dump());
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return HttpResponse{};
    }
    return *r;
  };
  const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 8}};

  json body = base;
  body["max_tokens"] = std::numeric_limits<int32_t>::max();
  HttpResponse r = post(body);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("maximum context length is 512 tokens"));
  EXPECT_THAT(r.body, HasSubstr("2147483647 to generate"));

  v1::GenerateRequest request =
      TextRequest("Once upon a time", std::numeric_limits<int32_t>::max());
  Completion c = Call(cluster_->router(), request, "");
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(c.status.error_message(), HasSubstr("maximum context length is 512 tokens"));
  EXPECT_THAT(c.status.error_message(), HasSubstr("2147483647 to generate"));

  body = base;
  body["n"] = 17;
  r = post(body);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("`n` is 17"));

  body = base;
  body["logprobs"] = 21;
  r = post(body);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("`logprobs` is 21"));

  body = base;
  body["stop"] = json::array();
  for (int i = 0; i < 17; ++i) body["stop"].push_back(absl::StrCat("stop", i));
  r = post(body);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("`stop` has 17 strings"));

  body = base;
  body["logit_bias"] = json::object();
  for (int i = 0; i < 1025; ++i) body["logit_bias"][std::to_string(i)] = 1;
  r = post(body);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("`logit_bias` has 1025 entries"));

  // The same bounds on gRPC.
  request = TextRequest("Once upon a time", 8);
  request.set_n(17);
  c = Call(cluster_->router(), request, "");
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(c.status.error_message(), HasSubstr("n is 17"));
  request = TextRequest("Once upon a time", 8);
  request.set_logprobs(21);
  c = Call(cluster_->router(), request, "");
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(c.status.error_message(), HasSubstr("logprobs is 21"));
  request = TextRequest("Once upon a time", 8);
  for (int i = 0; i < 17; ++i) request.add_stop(absl::StrCat("stop", i));
  c = Call(cluster_->router(), request, "");
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(c.status.error_message(), HasSubstr("17 stop strings"));
  request = TextRequest("Once upon a time", 8);
  for (int i = 0; i < 1025; ++i) (*request.mutable_sampling()->mutable_logit_bias())[i] = 1;
  c = Call(cluster_->router(), request, "");
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(c.status.error_message(), HasSubstr("logit_bias has 1025 entries"));

  // The router still serves after all that.
  c = Call(cluster_->router(), TextRequest("Once upon a time", 8), "");
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
}

}  // namespace
}  // namespace tandem::testing
