#include "common/http/http_server.h"

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <exception>
#include <limits>
#include <optional>
#include <thread>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"

namespace tandem::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

// One piece of a response, handed from an exchange to its connection.
struct ResponsePiece {
  enum class Kind { kWhole, kHead, kChunk, kEnd };
  Kind kind = Kind::kChunk;
  int status = 200;
  std::vector<HttpHeader> headers;
  std::string data;
  // Bytes of `data` counted in the exchange's queue.
  size_t counted = 0;
};

// What an exchange sees of its connection. Thread-safe: each call posts
// to the connection's strand.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  explicit Connection(size_t max_queued_bytes) : max_queued_bytes_(max_queued_bytes) {}
  virtual ~Connection() = default;
  virtual void Post(ResponsePiece piece) = 0;
  // The client fell too far behind: closed as if it went away.
  virtual void PostAbort() = 0;
  size_t max_queued_bytes() const { return max_queued_bytes_; }

 private:
  const size_t max_queued_bytes_;
};

namespace {

// Bytes read per socket read (and held per connection for it).
constexpr size_t kReadChunk = 8 << 10;
// Response pieces gathered into one socket write.
constexpr size_t kMaxGather = 64;
// How long a closing connection keeps reading (and dropping) what the
// client still sends, so that its last response is not lost to a reset.
constexpr auto kLingerTime = std::chrono::seconds(1);

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return std::chrono::hours(24 * 365);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      absl::ToChronoNanoseconds(d));
}

absl::string_view Reason(int status) {
  const beast::string_view r =
      http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return absl::string_view(r.data(), r.size());
}

bool SafeHeaderText(absl::string_view s) {
  return std::none_of(s.begin(), s.end(), [](char c) { return c == '\r' || c == '\n' || c == 0; });
}

std::string ErrorBody(absl::string_view message, absl::string_view type, absl::string_view code) {
  return absl::StrCat(R"({"error": {"message": ")", message, R"(", "type": ")", type,
                      R"(", "code": ")", code, R"("}})");
}

}  // namespace

// --- HttpExchange ----------------------------------------------------------

HttpExchange::HttpExchange(std::shared_ptr<Connection> connection, std::string method,
                           std::string target, std::vector<HttpHeader> headers, std::string body,
                           bool http11)
    : method_(std::move(method)),
      target_(std::move(target)),
      headers_(std::move(headers)),
      body_(std::move(body)),
      http11_(http11),
      connection_(std::move(connection)) {}

HttpExchange::~HttpExchange() {
  // A handler that let go of the exchange without finishing its response
  // must not leave the client waiting.
  std::shared_ptr<Connection> c;
  {
    absl::MutexLock lock(&mu_);
    c = std::move(connection_);
  }
  if (c != nullptr) c->PostAbort();
}

absl::string_view HttpExchange::path() const {
  absl::string_view t = target_;
  return t.substr(0, t.find('?'));
}

absl::string_view HttpExchange::Header(absl::string_view name) const {
  for (const HttpHeader& h : headers_) {
    if (absl::EqualsIgnoreCase(h.name, name)) return h.value;
  }
  return {};
}

std::shared_ptr<Connection> HttpExchange::TakeOrGetConnection(bool take) {
  absl::MutexLock lock(&mu_);
  if (take) return std::move(connection_);
  return connection_;
}

void HttpExchange::Respond(int status, std::vector<HttpHeader> headers, std::string body) {
  std::shared_ptr<Connection> c = TakeOrGetConnection(/*take=*/true);
  if (c == nullptr) return;
  c->Post({ResponsePiece::Kind::kWhole, status, std::move(headers), std::move(body), 0});
}

void HttpExchange::StartStream(int status, std::vector<HttpHeader> headers) {
  std::shared_ptr<Connection> c = TakeOrGetConnection(/*take=*/false);
  if (c == nullptr) return;
  c->Post({ResponsePiece::Kind::kHead, status, std::move(headers), "", 0});
}

bool HttpExchange::Write(std::string data) {
  if (client_gone()) return false;
  std::shared_ptr<Connection> c = TakeOrGetConnection(/*take=*/false);
  if (c == nullptr) return false;
  const size_t n = data.size();
  if (queued_.fetch_add(n, std::memory_order_relaxed) + n > c->max_queued_bytes()) {
    queued_.fetch_sub(n, std::memory_order_relaxed);
    c->PostAbort();
    return false;
  }
  c->Post({ResponsePiece::Kind::kChunk, 0, {}, std::move(data), n});
  return true;
}

void HttpExchange::End() {
  std::shared_ptr<Connection> c = TakeOrGetConnection(/*take=*/true);
  if (c == nullptr) return;
  c->Post({ResponsePiece::Kind::kEnd, 0, {}, "", 0});
}

void HttpExchange::OnClientGone(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!gone_.load(std::memory_order_acquire)) {
      on_gone_ = std::move(fn);
      return;
    }
  }
  fn();
}

void HttpExchange::MarkGone() {
  std::function<void()> fn;
  {
    absl::MutexLock lock(&mu_);
    gone_.store(true, std::memory_order_release);
    connection_.reset();
    fn = std::move(on_gone_);
    on_gone_ = nullptr;
  }
  if (fn) fn();
}

void HttpExchange::Detach() {
  absl::MutexLock lock(&mu_);
  connection_.reset();
}

// --- the server ------------------------------------------------------------

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        acceptor_(asio::make_strand(ioc_)),
        retry_timer_(acceptor_.get_executor()),
        work_(asio::make_work_guard(ioc_)) {}

  absl::Status Listen();
  void Run();
  void Stop(absl::Duration grace);

  const HttpServerOptions& options() const { return options_; }
  const HttpHandler& handler() const { return handler_; }
  int port() const { return port_; }
  bool tls() const { return tls_.has_value(); }
  int connections() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(connections_.size());
  }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  void Unregister(uint64_t id) {
    absl::MutexLock lock(&mu_);
    connections_.erase(id);
  }

 private:
  struct Entry {
    std::function<void(bool force)> shutdown;  // PostShutdown, while alive
  };
  void Accept();
  void OnAccept(const boost::system::error_code& ec, tcp::socket socket);
  // Closes idle connections (all of them when `force`).
  void ShutdownAll(bool force);

  const HttpServerOptions options_;
  const HttpHandler handler_;
  asio::io_context ioc_;
  std::optional<ssl::context> tls_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;  // Stop() ran (only Stop touches it).

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> connections_ ABSL_GUARDED_BY(mu_);
};

// One connection over `Stream` (a TCP socket or a TLS stream over one).
// Everything below runs on the socket's strand.
template <class Stream>
class StreamConnection final : public Connection {
 public:
  StreamConnection(HttpServer::Impl* server, uint64_t id, Stream stream)
      : Connection(server->options().max_queued_bytes),
        server_(server),
        id_(id),
        stream_(std::move(stream)),
        timer_(stream_.get_executor()) {}

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = Self()] { self->Begin(); });
  }

  void Post(ResponsePiece piece) override {
    asio::post(stream_.get_executor(), [self = Self(), piece = std::move(piece)]() mutable {
      self->OnPiece(std::move(piece));
    });
  }

  void PostAbort() override {
    asio::post(stream_.get_executor(), [self = Self()] { self->ClientGone(); });
  }

  // Server stop: idle connections close at once, a response under way ends
  // first (then the connection closes); `force` closes it regardless.
  void PostShutdown(bool force) {
    asio::post(stream_.get_executor(), [self = Self(), force] {
      if (force || self->phase_ != Phase::kHandling) {
        self->ClientGone();
      }
    });
  }

 private:
  enum class Phase {
    kHandshake,  // TLS handshake
    kIdle,       // waiting for a request's first byte
    kHeader,     // reading a request's header
    kBody,       // reading its body
    kHandling,   // the handler answers; reads only watch for a close
    kClosing,    // writing a last response, then closing
    kDraining,   // sent all, reading what still comes until EOF or linger
    kClosed,
  };
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  std::shared_ptr<StreamConnection> Self() {
    return std::static_pointer_cast<StreamConnection>(shared_from_this());
  }
  tcp::socket& Socket() { return beast::get_lowest_layer(stream_); }
  const HttpServerOptions& options() const { return server_->options(); }

  void Begin() {
    if constexpr (kTls) {
      phase_ = Phase::kHandshake;
      SetDeadline(ToChrono(options().header_timeout));
      stream_.async_handshake(ssl::stream_base::server,
                              [self = Self()](const boost::system::error_code& ec) {
                                if (self->phase_ == Phase::kClosed) return;
                                if (ec) {
                                  self->Close();
                                  return;
                                }
                                self->EnterIdle();
                              });
    } else {
      EnterIdle();
    }
  }

  // --- deadlines: one timer, one phase at a time ---
  void SetDeadline(std::chrono::steady_clock::duration d) {
    const uint64_t generation = ++deadline_generation_;
    timer_.expires_after(d);
    timer_.async_wait([self = Self(), generation](const boost::system::error_code& ec) {
      if (ec || generation != self->deadline_generation_ || self->phase_ == Phase::kClosed) return;
      self->OnDeadline();
    });
  }
  void ClearDeadline() {
    ++deadline_generation_;
    timer_.cancel();
  }
  void OnDeadline() {
    switch (phase_) {
      case Phase::kHeader:
      case Phase::kBody:
        RespondAndClose(408, ErrorBody(absl::StrCat("the request ",
                                                    phase_ == Phase::kHeader ? "header" : "body",
                                                    " took too long to arrive"),
                                       "invalid_request_error", "request_timeout"));
        return;
      case Phase::kHandling:  // a write made no progress
        ClientGone();
        return;
      default:
        Close();
        return;
    }
  }

  // --- reading ---
  void EnterIdle() {
    phase_ = Phase::kIdle;
    SetDeadline(ToChrono(options().idle_timeout));
    Process();
    MaybeRead();
  }

  void MaybeRead() {
    if (reading_ || phase_ == Phase::kClosed || phase_ == Phase::kHandshake) return;
    // While answering, what a client pipelines waits in the buffer, up to a
    // bound; reading stops there (a close is then noticed by a write).
    if (phase_ == Phase::kHandling && buffer_.size() >= options().max_header_bytes + kReadChunk) {
      return;
    }
    reading_ = true;
    stream_.async_read_some(
        asio::buffer(read_chunk_),
        [self = Self()](const boost::system::error_code& ec, size_t n) { self->OnRead(ec, n); });
  }

  void OnRead(const boost::system::error_code& ec, size_t n) {
    reading_ = false;
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      ClientGone();
      return;
    }
    // read_chunk_ is a buffer of its own: buffer_ may be consumed while a
    // read is outstanding, which would move the region it writes to.
    buffer_.commit(asio::buffer_copy(buffer_.prepare(n), asio::buffer(read_chunk_.data(), n)));
    if (phase_ == Phase::kClosing || phase_ == Phase::kDraining) {
      buffer_.consume(buffer_.size());
    } else {
      Process();
    }
    MaybeRead();
  }

  // Parses what the buffer holds, per phase.
  void Process() {
    if (phase_ == Phase::kIdle) {
      if (buffer_.size() == 0) return;
      phase_ = Phase::kHeader;
      SetDeadline(ToChrono(options().header_timeout));
      parser_.emplace();
      parser_->header_limit(static_cast<uint32_t>(
          std::min<size_t>(options().max_header_bytes, std::numeric_limits<uint32_t>::max())));
      parser_->body_limit(options().max_body_bytes);
      parser_->eager(true);
    }
    if (phase_ != Phase::kHeader && phase_ != Phase::kBody) return;
    while (buffer_.size() > 0 && !parser_->is_done()) {
      boost::system::error_code ec;
      const size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec == http::error::need_more) {
        // The parser may stop at a boundary of its own (a chunk header)
        // with bytes left: go on while it makes progress.
        if (used > 0) continue;
        if (phase_ == Phase::kHeader && buffer_.size() > options().max_header_bytes) {
          ec = http::error::header_limit;
        } else {
          break;
        }
      }
      if (ec) {
        ParseFailed(ec);
        return;
      }
      if (phase_ == Phase::kHeader && parser_->is_header_done()) {
        phase_ = Phase::kBody;
        SetDeadline(ToChrono(options().body_timeout));
        const auto& msg = parser_->get();
        auto expect = msg.find(http::field::expect);
        if (expect != msg.end() &&
            absl::EqualsIgnoreCase(
                absl::string_view(expect->value().data(), expect->value().size()),
                "100-continue") &&
            !parser_->is_done()) {
          Queue("HTTP/1.1 100 Continue\r\n\r\n", 0);
        }
      }
      if (used == 0) break;
    }
    if (parser_->is_done()) Dispatch();
  }

  void ParseFailed(const boost::system::error_code& ec) {
    if (ec == http::error::header_limit) {
      RespondAndClose(431, ErrorBody(absl::StrCat("the request header is over ",
                                                  options().max_header_bytes, " bytes"),
                                     "invalid_request_error", "header_too_large"));
    } else if (ec == http::error::body_limit) {
      RespondAndClose(413, ErrorBody(absl::StrCat("the request body is over ",
                                                  options().max_body_bytes, " bytes"),
                                     "invalid_request_error", "body_too_large"));
    } else {
      RespondAndClose(400, ErrorBody(absl::StrCat("malformed HTTP request: ", ec.message()),
                                     "invalid_request_error", "bad_request"));
    }
  }

  void Dispatch() {
    ClearDeadline();
    phase_ = Phase::kHandling;
    http::request<http::string_body> msg = parser_->release();
    parser_.reset();
    http11_ = msg.version() >= 11;
    keep_alive_ = msg.keep_alive();
    std::vector<HttpHeader> headers;
    for (const auto& field : msg) {
      headers.push_back({std::string(field.name_string()), std::string(field.value())});
    }
    auto exchange = std::make_shared<HttpExchange>(
        shared_from_this(), std::string(msg.method_string()), std::string(msg.target()),
        std::move(headers), std::move(msg.body()), http11_);
    exchange_ = exchange;
    try {
      server_->handler()(std::move(exchange));
    } catch (const std::exception& e) {
      LOG(ERROR) << "HTTP handler failed: " << e.what();
    }
  }

  // --- writing ---
  void OnPiece(ResponsePiece piece) {
    if (phase_ != Phase::kHandling) {
      if (auto ex = exchange_.lock()) ex->WriteDone(piece.counted);
      return;
    }
    switch (piece.kind) {
      case ResponsePiece::Kind::kWhole: {
        if (head_sent_) return;
        std::string out = Head(piece.status, piece.headers, piece.data.size());
        out += piece.data;
        Queue(std::move(out), 0);
        response_done_ = true;
        break;
      }
      case ResponsePiece::Kind::kHead:
        if (head_sent_) return;
        if (!http11_) keep_alive_ = false;
        chunked_ = http11_;
        Queue(Head(piece.status, piece.headers, std::nullopt), 0);
        break;
      case ResponsePiece::Kind::kChunk: {
        if (!head_sent_ || piece.data.empty()) {
          if (auto ex = exchange_.lock()) ex->WriteDone(piece.counted);
          return;
        }
        if (chunked_) {
          std::string out = absl::StrCat(absl::Hex(piece.data.size()), "\r\n");
          out += piece.data;
          out += "\r\n";
          Queue(std::move(out), piece.counted);
        } else {
          Queue(std::move(piece.data), piece.counted);
        }
        break;
      }
      case ResponsePiece::Kind::kEnd:
        if (!head_sent_) {  // a stream that never started
          Queue(Head(500, {}, 0), 0);
        } else if (chunked_) {
          Queue("0\r\n\r\n", 0);
        }
        response_done_ = true;
        break;
    }
  }

  // The status line and headers; `content_length` unset = a stream.
  std::string Head(int status, const std::vector<HttpHeader>& headers,
                   std::optional<size_t> content_length) {
    head_sent_ = true;
    if (server_->stopping()) keep_alive_ = false;
    std::string out = absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\n");
    for (const HttpHeader& h : headers) {
      if (!SafeHeaderText(h.name) || !SafeHeaderText(h.value)) continue;
      absl::StrAppend(&out, h.name, ": ", h.value, "\r\n");
    }
    if (content_length.has_value()) {
      absl::StrAppend(&out, "Content-Length: ", *content_length, "\r\n");
    } else if (chunked_) {
      out += "Transfer-Encoding: chunked\r\n";
    }
    absl::StrAppend(&out, "Connection: ", keep_alive_ ? "keep-alive" : "close", "\r\n\r\n");
    return out;
  }

  // A response of the server's own (errors before a request is whole),
  // after which the connection closes.
  void RespondAndClose(int status, std::string body) {
    phase_ = Phase::kClosing;
    parser_.reset();
    keep_alive_ = false;
    std::string out = Head(status, {{"Content-Type", "application/json"}}, body.size());
    out += body;
    Queue(std::move(out), 0);
    response_done_ = true;
  }

  void Queue(std::string bytes, size_t counted) {
    out_.push_back({std::move(bytes), counted});
    if (!writing_) StartWrite();
  }

  void StartWrite() {
    writing_ = true;
    writing_now_.clear();
    std::vector<asio::const_buffer> buffers;
    while (!out_.empty() && writing_now_.size() < kMaxGather) {
      writing_now_.push_back(std::move(out_.front()));
      out_.pop_front();
    }
    buffers.reserve(writing_now_.size());
    for (const auto& [bytes, counted] : writing_now_) buffers.push_back(asio::buffer(bytes));
    if (phase_ == Phase::kHandling || phase_ == Phase::kClosing) {
      SetDeadline(ToChrono(options().write_timeout));
    }
    asio::async_write(
        stream_, buffers,
        [self = Self()](const boost::system::error_code& ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(const boost::system::error_code& ec) {
    writing_ = false;
    size_t counted = 0;
    for (const auto& item : writing_now_) counted += item.second;
    writing_now_.clear();
    if (auto ex = exchange_.lock(); ex != nullptr && counted > 0) ex->WriteDone(counted);
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      ClientGone();
      return;
    }
    if (!out_.empty()) {
      StartWrite();
      return;
    }
    if (phase_ == Phase::kHandling || phase_ == Phase::kClosing) ClearDeadline();
    if (response_done_) ResponseEnded();
  }

  void ResponseEnded() {
    response_done_ = false;
    head_sent_ = false;
    chunked_ = false;
    if (auto ex = exchange_.lock()) ex->Detach();
    exchange_.reset();
    if (!keep_alive_ || server_->stopping() || phase_ == Phase::kClosing) {
      Drain();
      return;
    }
    EnterIdle();
  }

  // Sends FIN, then reads until the client closes too (or kLingerTime).
  void Drain() {
    phase_ = Phase::kDraining;
    buffer_.consume(buffer_.size());
    boost::system::error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_send, ignored);
    SetDeadline(kLingerTime);
    MaybeRead();
  }

  // The client went away (or must be cut off): the request, if any, is
  // told; then the connection closes.
  void ClientGone() {
    if (phase_ == Phase::kClosed) return;
    if (auto ex = exchange_.lock()) ex->MarkGone();
    exchange_.reset();
    Close();
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    if (auto ex = exchange_.lock()) ex->MarkGone();
    exchange_.reset();
    ClearDeadline();
    boost::system::error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_both, ignored);
    Socket().close(ignored);
    out_.clear();
    server_->Unregister(id_);
  }

  HttpServer::Impl* const server_;
  const uint64_t id_;
  Stream stream_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;  // read, not yet parsed
  std::array<char, kReadChunk> read_chunk_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kIdle;
  uint64_t deadline_generation_ = 0;
  bool reading_ = false;
  bool writing_ = false;
  // The response under way.
  std::weak_ptr<HttpExchange> exchange_;
  bool http11_ = true;
  bool keep_alive_ = false;
  bool head_sent_ = false;
  bool chunked_ = false;
  bool response_done_ = false;  // its last bytes are queued
  // Bytes to write, each with the count its exchange's queue holds.
  std::deque<std::pair<std::string, size_t>> out_;
  std::vector<std::pair<std::string, size_t>> writing_now_;
};

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
  tcp::resolver resolver(ioc_);
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
    threads_.emplace_back([this] { ioc_.run(); });
  }
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(asio::make_strand(ioc_),
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
  ioc_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
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
