// The OpenAI target against an in-process SSE server with known delays, the
// null target and the runner's load control.
#include "tools/bench/target.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/bench/fake_run_clock.h"
#include "tools/bench/arrivals.h"
#include "tools/bench/runner.h"

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
    // The socket listens already; stop() only works once the server loop
    // runs, so the destructor needs it running. The bound only stops a hang.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!server_.is_running() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
  const RequestRecord r =
      (*target)->Send({.prompt = "hello", .token_ids = {}, .prompt_len = 1, .max_tokens = 4});
  ASSERT_TRUE(r.success) << r.error << " body sent: " << server.last_body_;
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_EQ(r.prompt_tokens, 7);  // from usage
  // Only what a loaded machine cannot change: no chunk can arrive before
  // the server wrote it (so the server's delays are lower bounds), and the
  // gaps fit in the stream. A gap itself may be short when the client
  // reads two chunks at once.
  EXPECT_GE(r.ttft, kDelayMs * 1e-3);
  EXPECT_LT(r.ttft, 60.0);  // only catches a wrong time base
  ASSERT_EQ(r.itls.size(), 3u);
  double gaps = 0;
  for (double gap : r.itls) {
    EXPECT_GE(gap, 0);
    gaps += gap;
  }
  EXPECT_GE(r.e2e, 4 * kDelayMs * 1e-3);
  EXPECT_LE(r.ttft + gaps, r.e2e + 1e-9);
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
  const RequestRecord r =
      (*target)->Send({.prompt = "fail", .token_ids = {}, .prompt_len = 1, .max_tokens = 4});
  EXPECT_FALSE(r.success);
  EXPECT_THAT(r.error, HasSubstr("HTTP 500"));
  auto dead = MakeTarget("http://127.0.0.1:1", {.model = "", .timeout_s = 2});
  ASSERT_TRUE(dead.ok());
  const RequestRecord d =
      (*dead)->Send({.prompt = "x", .token_ids = {}, .prompt_len = 1, .max_tokens = 1});
  EXPECT_FALSE(d.success);
  EXPECT_THAT(d.error, HasSubstr("HTTP request failed"));
}

TEST(TargetTest, RejectsUnknownSchemes) {
  EXPECT_FALSE(MakeTarget("ftp://x", {}).ok());
  EXPECT_FALSE(MakeTarget("http://:80", {}).ok());
  EXPECT_TRUE(MakeTarget("grpc://127.0.0.1:1", {}).ok());
}

// Counts the most streams in flight at once. Each request is held until
// `gate` requests have been in flight together (so that a limit the runner
// allows is reached however the threads are scheduled), then takes
// `seconds` of the fake clock, if one is given.
class SlowTarget : public Target {
 public:
  SlowTarget(int gate, FakeRunClock* clock, double seconds)
      : gate_(gate), clock_(clock), seconds_(seconds) {}
  RequestRecord Send(const BenchRequest& request) override {
    {
      std::unique_lock lock(mu_);
      peak_ = std::max(peak_, ++in_flight_);
      gate_reached_.notify_all();
      // The bound only stops a hang of a runner that never allows `gate`.
      gate_reached_.wait_for(lock, std::chrono::seconds(60), [&] { return peak_ >= gate_; });
    }
    StreamTimer timer;
    if (clock_ != nullptr) clock_->Advance(seconds_);
    timer.OnTokens(request.max_tokens);
    {
      std::lock_guard lock(mu_);
      --in_flight_;
    }
    RequestRecord r;
    timer.Finish(r);
    r.success = true;
    return r;
  }
  int peak() {
    std::lock_guard lock(mu_);
    return peak_;
  }

 private:
  const int gate_;
  FakeRunClock* const clock_;
  const double seconds_;
  std::mutex mu_;
  std::condition_variable gate_reached_;
  int in_flight_ = 0;
  int peak_ = 0;
};

TEST(RunnerTest, FixedConcurrencyIsRespected) {
  SlowTarget target(/*gate=*/3, nullptr, 0);
  auto data = MakeDataset({.kind = "synthetic", .path = "", .input_len = 4, .output_len = 2});
  ASSERT_TRUE(data.ok());
  auto run = RunBenchmark(target, **data,
                          {.max_concurrency = 3, .num_requests = 30, .progress = false, .slo = {}});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->metrics.completed, 30);
  EXPECT_EQ(target.peak(), 3);
}

TEST(RunnerTest, PacesArrivalsAtTheRate) {
  auto target = MakeTarget("null://", {});
  auto data = MakeDataset({.kind = "synthetic", .path = "", .input_len = 4, .output_len = 8});
  ASSERT_TRUE(target.ok() && data.ok());
  FakeRunClock clock;
  auto run = RunBenchmark(**target, **data,
                          {.request_rate = 200,
                           .burstiness = 1,
                           .num_requests = 200,
                           .seed = 1,
                           .progress = false,
                           .slo = {},
                           .clock = &clock});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->metrics.completed, 200);
  EXPECT_EQ(run->metrics.total_output_tokens, 1600);
  // Each request starts at its arrival, from the same generator.
  ArrivalGenerator arrivals(200, 1, 1);
  double at = 0;
  ASSERT_EQ(run->records.size(), 200u);
  for (size_t i = 0; i < run->records.size(); ++i) {
    if (i > 0) at += arrivals.NextGap();
    EXPECT_NEAR(run->records[i].start, at, 1e-9) << "request " << i;
  }
  // 199 exponential gaps of mean 5 ms: about 1 s (5 sigma is +-0.35 s).
  EXPECT_NEAR(run->metrics.duration_s, at, 1e-9);
  EXPECT_GT(run->metrics.duration_s, 0.6);
  EXPECT_LT(run->metrics.duration_s, 1.6);
}

TEST(RunnerTest, DurationModeStopsSending) {
  // Each request takes 1/64 s of the fake clock (exact in binary, as are
  // the sums); 2 slots; 0.25 s. The runner sends while less than 0.25 s has
  // passed: 16 requests have ended by then, and at most one more was in
  // flight.
  FakeRunClock clock;
  SlowTarget target(/*gate=*/0, &clock, 1.0 / 64);
  auto data = MakeDataset({.kind = "synthetic", .path = "", .input_len = 4, .output_len = 2});
  auto run = RunBenchmark(
      target, **data,
      {.max_concurrency = 2, .duration_s = 0.25, .progress = false, .slo = {}, .clock = &clock});
  ASSERT_TRUE(run.ok()) << run.status();
  // Without the duration it would send num_requests (100).
  EXPECT_GE(run->metrics.completed, 16);
  EXPECT_LE(run->metrics.completed, 17);
  EXPECT_FALSE(RunBenchmark(target, **data, {.duration_s = 1, .progress = false, .slo = {}}).ok());
}

}  // namespace
}  // namespace tandem::bench
