// Prometheus metrics and per-request traces of a real cluster: every process
// serves /metrics (--metrics_listen, port 0 + --metrics_port_file); counters
// move by exactly the requests sent, KV bytes agree between prefill and
// decode, gauges return to idle, and the router writes one JSON trace line
// per request (--request_log).
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_harness.h"
#include "tests/e2e/metrics_scrape.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {
namespace {

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class MetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const ModelConfig shape{.dim = 64,
                            .hidden_dim = 172,
                            .n_layers = 2,
                            .n_heads = 4,
                            .n_kv_heads = 4,
                            .vocab_size = 512,
                            .seq_len = 256};
    auto files = WriteSyntheticModel(shape, 11, "metrics");
    CHECK_OK(files.status());
    model_ = files->model;
    tokenizer_ = files->tokenizer;
  }

  // One prefill and one decode worker, every process with a metrics
  // endpoint on a port it picks.
  void StartCluster(const std::vector<std::string>& router_flags = {}) {
    dir_ = TempDir();
    request_log_ = dir_ + "/requests.jsonl";
    auto flags = [&](const std::string& who) {
      return std::vector<std::string>{
          "--metrics_listen=127.0.0.1:0",
          absl::StrCat("--metrics_port_file=", dir_, "/", who, ".mport")};
    };
    ClusterOptions options{.prefill = 1, .decode = 1, .model = model_, .tokenizer = tokenizer_};
    options.router_flags = flags("router");
    options.router_flags.push_back("--request_log=" + request_log_);
    options.router_flags.insert(options.router_flags.end(), router_flags.begin(),
                                router_flags.end());
    options.prefill_flags = flags("prefill");
    options.decode_flags = flags("decode");
    auto cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
    for (const char* who : {"router", "prefill", "decode"}) {
      int port = 0;
      ASSERT_TRUE(absl::SimpleAtoi(
          absl::StripAsciiWhitespace(ReadWhole(absl::StrCat(dir_, "/", who, ".mport"))), &port))
          << who << " wrote no metrics port\n"
          << cluster_->Logs();
      ports_[who] = port;
    }
  }

  Samples ScrapeOf(const std::string& who) { return Scrape(ports_.at(who)); }

  // The router's in-flight gauge drops just after the client's stream ends.
  bool RouterIdle() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (Get(ScrapeOf("router"), "tandem_router_requests_in_flight") != 0) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

  // The router's trace lines, parsed.
  std::vector<nlohmann::json> TraceLines() {
    std::vector<nlohmann::json> lines;
    std::ifstream in(request_log_);
    for (std::string line; std::getline(in, line);) {
      lines.push_back(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
    }
    return lines;
  }

  static std::string model_, tokenizer_;
  std::string dir_, request_log_;
  std::map<std::string, int> ports_;
  std::unique_ptr<Cluster> cluster_;
};

std::string MetricsTest::model_;
std::string MetricsTest::tokenizer_;

TEST_F(MetricsTest, CountersMoveByTheRequestsServed) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const Samples r0 = ScrapeOf("router"), p0 = ScrapeOf("prefill"), d0 = ScrapeOf("decode");
  ASSERT_FALSE(r0.empty() || p0.empty() || d0.empty()) << cluster_->Logs();
  constexpr int kRequests = 5;
  // Expected histogram counts, from what each request returned.
  int completion_tokens = 0, with_tokens = 0, with_two = 0;
  for (int i = 0; i < kRequests; ++i) {
    v1::GenerateRequest request =
        TextRequest(absl::StrCat("the metrics test prompt number ", i), 4 + i);
    request.set_request_id(absl::StrCat("metrics-", i));
    const Completion c = RunGenerate(cluster_->router(), request);
    ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
    const int n = static_cast<int>(c.tokens.size());
    completion_tokens += n;
    with_tokens += n > 0;
    with_two += n > 1;
  }
  // Fixed seeds: the synthetic model never samples EOS first here.
  ASSERT_EQ(with_tokens, kRequests);
  ASSERT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(20)).ok()) << cluster_->Logs();
  const Samples r1 = ScrapeOf("router"), p1 = ScrapeOf("prefill"), d1 = ScrapeOf("decode");
  auto delta = [](const Samples& a, const Samples& b, const std::string& name) {
    return Get(b, name) - Get(a, name);
  };

  // Router.
  EXPECT_EQ(delta(r0, r1, "tandem_router_requests_total{outcome=\"ok\"}"), kRequests);
  EXPECT_EQ(delta(r0, r1, "tandem_router_requests_total{outcome=\"error\"}"), 0);
  EXPECT_EQ(delta(r0, r1, "tandem_router_time_to_first_token_seconds_count"), kRequests);
  EXPECT_EQ(delta(r0, r1, "tandem_router_e2e_request_latency_seconds_count"), kRequests);
  EXPECT_EQ(delta(r0, r1, "tandem_router_time_per_output_token_seconds_count"), with_two);
  EXPECT_EQ(delta(r0, r1, "tandem_router_inter_token_latency_seconds_count"),
            completion_tokens - kRequests);
  EXPECT_EQ(delta(r0, r1, "tandem_router_disaggregated_requests_total"), kRequests);
  EXPECT_EQ(delta(r0, r1, "tandem_router_local_prefill_requests_total"), 0);
  EXPECT_EQ(delta(r0, r1, "tandem_router_generation_tokens_total"), completion_tokens);
  EXPECT_GT(delta(r0, r1, "tandem_router_prompt_tokens_total"), kRequests);
  EXPECT_TRUE(RouterIdle());
  EXPECT_EQ(Get(r1, "tandem_router_prefill_retries_total"), 0);

  // Prefill.
  EXPECT_EQ(delta(p0, p1, "tandem_prefill_requests_total{outcome=\"ok\"}"), kRequests);
  EXPECT_EQ(delta(p0, p1, "tandem_prefill_kv_transfer_seconds_count"), kRequests);
  EXPECT_GE(delta(p0, p1, "tandem_prefill_step_seconds_count"), 1);
  EXPECT_EQ(delta(p0, p1, "tandem_prefill_kv_transfers_total"), kRequests);
  EXPECT_EQ(Get(p1, "tandem_prefill_kv_transfer_failures_total"), 0);
  EXPECT_GT(delta(p0, p1, "tandem_prefill_prefix_cache_queried_tokens_total"), 0);
  EXPECT_LE(Get(p1, "tandem_prefill_prefix_cache_hit_tokens_total"),
            Get(p1, "tandem_prefill_prefix_cache_queried_tokens_total"));
  EXPECT_EQ(Get(p1, "tandem_prefill_kv_blocks_used"), 0);
  EXPECT_GT(Get(p1, "tandem_prefill_kv_blocks_free"), 0);
  EXPECT_EQ(Get(p1, "tandem_prefill_requests_waiting"), 0);
  EXPECT_EQ(Get(p1, "tandem_prefill_requests_running"), 0);

  // Decode, and the KV bytes both sides saw.
  EXPECT_EQ(delta(d0, d1, "tandem_decode_requests_total{outcome=\"ok\"}"), kRequests);
  EXPECT_EQ(delta(d0, d1, "tandem_decode_generated_tokens_total"), completion_tokens);
  EXPECT_GE(delta(d0, d1, "tandem_decode_step_seconds_count"), 1);
  const double sent = delta(p0, p1, "tandem_prefill_kv_transfer_bytes_total");
  EXPECT_GT(sent, 0);
  EXPECT_EQ(delta(d0, d1, "tandem_decode_kv_received_bytes_total"), sent);
  EXPECT_EQ(delta(d0, d1, "tandem_decode_kv_transfers_total"), kRequests);
  EXPECT_EQ(Get(d1, "tandem_decode_kv_transfer_failures_total"), 0);
  EXPECT_EQ(Get(d1, "tandem_decode_kv_blocks_used"), 0);
  EXPECT_GT(Get(d1, "tandem_decode_kv_blocks_free"), 0);
  EXPECT_EQ(Get(d1, "tandem_decode_requests_running"), 0);
  EXPECT_EQ(Get(d1, "tandem_decode_requests_waiting"), 0);

  // One trace line per request, with its timeline and workers.
  const std::vector<nlohmann::json> lines = TraceLines();
  ASSERT_EQ(lines.size(), kRequests);
  int traced_tokens = 0;
  for (int i = 0; i < kRequests; ++i) {
    const nlohmann::json& t = lines[i];
    ASSERT_TRUE(t.is_object()) << "line " << i << " is not JSON";
    EXPECT_EQ(t.value("request_id", ""), absl::StrCat("metrics-", i));
    EXPECT_EQ(t.value("status", ""), "ok");
    EXPECT_GT(t.value("prompt_tokens", 0), 0);
    traced_tokens += t.value("completion_tokens", 0);
    EXPECT_EQ(t.value("prefill_worker", ""), cluster_->prefill(0).address);
    EXPECT_EQ(t.value("decode_worker", ""), cluster_->decode(0).address);
    EXPECT_TRUE(t.value("disaggregated", false));
    EXPECT_FALSE(t.value("routing", "").empty());
    ASSERT_TRUE(t.contains("timeline_us"));
    const nlohmann::json& tl = t["timeline_us"];
    for (const char* field : {"router_queue", "reserve", "prefill_call", "prefill_queue", "prefill",
                              "kv_transfer", "decode_queue", "first_token", "end"}) {
      EXPECT_TRUE(tl.contains(field)) << field;
    }
    EXPECT_GT(tl.value("first_token", int64_t{0}), 0);
    EXPECT_GT(tl.value("prefill", int64_t{0}), 0);
    // The router's own view of the two calls holds the workers' figures.
    EXPECT_GT(tl.value("reserve", int64_t{0}), 0);
    EXPECT_GE(tl.value("prefill_call", int64_t{0}),
              tl.value("prefill_queue", int64_t{0}) + tl.value("prefill", int64_t{0}));
    EXPECT_GE(tl.value("first_token", int64_t{0}), tl.value("router_queue", int64_t{0}) +
                                                       tl.value("reserve", int64_t{0}) +
                                                       tl.value("prefill_call", int64_t{0}));
    EXPECT_GE(tl.value("end", int64_t{0}), tl.value("first_token", int64_t{0}));
  }
  EXPECT_EQ(traced_tokens, completion_tokens);
}

TEST_F(MetricsTest, BadRequestCountsAsInvalidArgument) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const Samples r0 = ScrapeOf("router");
  ASSERT_FALSE(r0.empty()) << cluster_->Logs();
  v1::GenerateRequest request = TextRequest("Hi", -1);  // A negative max_tokens.
  request.set_request_id("metrics-bad");
  const Completion c = RunGenerate(cluster_->router(), request);
  ASSERT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const Samples r1 = ScrapeOf("router");
  const std::string bad = "tandem_router_requests_total{outcome=\"invalid_argument\"}";
  EXPECT_EQ(Get(r1, bad) - Get(r0, bad), 1);
  const std::string ok = "tandem_router_requests_total{outcome=\"ok\"}";
  EXPECT_EQ(Get(r1, ok) - Get(r0, ok), 0);
  EXPECT_EQ(Get(r1, "tandem_router_time_to_first_token_seconds_count"),
            Get(r0, "tandem_router_time_to_first_token_seconds_count"));

  const std::vector<nlohmann::json> lines = TraceLines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].value("request_id", ""), "metrics-bad");
  EXPECT_EQ(lines[0].value("status", ""), "invalid_argument");
  EXPECT_THAT(lines[0].value("error", ""), ::testing::HasSubstr("max_tokens is -1"));
  EXPECT_EQ(lines[0].value("completion_tokens", -1), 0);
}

TEST_F(MetricsTest, LocalPrefillIsCountedAndTracedAsSuch) {
  ASSERT_NO_FATAL_FAILURE(StartCluster({"--local_prefill_tokens=1000"}));
  const Samples r0 = ScrapeOf("router"), p0 = ScrapeOf("prefill"), d0 = ScrapeOf("decode");
  ASSERT_FALSE(r0.empty() || p0.empty() || d0.empty()) << cluster_->Logs();
  constexpr int kRequests = 2;
  int completion_tokens = 0;
  for (int i = 0; i < kRequests; ++i) {
    const Completion c = RunGenerate(cluster_->router(), TextRequest("a short local prompt", 6));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster_->Logs();
    completion_tokens += static_cast<int>(c.tokens.size());
  }
  ASSERT_TRUE(cluster_->WaitUntilIdle(absl::Seconds(20)).ok()) << cluster_->Logs();
  const Samples r1 = ScrapeOf("router"), p1 = ScrapeOf("prefill"), d1 = ScrapeOf("decode");
  auto delta = [](const Samples& a, const Samples& b, const std::string& name) {
    return Get(b, name) - Get(a, name);
  };
  EXPECT_EQ(delta(r0, r1, "tandem_router_local_prefill_requests_total"), kRequests);
  EXPECT_EQ(delta(r0, r1, "tandem_router_disaggregated_requests_total"), 0);
  EXPECT_EQ(delta(p0, p1, "tandem_prefill_requests_total{outcome=\"ok\"}"), 0);
  EXPECT_EQ(delta(d0, d1, "tandem_decode_requests_total{outcome=\"ok\"}"), kRequests);
  EXPECT_EQ(delta(d0, d1, "tandem_decode_kv_received_bytes_total"), 0);
  EXPECT_EQ(delta(d0, d1, "tandem_decode_generated_tokens_total"), completion_tokens);
  EXPECT_EQ(Get(d1, "tandem_decode_kv_blocks_used"), 0);

  const std::vector<nlohmann::json> lines = TraceLines();
  ASSERT_EQ(lines.size(), kRequests);
  for (const nlohmann::json& t : lines) {
    ASSERT_TRUE(t.is_object());
    EXPECT_EQ(t.value("status", ""), "ok");
    EXPECT_FALSE(t.value("disaggregated", true));
    EXPECT_EQ(t.value("prefill_worker", "-"), "");
    EXPECT_EQ(t.value("decode_worker", ""), cluster_->decode(0).address);
    EXPECT_THAT(t.value("routing", ""), ::testing::HasSubstr("local prefill"));
    // A generated request id, as the client set none.
    EXPECT_FALSE(t.value("request_id", "").empty());
    EXPECT_GT(t["timeline_us"].value("prefill", int64_t{0}), 0);
  }
}

}  // namespace
}  // namespace tandem::testing
