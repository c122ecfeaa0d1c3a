#include "common/metrics/tier_metrics.h"

#include "common/metrics/metrics.h"

namespace tandem::metrics {

TierMetrics::TierMetrics(prometheus::Registry& registry, const std::string& prefix)
    : queried_tokens_(AddCounter(registry, prefix + "_kv_tier_queried_tokens_total",
                                 "Prompt tokens past the prefix cache's hit looked up in the KV "
                                 "tier (whole blocks)")),
      hit_tokens_(AddCounter(registry, prefix + "_kv_tier_hit_tokens_total",
                             "Prompt tokens whose KV was loaded from the KV tier, verified, "
                             "instead of being computed")),
      spilled_(AddCounter(registry, prefix + "_kv_tier_spilled_blocks_total",
                          "Cached KV blocks evicted from the pool that the tier took")),
      spills_refused_(AddCounter(registry, prefix + "_kv_tier_spills_refused_total",
                                 "Evicted cached KV blocks the tier did not take (held already, "
                                 "or its writes behind)")),
      late_(AddCounter(registry, prefix + "_kv_tier_late_blocks_total",
                       "Blocks whose load was still out when the job stopped waiting "
                       "(computed instead)")),
      evicted_(AddCounter(registry, prefix + "_kv_tier_evicted_blocks_total",
                          "Records the tier dropped to stay within its bound")),
      read_bytes_(AddCounter(registry, prefix + "_kv_tier_read_bytes_total",
                             "Bytes the tier read for loads")),
      written_bytes_(AddCounter(registry, prefix + "_kv_tier_written_bytes_total",
                                "Bytes the tier wrote for stores")),
      used_bytes_(AddGauge(registry, prefix + "_kv_tier_bytes",
                           "Bytes of the tier's records, those being written included")),
      records_(AddGauge(registry, prefix + "_kv_tier_records", "Readable records in the tier")) {
  auto& family = prometheus::BuildCounter()
                     .Name(prefix + "_kv_tier_load_misses_total")
                     .Help(
                         "Loads from the KV tier that gave no block, by reason (a miss is "
                         "recomputed, never used)")
                     .Register(registry);
  for (int i = 0; i < kTierMissKinds; ++i) {
    misses_[i] = &family.Add({{"reason", std::string(TierMissName(static_cast<TierMiss>(i)))}});
  }
}

void TierMetrics::Publish(const KvTierStats& tier, const TierLinkStats& link,
                          uint64_t queried_tokens, uint64_t hit_tokens) {
  auto advance = [](prometheus::Counter& c, uint64_t v) { AdvanceTo(c, static_cast<double>(v)); };
  advance(queried_tokens_, queried_tokens);
  advance(hit_tokens_, hit_tokens);
  advance(spilled_, link.spilled);
  advance(spills_refused_, link.spills_refused);
  advance(late_, link.blocks_late);
  for (int i = 0; i < kTierMissKinds; ++i) advance(*misses_[i], tier.misses[i]);
  advance(evicted_, tier.evictions);
  advance(read_bytes_, tier.bytes_read);
  advance(written_bytes_, tier.bytes_written);
  used_bytes_.Set(static_cast<double>(tier.used_bytes));
  records_.Set(static_cast<double>(tier.records));
}

}  // namespace tandem::metrics
