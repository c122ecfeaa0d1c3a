#include "planner/planner_core.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::planner {
namespace {

int Clamp(int v, const PoolBounds& b) { return std::clamp(v, b.min, b.max); }

absl::Status CheckBounds(const char* pool, const PoolBounds& b, int initial) {
  if (b.min < 0 || b.max < b.min) {
    return absl::InvalidArgumentError(absl::StrCat("the ", pool, " pool's bounds are ", b.min,
                                                   " to ", b.max, "; give 0 <= min <= max"));
  }
  if (initial < b.min || initial > b.max) {
    return absl::InvalidArgumentError(absl::StrCat("the ", pool, " pool starts with ", initial,
                                                   " workers, outside its bounds ", b.min, " to ",
                                                   b.max));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScalingTable> ScalingTable::Create(std::vector<Point> points) {
  if (points.empty()) return absl::InvalidArgumentError("the scaling table has no rate");
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    if (!(p.rate > 0) || (i > 0 && !(p.rate > points[i - 1].rate))) {
      return absl::InvalidArgumentError(
          "the scaling table's rates must be positive and increasing");
    }
    if (p.counts.decode < 1 || p.counts.prefill < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the scaling table's point at ", p.rate, " req/s has ", p.counts.prefill,
                       " prefill and ", p.counts.decode, " decode workers; give 0+ and 1+"));
    }
  }
  ScalingTable t;
  t.points_ = std::move(points);
  return t;
}

absl::StatusOr<ScalingTable> ScalingTable::FromPlanJson(const nlohmann::json& plan) {
  if (!plan.is_object() || !plan.contains("plans") || !plan["plans"].is_array()) {
    return absl::InvalidArgumentError("not tandem-plan's --plan_json: it has no \"plans\" list");
  }
  std::vector<Point> points;
  for (const nlohmann::json& p : plan["plans"]) {
    if (!p.contains("request_rate") || !p["request_rate"].is_number()) {
      return absl::InvalidArgumentError("a plan has no request_rate");
    }
    const double rate = p["request_rate"].get<double>();
    if (!p.contains("chosen") || !p["chosen"].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no deployment within the budget met the SLOs at ", rate,
                       " req/s: raise tandem-plan's --max_workers or plan for lower rates"));
    }
    const auto& list = p["points"];
    const int64_t chosen = p["chosen"].get<int64_t>();
    if (!list.is_array() || chosen < 0 || chosen >= static_cast<int64_t>(list.size()) ||
        !list[chosen].contains("prefill") || !list[chosen].contains("decode")) {
      return absl::InvalidArgumentError(
          absl::StrCat("the plan at ", rate, " req/s names no chosen point"));
    }
    points.push_back(
        {rate, PoolCounts{list[chosen]["prefill"].get<int>(), list[chosen]["decode"].get<int>()}});
  }
  std::sort(points.begin(), points.end(),
            [](const Point& a, const Point& b) { return a.rate < b.rate; });
  return Create(std::move(points));
}

PoolCounts ScalingTable::For(double rate) const {
  for (const Point& p : points_) {
    if (rate <= p.rate) return p.counts;
  }
  const Point& last = points_.back();
  const double f = rate / last.rate;
  return PoolCounts{static_cast<int>(std::ceil(last.counts.prefill * f - 1e-9)),
                    static_cast<int>(std::ceil(last.counts.decode * f - 1e-9))};
}

absl::StatusOr<std::unique_ptr<PlannerCore>> PlannerCore::Create(
    PlannerOptions options, ScalingTable table, std::unique_ptr<Forecaster> forecaster,
    PoolCounts initial, absl::Time now) {
  if (auto s = CheckBounds("prefill", options.prefill, initial.prefill); !s.ok()) return s;
  if (auto s = CheckBounds("decode", options.decode, initial.decode); !s.ok()) return s;
  if (options.decode.max < 1) {
    return absl::InvalidArgumentError("the decode pool's maximum must be at least 1");
  }
  if (!(options.correction_limit >= 1) || !(options.correction_weight > 0) ||
      options.correction_weight > 1) {
    return absl::InvalidArgumentError(
        "give a correction limit of at least 1 and a correction weight in (0, 1]");
  }
  if (options.burst_intervals < 1) {
    return absl::InvalidArgumentError("burst_intervals must be at least 1");
  }
  return std::unique_ptr<PlannerCore>(
      new PlannerCore(std::move(options), std::move(table), std::move(forecaster), initial, now));
}

PlannerCore::PlannerCore(PlannerOptions options, ScalingTable table,
                         std::unique_ptr<Forecaster> forecaster, PoolCounts initial, absl::Time now)
    : options_(std::move(options)),
      table_(std::move(table)),
      forecaster_(std::move(forecaster)),
      target_(initial) {
  // The pools as they start count as a change: nothing moves within the
  // cool-down of starting, and start-up is checked from here.
  prefill_state_.last_change = decode_state_.last_change = now;
}

void PlannerCore::UpdateCorrection(std::optional<double> observed, std::optional<double> target,
                                   double& correction) const {
  if (!observed.has_value() || !target.has_value() || !(*target > 0)) return;
  const double ratio =
      std::clamp(*observed / *target, 1 / options_.correction_limit, options_.correction_limit);
  correction += options_.correction_weight * (ratio - correction);
}

void PlannerCore::Relax(double& correction) const {
  correction += options_.correction_weight * (1 - correction);
}

bool PlannerCore::Settle(const char* name, int desired, int& target, PoolState& state,
                         absl::Time now, std::string& reason) {
  const bool cooling = now - state.last_change < options_.cooldown;
  if (desired >= target) {
    state.below_since.reset();
    if (desired == target) return false;
    if (cooling) {
      absl::StrAppend(&reason, name, " wants ", desired, " but changed ",
                      absl::FormatDuration(now - state.last_change), " ago (cool-down); ");
      return false;
    }
    absl::StrAppend(&reason, name, " ", target, " -> ", desired, "; ");
    target = desired;
    state.last_change = now;
    return true;
  }
  if (!state.below_since.has_value()) {
    state.below_since = now;
    state.largest_below = desired;
  }
  state.largest_below = std::max(state.largest_below, desired);
  if (now - *state.below_since < options_.scale_down_delay || cooling) {
    absl::StrAppend(&reason, name, " could shrink to ", state.largest_below, " (below ", target,
                    " for ", absl::FormatDuration(now - *state.below_since), "); ");
    return false;
  }
  absl::StrAppend(&reason, name, " ", target, " -> ", state.largest_below, " (below for ",
                  absl::FormatDuration(now - *state.below_since), "); ");
  target = state.largest_below;
  state.last_change = now;
  state.below_since.reset();
  return true;
}

Decision PlannerCore::Step(const Observation& obs, absl::Time now) {
  Decision d;
  d.target = d.desired = target_;
  d.prefill_correction = prefill_correction_;
  d.decode_correction = decode_correction_;
  if (now - obs.at > options_.stale_after) {
    d.reason = absl::StrCat("metrics read ", absl::FormatDuration(now - obs.at),
                            " ago are stale: holding");
    d.warnings.push_back(d.reason);
    burst_run_ = 0;  // "in a row" means readings in a row
    return d;
  }
  if (!obs.request_rate.has_value()) {
    d.reason = "no request rate in the metrics: holding";
    d.warnings.push_back(d.reason);
    burst_run_ = 0;
    return d;
  }
  forecaster_->Observe(obs.at, *obs.request_rate);
  burst_run_ = obs.burst_fraction.value_or(0) > options_.burst_limit ? burst_run_ + 1 : 0;
  if (burst_run_ >= options_.burst_intervals) {
    // Decode workers keep prefilling what the prefill pool cannot take:
    // as far over its target as counts, whatever TTFT the absorbing hides.
    const double target = options_.ttft_target.value_or(1);
    UpdateCorrection(std::max(obs.ttft_p99.value_or(0), options_.correction_limit * target), target,
                     prefill_correction_);
  } else if (options_.ttft_target.has_value()) {
    UpdateCorrection(obs.ttft_p99, options_.ttft_target, prefill_correction_);
  } else {
    Relax(prefill_correction_);  // without a target only bursts move it
  }
  std::optional<double> tpot = obs.tpot_p99;
  if (obs.refused_fraction.value_or(0) > options_.refused_limit) {
    // Refusals are a full decode pool: as far over its target as counts.
    const double target = options_.tpot_target.value_or(1);
    tpot = std::max(tpot.value_or(0), options_.correction_limit * target);
    UpdateCorrection(tpot, target, decode_correction_);
  } else if (options_.tpot_target.has_value()) {
    UpdateCorrection(tpot, options_.tpot_target, decode_correction_);
  } else {
    Relax(decode_correction_);  // without a target only refusals move it
  }
  d.prefill_correction = prefill_correction_;
  d.decode_correction = decode_correction_;
  d.forecast_rate = forecaster_->Predict(now + options_.horizon);
  const PoolCounts by_ttft = table_.For(d.forecast_rate * prefill_correction_);
  const PoolCounts by_tpot = table_.For(d.forecast_rate * decode_correction_);
  d.desired.prefill = Clamp(by_ttft.prefill, options_.prefill);
  d.desired.decode =
      Clamp(std::max(by_tpot.decode, by_ttft.prefill == 0 ? by_ttft.decode : 0), options_.decode);
  std::string reason = absl::StrFormat(
      "forecast %.3g req/s (corrections: prefill %.2f, decode "
      "%.2f); ",
      d.forecast_rate, prefill_correction_, decode_correction_);
  const bool p = Settle("prefill", d.desired.prefill, target_.prefill, prefill_state_, now, reason);
  const bool q = Settle("decode", d.desired.decode, target_.decode, decode_state_, now, reason);
  d.changed = p || q;
  d.target = target_;
  d.reason = reason;
  auto overdue = [&](const char* name, int ready, int target, const PoolState& s) {
    if (ready < target && now - s.last_change >= options_.start_timeout) {
      d.warnings.push_back(absl::StrCat(name, " pool has ", ready, " of ", target,
                                        " workers ready ",
                                        absl::FormatDuration(now - s.last_change),
                                        " after it was last changed: a worker did not start"));
    }
  };
  overdue("prefill", obs.prefill_ready, target_.prefill, prefill_state_);
  overdue("decode", obs.decode_ready, target_.decode, decode_state_);
  return d;
}

}  // namespace tandem::planner
