#include "common/metrics/metrics_server.h"

#include <cstdio>
#include <exception>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/port_file.h"
#include "common/base/status_macros.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (GET /metrics); port 0 picks a free one; "
          "empty = no metrics endpoint");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the bound metrics port here (one line) once it serves; empty = don't");

namespace tandem::metrics {

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                             std::shared_ptr<prometheus::Registry> registry, int port)
    : registry_(std::move(registry)), exposer_(std::move(exposer)), port_(port) {}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", listen, "' is not HOST:PORT"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One thread: scrapes are rare and cheap.
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  exposer->RegisterCollectable(registry);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics endpoint on ", listen, " bound no port"));
  }
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), std::move(registry), ports.front()));
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerFromFlags(
    std::shared_ptr<prometheus::Registry> registry) {
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (listen.empty()) return std::unique_ptr<MetricsServer>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(listen, std::move(registry));
  if (!server.ok()) return server.status();
  if (const std::string path = absl::GetFlag(FLAGS_metrics_port_file); !path.empty()) {
    RETURN_IF_ERROR(WritePortFile(path, (*server)->port(), "metrics_port_file"));
  }
  LOG(INFO) << "serving Prometheus metrics on port " << (*server)->port() << " (GET /metrics)";
  return server;
}

}  // namespace tandem::metrics
