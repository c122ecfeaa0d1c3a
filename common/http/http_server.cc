// HttpServer: the listener (binding, TLS set-up, accepting connections
// within max_connections) and stopping; each connection is served by a
// StreamConnection (http_connection.cc).
#include "common/http/http_server.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/http/internal/http_server_impl.h"

namespace tandem::http {

absl::Status ParseListenAddress(const std::string& listen, std::string* host, int* port) {
  absl::StatusOr<HostPort> hp = ParseHostPort(listen, "HTTP listen address", /*min_port=*/0);
  if (!hp.ok()) return hp.status();
  *host = std::move(hp->host);
  *port = hp->port;
  return absl::OkStatus();
}

absl::Status HttpServer::Impl::Listen() {
  const HttpServerOptions& o = options_;
  if (o.io_threads < 1) return absl::InvalidArgumentError("io_threads must be >= 1");
  if (o.max_connections < 1) return absl::InvalidArgumentError("max_connections must be >= 1");
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key file");
  }
  if (!o.tls_cert_file.empty()) {
    tls_.emplace(ssl::context::tls_server);
    tls_->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                      ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                      ssl::context::single_dh_use);
    boost::system::error_code ec;
    tls_->use_certificate_chain_file(o.tls_cert_file, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot load the TLS certificate ", o.tls_cert_file, ": ", ec.message()));
    }
    tls_->use_private_key_file(o.tls_key_file, ssl::context::pem, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot load the TLS key ", o.tls_key_file, ": ", ec.message()));
    }
  }
  std::string host;
  int port = 0;
  if (absl::Status s = ParseListenAddress(o.listen, &host, &port); !s.ok()) return s;
  boost::system::error_code ec;
  tcp::resolver resolver(*ioc_);
  auto endpoints = resolver.resolve(host, std::to_string(port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve the host of ", o.listen, ": ", ec.message()));
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.listen, ": ", ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  return absl::OkStatus();
}

void HttpServer::Impl::Run() {
  asio::post(acceptor_.get_executor(), [this] { Accept(); });
  for (int i = 0; i < options_.io_threads; ++i) {
    threads_.emplace_back([this] { ioc_->run(); });
  }
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(asio::make_strand(*ioc_),
                         [this](const boost::system::error_code& ec, tcp::socket socket) {
                           OnAccept(ec, std::move(socket));
                         });
}

void HttpServer::Impl::OnAccept(const boost::system::error_code& ec, tcp::socket socket) {
  if (!acceptor_.is_open() || stopping()) return;
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    // Out of file descriptors and the like: try again shortly rather than
    // spinning.
    LOG(WARNING) << "HTTP accept failed: " << ec.message();
    retry_timer_.expires_after(std::chrono::milliseconds(50));
    retry_timer_.async_wait([this](const boost::system::error_code& e) {
      if (!e && !stopping()) Accept();
    });
    return;
  }
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (connections_.size() >= static_cast<size_t>(options_.max_connections)) {
      socket.close(ignored);
      Accept();
      return;
    }
    id = next_id_++;
  }
  auto start = [&](auto connection) {
    {
      absl::MutexLock lock(&mu_);
      connections_[id] = Entry{[weak = std::weak_ptr(connection)](bool force) {
        if (auto c = weak.lock()) c->PostShutdown(force);
      }};
    }
    connection->Start();
  };
  if (tls_.has_value()) {
    start(std::make_shared<StreamConnection<ssl::stream<tcp::socket>>>(
        this, id, ssl::stream<tcp::socket>(std::move(socket), *tls_)));
  } else {
    start(std::make_shared<StreamConnection<tcp::socket>>(this, id, std::move(socket)));
  }
  Accept();
}

void HttpServer::Impl::ShutdownAll(bool force) {
  std::vector<std::function<void(bool)>> shutdowns;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : connections_) shutdowns.push_back(entry.shutdown);
  }
  for (const auto& s : shutdowns) s(force);
}

void HttpServer::Impl::Stop(absl::Duration grace) {
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true, std::memory_order_release);
  asio::post(acceptor_.get_executor(), [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    retry_timer_.cancel();
  });
  ShutdownAll(/*force=*/false);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return connections_.empty(); };
  {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&none), grace) && grace > absl::ZeroDuration()) {
      LOG(WARNING) << connections_.size() << " HTTP connections still busy after " << grace
                   << "; closing them";
    }
  }
  ShutdownAll(/*force=*/true);
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&none), absl::Seconds(5));
  }
  work_.reset();
  ioc_->stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  // Handlers still queued hold their connections, which hold the
  // io_context: run what is ready here (every socket is closed) so that
  // none is left to keep it alive.
  ioc_->restart();
  ioc_->poll();
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(absl::ZeroDuration()); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpHandler handler) {
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  impl->Run();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port(); }
bool HttpServer::tls() const { return impl_->tls(); }
int HttpServer::connections() const { return impl_->connections(); }
void HttpServer::Stop(absl::Duration grace) { impl_->Stop(grace); }

}  // namespace tandem::http
