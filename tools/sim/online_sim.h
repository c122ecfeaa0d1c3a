// The online planner in the simulator: a workload whose rate follows a
// curve (a day compressed, say 2 -> 40 -> 2 requests a second), sent to a
// resizable SimCluster while tandem-planner's own code (the router's
// metrics read as text, planner/router_scrape.h; the decisions,
// planner/planner_core.h) resizes it every interval, new workers taking a
// start-up time to join. A static deployment is the same run with no
// planner. Dynamo's SLA planner formula is a scaling table made from the
// cost model's throughputs (DynamoTable), run through the same core.
#ifndef TANDEM_TOOLS_SIM_ONLINE_SIM_H_
#define TANDEM_TOOLS_SIM_ONLINE_SIM_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/engine/simulated_executor.h"
#include "planner/planner_core.h"
#include "prometheus/registry.h"
#include "tools/bench/dataset.h"
#include "tools/bench/runner.h"
#include "tools/sim/sim_cluster.h"
#include "tools/sim/sim_run.h"

namespace tandem::sim {

// A request rate that moves linearly between points (seconds, req/s).
struct RateCurve {
  std::vector<std::pair<double, double>> points;
  double RateAt(double t) const;
  double duration() const { return points.empty() ? 0 : points.back().first; }
};

// "0:2,600:40,1200:40,1800:2": times in seconds, increasing from 0, and
// rates of at least 0; INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<RateCurve> ParseRateCurve(absl::string_view text);

// The arrival times (s) of a Poisson process whose rate follows `curve`
// over its duration: unit exponential gaps of the cumulative rate,
// inverted. The same seed gives the same times.
std::vector<double> CurveArrivals(const RateCurve& curve, uint64_t seed);

// `base`'s requests, the i-th sent at arrivals[i] (cycled past the end with
// no time: callers send arrivals.size() requests).
std::unique_ptr<bench::Dataset> ScheduledDataset(std::unique_ptr<bench::Dataset> base,
                                                 std::vector<double> arrivals);

struct OnlineOptions {
  planner::PlannerOptions planner;
  absl::Duration interval = absl::Seconds(10);
  // From a new worker's start to its joining the pool (loading its model).
  absl::Duration startup = absl::Seconds(60);
  std::string forecast = "trend";
  absl::Duration trend_window = absl::Minutes(5);
};

struct OnlineRun {
  bench::RunResult run;
  double worker_hours = 0;
  int changes = 0;
  // Each change: seconds from the start, prefill and decode workers.
  std::vector<std::tuple<double, int, int>> targets;
};

// Sends `dataset` (arrival times set) with `run` into `cluster` (resizable,
// its router's RouterMetrics registered in `metrics` and its
// on_poll_round setting their ready gauges) and, with a `table`, runs the
// planner every interval on the metrics' text until every request has
// ended. No table: the cluster keeps its size.
absl::StatusOr<OnlineRun> RunOnline(SimCluster& cluster, prometheus::Registry& metrics,
                                    const bench::Dataset& dataset, const bench::RunOptions& run,
                                    const RouterCpuModel& router_cpu,
                                    const planner::ScalingTable* table,
                                    const OnlineOptions& options);

// Dynamo's SLA planner sizing as a scaling table at `rates`: prefill
// workers = ceil(rate x isl / prefill throughput), the throughput of one
// isl-token prompt alone; decode workers = ceil(rate x osl / decode
// throughput at the ITL target), the tokens per second of the largest
// batch (up to max_batch) whose step at a context of isl + osl/2 stays
// within `itl`. Both from `cost`, as its profiler measures them.
absl::StatusOr<planner::ScalingTable> DynamoTable(const StepCostFn& cost,
                                                  const std::vector<double>& rates, int isl,
                                                  int osl, absl::Duration itl, int max_batch);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_ONLINE_SIM_H_
