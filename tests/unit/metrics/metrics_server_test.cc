// The /metrics HTTP server over raw requests: the text format and its
// content type, keep-alive, 404 and 405, the size bounds, a silent client's
// deadline, a stop with connections open, and a thread that starts whatever
// static TLS the process carries.
#include "common/metrics/metrics_server.h"

#include <pthread.h>

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using ::tandem::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::Eq;
using ::testing::HasSubstr;

// 128 KiB of static TLS in this binary, more than libcublasLt's 94 KiB:
// glibc carves it out of every thread's stack, so a thread created with a
// small fixed stack (CivetWeb's ~100 KiB, which prometheus-cpp's exposer
// used) fails with EINVAL, as it did in the workers once they linked cuBLAS.
// Every server in this binary starts under that pressure.
thread_local std::array<unsigned char, 128 << 10> static_tls_pressure;

// A connection to 127.0.0.1:port that writes raw bytes and reads
// responses; every operation gives up after 30 s rather than hang a test.
class Client {
 public:
  explicit Client(int port) : stream_(ioc_) {
    stream_.expires_after(kGuard);
    stream_.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port),
                          [this](beast::error_code ec) { ec_ = ec; });
    Run();
  }

  beast::error_code connect_error() const { return ec_; }

  beast::error_code Send(const std::string& bytes) {
    stream_.expires_after(kGuard);
    asio::async_write(stream_, asio::buffer(bytes),
                      [this](beast::error_code ec, size_t) { ec_ = ec; });
    Run();
    return ec_;
  }

  beast::error_code Read(http::response<http::string_body>* response) {
    stream_.expires_after(kGuard);
    http::async_read(stream_, buffer_, *response,
                     [this](beast::error_code ec, size_t) { ec_ = ec; });
    Run();
    return ec_;
  }

  // Sends one request and reads its response.
  http::response<http::string_body> Exchange(const std::string& request) {
    http::response<http::string_body> response;
    EXPECT_FALSE(Send(request));
    const beast::error_code ec = Read(&response);
    EXPECT_FALSE(ec) << ec.message();
    return response;
  }

  // Reads until the server closes the connection: the error that ends it
  // (eof for a close, timeout when the server never closes).
  beast::error_code WaitClosed() {
    stream_.expires_after(kGuard);
    std::array<char, 512> sink;
    beast::error_code result;
    std::function<void()> read = [&] {
      stream_.async_read_some(asio::buffer(sink), [&](beast::error_code ec, size_t) {
        if (ec) {
          result = ec;
        } else {
          read();
        }
      });
    };
    read();
    Run();
    return result;
  }

 private:
  static constexpr auto kGuard = std::chrono::seconds(30);

  void Run() {
    ioc_.restart();
    ioc_.run();
  }

  asio::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  beast::error_code ec_;
};

std::string Get(const std::string& target, const std::string& extra_headers = "") {
  return absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: metrics\r\n", extra_headers, "\r\n");
}

class MetricsServerHttpTest : public ::testing::Test {
 protected:
  void Start(MetricsServerOptions options = {}) {
    auto server = MetricsServer::Start("127.0.0.1:0", registry_, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Counter& scrapes_ = AddCounter(*registry_, "tandem_test_scrapes_total", "Scrapes");
  std::unique_ptr<MetricsServer> server_;
};

TEST_F(MetricsServerHttpTest, ServesTheTextFormatWithItsContentType) {
  scrapes_.Increment(2);
  Start();
  Client client(server_->port());
  ASSERT_FALSE(client.connect_error());
  const auto response = client.Exchange(Get("/metrics"));
  EXPECT_EQ(response.result(), http::status::ok);
  EXPECT_EQ(response[http::field::content_type], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(response.body(), HasSubstr("# TYPE tandem_test_scrapes_total counter\n"));
  EXPECT_THAT(response.body(), HasSubstr("\ntandem_test_scrapes_total 2\n"));
  // A query string does not change the path.
  EXPECT_EQ(client.Exchange(Get("/metrics?name=x")).result(), http::status::ok);
}

TEST_F(MetricsServerHttpTest, ScrapesTwiceOnOneKeepAliveConnection) {
  Start();
  Client client(server_->port());
  ASSERT_FALSE(client.connect_error());
  const auto first = client.Exchange(Get("/metrics"));
  EXPECT_EQ(first.result(), http::status::ok);
  EXPECT_TRUE(first.keep_alive());
  EXPECT_THAT(first.body(), HasSubstr("\ntandem_test_scrapes_total 0\n"));
  scrapes_.Increment();
  const auto second = client.Exchange(Get("/metrics"));
  EXPECT_EQ(second.result(), http::status::ok);
  EXPECT_THAT(second.body(), HasSubstr("\ntandem_test_scrapes_total 1\n"));
  // A client that asks to close gets its answer, then the close.
  const auto last = client.Exchange(Get("/metrics", "Connection: close\r\n"));
  EXPECT_EQ(last.result(), http::status::ok);
  EXPECT_FALSE(last.keep_alive());
  EXPECT_EQ(client.WaitClosed(), asio::error::eof);
}

TEST_F(MetricsServerHttpTest, AnswersOtherPaths404AndOtherMethods405) {
  Start();
  Client client(server_->port());
  ASSERT_FALSE(client.connect_error());
  EXPECT_EQ(client.Exchange(Get("/")).result(), http::status::not_found);
  EXPECT_EQ(client.Exchange(Get("/metrics/x")).result(), http::status::not_found);
  const auto post =
      client.Exchange("POST /metrics HTTP/1.1\r\nHost: metrics\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_EQ(post.result(), http::status::method_not_allowed);
  EXPECT_EQ(post[http::field::allow], "GET");
  // Both keep the connection: a scrape on it still works.
  EXPECT_EQ(client.Exchange(Get("/metrics")).result(), http::status::ok);
}

TEST_F(MetricsServerHttpTest, RefusesAHeaderOverTheBound) {
  Start();
  Client client(server_->port());
  ASSERT_FALSE(client.connect_error());
  const auto response =
      client.Exchange(Get("/metrics", absl::StrCat("X-Big: ", std::string(16 << 10, 'a'), "\r\n")));
  EXPECT_EQ(response.result(), http::status::request_header_fields_too_large);
  EXPECT_EQ(client.WaitClosed(), asio::error::eof);
}

TEST_F(MetricsServerHttpTest, RefusesABodyOverTheBound) {
  Start();
  Client client(server_->port());
  ASSERT_FALSE(client.connect_error());
  const std::string body(64 << 10, 'b');
  const auto response = client.Exchange(absl::StrCat(
      "GET /metrics HTTP/1.1\r\nHost: metrics\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
  EXPECT_EQ(response.result(), http::status::payload_too_large);
  EXPECT_EQ(client.WaitClosed(), asio::error::eof);
}

TEST_F(MetricsServerHttpTest, AnswersGarbage400) {
  Start();
  Client client(server_->port());
  ASSERT_FALSE(client.connect_error());
  EXPECT_EQ(client.Exchange("GET /metrics SMTP/2\r\n\r\n").result(), http::status::bad_request);
  EXPECT_EQ(client.WaitClosed(), asio::error::eof);
}

TEST_F(MetricsServerHttpTest, ClosesASilentConnectionAtItsDeadline) {
  Start({.timeout = absl::Milliseconds(200)});
  Client silent(server_->port());
  ASSERT_FALSE(silent.connect_error());
  Client half(server_->port());
  ASSERT_FALSE(half.connect_error());
  ASSERT_FALSE(half.Send("GET /metr"));
  // The client's own guard is 30 s: a server that never closes reads as
  // timeout here.
  EXPECT_EQ(silent.WaitClosed(), asio::error::eof);
  EXPECT_EQ(half.WaitClosed(), asio::error::eof);
  Client next(server_->port());
  EXPECT_EQ(next.Exchange(Get("/metrics")).result(), http::status::ok);
}

TEST_F(MetricsServerHttpTest, StopsWithConnectionsOpen) {
  Start();
  Client idle(server_->port());
  ASSERT_FALSE(idle.connect_error());
  EXPECT_EQ(idle.Exchange(Get("/metrics")).result(), http::status::ok);
  Client half(server_->port());
  ASSERT_FALSE(half.connect_error());
  ASSERT_FALSE(half.Send("GET /metr"));
  server_.reset();  // must return, not wait for the clients
  EXPECT_EQ(idle.WaitClosed(), asio::error::eof);
  // A socket closed with unread bytes may end in a reset instead.
  EXPECT_THAT(half.WaitClosed(), AnyOf(Eq(asio::error::eof), Eq(asio::error::connection_reset)));
}

TEST_F(MetricsServerHttpTest, StartsUnderLargeStaticTls) {
  // The pressure is real in this binary: a thread with CivetWeb's stack
  // size cannot be created.
  static_tls_pressure[static_tls_pressure.size() - 1] = 7;
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 100 << 10), 0);
  pthread_t thread;
  const int created = pthread_create(
      &thread, &attr, [](void*) -> void* { return nullptr; }, nullptr);
  if (created == 0) pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_EQ(created, EINVAL);
  EXPECT_EQ(static_tls_pressure[static_tls_pressure.size() - 1], 7);
  // Our server's thread has the default stack: it starts and serves.
  Start();
  Client client(server_->port());
  ASSERT_FALSE(client.connect_error());
  EXPECT_EQ(client.Exchange(Get("/metrics")).result(), http::status::ok);
}

TEST(MetricsServerOptionsTest, RefusesATimeoutThatIsNotPositiveAndFinite) {
  auto registry = std::make_shared<prometheus::Registry>();
  EXPECT_THAT(
      MetricsServer::Start("127.0.0.1:0", registry, {.timeout = absl::ZeroDuration()}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
  EXPECT_THAT(
      MetricsServer::Start("127.0.0.1:0", registry, {.timeout = absl::InfiniteDuration()}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
  EXPECT_THAT(MetricsServer::Start("127.0.0.1:0", nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("registry")));
}

}  // namespace
}  // namespace tandem::metrics
