// The decode worker's Prometheus metrics (tandem_decode_*). The loop feeds
// them: gauges and counters from the stats it publishes each round, step
// times where it steps, and outcomes and tokens through a sink wrapper.
// Thread-safe.
#ifndef TANDEM_DECODE_WORKER_DECODE_METRICS_H_
#define TANDEM_DECODE_WORKER_DECODE_METRICS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "decode_worker/decode_types.h"
#include "prometheus/registry.h"

namespace tandem::decode {

class DecodeMetrics {
 public:
  explicit DecodeMetrics(prometheus::Registry& registry);

  // The loop thread, after each round.
  void Publish(const LoopStats& stats);
  // The loop thread, with Engine::expert_load().
  void PublishExpertLoad(const std::vector<std::vector<uint64_t>>& load) {
    engine_.PublishExpertLoad(load);
  }
  // One engine step of the running batch (and local prefill chunks).
  void ObserveStep(absl::Duration step) { step_.Observe(metrics::Seconds(step)); }
  // A request refused by Submit.
  void OnRefused(const absl::Status& status) { requests_.Count(status); }
  // Wraps an admitted request's sink so that its outcome and tokens count.
  std::shared_ptr<EventSink> Wrap(std::shared_ptr<EventSink> sink);

 private:
  class CountingSink;

  metrics::OutcomeCounter requests_;
  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Gauge& kv_blocks_used_;
  prometheus::Gauge& kv_blocks_free_;
  prometheus::Gauge& kv_blocks_cached_;
  prometheus::Counter& prefix_cache_queried_tokens_;
  prometheus::Counter& prefix_cache_hit_tokens_;
  prometheus::Counter& prefix_cache_evicted_blocks_;
  prometheus::Counter& preemptions_;
  prometheus::Histogram& step_;
  prometheus::Counter& generated_tokens_;
  prometheus::Counter& moves_offered_;
  prometheus::Counter& kv_transfers_;
  prometheus::Counter& kv_bytes_received_;
  prometheus::Counter& kv_transfer_failures_;
  prometheus::Histogram& kv_wait_;
  metrics::EngineGauges engine_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_METRICS_H_
