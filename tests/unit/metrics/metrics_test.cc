// tandem_metrics: names render as Prometheus text on a real /metrics
// endpoint, fetched over HTTP.
#include "common/metrics/metrics.h"

#include <fstream>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

ABSL_DECLARE_FLAG(std::string, metrics_listen);
ABSL_DECLARE_FLAG(std::string, metrics_port_file);

namespace tandem::metrics {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// GET /metrics from 127.0.0.1:port; the body, or "HTTP <status>" / "error".
std::string Scrape(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/metrics");
  if (!result) return "error";
  if (result->status != 200) return absl::StrCat("HTTP ", result->status);
  return result->body;
}

TEST(MetricsServerTest, ServesTextFormatOnAPickedPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Counter& counter = AddCounter(*registry, "tandem_test_things_total", "Things seen");
  counter.Increment(3);
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string body = Scrape((*server)->port());
  EXPECT_THAT(body, HasSubstr("# HELP tandem_test_things_total Things seen"));
  EXPECT_THAT(body, HasSubstr("# TYPE tandem_test_things_total counter"));
  EXPECT_THAT(body, HasSubstr("\ntandem_test_things_total 3\n"));
  // Live: a later scrape sees later increments.
  counter.Increment();
  EXPECT_THAT(Scrape((*server)->port()), HasSubstr("\ntandem_test_things_total 4\n"));
}

TEST(MetricsServerTest, RendersHistogramsGaugesAndOutcomes) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Histogram& latency =
      AddHistogram(*registry, "tandem_test_latency_seconds", "Latency", LatencyBuckets());
  latency.Observe(0.002);
  latency.Observe(3.0);
  AddGauge(*registry, "tandem_test_in_flight", "In flight").Set(7);
  OutcomeCounter outcomes(*registry, "tandem_test_requests_total", "Requests");
  outcomes.Count(absl::OkStatus());
  outcomes.Count(absl::OkStatus());
  outcomes.Count(absl::InvalidArgumentError("bad"));
  outcomes.Count(absl::InternalError("bug"));
  outcomes.Count(absl::NotFoundError("no such model"));
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string body = Scrape((*server)->port());
  EXPECT_THAT(body, HasSubstr("# TYPE tandem_test_latency_seconds histogram"));
  EXPECT_THAT(body, HasSubstr("tandem_test_latency_seconds_count 2\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_latency_seconds_sum 3.002\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_latency_seconds_bucket{le=\"0.001\"} 0\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_latency_seconds_bucket{le=\"0.0025\"} 1\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_latency_seconds_bucket{le=\"5\"} 2\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_latency_seconds_bucket{le=\"+Inf\"} 2\n"));
  EXPECT_THAT(body, HasSubstr("# TYPE tandem_test_in_flight gauge"));
  EXPECT_THAT(body, HasSubstr("\ntandem_test_in_flight 7\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_requests_total{outcome=\"ok\"} 2\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_requests_total{outcome=\"invalid_argument\"} 1\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_requests_total{outcome=\"error\"} 1\n"));
  // An unknown model is the client's mistake, not a server error.
  EXPECT_THAT(body, HasSubstr("tandem_test_requests_total{outcome=\"not_found\"} 1\n"));
  // Every outcome renders from the start, so that rates work from zero.
  EXPECT_THAT(body, HasSubstr("tandem_test_requests_total{outcome=\"deadline_exceeded\"} 0\n"));
}

TEST(MetricsServerTest, RefusesBadAddressesAndBusyPorts) {
  auto registry = std::make_shared<prometheus::Registry>();
  EXPECT_THAT(MetricsServer::Start("no-port", registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MetricsServer::Start("127.0.0.1:99999", registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto first = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(MetricsServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), registry).status(),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(MetricsServerTest, FromFlagsIsOffByDefaultAndWritesThePortFile) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::SetFlag(&FLAGS_metrics_listen, "");
  auto none = StartMetricsServerFromFlags(registry);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);

  const std::string port_file = testing::TempDir() + "/metrics.port";
  absl::SetFlag(&FLAGS_metrics_listen, "127.0.0.1:0");
  absl::SetFlag(&FLAGS_metrics_port_file, port_file);
  auto server = StartMetricsServerFromFlags(registry);
  absl::SetFlag(&FLAGS_metrics_listen, "");
  absl::SetFlag(&FLAGS_metrics_port_file, "");
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_NE(*server, nullptr);
  int written = 0;
  std::ifstream(port_file) >> written;
  EXPECT_EQ(written, (*server)->port());
  EXPECT_THAT(Scrape(written), Not(HasSubstr("error")));
}

TEST(MetricsServerTest, RendersTokensPerExpertOfEachSparseLayer) {
  auto registry = std::make_shared<prometheus::Registry>();
  EngineGauges engine(*registry, "tandem_test");
  // Layer 0 dense (no experts), layer 1 with three experts.
  engine.PublishExpertLoad({{}, {5, 0, 2}});
  engine.PublishExpertLoad({{}, {9, 0, 2}});
  // Other dimensions (never from one engine) change nothing.
  engine.PublishExpertLoad({{1}, {100, 100, 100, 100}});
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string body = Scrape((*server)->port());
  EXPECT_THAT(body, HasSubstr("# TYPE tandem_test_moe_expert_tokens_total counter"));
  EXPECT_THAT(body, HasSubstr("tandem_test_moe_expert_tokens_total{expert=\"0\",layer=\"1\"} 9\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_moe_expert_tokens_total{expert=\"1\",layer=\"1\"} 0\n"));
  EXPECT_THAT(body, HasSubstr("tandem_test_moe_expert_tokens_total{expert=\"2\",layer=\"1\"} 2\n"));
  EXPECT_THAT(body, Not(HasSubstr("layer=\"0\"")));
  EXPECT_THAT(body, Not(HasSubstr("expert=\"3\"")));
}

TEST(MetricsTest, OutcomeLabelsAndAdvanceTo) {
  EXPECT_EQ(OutcomeLabel(absl::StatusCode::kOk), "ok");
  EXPECT_EQ(OutcomeLabel(absl::StatusCode::kResourceExhausted), "resource_exhausted");
  EXPECT_EQ(OutcomeLabel(absl::StatusCode::kCancelled), "cancelled");
  EXPECT_EQ(OutcomeLabel(absl::StatusCode::kUnavailable), "unavailable");
  EXPECT_EQ(OutcomeLabel(absl::StatusCode::kAlreadyExists), "error");
  prometheus::Registry registry;
  prometheus::Counter& c = AddCounter(registry, "tandem_test_bytes_total", "Bytes");
  AdvanceTo(c, 10);
  AdvanceTo(c, 4);  // A counter never goes back.
  EXPECT_EQ(c.Value(), 10);
  AdvanceTo(c, 25);
  EXPECT_EQ(c.Value(), 25);
}

}  // namespace
}  // namespace tandem::metrics
