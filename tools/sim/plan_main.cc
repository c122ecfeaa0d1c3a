// tandem-plan: the cheapest deployment that meets a workload's latency
// SLOs, found by running the workload through tandem-sim's cluster (the
// production router and worker cores on a cost model) over pool sizes and
// settings (plan_search.h). Prints what it evaluated, the Pareto frontier,
// the chosen deployment with its predicted distributions, and that
// deployment as deploy/local/cluster.sh's command and as Helm values.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "tools/bench/workload_flags.h"
#include "tools/sim/plan_online.h"
#include "tools/sim/plan_output.h"
#include "tools/sim/plan_search.h"
#include "tools/sim/sim_flags.h"

ABSL_FLAG(int, max_workers, 8, "The budget: most workers (prefill and decode together)");
ABSL_FLAG(bool, colocated, true, "Consider deployments with no prefill worker");
ABSL_FLAG(bool, disaggregated, true, "Consider deployments with prefill workers");
ABSL_FLAG(std::vector<std::string>, schedule_policies,
          std::vector<std::string>({"decode_priority", "chunked", "prefill_first"}),
          "Decode workers' schedule policies to try (the first is where the search starts)");
ABSL_FLAG(std::vector<std::string>, chunk_tokens, std::vector<std::string>({"512", "256"}),
          "The chunked policy's --prefill_chunk_tokens to try");
ABSL_FLAG(std::vector<std::string>, batch_tokens, std::vector<std::string>({"2048"}),
          "Every worker's --max_batch_tokens to try");
ABSL_FLAG(std::vector<std::string>, local_prefill, std::vector<std::string>({"0"}),
          "The router's --local_prefill_tokens to try (with prefill workers)");
ABSL_FLAG(std::vector<std::string>, routing_policies, std::vector<std::string>({"prefix", "load"}),
          "The router's --routing_policy values to try");
ABSL_FLAG(std::vector<std::string>, kv_dtypes, std::vector<std::string>({}),
          "KV types to try (f32, bf16, f16); default: --kv_dtype's");
ABSL_FLAG(double, slo_percentile, 99, "The percentile of requests each --slo target holds for");
ABSL_FLAG(std::vector<std::string>, request_rates, std::vector<std::string>({}),
          "Plan for each of these rates (req/s; a rate curve's levels) instead of --request_rate");
ABSL_FLAG(double, plan_seconds, 0,
          "Send each rate's workload for this long (rate x seconds requests, at least "
          "--num_requests): queues that build over minutes show; 0: --num_requests");
ABSL_FLAG(int, jobs, 0, "Simulations run at once; 0: one per CPU");
ABSL_FLAG(std::string, plan_json, "", "Write every point evaluated and the plan here");
ABSL_FLAG(std::string, rate_curve, "",
          "Then run the online planner in the simulator over this rate curve (SECONDS:RATE,... "
          "e.g. 0:2,900:40,1800:2), on the plan of --request_rates, against a static deployment "
          "for the peak and Dynamo's planner formula");
ABSL_FLAG(absl::Duration, worker_startup, absl::Seconds(60),
          "With --rate_curve: how long a new worker takes to join its pool");
ABSL_FLAG(absl::Duration, planner_interval, absl::Seconds(10),
          "With --rate_curve: how often the planner reads the router");
ABSL_FLAG(absl::Duration, planner_cooldown, absl::Seconds(30),
          "With --rate_curve: the planner's cool-down");
ABSL_FLAG(absl::Duration, planner_scale_down_delay, absl::Minutes(2),
          "With --rate_curve: the planner's scale-down delay");
ABSL_FLAG(std::string, helm_values, "",
          "Write the chosen deployment (at the highest rate) as values for deploy/helm/tandem");

namespace tandem::sim {
namespace {

constexpr char kUsage[] =
    "The cheapest tandem deployment that meets latency SLOs, found in the simulator.\n"
    "Usage: tandem-plan --slo ttft=500,tpot=50 [--slo_percentile 99] [--max_workers 8]\n"
    "       [--profile FILE | --device h100 --shape llama3-8b | --step_* costs]\n"
    "       [tandem-bench's workload flags: --dataset, --input_len, --output_len, "
    "--request_rate or --request_rates 2,10,40, --num_requests, --seed]";

constexpr char kNotModelled[] =
    "Not modelled (the plan cannot see these):\n"
    "  - step times come from the cost model (a profile, a roofline or --step_* costs), not from\n"
    "    computing; a KV type other than the profile's changes the link's bytes and the pools'\n"
    "    blocks (with --device, its roofline too), not a profile's step times;\n"
    "  - the time a worker spends between steps sending each row's tokens (measured on this\n"
    "    machine, simulated TPOT medians run 8-18% low: docs/planning.md, simulator validation);\n"
    "  - the router's CPU unless --router_request_cost/--router_token_cost are given;\n"
    "  - worker start-up, failures, restarts and network faults; tensor parallelism (a worker\n"
    "    is one device or one CPU process);\n"
    "  - a replayed request log's shared prefixes (the log keeps counts, not tokens) and\n"
    "    multi-turn replies (stand-ins as long as max_tokens).\n";

absl::StatusOr<std::vector<int>> Ints(const std::vector<std::string>& words, const char* flag) {
  std::vector<int> out;
  for (const std::string& w : words) {
    int v = 0;
    if (!absl::SimpleAtoi(w, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " holds '", w, "'; give whole numbers, e.g. 256,512"));
    }
    out.push_back(v);
  }
  return out;
}

// The user's --*_args may not set what the search varies: the plan's value
// would silently replace it.
absl::Status CheckBaseArgs(const PlanBaseArgs& base) {
  const std::vector<std::pair<std::string, std::string>> searched = {
      {"schedule_policy", "schedule_policies"},
      {"prefill_chunk_tokens", "chunk_tokens"},
      {"max_batch_tokens", "batch_tokens"},
      {"routing_policy", "routing_policies"},
      {"local_prefill_tokens", "local_prefill"}};
  for (const std::string& args : {base.decode, base.prefill, base.router}) {
    for (absl::string_view word : absl::StrSplit(args, ' ', absl::SkipEmpty())) {
      for (const auto& [name, list] : searched) {
        if (word == "--" + name || absl::StartsWith(word, "--" + name + "=")) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tandem-plan searches --", name, "; give its values in --", list, " instead"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanSpace> SpaceFromFlags() {
  PlanSpace s;
  s.max_workers = absl::GetFlag(FLAGS_max_workers);
  s.colocated = absl::GetFlag(FLAGS_colocated);
  s.disaggregated = absl::GetFlag(FLAGS_disaggregated);
  s.schedule_policies = absl::GetFlag(FLAGS_schedule_policies);
  ASSIGN_OR_RETURN(s.prefill_chunk_tokens, Ints(absl::GetFlag(FLAGS_chunk_tokens), "chunk_tokens"));
  ASSIGN_OR_RETURN(s.max_batch_tokens, Ints(absl::GetFlag(FLAGS_batch_tokens), "batch_tokens"));
  ASSIGN_OR_RETURN(s.local_prefill_tokens,
                   Ints(absl::GetFlag(FLAGS_local_prefill), "local_prefill"));
  s.routing_policies = absl::GetFlag(FLAGS_routing_policies);
  s.kv_dtypes = absl::GetFlag(FLAGS_kv_dtypes);
  if (s.kv_dtypes.empty()) s.kv_dtypes = {""};
  return s;
}

absl::Status Main() {
  ASSIGN_OR_RETURN(const ModelConfig shape, ShapeFromFlags());
  const bench::DatasetOptions data = bench::DatasetFromFlags(/*token_ids=*/true);
  ASSIGN_OR_RETURN(const std::unique_ptr<ModelWeights> weights, StandInWeights(shape, data));
  ASSIGN_OR_RETURN(const auto dataset, bench::MakeDataset(data));
  ASSIGN_OR_RETURN(const PlanSpace space, SpaceFromFlags());
  const PlanBaseArgs base{DecodeArgsFlag(), PrefillArgsFlag(), RouterArgsFlag()};
  RETURN_IF_ERROR(CheckBaseArgs(base));
  ASSIGN_OR_RETURN(const ClusterSetup defaults, ClusterFromFlags(shape));
  std::vector<double> rates;
  for (const std::string& w : absl::GetFlag(FLAGS_request_rates)) {
    double r = 0;
    if (!absl::SimpleAtod(w, &r) || !(r > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--request_rates holds '", w, "'; give positive rates, e.g. 2,10,40"));
    }
    rates.push_back(r);
  }
  if (!rates.empty() && data.kind == "request_log") {
    return absl::InvalidArgumentError(
        "a replayed request log keeps its own arrival times: leave out --request_rates");
  }
  if (rates.empty()) rates.push_back(bench::RequestRateFlag());
  std::sort(rates.begin(), rates.end());
  int jobs = absl::GetFlag(FLAGS_jobs);
  if (jobs <= 0) jobs = std::max(1u, std::thread::hardware_concurrency());
  PlanTargets targets;
  targets.percentile = absl::GetFlag(FLAGS_slo_percentile);

  nlohmann::json plans = nlohmann::json::array();
  std::string curve;
  std::optional<PlanPoint> peak;
  std::vector<PlanConfig> chosen;
  for (const double rate : rates) {
    ASSIGN_OR_RETURN(bench::RunOptions run, bench::RunOptionsFromFlags(rate));
    run.progress = false;
    if (const double seconds = absl::GetFlag(FLAGS_plan_seconds);
        seconds > 0 && std::isfinite(rate)) {
      run.num_requests = std::max(run.num_requests, static_cast<int>(std::ceil(rate * seconds)));
    }
    targets.slo = run.slo;
    const PlanEvaluator evaluate = SimEvaluator(
        *weights, *dataset, run,
        [&shape](const std::string& kv) -> absl::StatusOr<SimClusterOptions> {
          ASSIGN_OR_RETURN(ClusterSetup setup, ClusterFromFlags(shape, kv));
          return std::move(setup.options);
        },
        base, defaults.router_cpu);
    const absl::Time wall_start = absl::Now();
    ASSIGN_OR_RETURN(const PlanResult result, SearchPlan(space, targets, evaluate, jobs));
    const double wall_s = absl::ToDoubleSeconds(absl::Now() - wall_start);
    std::cout << absl::StrFormat("== %.3g req/s: %d configurations simulated in %.1f s ==\n", rate,
                                 result.points.size(), wall_s);
    std::vector<int> all(result.points.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    std::cout << PointsTable(result, all, targets) << "\nPareto frontier (goodput per worker "
              << "against the SLO ratio):\n"
              << PointsTable(result, result.frontier, targets) << "\n";
    nlohmann::json plan = {{"request_rate", rate}, {"points", nlohmann::json::array()}};
    for (const PlanPoint& p : result.points) plan["points"].push_back(PointJson(p));
    plan["frontier"] = result.frontier;
    plan["rivals"] = result.rivals;
    if (result.chosen.has_value()) {
      const PlanPoint& p = result.points[*result.chosen];
      plan["chosen"] = *result.chosen;
      std::cout << "Chosen: " << p.config.Describe() << "\n" << ChosenSummary(p);
      std::cout << "Nearest rivals:\n" << PointsTable(result, result.rivals, targets);
      std::cout << "Run it: " << ClusterCommand(p.config, base) << "\n\n";
      absl::StrAppend(&curve, absl::StrFormat("%10.3g  %s\n", rate, p.config.Describe()));
      peak = p;
      chosen.push_back(p.config);
    } else {
      const PlanPoint& p = result.points[*result.closest];
      plan["closest"] = *result.closest;
      std::cout << "No deployment of at most " << space.max_workers
                << " workers meets the SLOs; the closest: " << p.config.Describe() << " (" << p.miss
                << ")\n"
                << ChosenSummary(p) << "\n";
      absl::StrAppend(&curve, absl::StrFormat("%10.3g  none within the budget (closest: %s)\n",
                                              rate, p.config.Describe()));
      peak.reset();
    }
    plans.push_back(std::move(plan));
  }
  if (rates.size() > 1) std::cout << "Rate curve:\n   req/s    deployment\n" << curve << "\n";
  std::cout << "Cost model: " << defaults.cost.source << "\n" << kNotModelled;
  if (const std::string text = absl::GetFlag(FLAGS_rate_curve); !text.empty()) {
    if (chosen.size() != rates.size()) {
      return absl::FailedPreconditionError(
          "--rate_curve needs a deployment for every rate of --request_rates");
    }
    OnlineComparison c;
    ASSIGN_OR_RETURN(c.curve, ParseRateCurve(text));
    c.rates = rates;
    c.chosen = chosen;
    c.data = data;
    ASSIGN_OR_RETURN(c.run, bench::RunOptionsFromFlags(rates.back()));
    c.targets = targets;
    c.targets.slo = c.run.slo;
    c.online.startup = absl::GetFlag(FLAGS_worker_startup);
    c.online.interval = absl::GetFlag(FLAGS_planner_interval);
    c.online.planner.horizon = c.online.startup;
    c.online.planner.cooldown = absl::GetFlag(FLAGS_planner_cooldown);
    c.online.planner.scale_down_delay = absl::GetFlag(FLAGS_planner_scale_down_delay);
    c.online.planner.stale_after = 3 * c.online.interval;
    c.online.planner.prefill = {0, space.max_workers};
    c.online.planner.decode = {1, space.max_workers};
    if (c.run.slo.ttft) c.online.planner.ttft_target = *c.run.slo.ttft;
    if (c.run.slo.tpot) c.online.planner.tpot_target = *c.run.slo.tpot;
    c.cluster = [&shape, &base](const PlanConfig& config) -> absl::StatusOr<SimClusterOptions> {
      ASSIGN_OR_RETURN(ClusterSetup setup, ClusterFromFlags(shape, config.kv_dtype));
      RETURN_IF_ERROR(ApplyPlanConfig(config, base, setup.options));
      return std::move(setup.options);
    };
    c.router_cpu = defaults.router_cpu;
    c.weights = weights.get();
    c.cost = defaults.cost.fn;
    c.isl = data.input_len + (data.kind == "shared_prefix" ? data.prefix_len : 0);
    c.osl = data.output_len;
    c.max_batch = defaults.options.decode.max_sequences;
    ASSIGN_OR_RETURN(const std::string report, CompareOnline(c));
    std::cout << "\n" << report;
  }

  if (const std::string path = absl::GetFlag(FLAGS_helm_values); !path.empty()) {
    if (!peak.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no deployment meets the SLOs at ", rates.back(), " req/s: ", path, " not written"));
    }
    std::ofstream out(path);
    out << HelmValues(peak->config, base,
                      absl::StrFormat("tandem-plan: %s at %.3g req/s (predicted TTFT p%g %.1f ms, "
                                      "TPOT p%g %.1f ms)",
                                      peak->config.Describe(), rates.back(), targets.percentile,
                                      peak->ttft * 1e3, targets.percentile, peak->tpot * 1e3));
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  if (const std::string path = absl::GetFlag(FLAGS_plan_json); !path.empty()) {
    nlohmann::json json = {{"workload", bench::WorkloadConfig(data)},
                           {"cost_model", defaults.cost.source},
                           {"slo_percentile", targets.percentile},
                           {"plans", plans}};
    std::ofstream out(path);
    out << json.dump(1);
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::sim

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv, tandem::sim::kUsage);
  // A search overloads most of what it tries: the router's warnings about
  // workers that turn a request away would drown the tables.
  tandem::SetMinLogSeverity(tandem::LogSeverity::kError);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const absl::Status status = tandem::sim::Main();
  if (!status.ok()) {
    std::cerr << "tandem-plan: " << status << "\n";
    return 1;
  }
  return 0;
}
