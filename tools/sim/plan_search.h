// tandem-plan's search: which deployment meets a workload's latency SLOs
// with the fewest workers. A configuration is what deploy/local/cluster.sh
// and the Helm chart are given (pool sizes, the decode workers' schedule
// policy, chunk and step budget, the router's local-prefill threshold and
// routing policy, the KV type); an evaluator runs the workload on it (the
// simulator, on the production cores; a test's formula) and the search
// ranks what comes back. The search is pure: the same evaluator gives the
// same plan.
//
// The search, over `PlanSpace`:
//   1. pool sizes with the first value of every setting, from the fewest
//      workers up (every prefill/decode split of each total, colocated
//      included), until some split meets the SLOs (none within the budget:
//      step 2 from the closest split of the budget);
//   2. at that total, each setting's other values one at a time from the
//      best point so far (coordinate descent), until no change helps;
//   3. the splits of one worker fewer with the settings found, and step 2
//      from the best of them; when that meets the SLOs, it is the new best
//      and step 3 runs again.
// Every point evaluated joins the Pareto frontier of goodput per worker
// against the SLO ratio (the worst of each percentile over its target).
#ifndef TANDEM_TOOLS_SIM_PLAN_SEARCH_H_
#define TANDEM_TOOLS_SIM_PLAN_SEARCH_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/runner.h"
#include "tools/bench/stats.h"
#include "tools/sim/sim_cluster.h"
#include "tools/sim/sim_run.h"

namespace tandem::sim {

struct PlanConfig {
  int prefill = 0;  // 0: colocated (the decode workers prefill every prompt)
  int decode = 1;
  std::string schedule_policy = "decode_priority";
  int prefill_chunk_tokens = 512;
  int max_batch_tokens = 2048;
  int local_prefill_tokens = 0;
  std::string routing_policy = "prefix";
  std::string kv_dtype;  // empty: the tool's default

  int workers() const { return prefill + decode; }
  // The flags of each binary this configuration sets, in cluster.sh's
  // --decode_args, --prefill_args and --router_args words.
  std::string DecodeArgs() const;
  std::string PrefillArgs() const;
  std::string RouterArgs() const;
  // One line for a table, e.g. "1P+2D chunked/256 mbt 2048 local 0 prefix".
  std::string Describe() const;
  bool operator==(const PlanConfig&) const = default;
};

// What the search may vary; the first value of each list is where it
// starts. Empty lists are refused.
struct PlanSpace {
  int max_workers = 8;
  bool colocated = true;      // splits with no prefill worker
  bool disaggregated = true;  // splits with prefill workers
  std::vector<std::string> schedule_policies = {"decode_priority", "chunked", "prefill_first"};
  std::vector<int> prefill_chunk_tokens = {512, 256};  // with chunked only
  std::vector<int> max_batch_tokens = {2048};
  std::vector<int> local_prefill_tokens = {0};  // with prefill workers only
  std::vector<std::string> routing_policies = {"prefix", "load"};
  std::vector<std::string> kv_dtypes = {""};
};

// The SLOs (bench::Slo, in seconds) held at a percentile of the requests:
// TTFT, TPOT and E2E of the `percentile`th request each at most its target.
struct PlanTargets {
  bench::Slo slo;
  double percentile = 99;
};

// One configuration's outcome.
struct PlanPoint {
  PlanConfig config;
  bench::Metrics metrics;
  // The targets' percentile of each latency, in seconds.
  double ttft = 0, tpot = 0, e2e = 0;
  // The worst of ttft, tpot and e2e over its target (<= 1: met).
  double slo_ratio = 0;
  bool meets = false;  // every request succeeded and slo_ratio <= 1
  double goodput_per_worker = 0;
  std::string miss;  // why it does not meet them, for the table
};

struct PlanResult {
  std::vector<PlanPoint> points;  // in the order evaluated
  // The cheapest point that meets the SLOs (fewest workers, then most
  // goodput (within 1%: a tie), then the lowest SLO ratio); none when none
  // does.
  std::optional<int> chosen;
  // Its nearest rivals: the next best points of as many workers (then of
  // more) whose outcomes differ from its own and each other's, at most
  // two.
  std::vector<int> rivals;
  // The Pareto frontier, by workers then SLO ratio.
  std::vector<int> frontier;
  // With no chosen point, the one closest to the SLOs.
  std::optional<int> closest;
};

// Runs the workload on a configuration. Called from `jobs` threads at once:
// it must be thread-safe.
using PlanEvaluator = std::function<absl::StatusOr<bench::RunResult>(const PlanConfig&)>;

// The simulator as an evaluator: for each configuration, a SimCluster of
// `base(kv_dtype)`'s options with the configuration's pool sizes, then
// `base_args` and the configuration's own args applied (ApplyClusterArgs;
// colocated: every prompt prefilled on its decode worker), running
// `dataset` with `run` (RunSimulated, with `router_cpu`). `weights`,
// `dataset` and `base` must outlive it; `base` must be thread-safe.
struct PlanBaseArgs {
  std::string decode, prefill, router;
};
// Sets `config`'s pool sizes on `options` and applies `base_args`, then
// the configuration's own args (which win), as cluster.sh would pass them.
absl::Status ApplyPlanConfig(const PlanConfig& config, const PlanBaseArgs& base_args,
                             SimClusterOptions& options);
PlanEvaluator SimEvaluator(
    const ModelWeights& weights, const bench::Dataset& dataset, const bench::RunOptions& run,
    std::function<absl::StatusOr<SimClusterOptions>(const std::string& kv_dtype)> base,
    PlanBaseArgs base_args, RouterCpuModel router_cpu);

// The point `run` makes for `config` against `targets`.
PlanPoint MakePoint(const PlanConfig& config, const bench::RunResult& run,
                    const PlanTargets& targets);

// Searches `space` as the header says. INVALID_ARGUMENT for an empty list,
// no SLO, or a space with no split; the evaluator's first error.
absl::StatusOr<PlanResult> SearchPlan(const PlanSpace& space, const PlanTargets& targets,
                                      const PlanEvaluator& evaluate, int jobs = 1);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_PLAN_SEARCH_H_
