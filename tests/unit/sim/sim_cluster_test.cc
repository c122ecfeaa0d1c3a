// A whole cluster in one thread: the production router core, one prefill
// worker and two decode workers, each loop driven a round at a time, over
// in-process channels and a ManualExecutor on a fake clock. A batch of
// requests, disaggregated and colocated, gets exactly the tokens a lone
// engine computes; on a SimulatedExecutor every token arrives exactly when
// the cost model says.
#include "tools/sim/sim_cluster.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/engine/simulated_executor.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/sim/sim_test_util.h"

namespace tandem::sim {
namespace {

using ::testing::ElementsAreArray;

ModelConfig ClusterShape() { return testing::TinyShape(); }

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 7 + salt * 13 + 1) % 101);
  return p;
}

// One request's stream as the router's sink saw it, with the cluster's
// time of every token.
class Recorder final : public router::ResponseSink {
 public:
  explicit Recorder(const Clock* clock) : clock_(clock) {}

  bool OnEvent(router::GenerateEvent event) override {
    if (event.kind == router::GenerateEvent::Kind::kTokens) {
      for (int32_t id : event.token_ids) {
        tokens.push_back(id);
        times.push_back(clock_->Now());
      }
    } else if (event.kind == router::GenerateEvent::Kind::kFinished) {
      finished = event;
    }
    return true;
  }
  void OnDone(absl::Status s) override {
    done = true;
    status = std::move(s);
  }

  std::vector<int32_t> tokens;
  std::vector<absl::Time> times;
  router::GenerateEvent finished;
  bool done = false;
  absl::Status status;

 private:
  const Clock* clock_;
};

class SimClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { weights_ = MakeSyntheticModel(ClusterShape(), 7).value(); }

  SimClusterOptions Options() {
    SimClusterOptions o;
    o.prefill_workers = 1;
    o.decode_workers = 2;
    o.make_backend = testing::OneThread;
    o.prefill.kv_blocks = 64;
    o.decode.kv_blocks = 64;
    // Prompts of up to 8 tokens are prefilled on the decode worker.
    o.router.driver.local_prefill_tokens = 8;
    return o;
  }

  std::shared_ptr<Recorder> Submit(SimCluster& cluster, std::vector<int32_t> prompt, int max_tokens,
                                   float temperature = 0.0f) {
    router::GenerateParams p;
    p.token_ids = std::move(prompt);
    p.max_tokens = max_tokens;
    p.temperature = temperature;
    if (temperature > 0.0f) {
      p.top_p = 0.9f;
      p.seed = 1234;
    }
    auto sink = std::make_shared<Recorder>(&cluster.clock());
    handles_.push_back(cluster.core().Submit(std::move(p), sink));
    return sink;
  }

  // Every KV block of every worker is back (free or cached and unused).
  void ExpectAllBlocksFree(SimCluster& cluster) {
    ASSERT_OK(cluster.Poll());
    for (router::WorkerRole role : {router::WorkerRole::kPrefill, router::WorkerRole::kDecode}) {
      for (const router::WorkerSnapshot& s : cluster.registry().Snapshot(role)) {
        EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total) << s.address;
      }
    }
  }

  std::unique_ptr<ModelWeights> weights_;
  std::vector<std::shared_ptr<router::RequestHandle>> handles_;
};

// The engine's own tokens for `prompt`, computed alone.
std::vector<int32_t> EngineTokens(const ModelWeights& weights, const std::vector<int32_t>& prompt,
                                  int max_tokens, float temperature) {
  std::unique_ptr<Engine> engine =
      Engine::Create(weights, testing::OneThread(), EngineOptions{}).value();
  GenerateRequest request;
  request.prompt = prompt;
  request.max_new_tokens = max_tokens;
  request.sampling.temperature = temperature;
  if (temperature > 0.0f) {
    request.sampling.top_p = 0.9f;
    request.sampling.seed = 1234;
  }
  return Generate(*engine, request).value().tokens;
}

TEST_F(SimClusterTest, ABatchGetsTheEnginesTokensDisaggregatedAndColocated) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SimCluster> cluster,
                       SimCluster::Create(*weights_, Options()));
  struct Case {
    std::vector<int32_t> prompt;
    int max_tokens;
    float temperature;
    bool disaggregated;
  };
  const std::vector<Case> cases = {
      {Prompt(40, 1), 12, 0.0f, true}, {Prompt(6, 2), 9, 0.0f, false},
      {Prompt(33, 3), 7, 0.8f, true},  {Prompt(5, 4), 10, 0.8f, false},
      {Prompt(57, 5), 15, 0.0f, true}, {Prompt(8, 6), 5, 0.0f, false},
  };
  std::vector<std::shared_ptr<Recorder>> sinks;
  for (const Case& c : cases)
    sinks.push_back(Submit(*cluster, c.prompt, c.max_tokens, c.temperature));
  ASSERT_OK(cluster->RunUntil([&] {
    for (const auto& s : sinks) {
      if (!s->done) return false;
    }
    return true;
  }));
  std::map<std::string, int> decode_used;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ASSERT_OK(sinks[i]->status);
    EXPECT_THAT(sinks[i]->tokens,
                ElementsAreArray(EngineTokens(*weights_, cases[i].prompt, cases[i].max_tokens,
                                              cases[i].temperature)));
    EXPECT_EQ(sinks[i]->finished.disaggregated, cases[i].disaggregated);
    EXPECT_EQ(sinks[i]->finished.finish_reason, FinishReason::kLength);
    ++decode_used[sinks[i]->finished.decode_worker];
  }
  // Both decode workers served.
  EXPECT_EQ(decode_used.size(), 2u);
  ExpectAllBlocksFree(*cluster);
}

// On a SimulatedExecutor costing 10 ms a step plus 1 ms a token, with the
// cluster otherwise idle: a disaggregated 32-token prompt's first token
// comes after the prefill worker's one step (42 ms), each later one a
// decode step (11 ms) after the last; two short prompts arriving together
// run in parallel, one on each decode worker (16 ms each, not 16 then 32).
TEST_F(SimClusterTest, TimingsAreTheCostModels) {
  constexpr absl::Duration kFixed = absl::Milliseconds(10);
  constexpr absl::Duration kPerToken = absl::Milliseconds(1);
  SimClusterOptions options = Options();
  options.make_executor = [&](Engine& engine, FakeClock* clock) {
    return std::make_unique<SimulatedExecutor>(
        engine.config(), engine.step_limits(), &engine.block_pool(), clock,
        LinearStepCost{.fixed = kFixed, .per_token = kPerToken});
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SimCluster> cluster,
                       SimCluster::Create(*weights_, std::move(options)));
  const int vocab = ClusterShape().vocab_size;
  auto simulated = [vocab](const std::vector<int32_t>& prompt, int n) {
    std::vector<int32_t> out;
    int32_t last = prompt.back();
    for (int i = 0; i < n; ++i) {
      last = SimulatedNextToken(last, static_cast<int>(prompt.size()) + i - 1, vocab);
      out.push_back(last);
    }
    return out;
  };

  const absl::Time t0 = cluster->clock().Now();
  const std::vector<int32_t> long_prompt = Prompt(32, 9);
  std::shared_ptr<Recorder> remote = Submit(*cluster, long_prompt, 4);
  ASSERT_OK(cluster->RunUntil([&] { return remote->done; }));
  ASSERT_OK(remote->status);
  EXPECT_TRUE(remote->finished.disaggregated);
  EXPECT_THAT(remote->tokens, ElementsAreArray(simulated(long_prompt, 4)));
  const absl::Duration prefill = kFixed + 32 * kPerToken;
  const absl::Duration decode = kFixed + kPerToken;
  ASSERT_EQ(remote->times.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(remote->times[i] - t0, prefill + i * decode) << "token " << i;
  }

  const absl::Time t1 = cluster->clock().Now();
  std::shared_ptr<Recorder> a = Submit(*cluster, Prompt(6, 10), 3);
  std::shared_ptr<Recorder> b = Submit(*cluster, Prompt(6, 11), 3);
  ASSERT_OK(cluster->RunUntil([&] { return a->done && b->done; }));
  for (const auto& r : {a, b}) {
    ASSERT_OK(r->status);
    EXPECT_FALSE(r->finished.disaggregated);
    ASSERT_EQ(r->times.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(r->times[i] - t1, kFixed + 6 * kPerToken + i * decode) << "token " << i;
    }
  }
  EXPECT_NE(a->finished.decode_worker, b->finished.decode_worker);
  EXPECT_THAT(a->tokens, ElementsAreArray(simulated(Prompt(6, 10), 3)));
  ExpectAllBlocksFree(*cluster);
}

// Every step takes 10 ms.
std::unique_ptr<StepExecutor> TenMsSteps(Engine& engine, FakeClock* clock) {
  return std::make_unique<SimulatedExecutor>(engine.config(), engine.step_limits(),
                                             &engine.block_pool(), clock,
                                             LinearStepCost{.fixed = absl::Milliseconds(10)});
}

// The registry polls every worker's stats each poll interval while the
// cluster runs, as tandem-router does each --health_interval: halfway
// through a long stream, the router sees the decode worker's blocks in use.
TEST_F(SimClusterTest, TheRegistryPollsWhileTheClusterRuns) {
  for (const absl::Duration interval : {absl::ZeroDuration(), absl::Milliseconds(100)}) {
    SimClusterOptions options = Options();
    options.decode_workers = 1;
    options.poll_interval = interval;
    options.make_executor = TenMsSteps;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SimCluster> cluster,
                         SimCluster::Create(*weights_, std::move(options)));
    const absl::Time t0 = cluster->clock().Now();
    std::shared_ptr<Recorder> r = Submit(*cluster, Prompt(6, 1), 60);
    EXPECT_TRUE(absl::IsDeadlineExceeded(
        cluster->RunUntil([] { return false; }, t0 + absl::Milliseconds(350))));
    const router::WorkerSnapshot decode =
        cluster->registry().Snapshot(router::WorkerRole::kDecode)[0];
    if (interval == absl::ZeroDuration()) {
      EXPECT_EQ(decode.kv_blocks_free, decode.kv_blocks_total);
      EXPECT_EQ(decode.running, 0);
    } else {
      EXPECT_LT(decode.kv_blocks_free, decode.kv_blocks_total);
      EXPECT_EQ(decode.running, 1);
    }
    ASSERT_OK(cluster->RunUntil([&] { return r->done; }));
    ASSERT_OK(r->status);
  }
}

// The timeline: one request of 25 tokens, each a 10 ms step, alone on a
// colocated worker, sampled every 100 ms: the worker is busy through the
// first two samples and half of the third, and holds KV blocks as its
// sequence grows until it ends at 250 ms.
TEST_F(SimClusterTest, TheTimelineSamplesUtilisationQueuesAndKv) {
  SimClusterOptions options = Options();
  options.prefill_workers = 0;
  options.decode_workers = 1;
  options.sample_interval = absl::Milliseconds(100);
  options.make_executor = TenMsSteps;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SimCluster> cluster,
                       SimCluster::Create(*weights_, std::move(options)));
  const absl::Time t0 = cluster->clock().Now();
  std::shared_ptr<Recorder> r = Submit(*cluster, Prompt(6, 1), 25);
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      cluster->RunUntil([] { return false; }, t0 + absl::Milliseconds(350))));
  ASSERT_TRUE(r->done);
  EXPECT_EQ(r->times.back() - t0, absl::Milliseconds(250));
  const Timeline& timeline = cluster->timeline();
  ASSERT_EQ(timeline.workers, std::vector<std::string>{"decode-0:1"});
  ASSERT_EQ(timeline.samples.size(), 3u);
  const double busy[] = {1.0, 1.0, 0.5};
  const int kv_used[] = {1, 2, 0};
  for (size_t i = 0; i < 3; ++i) {
    const TimelineSample& t = timeline.samples[i];
    EXPECT_DOUBLE_EQ(t.t_s, 0.1 * static_cast<double>(i + 1)) << i;
    ASSERT_EQ(t.workers.size(), 1u);
    const WorkerSample& w = t.workers[0];
    EXPECT_DOUBLE_EQ(w.busy, busy[i]) << i;
    EXPECT_EQ(w.running, i < 2 ? 1 : 0) << i;
    EXPECT_EQ(w.waiting, 0) << i;
    EXPECT_EQ(w.kv_total, 64);
    // Blocks of 16 as the sequence grows: 16 tokens by 100 ms, 26 by 200.
    EXPECT_EQ(w.kv_used, kv_used[i]) << i;
    EXPECT_EQ(t.router_inflight, i < 2 ? 1 : 0) << i;
  }
  const nlohmann::json json = timeline.Json();
  EXPECT_EQ(json["samples"].size(), 3u);
  EXPECT_EQ(json["samples"][2]["workers"][0]["busy"], 0.5);
}

// A burst beyond the decode worker's --max_sequences: the requests it
// refuses as full wait in the router and are served as slots free, larger
// priority first; with no wait allowed (--queue_timeout 0) they are refused.
TEST_F(SimClusterTest, ABurstBeyondTheDecodeSlotsWaitsAndIsServedLargerPriorityFirst) {
  for (const bool wait : {true, false}) {
    SCOPED_TRACE(wait ? "waiting" : "no wait");
    SimClusterOptions options = Options();
    options.decode_workers = 1;
    options.decode.max_sequences = 4;
    options.make_executor = TenMsSteps;
    if (!wait) options.router.queue_timeout = absl::ZeroDuration();
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SimCluster> cluster,
                         SimCluster::Create(*weights_, std::move(options)));
    std::vector<std::shared_ptr<Recorder>> sinks;
    for (int i = 0; i < 13; ++i) {
      router::GenerateParams p;
      p.token_ids = Prompt(6, i);
      p.max_tokens = 5;
      p.priority = i == 12 ? 9 : 0;  // The last comes first among those waiting.
      sinks.push_back(std::make_shared<Recorder>(&cluster->clock()));
      handles_.push_back(cluster->core().Submit(std::move(p), sinks.back()));
    }
    ASSERT_OK(cluster->RunUntil([&] {
      return std::all_of(sinks.begin(), sinks.end(), [](const auto& s) { return s->done; });
    }));
    if (!wait) {
      int refused = 0;
      for (const auto& s : sinks) {
        if (absl::IsResourceExhausted(s->status)) ++refused;
      }
      EXPECT_EQ(refused, 9);
      continue;
    }
    for (size_t i = 0; i < sinks.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("request ", i));
      ASSERT_OK(sinks[i]->status);
      EXPECT_EQ(sinks[i]->tokens.size(), 5u);
    }
    // Four slots: the first four took them; of the nine that waited, the
    // priority-9 one went in the next four (it arrived last: in arrival
    // order it would have waited for the fourth round).
    for (size_t i = 4; i < 12; ++i) {
      EXPECT_LE(sinks[12]->times[0], sinks[i]->times[0]) << "request " << i;
    }
    EXPECT_EQ(sinks[12]->times[0], sinks[4]->times[0]);
    EXPECT_LT(sinks[12]->times[0], sinks[7]->times[0]);
    EXPECT_LT(sinks[7]->times[0], sinks[11]->times[0]);
    EXPECT_EQ(cluster->core().waiting_for_decode(), 0);
    ExpectAllBlocksFree(*cluster);
  }
}

}  // namespace
}  // namespace tandem::sim
