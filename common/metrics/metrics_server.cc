#include "common/metrics/metrics_server.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/base/port_file.h"
#include "common/base/status_macros.h"
#include "prometheus/text_serializer.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (GET /metrics); port 0 picks a free one; "
          "empty = no metrics endpoint");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the bound metrics port here (one line) once it serves; empty = don't");

namespace tandem::metrics {
namespace {

// A scrape is a GET with a few short headers and no body: anything much
// larger is not one.
constexpr size_t kMaxHeaderBytes = 8 << 10;
constexpr size_t kMaxBodyBytes = 4 << 10;

constexpr char kTextFormat[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

MetricsServer::MetricsServer(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)) {}

MetricsServer::~MetricsServer() {
  if (server_ != nullptr) server_->Stop(absl::ZeroDuration());
}

void MetricsServer::Handle(http::HttpExchange& ex) const {
  const absl::string_view path = ex.path();
  if (path != "/metrics") {
    ex.Respond(404, {{"Content-Type", "text/plain; charset=utf-8"}},
               "not found: metrics are served on GET /metrics\n");
  } else if (ex.method() != "GET") {
    ex.Respond(405, {{"Content-Type", "text/plain; charset=utf-8"}, {"Allow", "GET"}},
               "/metrics answers GET only\n");
  } else {
    ex.Respond(200, {{"Content-Type", kTextFormat}},
               prometheus::TextSerializer().Serialize(registry_->Collect()));
  }
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
    MetricsServerOptions options) {
  RETURN_IF_ERROR(ParseHostPort(listen, "metrics address", /*min_port=*/0).status());
  if (registry == nullptr) return absl::InvalidArgumentError("metrics server without a registry");
  if (options.timeout <= absl::ZeroDuration() || options.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics connection timeout must be positive and finite, not ",
                     absl::FormatDuration(options.timeout)));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer(std::move(registry)));
  // One io thread serves every scrape.
  absl::StatusOr<std::unique_ptr<http::HttpServer>> started = http::HttpServer::Start(
      {.listen = listen,
       .io_threads = 1,
       .max_header_bytes = kMaxHeaderBytes,
       .max_body_bytes = kMaxBodyBytes,
       .header_timeout = options.timeout,
       .body_timeout = options.timeout,
       .idle_timeout = options.timeout,
       .write_timeout = options.timeout},
      [s = server.get()](std::shared_ptr<http::HttpExchange> ex) { s->Handle(*ex); });
  if (!started.ok()) {
    return absl::Status(started.status().code(), absl::StrCat("cannot serve metrics on ", listen,
                                                              ": ", started.status().message()));
  }
  server->server_ = *std::move(started);
  return server;
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
