// MetricsServer: serves a prometheus::Registry as Prometheus text format on
// http://HOST:PORT/metrics, on the shared HTTP server (common/http) with one
// io thread: keep-alive, no thread per connection or request. GET /metrics
// is 200, another path 404, another method 405; a request header over 8 KiB
// is 431, a body over 4 KiB 413, and a connection that sends no whole
// request (or does not take its response) within `timeout` is closed.
//
// Why not prometheus-cpp's CivetWeb exposer: CivetWeb creates its threads
// with a fixed ~100 KiB stack, and glibc places a thread's static TLS on its
// stack. The workers link cuBLAS (libcublasLt alone has ~94 KiB of static
// TLS), so those threads could not be created and the endpoint never came
// up. The HTTP server's threads are std::threads with the default stack.
//
// Every process links the flags below and calls StartMetricsServerFromFlags:
//   --metrics_listen HOST:PORT   empty (default) = no endpoint; port 0 picks
//                                a free one;
//   --metrics_port_file FILE     the bound port, written once serving.
#ifndef TANDEM_COMMON_METRICS_METRICS_SERVER_H_
#define TANDEM_COMMON_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http/http_server.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

struct MetricsServerOptions {
  // A connection that takes longer than this to send a whole request
  // (idle time before it included), or to take a response, is closed.
  absl::Duration timeout = absl::Seconds(10);
};

// Serves until destroyed; the destructor closes every connection and joins
// the io thread. Scrapes read the registry on that thread.
class MetricsServer {
 public:
  // Serves `registry` on `listen` (host:port or [v6]:port; port 0 = any free
  // port). INVALID_ARGUMENT for a malformed address (or a timeout that is
  // not positive), UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
      MetricsServerOptions options = {});

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port bound.
  int port() const { return server_->port(); }

 private:
  explicit MetricsServer(std::shared_ptr<prometheus::Registry> registry);
  void Handle(http::HttpExchange& ex) const;

  // Outlives the server, which reads it on its io thread.
  const std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<http::HttpServer> server_;
};

// Starts a MetricsServer for `registry` as --metrics_listen and
// --metrics_port_file ask; null when --metrics_listen is empty.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerFromFlags(
    std::shared_ptr<prometheus::Registry> registry);

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_METRICS_SERVER_H_
