#include "tests/unit/router/http_test_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::router::testing {
namespace {

// A read that waits longer than this fails the test instead of hanging it.
constexpr int kReadTimeoutSeconds = 30;

void SetReadTimeout(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

}  // namespace

std::string HttpResponse::Header(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<RawConnection>> RawConnection::Connect(int port, SSL_CTX* tls) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", strerror(err)));
  }
  int yes = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  SetReadTimeout(fd, absl::Seconds(kReadTimeoutSeconds));
  SSL* ssl = nullptr;
  if (tls != nullptr) {
    ssl = SSL_new(tls);
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, "localhost");
    if (SSL_connect(ssl) != 1) {
      char err[256];
      ERR_error_string_n(ERR_get_error(), err, sizeof(err));
      SSL_free(ssl);
      close(fd);
      return absl::UnavailableError(absl::StrCat("TLS handshake: ", err));
    }
  }
  return std::unique_ptr<RawConnection>(new RawConnection(fd, ssl));
}

RawConnection::~RawConnection() { Close(); }

void RawConnection::Close() {
  if (ssl_ != nullptr) {
    SSL_free(ssl_);
    ssl_ = nullptr;
  }
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

bool RawConnection::Send(absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ssl_ != nullptr
                          ? SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size()))
                          : send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

int RawConnection::Fill() {
  char chunk[16384];
  const ssize_t n =
      ssl_ != nullptr ? SSL_read(ssl_, chunk, sizeof(chunk)) : recv(fd_, chunk, sizeof(chunk), 0);
  if (n > 0) {
    buffer_.append(chunk, static_cast<size_t>(n));
    return static_cast<int>(n);
  }
  if (n == 0) return 0;
  if (ssl_ != nullptr) {
    const int err = SSL_get_error(ssl_, static_cast<int>(n));
    // The server closed without a TLS close_notify: EOF all the same.
    if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && errno == 0) ||
        err == SSL_ERROR_SSL) {
      return 0;
    }
  } else if (errno == ECONNRESET) {
    return 0;
  }
  return -1;
}

absl::StatusOr<std::string> RawConnection::ReadLine() {
  for (;;) {
    const size_t end = buffer_.find("\r\n");
    if (end != std::string::npos) {
      std::string line = buffer_.substr(0, end);
      buffer_.erase(0, end + 2);
      return line;
    }
    const int n = Fill();
    if (n == 0) return absl::OutOfRangeError("EOF in a line");
    if (n < 0) return absl::DeadlineExceededError("timed out reading a line");
  }
}

absl::StatusOr<std::string> RawConnection::ReadExactly(size_t size) {
  while (buffer_.size() < size) {
    const int n = Fill();
    if (n == 0) return absl::OutOfRangeError("EOF in a body");
    if (n < 0) return absl::DeadlineExceededError("timed out reading a body");
  }
  std::string out = buffer_.substr(0, size);
  buffer_.erase(0, size);
  return out;
}

absl::StatusOr<HttpResponse> RawConnection::ReadResponse(bool head) {
  HttpResponse r;
  absl::StatusOr<std::string> line = ReadLine();
  if (!line.ok()) return line.status();
  // "HTTP/1.1 200 OK"
  if (line->size() < 12 || !absl::SimpleAtoi(line->substr(9, 3), &r.status)) {
    return absl::InternalError(absl::StrCat("bad status line '", *line, "'"));
  }
  for (;;) {
    line = ReadLine();
    if (!line.ok()) return line.status();
    if (line->empty()) break;
    const size_t colon = line->find(':');
    if (colon == std::string::npos) return absl::InternalError("bad header line");
    r.headers.emplace_back(line->substr(0, colon),
                           std::string(absl::StripAsciiWhitespace(line->substr(colon + 1))));
  }
  if (head) return r;
  if (absl::EqualsIgnoreCase(r.Header("Transfer-Encoding"), "chunked")) {
    for (;;) {
      line = ReadLine();
      if (!line.ok()) return line.status();
      size_t size = 0;
      if (!absl::SimpleHexAtoi(*line, &size)) return absl::InternalError("bad chunk size");
      absl::StatusOr<std::string> data = ReadExactly(size + 2);
      if (!data.ok()) return data.status();
      if (size == 0) break;
      r.body += data->substr(0, size);
    }
  } else if (!r.Header("Content-Length").empty()) {
    size_t size = 0;
    if (!absl::SimpleAtoi(r.Header("Content-Length"), &size)) {
      return absl::InternalError("bad Content-Length");
    }
    absl::StatusOr<std::string> data = ReadExactly(size);
    if (!data.ok()) return data.status();
    r.body = *std::move(data);
  } else if (r.status >= 200 && r.status != 204 && r.status != 304) {
    for (;;) {
      const int n = Fill();
      if (n == 0) break;
      if (n < 0) return absl::DeadlineExceededError("timed out reading to EOF");
    }
    r.body = std::move(buffer_);
    buffer_.clear();
  }
  return r;
}

absl::StatusOr<std::string> RawConnection::ReadUntil(absl::string_view needle) {
  while (!absl::StrContains(buffer_, needle)) {
    const int n = Fill();
    if (n == 0) return absl::OutOfRangeError(absl::StrCat("EOF before '", needle, "'"));
    if (n < 0) return absl::DeadlineExceededError(absl::StrCat("timed out before '", needle, "'"));
  }
  return buffer_;
}

bool RawConnection::WaitClosed(absl::Duration timeout, std::string* received) {
  SetReadTimeout(fd_, timeout);
  bool closed = false;
  for (;;) {
    const int n = Fill();
    if (n == 0) {
      closed = true;
      break;
    }
    if (n < 0) break;
  }
  if (received != nullptr) *received += buffer_;
  buffer_.clear();
  SetReadTimeout(fd_, absl::Seconds(kReadTimeoutSeconds));
  return closed;
}

SSL_CTX* ClientTlsContext(const std::string& ca_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return nullptr;
  if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) {
    SSL_CTX_free(ctx);
    return nullptr;
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  return ctx;
}

void FreeTlsContext(SSL_CTX* ctx) { SSL_CTX_free(ctx); }

std::string Request(absl::string_view method, absl::string_view target, absl::string_view body,
                    const std::vector<std::string>& headers) {
  std::string out = absl::StrCat(method, " ", target, " HTTP/1.1\r\nHost: localhost\r\n");
  for (const std::string& h : headers) absl::StrAppend(&out, h, "\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&out, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  absl::StrAppend(&out, "\r\n", body);
  return out;
}

}  // namespace tandem::router::testing
