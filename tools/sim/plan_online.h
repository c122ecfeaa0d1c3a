// tandem-plan --rate_curve: the online planner checked in the simulator
// against a static deployment sized for the peak and against Dynamo's
// planner formula, over a rate curve (online_sim.h).
#ifndef TANDEM_TOOLS_SIM_PLAN_ONLINE_H_
#define TANDEM_TOOLS_SIM_PLAN_ONLINE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/dataset.h"
#include "tools/sim/online_sim.h"
#include "tools/sim/plan_search.h"

namespace tandem::sim {

struct OnlineComparison {
  // The plan's rate curve (a chosen deployment per rate) and its settings.
  std::vector<double> rates;
  std::vector<PlanConfig> chosen;
  RateCurve curve;
  bench::DatasetOptions data;
  bench::RunOptions run;  // seed and SLOs; the curve sets the times
  PlanTargets targets;
  OnlineOptions online;
  // The cluster's options for a configuration (pool sizes, args applied),
  // resizable.
  std::function<absl::StatusOr<SimClusterOptions>(const PlanConfig&)> cluster;
  RouterCpuModel router_cpu;
  const ModelWeights* weights = nullptr;
  // Dynamo's formula: the cost model, the workload's mean lengths, the
  // largest decode batch.
  StepCostFn cost;
  int isl = 0, osl = 0, max_batch = 64;
};

// Runs the curve four ways (static at the peak plan; the planner on the
// plan's table with the trend and with the constant forecast; the planner
// on Dynamo's table) and returns the printed comparison.
absl::StatusOr<std::string> CompareOnline(const OnlineComparison& c);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_PLAN_ONLINE_H_
