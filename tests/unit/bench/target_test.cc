// The OpenAI target against an in-process SSE server with known delays, the
// null target and the runner's load control.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/bench/runner.h"
#include "tools/bench/target.h"

namespace tandem::bench {
namespace {

using ::testing::HasSubstr;

constexpr int kDelayMs = 40;

// Streams 4 one-token chunks kDelayMs apart, then usage and [DONE]; or a
// 500 for prompts "fail".
class FakeOpenAi {
 public:
  FakeOpenAi() {
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      last_body_ = req.body;
      const auto body = nlohmann::json::parse(req.body);
      if (body["prompt"] == "fail") {
        res.status = 500;
        res.set_content("{\"error\": \"nope\"}", "application/json");
        return;
      }
      res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
        for (int i = 0; i < 4; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(kDelayMs));
          const std::string chunk =
              "data: {\"choices\":[{\"index\":0,\"text\":\"t" + std::to_string(i) + "\"}]}\n\n";
          sink.write(chunk.data(), chunk.size());
        }
        const std::string tail =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":4}}\n\n"
            "data: [DONE]\n\n";
        sink.write(tail.data(), tail.size());
        sink.done();
        return true;
      });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 200 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~FakeOpenAi() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::string last_body_;

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(OpenAiTargetTest, TimesStreamedChunks) {
  FakeOpenAi server;
  ASSERT_GT(server.port(), 0);
  auto target = MakeTarget("http://127.0.0.1:" + std::to_string(server.port()), {.model = "m"});
  ASSERT_TRUE(target.ok()) << target.status();
  const RequestRecord r = (*target)->Send({.prompt = "hello", .token_ids = {}, .prompt_len = 1,
                                           .max_tokens = 4});
  ASSERT_TRUE(r.success) << r.error << " body sent: " << server.last_body_;
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_EQ(r.prompt_tokens, 7);  // from usage
  EXPECT_GE(r.ttft, kDelayMs * 0.9e-3);
  // A bound that only catches a wrong time base: a loaded machine may take
  // seconds to connect and schedule the server's thread.
  EXPECT_LT(r.ttft, 60.0);
  ASSERT_EQ(r.itls.size(), 3u);
  for (double gap : r.itls) EXPECT_GE(gap, kDelayMs * 0.9e-3);
  EXPECT_GE(r.e2e, 4 * kDelayMs * 0.9e-3);
  EXPECT_NEAR(*Tpot(r), (r.e2e - r.ttft) / 3, 1e-12);
  const auto sent = nlohmann::json::parse(server.last_body_);
  EXPECT_EQ(sent["stream"], true);
  EXPECT_EQ(sent["max_tokens"], 4);
  EXPECT_EQ(sent["model"], "m");
}

TEST(OpenAiTargetTest, ReportsHttpErrorsAndRefusedConnections) {
  FakeOpenAi server;
  auto target = MakeTarget("http://127.0.0.1:" + std::to_string(server.port()), {});
  ASSERT_TRUE(target.ok());
  const RequestRecord r = (*target)->Send({.prompt = "fail", .token_ids = {}, .prompt_len = 1,
                                           .max_tokens = 4});
  EXPECT_FALSE(r.success);
  EXPECT_THAT(r.error, HasSubstr("HTTP 500"));
  auto dead = MakeTarget("http://127.0.0.1:1", {.model = "", .timeout_s = 2});
  ASSERT_TRUE(dead.ok());
  const RequestRecord d = (*dead)->Send({.prompt = "x", .token_ids = {}, .prompt_len = 1,
                                         .max_tokens = 1});
  EXPECT_FALSE(d.success);
  EXPECT_THAT(d.error, HasSubstr("HTTP request failed"));
}

TEST(TargetTest, RejectsUnknownSchemes) {
  EXPECT_FALSE(MakeTarget("ftp://x", {}).ok());
  EXPECT_FALSE(MakeTarget("http://:80", {}).ok());
  EXPECT_TRUE(MakeTarget("grpc://127.0.0.1:1", {}).ok());
}

// Counts the most streams in flight at once.
class SlowTarget : public Target {
 public:
  RequestRecord Send(const BenchRequest& request) override {
    const int now = ++in_flight_;
    for (int seen = peak_.load(); now > seen && !peak_.compare_exchange_weak(seen, now);) {}
    StreamTimer timer;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    timer.OnTokens(request.max_tokens);
    --in_flight_;
    RequestRecord r;
    timer.Finish(r);
    r.success = true;
    return r;
  }
  std::atomic<int> in_flight_{0}, peak_{0};
};

TEST(RunnerTest, FixedConcurrencyIsRespected) {
  SlowTarget target;
  auto data = MakeDataset({.kind = "synthetic", .path = "", .input_len = 4, .output_len = 2});
  ASSERT_TRUE(data.ok());
  auto run = RunBenchmark(target, **data, {.max_concurrency = 3, .num_requests = 30,
                                           .progress = false, .slo = {}});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->metrics.completed, 30);
  EXPECT_EQ(target.peak_.load(), 3);
  EXPECT_GE(run->metrics.duration_s, 10 * 0.02 * 0.9);  // 30 / 3 waves of 20 ms
}

TEST(RunnerTest, PacesArrivalsAtTheRate) {
  auto target = MakeTarget("null://", {});
  auto data = MakeDataset({.kind = "synthetic", .path = "", .input_len = 4, .output_len = 8});
  ASSERT_TRUE(target.ok() && data.ok());
  auto run = RunBenchmark(**target, **data, {.request_rate = 200, .burstiness = 1,
                                             .num_requests = 200, .seed = 1,
                                             .progress = false, .slo = {}});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->metrics.completed, 200);
  EXPECT_EQ(run->metrics.total_output_tokens, 1600);
  // 199 exponential gaps of mean 5 ms: about 1 s (5 sigma is +-0.35 s).
  EXPECT_GT(run->metrics.duration_s, 0.6);
  EXPECT_LT(run->metrics.duration_s, 1.6);
  for (size_t i = 1; i < run->records.size(); ++i) {
    EXPECT_GE(run->records[i].start, run->records[i - 1].start);
  }
}

TEST(RunnerTest, DurationModeStopsSending) {
  SlowTarget target;
  auto data = MakeDataset({.kind = "synthetic", .path = "", .input_len = 4, .output_len = 2});
  auto run = RunBenchmark(target, **data, {.max_concurrency = 2, .duration_s = 0.3,
                                           .progress = false, .slo = {}});
  ASSERT_TRUE(run.ok()) << run.status();
  // Without the duration it would send num_requests (100). Requests take
  // at least 20 ms, so 2 slots complete at most 2 * 0.3 / 0.02 + 2 in flight;
  // a loaded machine only makes them fewer, so the lower bound is loose.
  EXPECT_GE(run->metrics.completed, 2);
  EXPECT_LE(run->metrics.completed, 32);
  EXPECT_FALSE(RunBenchmark(target, **data, {.duration_s = 1, .progress = false, .slo = {}}).ok());
}

}  // namespace
}  // namespace tandem::bench
