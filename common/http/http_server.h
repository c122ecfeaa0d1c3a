// An asynchronous HTTP/1.1 server (Boost.Beast's parser on Boost.Asio),
// plain or TLS, that hands each request to one handler as an HttpExchange.
//
//   HttpServer::Start(options, [](std::shared_ptr<HttpExchange> ex) {
//     ex->Respond(200, {{"Content-Type", "text/plain"}}, "ok");
//   });
//
// A few io threads serve every connection; nothing runs a thread per
// connection or per request. Keep-alive connections serve any number of
// requests. Everything a client controls is bounded: connections (beyond
// `max_connections` a new one is closed at once), header bytes (431), body
// bytes (413), the time to send the header and the body (408, then the
// connection is closed) and the idle time between requests (closed).
//
// A response is whole (Respond) or a stream (StartStream, Write..., End):
// writes are queued per connection and leave one at a time, so a sink never
// waits for the client; a client that falls `max_queued_bytes` behind is cut
// off like one that went away. While a request is answered the server keeps
// reading its connection, so a client that closes it is noticed at once:
// the exchange's OnClientGone callback runs (as it does when a write fails).
#ifndef TANDEM_COMMON_HTTP_HTTP_SERVER_H_
#define TANDEM_COMMON_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::http {

struct HttpServerOptions {
  // HOST:PORT to listen on ([v6]:PORT too); port 0 picks a free one.
  std::string listen = "127.0.0.1:0";
  // Threads running the io loop (all connections share them).
  int io_threads = 2;
  // Open connections; beyond it a new connection is closed at once.
  int max_connections = 16384;
  // Bounds on a request (431 and 413 above them).
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 16 << 20;
  // From a request's first byte to the end of its header, and from there to
  // the end of its body: a client slower than this gets 408 and is closed.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  // A connection with no request under way is closed after this long
  // (a new one too, until its first byte).
  absl::Duration idle_timeout = absl::Seconds(60);
  // A response write that makes no progress for this long closes the
  // connection (the client stopped reading).
  absl::Duration write_timeout = absl::Seconds(30);
  // Response bytes queued on a connection and not yet written; a stream
  // that gets further ahead of its client is cut off.
  size_t max_queued_bytes = 8 << 20;
  // PEM files; both set = TLS on every connection, neither = plain HTTP.
  std::string tls_cert_file = "";
  std::string tls_key_file = "";
};

// INVALID_ARGUMENT unless `listen` is HOST:PORT (or [v6]:PORT), port in
// [0, 65535]; sets `host` and `port`.
absl::Status ParseListenAddress(const std::string& listen, std::string* host, int* port);

struct HttpHeader {
  std::string name;
  std::string value;
};

class Connection;

// One request and its response. The request accessors are immutable; the
// response methods are thread-safe and never block. Exactly one of
// Respond or StartStream should be called, and a stream should End.
class HttpExchange {
 public:
  HttpExchange(std::shared_ptr<Connection> connection, std::string method, std::string target,
               std::vector<HttpHeader> headers, std::string body);
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const std::string& method() const { return method_; }
  // The request target as sent ("/v1/models?x=1").
  const std::string& target() const { return target_; }
  // The target without its query.
  absl::string_view path() const;
  // The first header of that name (case-insensitive), "" when absent.
  absl::string_view Header(absl::string_view name) const;
  const std::string& body() const { return body_; }

  // A whole response (Content-Length set here).
  void Respond(int status, std::vector<HttpHeader> headers, std::string body);
  // The header of a streamed response (chunked on HTTP/1.1, closed at the
  // end on HTTP/1.0); then Write each piece and End.
  void StartStream(int status, std::vector<HttpHeader> headers);
  // Queues `data`; false when the client is gone (or too far behind).
  bool Write(std::string data);
  void End();

  // True once the client closed the connection or a write to it failed.
  bool client_gone() const { return gone_.load(std::memory_order_acquire); }
  // Runs `fn` once when the client goes away before the response ended
  // (at once, on this thread, when it is gone already; a later call
  // replaces an earlier `fn` not yet run). Runs on an io thread: it must
  // not block.
  void OnClientGone(std::function<void()> fn);

  // Called by the connection (on its strand).
  void MarkGone();
  void Detach();
  void WriteDone(size_t bytes) { queued_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  // The connection while the response is under way; null after End or
  // Respond, or once it closed.
  std::shared_ptr<Connection> TakeOrGetConnection(bool take);

  const std::string method_;
  const std::string target_;
  const std::vector<HttpHeader> headers_;
  const std::string body_;

  std::atomic<bool> gone_{false};
  std::atomic<size_t> queued_{0};
  absl::Mutex mu_;
  std::shared_ptr<Connection> connection_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_gone_ ABSL_GUARDED_BY(mu_);
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

class HttpServer {
 public:
  // Binds and starts serving. INVALID_ARGUMENT for a bad address or
  // options (one of the TLS files without the other), UNAVAILABLE when the
  // address cannot be bound, FAILED_PRECONDITION when the TLS files do not
  // load. `handler` runs on an io thread and must not block.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpHandler handler);
  ~HttpServer();  // Stop(absl::ZeroDuration()).

  int port() const;
  bool tls() const;
  // Open connections.
  int connections() const;

  // Stops accepting, closes idle connections, lets responses under way end
  // for up to `grace` (their connections close after them), then closes
  // every connection and joins the io threads. Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(5));

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_HTTP_SERVER_H_
