#include "tools/sim/plan_online.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "router/router_metrics.h"

namespace tandem::sim {
namespace {

struct Policy {
  std::string name;
  const planner::ScalingTable* table;  // null: static
  std::string forecast;
};

// One run of the curve: a fresh cluster of `start` with the router's
// metrics, and the planner on `policy`'s table.
absl::StatusOr<OnlineRun> RunPolicy(const OnlineComparison& c, const PlanConfig& start,
                                    const Policy& policy, const bench::Dataset& dataset,
                                    const bench::RunOptions& run) {
  ASSIGN_OR_RETURN(SimClusterOptions options, c.cluster(start));
  auto metrics_registry = std::make_shared<prometheus::Registry>();
  auto metrics = std::make_shared<router::RouterMetrics>(*metrics_registry);
  options.resizable = true;
  options.router.driver.metrics = metrics.get();
  options.on_poll_round = [metrics](int prefill, int decode) {
    metrics->prefill_workers_ready.Set(prefill);
    metrics->decode_workers_ready.Set(decode);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<SimCluster> cluster,
                   SimCluster::Create(*c.weights, std::move(options)));
  OnlineOptions online = c.online;
  online.forecast = policy.forecast.empty() ? online.forecast : policy.forecast;
  return RunOnline(*cluster, *metrics_registry, dataset, run, c.router_cpu, policy.table, online);
}

// The share of requests that succeeded within every SLO target.
double Attainment(const bench::RunResult& run, const bench::Slo& slo) {
  if (run.records.empty()) return 0;
  int good = 0;
  for (const bench::RequestRecord& r : run.records) {
    if (!r.success) continue;
    if (slo.ttft && r.ttft > *slo.ttft) continue;
    if (slo.e2e && r.e2e > *slo.e2e) continue;
    const std::optional<double> tpot = bench::Tpot(r);
    if (slo.tpot && tpot && *tpot > *slo.tpot) continue;
    ++good;
  }
  return static_cast<double>(good) / run.records.size();
}

}  // namespace

absl::StatusOr<std::string> CompareOnline(const OnlineComparison& c) {
  if (c.chosen.empty() || c.chosen.size() != c.rates.size()) {
    return absl::InvalidArgumentError("the online comparison needs a deployment per rate");
  }
  std::vector<planner::ScalingTable::Point> points;
  for (size_t i = 0; i < c.rates.size(); ++i) {
    points.push_back({c.rates[i], {c.chosen[i].prefill, c.chosen[i].decode}});
  }
  ASSIGN_OR_RETURN(const planner::ScalingTable plan_table,
                   planner::ScalingTable::Create(std::move(points)));
  ASSIGN_OR_RETURN(const planner::ScalingTable dynamo_table,
                   DynamoTable(c.cost, c.rates, c.isl, c.osl,
                               absl::Seconds(c.targets.slo.tpot.value_or(0.05)), c.max_batch));
  // Every run uses the peak plan's settings; the planners start at the
  // size their table gives the curve's first rate.
  const PlanConfig& peak = c.chosen.back();
  ASSIGN_OR_RETURN(std::unique_ptr<bench::Dataset> base, bench::MakeDataset(c.data));
  const std::vector<double> arrivals = CurveArrivals(c.curve, c.run.seed + 1);
  const std::unique_ptr<bench::Dataset> dataset = ScheduledDataset(std::move(base), arrivals);
  bench::RunOptions run = c.run;
  run.num_requests = static_cast<int>(arrivals.size());
  run.request_rate = 0;
  run.progress = false;

  std::string out = absl::StrFormat(
      "Online: %zu requests over %.0f s (rate %.3g -> peak %.3g req/s), workers start in %s, the "
      "planner reads the router every %s\n",
      arrivals.size(), c.curve.duration(), c.curve.points.front().second,
      std::max_element(c.curve.points.begin(), c.curve.points.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; })
          ->second,
      absl::FormatDuration(c.online.startup), absl::FormatDuration(c.online.interval));
  absl::StrAppend(
      &out, absl::StrFormat("%-34s %9s %7s %9s %9s %9s %8s %7s\n", "policy", "in SLO", "failed",
                            "TTFT p99", "TPOT p99", "wkr-hours", "changes", "wall s"));
  const double curve_start = c.curve.points.front().second;
  const std::vector<Policy> policies = {
      {absl::StrCat("static ", peak.prefill, "P+", peak.decode, "D (the peak's plan)"), nullptr,
       ""},
      {"tandem-planner (trend)", &plan_table, "trend"},
      {"tandem-planner (constant)", &plan_table, "constant"},
      {"Dynamo formula (trend)", &dynamo_table, "trend"}};
  for (const Policy& p : policies) {
    PlanConfig start = peak;
    if (p.table != nullptr) {
      const planner::PoolCounts counts = p.table->For(curve_start);
      start.prefill = counts.prefill;
      start.decode = counts.decode;
    }
    const absl::Time wall = absl::Now();
    ASSIGN_OR_RETURN(const OnlineRun r, RunPolicy(c, start, p, *dataset, run));
    const bench::Metrics& m = r.run.metrics;
    absl::StrAppend(&out, absl::StrFormat("%-34s %8.1f%% %7d %9.1f %9.1f %9.2f %8d %7.1f\n", p.name,
                                          100 * Attainment(r.run, c.targets.slo), m.failed,
                                          m.ttft_ms.p99, m.tpot_ms.p99, r.worker_hours, r.changes,
                                          absl::ToDoubleSeconds(absl::Now() - wall)));
    if (!r.targets.empty()) {
      std::string path;
      for (const auto& [t, prefill, decode] : r.targets) {
        absl::StrAppend(&path, absl::StrFormat(" %.0fs:%dP+%dD", t, prefill, decode));
      }
      absl::StrAppend(&out, "    changes:", path, "\n");
    }
  }
  std::string dynamo;
  for (const auto& pt : dynamo_table.points()) {
    absl::StrAppend(&dynamo,
                    absl::StrFormat(" %.3g:%dP+%dD", pt.rate, pt.counts.prefill, pt.counts.decode));
  }
  absl::StrAppend(&out, "Dynamo's table (rate:workers):", dynamo, "\n");
  return out;
}

}  // namespace tandem::sim
