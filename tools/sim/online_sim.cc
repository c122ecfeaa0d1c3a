#include "tools/sim/online_sim.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "planner/router_scrape.h"
#include "prometheus/text_serializer.h"

namespace tandem::sim {
namespace {

class Scheduled final : public bench::Dataset {
 public:
  Scheduled(std::unique_ptr<bench::Dataset> base, std::vector<double> arrivals)
      : base_(std::move(base)), arrivals_(std::move(arrivals)) {}
  bench::BenchRequest Get(size_t index) const override {
    bench::BenchRequest r = base_->Get(index);
    if (index < arrivals_.size()) r.arrival_s = arrivals_[index];
    return r;
  }

 private:
  std::unique_ptr<bench::Dataset> base_;
  std::vector<double> arrivals_;
};

// Reads the router's metrics as tandem-planner reads them over HTTP, and
// resizes the cluster as its apply mode would, every interval of the
// cluster's time.
class Ticker : public std::enable_shared_from_this<Ticker> {
 public:
  Ticker(SimCluster* cluster, prometheus::Registry* metrics, const OnlineOptions& options,
         std::unique_ptr<planner::PlannerCore> core, planner::RouterScrape first, absl::Time start)
      : cluster_(cluster),
        metrics_(metrics),
        options_(options),
        core_(std::move(core)),
        last_(std::move(first)),
        start_(start) {}

  static absl::StatusOr<planner::RouterScrape> Read(SimCluster& cluster,
                                                    prometheus::Registry& metrics) {
    return planner::ParseRouterMetrics(prometheus::TextSerializer().Serialize(metrics.Collect()),
                                       cluster.clock().Now());
  }
  void Schedule() {
    cluster_->executor().PostAt(cluster_->clock().Now() + options_.interval,
                                [self = shared_from_this()] { self->Tick(); });
  }
  void Tick() {
    if (done_ || !error_.ok()) return;
    absl::StatusOr<planner::RouterScrape> now = Read(*cluster_, *metrics_);
    if (!now.ok()) {
      error_ = now.status();
      return;
    }
    const planner::Observation obs = planner::Between(last_, *now);
    last_ = *std::move(now);
    const planner::Decision d = core_->Step(obs, cluster_->clock().Now());
    if (d.changed) {
      error_ = cluster_->Resize(d.target.prefill, d.target.decode, options_.startup);
      ++changes_;
      targets_.emplace_back(absl::ToDoubleSeconds(cluster_->clock().Now() - start_),
                            d.target.prefill, d.target.decode);
    }
    Schedule();
  }

  bool done_ = false;
  absl::Status error_;
  int changes_ = 0;
  std::vector<std::tuple<double, int, int>> targets_;

 private:
  SimCluster* const cluster_;
  prometheus::Registry* const metrics_;
  const OnlineOptions options_;
  std::unique_ptr<planner::PlannerCore> core_;
  planner::RouterScrape last_;
  const absl::Time start_;
};

}  // namespace

double RateCurve::RateAt(double t) const {
  if (points.empty()) return 0;
  if (t <= points.front().first) return points.front().second;
  for (size_t i = 1; i < points.size(); ++i) {
    const auto& [t1, r1] = points[i];
    if (t <= t1) {
      const auto& [t0, r0] = points[i - 1];
      return t1 == t0 ? r1 : r0 + (r1 - r0) * (t - t0) / (t1 - t0);
    }
  }
  return points.back().second;
}

absl::StatusOr<RateCurve> ParseRateCurve(absl::string_view text) {
  RateCurve c;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    double t = 0, r = 0;
    if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &t) || !absl::SimpleAtod(parts[1], &r) ||
        !(r >= 0) || !(t >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the rate curve holds '", item, "'; give SECONDS:RATE pairs, e.g. 0:2,600:40,1200:2"));
    }
    if (!c.points.empty() && !(t > c.points.back().first)) {
      return absl::InvalidArgumentError("the rate curve's times must increase");
    }
    c.points.emplace_back(t, r);
  }
  if (c.points.size() < 2 || c.points.front().first != 0) {
    return absl::InvalidArgumentError(
        "the rate curve needs two points or more, the first at time 0 (e.g. 0:2,600:40)");
  }
  return c;
}

std::vector<double> CurveArrivals(const RateCurve& curve, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(1.0);
  std::vector<double> out;
  // The cumulative rate, integrated in steps of 10 ms (exact for a
  // piecewise-linear curve between steps, as each step is a trapezoid).
  constexpr double kStep = 0.01;
  double t = 0, area = 0, next = gap(rng);
  while (t < curve.duration()) {
    const double r0 = curve.RateAt(t), r1 = curve.RateAt(t + kStep);
    const double step_area = (r0 + r1) / 2 * kStep;
    while (area + step_area >= next) {
      // Linear within the step: where the area reaches `next`.
      out.push_back(t + kStep * (next - area) / step_area);
      next += gap(rng);
    }
    area += step_area;
    t += kStep;
  }
  return out;
}

std::unique_ptr<bench::Dataset> ScheduledDataset(std::unique_ptr<bench::Dataset> base,
                                                 std::vector<double> arrivals) {
  return std::make_unique<Scheduled>(std::move(base), std::move(arrivals));
}

absl::StatusOr<OnlineRun> RunOnline(SimCluster& cluster, prometheus::Registry& metrics,
                                    const bench::Dataset& dataset, const bench::RunOptions& run,
                                    const RouterCpuModel& router_cpu,
                                    const planner::ScalingTable* table,
                                    const OnlineOptions& options) {
  std::shared_ptr<Ticker> ticker;
  if (table != nullptr) {
    ASSIGN_OR_RETURN(std::unique_ptr<planner::Forecaster> forecaster,
                     planner::MakeForecaster(options.forecast, options.trend_window));
    const planner::PoolCounts initial{cluster.pool_size(router::WorkerRole::kPrefill),
                                      cluster.pool_size(router::WorkerRole::kDecode)};
    ASSIGN_OR_RETURN(std::unique_ptr<planner::PlannerCore> core,
                     planner::PlannerCore::Create(options.planner, *table, std::move(forecaster),
                                                  initial, cluster.clock().Now()));
    ASSIGN_OR_RETURN(planner::RouterScrape first, Ticker::Read(cluster, metrics));
    ticker = std::make_shared<Ticker>(&cluster, &metrics, options, std::move(core),
                                      std::move(first), cluster.clock().Now());
    ticker->Schedule();
  }
  OnlineRun out;
  ASSIGN_OR_RETURN(out.run, RunSimulated(cluster, dataset, run, router_cpu));
  if (ticker != nullptr) {
    ticker->done_ = true;
    RETURN_IF_ERROR(ticker->error_);
    out.changes = ticker->changes_;
    out.targets = ticker->targets_;
  }
  out.worker_hours = cluster.WorkerSeconds() / 3600;
  return out;
}

absl::StatusOr<planner::ScalingTable> DynamoTable(const StepCostFn& cost,
                                                  const std::vector<double>& rates, int isl,
                                                  int osl, absl::Duration itl, int max_batch) {
  if (isl < 1 || osl < 1 || max_batch < 1) {
    return absl::InvalidArgumentError("give positive lengths and batch for Dynamo's formula");
  }
  const StepShape prompt{
      .items = 1, .tokens = isl, .attended = int64_t{isl} * (isl + 1) / 2, .logit_rows = 1};
  const double prefill_tps = isl / absl::ToDoubleSeconds(cost(prompt));
  const int64_t context = isl + osl / 2;
  double decode_tps = 0;
  for (int b = 1; b <= max_batch; ++b) {
    const StepShape step{.items = b,
                         .tokens = b,
                         .attended = b * context,
                         .logit_rows = b,
                         .decode_tokens = b,
                         .decode_attended = b * context};
    const absl::Duration t = cost(step);
    if (t <= itl) decode_tps = std::max(decode_tps, b / absl::ToDoubleSeconds(t));
  }
  if (!(decode_tps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("no decode batch steps within the ITL target of ", absl::FormatDuration(itl)));
  }
  std::vector<planner::ScalingTable::Point> points;
  for (double r : rates) {
    points.push_back({r,
                      {std::max(1, static_cast<int>(std::ceil(r * isl / prefill_tps))),
                       std::max(1, static_cast<int>(std::ceil(r * osl / decode_tps)))}});
  }
  return planner::ScalingTable::Create(std::move(points));
}

}  // namespace tandem::sim
