// tandem-plan's search (tools/sim/plan_search.h) on a formula whose answer
// is known by brute force, and on the simulator itself; and what it writes
// (tools/sim/plan_output.h).
#include "tools/sim/plan_search.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/engine/simulated_executor.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/sim/sim_test_util.h"
#include "tools/sim/cluster_args.h"
#include "tools/sim/plan_output.h"

namespace tandem::sim {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::HasSubstr;

// A cluster as a formula: the first token takes 1 / (decode + 2 prefill)
// seconds (half with the chunked policy), each later one 0.1 / decode.
// Ten requests of ten tokens, all alike, over one second.
bench::RunResult Formula(const PlanConfig& c, const bench::Slo& slo) {
  const double ttft = (c.schedule_policy == "chunked" ? 0.5 : 1.0) / (c.decode + 2 * c.prefill);
  const double tpot = 0.1 / c.decode;
  bench::RunResult run;
  for (int i = 0; i < 10; ++i) {
    bench::RequestRecord r;
    r.success = true;
    r.ttft = ttft;
    r.output_tokens = 10;
    r.e2e = ttft + 9 * tpot;
    r.itls.assign(9, tpot);
    run.records.push_back(r);
  }
  run.metrics = bench::ComputeMetrics(run.records, 1.0, slo);
  return run;
}

PlanTargets Targets(double ttft, double tpot) {
  PlanTargets t;
  t.slo.ttft = ttft;
  t.slo.tpot = tpot;
  return t;
}

PlanEvaluator FormulaEvaluator(const PlanTargets& targets) {
  return [slo = targets.slo](const PlanConfig& c) { return Formula(c, slo); };
}

// Every configuration of `space` of at most `workers` workers, as the
// search would spell it.
std::vector<PlanConfig> Everything(const PlanSpace& space, int workers) {
  std::vector<PlanConfig> out;
  for (int n = 1; n <= workers; ++n) {
    for (int p = 0; p < n; ++p) {
      for (const std::string& policy : space.schedule_policies) {
        for (int chunk : space.prefill_chunk_tokens) {
          PlanConfig c;
          c.prefill = p;
          c.decode = n - p;
          c.schedule_policy = policy;
          c.prefill_chunk_tokens = chunk;
          out.push_back(c);
        }
      }
    }
  }
  return out;
}

// The formula needs 3 decode workers for its TPOT; the TTFT then needs 5
// "prefill units" without chunking (1P+3D: four workers) but 2.5 with it
// (3x colocated, chunked). The search starts without chunking, finds four
// workers, and then three with the chunked policy: the fewest by brute
// force.
TEST(PlanSearch, FindsTheFewestWorkersThatMeetTheSlos) {
  const PlanSpace space;
  const PlanTargets targets = Targets(0.2, 0.04);
  ASSERT_OK_AND_ASSIGN(const PlanResult r, SearchPlan(space, targets, FormulaEvaluator(targets)));
  ASSERT_TRUE(r.chosen.has_value());
  const PlanPoint& chosen = r.points[*r.chosen];
  EXPECT_TRUE(chosen.meets);
  EXPECT_EQ(chosen.config.Describe(), "3x colocated chunked/512 mbt 2048 prefix");
  int fewest = 100;
  for (const PlanConfig& c : Everything(space, space.max_workers)) {
    if (MakePoint(c, Formula(c, targets.slo), targets).meets)
      fewest = std::min(fewest, c.workers());
  }
  EXPECT_EQ(chosen.config.workers(), fewest);
  // Four workers met them first, without chunking.
  EXPECT_TRUE(std::any_of(r.points.begin(), r.points.end(), [](const PlanPoint& p) {
    return p.meets && p.config.workers() == 4 && p.config.schedule_policy == "decode_priority";
  }));
}

TEST(PlanSearch, EvaluatesEachConfigurationOnceFromManyThreads) {
  const PlanTargets targets = Targets(0.2, 0.04);
  absl::Mutex mu;
  std::map<std::string, int> calls;
  const PlanEvaluator count = [&](const PlanConfig& c) {
    absl::MutexLock lock(&mu);
    ++calls[absl::StrCat(c.Describe(), " ", c.prefill, "/", c.decode)];
    return Formula(c, targets.slo);
  };
  ASSERT_OK_AND_ASSIGN(const PlanResult r, SearchPlan(PlanSpace{}, targets, count, /*jobs=*/4));
  EXPECT_EQ(calls.size(), r.points.size());
  for (const auto& [config, n] : calls) EXPECT_EQ(n, 1) << config;
}

// A chunk size acts only with the chunked policy, a local-prefill
// threshold only with prefill workers: the search never varies them where
// they do not act.
TEST(PlanSearch, SettingsThatDoNotActAreNotVaried) {
  PlanSpace space;
  space.local_prefill_tokens = {0, 64};
  const PlanTargets targets = Targets(0.2, 0.04);
  ASSERT_OK_AND_ASSIGN(const PlanResult r, SearchPlan(space, targets, FormulaEvaluator(targets)));
  for (const PlanPoint& p : r.points) {
    if (p.config.schedule_policy != "chunked") {
      EXPECT_EQ(p.config.prefill_chunk_tokens, 512);
    }
    if (p.config.prefill == 0) {
      EXPECT_EQ(p.config.local_prefill_tokens, 0);
    }
  }
}

TEST(PlanSearch, WithNoDeploymentInTheBudgetItNamesTheClosest) {
  PlanSpace space;
  space.max_workers = 3;
  const PlanTargets targets = Targets(0.2, 0.001);
  ASSERT_OK_AND_ASSIGN(const PlanResult r, SearchPlan(space, targets, FormulaEvaluator(targets)));
  EXPECT_FALSE(r.chosen.has_value());
  ASSERT_TRUE(r.closest.has_value());
  for (const PlanPoint& p : r.points) {
    EXPECT_FALSE(p.meets);
    EXPECT_LE(r.points[*r.closest].slo_ratio, p.slo_ratio);
  }
  EXPECT_LE(r.points[*r.closest].config.workers(), 3);
}

TEST(PlanSearch, TheFrontierHoldsExactlyTheUndominatedPoints) {
  const PlanTargets targets = Targets(0.2, 0.04);
  ASSERT_OK_AND_ASSIGN(const PlanResult r,
                       SearchPlan(PlanSpace{}, targets, FormulaEvaluator(targets)));
  ASSERT_FALSE(r.frontier.empty());
  for (size_t i = 0; i < r.points.size(); ++i) {
    const PlanPoint& p = r.points[i];
    const bool dominated = std::any_of(r.points.begin(), r.points.end(), [&](const PlanPoint& q) {
      return q.goodput_per_worker >= p.goodput_per_worker && q.slo_ratio <= p.slo_ratio &&
             (q.goodput_per_worker > p.goodput_per_worker || q.slo_ratio < p.slo_ratio);
    });
    const bool on = std::count(r.frontier.begin(), r.frontier.end(), static_cast<int>(i)) == 1;
    EXPECT_EQ(on, !dominated) << p.config.Describe();
  }
}

// Rivals come from as many workers first and never repeat an outcome (a
// setting that changed nothing is the same deployment for a client).
TEST(PlanSearch, RivalsAreTheNextBestWithOtherOutcomes) {
  const PlanTargets targets = Targets(0.2, 0.04);
  ASSERT_OK_AND_ASSIGN(const PlanResult r,
                       SearchPlan(PlanSpace{}, targets, FormulaEvaluator(targets)));
  ASSERT_TRUE(r.chosen.has_value());
  ASSERT_EQ(r.rivals.size(), 2u);
  const PlanPoint& c = r.points[*r.chosen];
  std::vector<const PlanPoint*> seen = {&c};
  for (int id : r.rivals) {
    const PlanPoint& p = r.points[id];
    EXPECT_GE(p.config.workers(), c.config.workers());
    for (const PlanPoint* s : seen) {
      EXPECT_FALSE(p.ttft == s->ttft && p.tpot == s->tpot) << p.config.Describe();
    }
    seen.push_back(&p);
  }
  // The formula's routing policy changes nothing: "load" is never a rival.
  for (int id : r.rivals) EXPECT_EQ(r.points[id].config.routing_policy, "prefix");
}

TEST(PlanSearch, RefusesWhatCannotBeSearched) {
  const PlanTargets targets = Targets(0.2, 0.04);
  const PlanEvaluator f = FormulaEvaluator(targets);
  EXPECT_THAT(SearchPlan(PlanSpace{}, PlanTargets{}, f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least one SLO")));
  PlanSpace empty;
  empty.routing_policies.clear();
  EXPECT_THAT(SearchPlan(empty, targets, f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least one value")));
  PlanSpace none;
  none.max_workers = 0;
  EXPECT_THAT(SearchPlan(none, targets, f), StatusIs(absl::StatusCode::kInvalidArgument));
  PlanSpace no_split;
  no_split.colocated = false;
  no_split.max_workers = 1;
  EXPECT_THAT(SearchPlan(no_split, targets, f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no split")));
  const PlanEvaluator failing = [](const PlanConfig&) -> absl::StatusOr<bench::RunResult> {
    return absl::InvalidArgumentError("the workload does not fit");
  };
  EXPECT_THAT(SearchPlan(PlanSpace{}, targets, failing),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1x colocated decode_priority mbt 2048 prefix: the workload")));
}

// TTFTs of 1 to 100 ms: the 99th percentile is 99.01 ms (numpy's linear
// interpolation), inside a 100 ms target; one failed request fails the
// point whatever its latencies.
TEST(PlanPoint, HoldsThePercentileToItsTargetAndNeedsEveryRequest) {
  bench::RunResult run;
  for (int i = 1; i <= 100; ++i) {
    bench::RequestRecord r;
    r.success = true;
    r.ttft = i / 1000.0;
    r.e2e = r.ttft + 0.05;
    r.output_tokens = 6;
    run.records.push_back(r);
  }
  PlanTargets targets = Targets(0.1, 0.011);
  run.metrics = bench::ComputeMetrics(run.records, 10.0, targets.slo);
  PlanConfig c;
  c.decode = 2;
  PlanPoint p = MakePoint(c, run, targets);
  EXPECT_THAT(p.ttft, DoubleNear(0.09901, 1e-9));
  EXPECT_THAT(p.tpot, DoubleNear(0.01, 1e-9));
  EXPECT_TRUE(p.meets) << p.miss;
  EXPECT_THAT(p.slo_ratio, DoubleNear(0.9901, 1e-9));
  EXPECT_THAT(p.goodput_per_worker, DoubleNear(5.0, 1e-9));

  EXPECT_FALSE(MakePoint(c, run, Targets(0.099, 0.011)).meets);
  bench::RequestRecord failed;
  failed.error = "UNAVAILABLE";
  run.records.push_back(failed);
  run.metrics = bench::ComputeMetrics(run.records, 10.0, targets.slo);
  p = MakePoint(c, run, Targets(0.1, 0.011));
  EXPECT_FALSE(p.meets);
  EXPECT_THAT(p.miss, HasSubstr("1 failed"));
}

PlanConfig OneAndTwo() {
  PlanConfig c;
  c.prefill = 1;
  c.decode = 2;
  c.schedule_policy = "chunked";
  c.prefill_chunk_tokens = 256;
  c.max_batch_tokens = 1024;
  c.local_prefill_tokens = 32;
  c.routing_policy = "load";
  c.kv_dtype = "bf16";
  return c;
}

// What the plan writes is what the simulator ran: the configuration's
// args, applied as the simulator applies them, set exactly its settings.
TEST(PlanConfig, ItsArgsAreTheSettingsTheSimulatorApplies) {
  const PlanConfig c = OneAndTwo();
  SimClusterOptions o;
  ASSERT_OK(ApplyClusterArgs(ArgsRole::kDecode, c.DecodeArgs(), o));
  ASSERT_OK(ApplyClusterArgs(ArgsRole::kPrefill, c.PrefillArgs(), o));
  ASSERT_OK(ApplyClusterArgs(ArgsRole::kRouter, c.RouterArgs(), o));
  EXPECT_EQ(o.decode.schedule_policy, decode::SchedulePolicyKind::kChunked);
  EXPECT_EQ(o.decode.prefill_chunk_tokens, 256);
  EXPECT_EQ(o.decode.max_batch_tokens, 1024);
  EXPECT_EQ(o.prefill.max_batch_tokens, 1024);
  EXPECT_EQ(o.router.driver.local_prefill_tokens, 32);
  EXPECT_EQ(o.router.driver.prefix_router, nullptr);
}

TEST(PlanOutput, TheClusterCommandAndHelmValuesCarryTheConfiguration) {
  const PlanConfig c = OneAndTwo();
  const PlanBaseArgs base{.decode = "--kv_blocks 512", .prefill = "", .router = ""};
  EXPECT_EQ(ClusterCommand(c, base),
            "deploy/local/cluster.sh up --prefill 1 --decode 2 --kv_dtype bf16 --decode_args "
            "'--kv_blocks 512 --schedule_policy chunked --max_batch_tokens 1024 "
            "--prefill_chunk_tokens 256' --prefill_args '--max_batch_tokens 1024' --router_args "
            "'--routing_policy load --local_prefill_tokens 32'");
  EXPECT_EQ(HelmValues(c, base, "planned\nat 4 req/s"),
            "# planned\n"
            "# at 4 req/s\n"
            "model:\n"
            "  kvDtype: \"bf16\"\n"
            "router:\n"
            "  flags:\n"
            "    routing_policy: \"load\"\n"
            "    local_prefill_tokens: \"32\"\n"
            "  extraArgs: []\n"
            "prefill:\n"
            "  enabled: true\n"
            "  replicas: 1\n"
            "  flags:\n"
            "    max_batch_tokens: \"1024\"\n"
            "  extraArgs: []\n"
            "decode:\n"
            "  replicas: 2\n"
            "  flags:\n"
            "    schedule_policy: \"chunked\"\n"
            "    max_batch_tokens: \"1024\"\n"
            "    prefill_chunk_tokens: \"256\"\n"
            "  extraArgs:\n"
            "    - \"--kv_blocks=512\"\n");
  // A flag alone and one written with '=' stay as they are.
  EXPECT_THAT(
      HelmValues(c, {.decode = "--noprefix_cache --max_sequences=8", .prefill = "", .router = ""},
                 ""),
      HasSubstr("  extraArgs:\n    - \"--noprefix_cache\"\n    - \"--max_sequences=8\"\n"));
  PlanConfig colocated;
  colocated.decode = 3;
  EXPECT_THAT(HelmValues(colocated, {}, ""), HasSubstr("prefill:\n  enabled: false\ndecode:\n"));
  EXPECT_EQ(ClusterCommand(colocated, {}),
            "deploy/local/cluster.sh up --prefill 0 --decode 3 --decode_args '--schedule_policy "
            "decode_priority --max_batch_tokens 2048' --router_args '--routing_policy prefix'");
}

// The search on the simulator itself (a 10 ms + 1 ms per token cost model):
// 40 requests of 32 prompt and 8 output tokens at 40 per second overload
// one worker; the plan is the same on every run, meets its SLOs, and the
// chosen configuration run again gives the same figures.
TEST(PlanSearch, OnTheSimulatorThePlanMeetsItsSlosAndRepeats) {
  const ModelConfig shape = testing::TinyShape();
  const std::unique_ptr<ModelWeights> weights = MakeSyntheticModel(shape, 7).value();
  const std::unique_ptr<bench::Dataset> data = bench::MakeDataset({.kind = "synthetic",
                                                                   .input_len = 32,
                                                                   .output_len = 8,
                                                                   .token_ids = true,
                                                                   .vocab_size = 101,
                                                                   .seed = 3})
                                                   .value();
  PlanTargets targets = Targets(0.1, 0.03);
  bench::RunOptions run{.request_rate = 40, .num_requests = 40, .seed = 5, .progress = false};
  run.slo = targets.slo;
  const PlanEvaluator evaluate = SimEvaluator(
      *weights, *data, run,
      [](const std::string&) -> absl::StatusOr<SimClusterOptions> {
        SimClusterOptions o;
        o.make_backend = testing::OneThread;
        o.prefill.kv_blocks = o.decode.kv_blocks = 64;
        o.make_executor = [](Engine& engine, FakeClock* clock) {
          return std::make_unique<SimulatedExecutor>(
              engine.config(), engine.step_limits(), &engine.block_pool(), clock,
              LinearStepCost{.fixed = absl::Milliseconds(10), .per_token = absl::Milliseconds(1)});
        };
        return o;
      },
      {}, {});
  PlanSpace space;
  space.max_workers = 4;
  ASSERT_OK_AND_ASSIGN(const PlanResult a, SearchPlan(space, targets, evaluate, /*jobs=*/2));
  ASSERT_OK_AND_ASSIGN(const PlanResult b, SearchPlan(space, targets, evaluate, /*jobs=*/1));
  ASSERT_TRUE(a.chosen.has_value());
  const PlanPoint& chosen = a.points[*a.chosen];
  EXPECT_TRUE(chosen.meets) << chosen.miss;
  EXPECT_GT(chosen.config.workers(), 1);
  EXPECT_FALSE(a.points.front().meets) << "one worker should not keep up";
  ASSERT_TRUE(b.chosen.has_value());
  EXPECT_EQ(b.points[*b.chosen].config, chosen.config);
  ASSERT_OK_AND_ASSIGN(const bench::RunResult again, evaluate(chosen.config));
  const PlanPoint repeat = MakePoint(chosen.config, again, targets);
  EXPECT_EQ(repeat.ttft, chosen.ttft);
  EXPECT_EQ(repeat.tpot, chosen.tpot);
  EXPECT_EQ(repeat.metrics.completed, 40);
}

}  // namespace
}  // namespace tandem::sim
