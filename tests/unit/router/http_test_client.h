// A raw-socket HTTP/1.1 client for server tests: it writes exactly the
// bytes a test gives it (partial requests, slow requests, garbage) and
// reads responses byte by byte, over plain TCP or TLS (OpenSSL).
// Every read gives up after a generous timeout rather than hanging a test.
#ifndef TANDEM_TESTS_UNIT_ROUTER_HTTP_TEST_CLIENT_H_
#define TANDEM_TESTS_UNIT_ROUTER_HTTP_TEST_CLIENT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace tandem::router::testing {

struct HttpResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // de-chunked
  // The first header of that name (case-insensitive), "" when absent.
  std::string Header(absl::string_view name) const;
};

class RawConnection {
 public:
  // `tls`: a client context (see ClientTlsContext), or null for plain TCP.
  static absl::StatusOr<std::unique_ptr<RawConnection>> Connect(int port, SSL_CTX* tls = nullptr);
  ~RawConnection();

  bool Send(absl::string_view bytes);
  // One whole response (Content-Length, chunked, or up to EOF); the answer
  // to a HEAD request (`head`) is its header alone, whatever it announces.
  absl::StatusOr<HttpResponse> ReadResponse(bool head = false);
  // Reads until what was read holds `needle`; returns everything read so
  // far (the header included) or an error at EOF or timeout.
  absl::StatusOr<std::string> ReadUntil(absl::string_view needle);
  // True when the server closes the connection within `timeout` (whatever
  // it sends before is appended to `*received` when given).
  bool WaitClosed(absl::Duration timeout, std::string* received = nullptr);
  void Close();

 private:
  RawConnection(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  // Reads some bytes into buffer_; 0 at EOF, -1 on error or timeout.
  int Fill();
  absl::StatusOr<std::string> ReadLine();
  absl::StatusOr<std::string> ReadExactly(size_t n);

  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::string buffer_;
};

// A TLS client context trusting `ca_file` (PEM); null on failure.
SSL_CTX* ClientTlsContext(const std::string& ca_file);
void FreeTlsContext(SSL_CTX* ctx);

// One request, serialized: method, target, extra header lines ("K: V"),
// and a body (with its Content-Length when non-empty or POST).
std::string Request(absl::string_view method, absl::string_view target, absl::string_view body = "",
                    const std::vector<std::string>& headers = {});

}  // namespace tandem::router::testing

#endif  // TANDEM_TESTS_UNIT_ROUTER_HTTP_TEST_CLIENT_H_
