#include "common/metrics/metrics_server.h"

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/base/port_file.h"
#include "common/base/status_macros.h"
#include "prometheus/text_serializer.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (GET /metrics); port 0 picks a free one; "
          "empty = no metrics endpoint");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the bound metrics port here (one line) once it serves; empty = don't");

namespace tandem::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// A scrape is a GET with a few short headers and no body: anything much
// larger is not one.
constexpr uint32_t kMaxHeaderBytes = 8 << 10;
constexpr uint64_t kMaxBodyBytes = 4 << 10;
// How long a connection that is closing keeps reading (and dropping) what
// the client still sends, so that the client's kernel does not answer our
// close with a reset that loses the last response.
constexpr auto kLingerTime = std::chrono::seconds(1);
// The pause before accepting again after accept failed (out of descriptors).
constexpr auto kAcceptRetry = std::chrono::milliseconds(50);

constexpr char kTextFormat[] = "text/plain; version=0.0.4; charset=utf-8";

// An error of Beast's HTTP parser about what the client sent (not the
// client closing the connection before a whole request).
bool IsMalformed(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

// One client connection: reads a request, answers it, and reads the next
// while the client keeps the connection alive. Lives while an operation on
// it is pending; runs on the server's one io thread.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const prometheus::Registry* registry,
             std::chrono::steady_clock::duration timeout)
      : stream_(std::move(socket)), registry_(registry), timeout_(timeout) {}

  void ReadRequest() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(kMaxBodyBytes);
    stream_.expires_after(timeout_);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::header_limit) {
      Respond(http::status::request_header_fields_too_large, 11, /*keep_alive=*/false,
              absl::StrCat("the request header is over ", kMaxHeaderBytes, " bytes\n"));
      return;
    }
    if (ec == http::error::body_limit) {
      Respond(http::status::payload_too_large, 11, /*keep_alive=*/false,
              absl::StrCat("the request body is over ", kMaxBodyBytes, " bytes\n"));
      return;
    }
    if (ec) {
      if (IsMalformed(ec)) {
        Respond(http::status::bad_request, 11, /*keep_alive=*/false,
                absl::StrCat("malformed HTTP request: ", ec.message(), "\n"));
      } else {
        // The client closed (between requests or within one), timed out, or
        // the connection failed: nobody to answer.
        stream_.close();
      }
      return;
    }
    const http::request<http::string_body>& request = parser_->get();
    const beast::string_view target = request.target();
    if (target.substr(0, target.find('?')) != "/metrics") {
      Respond(http::status::not_found, request.version(), request.keep_alive(),
              "not found: metrics are served on GET /metrics\n");
    } else if (request.method() != http::verb::get) {
      Respond(http::status::method_not_allowed, request.version(), request.keep_alive(),
              "/metrics answers GET only\n");
    } else {
      Respond(http::status::ok, request.version(), request.keep_alive(),
              prometheus::TextSerializer().Serialize(registry_->Collect()));
    }
  }

  void Respond(http::status status, unsigned version, bool keep_alive, std::string body) {
    response_.emplace(status, version);
    response_->set(http::field::content_type,
                   status == http::status::ok ? kTextFormat : "text/plain; charset=utf-8");
    if (status == http::status::method_not_allowed) response_->set(http::field::allow, "GET");
    response_->keep_alive(keep_alive);
    response_->body() = std::move(body);
    response_->prepare_payload();
    stream_.expires_after(timeout_);
    http::async_write(
        stream_, *response_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    if (ec) {
      stream_.close();
      return;
    }
    const bool keep_alive = response_->keep_alive();
    response_.reset();
    if (keep_alive) {
      ReadRequest();
      return;
    }
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(kLingerTime);
    Drain();
  }

  // Reads until the client closes too (or kLingerTime passes).
  void Drain() {
    stream_.async_read_some(asio::buffer(drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) {
                                self->stream_.close();
                              } else {
                                self->Drain();
                              }
                            });
  }

  beast::tcp_stream stream_;
  const prometheus::Registry* const registry_;
  const std::chrono::steady_clock::duration timeout_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> response_;
  std::array<char, 512> drain_;
};

// INVALID_ARGUMENT unless `listen` is HOST:PORT or [V6]:PORT, port in
// [0, 65535].
absl::Status ParseListen(const std::string& listen, std::string* host, int* port) {
  absl::StatusOr<HostPort> hp = ParseHostPort(listen, "metrics address", /*min_port=*/0);
  if (!hp.ok()) return hp.status();
  *host = std::move(hp->host);
  *port = hp->port;
  return absl::OkStatus();
}

}  // namespace

// The acceptor and every connection run on one io_context, run by one
// std::thread: a thread with the default stack, whatever static TLS the
// process carries.
class MetricsServer::Impl {
 public:
  Impl(std::shared_ptr<prometheus::Registry> registry, std::chrono::steady_clock::duration timeout)
      : registry_(std::move(registry)), timeout_(timeout) {}

  // Stops the io thread. A connection lives in the handlers of its pending
  // operations; ioc_ destroys those handlers, closing the sockets.
  ~Impl() {
    if (!thread_.joinable()) return;
    asio::post(ioc_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      retry_timer_.cancel();
      ioc_.stop();
    });
    thread_.join();
  }

  // Binds `host`:`port` (`listen` names it in errors); the port bound.
  absl::StatusOr<int> Listen(const std::string& host, int port, const std::string& listen) {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    const auto endpoints = resolver.resolve(
        host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || endpoints.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics address '", listen, "': cannot resolve '", host, "': ", ec.message()));
    }
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", listen, ": ", ec.message()));
    }
    return acceptor_.local_endpoint().port();
  }

  void Run() {
    Accept();
    thread_ = std::thread([this] { ioc_.run(); });
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor_.is_open()) return;
      if (ec) {
        LOG(WARNING) << "metrics endpoint: accept failed: " << ec.message();
        retry_timer_.expires_after(kAcceptRetry);
        retry_timer_.async_wait([this](beast::error_code e) {
          if (!e) Accept();
        });
        return;
      }
      std::make_shared<Connection>(std::move(socket), registry_.get(), timeout_)->ReadRequest();
      Accept();
    });
  }

  // Outlives ioc_, and so every connection that reads it.
  const std::shared_ptr<prometheus::Registry> registry_;
  const std::chrono::steady_clock::duration timeout_;
  asio::io_context ioc_{1};
  tcp::acceptor acceptor_{ioc_};
  asio::steady_timer retry_timer_{ioc_};
  std::thread thread_;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
    MetricsServerOptions options) {
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(ParseListen(listen, &host, &port));
  if (registry == nullptr) return absl::InvalidArgumentError("metrics server without a registry");
  if (options.timeout <= absl::ZeroDuration() || options.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics connection timeout must be positive and finite, not ",
                     absl::FormatDuration(options.timeout)));
  }
  auto impl = std::make_unique<Impl>(
      std::move(registry), std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               absl::ToChronoNanoseconds(options.timeout)));
  ASSIGN_OR_RETURN(const int bound, impl->Listen(host, port, listen));
  impl->Run();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl), bound));
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerFromFlags(
    std::shared_ptr<prometheus::Registry> registry) {
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (listen.empty()) return std::unique_ptr<MetricsServer>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(listen, std::move(registry));
  if (!server.ok()) return server.status();
  if (const std::string path = absl::GetFlag(FLAGS_metrics_port_file); !path.empty()) {
    RETURN_IF_ERROR(WritePortFile(path, (*server)->port(), "metrics_port_file"));
  }
  LOG(INFO) << "serving Prometheus metrics on port " << (*server)->port() << " (GET /metrics)";
  return server;
}

}  // namespace tandem::metrics
