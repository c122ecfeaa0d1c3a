// The Beast HTTP server (router/http_server.h) over raw sockets: keep-alive,
// bodies and their absence, the limits and timeouts a slow or greedy client
// meets, many idle connections, disconnects, streaming, TLS and a graceful
// stop.
#include "common/http/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/router/http_test_client.h"

namespace tandem::http::testing {
namespace {

// The raw HTTP client the router's API tests share.
using ::tandem::router::testing::ClientTlsContext;
using ::tandem::router::testing::FreeTlsContext;
using ::tandem::router::testing::HttpResponse;
using ::tandem::router::testing::RawConnection;
using ::tandem::router::testing::Request;

using ::testing::HasSubstr;

// Requests to /hold wait here for the test to answer them.
class HeldExchanges {
 public:
  void Add(std::shared_ptr<HttpExchange> ex) {
    absl::MutexLock lock(&mu_);
    held_.push_back(std::move(ex));
  }
  std::shared_ptr<HttpExchange> Next(absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto some = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&some), timeout)) return nullptr;
    std::shared_ptr<HttpExchange> ex = held_.front();
    held_.pop_front();
    return ex;
  }

 private:
  absl::Mutex mu_;
  std::deque<std::shared_ptr<HttpExchange>> held_ ABSL_GUARDED_BY(mu_);
};

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions options = {}) {
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
        std::move(options), [this](std::shared_ptr<HttpExchange> ex) { Handle(std::move(ex)); });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void Handle(std::shared_ptr<HttpExchange> ex) {
    if (ex->path() == "/echo") {
      ex->Respond(200, {{"Content-Type", "text/plain"}},
                  absl::StrCat(ex->method(), " ", ex->target(), " [", ex->body(), "]"));
    } else if (ex->path() == "/stream") {
      ex->StartStream(200, {{"Content-Type", "text/plain"}});
      ex->Write("one,");
      ex->Write("two");
      ex->End();
    } else if (ex->path() == "/hold") {
      held_.Add(std::move(ex));
    } else {
      ex->Respond(404, {}, "no such path");
    }
  }

  std::unique_ptr<RawConnection> Connect(SSL_CTX* tls = nullptr) {
    absl::StatusOr<std::unique_ptr<RawConnection>> c = RawConnection::Connect(server_->port(), tls);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  HeldExchanges held_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, KeepAliveServesManyRequestsOnOneConnection) {
  Start();
  std::unique_ptr<RawConnection> c = Connect();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(c->Send(Request("POST", absl::StrCat("/echo?i=", i), absl::StrCat("body", i))));
    absl::StatusOr<HttpResponse> r = c->ReadResponse();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, absl::StrCat("POST /echo?i=", i, " [body", i, "]"));
    EXPECT_EQ(r->Header("Connection"), "keep-alive");
  }
  // Two requests in one write are answered in order.
  ASSERT_TRUE(c->Send(Request("GET", "/echo?a") + Request("GET", "/echo?b")));
  absl::StatusOr<HttpResponse> a = c->ReadResponse();
  absl::StatusOr<HttpResponse> b = c->ReadResponse();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->body, "GET /echo?a []");
  EXPECT_EQ(b->body, "GET /echo?b []");
}

TEST_F(HttpServerTest, PostWithoutBodyIsDispatchedAtOnce) {
  Start();
  std::unique_ptr<RawConnection> c = Connect();
  // Neither Content-Length nor chunked: the request has no body.
  ASSERT_TRUE(c->Send("POST /echo HTTP/1.1\r\nHost: x\r\n\r\n"));
  absl::StatusOr<HttpResponse> r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "POST /echo []");
  ASSERT_TRUE(c->Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"));
  r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "POST /echo []");
}

TEST_F(HttpServerTest, ChunkedRequestAndExpectContinue) {
  Start();
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"));
  absl::StatusOr<HttpResponse> r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "POST /echo [abc]");
  ASSERT_TRUE(
      c->Send("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
              "Content-Length: 2\r\n\r\n"));
  absl::StatusOr<HttpResponse> cont = c->ReadResponse();
  ASSERT_TRUE(cont.ok()) << cont.status();
  EXPECT_EQ(cont->status, 100);
  ASSERT_TRUE(c->Send("hi"));
  r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "POST /echo [hi]");
}

TEST_F(HttpServerTest, SlowHeaderIsCutOff) {
  Start({.header_timeout = absl::Milliseconds(200)});
  std::unique_ptr<RawConnection> c = Connect();
  // One byte, then nothing: the header never completes.
  ASSERT_TRUE(c->Send("P"));
  std::string received;
  ASSERT_TRUE(c->WaitClosed(absl::Seconds(20), &received));
  EXPECT_THAT(received, HasSubstr("408"));
  EXPECT_THAT(received, HasSubstr("header took too long"));
}

TEST_F(HttpServerTest, SlowBodyIsCutOff) {
  Start({.body_timeout = absl::Milliseconds(200)});
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab"));
  std::string received;
  ASSERT_TRUE(c->WaitClosed(absl::Seconds(20), &received));
  EXPECT_THAT(received, HasSubstr("408"));
  EXPECT_THAT(received, HasSubstr("body took too long"));
}

TEST_F(HttpServerTest, IdleConnectionIsClosed) {
  Start({.idle_timeout = absl::Milliseconds(200)});
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("GET", "/echo")));
  ASSERT_TRUE(c->ReadResponse().ok());
  std::string received;
  ASSERT_TRUE(c->WaitClosed(absl::Seconds(20), &received));
  EXPECT_EQ(received, "");
}

TEST_F(HttpServerTest, OversizedHeaderAndBodyAreRefused) {
  Start({.max_header_bytes = 1024, .max_body_bytes = 100});
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("GET", "/echo", "", {"X-Big: " + std::string(2000, 'a')})));
  absl::StatusOr<HttpResponse> r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 431);
  EXPECT_TRUE(c->WaitClosed(absl::Seconds(20)));

  c = Connect();
  ASSERT_TRUE(c->Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"));
  r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(r->body, HasSubstr("over 100 bytes"));
  EXPECT_TRUE(c->WaitClosed(absl::Seconds(20)));

  c = Connect();
  ASSERT_TRUE(c->Send("NOT HTTP\r\n\r\n"));
  r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400);
}

// Raises the open-file limit to what `connections` client and server
// sockets need (or skips).
bool EnoughFiles(int connections) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  const rlim_t need = static_cast<rlim_t>(connections) * 2 + 256;
  if (limit.rlim_cur < need) {
    limit.rlim_cur = std::min(need, limit.rlim_max);
    setrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur >= need;
}

TEST_F(HttpServerTest, HoldsManyIdleConnections) {
  // 10,000 idle keep-alive connections, or as many as the process's hard
  // open-file limit allows for both ends of each (at least 2,000).
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  int count = static_cast<int>(
      std::clamp<rlim_t>(limit.rlim_max > 256 ? (limit.rlim_max - 256) / 2 : 0, 2000, 10000));
  if (const char* env = std::getenv("TANDEM_HTTP_IDLE_CONNECTIONS")) {
    ASSERT_TRUE(absl::SimpleAtoi(env, &count));
  }
  if (count < 10000) std::cerr << "holding " << count << " idle connections (open-file limit)\n";
  if (!EnoughFiles(count)) GTEST_SKIP() << "not enough file descriptors for " << count;
  Start({.max_connections = count + 1});
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < count; ++i) {
    idle.push_back(Connect());
    ASSERT_NE(idle.back(), nullptr);
    ASSERT_TRUE(idle.back()->Send(Request("GET", "/echo")));
  }
  // Every one was answered, and every one stays open.
  for (auto& c : idle) {
    absl::StatusOr<HttpResponse> r = c->ReadResponse();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 200);
  }
  EXPECT_EQ(server_->connections(), count);
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("GET", "/echo?last")));
  absl::StatusOr<HttpResponse> r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "GET /echo?last []");
  // Over max_connections, a new connection is closed at once.
  std::unique_ptr<RawConnection> over = Connect();
  std::string received;
  EXPECT_TRUE(over->WaitClosed(absl::Seconds(20), &received));
  EXPECT_EQ(received, "");
  // The idle ones still work.
  ASSERT_TRUE(idle.front()->Send(Request("GET", "/echo?again")));
  r = idle.front()->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "GET /echo?again []");
}

TEST_F(HttpServerTest, ClientGoneIsNoticedWhileAnswering) {
  Start();
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("POST", "/hold", "{}")));
  std::shared_ptr<HttpExchange> ex = held_.Next();
  ASSERT_NE(ex, nullptr);
  absl::Notification gone;
  ex->OnClientGone([&gone] { gone.Notify(); });
  EXPECT_FALSE(ex->client_gone());
  c->Close();
  ASSERT_TRUE(gone.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(ex->client_gone());
  EXPECT_FALSE(ex->Write("late"));
  // A callback registered after the fact runs at once.
  bool late = false;
  ex->OnClientGone([&late] { late = true; });
  EXPECT_TRUE(late);
}

TEST_F(HttpServerTest, StreamsChunkedOrToCloseOnHttp10) {
  Start();
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("GET", "/stream")));
  absl::StatusOr<HttpResponse> r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->Header("Transfer-Encoding"), "chunked");
  EXPECT_EQ(r->body, "one,two");
  c = Connect();
  ASSERT_TRUE(c->Send("GET /stream HTTP/1.0\r\n\r\n"));
  r = c->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->Header("Connection"), "close");
  EXPECT_EQ(r->body, "one,two");
}

TEST_F(HttpServerTest, AClientThatDoesNotReadIsCutOff) {
  Start({.max_queued_bytes = 256 << 10});
  std::unique_ptr<RawConnection> c = Connect();
  ASSERT_TRUE(c->Send(Request("GET", "/hold")));
  std::shared_ptr<HttpExchange> ex = held_.Next();
  ASSERT_NE(ex, nullptr);
  ex->StartStream(200, {});
  // The client never reads: the queue stops growing at its bound and the
  // writer is told, long before the loop could end.
  const std::string piece(64 << 10, 'x');
  int written = 0;
  while (written < 100000 && ex->Write(piece)) ++written;
  EXPECT_LT(written, 100000);
}

TEST_F(HttpServerTest, GracefulStopLetsResponsesUnderWayEnd) {
  Start();
  std::unique_ptr<RawConnection> idle = Connect();
  ASSERT_TRUE(idle->Send(Request("GET", "/echo")));
  ASSERT_TRUE(idle->ReadResponse().ok());
  std::unique_ptr<RawConnection> busy = Connect();
  ASSERT_TRUE(busy->Send(Request("GET", "/hold")));
  std::shared_ptr<HttpExchange> ex = held_.Next();
  ASSERT_NE(ex, nullptr);
  std::thread stopper([this] { server_->Stop(absl::Seconds(60)); });
  // The idle connection closes at once; the busy one gets its answer.
  EXPECT_TRUE(idle->WaitClosed(absl::Seconds(30)));
  ex->Respond(200, {}, "late but whole");
  absl::StatusOr<HttpResponse> r = busy->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "late but whole");
  EXPECT_EQ(r->Header("Connection"), "close");
  EXPECT_TRUE(busy->WaitClosed(absl::Seconds(30)));
  stopper.join();
  EXPECT_EQ(server_->connections(), 0);
}

// A self-signed certificate for "localhost", made with the openssl CLI.
struct TestCert {
  std::string cert;
  std::string key;
};
std::optional<TestCert> MakeCert(const std::string& name) {
  const std::string dir = ::testing::TempDir();
  TestCert c{dir + "/" + name + "_cert.pem", dir + "/" + name + "_key.pem"};
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ",
      c.key, " -out ", c.cert, " >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) return std::nullopt;
  return c;
}

TEST_F(HttpServerTest, ServesTls) {
  std::optional<TestCert> cert = MakeCert("server");
  std::optional<TestCert> other = MakeCert("other");
  ASSERT_TRUE(cert.has_value() && other.has_value()) << "the openssl CLI failed";
  Start({.tls_cert_file = cert->cert, .tls_key_file = cert->key});
  EXPECT_TRUE(server_->tls());
  SSL_CTX* trusting = ClientTlsContext(cert->cert);
  ASSERT_NE(trusting, nullptr);
  {
    std::unique_ptr<RawConnection> c = Connect(trusting);
    ASSERT_NE(c, nullptr);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(c->Send(Request("POST", "/echo", "secret")));
      absl::StatusOr<HttpResponse> r = c->ReadResponse();
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->body, "POST /echo [secret]");
    }
    ASSERT_TRUE(c->Send(Request("GET", "/stream")));
    absl::StatusOr<HttpResponse> r = c->ReadResponse();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->body, "one,two");
  }
  FreeTlsContext(trusting);
  // A client that does not trust the certificate refuses the handshake.
  SSL_CTX* distrusting = ClientTlsContext(other->cert);
  ASSERT_NE(distrusting, nullptr);
  EXPECT_FALSE(RawConnection::Connect(server_->port(), distrusting).ok());
  FreeTlsContext(distrusting);
  // Plain HTTP to the TLS port gets no HTTP answer.
  std::unique_ptr<RawConnection> plain = Connect();
  ASSERT_TRUE(plain->Send(Request("GET", "/echo")));
  std::string received;
  EXPECT_TRUE(plain->WaitClosed(absl::Seconds(20), &received));
  EXPECT_FALSE(absl::StrContains(received, "200"));
}

TEST(HttpServerStartTest, BadOptionsAreRefused) {
  auto handler = [](std::shared_ptr<HttpExchange>) {};
  EXPECT_EQ(HttpServer::Start({.listen = "nope"}, handler).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start({.tls_cert_file = "a.pem"}, handler).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      HttpServer::Start({.tls_cert_file = "/nonexistent.pem", .tls_key_file = "/k.pem"}, handler)
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::unique_ptr<HttpServer>> first = HttpServer::Start({}, handler);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(HttpServer::Start({.listen = absl::StrCat("127.0.0.1:", (*first)->port())}, handler)
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::http::testing
