// The HTTP server's internals (internal to common/http), shared by its
// sources: http_exchange.cc (HttpExchange, what a handler holds),
// http_connection.cc (StreamConnection: one client connection, reading
// requests and writing responses) and http_server.cc (HttpServer::Impl: the
// listener, accepting connections, stopping).
#ifndef TANDEM_COMMON_HTTP_INTERNAL_HTTP_SERVER_IMPL_H_
#define TANDEM_COMMON_HTTP_INTERNAL_HTTP_SERVER_IMPL_H_

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/http_server.h"

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

// Bytes read per socket read (and held per connection for it).
constexpr size_t kReadChunk = 8 << 10;

// The server: its listener, io threads and open connections (the
// listener's side is in http_server.cc).
class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        acceptor_(asio::make_strand(*ioc_)),
        retry_timer_(acceptor_.get_executor()),
        work_(asio::make_work_guard(*ioc_)) {}

  absl::Status Listen();
  void Run();
  void Stop(absl::Duration grace);

  const HttpServerOptions& options() const { return options_; }
  const HttpHandler& handler() const { return handler_; }
  const std::shared_ptr<asio::io_context>& io_context() const { return ioc_; }
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
  // Shared with every connection: a thread that posts a response to a
  // connection holds it, and the io_context must outlive that post even
  // when the server stops meanwhile (the io thread may run the response,
  // and the server stop, before the poster has returned from post).
  std::shared_ptr<asio::io_context> ioc_ = std::make_shared<asio::io_context>();
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
  StreamConnection(HttpServer::Impl* server, uint64_t id, Stream stream);

  void Start();
  void Post(ResponsePiece piece) override;
  void PostAbort() override;
  // Server stop: idle connections close at once, a response under way ends
  // first (then the connection closes); `force` closes it regardless.
  void PostShutdown(bool force);

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

  void Begin();

  // --- deadlines: one timer, one phase at a time ---
  void SetDeadline(std::chrono::steady_clock::duration d);
  void ClearDeadline();
  void OnDeadline();

  // --- reading ---
  void EnterIdle();
  void MaybeRead();
  void OnRead(const boost::system::error_code& ec, size_t n);
  // Parses what the buffer holds, per phase.
  void Process();
  void ParseFailed(const boost::system::error_code& ec);
  void Dispatch();

  // --- writing ---
  void OnPiece(ResponsePiece piece);
  // The status line and headers; `content_length` unset = a stream.
  std::string Head(int status, const std::vector<HttpHeader>& headers,
                   std::optional<size_t> content_length);
  // A response of the server's own (errors before a request is whole),
  // after which the connection closes.
  void RespondAndClose(int status, std::string body);
  void Queue(std::string bytes, size_t counted);
  void StartWrite();
  void OnWrite(const boost::system::error_code& ec);
  void ResponseEnded();
  // Sends FIN, then reads until the client closes too (or kLingerTime).
  void Drain();
  // The client went away (or must be cut off): the request, if any, is
  // told; then the connection closes.
  void ClientGone();
  void Close();

  // First, so that it goes last: the socket and timer below live on it.
  const std::shared_ptr<asio::io_context> io_context_;
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
  // A HEAD request: its response carries the header a GET's would, no body.
  bool head_only_ = false;
  bool keep_alive_ = false;
  bool head_sent_ = false;
  bool chunked_ = false;
  bool response_done_ = false;  // its last bytes are queued
  // Bytes to write, each with the count its exchange's queue holds.
  std::deque<std::pair<std::string, size_t>> out_;
  std::vector<std::pair<std::string, size_t>> writing_now_;
};

// Instantiated in http_connection.cc.
extern template class StreamConnection<tcp::socket>;
extern template class StreamConnection<ssl::stream<tcp::socket>>;

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_INTERNAL_HTTP_SERVER_IMPL_H_
