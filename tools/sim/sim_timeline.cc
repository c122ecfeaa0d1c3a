#include "tools/sim/sim_timeline.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tandem::sim {

WorkerSample Timeline::Sample(const WorkerStatsRecord& stats, absl::Duration busy,
                              absl::Duration interval) {
  WorkerSample s;
  s.busy = interval > absl::ZeroDuration()
               ? std::clamp(absl::FDivDuration(busy, interval), 0.0, 1.0)
               : 0.0;
  s.running = stats.running;
  s.waiting = stats.waiting;
  s.kv_total = stats.kv_blocks_total;
  s.kv_used = stats.kv_blocks_total - stats.kv_blocks_free;
  s.kv_cached = stats.kv_blocks_cached;
  return s;
}

nlohmann::json Timeline::Json() const {
  nlohmann::json samples = nlohmann::json::array();
  for (const TimelineSample& t : this->samples) {
    nlohmann::json workers = nlohmann::json::array();
    for (const WorkerSample& w : t.workers) {
      workers.push_back({{"busy", w.busy},
                         {"running", w.running},
                         {"waiting", w.waiting},
                         {"kv_used", w.kv_used},
                         {"kv_cached", w.kv_cached},
                         {"kv_total", w.kv_total}});
    }
    samples.push_back({{"t_s", t.t_s},
                       {"router_queued", t.router_queued},
                       {"router_inflight", t.router_inflight},
                       {"workers", std::move(workers)}});
  }
  return {{"interval_s", absl::ToDoubleSeconds(interval)},
          {"workers", workers},
          {"samples", std::move(samples)}};
}

std::string Timeline::Summary() const {
  std::string out = absl::StrFormat("Timeline: %d samples of %s\n", samples.size(),
                                    absl::FormatDuration(interval));
  out += absl::StrFormat("%-14s %9s %9s %9s %9s %9s\n", "worker", "busy", "busy max", "waiting",
                         "wait max", "KV max");
  for (size_t i = 0; i < workers.size(); ++i) {
    double busy = 0, busy_max = 0, waiting = 0, kv_max = 0;
    int waiting_max = 0;
    for (const TimelineSample& t : samples) {
      const WorkerSample& w = t.workers[i];
      busy += w.busy;
      busy_max = std::max(busy_max, w.busy);
      waiting += w.waiting;
      waiting_max = std::max(waiting_max, w.waiting);
      if (w.kv_total > 0) kv_max = std::max(kv_max, static_cast<double>(w.kv_used) / w.kv_total);
    }
    const double n = std::max<size_t>(1, samples.size());
    out += absl::StrFormat("%-14s %8.1f%% %8.1f%% %9.2f %9d %8.1f%%\n", workers[i], 100 * busy / n,
                           100 * busy_max, waiting / n, waiting_max, 100 * kv_max);
  }
  int queued_max = 0;
  for (const TimelineSample& t : samples) queued_max = std::max(queued_max, t.router_queued);
  out += absl::StrFormat("router queue max %d\n", queued_max);
  return out;
}

}  // namespace tandem::sim
