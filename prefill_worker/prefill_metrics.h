// The prefill worker's Prometheus metrics (tandem_prefill_*). The loop feeds
// them: gauges and counters from the stats it publishes each round,
// histograms and outcomes where the events happen. Thread-safe.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_METRICS_H_
#define TANDEM_PREFILL_WORKER_PREFILL_METRICS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/metrics/tier_metrics.h"
#include "prefill_worker/prefill_job.h"
#include "prometheus/registry.h"

namespace tandem::prefill {

struct PrefillStats;

class PrefillMetrics {
 public:
  explicit PrefillMetrics(prometheus::Registry& registry);

  // The loop thread, after each round (stats_ as just published).
  void Publish(const PrefillStats& stats);
  // The loop thread, with Engine::expert_load().
  void PublishExpertLoad(const std::vector<std::vector<uint64_t>>& load) {
    engine_.PublishExpertLoad(load);
  }
  // One engine step (a chunked, batched forward pass).
  void ObserveStep(absl::Duration step) { step_.Observe(metrics::Seconds(step)); }
  // A job's reply, just before its callback runs.
  void OnReply(const absl::StatusOr<PrefillResult>& result);

 private:
  metrics::OutcomeCounter requests_;
  prometheus::Gauge& waiting_;
  prometheus::Gauge& running_;
  prometheus::Gauge& kv_blocks_used_;
  prometheus::Gauge& kv_blocks_free_;
  prometheus::Histogram& step_;
  prometheus::Counter& steps_;
  prometheus::Counter& kv_transfers_;
  prometheus::Counter& kv_transfer_bytes_;
  prometheus::Counter& kv_transfer_failures_;
  prometheus::Histogram& kv_transfer_latency_;
  prometheus::Counter& prefix_cache_queried_tokens_;
  prometheus::Counter& prefix_cache_hit_tokens_;
  prometheus::Counter& prefix_cache_evicted_blocks_;
  prometheus::Gauge& kv_blocks_cached_;
  prometheus::Gauge& kv_connections_;
  prometheus::Gauge& kv_peers_;
  metrics::EngineGauges engine_;
  metrics::TierMetrics tier_;
};

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_METRICS_H_
