// MetricsServer: serves a prometheus::Registry as Prometheus text format on
// http://HOST:PORT/metrics (prometheus-cpp's CivetWeb exposer, its own
// threads).
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
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

class MetricsServer {
 public:
  // Serves `registry` on `listen` (host:port; port 0 = any free port).
  // INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry);

  // Stops serving (joins the exposer's threads).
  ~MetricsServer() = default;
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port bound.
  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                std::shared_ptr<prometheus::Registry> registry, int port);

  // The registry goes last, after the exposer that reads it.
  const std::shared_ptr<prometheus::Registry> registry_;
  const std::unique_ptr<prometheus::Exposer> exposer_;
  const int port_;
};

// Starts a MetricsServer for `registry` as --metrics_listen and
// --metrics_port_file ask; null when --metrics_listen is empty.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerFromFlags(
    std::shared_ptr<prometheus::Registry> registry);

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_METRICS_SERVER_H_
