// HttpExchange: one request as its handler sees it, and the response the
// handler sends, handed to the request's connection as ResponsePieces.
#include <utility>

#include "absl/strings/match.h"
#include "common/http/http_server.h"
#include "common/http/internal/http_server_impl.h"

namespace tandem::http {

HttpExchange::HttpExchange(std::shared_ptr<Connection> connection, std::string method,
                           std::string target, std::vector<HttpHeader> headers, std::string body)
    : method_(std::move(method)),
      target_(std::move(target)),
      headers_(std::move(headers)),
      body_(std::move(body)),
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

}  // namespace tandem::http
