// A worker's metrics of its KV tiers (common/kvcache/kv_tier.h), under a
// prefix such as "tandem_prefill": the prompt tokens looked up in the tiers
// and loaded from them, the blocks spilled into them and refused (the
// link's), and per tier (label `tier`: host, ssd) the loads that gave no
// block by reason, the records evicted, the bytes read and written, and what
// it holds now. Fed from stats snapshots on one thread.
#ifndef TANDEM_COMMON_METRICS_TIER_METRICS_H_
#define TANDEM_COMMON_METRICS_TIER_METRICS_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "common/kvcache/cache_events.h"
#include "common/kvcache/kv_tier.h"
#include "common/kvcache/tier_link.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

class TierMetrics {
 public:
  TierMetrics(prometheus::Registry& registry, const std::string& prefix);
  // `tiers`: each tier's counters, as KvTier::stats gives them.
  void Publish(std::span<const std::pair<CacheTier, KvTierStats>> tiers, const TierLinkStats& link,
               uint64_t queried_tokens, uint64_t hit_tokens);

 private:
  // One tier's series, host memory's and the SSD's made at once (a worker
  // without a tier shows them at 0).
  struct PerTier {
    std::array<prometheus::Counter*, kTierMissKinds> misses{};
    prometheus::Counter* evicted = nullptr;
    prometheus::Counter* read_bytes = nullptr;
    prometheus::Counter* written_bytes = nullptr;
    prometheus::Gauge* used_bytes = nullptr;
    prometheus::Gauge* records = nullptr;
  };
  PerTier& Series(CacheTier tier) { return tier == CacheTier::kHost ? host_ : ssd_; }

  prometheus::Counter& queried_tokens_;
  prometheus::Counter& hit_tokens_;
  prometheus::Counter& spilled_;
  prometheus::Counter& spills_refused_;
  prometheus::Counter& late_;
  PerTier host_;
  PerTier ssd_;
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_TIER_METRICS_H_
