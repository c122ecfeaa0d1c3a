#include "common/metrics/tier_metrics.h"

#include "common/metrics/metrics.h"

namespace tandem::metrics {

TierMetrics::TierMetrics(prometheus::Registry& registry, const std::string& prefix)
    : queried_tokens_(AddCounter(registry, prefix + "_kv_tier_queried_tokens_total",
                                 "Prompt tokens past the prefix cache's hit looked up in the KV "
                                 "tiers (whole blocks)")),
      hit_tokens_(AddCounter(registry, prefix + "_kv_tier_hit_tokens_total",
                             "Prompt tokens whose KV was loaded from a KV tier, verified, "
                             "instead of being computed")),
      spilled_(AddCounter(registry, prefix + "_kv_tier_spilled_blocks_total",
                          "Cached KV blocks evicted from the pool that the tiers took")),
      spills_refused_(AddCounter(registry, prefix + "_kv_tier_spills_refused_total",
                                 "Evicted cached KV blocks the tiers did not take (held already, "
                                 "or their writes behind)")),
      late_(AddCounter(registry, prefix + "_kv_tier_late_blocks_total",
                       "Blocks whose load was still out when the job stopped waiting "
                       "(computed instead)")) {
  auto& misses = prometheus::BuildCounter()
                     .Name(prefix + "_kv_tier_load_misses_total")
                     .Help(
                         "Loads from a KV tier that gave no block, by tier and reason (a miss is "
                         "passed to the tier below or recomputed, never used)")
                     .Register(registry);
  auto& evicted = prometheus::BuildCounter()
                      .Name(prefix + "_kv_tier_evicted_blocks_total")
                      .Help(
                          "Records a tier dropped to stay within its bound (host memory's go on "
                          "to the SSD tier when there is one)")
                      .Register(registry);
  auto& read = prometheus::BuildCounter()
                   .Name(prefix + "_kv_tier_read_bytes_total")
                   .Help("Bytes a tier read for loads")
                   .Register(registry);
  auto& written = prometheus::BuildCounter()
                      .Name(prefix + "_kv_tier_written_bytes_total")
                      .Help("Bytes a tier wrote for stores")
                      .Register(registry);
  auto& used = prometheus::BuildGauge()
                   .Name(prefix + "_kv_tier_bytes")
                   .Help("Bytes of a tier's records, those being written included")
                   .Register(registry);
  auto& records = prometheus::BuildGauge()
                      .Name(prefix + "_kv_tier_records")
                      .Help("Readable records in a tier")
                      .Register(registry);
  for (CacheTier tier : {CacheTier::kHost, CacheTier::kSsd}) {
    const std::string name = tier == CacheTier::kHost ? "host" : "ssd";
    PerTier& t = Series(tier);
    for (int i = 0; i < kTierMissKinds; ++i) {
      t.misses[i] = &misses.Add(
          {{"tier", name}, {"reason", std::string(TierMissName(static_cast<TierMiss>(i)))}});
    }
    t.evicted = &evicted.Add({{"tier", name}});
    t.read_bytes = &read.Add({{"tier", name}});
    t.written_bytes = &written.Add({{"tier", name}});
    t.used_bytes = &used.Add({{"tier", name}});
    t.records = &records.Add({{"tier", name}});
  }
}

void TierMetrics::Publish(std::span<const std::pair<CacheTier, KvTierStats>> tiers,
                          const TierLinkStats& link, uint64_t queried_tokens, uint64_t hit_tokens) {
  auto advance = [](prometheus::Counter& c, uint64_t v) { AdvanceTo(c, static_cast<double>(v)); };
  advance(queried_tokens_, queried_tokens);
  advance(hit_tokens_, hit_tokens);
  advance(spilled_, link.spilled);
  advance(spills_refused_, link.spills_refused);
  advance(late_, link.blocks_late);
  for (const auto& [tier, stats] : tiers) {
    if (tier == CacheTier::kPool) continue;
    PerTier& t = Series(tier);
    for (int i = 0; i < kTierMissKinds; ++i) advance(*t.misses[i], stats.misses[i]);
    advance(*t.evicted, stats.evictions);
    advance(*t.read_bytes, stats.bytes_read);
    advance(*t.written_bytes, stats.bytes_written);
    t.used_bytes->Set(static_cast<double>(stats.used_bytes));
    t.records->Set(static_cast<double>(stats.records));
  }
}

}  // namespace tandem::metrics
