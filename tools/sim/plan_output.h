// What tandem-plan prints and writes: the table of points it evaluated, the
// chosen deployment with its predicted distributions, and that deployment
// as deploy/local/cluster.sh's command line and as Helm values.
#ifndef TANDEM_TOOLS_SIM_PLAN_OUTPUT_H_
#define TANDEM_TOOLS_SIM_PLAN_OUTPUT_H_

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/sim/plan_search.h"

namespace tandem::sim {

// A table of `ids` of `result`: configuration, goodput per worker, the
// latencies at the targets' percentile, and what it misses.
std::string PointsTable(const PlanResult& result, const std::vector<int>& ids,
                        const PlanTargets& targets);

// The chosen point's (or, without one, the closest's) summary: its TTFT,
// TPOT and E2E at p50, p90 and p99, its throughput and goodput.
std::string ChosenSummary(const PlanPoint& point);

// `base` holds the flags the user gave every binary (tandem-plan's
// --decode_args, --prefill_args, --router_args); the plan's own come after
// them and win.
// `config` as `deploy/local/cluster.sh up ...` (every flag quoted for a
// POSIX shell).
std::string ClusterCommand(const PlanConfig& config, const PlanBaseArgs& base);

// `config` as a values file for deploy/helm/tandem: the pools' replicas
// (prefill.enabled false when colocated), model.kvDtype, and each
// binary's flags (the user's as extraArgs, each "--name=value"; the
// plan's as flags).
// `comment` leads it, one "# " line per line.
std::string HelmValues(const PlanConfig& config, const PlanBaseArgs& base,
                       const std::string& comment);

nlohmann::json PointJson(const PlanPoint& point);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_PLAN_OUTPUT_H_
