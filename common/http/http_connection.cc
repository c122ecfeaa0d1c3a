// One client connection of the HTTP server (StreamConnection, plain or
// TLS): the handshake, reading and parsing requests within their deadlines,
// handing each to the handler as an HttpExchange, writing the pieces of its
// response in order, then keep-alive or closing.
#include <algorithm>
#include <exception>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/http/internal/http_server_impl.h"

namespace tandem::http {

namespace {

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

// The OpenAI error shape every JSON error of the router has (the messages
// here hold no character JSON must escape).
std::string ErrorBody(absl::string_view message, absl::string_view type, absl::string_view code) {
  return absl::StrCat(R"({"error": {"message": ")", message, R"(", "type": ")", type,
                      R"(", "param": null, "code": ")", code, R"("}})");
}

}  // namespace

template <class Stream>
StreamConnection<Stream>::StreamConnection(HttpServer::Impl* server, uint64_t id, Stream stream)
    : Connection(server->options().max_queued_bytes),
      io_context_(server->io_context()),
      server_(server),
      id_(id),
      stream_(std::move(stream)),
      timer_(stream_.get_executor()) {}

template <class Stream>
void StreamConnection<Stream>::Start() {
  asio::dispatch(stream_.get_executor(), [self = Self()] { self->Begin(); });
}

template <class Stream>
void StreamConnection<Stream>::Post(ResponsePiece piece) {
  asio::post(stream_.get_executor(), [self = Self(), piece = std::move(piece)]() mutable {
    self->OnPiece(std::move(piece));
  });
}

template <class Stream>
void StreamConnection<Stream>::PostAbort() {
  asio::post(stream_.get_executor(), [self = Self()] { self->ClientGone(); });
}

template <class Stream>
void StreamConnection<Stream>::PostShutdown(bool force) {
  asio::post(stream_.get_executor(), [self = Self(), force] {
    if (force || self->phase_ != Phase::kHandling) {
      self->ClientGone();
    }
  });
}

template <class Stream>
void StreamConnection<Stream>::Begin() {
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
template <class Stream>
void StreamConnection<Stream>::SetDeadline(std::chrono::steady_clock::duration d) {
  const uint64_t generation = ++deadline_generation_;
  timer_.expires_after(d);
  timer_.async_wait([self = Self(), generation](const boost::system::error_code& ec) {
    if (ec || generation != self->deadline_generation_ || self->phase_ == Phase::kClosed) return;
    self->OnDeadline();
  });
}

template <class Stream>
void StreamConnection<Stream>::ClearDeadline() {
  ++deadline_generation_;
  timer_.cancel();
}

template <class Stream>
void StreamConnection<Stream>::OnDeadline() {
  switch (phase_) {
    case Phase::kHeader:
    case Phase::kBody:
      RespondAndClose(
          408, ErrorBody(absl::StrCat("the request ", phase_ == Phase::kHeader ? "header" : "body",
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
template <class Stream>
void StreamConnection<Stream>::EnterIdle() {
  phase_ = Phase::kIdle;
  SetDeadline(ToChrono(options().idle_timeout));
  Process();
  MaybeRead();
}

template <class Stream>
void StreamConnection<Stream>::MaybeRead() {
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

template <class Stream>
void StreamConnection<Stream>::OnRead(const boost::system::error_code& ec, size_t n) {
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

template <class Stream>
void StreamConnection<Stream>::Process() {
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
          absl::EqualsIgnoreCase(absl::string_view(expect->value().data(), expect->value().size()),
                                 "100-continue") &&
          !parser_->is_done()) {
        Queue("HTTP/1.1 100 Continue\r\n\r\n", 0);
      }
    }
    if (used == 0) break;
  }
  if (parser_->is_done()) Dispatch();
}

template <class Stream>
void StreamConnection<Stream>::ParseFailed(const boost::system::error_code& ec) {
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

template <class Stream>
void StreamConnection<Stream>::Dispatch() {
  ClearDeadline();
  phase_ = Phase::kHandling;
  http::request<http::string_body> msg = parser_->release();
  parser_.reset();
  http11_ = msg.version() >= 11;
  head_only_ = msg.method() == http::verb::head;
  keep_alive_ = msg.keep_alive();
  std::vector<HttpHeader> headers;
  for (const auto& field : msg) {
    headers.push_back({std::string(field.name_string()), std::string(field.value())});
  }
  auto exchange = std::make_shared<HttpExchange>(
      shared_from_this(), std::string(msg.method_string()), std::string(msg.target()),
      std::move(headers), std::move(msg.body()));
  exchange_ = exchange;
  try {
    server_->handler()(std::move(exchange));
  } catch (const std::exception& e) {
    LOG(ERROR) << "HTTP handler failed: " << e.what();
  }
}

// --- writing ---
template <class Stream>
void StreamConnection<Stream>::OnPiece(ResponsePiece piece) {
  if (phase_ != Phase::kHandling) {
    if (auto ex = exchange_.lock()) ex->WriteDone(piece.counted);
    return;
  }
  switch (piece.kind) {
    case ResponsePiece::Kind::kWhole: {
      if (head_sent_) return;
      std::string out = Head(piece.status, piece.headers, piece.data.size());
      if (!head_only_) out += piece.data;
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
      if (!head_sent_ || piece.data.empty() || head_only_) {
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
      } else if (chunked_ && !head_only_) {
        Queue("0\r\n\r\n", 0);
      }
      response_done_ = true;
      break;
  }
}

template <class Stream>
std::string StreamConnection<Stream>::Head(int status, const std::vector<HttpHeader>& headers,
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

template <class Stream>
void StreamConnection<Stream>::RespondAndClose(int status, std::string body) {
  phase_ = Phase::kClosing;
  parser_.reset();
  keep_alive_ = false;
  std::string out = Head(status, {{"Content-Type", "application/json"}}, body.size());
  out += body;
  Queue(std::move(out), 0);
  response_done_ = true;
}

template <class Stream>
void StreamConnection<Stream>::Queue(std::string bytes, size_t counted) {
  out_.push_back({std::move(bytes), counted});
  if (!writing_) StartWrite();
}

template <class Stream>
void StreamConnection<Stream>::StartWrite() {
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
  asio::async_write(stream_, buffers, [self = Self()](const boost::system::error_code& ec, size_t) {
    self->OnWrite(ec);
  });
}

template <class Stream>
void StreamConnection<Stream>::OnWrite(const boost::system::error_code& ec) {
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

template <class Stream>
void StreamConnection<Stream>::ResponseEnded() {
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

template <class Stream>
void StreamConnection<Stream>::Drain() {
  phase_ = Phase::kDraining;
  buffer_.consume(buffer_.size());
  boost::system::error_code ignored;
  Socket().shutdown(tcp::socket::shutdown_send, ignored);
  SetDeadline(kLingerTime);
  MaybeRead();
}

template <class Stream>
void StreamConnection<Stream>::ClientGone() {
  if (phase_ == Phase::kClosed) return;
  if (auto ex = exchange_.lock()) ex->MarkGone();
  exchange_.reset();
  Close();
}

template <class Stream>
void StreamConnection<Stream>::Close() {
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

template class StreamConnection<tcp::socket>;
template class StreamConnection<ssl::stream<tcp::socket>>;

}  // namespace tandem::http
