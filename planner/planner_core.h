// The planner's decisions: how many prefill and decode workers the pools
// should have, from the load it forecasts, a scaling table (tandem-plan's
// rate curve: the cheapest deployment that meets the SLOs at each rate,
// found in the simulator) and the latencies it observes, with hysteresis,
// a cool-down and bounds. A pure function of its observations and the
// times it is given: no clock, no I/O (tandem-planner reads the metrics and
// applies the counts).
//
// Each step:
//   1. A stale observation (older than stale_after) or one with no rate
//      changes nothing and says so.
//   2. The forecast rate at now + horizon, times each pool's correction:
//      the observed TTFT p99 over its target for the prefill pool, TPOT p99
//      over its target for the decode pool (a running mean of the ratio,
//      within [1/correction_limit, correction_limit]; 1 without a target or
//      a latency), looked up in the table: the prefill count from the TTFT
//      lookup; the decode count from the TPOT lookup, or the TTFT lookup's
//      when that is colocated (its decode workers prefill), whichever is
//      larger. Then the bounds. Requests refused for want of capacity
//      (over refused_limit of them) count as TPOT at the correction limit;
//      prompts absorbed by decode workers in bursts (over burst_limit of
//      them, burst_intervals in a row) count as TTFT at that limit.
//   3. A pool grows at once, unless it changed within the cool-down; it
//      shrinks only when every desired count for scale_down_delay was
//      below it (to the largest of them), and not within the cool-down.
//   4. A pool with fewer ready workers than its target start_timeout after
//      it was last changed is reported (a worker that failed to start).
#ifndef TANDEM_PLANNER_PLANNER_CORE_H_
#define TANDEM_PLANNER_PLANNER_CORE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "planner/forecast.h"

namespace tandem::planner {

struct PoolCounts {
  int prefill = 0;
  int decode = 1;
  bool operator==(const PoolCounts&) const = default;
};

// Pool sizes by request rate.
class ScalingTable {
 public:
  struct Point {
    double rate = 0;
    PoolCounts counts;
  };
  // Points of increasing rate with at least one decode worker each;
  // INVALID_ARGUMENT otherwise.
  static absl::StatusOr<ScalingTable> Create(std::vector<Point> points);
  // From tandem-plan's --plan_json: each plan's rate and chosen deployment
  // (a rate with none chosen is refused: the budget did not meet the SLOs).
  static absl::StatusOr<ScalingTable> FromPlanJson(const nlohmann::json& plan);

  // The counts of the first point whose rate is at least `rate`; past the
  // last, its counts scaled by rate / its rate (rounded up).
  PoolCounts For(double rate) const;
  const std::vector<Point>& points() const { return points_; }

 private:
  std::vector<Point> points_;
};

struct PoolBounds {
  int min = 0;
  int max = 64;
};

struct PlannerOptions {
  PoolBounds prefill{0, 16};
  PoolBounds decode{1, 64};
  // How far ahead the load is forecast: about a new worker's start-up.
  absl::Duration horizon = absl::Minutes(1);
  absl::Duration scale_down_delay = absl::Minutes(2);
  absl::Duration cooldown = absl::Seconds(30);
  absl::Duration stale_after = absl::Seconds(30);
  absl::Duration start_timeout = absl::Minutes(5);
  // SLO targets in seconds; unset: no correction for that pool.
  std::optional<double> ttft_target;
  std::optional<double> tpot_target;
  double correction_limit = 2;
  // The running mean's weight of each new ratio.
  double correction_weight = 0.5;
  // More than this share of requests refused for want of capacity (a full
  // decode pool turns requests away before any latency shows it) counts
  // as the decode pool's latency at the correction limit.
  double refused_limit = 0.01;
  // Decode workers absorb a burst of prompts that fills every prefill
  // worker; the prefill pool is short only when they keep doing it: more
  // than burst_limit of the requests, burst_intervals observations in a
  // row, counts as the prefill pool's latency at the correction limit.
  double burst_limit = 0.1;
  int burst_intervals = 3;
};

// What the planner reads each step.
struct Observation {
  absl::Time at;  // when the metrics were read
  // Requests per second over the interval that ended at `at`.
  std::optional<double> request_rate;
  // Over the same interval; unset without requests.
  std::optional<double> ttft_p99;
  std::optional<double> tpot_p99;
  // The share of the interval's requests refused for want of capacity.
  std::optional<double> refused_fraction;
  // The share of them prefilled on decode workers because every prefill
  // worker was full (the router's --prefill_burst_queue).
  std::optional<double> burst_fraction;
  // Workers the router holds ready in each pool.
  int prefill_ready = 0;
  int decode_ready = 0;
};

struct Decision {
  PoolCounts target;   // what the pools should have now
  PoolCounts desired;  // what the load asks for, before hysteresis and cool-down
  bool changed = false;
  double forecast_rate = 0;
  double prefill_correction = 1;
  double decode_correction = 1;
  std::string reason;
  std::vector<std::string> warnings;
};

// Thread-compatible: the planner's loop drives it, on a clock it is given.
class PlannerCore {
 public:
  // INVALID_ARGUMENT for bounds that hold no count or `initial` outside
  // them.
  static absl::StatusOr<std::unique_ptr<PlannerCore>> Create(PlannerOptions options,
                                                             ScalingTable table,
                                                             std::unique_ptr<Forecaster> forecaster,
                                                             PoolCounts initial, absl::Time now);

  Decision Step(const Observation& observation, absl::Time now);
  const PoolCounts& target() const { return target_; }

 private:
  struct PoolState {
    absl::Time last_change;
    // Since when every desired count has been below the target, and the
    // largest of them; unset while none is.
    std::optional<absl::Time> below_since;
    int largest_below = 0;
  };
  PlannerCore(PlannerOptions options, ScalingTable table, std::unique_ptr<Forecaster> forecaster,
              PoolCounts initial, absl::Time now);
  // Moves `target` toward `desired` as step 3 says; true when it moved.
  bool Settle(const char* name, int desired, int& target, PoolState& state, absl::Time now,
              std::string& reason);
  void UpdateCorrection(std::optional<double> observed, std::optional<double> target,
                        double& correction) const;
  // Moves a correction back toward 1 (a pool without a latency target,
  // once what pushed it stops).
  void Relax(double& correction) const;

  const PlannerOptions options_;
  const ScalingTable table_;
  std::unique_ptr<Forecaster> forecaster_;
  PoolCounts target_;
  PoolState prefill_state_, decode_state_;
  int burst_run_ = 0;  // observations in a row over burst_limit
  double prefill_correction_ = 1;
  double decode_correction_ = 1;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_PLANNER_CORE_H_
