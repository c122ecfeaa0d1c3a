// The router's metrics and trace lines against fake workers: outcomes
// (refusals and deadlines included), retries, latency histograms and the
// JSON line per request.
#include "router/router_metrics.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"
#include "tests/testing/model_files.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);

uint64_t Count(prometheus::Histogram& h) { return h.Collect().histogram.sample_count; }

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
  }
  return lines;
}

class RouterMetricsTest : public ::testing::Test {
 protected:
  std::unique_ptr<RouterHarness> Start(HarnessOptions options) {
    // One file per test, emptied first: the log appends, and a repeated
    // run (--gtest_repeat) would read the lines of the one before.
    log_path_ = tandem::testing::TempDir() + "/requests_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl";
    std::filesystem::remove(log_path_);
    auto log = RequestLog::Open(log_path_);
    EXPECT_TRUE(log.ok()) << log.status();
    log_ = *std::move(log);
    options.router.driver.metrics = &metrics_;
    options.router.driver.request_log = log_.get();
    auto h = std::make_unique<RouterHarness>(std::move(options));
    const absl::Status s = h->Start();
    EXPECT_TRUE(s.ok()) << s;
    return s.ok() ? std::move(h) : nullptr;
  }

  prometheus::Registry registry_;
  RouterMetrics metrics_{registry_};
  std::string log_path_;
  std::unique_ptr<RequestLog> log_;
};

TEST_F(RouterMetricsTest, RetriedDisaggregatedRequestIsCountedAndTraced) {
  auto h = Start({.prefill = 2, .decode = 1});
  ASSERT_NE(h, nullptr);
  const int bad = h->FirstPrefill();
  h->prefill(bad).SetBehaviour({.fail = absl::InternalError("prefill blew up")});
  v1::GenerateRequest request = TokenRequest({1, 5, 6}, 4);
  request.set_request_id("traced");
  const Result r = h->Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.tokens.size(), 4u);
  ASSERT_TRUE(h->core().WaitForIdle(kWait));

  EXPECT_EQ(metrics_.requests.Get(absl::StatusCode::kOk).Value(), 1);
  EXPECT_EQ(metrics_.prefill_retries.Value(), 1);
  EXPECT_EQ(metrics_.disaggregated_requests.Value(), 1);
  EXPECT_EQ(metrics_.local_prefill_requests.Value(), 0);
  EXPECT_EQ(metrics_.prompt_tokens.Value(), 3);
  EXPECT_EQ(metrics_.generation_tokens.Value(), 4);
  EXPECT_EQ(metrics_.requests_in_flight.Value(), 0);
  EXPECT_EQ(Count(metrics_.time_to_first_token), 1u);
  EXPECT_EQ(Count(metrics_.inter_token_latency), 3u);
  EXPECT_EQ(Count(metrics_.time_per_output_token), 1u);
  EXPECT_EQ(Count(metrics_.e2e_request_latency), 1u);

  const std::vector<nlohmann::json> lines = ReadLines(log_path_);
  ASSERT_EQ(lines.size(), 1u);
  const nlohmann::json& t = lines[0];
  ASSERT_TRUE(t.is_object());
  EXPECT_EQ(t.value("request_id", ""), "traced");
  EXPECT_EQ(t.value("status", ""), "ok");
  EXPECT_EQ(t.value("finish_reason", ""), "FINISH_REASON_LENGTH");
  EXPECT_EQ(t.value("prompt_tokens", 0), 3);
  EXPECT_EQ(t.value("completion_tokens", 0), 4);
  EXPECT_EQ(t.value("prefill_worker", ""), h->prefill_address(1 - bad));
  EXPECT_EQ(t.value("decode_worker", ""), h->decode_address(0));
  EXPECT_TRUE(t.value("disaggregated", false));
  EXPECT_THAT(t.value("routing", ""), HasSubstr("disaggregated"));
  ASSERT_TRUE(t.contains("prefill_errors"));
  EXPECT_THAT(t["prefill_errors"][0].get<std::string>(), HasSubstr("prefill blew up"));
  EXPECT_EQ(t["timeline_us"].value("first_token", int64_t{-1}),
            r.finished.timeline().first_token_us());
  EXPECT_EQ(t["timeline_us"].value("end", int64_t{-1}), r.finished.timeline().end_us());
}

// Waits for the end of a request submitted to the core directly.
class DoneSink final : public ResponseSink {
 public:
  bool OnEvent(GenerateEvent) override { return true; }
  void OnDone(absl::Status status) override {
    status_ = std::move(status);
    done_.Notify();
  }
  absl::Status Wait() {
    if (!done_.WaitForNotificationWithTimeout(kWait)) return absl::DeadlineExceededError("no end");
    return status_;
  }

 private:
  absl::Notification done_;
  absl::Status status_;
};

TEST_F(RouterMetricsTest, TheClientsUserAndMetadataReachTheLogLine) {
  auto h = Start({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  GenerateParams params;
  params.request_id = "tagged";
  params.token_ids = std::vector<int32_t>{1, 5, 6};
  params.max_tokens = 2;
  params.user = "end-user-42";
  params.metadata = {{"team", "search"}};
  auto sink = std::make_shared<DoneSink>();
  auto handle = h->core().Submit(std::move(params), sink);
  ASSERT_TRUE(sink->Wait().ok());
  ASSERT_TRUE(h->core().WaitForIdle(kWait));
  const std::vector<nlohmann::json> lines = ReadLines(log_path_);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].value("request_id", ""), "tagged");
  EXPECT_EQ(lines[0].value("user", ""), "end-user-42");
  ASSERT_TRUE(lines[0].contains("metadata"));
  EXPECT_EQ(lines[0]["metadata"].value("team", ""), "search");
}

TEST_F(RouterMetricsTest, RefusalsAndDeadlinesAreCountedByOutcome) {
  HarnessOptions options{.prefill = 0, .decode = 1};
  options.router.max_inflight = 1;
  options.router.max_queued = 0;
  auto h = Start(std::move(options));
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.hold_after = 1});
  v1::GenerateRequest slow = TokenRequest({1, 5, 6}, 8);
  slow.set_timeout_ms(500);
  Result held;
  std::thread first([&] { held = h->Run(slow); });
  const absl::Time deadline = absl::Now() + kWait;
  while (metrics_.requests_in_flight.Value() < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(metrics_.requests_in_flight.Value(), 1);
  const Result refused = h->Run(TokenRequest({1, 5}, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  first.join();
  EXPECT_EQ(held.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(h->core().WaitForIdle(kWait));
  const Result invalid = h->Run(TokenRequest({1, 5}, -1));
  EXPECT_EQ(invalid.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(h->core().WaitForIdle(kWait));

  EXPECT_EQ(metrics_.requests.Get(absl::StatusCode::kResourceExhausted).Value(), 1);
  EXPECT_EQ(metrics_.requests.Get(absl::StatusCode::kDeadlineExceeded).Value(), 1);
  EXPECT_EQ(metrics_.requests.Get(absl::StatusCode::kInvalidArgument).Value(), 1);
  EXPECT_EQ(metrics_.requests.Get(absl::StatusCode::kOk).Value(), 0);
  EXPECT_EQ(metrics_.requests_in_flight.Value(), 0);
  EXPECT_EQ(metrics_.local_prefill_requests.Value(), 1);
  // The held request got its first token, but never finished OK.
  EXPECT_EQ(Count(metrics_.time_to_first_token), 1u);
  EXPECT_EQ(Count(metrics_.e2e_request_latency), 0u);
  // Refused requests never reach a driver: two trace lines.
  const std::vector<nlohmann::json> lines = ReadLines(log_path_);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].value("status", ""), "deadline_exceeded");
  EXPECT_FALSE(lines[0].value("disaggregated", true));
  EXPECT_THAT(lines[0].value("routing", ""), HasSubstr("local prefill"));
  EXPECT_EQ(lines[1].value("status", ""), "invalid_argument");
  EXPECT_EQ(lines[1].value("routing", ""), "not routed");
}

}  // namespace
}  // namespace tandem::router::testing
