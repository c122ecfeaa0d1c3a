// What a simulated cluster did over time: every sample interval, each
// worker's utilisation (the share of the interval its steps took), its
// running and waiting work and its KV pool's occupancy, and the router's
// queue. Written as JSON by tandem-sim --timeline_json and summed up per
// worker in its output.
#ifndef TANDEM_TOOLS_SIM_SIM_TIMELINE_H_
#define TANDEM_TOOLS_SIM_SIM_TIMELINE_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/worker/worker_stats.h"
#include "nlohmann/json.hpp"

namespace tandem::sim {

struct WorkerSample {
  double busy = 0;  // Share of the interval spent in steps, 0 to 1.
  int running = 0;
  int waiting = 0;
  int kv_used = 0;    // Blocks held by sequences (total less free).
  int kv_cached = 0;  // Blocks the prefix cache keeps (in use or not).
  int kv_total = 0;
};

struct TimelineSample {
  double t_s = 0;  // Seconds from the cluster's start, at the interval's end.
  int router_queued = 0;
  int router_inflight = 0;
  std::vector<WorkerSample> workers;  // In Timeline::workers' order.
};

struct Timeline {
  absl::Duration interval;
  // "prefill-0:1", "decode-0:1", ...: the workers, prefill first.
  std::vector<std::string> workers;
  std::vector<TimelineSample> samples;

  // The sample of one worker from its stats and the busy time it gained in
  // the interval.
  static WorkerSample Sample(const WorkerStatsRecord& stats, absl::Duration busy,
                             absl::Duration interval);
  nlohmann::json Json() const;
  // One line per worker: mean and peak utilisation, mean and peak waiting,
  // peak KV occupancy; and the router's peak queue.
  std::string Summary() const;
};

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_SIM_TIMELINE_H_
