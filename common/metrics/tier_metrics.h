// A worker's metrics of its KV tier (common/kvcache/kv_tier.h), under a
// prefix such as "tandem_prefill": the prompt tokens looked up in the tier
// and loaded from it, the blocks spilled into it and refused, the loads
// that gave no block by reason, the bytes read and written, and what it
// holds now. Fed from stats snapshots on one thread.
#ifndef TANDEM_COMMON_METRICS_TIER_METRICS_H_
#define TANDEM_COMMON_METRICS_TIER_METRICS_H_

#include <array>
#include <cstdint>
#include <string>

#include "common/kvcache/kv_tier.h"
#include "common/kvcache/tier_link.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

class TierMetrics {
 public:
  TierMetrics(prometheus::Registry& registry, const std::string& prefix);
  void Publish(const KvTierStats& tier, const TierLinkStats& link, uint64_t queried_tokens,
               uint64_t hit_tokens);

 private:
  prometheus::Counter& queried_tokens_;
  prometheus::Counter& hit_tokens_;
  prometheus::Counter& spilled_;
  prometheus::Counter& spills_refused_;
  prometheus::Counter& late_;
  std::array<prometheus::Counter*, kTierMissKinds> misses_{};
  prometheus::Counter& evicted_;
  prometheus::Counter& read_bytes_;
  prometheus::Counter& written_bytes_;
  prometheus::Gauge& used_bytes_;
  prometheus::Gauge& records_;
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_TIER_METRICS_H_
