// tandem-bench's workload run against a simulated cluster (tools/sim/
// sim_run.h): on a cost model whose step times are known, every record's
// start, TTFT, gaps and end are the hand-computed ones; the arrival
// schedule is tandem-bench's; the concurrency limit holds; two runs give
// byte-identical results; what the simulator cannot do is refused.
#include "tools/sim/sim_run.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/simulated_executor.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/prefix_routing.h"
#include "router/router_metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/sim/sim_test_util.h"
#include "tools/bench/arrivals.h"
#include "tools/bench/report.h"
#include "tools/sim/stand_in_model.h"

namespace tandem::sim {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr absl::Duration kFixed = absl::Milliseconds(10);
constexpr absl::Duration kPerToken = absl::Milliseconds(1);
// Simulated times are exact; this only absorbs the conversion to seconds.
constexpr double kEps = 1e-9;

ModelConfig RunShape() { return testing::TinyShape(); }

class SimRunTest : public ::testing::Test {
 protected:
  void SetUp() override { weights_ = MakeSyntheticModel(RunShape(), 7).value(); }

  std::unique_ptr<SimCluster> Cluster(int prefill, int decode,
                                      std::optional<kvtransfer::LinkModel> link = std::nullopt,
                                      const ModelWeights* weights = nullptr,
                                      std::shared_ptr<router::PrefixRouter> prefix = nullptr,
                                      router::RequestLog* log = nullptr) {
    SimClusterOptions o;
    o.router.driver.prefix_router = std::move(prefix);
    o.router.driver.request_log = log;
    o.link = link;
    o.prefill_workers = prefill;
    o.decode_workers = decode;
    o.make_backend = testing::OneThread;
    o.prefill.kv_blocks = 64;
    o.decode.kv_blocks = 64;
    if (prefill == 0) o.router.driver.local_prefill_tokens = RunShape().seq_len;
    o.make_executor = [](Engine& engine, FakeClock* clock) {
      return std::make_unique<SimulatedExecutor>(
          engine.config(), engine.step_limits(), &engine.block_pool(), clock,
          LinearStepCost{.fixed = kFixed, .per_token = kPerToken});
    };
    return SimCluster::Create(weights != nullptr ? *weights : *weights_, std::move(o)).value();
  }

  static std::unique_ptr<bench::Dataset> Prompts(int input_len, int output_len) {
    return bench::MakeDataset({.kind = "synthetic",
                               .input_len = input_len,
                               .output_len = output_len,
                               .token_ids = true,
                               .vocab_size = 101,
                               .seed = 3})
        .value();
  }

  std::unique_ptr<ModelWeights> weights_;
};

// One request alone on a colocated decode worker: its 32-token prompt is
// one 42 ms step, which gives the first token; each of the 4 others is an
// 11 ms decode step.
TEST_F(SimRunTest, ARequestAloneTakesTheCostModelsTime) {
  auto cluster = Cluster(/*prefill=*/0, /*decode=*/1);
  ASSERT_OK_AND_ASSIGN(bench::RunResult run,
                       RunSimulated(*cluster, *Prompts(32, 5), {.num_requests = 1}));
  ASSERT_EQ(run.records.size(), 1u);
  const bench::RequestRecord& r = run.records[0];
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.prompt_tokens, 32);
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_THAT(r.ttft, DoubleNear(0.042, kEps));
  ASSERT_EQ(r.itls.size(), 4u);
  EXPECT_THAT(r.itls, Each(DoubleNear(0.011, kEps)));
  EXPECT_THAT(r.e2e, DoubleNear(0.042 + 4 * 0.011, kEps));
  EXPECT_EQ(run.metrics.completed, 1);
  EXPECT_THAT(run.metrics.tpot_ms.median, DoubleNear(11.0, 1e-6));
}

// With one request in flight at a time, each starts when the one before
// ends; disaggregated, the prompt's step runs on the prefill worker.
TEST_F(SimRunTest, AConcurrencyOfOneSendsEachRequestWhenThePreviousEnds) {
  auto cluster = Cluster(/*prefill=*/1, /*decode=*/1);
  ASSERT_OK_AND_ASSIGN(
      bench::RunResult run,
      RunSimulated(*cluster, *Prompts(32, 3), {.max_concurrency = 1, .num_requests = 3}));
  ASSERT_EQ(run.records.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const bench::RequestRecord& r = run.records[i];
    ASSERT_TRUE(r.success) << r.error;
    EXPECT_THAT(r.ttft, DoubleNear(0.042, kEps)) << i;
    EXPECT_THAT(r.e2e, DoubleNear(0.042 + 2 * 0.011, kEps)) << i;
    if (i > 0) {
      EXPECT_THAT(r.start, DoubleNear(run.records[i - 1].start + 0.064, kEps)) << i;
    }
  }
  EXPECT_THAT(run.metrics.duration_s, DoubleNear(3 * 0.064, kEps));
}

// Each request is sent on tandem-bench's schedule (the same seeded gamma
// gaps); one that arrives to an idle cluster takes the time it takes alone.
TEST_F(SimRunTest, RequestsAreSentOnTandemBenchsArrivalSchedule) {
  auto cluster = Cluster(/*prefill=*/1, /*decode=*/2);
  const bench::RunOptions options{.request_rate = 2, .num_requests = 6, .seed = 9};
  ASSERT_OK_AND_ASSIGN(bench::RunResult run, RunSimulated(*cluster, *Prompts(16, 2), options));
  bench::ArrivalGenerator arrivals(2, 1, 9);
  double start = 0;
  for (size_t i = 0; i < run.records.size(); ++i) {
    if (i > 0) start += arrivals.NextGap();
    const bench::RequestRecord& r = run.records[i];
    ASSERT_TRUE(r.success) << r.error;
    // Microsecond rounding of the send time.
    EXPECT_THAT(r.start, DoubleNear(start, 1e-6)) << i;
    // Alone, its prompt's step (10 ms + 16 tokens) gives the first token;
    // one sent while another was still running may wait behind it.
    const bool alone = i == 0 || r.start >= run.records[i - 1].start + run.records[i - 1].e2e;
    if (alone) {
      EXPECT_THAT(r.ttft, DoubleNear(0.026, kEps)) << i;
    } else {
      EXPECT_GE(r.ttft, 0.026 - kEps) << i;
    }
  }
}

// A replayed request log: each request at its logged time (from the
// first), cycled once the log is done, with its logged lengths.
TEST_F(SimRunTest, ARequestLogIsReplayedAtItsOwnTimes) {
  const std::string path = ::testing::TempDir() + "/sim_replay_requests.jsonl";
  {
    std::ofstream out(path);
    out << R"({"status":"ok","arrival_unix_us":5000000,"prompt_tokens":16,)"
        << R"("completion_tokens":3,"n":1})"
        << "\n"
        << R"({"status":"ok","arrival_unix_us":5400000,"prompt_tokens":20,)"
        << R"("completion_tokens":4,"n":1})"
        << "\n";
  }
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<bench::Dataset> log,
      bench::MakeDataset(
          {.kind = "request_log", .path = path, .token_ids = true, .vocab_size = 101, .seed = 1}));
  auto cluster = Cluster(/*prefill=*/1, /*decode=*/1);
  ASSERT_OK_AND_ASSIGN(bench::RunResult run,
                       RunSimulated(*cluster, *log, {.request_rate = 1000, .num_requests = 4}));
  // 0 and 0.4 s, then again one span and one gap (0.8 s) later.
  const double starts[] = {0, 0.4, 0.8, 1.2};
  const int outputs[] = {3, 4, 3, 4};
  ASSERT_EQ(run.records.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const bench::RequestRecord& r = run.records[i];
    ASSERT_TRUE(r.success) << r.error;
    EXPECT_THAT(r.start, DoubleNear(starts[i], 1e-6)) << i;
    EXPECT_EQ(r.output_tokens, outputs[i]) << i;
  }
}

// Over a link of 5 ms latency (and bandwidth to spare), the prefill
// worker's answer waits for the decode worker's receipt of the last layer:
// 42 ms of compute, the last layer's 5 ms there and the receipt's 5 ms
// back. The decode steps that follow are not slowed.
TEST_F(SimRunTest, AKvLinksLatencyDelaysTheFirstTokenByARoundTrip) {
  constexpr absl::Duration kLatency = absl::Milliseconds(5);
  auto cluster = Cluster(/*prefill=*/1, /*decode=*/1,
                         kvtransfer::LinkModel{.bandwidth = 1e15, .latency = kLatency});
  ASSERT_OK_AND_ASSIGN(bench::RunResult run,
                       RunSimulated(*cluster, *Prompts(32, 3), {.num_requests = 1}));
  const bench::RequestRecord& r = run.records[0];
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_THAT(r.ttft, DoubleNear(0.042 + 0.010, 1e-6));
  EXPECT_THAT(r.itls, Each(DoubleNear(0.011, 1e-6)));
  // A slow link: 1 MB/s makes the KV's bytes, not the latency, the cost.
  auto slow = Cluster(/*prefill=*/1, /*decode=*/1,
                      kvtransfer::LinkModel{.bandwidth = 1e6, .latency = kLatency});
  ASSERT_OK_AND_ASSIGN(bench::RunResult slow_run,
                       RunSimulated(*slow, *Prompts(32, 3), {.num_requests = 1}));
  ASSERT_TRUE(slow_run.records[0].success);
  EXPECT_GT(slow_run.records[0].ttft, r.ttft + 0.005);
}

// Workers holding the shape's stand-in (two-wide, one head) time a request
// as workers holding the shape itself do: the link carries the stand-in's
// KV scaled to the shape's bytes, here at 1 MB/s, where the bytes are most
// of the first token's wait.
TEST_F(SimRunTest, AStandInModelTimesRequestsAsTheModelDoes) {
  const kvtransfer::LinkModel link{.bandwidth = 1e6, .latency = absl::Milliseconds(1)};
  auto real = Cluster(/*prefill=*/1, /*decode=*/1, link);
  ASSERT_OK_AND_ASSIGN(bench::RunResult want,
                       RunSimulated(*real, *Prompts(32, 3), {.num_requests = 2}));
  const std::unique_ptr<ModelWeights> stand_in =
      MakeSyntheticModel(StandInConfig(RunShape()), 7).value();
  kvtransfer::LinkModel scaled = link;
  scaled.byte_scale = KvByteScale(RunShape(), DType::kF32, DType::kF32);
  EXPECT_EQ(scaled.byte_scale, 16);
  auto sim = Cluster(/*prefill=*/1, /*decode=*/1, scaled, stand_in.get());
  ASSERT_OK_AND_ASSIGN(bench::RunResult got,
                       RunSimulated(*sim, *Prompts(32, 3), {.num_requests = 2}));
  ASSERT_EQ(got.records.size(), want.records.size());
  for (size_t i = 0; i < got.records.size(); ++i) {
    ASSERT_TRUE(got.records[i].success) << got.records[i].error;
    // 32 tokens of 768 bytes take 24.6 ms; headers differ by a few bytes.
    EXPECT_GT(want.records[i].ttft, 0.042 + 0.024);
    EXPECT_THAT(got.records[i].ttft, DoubleNear(want.records[i].ttft, 1e-4)) << i;
    EXPECT_THAT(got.records[i].e2e, DoubleNear(want.records[i].e2e, 1e-4)) << i;
  }
}

// The router's CPU: 3 ms to take a request in, 1 ms per token passed on.
// A lone colocated request reaches the core at 3 ms, its first token
// leaves the decode worker at 45 ms and the client at 46; the others
// follow one decode step (11 ms) apart.
TEST_F(SimRunTest, TheRoutersCpuTimeDelaysWhatPassesThroughIt) {
  auto cluster = Cluster(/*prefill=*/0, /*decode=*/1);
  const RouterCpuModel cpu{.per_request = absl::Milliseconds(3),
                           .per_token = absl::Milliseconds(1)};
  ASSERT_OK_AND_ASSIGN(bench::RunResult run,
                       RunSimulated(*cluster, *Prompts(32, 5), {.num_requests = 1}, cpu));
  const bench::RequestRecord& r = run.records[0];
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_THAT(r.ttft, DoubleNear(0.046, kEps));
  EXPECT_THAT(r.itls, Each(DoubleNear(0.011, kEps)));
  EXPECT_THAT(r.e2e, DoubleNear(0.046 + 4 * 0.011, kEps));
}

// The hops' latency moves a stream's times alike and queues nothing: ten
// requests sent at once on two workers each reach the core 2 ms later, so
// each TTFT is what it is without it plus 2 ms, and the gaps are the same.
TEST_F(SimRunTest, TheHopsLatencyMovesEveryStreamAlike) {
  std::vector<bench::RunResult> runs;
  for (const absl::Duration latency : {absl::ZeroDuration(), absl::Milliseconds(2)}) {
    auto cluster = Cluster(/*prefill=*/0, /*decode=*/2);
    ASSERT_OK_AND_ASSIGN(bench::RunResult run,
                         RunSimulated(*cluster, *Prompts(16, 3), {.num_requests = 10},
                                      RouterCpuModel{.hop_latency = latency}));
    runs.push_back(std::move(run));
  }
  for (size_t i = 0; i < 10; ++i) {
    const bench::RequestRecord &a = runs[0].records[i], &b = runs[1].records[i];
    ASSERT_TRUE(a.success && b.success) << i;
    EXPECT_THAT(b.ttft, DoubleNear(a.ttft + 0.002, kEps)) << i;
    EXPECT_THAT(b.e2e, DoubleNear(a.e2e + 0.002, kEps)) << i;
    EXPECT_EQ(b.itls.size(), a.itls.size());
    for (size_t k = 0; k < a.itls.size(); ++k) EXPECT_THAT(b.itls[k], DoubleNear(a.itls[k], kEps));
  }
  auto cluster = Cluster(/*prefill=*/0, /*decode=*/1);
  EXPECT_THAT(RunSimulated(*cluster, *Prompts(16, 2), {.num_requests = 1},
                           RouterCpuModel{.hop_latency = absl::Milliseconds(-1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hop latency")));
}

// A router whose one thread needs 50 ms per request saturates: ten sent at
// once reach the core 50 ms apart, and each waits for all before it.
TEST_F(SimRunTest, ASaturatedRouterQueuesRequests) {
  auto cluster = Cluster(/*prefill=*/1, /*decode=*/2);
  ASSERT_OK_AND_ASSIGN(
      bench::RunResult run,
      RunSimulated(*cluster, *Prompts(16, 2), {.num_requests = 10},
                   RouterCpuModel{.per_request = absl::Milliseconds(50), .threads = 1}));
  for (size_t i = 0; i < run.records.size(); ++i) {
    ASSERT_TRUE(run.records[i].success) << run.records[i].error;
    EXPECT_GE(run.records[i].ttft, 0.050 * (i + 1)) << i;
    EXPECT_LT(run.records[i].ttft, 0.050 * (i + 1) + 0.050) << i;
  }
  EXPECT_THAT(
      RunSimulated(*cluster, *Prompts(16, 2), {.num_requests = 1}, RouterCpuModel{.threads = 0}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("thread")));
}

// A conversation's turns on a colocated worker: each is sent 100 ms (the
// think time) after the previous one's last token, and its prompt begins
// with the previous turn's, whose whole blocks the worker's prefix cache
// still holds: turn 1's 66 tokens compute 34 (32 cached), turn 2's 100
// compute 36 (64 cached).
TEST_F(SimRunTest, AConversationsTurnsFollowEachOtherAndReuseTheirPrefix) {
  auto cluster = Cluster(/*prefill=*/0, /*decode=*/1);
  std::unique_ptr<bench::Dataset> chats = bench::MakeDataset({.kind = "multi_turn",
                                                              .input_len = 32,
                                                              .output_len = 2,
                                                              .turns = 3,
                                                              .think_time_s = 0.1,
                                                              .token_ids = true,
                                                              .vocab_size = 101})
                                              .value();
  ASSERT_OK_AND_ASSIGN(bench::RunResult run, RunSimulated(*cluster, *chats, {.num_requests = 3}));
  ASSERT_EQ(run.records.size(), 3u);
  const int prompts[] = {32, 66, 100};
  const double ttfts[] = {0.042, 0.044, 0.046};
  double start = 0;
  for (size_t i = 0; i < 3; ++i) {
    const bench::RequestRecord& r = run.records[i];
    ASSERT_TRUE(r.success) << r.error;
    EXPECT_EQ(r.prompt_tokens, prompts[i]) << i;
    EXPECT_THAT(r.start, DoubleNear(start, kEps)) << i;
    EXPECT_THAT(r.ttft, DoubleNear(ttfts[i], kEps)) << i;
    EXPECT_THAT(r.e2e, DoubleNear(ttfts[i] + 0.011, kEps)) << i;
    start += r.e2e + 0.1;
  }
}

// Four conversations at once on two colocated workers: prefix routing
// (the router's default policy) sends each later turn to the worker that
// holds its conversation, so every turn finds its previous turn's blocks
// there (the router's log says how many tokens were cached); routing by
// load alone does not. Affinity weighs heavily here (4 tokens a request).
TEST_F(SimRunTest, PrefixRoutingKeepsAConversationOnTheWorkerHoldingIt) {
  for (const bool by_prefix : {true, false}) {
    const std::string path = absl::StrCat(::testing::TempDir(), "/sim_chats_", by_prefix, ".jsonl");
    std::remove(path.c_str());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<router::RequestLog> log, router::RequestLog::Open(path));
    auto cluster = Cluster(/*prefill=*/0, /*decode=*/2, std::nullopt, nullptr,
                           by_prefix ? std::make_shared<router::PrefixRouter>(
                                           router::PrefixRoutingOptions{.load_tokens = 4})
                                     : nullptr,
                           log.get());
    std::unique_ptr<bench::Dataset> chats = bench::MakeDataset({.kind = "multi_turn",
                                                                .input_len = 24,
                                                                .output_len = 6,
                                                                .range_ratio = 0.5,
                                                                .turns = 3,
                                                                .think_time_s = 0.1,
                                                                .token_ids = true,
                                                                .vocab_size = 101})
                                                .value();
    // By prompt length (distinct here): the whole blocks of the previous
    // turn's prompt (its reply's stand-in is not what the worker
    // generated, so the blocks that hold the reply differ); none for a
    // first turn.
    std::map<int, int> cached;
    for (int i = 0; i < 12; ++i) {
      const bench::BenchRequest r = chats->Get(i);
      int blocks = 0;
      if (r.follows >= 0) {
        const bench::BenchRequest prev = chats->Get(r.follows);
        blocks = prev.prompt_len / 16;
      }
      ASSERT_TRUE(cached.emplace(r.prompt_len, 16 * blocks).second) << i;
    }
    ASSERT_OK_AND_ASSIGN(bench::RunResult run,
                         RunSimulated(*cluster, *chats, {.num_requests = 12}));
    EXPECT_EQ(run.metrics.completed, 12);
    cluster.reset();
    log.reset();
    std::ifstream in(path);
    std::string line;
    int lines = 0, hits = 0;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      ++lines;
      hits += j["cached_tokens"] == cached.at(j["prompt_tokens"].get<int>());
    }
    EXPECT_EQ(lines, 12);
    if (by_prefix) {
      EXPECT_EQ(hits, 12);
    } else {
      EXPECT_LT(hits, 12);
    }
  }
}

TEST_F(SimRunTest, TheSameInputsGiveByteIdenticalResults) {
  const bench::RunOptions options{.request_rate = 40, .num_requests = 30, .seed = 4};
  std::string first;
  for (int i = 0; i < 2; ++i) {
    auto cluster = Cluster(/*prefill=*/1, /*decode=*/2);
    ASSERT_OK_AND_ASSIGN(bench::RunResult run, RunSimulated(*cluster, *Prompts(40, 12), options));
    EXPECT_EQ(run.metrics.completed, 30);
    const std::string json = bench::ResultJson({run}, {{"target", "tandem-sim"}}).dump();
    if (i == 0) {
      first = json;
    } else {
      EXPECT_EQ(json, first);
    }
  }
}

// A prompt larger than every worker's KV pool can never run: it fails at
// once with an error that names the pool, and the run goes on.
TEST_F(SimRunTest, APromptNoPoolCanHoldFailsClearly) {
  SimClusterOptions o;
  o.prefill_workers = 0;
  o.decode_workers = 2;
  o.make_backend = testing::OneThread;
  o.decode.kv_blocks = 4;  // 64 tokens.
  o.router.driver.local_prefill_tokens = RunShape().seq_len;
  o.make_executor = [](Engine& engine, FakeClock* clock) {
    return std::make_unique<SimulatedExecutor>(
        engine.config(), engine.step_limits(), &engine.block_pool(), clock,
        LinearStepCost{.fixed = kFixed, .per_token = kPerToken});
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SimCluster> cluster,
                       SimCluster::Create(*weights_, std::move(o)));
  ASSERT_OK_AND_ASSIGN(bench::RunResult run,
                       RunSimulated(*cluster, *Prompts(100, 4), {.num_requests = 2}));
  ASSERT_EQ(run.records.size(), 2u);
  for (const bench::RequestRecord& r : run.records) {
    EXPECT_FALSE(r.success);
    EXPECT_THAT(r.error, HasSubstr("block"));
  }
  EXPECT_EQ(run.metrics.failed, 2);
}

TEST_F(SimRunTest, WhatOnlyARealClientDoesIsRefused) {
  auto cluster = Cluster(/*prefill=*/1, /*decode=*/1);
  EXPECT_THAT(RunSimulated(*cluster, *Prompts(8, 2), {.waves = true, .num_requests = 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("waves")));
  EXPECT_THAT(RunSimulated(*cluster, *Prompts(8, 2), {.num_requests = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_requests")));
  std::unique_ptr<bench::Dataset> text =
      bench::MakeDataset({.kind = "synthetic", .token_ids = false, .seed = 1}).value();
  EXPECT_THAT(RunSimulated(*cluster, *text, {.num_requests = 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token ids")));
}

}  // namespace
}  // namespace tandem::sim
